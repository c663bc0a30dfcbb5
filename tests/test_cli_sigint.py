"""Ctrl-C at every moment of a long command: a real SIGINT sent to ``python -m fedjax_dro`` while
it imports, compiles, runs and writes ends it with exit status 130 and one line on stderr, never
a traceback nor a crash of the interpreter (a segmentation fault, -11). The default suite sends
one interrupt per moment to ``run``; the slow suite 20 per moment to ``run``, ``sweep``,
``compare`` and ``reproduce``."""

import os
import signal
import subprocess
import sys
import time

import pytest

RUN = ["run", "--rounds", "200000", "--eval-every", "1", "--no-progress"]
SWEEP = ["sweep", "--rounds", "200000", "--eval-every", "1", "--grid", "client_lr=0.01,0.02"]
REPRODUCE = ["reproduce", "karula-synthetic", "--quick"]
MOMENTS = ("importing", "compiling", "running", "writing")

COMPARE_TOML = """
name = "sigint"
[data]
dataset = "synthetic-ridge"
[protocol]
seeds = [0, 1, 2]
metric = "mse"
folds = 2
max_widenings = 0
budget = { kind = "rounds", rounds = 300 }
[[strategy]]
label = "FedAvg"
algorithm = "fedavg"
grid = { client_lr = [0.01, 0.02, 0.04] }
[[strategy]]
label = "FedProx"
algorithm = "fedprox"
grid = { client_lr = [0.01, 0.02, 0.04] }
"""


def _wait_for(proc, ready, what, timeout=180.0):
  deadline = time.monotonic() + timeout
  while not ready():
    if proc.poll() is not None:
      pytest.fail(f"the command ended ({proc.returncode}) before {what}: {proc.communicate()}")
    assert time.monotonic() < deadline, f"no {what} within {timeout} s"
    time.sleep(0.005)


def _read(path):
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return ""


def _interrupt(argv, moment, tmp_path, index=0):
  """Starts ``fedjax-dro argv`` with ``--out``, sends SIGINT at ``moment``, returns
  ``(status, stderr)``."""
  out = tmp_path / f"out-{moment}-{index}"
  log = tmp_path / f"stdout-{moment}-{index}.txt"
  with open(log, "w") as stdout:
    proc = subprocess.Popen(
      [sys.executable, "-m", "fedjax_dro", *argv, "--out", str(out)],
      stdout=stdout,
      stderr=subprocess.PIPE,
      text=True,
      env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    started = lambda: log.stat().st_size > 0  # noqa: E731  the first line: built, not compiled
    if moment == "importing":  # JAX's compiled extension mapped: the package is still loading
      maps = f"/proc/{proc.pid}/maps"
      if os.path.exists(maps):
        _wait_for(proc, lambda: "jaxlib" in _read(maps), "JAX loading")
        time.sleep(0.02 * (index % 5))
      else:
        time.sleep(0.3 + 0.1 * (index % 5))
    elif moment == "compiling":
      _wait_for(proc, started, "the first line")
    else:  # running: rounds recorded; writing: an evaluation is appended every round
      jsonl = [out / "metrics.jsonl", out / "sweep.json"]
      runs = out / "runs"
      _wait_for(
        proc,
        lambda: any(p.exists() and p.stat().st_size > 0 for p in jsonl) or runs.exists(),
        "recorded rounds",
      )
      if moment == "writing":
        time.sleep(0.01 * (index % 7))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  return proc.returncode, err


def _check(status, err, moment):
  lines = err.strip().splitlines()
  assert status == 130, f"{moment}: exit {status}; stderr: {err}"
  assert len(lines) == 1 and "Traceback" not in err, f"{moment}: {err}"
  assert lines[0].startswith("interrupted"), f"{moment}: {err}"


@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_at_each_moment_of_a_run_is_one_line_and_130(tmp_path, moment):
  status, err = _interrupt(RUN, moment, tmp_path)
  _check(status, err, moment)


def _commands(tmp_path):
  config = tmp_path / "sigint.toml"
  config.write_text(COMPARE_TOML)
  return {"run": RUN, "sweep": SWEEP, "compare": ["compare", str(config)], "reproduce": REPRODUCE}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "sweep", "compare", "reproduce"])
@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_twenty_times_at_each_moment_of_each_long_command(tmp_path, command, moment):
  if command in ("sweep", "reproduce") and moment in ("running", "writing"):
    moment = "compiling"  # their records are written at the end: interrupted while computing
  argv = _commands(tmp_path)[command]
  for i in range(20):
    status, err = _interrupt(argv, moment, tmp_path, i)
    _check(status, err, f"{command} {moment} #{i}")
