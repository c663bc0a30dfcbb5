"""Hostile and damaged checkpoints: every case of issue 28 is refused with one CheckpointError
naming the file (and, for the manifest, the field), without hanging or reading without bound;
random mutations of a valid manifest (hypothesis) load identically or raise that error, nothing
else. Also: model identity on resume, the history log (constant checkpoint size, a torn append
cut off, old-format refusal) and the "resuming from round R" line.

``CHECKPOINT_CASES`` is imported by tests/test_bad_inputs.py: each case is a row of the
bad-input table in docs/bad_inputs.md. Over 600 lines: the hostile cases, their builders and the
property tests share one pristine run and its copies.
"""

import atexit
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import tempfile
import zipfile

import flax.linen as nn
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fedjax_dro import algorithms as A, run
from fedjax_dro.common.model import model_identity
from fedjax_dro.models import from_flax
from fedjax_dro.records import checkpoint
from fedjax_dro.records.checkpoint import CheckpointError, CheckpointManifestError
from tests.helpers import dataset, linreg, regression_clients

ROUNDS, EVERY = 8, 2
NEWEST = "ckpt-00000008"
_STATE = {}


def _pristine():
  """A finished checkpointed run (built once): its directory, algorithm, data and history."""
  if not _STATE:
    root = tempfile.mkdtemp(prefix="fedjax-dro-checkpoint-cases-")
    atexit.register(shutil.rmtree, root, True)
    alg = A.scaffold(linreg(3), clients_per_round=2, local_steps=2, batch_size=3)
    ds = dataset(regression_clients(n=4, d=3, seed=5))
    ckpt = os.path.join(root, "pristine")
    hist = run(alg, ds, rounds=ROUNDS, eval_every=EVERY, checkpoint_dir=ckpt)
    _STATE.update(root=root, dir=ckpt, alg=alg, ds=ds, hist=hist)
  return _STATE


def _copy() -> str:
  p = _pristine()
  ckpt = os.path.join(tempfile.mkdtemp(dir=p["root"]), "ckpt")
  shutil.copytree(p["dir"], ckpt, symlinks=True)
  return ckpt


@contextlib.contextmanager
def _no_hang(seconds=60):
  """Fails (TimeoutError, not a ValueError) instead of hanging."""

  def alarm(*_):
    raise TimeoutError(f"still running after {seconds} s")

  old = signal.signal(signal.SIGALRM, alarm)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _resume(ckpt):
  p = _pristine()
  with _no_hang():
    return run(p["alg"], p["ds"], rounds=ROUNDS, eval_every=EVERY, checkpoint_dir=ckpt)


def _read_json(path):
  with open(path) as f:
    return json.load(f)


def _write(path, data):
  if os.path.lexists(path):
    os.remove(path)
  with open(path, "wb") as f:
    f.write(data)


def manifest_edit(edit):
  """Resumes a copy of the pristine run whose newest manifest was changed by ``edit(m)``."""
  ckpt = _copy()
  path = os.path.join(ckpt, NEWEST + ".json")
  m = _read_json(path)
  edit(m)
  _write(path, json.dumps(m).encode())
  return _resume(ckpt)


def npz_edit(edit):
  """Resumes a copy whose newest .npz is ``edit(bytes)``, the manifest's SHA-256 updated."""
  ckpt = _copy()
  npz, path = os.path.join(ckpt, NEWEST + ".npz"), os.path.join(ckpt, NEWEST + ".json")
  with open(npz, "rb") as f:
    blob = edit(f.read())
  _write(npz, blob)
  m = _read_json(path)
  m["sha256"] = hashlib.sha256(blob).hexdigest()
  _write(path, json.dumps(m).encode())
  return _resume(ckpt)


def file_swap(name, make):
  """Resumes a copy whose file ``name`` was replaced by ``make(path)`` (a FIFO, a link...)."""
  ckpt = _copy()
  path = os.path.join(ckpt, name)
  os.remove(path)
  make(path)
  return _resume(ckpt)


def _flip(blob, at=None):
  at = len(blob) // 2 if at is None else at
  return blob[:at] + bytes([blob[at] ^ 0xFF]) + blob[at + 1 :]


def _huge_header(blob):
  """The .npz with state_0000's header claiming 10**12 elements (data unchanged)."""
  out = io.BytesIO()
  with zipfile.ZipFile(io.BytesIO(blob)) as src, zipfile.ZipFile(out, "w") as dst:
    for info in src.infolist():
      data = src.read(info)
      if info.filename == "state_0000.npy":
        arr = np.load(io.BytesIO(data), allow_pickle=False)
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(
          head, {"descr": arr.dtype.str, "fortran_order": False, "shape": (10**12,)}
        )
        data = head.getvalue() + arr.tobytes()  # the header starts with the magic
      dst.writestr(info.filename, data)
  return out.getvalue()


def _flip_file(path, at=None):
  with open(path, "rb") as f:
    blob = f.read()
  _write(path, _flip(blob, at))


def _log_flip(ckpt):
  _flip_file(os.path.join(ckpt, checkpoint.LOG_FILE), 40)


def _log_short(m):
  m["log"]["bytes"] += 10


def _set(key, value):
  return lambda m: m.__setitem__(key, value)


def _spec(field, value):
  return lambda m: m["arrays"]["state_0000"].__setitem__(field, value)


def _other_model():
  ckpt = _copy()
  p = _pristine()
  alg = A.scaffold(linreg(3, l2=1.0), clients_per_round=2, local_steps=2, batch_size=3)
  with _no_hang():
    run(alg, p["ds"], rounds=ROUNDS, eval_every=EVERY, checkpoint_dir=ckpt)


def _version_2(m):
  m["version"] = 2
  m["evaluations"] = []


def _custom(fn):
  def case():
    ckpt = _copy()
    fn(ckpt)
    return _resume(ckpt)

  return case


# description: (call, exception, what the message names) -- rows of docs/bad_inputs.md
def _non_finite(value):
  """An .npz edit: the same arrays, the first floating one's first entry set to ``value``."""

  def edit(blob):
    with np.load(io.BytesIO(blob)) as z:
      arrays = {k: np.array(z[k]) for k in z.files}
    name = next(k for k in sorted(arrays) if arrays[k].dtype.kind == "f" and arrays[k].size)
    arrays[name].reshape(-1)[0] = value
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()

  return edit


CHECKPOINT_CASES = {
  "checkpoint state holding NaN (hashes consistent)": (
    lambda: npz_edit(_non_finite(np.nan)),
    CheckpointError,
    "NaN or infinite",
  ),
  "checkpoint state holding -inf (hashes consistent)": (
    lambda: npz_edit(_non_finite(-np.inf)),
    CheckpointError,
    f"{NEWEST}.npz: state array state_",
  ),
  "checkpoint .npz with a flipped byte (SHA-256 recomputed)": (
    lambda: npz_edit(_flip),
    CheckpointError,
    f"{NEWEST}.npz",
  ),
  "checkpoint .npz with a flipped byte": (
    _custom(lambda d: _flip_file(os.path.join(d, NEWEST + ".npz"))),
    CheckpointError,
    f"{NEWEST}.npz is corrupt",
  ),
  "checkpoint manifest without next_chunk": (
    lambda: manifest_edit(lambda m: m.pop("next_chunk")),
    CheckpointManifestError,
    "field 'next_chunk' is missing",
  ),
  "checkpoint manifest without train_metrics": (
    lambda: manifest_edit(lambda m: m.pop("train_metrics")),
    CheckpointManifestError,
    "field 'train_metrics' is missing",
  ),
  "checkpoint manifest array without kind": (
    lambda: manifest_edit(lambda m: m["arrays"]["state_0000"].pop("kind")),
    CheckpointManifestError,
    "field 'arrays.state_0000.kind'",
  ),
  "checkpoint manifest status 1e300": (
    lambda: manifest_edit(_set("status", [False, 1e300])),
    CheckpointManifestError,
    "field 'status[1]'",
  ),
  "checkpoint manifest next_chunk 10**18": (
    lambda: manifest_edit(_set("next_chunk", 10**18)),
    CheckpointManifestError,
    "field 'next_chunk'",
  ),
  "checkpoint manifest next_chunk -3": (
    lambda: manifest_edit(_set("next_chunk", -3)),
    CheckpointManifestError,
    "field 'next_chunk'",
  ),
  "checkpoint manifest next_chunk a string": (
    lambda: manifest_edit(_set("next_chunk", "4")),
    CheckpointManifestError,
    "field 'next_chunk' must be an integer",
  ),
  "checkpoint manifest next_chunk beyond the run's chunks": (
    lambda: manifest_edit(_set("next_chunk", 5)),
    CheckpointManifestError,
    "field 'next_chunk'",
  ),
  "checkpoint manifest rounds_done not its file's round": (
    lambda: manifest_edit(_set("rounds_done", 6)),
    CheckpointManifestError,
    "field 'rounds_done'",
  ),
  "checkpoint manifest wall_time 1e300": (
    lambda: manifest_edit(_set("wall_time", 1e300)),
    CheckpointManifestError,
    "field 'wall_time'",
  ),
  "checkpoint manifest with an unknown field": (
    lambda: manifest_edit(_set("payload", "x")),
    CheckpointManifestError,
    "field 'payload'",
  ),
  "checkpoint manifest dtype 'O'": (
    lambda: manifest_edit(_spec("dtype", "O")),
    CheckpointManifestError,
    "field 'arrays.state_0000.dtype'",
  ),
  "checkpoint manifest PRNG implementation 'evil'": (
    lambda: manifest_edit(
      lambda m: m["arrays"].__setitem__(
        "state_0000", {"kind": "prng_key", "impl": "evil", "shape": [2]}
      )
    ),
    CheckpointManifestError,
    "field 'arrays.state_0000.impl'",
  ),
  "checkpoint manifest of format version 2": (
    lambda: manifest_edit(_version_2),
    CheckpointError,
    "format version 2",
  ),
  "checkpoint .npz header claiming 10**12 elements": (
    lambda: npz_edit(_huge_header),
    CheckpointError,
    "member 'state_0000'",
  ),
  "checkpoint manifest a FIFO (never opened for reading)": (
    lambda: file_swap(NEWEST + ".json", os.mkfifo),
    CheckpointError,
    f"{NEWEST}.json is not a regular file (a FIFO)",
  ),
  "checkpoint .npz a symlink to /dev/zero": (
    lambda: file_swap(NEWEST + ".npz", lambda p: os.symlink("/dev/zero", p)),
    CheckpointError,
    f"{NEWEST}.npz is a symbolic link to /dev/zero",
  ),
  "history.log a symlink to /dev/zero": (
    lambda: file_swap(checkpoint.LOG_FILE, lambda p: os.symlink("/dev/zero", p)),
    CheckpointError,
    "history.log is a symbolic link to /dev/zero",
  ),
  "history.log shorter than its manifest says": (
    lambda: manifest_edit(_log_short),
    CheckpointError,
    "history.log holds",
  ),
  "history.log with a flipped byte": (_custom(_log_flip), CheckpointError, "history.log"),
  "resume with another model of the same shapes (l2=0, then l2=1.0)": (
    _other_model,
    CheckpointError,
    "l2=1.0",
  ),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_hostile_checkpoint_is_one_clear_error_naming_file_and_field(case):
  fn, exc, fragment = CHECKPOINT_CASES[case]
  with pytest.raises(exc) as info:
    fn()
  text = str(info.value)
  assert fragment in text, text
  assert "ckpt" in text or "history.log" in text, text  # the file
  if isinstance(info.value, CheckpointManifestError):
    assert info.value.path.endswith(".json") and info.value.field in text


def test_another_model_names_both_identities():
  with pytest.raises(CheckpointError) as info:
    _other_model()
  assert "l2=0.0" in str(info.value) and "l2=1.0" in str(info.value)
  assert "another model" in str(info.value)


class _Act(nn.Module):
  act: object = nn.relu

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(self.act(nn.Dense(3)(x)))


def test_flax_models_of_the_same_shapes_have_other_identities():
  x = np.zeros((1, 4), np.float32)
  relu, relu2, tanh = (from_flax(_Act(a), x) for a in (nn.relu, nn.relu, nn.tanh))
  assert model_identity(relu) == model_identity(relu2)  # deterministic (no memory addresses)
  assert model_identity(relu) != model_identity(tanh)
  assert " at 0x" not in model_identity(relu)
  assert model_identity(linreg(3)) != model_identity(linreg(3, l2=1.0))


# ----------------------------------------------------------------------------------------------
# Property-based: random mutations of a valid manifest
# ----------------------------------------------------------------------------------------------
def _load(ckpt):
  p = _pristine()
  return checkpoint.load_checkpoint(ckpt, p["hist"].config, p["hist"].final_state)


def _same(a, b):
  (pa, sa), (pb, sb) = a, b
  for key in ("next_chunk", "rounds_done", "status"):
    assert pa[key] == pb[key], key
  assert 0 <= pa["wall_time"] <= 1e12  # informational (seconds spent): any number in range loads
  assert os.path.basename(pa["path"]) == os.path.basename(pb["path"])
  assert list(pa["train_metrics"]) == list(pb["train_metrics"])
  for k in pa["train_metrics"]:
    assert pa["train_metrics"][k].tobytes() == pb["train_metrics"][k].tobytes()
  assert json.dumps(pa["evaluations"], default=lambda x: x.tobytes().hex()) == json.dumps(
    pb["evaluations"], default=lambda x: x.tobytes().hex()
  )
  for x, y in zip(jax_leaves(sa), jax_leaves(sb)):
    assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def jax_leaves(tree):
  import jax

  return jax.tree.leaves(tree)


_JSON = st.recursive(
  st.none()
  | st.booleans()
  | st.integers(min_value=-(2**70), max_value=2**70)
  | st.floats(allow_nan=False, allow_infinity=False)
  | st.text(max_size=8),
  lambda inner: (
    st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
  ),
  max_leaves=6,
)


def _paths(obj, prefix=()):
  yield prefix
  if isinstance(obj, dict):
    for k, v in obj.items():
      yield from _paths(v, prefix + (k,))
  elif isinstance(obj, list):
    for i, v in enumerate(obj):
      yield from _paths(v, prefix + (i,))


def _mutate(m, path, op, value):
  if not path:
    return value if op == "replace" else m
  parent = m
  for key in path[:-1]:
    parent = parent[key]
  last = path[-1]
  if op == "delete":
    parent.pop(last) if isinstance(parent, dict) else parent.pop(last)
  elif op == "replace":
    parent[last] = value
  elif op == "add" and isinstance(parent, dict):
    parent[f"{last}_extra"] = value
  elif op == "numeric" and type(parent[last]) in (int, float):
    parent[last] = parent[last] + (value if type(value) in (int, float) else 1)
  return m


def _check_mutation(edit_file):
  ckpt = _copy()
  edit_file(ckpt)
  try:
    with _no_hang(30):
      got = _load(ckpt)
  except CheckpointError:
    return "refused"
  _same(got, _load(_pristine()["dir"]))
  return "identical"


@settings(
  max_examples=60,
  deadline=None,
  database=None,
  suppress_health_check=[HealthCheck.too_slow],
  derandomize=True,
)
@given(
  choice=st.integers(min_value=0, max_value=10**6),
  op=st.sampled_from(["delete", "replace", "add", "numeric"]),
  value=_JSON,
)
def test_mutated_manifests_load_identically_or_raise_checkpoint_error(choice, op, value):
  def edit(ckpt):
    path = os.path.join(ckpt, NEWEST + ".json")
    m = _read_json(path)
    paths = list(_paths(m))
    m = _mutate(m, paths[choice % len(paths)], op, value)
    _write(path, json.dumps(m).encode())

  _check_mutation(edit)


@settings(max_examples=40, deadline=None, database=None, derandomize=True)
@given(
  which=st.sampled_from([".npz", ".json", "log"]),
  at=st.integers(min_value=0, max_value=10**6),
  mask=st.integers(min_value=1, max_value=255),
  fix_sha=st.booleans(),
  cut=st.booleans(),
)
def test_damaged_files_load_identically_or_raise_checkpoint_error(which, at, mask, fix_sha, cut):
  def edit(ckpt):
    name = checkpoint.LOG_FILE if which == "log" else NEWEST + which
    path = os.path.join(ckpt, name)
    with open(path, "rb") as f:
      blob = f.read()
    i = at % len(blob)
    blob = blob[:i] if cut else blob[:i] + bytes([blob[i] ^ mask]) + blob[i + 1 :]
    _write(path, blob)
    if which == ".npz" and fix_sha:
      mpath = os.path.join(ckpt, NEWEST + ".json")
      m = _read_json(mpath)
      m["sha256"] = hashlib.sha256(blob).hexdigest()
      _write(mpath, json.dumps(m).encode())

  _check_mutation(edit)


def test_every_manifest_field_removed_or_retyped_is_named():
  for field in checkpoint.FIELDS[2:]:  # format and version: "not a checkpoint" / "version"
    for retype in (False, True):
      ckpt = _copy()
      path = os.path.join(ckpt, NEWEST + ".json")
      m = _read_json(path)
      if retype:
        m[field] = "x"
      else:
        m.pop(field)
      _write(path, json.dumps(m).encode())
      with pytest.raises(CheckpointError) as info:
        _load(ckpt)
      assert field in str(info.value) or "different run" in str(info.value), str(info.value)
      assert NEWEST in str(info.value)


# ----------------------------------------------------------------------------------------------
# The history log: constant checkpoint size, torn appends, resume line
# ----------------------------------------------------------------------------------------------
def test_checkpoint_size_does_not_grow_with_the_run(tmp_path):
  alg = A.fedavg(linreg(3))
  ds = dataset(regression_clients(n=4, d=3, seed=5))
  ckpt = str(tmp_path / "ckpt")
  run(alg, ds, rounds=40, eval_every=2, checkpoint_dir=ckpt, keep_checkpoints=100)
  sizes = {
    ext: [os.path.getsize(os.path.join(ckpt, f"ckpt-{r:08d}{ext}")) for r in (2, 40)]
    for ext in (".npz", ".json")
  }
  assert sizes[".npz"][0] == sizes[".npz"][1]
  assert abs(sizes[".json"][1] - sizes[".json"][0]) < 40  # digits of the counters only
  log = os.path.getsize(os.path.join(ckpt, checkpoint.LOG_FILE))
  assert log > sizes[".npz"][0] + sizes[".json"][0]  # the history lives in the log (20 records)


def test_resume_cuts_a_torn_log_append_and_equals_the_uninterrupted_run(tmp_path, capsys):
  alg = A.scaffold(linreg(3), clients_per_round=2, local_steps=2, batch_size=3)
  ds = dataset(regression_clients(n=4, d=3, seed=7))
  full = run(alg, ds, rounds=10, eval_every=2)
  ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
  run(alg, ds, rounds=10, eval_every=2, checkpoint_dir=ckpt, out_dir=out, keep_checkpoints=5)
  # as if killed after round 6's checkpoint, while appending the next records: checkpoints 8 and
  # 10 gone, the log holds their records and a torn tail
  for r in (8, 10):
    for ext in (".npz", ".json"):
      os.remove(os.path.join(ckpt, f"ckpt-{r:08d}{ext}"))
  with open(os.path.join(ckpt, checkpoint.LOG_FILE), "ab") as f:
    f.write(b"FDJXLOG1\x00\x10")
  capsys.readouterr()
  resumed = run(alg, ds, rounds=10, eval_every=2, checkpoint_dir=ckpt, out_dir=out)
  err = capsys.readouterr().err
  assert f"resuming from round 6 (checkpoint {os.path.join(ckpt, 'ckpt-00000006.json')})" in err
  for k in full.train_metrics:
    assert full.train_metrics[k].tobytes() == resumed.train_metrics[k].tobytes()
  assert [e["summary"] for e in full.evaluations] == [e["summary"] for e in resumed.evaluations]
  for a, b in zip(full.evaluations, resumed.evaluations):
    for k in a["per_client"]:
      assert np.asarray(a["per_client"][k]).tobytes() == np.asarray(b["per_client"][k]).tobytes()
  # and the log now resumes again cleanly from its newest checkpoint
  again = run(alg, ds, rounds=10, eval_every=2, checkpoint_dir=ckpt)
  assert [e["round"] for e in again.evaluations] == [2, 4, 6, 8, 10]
  assert "resuming from round 10" in capsys.readouterr().err


def test_a_fresh_run_prints_no_resume_line(tmp_path, capsys):
  run(
    A.fedavg(linreg(3)),
    dataset(regression_clients(n=4, d=3)),
    rounds=2,
    checkpoint_dir=str(tmp_path),
  )
  assert "resuming" not in capsys.readouterr().err


def resume_line_behaviour():
  """The bad-input table's row (tests/test_bad_inputs.py): a resume says where it resumes."""
  ckpt = _copy()
  os.remove(os.path.join(ckpt, NEWEST + ".json"))  # as if killed before round 8's manifest
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    hist = _resume(ckpt)
  expected = f"resuming from round 6 (checkpoint {os.path.join(ckpt, 'ckpt-00000006.json')})"
  assert expected in err.getvalue(), err.getvalue()
  assert [e["round"] for e in hist.evaluations] == [2, 4, 6, 8]


def test_non_finite_checkpoint_state_resumes_with_check_finite_off():
  """The refusal follows the run's check_finite: a run that accepts non-finite rounds resumes
  from such a state (and records the non-finite values it computes)."""
  ckpt = _copy()
  npz, path = os.path.join(ckpt, NEWEST + ".npz"), os.path.join(ckpt, NEWEST + ".json")
  with open(npz, "rb") as f:
    blob = _non_finite(np.nan)(f.read())
  _write(npz, blob)
  m = _read_json(path)
  m["sha256"] = hashlib.sha256(blob).hexdigest()
  _write(path, json.dumps(m).encode())
  p = _pristine()
  with _no_hang():
    hist = run(
      p["alg"], p["ds"], rounds=ROUNDS, eval_every=EVERY, checkpoint_dir=ckpt, check_finite=False
    )
  assert hist.config["rounds"] == ROUNDS
