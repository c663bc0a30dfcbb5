"""Checkpoints of :func:`fedjax_dro.run`: arrays and JSON only, atomic, checksummed, locked.

Reading a checkpoint never runs code: there is no pickle anywhere. A checkpoint after ``R``
rounds is two files in ``checkpoint_dir``:

* ``ckpt-{R:08d}.npz``: the state leaves (``state_0000`` ...), the per-round training metrics
  (``train__<name>``) and the per-client evaluation metrics (``eval_0003__accuracy`` ...), written
  with ``np.savez`` and read with ``np.load(..., allow_pickle=False)``. Leaves of dtypes NumPy
  cannot store natively (bfloat16, typed PRNG keys) are stored as raw bits and restored exactly.
* ``ckpt-{R:08d}.json``: the manifest: ``format`` (:data:`FORMAT`), ``version``, the run's
  configuration (a resume must match it), the position (``next_chunk``, ``rounds_done``,
  ``status``), wall time, the evaluation summaries, the dtype and shape of every stored array,
  and the SHA-256 of the ``.npz`` file.

Atomicity: the ``.npz`` is written to a temporary file, flushed, ``fsync``-ed and renamed; then
the manifest, the same way. A checkpoint exists only once its manifest does, so a process killed
at any moment leaves either the previous checkpoints or the new one complete (temporary files of
an interrupted write start with ``.tmp-`` and are ignored, and removed by the next write).
Only the newest ``keep`` checkpoints are kept.

Validation: a resume loads the newest manifest and checks format, version, configuration,
checksum, array names, shapes and dtypes against the run's state; anything that does not match
(a corrupt, truncated or foreign file, an old ``checkpoint.pkl``) raises a ``ValueError`` that
names the file, and nothing in the directory is changed. A directory that holds files which are
not checkpoints is refused the same way (subdirectories and fedjax_dro's own result files,
``metrics.jsonl``, ``summary.json``, ``metrics.csv``, ``clients.csv``, are allowed, so ``out_dir``
and ``checkpoint_dir`` may be the same directory).

Locking: :class:`CheckpointLock` holds an exclusive ``fcntl`` lock on ``checkpoint_dir/.lock``
for the whole run; a second process that opens the same directory is refused with a clear
error. The operating system releases the lock when the holder dies (no stale locks).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

# The format tag every manifest carries (the module's name when the format was made; kept so that
# existing checkpoints still load).
FORMAT = ".".join(("fedjax_dro", "checkpoint"))
VERSION = 2
LOCK_FILE = ".lock"
_NAME = re.compile(r"^ckpt-(\d{8})\.(npz|json)$")
_TMP_PREFIX = ".tmp-"
# Files fedjax_dro itself may write beside checkpoints (``--out`` and ``--checkpoint-dir`` may be
# the same directory): the lock and the result files of ``run``.
_ALLOWED = {
  ".lock",
  "metrics.jsonl",
  "summary.json",
  "metrics.csv",
  "clients.csv",
}
# Test hook: seconds to sleep between writing the .npz and its manifest, so that a test can kill
# the process *during* a checkpoint write (tests/records/test_checkpoint.py). Never set in normal use.
_WRITE_DELAY_ENV = "FEDJAX_DRO_TEST_CHECKPOINT_WRITE_DELAY"


class CheckpointError(ValueError):
  """A checkpoint directory or file that cannot be used (names the file and the reason)."""


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------
def _fsync_dir(directory: str) -> None:
  try:
    fd = os.open(directory, os.O_RDONLY)
  except OSError:  # pragma: no cover - platforms without directory fds
    return
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _write_atomic(path: str, write) -> None:
  """``write(file)`` into a temporary file beside ``path``, fsync, rename into place."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=_TMP_PREFIX, suffix=os.path.basename(path))
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  _fsync_dir(directory)


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _json_ready(obj):
  """``obj`` with NumPy scalars / arrays turned into JSON types (floats kept exactly)."""
  return json.loads(json.dumps(obj, default=_json_default))


def _json_default(obj):
  if isinstance(obj, np.generic):
    return obj.item()
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  return str(obj)


# ----------------------------------------------------------------------------------------------
# Array encoding (exact, without pickle)
# ----------------------------------------------------------------------------------------------
def _encode(x) -> Tuple[np.ndarray, Dict[str, Any]]:
  """``(storable array, spec)``: standard dtypes as they are, others as raw bits."""
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    impl = str(jax.random.key_impl(x))
    data = np.asarray(jax.random.key_data(x))
    return data, {"kind": "prng_key", "impl": impl, "shape": list(x.shape)}
  arr = np.asarray(x)
  if arr.dtype.kind in "biufc" and arr.dtype.isbuiltin:
    return arr, {"kind": "array", "dtype": arr.dtype.str, "shape": list(arr.shape)}
  bits = arr.view(np.dtype(f"u{arr.dtype.itemsize}"))
  return bits, {"kind": "bits", "dtype": str(arr.dtype), "shape": list(arr.shape)}


def _decode(stored: np.ndarray, spec: Dict[str, Any], template, where: str):
  shape = tuple(spec["shape"])
  if spec["kind"] == "prng_key":
    key = jax.random.wrap_key_data(jnp.asarray(stored), impl=spec["impl"])
    if tuple(key.shape) != shape:
      raise CheckpointError(f"{where}: key shape {key.shape} does not match {shape}")
    return key
  if spec["kind"] == "bits":
    dtype = jnp.dtype(spec["dtype"])
    arr = stored.view(dtype)
  else:
    arr = stored
  if arr.shape != shape or str(arr.dtype) != str(jnp.dtype(template.dtype)):
    raise CheckpointError(
      f"{where}: stored array {arr.dtype}{list(arr.shape)} does not match the run's state "
      f"{jnp.dtype(template.dtype)}{list(np.shape(template))}"
    )
  return jnp.asarray(arr)


# ----------------------------------------------------------------------------------------------
# The directory
# ----------------------------------------------------------------------------------------------
class CheckpointLock:
  """Exclusive lock on ``directory`` for one run (``with CheckpointLock(d): ...``)."""

  def __init__(self, directory: str):
    self.directory = directory
    self._fd: Optional[int] = None

  def __enter__(self):
    os.makedirs(self.directory, exist_ok=True)
    path = os.path.join(self.directory, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      raise CheckpointError(
        f"checkpoint_dir {self.directory!r} is in use by another run (a live process holds "
        f"{path}); wait for it to finish or use another directory"
      ) from None
    self._fd = fd
    return self

  def __exit__(self, *exc):
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None
    return False


def scan(directory: str) -> List[int]:
  """Rounds of the complete checkpoints in ``directory`` (ascending); refuses foreign files."""
  if not os.path.isdir(directory):
    return []
  rounds = []
  for name in sorted(os.listdir(directory)):
    if name in _ALLOWED or name.startswith(_TMP_PREFIX):
      continue
    if os.path.isdir(os.path.join(directory, name)):
      continue  # e.g. an out_dir inside the checkpoint directory
    match = _NAME.match(name)
    if match is None:
      hint = (
        " (a pickle checkpoint of fedjax_dro < 0.2: it is never read; delete it)"
        if name.endswith(".pkl")
        else ""
      )
      raise CheckpointError(
        f"checkpoint_dir {directory!r} contains {name!r}, which is not a fedjax_dro checkpoint"
        f"{hint}; use an empty directory or one written by fedjax_dro"
      )
    if match.group(2) == "json":
      rounds.append(int(match.group(1)))
  return sorted(rounds)


def _paths(directory: str, rounds_done: int) -> Tuple[str, str]:
  stem = os.path.join(directory, f"ckpt-{rounds_done:08d}")
  return stem + ".npz", stem + ".json"


def save_checkpoint(
  directory: str,
  config: Dict[str, Any],
  next_chunk: int,
  rounds_done: int,
  state,
  status: Tuple[bool, int],
  history,
  wall: float,
  keep: int = 2,
) -> str:
  """Writes the checkpoint after ``rounds_done`` rounds (atomically); returns the manifest path.

  Keeps the newest ``keep`` checkpoints and removes leftovers of interrupted writes.
  """
  os.makedirs(directory, exist_ok=True)
  arrays: Dict[str, np.ndarray] = {}
  specs: Dict[str, Dict[str, Any]] = {}
  for i, leaf in enumerate(jax.tree.leaves(state)):
    arrays[f"state_{i:04d}"], specs[f"state_{i:04d}"] = _encode(leaf)
  for name, values in history.train_metrics.items():
    arrays[f"train__{name}"], specs[f"train__{name}"] = _encode(np.asarray(values))
  evaluations = []
  for j, ev in enumerate(history.evaluations):
    metrics = sorted(ev["per_client"])
    for name in metrics:
      key = f"eval_{j:04d}__{name}"
      arrays[key], specs[key] = _encode(np.asarray(ev["per_client"][name]))
    evaluations.append({"round": int(ev["round"]), "metrics": metrics, "summary": ev["summary"]})
  npz_path, json_path = _paths(directory, rounds_done)
  _write_atomic(npz_path, lambda f: np.savez(f, **arrays))
  delay = float(os.environ.get(_WRITE_DELAY_ENV, "0") or 0)
  if delay > 0:  # test hook (see _WRITE_DELAY_ENV)
    import time

    time.sleep(delay)
  manifest = {
    "format": FORMAT,
    "version": VERSION,
    "config": _json_ready(config),
    "next_chunk": int(next_chunk),
    "rounds_done": int(rounds_done),
    "status": [bool(status[0]), int(status[1])],
    "wall_time": float(wall),
    "train_metrics": sorted(history.train_metrics),
    "evaluations": _json_ready(evaluations),
    "arrays": specs,
    "num_state_leaves": len(jax.tree.leaves(state)),
    "sha256": _sha256(npz_path),
  }
  _write_atomic(json_path, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
  # retention: the newest `keep` checkpoints; leftovers of interrupted writes
  for old in scan(directory)[:-keep] if keep > 0 else []:
    for path in _paths(directory, old):
      if os.path.exists(path):
        os.remove(path)
  for name in os.listdir(directory):
    if name.startswith(_TMP_PREFIX):
      try:
        os.remove(os.path.join(directory, name))
      except OSError:  # pragma: no cover - raced with another cleaner
        pass
  return json_path


def load_checkpoint(directory: str, config: Dict[str, Any], state):
  """``(payload, restored_state)`` of the newest checkpoint in ``directory``, or None if there
  is none. ``payload`` holds ``next_chunk``, ``rounds_done``, ``status``, ``wall_time``,
  ``train_metrics`` and ``evaluations``. Raises :class:`CheckpointError` (a ``ValueError``)
  naming the file for anything that does not match; nothing is modified."""
  rounds = scan(directory)
  if not rounds:
    return None
  npz_path, json_path = _paths(directory, rounds[-1])
  try:
    with open(json_path, "rb") as f:
      manifest = json.loads(f.read().decode())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{json_path} is not a valid checkpoint manifest ({e})") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise CheckpointError(f"{json_path} is not a fedjax_dro checkpoint manifest")
  if manifest.get("version") != VERSION:
    raise CheckpointError(
      f"{json_path} has checkpoint format version {manifest.get('version')!r}; this fedjax_dro "
      f"reads version {VERSION}"
    )
  stored = manifest.get("config")
  if stored != _json_ready(config):
    current = _json_ready(config)
    diff = sorted(
      k for k in set(current) | set(stored or {}) if current.get(k) != (stored or {}).get(k)
    )
    raise CheckpointError(
      f"checkpoint_dir {directory!r} holds a checkpoint of a different run (differs in {diff}; "
      f"{json_path}); use another directory or delete its checkpoints"
    )
  if not os.path.exists(npz_path):
    raise CheckpointError(f"{npz_path} is missing (its manifest {json_path} exists)")
  if _sha256(npz_path) != manifest.get("sha256"):
    raise CheckpointError(
      f"{npz_path} is corrupt or truncated (SHA-256 does not match {json_path})"
    )
  leaves, treedef = jax.tree.flatten(state)
  specs = manifest.get("arrays", {})
  if manifest.get("num_state_leaves") != len(leaves):
    raise CheckpointError(
      f"{json_path}: the checkpoint has {manifest.get('num_state_leaves')} state arrays, the run's "
      f"algorithm state has {len(leaves)}"
    )
  try:
    with np.load(npz_path, allow_pickle=False) as npz:
      data = {name: npz[name] for name in npz.files}
  except (OSError, ValueError, EOFError) as e:
    raise CheckpointError(f"{npz_path} cannot be read as arrays ({e})") from None
  if set(data) != set(specs):
    raise CheckpointError(f"{npz_path}: its arrays do not match the manifest {json_path}")
  restored = [
    _decode(data[f"state_{i:04d}"], specs[f"state_{i:04d}"], leaf, f"{npz_path}[state_{i:04d}]")
    for i, leaf in enumerate(leaves)
  ]
  train_metrics = {name: data[f"train__{name}"] for name in manifest["train_metrics"]}
  evaluations = []
  for j, ev in enumerate(manifest["evaluations"]):
    per_client = {name: data[f"eval_{j:04d}__{name}"] for name in ev["metrics"]}
    evaluations.append({"round": ev["round"], "per_client": per_client, "summary": ev["summary"]})
  payload = {
    "next_chunk": manifest["next_chunk"],
    "rounds_done": manifest["rounds_done"],
    "status": tuple(manifest["status"]),
    "wall_time": manifest["wall_time"],
    "train_metrics": train_metrics,
    "evaluations": evaluations,
    "path": json_path,
  }
  return payload, jax.tree.unflatten(treedef, restored)
