import json

from fedjax_dro import cli


def test_run_default_prints_table_and_writes_files(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(["run", "--rounds", "20", "--no-progress", "--out", str(out)]) == 0
  text = capsys.readouterr().out
  assert "fedavg on synthetic-ridge" in text and "| r2 " in text and "worst-20%" in text
  lines = [json.loads(l) for l in open(out / "metrics.jsonl")]
  assert sum(l["type"] == "round" for l in lines) == 20
  summary = json.load(open(out / "summary.json"))
  assert summary["config"]["algorithm"] == "fedavg" and "compile_time_s" in summary
  assert summary["final"]["r2"]["mean"] > 0.5


def test_run_other_algorithm_dataset_and_options(capsys):
  assert (
    cli.main(
      [
        "run",
        "--algorithm",
        "scaffold",
        "--dataset",
        "synthetic-classification",
        "--rounds",
        "10",
        "--clients-per-round",
        "5",
        "--local-steps",
        "3",
        "--batch-size",
        "8",
        "--hparam",
        "client_lr=0.05",
        "--backend",
        "map",
        "--no-progress",
      ]
    )
    == 0
  )
  assert "| accuracy" in capsys.readouterr().out


def test_sweep_and_list(tmp_path, capsys):
  assert (
    cli.main(
      [
        "sweep",
        "--grid",
        "client_lr=0.01,0.05",
        "--seeds",
        "0,1",
        "--rounds",
        "10",
        "--out",
        str(tmp_path),
      ]
    )
    == 0
  )
  out = capsys.readouterr().out
  assert "best (mean r2)" in out
  assert len(json.load(open(tmp_path / "sweep.json"))["configs"]) == 4
  assert cli.main(["list"]) == 0
  listing = capsys.readouterr().out
  for name in [
    "fedavg",
    "fedsgd",
    "fedprox",
    "scaffold",
    "fedadam",
    "local",
    "synthetic-ridge",
    "synthetic-shift",
  ]:
    assert name in listing


def test_compile_cache_keeps_compiled_programs_between_commands(tmp_path):
  """--compile-cache DIR: the first command writes XLA's programs into DIR (JAX's persistent
  cache, every program size); the same command again reads them and gives the same result."""
  import os
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env["JAX_LOGGING_LEVEL"] = "DEBUG"  # JAX logs every persistent-cache hit and miss
  cache = tmp_path / "xla"
  outs, logs = [], []
  for i in range(2):
    out = tmp_path / f"run{i}"
    argv = ["run", "--rounds", "3", "--no-progress", "--compile-cache", str(cache)]
    proc = subprocess.run(
      [sys.executable, "-m", "fedjax_dro", *argv, "--out", str(out)],
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs.append(proc.stderr)
    with open(out / "summary.json") as f:
      outs.append(json.load(f)["final"])
  assert os.listdir(cache), "nothing was written to the compile cache"
  rounds = "'jit_chunk_fn'"
  assert f"PERSISTENT COMPILATION CACHE MISS for {rounds}" in logs[0]
  assert f"Persistent compilation cache hit for {rounds}" in logs[1]
  assert f"MISS for {rounds}" not in logs[1]
  assert outs[0] == outs[1]


def one_writer_behaviour(tmp_path=None):
  """Two commands writing one --out directory at once: the first proceeds, the second (a run or
  a sweep) is refused with one line naming the holder's process and leaves the first's files
  alone; once the holder is SIGKILLed, the next run takes the directory over (a row of the
  bad-input table, tested there: tests/test_bad_inputs.py)."""
  import os
  import pathlib
  import tempfile

  if tmp_path is None:
    with tempfile.TemporaryDirectory(prefix="fedjax-dro-one-writer-") as tmp:
      return one_writer_behaviour(pathlib.Path(tmp))
  import signal
  import subprocess
  import sys
  import time

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = tmp_path / "out"

  def cli(*argv, **kw):
    return [sys.executable, "-m", "fedjax_dro", *argv, "--out", str(out)]

  holder = subprocess.Popen(
    cli("run", "--rounds", "1000000", "--eval-every", "20", "--no-progress"),
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    deadline = time.time() + 240
    while not (out / "metrics.jsonl").exists():  # the holder is writing
      assert holder.poll() is None, holder.stderr.read()[-2000:]
      assert time.time() < deadline, "the first run wrote nothing in 240 s"
      time.sleep(0.2)
    written = (out / "metrics.jsonl").stat().st_size
    for argv in (("run", "--rounds", "2", "--no-progress"), ("sweep", "--rounds", "1")):
      second = subprocess.run(cli(*argv), env=env, capture_output=True, text=True, timeout=300)
      assert second.returncode == 2, second.stderr[-2000:]
      lines = second.stderr.strip().splitlines()
      assert len(lines) == 1 and "is in use by another run" in lines[0], second.stderr[-2000:]
      assert f"process {holder.pid}" in lines[0]
    assert holder.poll() is None  # the first run goes on
    assert (out / "metrics.jsonl").stat().st_size >= written
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
  third = subprocess.run(
    cli("run", "--rounds", "2", "--no-progress"),
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert third.returncode == 0, third.stderr[-2000:]
  with open(out / "summary.json") as f:
    assert json.load(f)["config"]["rounds"] == 2


def test_list_name_prints_settings_and_hyper_parameters(capsys):
  """``fedjax-dro list afl``: AFL's keys (it has no client_lr) with their defaults and ranges;
  every registered algorithm's description names each of its hyper-parameters and settings."""
  import inspect

  import pytest

  from fedjax_dro import algorithms as A, models, sweep
  from tests.helpers import dataset, regression_clients

  assert cli.main(["list", "afl"]) == 0
  out = capsys.readouterr().out
  lines = {line.split("=")[0].strip(): line for line in out.splitlines() if "=" in line}
  assert "0.1" in lines["lr_lambda"] and "> 0" in lines["lr_lambda"]
  assert "lr_w" in lines and "client_lr" not in lines and "psi" in lines
  assert "alpha" in A.describe("afl", psi="cvar") and "rho" not in A.describe("afl", psi="cvar")
  for name, entry in A.list_algorithms().items():
    text = A.describe(name)
    alg = entry.factory(models.linear_regression(1))
    for key, spec in alg.hparams.items():
      assert f"  {key} " in text and f"{spec.default:g}" in text, (name, key)
    for setting in inspect.signature(entry.factory).parameters:
      assert setting == "model" or f"  {setting} = " in text, (name, setting)
  with pytest.raises(
    ValueError,
    match=r"unknown hyper-parameter 'client_lr' for afl; expected one of \[.*'lr_lambda'",
  ):
    sweep(
      A.afl(models.linear_regression(2)),
      dataset(regression_clients(n=4, d=2)),
      rounds=1,
      grid={"client_lr": [0.1]},
    )
  assert cli.main(["list", "no_such_algorithm"]) == 2
  assert "unknown algorithm 'no_such_algorithm'" in capsys.readouterr().err


def test_every_flag_has_help_and_defaults_are_shown(capsys):
  """Every command's every argument has a help text; defaults appear in --help; the top-level
  help names every command without markup; reproduce --help lists each experiment's run time."""
  import argparse

  import pytest

  from fedjax_dro.reproduce import EXPERIMENTS, RUN_TIMES

  parser = cli.build_parser()
  sub = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0]
  assert set(sub.choices) == {
    "run",
    "sweep",
    "compare",
    "reproduce",
    "features",
    "prepare",
    "merge",
    "plot",
    "list",
  }
  for name, command in sub.choices.items():
    for action in command._actions:
      assert action.help, (name, action.option_strings or action.dest)
  assert set(RUN_TIMES) == set(EXPERIMENTS)
  with pytest.raises(SystemExit):
    cli.main(["--help"])
  top = capsys.readouterr().out
  assert "``" not in top and all(c in top for c in sub.choices)
  with pytest.raises(SystemExit):
    cli.main(["run", "--help"])
  run_help = " ".join(capsys.readouterr().out.split())
  assert "(default: 100)" in run_help and "(default: synthetic-ridge)" in run_help
  assert "training seed" in run_help and "--data-seed" in run_help
  with pytest.raises(SystemExit):
    cli.main(["reproduce", "--help"])
  rep = capsys.readouterr().out
  for name, when in RUN_TIMES.items():
    assert f"{name:<18} {when}" in rep


# ----------------------------------------------------------------------------------------------
# The settings and privacy flags are generated from the library's declarations
# ----------------------------------------------------------------------------------------------
def _subparser(name):
  import argparse

  parser = cli.build_parser()
  sub = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0]
  return sub.choices[name]


def _actions(command):
  return {s: a for a in _subparser(command)._actions for s in a.option_strings}


def _untabled(fn, table):
  """The arguments of ``fn`` after the first (the algorithm) without a row in ``table``, and the
  rows naming none."""
  import inspect

  return sorted(set(list(inspect.signature(fn).parameters)[1:]) ^ set(table))


def test_setting_flags_are_the_declared_settings():
  """Every DECLARED setting has its flag in run and sweep, with the declared value type and
  choices, its docstring paragraph (with the declared default) as help, and no value unless
  given (the algorithm's own default holds)."""
  import argparse

  from fedjax_dro.core.clients import BACKENDS
  from fedjax_dro.core.settings import DECLARED

  assert cli.setting_flags() == {n: "--" + n.replace("_", "-") for n in DECLARED}
  assert DECLARED["backend"].choices == BACKENDS and DECLARED["batch_size"].type is int
  for command in ("run", "sweep"):
    actions = _actions(command)
    for name, declared in DECLARED.items():
      action = actions[cli.setting_flags()[name]]
      assert action.dest == name and action.default is argparse.SUPPRESS
      assert action.type is declared.type and action.choices == declared.choices
      default = declared.default
      doc = declared.doc.format(default=f'"{default}"' if isinstance(default, str) else default)
      assert action.help == cli._plain(doc, cli.setting_flags())
      if "{default}" in declared.doc:
        assert f"(default {default})" in action.help or f'(default "{default}")' in action.help
      assert "``" not in action.help and ":func:" not in action.help
  args = cli.build_parser().parse_args(["run", "--batch-size", "8", "--backend", "map"])
  assert cli._given(args, cli.setting_flags()) == {"batch_size": 8, "backend": "map"}


def test_a_new_declared_setting_gets_its_flag(monkeypatch):
  """The flags are read from DECLARED, not restated: a setting added there appears."""
  from fedjax_dro.core import settings

  extra = settings.Declared(3, "a new count (default ``{default}``).")
  monkeypatch.setitem(settings.DECLARED, "new_count", extra)
  action = _actions("run")["--new-count"]
  assert action.type is int and action.help == "a new count (default 3)."


def test_privacy_flags_are_the_arguments_of_private():
  """Every keyword argument of fd.private has one row, hence one --dp-* flag in run and sweep,
  with the type and default of private's signature; the detector sees a missing row."""
  import inspect

  from fedjax_dro.privacy import private

  table = cli.privacy_flags()
  assert _untabled(private, table) == []
  signature = inspect.signature(private).parameters
  for command in ("run", "sweep"):
    actions = _actions(command)
    for name, row in table.items():
      action = actions[row.flag]
      default = signature[name].default
      assert action.type is (str if isinstance(default, str) else float), name
      assert action.choices == row.choices and action.metavar == row.metavar
      if default not in (None, inspect.Parameter.empty):
        assert action.help.endswith(f"(default: {default})"), name
  flags = [row.flag for row in table.values()]
  assert len(set(flags)) == len(flags) and all(f.startswith("--dp-") for f in flags)

  def grown(alg, clip_norm, noise_multiplier, *, sampling="poisson", new_knob=1.0):
    del alg, clip_norm, noise_multiplier, sampling, new_knob

  assert "new_knob" in _untabled(grown, table)


def test_loss_bound_help_lists_exactly_the_declaring_algorithms(monkeypatch):
  """--dp-loss-bound's help lists the algorithms whose declaration releases losses,
  --dp-cluster-noise's those that release counts: read from the declarations (a changed
  declaration changes the help)."""
  import re

  from fedjax_dro.core.release import Refused, Releases
  from fedjax_dro.privacy import releases_table

  def listed(flag):
    run = _subparser("run")
    action = _actions("run")[flag]
    text = run._get_formatter()._expand_help(action)  # the help as --help shows it
    assert "".join(text.split()) in "".join(run.format_help().split())
    return set(re.search(r"\(([\w, ]+)\)", text)[1].split(", "))

  table = releases_table()
  losses = {n for n, d in table.items() if isinstance(d, Releases) and d.losses is not None}
  counts = {n for n, d in table.items() if isinstance(d, Releases) and d.counts}
  assert {"afl", "qffl", "drfa"} <= losses and counts == {"ifca"}
  assert listed("--dp-loss-bound") == losses and listed("--dp-cluster-noise") == counts
  fake = {"mine": Releases("x", losses="loss"), "yours": Releases("y"), "no": Refused("z")}
  monkeypatch.setattr(cli, "_releases_table", lambda: fake)
  assert listed("--dp-loss-bound") == {"mine"}


def _one_error_line(argv, capsys):
  rc = cli.main(["run", "--rounds", "1", "--no-progress", *argv])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and "\n" not in err and err.startswith("error: "), (argv, err)
  return err[len("error: ") :]


def test_a_bad_setting_names_its_flag(capsys):
  """A bad value of each shared setting is reported under its flag: the library's ArgumentError
  carries the setting's name, which the CLI maps through the table that made the flags."""
  from fedjax_dro.core.settings import DECLARED

  for name, flag in cli.setting_flags().items():
    if DECLARED[name].choices is None:
      err = _one_error_line([flag, "0"], capsys)
    else:  # argparse refuses a value outside the choices; --option reaches the library
      err = _one_error_line(["--option", f"{name}=bogus"], capsys)
    assert err.startswith(f"{flag} must be "), err
  err = _one_error_line(["--clients-per-round", "1000"], capsys)  # found when the run starts
  assert err.startswith("--clients-per-round must be in [1, num_clients="), err


def test_a_bad_privacy_value_names_its_flag(capsys):
  """A bad value of each argument of fd.private is reported under its flag (a new argument
  needs its case here too)."""
  dp = ["--dp-clip", "1"]
  adaptive = dp + ["--dp-adaptive-quantile", "0.5"]
  cases = {
    "clip_norm": ["--dp-clip", "-1"],
    "noise_multiplier": dp + ["--dp-noise", "-1"],
    "sampling": None,  # choices: argparse names the flag (below)
    "rate": dp + ["--dp-rate", "2"],
    "delta": dp + ["--dp-delta", "1"],
    "accountant": dp + ["--dp-sampling", "fixed", "--dp-accountant", "pld"],
    "loss_bound": ["--algorithm", "afl"] + dp + ["--dp-loss-bound", "-1"],
    "loss_noise_multiplier": ["--algorithm", "afl"]
    + dp
    + ["--dp-loss-bound", "1", "--dp-loss-noise", "-1"],
    "adaptive_quantile": dp + ["--dp-adaptive-quantile", "2"],
    "adaptive_lr": adaptive + ["--dp-adaptive-lr", "0"],
    "count_noise": adaptive + ["--dp-count-noise", "-1"],
    "cluster_count_noise": ["--algorithm", "ifca"] + dp + ["--dp-cluster-noise", "-1"],
  }
  table = cli.privacy_flags()
  assert set(cases) == set(table)
  for name, argv in cases.items():
    if argv is not None:
      assert _one_error_line(argv, capsys).startswith(table[name].flag), name
  import pytest

  with pytest.raises(SystemExit):
    cli.main(["run", "--dp-sampling", "sometimes"])
  assert "argument --dp-sampling: invalid choice" in capsys.readouterr().err
  assert _one_error_line(["--dp-noise", "1"], capsys).startswith("--dp-clip C is needed")
  err = _one_error_line(dp + ["--dp-loss-bound", "1"], capsys)
  assert err.startswith("--dp-loss-bound / --dp-loss-noise: 'fedavg' releases no losses"), err
  err = _one_error_line(dp + ["--dp-count-noise", "0.1"], capsys)
  assert err == "--dp-count-noise needs --dp-adaptive-quantile", err


def test_errors_are_mapped_by_the_argument_they_carry_not_their_message():
  """The link is the exception's ``argument``: an ArgumentError is renamed, a ValueError that
  merely starts with a setting's name is not, nor an ArgumentError about another argument; the
  renamed error is still a ValueError with the message's rest unchanged."""
  import pickle

  import pytest

  from fedjax_dro.common.checks import ArgumentError, integer

  flags = cli.setting_flags()
  with pytest.raises(ArgumentError) as info:
    integer(0, "batch_size")
  assert info.value.argument == "batch_size" and isinstance(info.value, ValueError)
  assert str(info.value) == "batch_size must be an integer >= 1, got 0"
  with pytest.raises(ValueError, match=r"^--batch-size must be an integer >= 1, got 0$"):
    with cli._named(flags):
      integer(0, "batch_size")
  with pytest.raises(ValueError, match=r"^batch_size must be"):
    with cli._named(flags):
      raise ValueError("batch_size must be an integer >= 1, got 0")
  with pytest.raises(ArgumentError, match=r"^sampling must be"):
    with cli._named(flags):
      integer(0, "sampling")
  two = ArgumentError(("loss_bound", "loss_noise_multiplier"), ": none")
  assert str(two.renamed({"loss_bound": "--b"})) == "--b / loss_noise_multiplier: none"
  copy = pickle.loads(pickle.dumps(two))
  assert str(copy) == str(two) and copy.arguments == two.arguments


def test_a_setting_the_algorithm_does_not_take_is_refused_naming_its_flag(capsys):
  """For every registered algorithm, a declared setting its factory does not take is refused
  with one line naming the flag and the settings it does take (before any data load)."""
  import inspect

  from fedjax_dro.algorithms import list_algorithms

  flags = cli.setting_flags()
  refused = 0
  for name, entry in list_algorithms().items():
    accepted = inspect.signature(entry.factory).parameters
    for setting, flag in flags.items():
      if setting in accepted:
        continue
      value = {"weighting": "uniform", "model_state": "frozen"}.get(setting, "2")
      err = _one_error_line(["--algorithm", name, flag, value], capsys)
      takes = ", ".join(f for s, f in flags.items() if s in accepted)
      assert err.startswith(f"{flag}: {name} takes no {setting} (its settings: {takes};"), err
      refused += 1
  assert refused >= 10


def test_sweep_takes_the_flags_of_run_that_are_not_a_single_runs(tmp_path, capsys):
  """sweep accepts every flag of run but those of a single run (its seed, checkpoints,
  cross-validation), --no-progress and --overwrite included."""
  single_run = {"--seed", "--checkpoint-dir", "--checkpoint-every"}
  single_run |= {"--keep-checkpoints", "--cv-folds", "--cv-grid", "--cv-metric"}
  run, sweep = set(_actions("run")), set(_actions("sweep"))
  assert run - sweep == single_run, run - sweep
  assert cli.main(["sweep", "--rounds", "2", "--no-progress", "--out", str(tmp_path)]) == 0
  assert "best (mean r2)" in capsys.readouterr().out


def test_building_the_parser_does_not_start_jax():
  """--help and parsing start no JAX backend: --devices can still split the CPU afterwards,
  and the help's lists of releasing algorithms are computed only when shown."""
  import os
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  code = (
    "from fedjax_dro import cli\n"
    "from jax._src import xla_bridge\n"
    "parser = cli.build_parser(); parser.format_help()\n"
    "parser.parse_args(['run', '--dp-clip', '1', '--batch-size', '4'])\n"
    "assert not xla_bridge.backends_are_initialized()\n"
  )
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]


def test_sweep_says_its_size_and_its_states_memory_first(capsys):
  """The job's size before its preparation: runs, grid and seeds, and the states' bytes (for
  FedAvg on the default ridge task, one state is its 51 parameters: 204 bytes in float32, 408 in
  the float64 of the test process)."""
  import jax

  argv = ["sweep", "--rounds", "1", "--grid", "client_lr=0.01,0.1,1", "--seeds", "0,1"]
  assert cli.main(argv) == 0
  lines = capsys.readouterr().out.splitlines()
  size = 6 * 51 * (8 if jax.config.jax_enable_x64 else 4) / 1000
  assert lines[1] == (
    f"6 runs (grid 3, 2 seeds) in one program; their states take about {size:.1f} KB of device "
    "memory"
  )
