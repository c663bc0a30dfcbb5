"""Reading TensorFlow Federated's HDF5 client files (shared by the FedCIFAR-100 and StackOverflow
readers).

TFF's ``HDF5ClientData`` (``tensorflow_federated/python/simulation/datasets/hdf5_client_data.py``,
removed in 2021 for SQLite files of the same rows) reads one HDF5 file per split:
a top-level group ``examples`` holding one subgroup per client, named by the client id, and in it
one dataset per feature whose first axis runs over the client's examples
(``examples/<client_id>/<feature>``). TFF lists the clients as ``sorted(examples.keys())``
(Python string order: ``"0", "1", "10", "100", ...``); the readers keep that order.

Every problem is a :class:`~fedjax_dro.data._sources.base.SourceError` of one line naming the
file (and the client and feature) and what is wrong.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from fedjax_dro.data._sources.base import SourceError

EXAMPLES_GROUP = "examples"

# A feature's check: the per-example shapes it may have (``None``: any), a predicate on its dtype
# and the dtype's description for the message.
FeatureSpec = Tuple[Optional[Sequence[Tuple[int, ...]]], Callable[[np.dtype], bool], str]


def require_h5py():
  """The ``h5py`` module, or an ``ImportError`` saying how to install it."""
  try:
    import h5py
  except ImportError as e:  # pragma: no cover - h5py is installed where tests run
    raise ImportError('reading TFF\'s HDF5 files needs h5py: pip install "fedjax_dro[data]"') from e
  return h5py


def is_int(dtype: np.dtype) -> bool:
  """An integer dtype (TFF stores labels as int64)."""
  return np.dtype(dtype).kind in "iu"


def is_uint8(dtype: np.dtype) -> bool:
  """``uint8`` (TFF's images)."""
  return np.dtype(dtype) == np.uint8


def is_string(dtype: np.dtype) -> bool:
  """A string dtype as h5py reads it: fixed-length bytes (``S``) or variable-length strings."""
  h5py = require_h5py()
  dtype = np.dtype(dtype)
  return dtype.kind == "S" or h5py.check_string_dtype(dtype) is not None


def find_file(path: str, filename: str) -> str:
  """``path/filename``, or a :class:`SourceError` when that file is absent."""
  full = os.path.join(path, filename)
  if not os.path.isfile(full):
    raise SourceError(f"{full}: file not found (expected TFF's {filename})")
  return full


def open_file(path: str):
  """``path`` opened read-only with h5py (a :class:`SourceError` when it is no readable HDF5
  file: truncated, corrupt, not HDF5)."""
  h5py = require_h5py()
  try:
    return h5py.File(path, "r")
  except (OSError, ValueError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise SourceError(f"{path}: not a readable HDF5 file ({reason})") from None


def client_ids(f, path: str) -> Tuple[str, ...]:
  """The client ids of an open TFF file in TFF's order (sorted strings), checked to be groups."""
  h5py = require_h5py()
  try:
    examples = f[EXAMPLES_GROUP] if EXAMPLES_GROUP in f else None
  except (OSError, KeyError) as e:
    raise SourceError(f"{path}: cannot read the {EXAMPLES_GROUP!r} group ({e})") from None
  if examples is None or not isinstance(examples, h5py.Group):
    raise SourceError(
      f"{path}: no {EXAMPLES_GROUP!r} group at the top level (TFF's layout is "
      f"{EXAMPLES_GROUP}/<client_id>/<feature>; top-level keys: {sorted(f.keys())[:5]})"
    )
  try:
    ids = sorted(examples.keys())
  except (OSError, RuntimeError) as e:
    raise SourceError(f"{path}: cannot list the clients of {EXAMPLES_GROUP!r} ({e})") from None
  if not ids:
    raise SourceError(f"{path}: the {EXAMPLES_GROUP!r} group holds no clients")
  return tuple(ids)


def check_clients(f, path: str, ids, specs: Dict[str, FeatureSpec]) -> Tuple[int, ...]:
  """Checks that every client of ``ids`` is a group holding each feature of ``specs`` with its
  per-example shape and dtype and one common length; returns the clients' lengths."""
  h5py = require_h5py()
  examples = f[EXAMPLES_GROUP]
  lengths = []
  for cid in ids:
    where = f"{path}: client {cid!r}"
    try:
      group = examples[cid]
    except (OSError, KeyError, RuntimeError) as e:
      raise SourceError(f"{where} cannot be read ({e})") from None
    if not isinstance(group, h5py.Group):
      raise SourceError(f"{where} is a dataset, expected a group of features")
    k = None
    for name, (shapes, dtype_ok, dtype_desc) in specs.items():
      try:
        ds = group[name] if name in group else None
      except (OSError, KeyError, RuntimeError) as e:
        raise SourceError(f"{where}: feature {name!r} cannot be read ({e})") from None
      if ds is None or not isinstance(ds, h5py.Dataset):
        raise SourceError(f"{where} has no {name!r} dataset (features: {sorted(group.keys())})")
      if ds.ndim == 0:
        raise SourceError(f"{where}: {name!r} is a scalar, expected one entry per example")
      if shapes is not None and tuple(ds.shape[1:]) not in [tuple(s) for s in shapes]:
        expected = " or ".join(str(["k", *s]).replace("'", "") for s in shapes)
        raise SourceError(f"{where}: {name!r} has shape {list(ds.shape)}, expected {expected}")
      if not dtype_ok(ds.dtype):
        raise SourceError(f"{where}: {name!r} has dtype {ds.dtype}, expected {dtype_desc}")
      if k is None:
        k = int(ds.shape[0])
      elif int(ds.shape[0]) != k:
        raise SourceError(f"{where}: {name!r} has {ds.shape[0]} entries, the other features {k}")
    lengths.append(int(k or 0))
  return tuple(lengths)


def read_client(path: str, cid: str, names) -> Dict[str, np.ndarray]:
  """Client ``cid``'s features ``names``, whole (a :class:`SourceError` naming the file when a
  read fails: a file damaged after the layout check)."""
  with open_file(path) as f:
    out = {}
    for name in names:
      try:
        out[name] = f[EXAMPLES_GROUP][cid][name][()]
      except (OSError, KeyError, RuntimeError, ValueError) as e:
        raise SourceError(f"{path}: client {cid!r}: {name!r} cannot be read ({e})") from None
    return out
