"""Loaders for user-supplied federated data files: labelled ``.npz`` and LEAF JSON.

Both read local files only (nothing is downloaded) and validate everything before building a
:class:`~fedjax_dro.data.federated.FederatedData`, with errors that name the file, the key and,
for LEAF, the user.
"""

from __future__ import annotations

import glob
import json
import numbers
import os
import zipfile
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from fedjax_dro.data.federated import FederatedData, from_arrays, from_client_arrays

PathLike = Union[str, os.PathLike]


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _existing_path(path, what: str) -> str:
  try:
    path = os.fspath(path)
  except TypeError:
    raise TypeError(
      f"{what} must be a path (str or os.PathLike), got {type(path).__name__}"
    ) from None
  if not os.path.exists(path):
    raise FileNotFoundError(f"{what} {path!r} does not exist")
  return path


def read_npz_member(npz, key: str, where: str) -> np.ndarray:
  """``npz[key]`` of an ``np.load(..., allow_pickle=False)`` archive, with every way it can fail
  (a pickled object array, a damaged or non-``.npy`` member) turned into one clear error that
  starts with ``where`` (e.g. ``"npz file 'a.npz'"``) and names the key."""
  try:
    arr = npz[key]
  except ValueError as e:
    if "pickle" in str(e) or "Object arrays" in str(e):
      raise TypeError(
        f"{where}, key {key!r}: holds an object (pickled) array, which is not "
        f"loaded (allow_pickle=False); store a numeric array"
      ) from e
    raise ValueError(f"{where}, key {key!r}: cannot read the array: {e}") from e
  except Exception as e:
    raise ValueError(f"{where}, key {key!r}: cannot read the array: {e}") from e
  if not isinstance(arr, np.ndarray):  # a zip member that is not a .npy array
    raise ValueError(
      f"{where}, key {key!r}: cannot read the array: the member is not in .npy "
      f"format (write the file with np.savez)"
    )
  return arr


def load_npz(
  path: PathLike,
  *,
  x_key: str = "x",
  y_key: str = "y",
  client_key: str = "client_id",
  num_clients: Optional[int] = None,
) -> FederatedData:
  """Reads a labelled ``.npz`` of pooled rows into :class:`FederatedData`.

  The file holds three arrays of ``N`` rows: features ``x_key`` (``[N, *feature_shape]``, real
  numbers), integer labels ``y_key`` (``[N]``, >= 0) and integer owners ``client_key`` (``[N]``,
  in ``[0, num_clients)``; every client owns >= 1 row). It is read with ``allow_pickle=False``:
  object arrays are rejected. Rows keep their file order within each client. ``y`` becomes int32.

  Args:
    path: the ``.npz`` file.
    x_key: name of the features array in the file.
    y_key: name of the labels array.
    client_key: name of the owners array.
    num_clients: number of clients (default: ``max(client_id) + 1``).

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: not a readable ``.npz``, a key is missing, lengths disagree, values out of range,
      empty data or an empty client.
    TypeError: object (pickled) arrays, non-numeric ``x``, non-integer labels or client ids.
  """
  path = _existing_path(path, "npz file")
  if not os.path.isfile(path):
    raise ValueError(f"npz file {path!r} is not a regular file")
  for name, key in (("x_key", x_key), ("y_key", y_key), ("client_key", client_key)):
    if not isinstance(key, str):
      raise TypeError(f"{name} must be a str, got {type(key).__name__}")
  if num_clients is not None and (not _is_int(num_clients) or num_clients < 1):
    raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}")
  if not zipfile.is_zipfile(path):
    raise ValueError(
      f"npz file {path!r} is not a valid .npz (not a zip archive; save it with np.savez or "
      f"np.savez_compressed)"
    )
  arrays = {}
  try:
    npz = np.load(path, allow_pickle=False)
  except Exception as e:
    raise ValueError(f"npz file {path!r} is not a valid .npz: {e}") from e
  with npz:
    if not hasattr(npz, "files"):  # pragma: no cover - the zip check above
      raise ValueError(f"npz file {path!r} is not a valid .npz")
    for key in (x_key, y_key, client_key):
      if key not in npz.files:
        raise ValueError(f"npz file {path!r} has no key {key!r} (keys: {sorted(npz.files)})")
      arrays[key] = read_npz_member(npz, key, f"npz file {path!r}")
  x, y, cid = arrays[x_key], arrays[y_key], arrays[client_key]
  where = lambda key: f"npz file {path!r}, key {key!r}"
  for key, arr in ((x_key, x), (y_key, y), (client_key, cid)):
    if arr.dtype == object:  # pragma: no cover - np.load refuses them first
      raise TypeError(f"{where(key)}: object arrays are not supported")
  if x.dtype.kind not in "biuf":
    raise TypeError(f"{where(x_key)}: features must be real numbers, got dtype {x.dtype}")
  if x.ndim < 1 or x.shape[0] == 0:
    raise ValueError(f"{where(x_key)}: no rows (shape {x.shape}); the data must be non-empty")
  if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
    raise ValueError(f"{where(x_key)}: has NaN or infinite values")
  for key, arr, what in ((y_key, y, "labels"), (client_key, cid, "client ids")):
    if arr.dtype.kind not in "iu":
      raise TypeError(f"{where(key)}: {what} must be integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
      raise ValueError(f"{where(key)}: {what} must be 1-D, got shape {arr.shape}")
    if arr.shape[0] != x.shape[0]:
      raise ValueError(
        f"{where(key)}: has {arr.shape[0]} rows but {x_key!r} has {x.shape[0]}: lengths must agree"
      )
  if y.min() < 0 or y.max() > np.iinfo(np.int32).max:
    raise ValueError(
      f"{where(y_key)}: labels must be class indices >= 0 (and fit int32), got min {y.min()}, "
      f"max {y.max()}"
    )
  if cid.min() < 0:
    raise ValueError(f"{where(client_key)}: client ids must be >= 0, got min {cid.min()}")
  n = int(num_clients) if num_clients is not None else int(cid.max()) + 1
  if cid.max() >= n:
    raise ValueError(
      f"{where(client_key)}: client id {cid.max()} is out of range [0, num_clients={n})"
    )
  counts = np.bincount(cid.astype(np.int64), minlength=n)
  if np.any(counts == 0):
    empty = np.flatnonzero(counts == 0)
    raise ValueError(
      f"{where(client_key)}: clients {empty[:10].tolist()} own no rows; every client in "
      f"[0, {n}) needs >= 1 row"
    )
  return from_arrays(x, y.astype(np.int32), cid, num_clients=n)


# Classes a label file may imply beyond its number of rows: labels are class indices 0..K-1, and
# a label far beyond the rows (1e9) would make every per-class array of that size downstream.
MIN_CLASS_LIMIT = 65536


def check_class_count(max_label: int, rows: int, where: str) -> None:
  """Refuses labels implying more classes (``max_label + 1``) than ``max(rows, 65536)``."""
  limit = max(int(rows), MIN_CLASS_LIMIT)
  if int(max_label) + 1 > limit:
    raise ValueError(
      f"{where}: label {int(max_label)} implies {int(max_label) + 1} classes for {rows} rows "
      f"(at most max(rows, {MIN_CLASS_LIMIT}) = {limit}); labels must be class indices "
      "0..K-1: relabel with np.unique(labels, return_inverse=True)[1]"
    )


def _read_leaf_document(path: str):
  """The parsed JSON of one LEAF file, refused before parsing when its count of JSON arrays and
  objects cannot be LEAF's (one flat list of numbers per example: a 28x28 row is ~2-4 KB of
  text), and refused, not crashed, when nested deeper than Python's JSON reader goes. Parsing
  takes about 16-20x the file's size in memory at most (Python numbers and lists)."""
  with open(path, "rb") as f:
    blob = f.read()
  containers = blob.count(b"[") + blob.count(b"{")
  limit = max(100_000, len(blob) // 16)
  if containers > limit:
    raise ValueError(
      f"LEAF file {path!r}: {containers} JSON arrays and objects in {len(blob)} bytes (at most "
      f"{limit} in a LEAF file of this size, whose x rows are flat lists of numbers); refused "
      "before parsing"
    )
  try:
    return json.loads(blob.decode("utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"LEAF file {path!r} is not valid JSON: {e}") from None
  except RecursionError:
    raise ValueError(
      f"LEAF file {path!r} is nested too deeply for a LEAF file (users -> user_data -> x -> "
      "rows of numbers: 4 levels)"
    ) from None


def _json_files(path_or_dir: PathLike) -> List[str]:
  path = _existing_path(path_or_dir, "LEAF path")
  if os.path.isdir(path):
    files = sorted(glob.glob(os.path.join(glob.escape(path), "*.json")))
    if not files:
      raise ValueError(f"LEAF directory {path!r} has no *.json files")
    return files
  return [path]


def _has_str(obj) -> bool:
  """Whether ``obj`` or a list nested in it holds a string (iterative: any depth)."""
  stack = [obj]
  while stack:
    item = stack.pop()
    if isinstance(item, str):
      return True
    if isinstance(item, list):
      stack.extend(item)
  return False


def _user_arrays(path: str, user: str, entry, n_samples, feature_shape):
  where = f"LEAF file {path!r}, user {user!r}"
  if not isinstance(entry, dict) or "x" not in entry or "y" not in entry:
    raise ValueError(f"{where}: user_data entry must be an object with keys 'x' and 'y'")
  xs, ys = entry["x"], entry["y"]
  if not isinstance(xs, list) or not isinstance(ys, list):
    raise ValueError(f"{where}: 'x' and 'y' must be lists")
  if any(isinstance(row, str) for row in xs) or any(isinstance(v, str) for v in ys):
    raise TypeError(
      f"{where}: 'x' or 'y' holds strings (text, e.g. LEAF Shakespeare); text needs a tokenizer, "
      f"which is out of scope for load_leaf_json: convert it to integer ids first"
    )
  if len(xs) != len(ys):
    raise ValueError(f"{where}: 'x' has {len(xs)} rows but 'y' has {len(ys)}")
  if len(xs) != n_samples:
    raise ValueError(f"{where}: num_samples says {n_samples} but 'x' and 'y' have {len(xs)} rows")
  if not xs:
    raise ValueError(f"{where}: has no samples; every user needs >= 1 row")
  for k, row in enumerate(xs):
    if not isinstance(row, list):
      raise TypeError(f"{where}: x[{k}] must be a list of numbers, got {type(row).__name__}")
    if len(row) != len(xs[0]):
      raise ValueError(
        f"{where}: ragged x: row {k} has {len(row)} values but row 0 has {len(xs[0])}"
      )
  if len(xs[0]) == 0:
    raise ValueError(f"{where}: x rows are empty lists; every row needs >= 1 feature")
  try:
    x = np.array(xs, dtype=np.float64)
  except ValueError as e:
    if _has_str(xs):
      raise TypeError(
        f"{where}: x holds strings; text needs a tokenizer, which is out of scope for "
        f"load_leaf_json"
      ) from e
    raise ValueError(f"{where}: x is not a rectangular array of numbers (ragged?): {e}") from e
  except (TypeError, RecursionError) as e:
    raise TypeError(f"{where}: x must hold rows of numbers: {str(e)[:200]}") from None
  if x.ndim != 2:
    raise ValueError(
      f"{where}: x rows must be flat lists of numbers, got rows of shape {x.shape[1:]}"
    )
  if not np.all(np.isfinite(x)):
    raise ValueError(f"{where}: x has null, NaN or infinite values")
  if feature_shape is not None:
    size = int(np.prod(feature_shape))
    if int(np.prod(x.shape[1:])) != size:
      raise ValueError(
        f"{where}: rows have {int(np.prod(x.shape[1:]))} values, which cannot be reshaped to "
        f"feature_shape={tuple(feature_shape)} ({size} values)"
      )
    x = x.reshape((x.shape[0],) + tuple(feature_shape))
  for k, v in enumerate(ys):
    if not _is_int(v):
      raise TypeError(f"{where}: label y[{k}] = {v!r} is not an integer")
  return x, np.array(ys, dtype=np.int64)


def load_leaf_json(
  path_or_dir: PathLike,
  *,
  num_classes: Optional[int] = None,
  feature_shape: Optional[Sequence[int]] = None,
) -> Tuple[FederatedData, List[str]]:
  """Reads LEAF JSON (the FEMNIST layout) into :class:`FederatedData`, one client per user.

  A file is ``{"users": [name, ...], "num_samples": [int, ...], "user_data": {name: {"x": [[float,
  ...], ...], "y": [int, ...]}}}``. A directory means every ``*.json`` in it, merged in sorted
  file-name order; users keep their order within a file. Text data (LEAF Shakespeare, whose ``x``
  rows are strings) is rejected: it needs a tokenizer, out of scope here.

  Args:
    path_or_dir: a LEAF ``.json`` file or a directory of them.
    num_classes: if given, every label must be in ``[0, num_classes)`` (else labels must be
      >= 0).
    feature_shape: if given, each flat ``x`` row is reshaped to it (e.g. ``(28, 28)`` for
      FEMNIST).

  Returns:
    ``(data, users)``: ``data.x`` float32 ``[n_users, max_examples, *feature_shape]``, ``data.y``
    int32; ``users[i]`` is client ``i``'s LEAF name.

  Raises:
    FileNotFoundError: ``path_or_dir`` does not exist.
    ValueError: invalid JSON, missing keys, disagreeing lengths, ragged rows, duplicate users,
      labels out of range.
    TypeError: non-numeric features, string (text) data, non-integer labels.
  """
  if num_classes is not None and (not _is_int(num_classes) or num_classes < 1):
    raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
  if feature_shape is not None:
    if isinstance(feature_shape, (str, bytes)) or not isinstance(feature_shape, Sequence):
      raise TypeError(f"feature_shape must be a sequence of ints, got {feature_shape!r}")
    if not feature_shape or not all(_is_int(d) and d >= 1 for d in feature_shape):
      raise ValueError(f"feature_shape must be non-empty positive ints, got {feature_shape!r}")
    feature_shape = tuple(int(d) for d in feature_shape)
  users_all: List[str] = []
  owner = {}
  xs, ys = [], []
  for path in _json_files(path_or_dir):
    doc = _read_leaf_document(path)
    if not isinstance(doc, dict):
      raise ValueError(f"LEAF file {path!r}: the top level must be a JSON object")
    for key in ("users", "num_samples", "user_data"):
      if key not in doc:
        raise ValueError(f"LEAF file {path!r} has no key {key!r} (keys: {sorted(doc)})")
    users, num_samples, user_data = doc["users"], doc["num_samples"], doc["user_data"]
    if not isinstance(users, list) or not isinstance(num_samples, list):
      raise ValueError(f"LEAF file {path!r}: 'users' and 'num_samples' must be lists")
    if not isinstance(user_data, dict):
      raise ValueError(f"LEAF file {path!r}: 'user_data' must be an object keyed by user")
    if len(users) != len(num_samples):
      raise ValueError(
        f"LEAF file {path!r}: 'users' has {len(users)} entries but 'num_samples' has "
        f"{len(num_samples)}"
      )
    extra = sorted(set(user_data) - set(map(str, users)))
    if extra:
      raise ValueError(f"LEAF file {path!r}: user_data has users not in 'users': {extra[:10]}")
    for user, n_samples in zip(users, num_samples):
      if not isinstance(user, str):
        raise ValueError(f"LEAF file {path!r}: user names must be strings, got {user!r}")
      if user in owner:
        where = "earlier in the same file" if owner[user] == path else f"in {owner[user]!r}"
        raise ValueError(f"LEAF file {path!r}: duplicate user {user!r} (already seen {where})")
      owner[user] = path
      if not _is_int(n_samples) or n_samples < 0:
        raise ValueError(
          f"LEAF file {path!r}, user {user!r}: num_samples must be a non-negative integer, got "
          f"{n_samples!r}"
        )
      if user not in user_data:
        raise ValueError(f"LEAF file {path!r}: user {user!r} has no entry in user_data")
      x, y = _user_arrays(path, user, user_data[user], n_samples, feature_shape)
      if xs and x.shape[1:] != xs[0].shape[1:]:
        raise ValueError(
          f"LEAF file {path!r}, user {user!r}: rows have shape {x.shape[1:]} but user "
          f"{users_all[0]!r} has {xs[0].shape[1:]}; every row needs the same length"
        )
      high = num_classes if num_classes is not None else np.iinfo(np.int32).max + 1
      if y.min() < 0 or y.max() >= high:
        bad = y[(y < 0) | (y >= high)][0]
        bound = f"[0, num_classes={num_classes})" if num_classes is not None else "[0, 2**31)"
        raise ValueError(
          f"LEAF file {path!r}, user {user!r}: label {int(bad)} is out of range {bound}"
        )
      users_all.append(user)
      xs.append(x)
      ys.append(y.astype(np.int32))
  if not users_all:
    raise ValueError(f"LEAF path {os.fspath(path_or_dir)!r} has no users")
  if num_classes is None:
    check_class_count(
      max(int(y.max()) for y in ys),
      sum(len(y) for y in ys),
      f"LEAF path {os.fspath(path_or_dir)!r}",
    )
  return from_client_arrays(xs, ys, dtype=np.float32), users_all
