"""Run-by-run records of a comparison, so that a killed table resumes where it stopped.

:func:`fedjax_dro.compare.compare` with an ``out_dir`` writes each finished run (one strategy on
one seed: its selection and its final run) to ``out_dir/runs/NAME/DIGEST.json`` as soon as it
completes, atomically. ``DIGEST`` is the SHA-256 of everything that determines the run: the
experiment's name, the strategy (its algorithm, settings, default hyper-parameters, grid, fixed
values, widened axes), the model's identity, the protocol, the extra metrics, the seed, the bytes
of that seed's data and the package version. A rerun of the same comparison finds the records of
the runs that finished, reads them instead of computing them again, and computes only the rest;
since every run starts from its own seed, the table equals an uninterrupted one (a row is read
back exactly as it was computed: the same JSON round trip is applied to every row, read or not).
A record whose key does not match, or that cannot be read, is computed again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Dict, Optional, Tuple

import jax
import numpy as np

from fedjax_dro.records.files import atomic_write
from fedjax_dro.records.history import json_default

_FLOAT, _DICT = "non-finite float", "escaped dict"  # the two marker keys


def encode(value: Any) -> Any:
  """``value`` as JSON-able data that :func:`decode` turns back into an equal value (non-finite
  floats as ``{"non-finite float": "nan"}``, a dict whose only key is a marker escaped, NumPy
  values as Python values, tuples as lists)."""
  if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "__array__"):
    value = np.asarray(value).tolist()
  if isinstance(value, float):
    return value if math.isfinite(value) else {_FLOAT: repr(value)}
  if isinstance(value, dict):
    encoded = {str(k): encode(v) for k, v in value.items()}
    return {_DICT: encoded} if set(encoded) in ({_FLOAT}, {_DICT}) else encoded
  if isinstance(value, (list, tuple)):
    return [encode(v) for v in value]
  return value


def decode(value: Any) -> Any:
  """The inverse of :func:`encode`."""
  if isinstance(value, dict):
    if set(value) == {_FLOAT}:
      return float(value[_FLOAT])
    if set(value) == {_DICT}:
      return {k: decode(v) for k, v in value[_DICT].items()}
    return {k: decode(v) for k, v in value.items()}
  if isinstance(value, list):
    return [decode(v) for v in value]
  return value


def round_trip(value: Any) -> Any:
  """``decode(encode(value))`` through JSON text: what a record gives back."""
  return decode(json.loads(json.dumps(encode(value), default=json_default)))


def data_digest(ds) -> str:
  """SHA-256 of a dataset's arrays (shapes, dtypes and bytes of every leaf, train and test)."""
  h = hashlib.sha256()
  for part in (ds.train, ds.test):
    for leaf in jax.tree.leaves(part):
      a = np.ascontiguousarray(np.asarray(leaf))
      h.update(f"{a.dtype.str}{a.shape}".encode())
      h.update(a.tobytes())
  return h.hexdigest()


def run_key(**parts: Any) -> Tuple[str, Dict[str, Any]]:
  """``(digest, key)``: the key (``parts`` as canonical JSON data) and its SHA-256."""
  key = json.loads(json.dumps(encode(parts), sort_keys=True, default=json_default))
  text = json.dumps(key, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest(), key


class RunRecords:
  """The finished runs of one comparison in ``directory`` (``None``: nothing kept).

  ``restored`` and ``computed`` count the runs read back and the runs recorded by this object.
  """

  def __init__(self, directory: Optional[str]):
    self.directory = directory
    self.restored = 0
    self.computed = 0

  def _path(self, digest: str) -> str:
    return os.path.join(self.directory, f"{digest}.json")

  def get(self, digest: str, key: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The recorded payload of the run ``digest``, if it finished with this very ``key``."""
    if self.directory is None:
      return None
    try:
      with open(self._path(digest)) as f:
        record = json.load(f)
    except (OSError, ValueError):
      return None
    if not isinstance(record, dict) or record.get("key") != key or "payload" not in record:
      return None
    self.restored += 1
    return decode(record["payload"])

  def put(self, digest: str, key: Dict[str, Any], payload: Dict[str, Any]) -> None:
    """Records the finished run ``digest`` (atomically)."""
    self.computed += 1
    if self.directory is None:
      return
    os.makedirs(self.directory, exist_ok=True)
    record = {"key": key, "payload": encode(payload)}
    atomic_write(self._path(digest), json.dumps(record, default=json_default) + "\n")


def check_part(part, out_dir) -> Optional[Tuple[int, int]]:
  """``part`` as ``(i, N)`` with ``1 <= i <= N`` (a ``"i/N"`` string accepted); a part needs an
  ``out_dir`` to record its runs in."""
  if part is None:
    return None
  if isinstance(part, str):
    i, sep, n = part.partition("/")
    try:
      part = (int(i), int(n)) if sep else None
    except ValueError:
      part = None
    if part is None:
      raise ValueError(f"part must be i/N (e.g. 2/4), got {part!r}")
  if (
    not isinstance(part, tuple)
    or len(part) != 2
    or not all(isinstance(v, int) and not isinstance(v, bool) for v in part)
    or not 1 <= part[0] <= part[1]
  ):
    raise ValueError(f"part must be (i, N) with 1 <= i <= N, got {part!r}")
  if out_dir is None:
    raise ValueError("part needs out_dir: a part records its runs there for the merge")
  return part


def merge_runs(out_dir: str, part_dirs) -> int:
  """Copies the run records of the parts ``part_dirs`` (each a ``compare`` / ``reproduce``
  output folder: ``runs/NAME/*.json``) into ``out_dir``; returns how many were copied. A record
  present in two places with different contents is refused, naming the file (two parts of
  different configurations); identical copies are fine."""

  copied = 0
  for part in part_dirs:
    runs = os.path.join(os.fspath(part), "runs")
    if not os.path.isdir(runs):
      raise ValueError(f"{part} holds no runs/ folder: not the output folder of a part")
    for root, _, files in os.walk(runs):
      for name in sorted(files):
        if not name.endswith(".json"):
          continue
        source = os.path.join(root, name)
        target = os.path.join(out_dir, "runs", os.path.relpath(source, runs))
        data = open(source, "rb").read()
        if os.path.exists(target):
          if open(target, "rb").read() != data:
            raise ValueError(
              f"{source} differs from the record already in {target}: the parts are not of "
              "one configuration"
            )
          continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        atomic_write(target, data)
        copied += 1
  return copied
