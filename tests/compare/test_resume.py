"""A comparison resumes run by run: killed after 1, 2 or 3 of its 4 runs and started again, it
computes only the runs that had not finished (counted) and its table equals the uninterrupted
one; a record of another declaration is never reused; a real SIGKILL of ``fedjax-dro compare``
resumes the same way (slow)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fedjax_dro import compare as C
from fedjax_dro.compare import harness
from fedjax_dro.compare.resume import decode, encode, round_trip
from tests.compare.test_compare import _experiment
from tests.compare.test_config import TINY

TIMING = ("seconds", "wall_time")


def _untimed(value):
  """The record without its wall-clock fields (the only ones a rerun may change)."""
  if isinstance(value, dict):
    return {k: _untimed(v) for k, v in value.items() if k not in TIMING}
  if isinstance(value, list):
    return [_untimed(v) for v in value]
  return value


class _Counted:
  """``harness._run`` counting its calls; raises KeyboardInterrupt at call ``stop`` (a kill)."""

  def __init__(self, stop=None):
    self.calls, self.stop, self.original = 0, stop, harness._run

  def __call__(self, *args, **kwargs):
    self.calls += 1
    if self.stop is not None and self.calls == self.stop:
      raise KeyboardInterrupt
    return self.original(*args, **kwargs)


def test_killed_at_three_points_the_rerun_equals_the_uninterrupted_table(tmp_path, monkeypatch):
  experiment = _experiment()
  total = len(experiment.protocol.seeds) * len(experiment.strategies)
  reference = C.compare(experiment, str(tmp_path / "reference"), verbose=False).to_json()
  for finished in (1, 2, 3):
    out = str(tmp_path / f"killed-{finished}")
    killer = _Counted(stop=finished + 1)
    monkeypatch.setattr(harness, "_run", killer)
    with pytest.raises(KeyboardInterrupt):
      C.compare(experiment, out, verbose=False)
    assert not os.path.exists(os.path.join(out, "tiny.json"))  # no table from a killed run
    counter = _Counted()
    monkeypatch.setattr(harness, "_run", counter)
    lines = []
    again = C.compare(experiment, out, log=lines.append).to_json()
    assert counter.calls == total - finished  # the finished runs were not computed again
    assert sum("recorded earlier" in line for line in lines) == finished
    assert _untimed(again) == _untimed(reference)
    with open(os.path.join(out, "tiny.json")) as f:
      written = json.load(f)
    with open(os.path.join(tmp_path / "reference", "tiny.json")) as f:
      assert _untimed(written) == _untimed(json.load(f))


def test_a_finished_comparison_rerun_computes_nothing(tmp_path, monkeypatch):
  experiment = _experiment(seeds=(0,))
  first = C.compare(experiment, str(tmp_path), verbose=False).to_json()
  counter = _Counted()
  monkeypatch.setattr(harness, "_run", counter)
  again = C.compare(experiment, str(tmp_path), verbose=False).to_json()
  assert counter.calls == 0 and again["per_seed"] == first["per_seed"]  # timings included


def test_a_record_of_another_declaration_is_not_reused(tmp_path, monkeypatch):
  C.compare(_experiment(seeds=(0,)), str(tmp_path), verbose=False)
  counter = _Counted()
  monkeypatch.setattr(harness, "_run", counter)
  C.compare(_experiment(seeds=(0,), folds=3), str(tmp_path), verbose=False)
  assert counter.calls == 2  # another protocol: both runs computed
  counter.calls = 0
  C.compare(_experiment(seeds=(0,), budget=C.Budget("rounds", rounds=6)), str(tmp_path))
  assert counter.calls == 2  # another budget


def test_a_record_whose_key_does_not_match_is_computed_again(tmp_path, monkeypatch):
  experiment = _experiment(seeds=(0,))
  C.compare(experiment, str(tmp_path), verbose=False)
  runs = os.path.join(tmp_path, "runs", "tiny")
  names = sorted(os.listdir(runs))
  with open(os.path.join(runs, names[0])) as f:
    record = json.load(f)
  record["key"]["seed"] = 99  # a file renamed or edited: its key no longer matches its name
  with open(os.path.join(runs, names[0]), "w") as f:
    json.dump(record, f)
  with open(os.path.join(runs, names[1]), "w") as f:
    f.write("{not json")
  counter = _Counted()
  monkeypatch.setattr(harness, "_run", counter)
  C.compare(experiment, str(tmp_path), verbose=False)
  assert counter.calls == 2


def test_records_give_back_exactly_what_was_computed():
  value = {
    "a": float("nan"),
    "b": [float("inf"), -float("inf"), 0.1, 1e-300, 3],
    "c": (1, 2.5),
    "d": {"e": None, "f": "text", "g": True},
  }
  back = round_trip(value)
  assert json.dumps(back, allow_nan=True) == json.dumps({**value, "c": [1, 2.5]}, allow_nan=True)
  for like_a_marker in ({"non-finite float": "text"}, {"escaped dict": {"non-finite float": 1}}):
    assert decode(encode(like_a_marker)) == like_a_marker


@pytest.mark.slow
def test_sigkill_at_three_points_then_rerun_equals_the_uninterrupted_table(tmp_path):
  config = tmp_path / "tiny.toml"
  config.write_text(TINY)
  cmd = [sys.executable, "-m", "fedjax_dro", "compare", str(config), "--out"]
  subprocess.run([*cmd, str(tmp_path / "reference")], check=True, capture_output=True)
  with open(tmp_path / "reference" / "tiny.json") as f:
    reference = _untimed(json.load(f))
  for finished in (1, 2, 3):
    out = tmp_path / f"killed-{finished}"
    runs = out / "runs" / "tiny"
    proc = subprocess.Popen([*cmd, str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (runs.is_dir() and len(os.listdir(runs)) >= finished):
      assert proc.poll() is None and time.monotonic() < deadline
      time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len([n for n in os.listdir(runs) if n.endswith(".json")])
    again = subprocess.run([*cmd, str(out)], check=True, capture_output=True, text=True)
    assert again.stdout.count("recorded earlier") == done
    with open(out / "tiny.json") as f:
      assert _untimed(json.load(f)) == reference
