"""The command line under interruption and reuse of an output directory: a real SIGINT to a
``fedjax-dro run`` prints one line naming the round it stopped after and exits 130, and the
same command run again resumes to the result of an uninterrupted run; a finished run of another
configuration in ``--out`` is refused unless ``--overwrite``; the same configuration says it is
complete."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from fedjax_dro import cli
from fedjax_dro.records.checkpoint import scan

ROUNDS = 3000
ARGS = ["run", "--rounds", str(ROUNDS), "--eval-every", "10", "--no-progress"]


def _final(out):
  with open(os.path.join(out, "summary.json")) as f:
    return json.load(f)["final"]


def test_ctrl_c_prints_one_line_exits_130_and_the_rerun_resumes_identically(tmp_path):
  ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
  cmd = [sys.executable, "-m", "fedjax_dro", *ARGS, "--checkpoint-dir", ck, "--out", out]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 120
  while not (os.path.isdir(ck) and scan(ck)):
    assert proc.poll() is None, proc.communicate()
    assert time.monotonic() < deadline, "no checkpoint within 120 s"
    time.sleep(0.02)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err
  lines = err.strip().splitlines()
  assert len(lines) == 1 and "Traceback" not in err, err
  stopped = int(re.search(r"stopped after round (\d+)", lines[0]).group(1))
  assert 0 < stopped < ROUNDS and "rerun the same command to resume" in lines[0]
  assert stopped == scan(ck)[-1]
  # the same command again: resumes from the checkpoint and finishes
  again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr
  # an uninterrupted run, in a process of its own as well (the test process runs in float64)
  ref = str(tmp_path / "reference")
  done = subprocess.run(
    [sys.executable, "-m", "fedjax_dro", *ARGS, "--out", ref], capture_output=True, timeout=300
  )
  assert done.returncode == 0, done.stderr
  assert _final(out) == _final(ref)


def test_interrupted_message_without_a_checkpoint(tmp_path):
  class Args:
    command, checkpoint_dir, out = "run", None, str(tmp_path)

  line = cli.interrupted_message(Args)
  assert "no checkpoint" in line and "metrics.jsonl" in line and "\n" not in line
  Args.command = "sweep"
  assert cli.interrupted_message(Args).startswith("interrupted: sweep stopped")


def test_a_finished_run_of_another_configuration_is_refused_unless_overwrite(tmp_path, capsys):
  out = str(tmp_path / "out")
  base = ["run", "--rounds", "5", "--no-progress", "--out", out]
  assert cli.main(base) == 0
  first = _final(out)
  capsys.readouterr()
  assert cli.main([*base, "--hparam", "client_lr=0.05"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "another configuration" in err[0] and "--overwrite" in err[0]
  assert "differs in hparams" in err[0] and _final(out) == first  # untouched
  assert cli.main([*base, "--dataset", "synthetic-shift"]) == 2
  assert "differs in dataset" in capsys.readouterr().err
  # the same configuration: complete, nothing rerun
  mtime = os.path.getmtime(os.path.join(out, "summary.json"))
  assert cli.main(base) == 0
  assert "already holds this run, complete (5 rounds)" in capsys.readouterr().out
  assert os.path.getmtime(os.path.join(out, "summary.json")) == mtime
  # --overwrite replaces it; the float the user gave is written as given
  assert cli.main([*base, "--hparam", "client_lr=0.05", "--overwrite"]) == 0
  with open(os.path.join(out, "summary.json")) as f:
    assert json.load(f)["config"]["hparams"]["client_lr"] == 0.05
  assert _final(out) != first


@pytest.mark.parametrize("value", [0.1, 0.3, 1e-3, 2.5e-7])
def test_hparams_are_written_as_given(value):
  import numpy as np

  from fedjax_dro.engine.runner import shortest_floats

  assert shortest_floats(np.float32(value)) == value
  assert np.float32(shortest_floats(np.float32(value))) == np.float32(value)
  assert shortest_floats(np.array([value, 2.0], np.float32)) == [value, 2.0]
