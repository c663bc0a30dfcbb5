"""Checkpoints hold arrays and JSON only: a crafted pickle never runs, corrupt / foreign / old
files are refused naming the file with the directory unchanged, a lock refuses a second writer,
keep-last-N and checkpoint-every, exact resume, and SIGKILLed CLI runs that resume to the
uninterrupted run's metrics bit for bit."""

import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, run
from fedjax_dro.records import checkpoint
from fedjax_dro.records.checkpoint import CheckpointError, CheckpointLock
from tests.helpers import dataset, linreg, regression_clients

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _problem():
  data = regression_clients(n=6, d=3, seed=12)
  alg = A.scaffold(linreg(3), clients_per_round=3, local_steps=2, batch_size=3)
  return alg, dataset(data)


def _snapshot(directory):
  return {
    name: open(os.path.join(directory, name), "rb").read()
    for name in sorted(os.listdir(directory))
    if os.path.isfile(os.path.join(directory, name))
  }


class _Evil:
  """Unpickling this creates a marker file (what a crafted checkpoint would do)."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, "w"))


def test_crafted_pickle_and_foreign_files_never_run_and_are_refused(tmp_path):
  alg, ds = _problem()
  marker = tmp_path / "marker-created-by-unpickling"
  ckpt = tmp_path / "ckpt"
  ckpt.mkdir()
  for name in ("checkpoint.pkl", "ckpt-00000010.pkl", "notes.txt"):
    (ckpt / name).write_bytes(pickle.dumps(_Evil(str(marker))))
    before = _snapshot(ckpt)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
      run(alg, ds, rounds=4, eval_every=2, checkpoint_dir=str(ckpt))
    assert not marker.exists()
    assert _snapshot(ckpt) == before  # refused without touching the directory
    (ckpt / name).unlink()


def test_no_pickle_load_anywhere_in_the_package():
  for folder, _, files in os.walk(os.path.join(ROOT, "fedjax_dro")):
    for name in files:
      if name.endswith(".py"):
        text = open(os.path.join(folder, name)).read()
        assert "pickle.load" not in text and "allow_pickle=True" not in text, name
        assert "import pickle" not in text, name


def _checkpointed(tmp_path, **kw):
  alg, ds = _problem()
  ckpt = str(tmp_path / "ckpt")
  hist = run(alg, ds, rounds=8, eval_every=2, checkpoint_dir=ckpt, **kw)
  return alg, ds, ckpt, hist


def test_corrupt_truncated_edited_and_old_checkpoints_are_refused(tmp_path):
  alg, ds, ckpt, _ = _checkpointed(tmp_path)
  newest = sorted(f for f in os.listdir(ckpt) if f.endswith(".npz"))[-1]
  npz, manifest = os.path.join(ckpt, newest), os.path.join(ckpt, newest[:-4] + ".json")
  original = open(npz, "rb").read()
  cases = [
    (npz, original[: len(original) // 2], "corrupt or truncated"),
    (npz, original[:-8] + b"\x00" * 8, "corrupt or truncated"),
    (manifest, b"{ not json", "not a valid checkpoint manifest"),
    (manifest, json.dumps({"format": "other"}).encode(), "not a fedjax_dro checkpoint"),
  ]
  good_manifest = open(manifest, "rb").read()
  edited = json.loads(good_manifest)
  edited["version"] = 1
  cases.append((manifest, json.dumps(edited).encode(), "version"))
  for path, content, match in cases:
    with open(path, "wb") as f:
      f.write(content)
    before = _snapshot(ckpt)
    with pytest.raises(CheckpointError, match=match) as err:
      run(alg, ds, rounds=8, eval_every=2, checkpoint_dir=ckpt)
    assert os.path.basename(path) in str(err.value)
    assert _snapshot(ckpt) == before
    with open(npz, "wb") as f:
      f.write(original)
    with open(manifest, "wb") as f:
      f.write(good_manifest)
  with pytest.raises(CheckpointError, match="different run"):
    run(alg, ds, rounds=8, eval_every=2, seed=3, checkpoint_dir=ckpt)


def test_lock_keep_last_and_checkpoint_every(tmp_path):
  alg, ds, ckpt, full = _checkpointed(tmp_path, keep_checkpoints=3)
  assert sorted(os.listdir(ckpt)) == sorted(
    [".lock", "history.log"] + [f"ckpt-{r:08d}.{ext}" for r in (4, 6, 8) for ext in ("npz", "json")]
  )
  with CheckpointLock(ckpt):
    with pytest.raises(CheckpointError, match="in use by another run"):
      run(alg, ds, rounds=8, eval_every=2, checkpoint_dir=ckpt)
  every = str(tmp_path / "every")
  run(alg, ds, rounds=9, eval_every=2, checkpoint_dir=every, checkpoint_every=4, keep_checkpoints=9)
  # evaluations at 2, 4, 6, 8, 9: checkpoints at the first evaluation after 4, 8, and the end
  assert sorted(f for f in os.listdir(every) if f.endswith(".json")) == [
    "ckpt-00000004.json",
    "ckpt-00000008.json",
    "ckpt-00000009.json",
  ]
  with pytest.raises(ValueError, match="keep_checkpoints"):
    run(alg, ds, rounds=2, checkpoint_dir=every, keep_checkpoints=0)


def test_bfloat16_and_typed_key_leaves_round_trip_exactly(tmp_path):
  state = {
    "w": jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3) / 3,
    "key": jax.random.key(7),
    "raw": jax.random.PRNGKey(3),
    "n": jnp.int32(5),
  }

  class _H:
    train_metrics = {"loss": np.array([1.0, 0.5])}
    evaluations = [
      {
        "round": 2,
        "per_client": {"acc": np.array([0.5, 1.0], np.float32)},
        "summary": {"acc": {"mean": 0.75}},
      }
    ]

  config = {"algorithm": "x", "rounds": 2}
  checkpoint.save_checkpoint(str(tmp_path), config, 1, 2, state, (False, -1), _H(), 0.1)
  payload, restored = checkpoint.load_checkpoint(str(tmp_path), config, state)
  assert restored["w"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(
    np.asarray(restored["w"], np.float32), np.asarray(state["w"], np.float32)
  )
  assert jax.random.key_impl(restored["key"]) == jax.random.key_impl(state["key"])
  np.testing.assert_array_equal(
    jax.random.key_data(restored["key"]), jax.random.key_data(state["key"])
  )
  np.testing.assert_array_equal(restored["raw"], state["raw"])
  assert payload["evaluations"][0]["per_client"]["acc"].dtype == np.float32
  assert payload["rounds_done"] == 2


# ----------------------------------------------------------------------------------------------
# SIGKILL at random moments, some during a checkpoint write
# ----------------------------------------------------------------------------------------------
CLI = [
  sys.executable,
  "-m",
  "fedjax_dro.cli",
  "run",
  "--algorithm",
  "scaffold",
  "--dataset",
  "synthetic-classification",
  "--rounds",
  "24",
  "--eval-every",
  "2",
  "--clients-per-round",
  "5",
  "--local-steps",
  "2",
  "--batch-size",
  "8",
  "--no-progress",
]


def _env(delay=None):
  env = dict(os.environ)
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env["JAX_PLATFORMS"] = "cpu"
  if delay:
    env[checkpoint._WRITE_DELAY_ENV] = str(delay)
  return env


def _outputs(out):
  with open(os.path.join(out, "summary.json")) as f:
    final = json.load(f)["final"]
  with open(os.path.join(out, "metrics.jsonl"), "rb") as f:
    return final, f.read()


@pytest.mark.parametrize(
  "trials",
  [[0], pytest.param([0, 1, 2, 3, 4], marks=pytest.mark.slow)],
  ids=["1-trial", "5-trials"],
)
def test_sigkill_at_random_moments_then_resume_equals_uninterrupted(tmp_path, trials):
  reference = str(tmp_path / "reference")
  subprocess.run(CLI + ["--out", reference], env=_env(), check=True, capture_output=True)
  ref_final, ref_jsonl = _outputs(reference)
  rng = random.Random(0)
  during_write = 0
  for trial in trials:
    ckpt, out = str(tmp_path / f"ckpt{trial}"), str(tmp_path / f"out{trial}")
    in_write = trial % 2 == 0  # trials 0, 2, 4: killed while a checkpoint is being written
    proc = subprocess.Popen(
      CLI + ["--checkpoint-dir", ckpt, "--out", out],
      env=_env(0.4 if in_write else None),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    if in_write:  # kill when a checkpoint's arrays are on disk but its manifest is not yet
      completed = rng.randint(0, 3)  # ... after this many complete checkpoints
      while time.time() < deadline and proc.poll() is None:
        names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
        manifests = {n[: -len(".json")] for n in names if n.endswith(".json")}
        pending = {n[: -len(".npz")] for n in names if n.endswith(".npz")} - manifests
        if pending and len(manifests) >= min(completed, 1 if trial else 0):
          during_write += 1
          break
        time.sleep(0.005)
    else:  # a random moment after the run has started writing results
      while (
        time.time() < deadline
        and proc.poll() is None
        and not os.path.exists(os.path.join(out, "metrics.jsonl"))
      ):
        time.sleep(0.01)
      time.sleep(rng.uniform(0.0, 1.5))
    if proc.poll() is None:
      proc.send_signal(signal.SIGKILL)
    proc.wait()
    # resume (no delay) and compare with the uninterrupted run, bit for bit
    subprocess.run(
      CLI + ["--checkpoint-dir", ckpt, "--out", out], env=_env(), check=True, capture_output=True
    )
    final, jsonl = _outputs(out)
    assert final == ref_final, trial
    assert jsonl == ref_jsonl, trial
  # kills that landed between a checkpoint's arrays and its manifest (trials 0, 2, 4)
  assert during_write == len([t for t in trials if t % 2 == 0])


@pytest.mark.parametrize("eval_every", [10, 60])
def test_a_run_stopped_by_a_nonfinite_round_stays_stopped_on_resume(tmp_path, eval_every):
  """Resuming a run whose checkpoint records a non-finite stop raises the same error again,
  without running or evaluating anything more (before the fix, a stop in the last chunk resumed
  into a normal return, and an earlier stop added a duplicate evaluation)."""
  from fedjax_dro import NonFiniteError

  data = dataset(regression_clients(n=4, d=3, seed=10, shift=3.0))
  alg = A.fedavg(linreg(3), local_steps=5)
  out = str(tmp_path / "out")
  kw = dict(
    rounds=60,
    hparams={"client_lr": 5.0},
    eval_every=eval_every,
    checkpoint_dir=str(tmp_path / "ckpt"),
    out_dir=out,
  )
  with pytest.raises(NonFiniteError) as first:
    run(alg, data, **kw)
  lines = open(os.path.join(out, "metrics.jsonl"), "rb").read()
  with pytest.raises(NonFiniteError) as again:
    run(alg, data, **kw)
  assert again.value.round == first.value.round
  rounds = [e["round"] for e in again.value.history.evaluations]
  assert rounds == [e["round"] for e in first.value.history.evaluations]
  assert open(os.path.join(out, "metrics.jsonl"), "rb").read() == lines
  for a, b in zip(jax.tree.leaves(again.value.state), jax.tree.leaves(first.value.state)):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_a_checkpoint_resumes_only_the_run_that_wrote_it(tmp_path):
  """Same algorithm, shapes and settings but other data values, other init_params or another PRNG
  key: refused (before the fix such a run silently resumed -- and returned -- the other run)."""
  alg = A.fedavg(linreg(3))
  a = dataset(regression_clients(n=4, d=3, seed=1))
  b = dataset(regression_clients(n=4, d=3, seed=2))  # same shapes, same name "custom"
  ckpt = str(tmp_path / "ckpt")
  run(alg, a, rounds=4, eval_every=2, checkpoint_dir=ckpt)
  before = _snapshot(ckpt)
  with pytest.raises(CheckpointError, match="different run .*fingerprints"):
    run(alg, b, rounds=4, eval_every=2, checkpoint_dir=ckpt)
  params = {"w": jnp.ones(3), "b": jnp.zeros(())}
  with pytest.raises(CheckpointError, match="different run .*fingerprints"):
    run(alg, a, rounds=4, eval_every=2, checkpoint_dir=ckpt, init_params=params)
  keyed = str(tmp_path / "keyed")
  run(alg, a, rounds=4, eval_every=2, checkpoint_dir=keyed, seed=jax.random.PRNGKey(1))
  with pytest.raises(CheckpointError, match="different run .*seed"):
    run(alg, a, rounds=4, eval_every=2, checkpoint_dir=keyed, seed=jax.random.PRNGKey(2))
  assert _snapshot(ckpt) == before
  run(alg, a, rounds=4, eval_every=2, checkpoint_dir=ckpt)  # the same run still resumes


def test_sigkill_after_a_history_log_append_then_resume_equals_uninterrupted(tmp_path):
  """The history log (format version 3): killed when the log already holds the records of a
  checkpoint whose manifest is not written yet; the resume cuts them off, recomputes, and ends
  bit for bit with the uninterrupted run's metrics.jsonl and summary."""
  reference = str(tmp_path / "reference")
  subprocess.run(CLI + ["--out", reference], env=_env(), check=True, capture_output=True)
  ref_final, ref_jsonl = _outputs(reference)
  ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
  proc = subprocess.Popen(
    CLI + ["--checkpoint-dir", ckpt, "--out", out],
    env=_env(0.4),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline, seen = time.time() + 120, None
  while time.time() < deadline and proc.poll() is None and seen is None:
    names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
    manifests = sorted(n for n in names if n.endswith(".json"))
    pending = {n[:-4] for n in names if n.endswith(".npz")} - {n[:-5] for n in manifests}
    if pending and manifests:  # the newest checkpoint's arrays and log records, no manifest yet
      try:
        with open(os.path.join(ckpt, manifests[-1])) as f:
          extent = json.load(f)["log"]["bytes"]
        size = os.path.getsize(os.path.join(ckpt, checkpoint.LOG_FILE))
      except (OSError, ValueError, KeyError):
        continue
      if size > extent:
        seen = (size, extent)
        break
    time.sleep(0.005)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert seen is not None, "the kill did not land between a log append and its manifest"
  resumed = subprocess.run(
    CLI + ["--checkpoint-dir", ckpt, "--out", out], env=_env(), check=True, capture_output=True
  )
  assert b"resuming from round" in resumed.stderr
  final, jsonl = _outputs(out)
  assert final == ref_final
  assert jsonl == ref_jsonl
