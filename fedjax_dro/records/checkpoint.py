"""Checkpoints of :func:`fedjax_dro.run`: arrays and JSON only, atomic, checksummed, locked,
validated against a schema before anything in them is used.

Reading a checkpoint never runs code: there is no pickle anywhere. ``checkpoint_dir`` holds:

* ``ckpt-{R:08d}.npz``: the algorithm state after ``R`` rounds (``state_0000`` ...), written with
  ``np.savez``. Leaves of dtypes NumPy cannot store natively (bfloat16, typed PRNG keys) are
  stored as raw bits and restored exactly. Its size is the state's: it does not grow with the run.
* ``ckpt-{R:08d}.json``: the manifest (:data:`FIELDS`): ``format`` (:data:`FORMAT`),
  ``version`` (:data:`VERSION`), the run's configuration (a resume must match it, the model's
  identity included), the position (``next_chunk``, ``rounds_done``, ``status``), wall time, the
  names of the training metrics, the dtype and shape of every state array, the SHA-256 of the
  ``.npz`` and the extent of the history log (``log``: records, bytes, chained SHA-256).
* ``history.log``: the run's history, appended at every checkpoint and never rewritten: one record
  per evaluation (``FDJXLOG1``, an 8-byte length, then an ``.npz`` with the training metrics of
  the rounds since the previous evaluation, the per-client metrics and, as JSON, the round and the
  summary). A checkpoint uses the first ``log.bytes`` bytes; bytes after them (an append that a
  kill interrupted) are cut off by the next write.

Atomicity: the log records are appended and forced to disk, then the ``.npz`` is written to a
temporary file, ``fsync``-ed and renamed, then the manifest the same way. A checkpoint exists only
once its manifest does, so a process killed at any moment leaves either the previous checkpoints
or the new one complete. Only the newest ``keep`` checkpoints are kept.

Validation (:func:`load_checkpoint`): only regular files are opened (a FIFO or device named like a
checkpoint is refused, never read; a symbolic link is followed only to a regular file inside the
directory), and never more bytes than the run's state and the manifest's log extent allow. The
manifest is checked field by field (types, ranges, known keys, consistency with the file name, the
run's configuration and chunks, and the state's arrays); the ``.npz`` members' headers are checked
against the run's state before any array is allocated. Every problem raises one
:class:`CheckpointError` (a ``ValueError``) naming the file (and, for the manifest, the field:
:class:`CheckpointManifestError`), and nothing in the directory is changed. Checkpoints of format
version 2 (every evaluation copied into each manifest) are refused with a message saying so.
A directory that holds files which are not checkpoints is refused the same way (subdirectories and
fedjax_dro's own result files are allowed, so ``out_dir`` and ``checkpoint_dir`` may be the same
directory).

Locking: :class:`CheckpointLock` holds an exclusive ``fcntl`` lock on ``checkpoint_dir/.lock``
for the whole run; a second process that opens the same directory is refused with a clear
error. The operating system releases the lock when the holder dies (no stale locks).

This module is over 600 lines on purpose: the writer and the field-by-field reader of one file
format stay side by side, so that every field written is a field checked.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import struct
from typing import Any, Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.records.files import (
  DirectoryLock,
  FileWriteError,
  UnreadableFileError,
  atomic_write,
  open_regular_file,
  read_npz_bytes,
  read_regular_file,
  read_up_to,
  write_all,
)

# The format tag every manifest carries (the module's name when the format was made).
FORMAT = ".".join(("fedjax_dro", "checkpoint"))
VERSION = 3
LOCK_FILE = ".lock"
LOG_FILE = "history.log"
# Every field of a manifest (all required, no others).
FIELDS = (
  "format",
  "version",
  "config",
  "next_chunk",
  "rounds_done",
  "status",
  "wall_time",
  "train_metrics",
  "arrays",
  "num_state_leaves",
  "sha256",
  "log",
)
PRNG_IMPLS = ("threefry2x32", "threefry4x32", "philox2x32", "philox4x32", "rbg", "unsafe_rbg")
_NAME = re.compile(r"^ckpt-(\d{8})\.(npz|json)$")
_METRIC = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TMP_PREFIX = ".tmp-"
_LOG_MAGIC = b"FDJXLOG1"
_LOG_SEED = hashlib.sha256(b"fedjax_dro history log").hexdigest()
_MANIFEST_LIMIT = 16 << 20
_MEMBER_OVERHEAD = 4096  # zip entry + .npy header bytes per member, generously
_MAX_INT = 2**31 - 1
# Files fedjax_dro itself may write beside checkpoints (``--out`` and ``--checkpoint-dir`` may be
# the same directory): the lock, the history log and the result files of ``run``.
_ALLOWED = {".lock", LOG_FILE, "metrics.jsonl", "summary.json", "metrics.csv", "clients.csv"}
# Test hook: seconds to sleep between writing the .npz and its manifest, so that a test can kill
# the process *during* a checkpoint write (tests/records/test_checkpoint.py). Never set in normal use.
_WRITE_DELAY_ENV = "FEDJAX_DRO_TEST_CHECKPOINT_WRITE_DELAY"


class CheckpointError(ValueError):
  """A checkpoint directory or file that cannot be used (names the file and the reason)."""


class CheckpointManifestError(CheckpointError):
  """A manifest field that is missing, unknown, of the wrong type, out of range or inconsistent.
  ``path`` is the manifest, ``field`` the field (dotted for nested ones: ``log.bytes``)."""

  def __init__(self, path: str, field: str, problem: str):
    super().__init__(f"{path}: field {field!r} {problem}")
    self.path, self.field = path, field


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


def _decode(stored: np.ndarray, spec: Dict[str, Any]):
  if spec["kind"] == "prng_key":
    return jax.random.wrap_key_data(jnp.asarray(stored), impl=spec["impl"])
  return jnp.asarray(stored.view(jnp.dtype(spec["dtype"])) if spec["kind"] == "bits" else stored)


def _json_ready(obj):
  """``obj`` with NumPy scalars / arrays turned into JSON types (floats kept exactly)."""
  return json.loads(json.dumps(obj, default=_json_default))


def _json_default(obj):
  if isinstance(obj, np.generic):
    return obj.item()
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  return str(obj)


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _summary_to_json(obj):
  """Summaries as strict JSON: non-finite floats as the strings "NaN", "Infinity", "-Infinity"."""
  if isinstance(obj, dict):
    return {str(k): _summary_to_json(v) for k, v in obj.items()}
  if isinstance(obj, np.generic):
    obj = obj.item()
  if isinstance(obj, float) and not math.isfinite(obj):
    return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
  return obj


# ----------------------------------------------------------------------------------------------
# The directory
# ----------------------------------------------------------------------------------------------
class CheckpointLock(DirectoryLock):
  """Exclusive lock on ``directory`` for one run (``with CheckpointLock(d): ...``): a
  :class:`~fedjax_dro.records.files.DirectoryLock` on its ``.lock`` file, refused with a
  :class:`CheckpointError` naming ``checkpoint_dir`` (``reentrant``: as for ``DirectoryLock``)."""

  def __init__(self, directory: str, *, reentrant: bool = False):
    super().__init__(directory, "checkpoint_dir", LOCK_FILE, CheckpointError, reentrant=reentrant)


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


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------
def _log_record(history, j: int) -> bytes:
  """The history-log record of evaluation ``j``: the training metrics of the rounds since the
  previous evaluation, the per-client metrics, and the round and summary as JSON."""
  ev = history.evaluations[j]
  start = int(history.evaluations[j - 1]["round"]) if j else 0
  stop = int(ev["round"])
  arrays, specs = {}, {}
  for name, values in history.train_metrics.items():
    arrays[f"train__{name}"], specs[f"train__{name}"] = _encode(np.asarray(values)[start:stop])
  for name, values in ev["per_client"].items():
    arrays[f"eval__{name}"], specs[f"eval__{name}"] = _encode(np.asarray(values))
  meta = {
    "round": stop,
    "start": start,
    "summary": _summary_to_json(ev["summary"]),
    "arrays": specs,
  }
  text = json.dumps(meta, default=_json_default, allow_nan=False).encode()
  buf = io.BytesIO()
  np.savez(buf, meta=np.frombuffer(text, np.uint8), **arrays)
  blob = buf.getvalue()
  return _LOG_MAGIC + struct.pack("<Q", len(blob)) + blob


def _chain(digest: str, record: bytes) -> str:
  return hashlib.sha256(bytes.fromhex(digest) + record).hexdigest()


def _check_log_size(fd: int, path: str, expected: int, recorder: str) -> None:
  """Refuses the history log ``fd`` when it holds fewer than the ``expected`` bytes its
  ``recorder`` (a checkpoint) records (truncated)."""
  size = os.fstat(fd).st_size
  if size < expected:
    raise CheckpointError(
      f"{path} holds {size} bytes, fewer than the {expected} {recorder} records (truncated)"
    )


def _append_log(directory: str, history) -> Dict[str, Any]:
  """Appends the evaluations the newest checkpoint's log extent does not hold yet (cutting off
  whatever an interrupted append left after it); the new extent."""
  rounds = scan(directory)
  if rounds:
    json_path = _paths(directory, rounds[-1])[1]
    previous = _schema(_read_manifest(json_path, directory), json_path)["log"]
  else:
    previous = {"records": 0, "bytes": 0, "sha256": _LOG_SEED}
  if previous["records"] > len(history.evaluations):
    raise CheckpointError(
      f"{directory}: the newest checkpoint's log holds {previous['records']} evaluations, more "
      f"than the run's {len(history.evaluations)}"
    )
  records = [_log_record(history, j) for j in range(previous["records"], len(history.evaluations))]
  path = os.path.join(directory, LOG_FILE)
  digest = previous["sha256"]
  for record in records:
    digest = _chain(digest, record)
  try:
    if os.path.lexists(path):
      fd = open_regular_file(path, directory, os.O_WRONLY)
    else:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
  except UnreadableFileError as e:
    raise CheckpointError(str(e)) from None
  except OSError as e:
    raise FileWriteError(path, e) from None
  try:
    _check_log_size(fd, path, previous["bytes"], "its newest checkpoint")
    os.ftruncate(fd, previous["bytes"])
    os.lseek(fd, previous["bytes"], os.SEEK_SET)
    write_all(fd, b"".join(records))
    os.fsync(fd)
  except OSError as e:
    raise FileWriteError(path, e) from None
  finally:
    os.close(fd)
  added = sum(len(r) for r in records)
  return {"records": len(history.evaluations), "bytes": previous["bytes"] + added, "sha256": digest}


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

  Appends the evaluations since the previous checkpoint to the history log, keeps the newest
  ``keep`` checkpoints and removes leftovers of interrupted writes. Raises
  :class:`~fedjax_dro.records.files.FileWriteError` (an ``OSError``) naming the file a write
  failed on (a full disk); the checkpoints already complete stay usable.
  """
  os.makedirs(directory, exist_ok=True)
  leaves = jax.tree.leaves(state)
  arrays: Dict[str, np.ndarray] = {}
  specs: Dict[str, Dict[str, Any]] = {}
  for i, leaf in enumerate(leaves):
    arrays[f"state_{i:04d}"], specs[f"state_{i:04d}"] = _encode(leaf)
  log = _append_log(directory, history)
  npz_path, json_path = _paths(directory, rounds_done)
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  blob = buf.getvalue()
  atomic_write(npz_path, blob, durable=True)
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
    "train_metrics": [str(k) for k in history.train_metrics],
    "arrays": specs,
    "num_state_leaves": len(leaves),
    "sha256": hashlib.sha256(blob).hexdigest(),
    "log": log,
  }
  atomic_write(json_path, json.dumps(manifest, indent=1, allow_nan=False), durable=True)
  # retention: the newest `keep` checkpoints; leftovers of interrupted writes
  for old in scan(directory)[:-keep] if keep > 0 else []:
    for path in _paths(directory, old):
      if os.path.lexists(path):
        os.remove(path)
  for name in os.listdir(directory):
    if name.startswith(_TMP_PREFIX):
      try:
        os.remove(os.path.join(directory, name))
      except OSError:  # pragma: no cover - raced with another cleaner
        pass
  return json_path


# ----------------------------------------------------------------------------------------------
# Reading: the manifest's schema
# ----------------------------------------------------------------------------------------------
def _read_manifest(json_path: str, directory: str) -> Any:
  try:
    text = read_regular_file(json_path, directory, _MANIFEST_LIMIT)
  except UnreadableFileError as e:
    raise CheckpointError(f"{e} (a checkpoint manifest)") from None

  def refuse_constant(token):
    raise ValueError(f"{token} is not JSON")

  try:
    return json.loads(text.decode(), parse_constant=refuse_constant)
  except (UnicodeDecodeError, ValueError, RecursionError) as e:
    raise CheckpointError(f"{json_path} is not a valid checkpoint manifest ({e})") from None


def _shown(value) -> str:
  text = repr(value)
  return (text if len(text) <= 60 else text[:57] + "...") + f" ({type(value).__name__})"


def _int(path, field, value, lo, hi) -> int:
  if type(value) is not int:
    raise CheckpointManifestError(path, field, f"must be an integer, got {_shown(value)}")
  if not lo <= value <= hi:
    raise CheckpointManifestError(path, field, f"is {value}, outside [{lo}, {hi}]")
  return value


def _keys(path, field, value, required) -> Dict[str, Any]:
  if not isinstance(value, dict):
    raise CheckpointManifestError(path, field, f"must be a JSON object, got {_shown(value)}")
  for key in required:
    if key not in value:
      raise CheckpointManifestError(path, f"{field}.{key}" if field else key, "is missing")
  for key in value:
    if key not in required:
      name = f"{field}.{key}" if field else key
      raise CheckpointManifestError(path, name, f"is not a field of a version-{VERSION} manifest")
  return value


def _hex(path, field, value) -> str:
  if not isinstance(value, str) or not _HEX64.match(value):
    raise CheckpointManifestError(path, field, f"must be 64 hex digits, got {_shown(value)}")
  return value


def _schema(m, path: str) -> Dict[str, Any]:
  """The manifest ``m`` checked field by field on its own (types, ranges, known keys)."""
  if not isinstance(m, dict) or m.get("format") != FORMAT:
    raise CheckpointError(f"{path} is not a fedjax_dro checkpoint manifest")
  if type(m.get("version")) is not int or m["version"] != VERSION:
    raise CheckpointError(
      f"{path} has checkpoint format version {m.get('version')!r}; this fedjax_dro reads version "
      f"{VERSION} (version 3 keeps the evaluations in {LOG_FILE} instead of every manifest): "
      f"finish that run with the fedjax_dro that wrote it, or delete its checkpoints"
    )
  _keys(path, "", m, FIELDS)
  if not isinstance(m["config"], dict):
    raise CheckpointManifestError(
      path, "config", f"must be a JSON object, got {_shown(m['config'])}"
    )
  _int(path, "next_chunk", m["next_chunk"], 1, _MAX_INT)
  _int(path, "rounds_done", m["rounds_done"], 0, _MAX_INT)
  status = m["status"]
  if not isinstance(status, list) or len(status) != 2 or type(status[0]) is not bool:
    raise CheckpointManifestError(
      path, "status", f"must be [stopped (true/false), first bad round], got {_shown(status)}"
    )
  _int(path, "status[1]", status[1], -1, _MAX_INT)
  wall = m["wall_time"]
  if type(wall) not in (int, float) or not 0 <= wall <= 1e12:
    raise CheckpointManifestError(
      path, "wall_time", f"must be a number of seconds in [0, 1e12], got {_shown(wall)}"
    )
  names = m["train_metrics"]
  if (
    not isinstance(names, list)
    or len(names) > 1000
    or not all(isinstance(n, str) and _METRIC.match(n) for n in names)
    or len(set(names)) != len(names)
  ):
    raise CheckpointManifestError(
      path, "train_metrics", f"must be a list of distinct metric names, got {_shown(names)}"
    )
  if not isinstance(m["arrays"], dict):
    raise CheckpointManifestError(
      path, "arrays", f"must be a JSON object, got {_shown(m['arrays'])}"
    )
  _int(path, "num_state_leaves", m["num_state_leaves"], 0, 10**6)
  _hex(path, "sha256", m["sha256"])
  log = _keys(path, "log", m["log"], ("records", "bytes", "sha256"))
  _int(path, "log.records", log["records"], 1, _MAX_INT)
  _int(path, "log.bytes", log["bytes"], 0, 2**62)
  _hex(path, "log.sha256", log["sha256"])
  return m


def _check_run(m, path: str, directory: str, config, file_round: int) -> Tuple[int, int]:
  """The manifest against the run: configuration, model, position; ``(rounds, chunk)``."""
  current = _json_ready(config)
  stored = m["config"]
  if stored != current:
    if "model" in current and stored.get("model") != current["model"]:
      raise CheckpointError(
        f"checkpoint_dir {directory!r} holds a checkpoint of another model ({path}: model "
        f"{stored.get('model')!r}); this run's model is {current['model']!r}: use another "
        f"directory or delete its checkpoints"
      )
    diff = sorted(k for k in set(current) | set(stored) if current.get(k) != stored.get(k))
    raise CheckpointError(
      f"checkpoint_dir {directory!r} holds a checkpoint of a different run (differs in {diff}; "
      f"{path}); use another directory or delete its checkpoints"
    )
  rounds = max(1, current.get("rounds", m["rounds_done"]))
  chunk = current.get("eval_every") or rounds
  num_chunks = -(-rounds // chunk)
  next_chunk, done = m["next_chunk"], m["rounds_done"]
  if next_chunk > num_chunks:
    raise CheckpointManifestError(
      path, "next_chunk", f"is {next_chunk}, beyond the run's {num_chunks} chunks of {chunk} rounds"
    )
  if done != file_round:
    raise CheckpointManifestError(
      path, "rounds_done", f"is {done}, but the file is the checkpoint of round {file_round}"
    )
  failed, first_bad = m["status"]
  if failed:
    lo, hi = (next_chunk - 1) * chunk, min(rounds, next_chunk * chunk)
    if not lo <= first_bad < hi or done != first_bad:
      raise CheckpointManifestError(
        path,
        "status",
        f"records a stop at round index {first_bad}, not in chunk {next_chunk - 1} (rounds "
        f"{lo}..{hi - 1}) or not rounds_done ({done})",
      )
  else:
    if first_bad != -1:
      raise CheckpointManifestError(
        path, "status", f"is {json.dumps(m['status'])}: a run that did not stop has -1"
      )
    if done != min(rounds, next_chunk * chunk):
      raise CheckpointManifestError(
        path,
        "rounds_done",
        f"is {done}, but {next_chunk} chunks of {chunk} rounds end at round "
        f"{min(rounds, next_chunk * chunk)}",
      )
  if m["log"]["records"] != next_chunk:
    raise CheckpointManifestError(
      path, "log.records", f"is {m['log']['records']}, but {next_chunk} chunks were evaluated"
    )
  return rounds, chunk


def _expected_arrays(m, path: str, leaves) -> List[Tuple[np.ndarray, Dict[str, Any]]]:
  """The stored arrays and specs the run's state implies, checked against ``m["arrays"]``."""
  if m["num_state_leaves"] != len(leaves):
    raise CheckpointManifestError(
      path,
      "num_state_leaves",
      f"is {m['num_state_leaves']}, but the run's algorithm state has {len(leaves)} arrays",
    )
  names = [f"state_{i:04d}" for i in range(len(leaves))]
  specs = m["arrays"]
  for key in sorted(set(specs) - set(names)) + [k for k in names if k not in specs]:
    problem = "is missing" if key in names else "is not an array of the run's state"
    raise CheckpointManifestError(path, f"arrays.{key}", problem)
  expected = []
  for key, leaf in zip(names, leaves):
    field, spec = f"arrays.{key}", specs[key]
    kind = spec.get("kind") if isinstance(spec, dict) else None
    if kind not in ("array", "bits", "prng_key"):
      raise CheckpointManifestError(
        path, f"{field}.kind", f"is {_shown(kind)}; expected 'array', 'bits' or 'prng_key'"
      )
    _keys(path, field, spec, ("kind", "impl" if kind == "prng_key" else "dtype", "shape"))
    shape = spec["shape"]
    if not isinstance(shape, list) or len(shape) > 64:
      raise CheckpointManifestError(path, f"{field}.shape", f"must be a list, got {_shown(shape)}")
    for j, n in enumerate(shape):
      _int(path, f"{field}.shape[{j}]", n, 0, 2**40)
    if kind == "prng_key" and spec["impl"] not in PRNG_IMPLS:
      raise CheckpointManifestError(
        path, f"{field}.impl", f"is {_shown(spec['impl'])}, not a PRNG implementation of JAX"
      )
    if kind != "prng_key":
      _check_dtype(path, f"{field}.dtype", spec["dtype"], kind)
    stored, want = _encode(leaf)
    if spec != want:
      raise CheckpointManifestError(
        path, field, f"is {json.dumps(spec)}, but the run's state array is {json.dumps(want)}"
      )
    expected.append((stored, want))
  return expected


def _check_dtype(path, field, dtype, kind) -> None:
  try:
    parsed = np.dtype(dtype) if kind == "array" else jnp.dtype(dtype)
  except (TypeError, ValueError, SyntaxError, AttributeError):
    raise CheckpointManifestError(path, field, f"is {_shown(dtype)}, not a dtype") from None
  allowed = "biufc" if kind == "array" else "biufcV"  # bits: bfloat16 and other ml_dtypes
  if not isinstance(dtype, str) or parsed.hasobject or parsed.kind not in allowed:
    raise CheckpointManifestError(
      path,
      field,
      f"is {_shown(dtype)}: not an allowed dtype (numeric arrays only; objects are never read)",
    )


# ----------------------------------------------------------------------------------------------
# Reading: the files
# ----------------------------------------------------------------------------------------------
def _read_state(m, npz_path, json_path, directory, expected):
  limit = sum(s.nbytes + _MEMBER_OVERHEAD for s, _ in expected) + _MEMBER_OVERHEAD
  try:
    blob = read_regular_file(npz_path, directory, limit)
  except UnreadableFileError as e:
    if not os.path.lexists(npz_path):
      raise CheckpointError(f"{npz_path} is missing (its manifest {json_path} exists)") from None
    raise CheckpointError(f"{e} (the run's state needs at most {limit} bytes)") from None
  if hashlib.sha256(blob).hexdigest() != m["sha256"]:
    raise CheckpointError(
      f"{npz_path} is corrupt or truncated (SHA-256 does not match {json_path})"
    )
  want = {f"state_{i:04d}": stored for i, (stored, _) in enumerate(expected)}

  def check(name, dtype, shape):
    if name not in want or dtype != want[name].dtype or shape != want[name].shape:
      shown = f"{want[name].dtype}{list(want[name].shape)}" if name in want else "no such array"
      raise UnreadableFileError(
        f"{npz_path}, member {name!r}: its header claims {dtype}{list(shape)}; the run's state "
        f"implies {shown}"
      )

  try:
    data = read_npz_bytes(blob, npz_path, check)
  except UnreadableFileError as e:
    raise CheckpointError(str(e)) from None
  if set(data) != set(want):
    raise CheckpointError(
      f"{npz_path}: its arrays {sorted(data)} are not the manifest's {sorted(want)}"
    )
  try:
    return [_decode(data[f"state_{i:04d}"], spec) for i, (_, spec) in enumerate(expected)]
  except (ValueError, TypeError) as e:
    raise CheckpointError(f"{npz_path}: a state array cannot be restored ({e})") from None


def _check_finite_state(npz_path: str, state, restored) -> None:
  """Refuses restored state arrays of a floating or complex dtype that hold NaN or inf."""
  places = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
  for i, (place, leaf) in enumerate(zip(places, restored)):
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      continue
    arr = np.asarray(leaf)
    if arr.dtype.kind not in "fcV" and not jnp.issubdtype(arr.dtype, jnp.floating):
      continue
    values = arr.astype(np.complex128 if arr.dtype.kind == "c" else np.float64)
    bad = ~np.isfinite(values)
    if np.any(bad):
      raise CheckpointError(
        f"{npz_path}: state array state_{i:04d} (the algorithm state's {place or 'root'}) holds "
        f"{int(np.sum(bad))} NaN or infinite value(s); a run that stops at non-finite rounds "
        "never writes one, so this file was changed after it was written (resume from an "
        "earlier checkpoint, or run with check_finite=False to accept it)"
      )


def _read_log(m, json_path, directory, rounds, chunk):
  """``(train_metrics, evaluations)`` of the first ``log.bytes`` bytes of the history log."""
  path = os.path.join(directory, LOG_FILE)
  extent = m["log"]
  try:
    fd = open_regular_file(path, directory)
  except UnreadableFileError as e:
    raise CheckpointError(f"{e} (its checkpoint {json_path} records history in it)") from None
  try:
    _check_log_size(fd, path, extent["bytes"], f"its checkpoint {json_path}")
    data = read_up_to(fd, extent["bytes"])
  finally:
    os.close(fd)
  blobs, offset, digest = [], 0, _LOG_SEED
  while offset < len(data):
    head = data[offset : offset + 16]
    length = struct.unpack("<Q", head[8:])[0] if len(head) == 16 else -1
    if head[:8] != _LOG_MAGIC or not 0 < length <= len(data) - offset - 16:
      raise CheckpointError(f"{path} is corrupt at byte {offset} (not a history-log record)")
    digest = _chain(digest, data[offset : offset + 16 + length])
    blobs.append(data[offset + 16 : offset + 16 + length])
    offset += 16 + length
  if len(data) != extent["bytes"] or digest != extent["sha256"]:
    raise CheckpointError(f"{path} is corrupt (its SHA-256 does not match {json_path})")
  if len(blobs) != extent["records"]:
    raise CheckpointManifestError(
      json_path, "log.records", f"is {extent['records']}, but {path} holds {len(blobs)} records"
    )
  train = {name: [] for name in m["train_metrics"]}
  evaluations, eval_names = [], None
  for j, blob in enumerate(blobs):
    where = f"{path}, record {j}"
    try:
      arrays = read_npz_bytes(blob, where)
      meta = json.loads(bytes(arrays.pop("meta", np.zeros(0, np.uint8))).decode())
    except (UnreadableFileError, UnicodeDecodeError, ValueError) as e:
      raise CheckpointError(f"{where}: cannot be read ({e})") from None
    ev = _log_entry(meta, arrays, where, j, chunk, m, train, eval_names)
    eval_names = list(ev["per_client"])
    evaluations.append(ev)
  if evaluations[-1]["round"] != m["rounds_done"]:
    raise CheckpointError(f"{path}: its last evaluation is not the round of {json_path}")
  dtypes = {name: [a.dtype for a in values] for name, values in train.items()}
  return {k: np.concatenate(v) if v else np.zeros(0) for k, v in train.items()}, evaluations, dtypes


def _log_entry(meta, arrays, where, j, chunk, m, train, eval_names):
  if not isinstance(meta, dict) or set(meta) != {"round", "start", "summary", "arrays"}:
    raise CheckpointError(f"{where}: not a history-log record")
  start, stop, specs, summary = meta["start"], meta["round"], meta["arrays"], meta["summary"]
  if start != j * chunk or type(stop) is not int or not start <= stop <= start + chunk:
    raise CheckpointError(
      f"{where}: rounds {start!r}..{stop!r} are not chunk {j} of {chunk} rounds"
    )
  if j + 1 < m["next_chunk"] and stop != start + chunk:
    raise CheckpointError(f"{where}: chunk {j} ends at round {stop}, not {start + chunk}")
  if not isinstance(specs, dict) or set(specs) != set(arrays):
    raise CheckpointError(f"{where}: its arrays do not match its description")
  decoded = {}
  for key, arr in arrays.items():
    spec = specs[key]
    if spec != _encode(arr)[1] and not (
      isinstance(spec, dict) and spec.get("kind") == "bits" and _bits_of(spec, arr)
    ):
      raise CheckpointError(f"{where}, member {key!r}: does not match its description {spec}")
    decoded[key] = np.asarray(_decode(arr, spec)) if spec["kind"] == "bits" else arr
    if decoded[key].ndim != 1:
      raise CheckpointError(f"{where}, member {key!r}: not one value per round / client")
  names = [k[len("train__") :] for k in decoded if k.startswith("train__")]
  if names != list(train):
    raise CheckpointError(f"{where}: training metrics {names} are not {list(train)}")
  for name in names:
    if len(decoded[f"train__{name}"]) != stop - start:
      raise CheckpointError(f"{where}: {name!r} does not hold rounds {start + 1}..{stop}")
    train[name].append(decoded[f"train__{name}"])
  per_client = {k[len("eval__") :]: v for k, v in decoded.items() if k.startswith("eval__")}
  if len(per_client) + len(names) != len(decoded) or (
    eval_names is not None and list(per_client) != eval_names
  ):
    raise CheckpointError(f"{where}: its per-client metrics differ from the previous records'")
  if len({len(v) for v in per_client.values()}) > 1:
    raise CheckpointError(f"{where}: per-client metrics of different lengths")
  return {"round": stop, "per_client": per_client, "summary": _summary_from_json(summary, where)}


def _bits_of(spec, arr) -> bool:
  try:
    dtype = jnp.dtype(spec["dtype"])
  except (TypeError, ValueError, KeyError):
    return False
  return (
    set(spec) == {"kind", "dtype", "shape"}
    and not dtype.hasobject
    and arr.dtype == np.dtype(f"u{dtype.itemsize}")
    and spec["shape"] == list(arr.shape)
  )


def _summary_from_json(summary, where):
  if not isinstance(summary, dict) or not all(isinstance(v, dict) for v in summary.values()):
    raise CheckpointError(f"{where}: its summary is not {{metric: {{statistic: value}}}}")
  out = {}
  for metric, stats in summary.items():
    out[metric] = {}
    for stat_name, value in stats.items():
      if isinstance(value, str) and value in _NONFINITE:
        value = _NONFINITE[value]
      elif type(value) not in (int, float):
        raise CheckpointError(f"{where}: summary {metric}.{stat_name} is {_shown(value)}")
      out[metric][stat_name] = value
  return out


def load_checkpoint(directory: str, config: Dict[str, Any], state, require_finite: bool = True):
  """``(payload, restored_state)`` of the newest checkpoint in ``directory``, or None if there
  is none. ``payload`` holds ``next_chunk``, ``rounds_done``, ``status``, ``wall_time``,
  ``train_metrics``, ``evaluations`` and ``path`` (the manifest). Raises
  :class:`CheckpointError` (a ``ValueError``; :class:`CheckpointManifestError` for a manifest
  field) naming the file for anything that does not match; nothing is modified.
  ``require_finite``: a state array holding NaN or infinite values is refused, naming the file,
  the array and its place in the state (a run that stops at non-finite rounds never writes one;
  resumed, it would stop at its next round)."""
  rounds = scan(directory)
  if not rounds:
    return None
  npz_path, json_path = _paths(directory, rounds[-1])
  m = _schema(_read_manifest(json_path, directory), json_path)
  run_rounds, chunk = _check_run(m, json_path, directory, config, rounds[-1])
  leaves, treedef = jax.tree.flatten(state)
  expected = _expected_arrays(m, json_path, leaves)
  restored = _read_state(m, npz_path, json_path, directory, expected)
  if require_finite:
    _check_finite_state(npz_path, state, restored)
  train_metrics, evaluations, dtypes = _read_log(m, json_path, directory, run_rounds, chunk)
  for name, kinds in dtypes.items():
    if len(set(kinds)) > 1:
      raise CheckpointError(f"{LOG_FILE}: training metric {name!r} changes dtype between records")
  payload = {
    "next_chunk": m["next_chunk"],
    "rounds_done": m["rounds_done"],
    "status": (m["status"][0], m["status"][1]),
    "wall_time": float(m["wall_time"]),
    "train_metrics": train_metrics,
    "evaluations": evaluations,
    "path": json_path,
  }
  return payload, jax.tree.unflatten(treedef, restored)
