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
  assert set(sub.choices) == {"run", "sweep", "compare", "reproduce", "plot", "list"}
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
