"""One claim of an output directory, for every command that writes one: two commands started on
one ``--out`` never both write it, whatever their timing, and a finished result of another
configuration is refused unless ``--overwrite``.

The overlap is made deterministic with a barrier instead of a sleep: the first command (A) runs
in a process whose work function (``run``, ``sweep``, ``compare``, ``reproduce``) waits, once
called, for a file the test creates; the second (B) is started only when A has got there (past
every check that A makes before its work) and runs to its end; then A is released. Before the
claim was taken first, a second ``run`` passed its check while the first waited (nothing was
written yet), ran and finished, and the first then replaced its finished result: both exited 0
and one result was lost (this test failed so on that tree)."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from fedjax_dro import cli
from fedjax_dro.records.claim import OutputClaim

# A process running ``fedjax-dro ARGV`` whose function MODULE.ATTR, once called, signals STARTED
# and waits for RELEASE ("-": no hook). A tiny experiment "claim-test" is registered for the
# reproduce command: it writes its seed and waits nowhere.
WRAPPER = textwrap.dedent(
  """
  import importlib, json, os, sys, time
  from fedjax_dro import reproduce as R

  def tiny(out_dir=None, *, rounds=None, quick=False, seed=0):
    if out_dir is not None:
      with open(os.path.join(out_dir, "claim_test.json"), "w") as f:
        json.dump({"seed": seed}, f)
    return {"seed": seed}

  R.EXPERIMENTS["claim-test"] = tiny
  target, started, release = sys.argv[1:4]
  if target != "-":
    module, attr = target.rsplit(".", 1)
    module = importlib.import_module(module)
    original = getattr(module, attr)

    def hooked(*args, **kwargs):
      open(started, "w").close()
      deadline = time.monotonic() + 300
      while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
      return original(*args, **kwargs)

    setattr(module, attr, hooked)
  from fedjax_dro.cli import main
  sys.exit(main(sys.argv[4:]))
  """
)

TOML = textwrap.dedent(
  """
  name = "claim"
  [data]
  dataset = "synthetic-ridge"
  options = {{ num_clients = 4, dim = 3 }}
  [protocol]
  seeds = {seeds}
  metric = "mse"
  folds = 2
  max_widenings = 0
  budget = {{ kind = "rounds", rounds = {rounds} }}
  [[strategy]]
  label = "FedAvg"
  algorithm = "fedavg"
  grid = {{ client_lr = [0.01, 0.03] }}
  """
)


def _commands(tmp_path, out):
  """``{command: (hook target, A's argv, B's argv, what A's result is)}``: B differs from A."""
  a, b = tmp_path / "a.toml", tmp_path / "b.toml"
  a.write_text(TOML.format(seeds="[0, 1]", rounds=4))
  b.write_text(TOML.format(seeds="[7]", rounds=2))
  run = ["run", "--rounds", "5", "--no-progress", "--out", out]
  sweep = ["sweep", "--rounds", "3", "--grid", "client_lr=0.01,0.1", "--out", out]
  return {
    "run": ("fedjax_dro.engine.runner.run", [*run, "--seed", "1"], [*run, "--seed", "2"]),
    "sweep": ("fedjax_dro.engine.sweeps.sweep", [*sweep, "--seeds", "1"], [*sweep, "--seeds", "2"]),
    "compare": (
      "fedjax_dro.compare.compare",
      ["compare", str(a), "--out", out],
      ["compare", str(b), "--out", out],
    ),
    "reproduce": (
      "fedjax_dro.reproduce.reproduce",
      ["reproduce", "claim-test", "--seed", "1", "--out", out],
      ["reproduce", "claim-test", "--seed", "2", "--out", out],
    ),
  }


def _result(command, out):
  """What identifies the finished result in ``out``: A's or B's."""
  path = {
    "run": "summary.json",
    "sweep": "sweep.json",
    "compare": "claim.json",
    "reproduce": "claim_test.json",
  }[command]
  with open(os.path.join(out, path)) as f:
    record = json.load(f)
  if command == "run":
    return record["config"]["seed"]
  if command == "sweep":
    return sorted({c["seed"] for c in record["configs"]})
  if command == "compare":
    return record["kept_seeds"]
  return record["seed"]


def _start(target, argv, started, release, **kw):
  cmd = [sys.executable, "-c", WRAPPER, target, str(started), str(release), *argv]
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _overlap(tmp_path, command, index=0):
  """A waits inside its work; B runs whole; A is released. Returns (A, B, result)."""
  out = str(tmp_path / f"same-{index}")
  target, argv_a, argv_b = _commands(tmp_path, out)[command]
  started, release = tmp_path / f"started-{index}", tmp_path / f"release-{index}"
  a = _start(target, argv_a, started, release)
  deadline = time.monotonic() + 300
  while not started.exists():
    assert a.poll() is None, a.communicate()
    assert time.monotonic() < deadline, "A never reached its work"
    time.sleep(0.01)
  b = _start("-", argv_b, started, release)
  b_out, b_err = b.communicate(timeout=300)
  release.touch()
  a_out, a_err = a.communicate(timeout=300)
  return (a.returncode, a_err), (b.returncode, b_err), _result(command, out)


A_RESULT = {"run": 1, "sweep": [1], "compare": [0, 1], "reproduce": 1}


def _check_overlap(a, b, result, command):
  (a_status, a_err), (b_status, b_err) = a, b
  assert a_status == 0, a_err
  lines = b_err.strip().splitlines()
  assert b_status == 2 and len(lines) == 1, b_err
  assert "in use by another run" in lines[0] and "--out" in lines[0], lines[0]
  assert result == A_RESULT[command]  # A's finished result, nothing of B's


@pytest.mark.parametrize("command", ["run", "sweep", "compare", "reproduce"])
def test_an_overlapping_second_command_is_refused_and_the_first_result_kept(tmp_path, command):
  a, b, result = _overlap(tmp_path, command)
  _check_overlap(a, b, result, command)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "sweep", "compare", "reproduce"])
def test_the_deterministic_overlap_100_times(tmp_path, command):
  for i in range(100):
    a, b, result = _overlap(tmp_path, command, i)
    _check_overlap(a, b, result, command)


@pytest.mark.parametrize("command", ["sweep", "compare", "reproduce"])
def test_a_finished_result_of_another_configuration_is_refused_unless_overwrite(
  tmp_path, capsys, command
):
  out = str(tmp_path / "out")
  _, argv_a, argv_b = _commands(tmp_path, out)[command]
  from fedjax_dro import reproduce as R

  def tiny(out_dir=None, *, rounds=None, quick=False, seed=0):
    with open(os.path.join(out_dir, "claim_test.json"), "w") as f:
      json.dump({"seed": seed}, f)
    return {}

  R.EXPERIMENTS["claim-test"] = tiny
  try:
    assert cli.main(argv_a) == 0
    first = _result(command, out)
    capsys.readouterr()
    assert cli.main(argv_b) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another configuration" in err[0] and "--overwrite" in err[0], err
    assert _result(command, out) == first  # untouched
    assert cli.main([*argv_b, "--overwrite"]) == 0
    assert _result(command, out) != first
  finally:
    del R.EXPERIMENTS["claim-test"]


def test_result_files_without_a_record_are_refused(tmp_path):
  (tmp_path / "sweep.json").write_text("{}")
  with OutputClaim(str(tmp_path), "--out", "sweep", ("sweep.json",)) as claim:
    with pytest.raises(ValueError, match="configuration is not recorded"):
      claim.check({"a": 1})
    assert claim.check({"a": 1}, overwrite=True) is False
    claim.finish()
  with OutputClaim(str(tmp_path), "--out", "sweep", ("sweep.json",)) as claim:
    assert claim.check({"a": 1}) is True  # the same job, finished
    with pytest.raises(ValueError, match=r"differs in a\b"):
      claim.check({"a": 2})


def test_the_claim_refuses_a_second_holder_and_lets_its_own_run_in(tmp_path):
  import threading

  from fedjax_dro.records.files import DirectoryLock

  out = str(tmp_path)
  with OutputClaim(out, "--out", "run"):
    with DirectoryLock(out, "out_dir"):  # the run this command starts, in its thread
      pass
    errors = []

    def other():
      try:
        with DirectoryLock(out, "out_dir"):
          pass
      except ValueError as e:
        errors.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1 and "in use by another run" in errors[0]
  with DirectoryLock(out, "out_dir"):  # released on exit
    with pytest.raises(ValueError, match="in use"):  # not re-entrant unless asked
      with DirectoryLock(out, "out_dir"):
        pass


def test_out_equal_to_checkpoint_dir_is_refused_naming_both_flags_leaving_no_lock(tmp_path):
  d = tmp_path / "d"
  argv = ["run", "--rounds", "2", "--no-progress", "--out", str(d), "--checkpoint-dir", str(d)]
  assert cli.main(argv) == 2
  assert not d.exists() or not any(p.name.startswith(".") for p in d.iterdir())
