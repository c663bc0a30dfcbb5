"""Readers for files the user already has on disk: CIFAR-10/100 (binary), TinyImageNet, features.

Nothing is downloaded and nothing is unpickled (every ``np.load`` uses ``allow_pickle=False``; the
CIFAR readers use the *binary* versions, ``cifar-10-batches-bin`` and ``cifar-100-binary``, never
the Python pickles). Every reader validates the whole layout before returning, and a malformed
file gets a ``ValueError`` / ``TypeError`` / ``FileNotFoundError`` naming the file and what was
expected. The ``write_*`` functions are the inverses, for making small stand-ins (and test
fixtures) in the same formats. This module holds the containers, the features and TinyImageNet
readers and the checks they share; the CIFAR readers are in :mod:`fedjax_dro.data.cifar`.
"""

from __future__ import annotations

import os
import zipfile
from typing import Dict, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

PathLike = Union[str, os.PathLike]


class ImageSet(NamedTuple):
  """An image classification dataset read from disk.

  Attributes:
    x_train: float32 ``[N, H, W, C]`` in ``[0, 1]``.
    y_train: int32 ``[N]`` class indices.
    x_test: float32 ``[M, H, W, C]`` in ``[0, 1]``.
    y_test: int32 ``[M]``.
    num_classes: number of classes (labels are in ``[0, num_classes)``).
    class_names: the class names in label order, or ``()`` when the files have none.
  """

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  class_names: Tuple[str, ...]


class FeatureSet(NamedTuple):
  """Precomputed embeddings read by :func:`load_features`.

  Attributes:
    features: float32 ``[N, d]``.
    labels: int32 ``[N]``, class indices ``>= 0``.
    split: ``None`` or a bool ``[N]`` array, True for held-out (test) rows.
    num_classes: ``max(labels) + 1``.
  """

  features: np.ndarray
  labels: np.ndarray
  split: Optional[np.ndarray]
  num_classes: int


# ---------------------------------------------------------------------------------------------
# Shared helpers


def as_path(path, what: str) -> str:
  """``os.fspath(path)``, or a TypeError naming ``what`` (shared by the readers)."""
  try:
    return os.fspath(path)
  except TypeError:
    raise TypeError(
      f"{what} must be a path (str or os.PathLike), got {type(path).__name__}"
    ) from None


def _existing_file(path, what: str) -> str:
  path = as_path(path, what)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{what} {path!r} does not exist")
  if not os.path.isfile(path):
    raise ValueError(f"{what} {path!r} is not a regular file")
  return path


def _read_npz(
  path: str, what: str, required: Sequence[str], optional: Sequence[str] = ()
) -> Dict[str, np.ndarray]:
  """The arrays ``required`` (all present) and ``optional`` (if present) of an ``.npz``."""
  if not zipfile.is_zipfile(path):
    raise ValueError(
      f"{what} {path!r} is not a valid .npz (not a zip archive; save it with np.savez or "
      f"np.savez_compressed)"
    )
  try:
    npz = np.load(path, allow_pickle=False)
  except Exception as e:
    raise ValueError(f"{what} {path!r} is not a valid .npz: {e}") from e
  arrays = {}
  with npz:
    missing = [k for k in required if k not in npz.files]
    if missing:
      raise ValueError(
        f"{what} {path!r} has no key(s) {missing}: expected keys {list(required)}"
        + (f" (optional {list(optional)})" if optional else "")
        + f", found {sorted(npz.files)}"
      )
    for key in list(required) + [k for k in optional if k in npz.files]:
      try:
        arr = npz[key]
      except ValueError as e:
        if "pickle" in str(e) or "Object arrays" in str(e):
          raise TypeError(
            f"{what} {path!r}, key {key!r}: holds an object (pickled) array, which is not "
            f"loaded (allow_pickle=False); store a numeric array"
          ) from e
        raise ValueError(f"{what} {path!r}, key {key!r}: cannot read the array: {e}") from e
      except Exception as e:
        raise ValueError(f"{what} {path!r}, key {key!r}: cannot read the array: {e}") from e
      if not isinstance(arr, np.ndarray):  # a zip member that is not a .npy array
        raise ValueError(
          f"{what} {path!r}, key {key!r}: the member is not in .npy format (write the file "
          f"with np.savez)"
        )
      if arr.dtype == object:  # pragma: no cover - np.load refuses them first
        raise TypeError(f"{what} {path!r}, key {key!r}: object arrays are not supported")
      arrays[key] = arr
  return arrays


def check_labels(y, where: str, n: Optional[int] = None, num_classes: Optional[int] = None):
  """int32 copy of class labels ``y`` (1-D integers >= 0, ``n`` rows, < ``num_classes``).

  Shared by the readers and writers; errors start with ``where``.
  """
  y = np.asarray(y)
  if y.dtype == object or y.dtype.kind not in "iu":
    raise TypeError(f"{where}: labels must be integers, got dtype {y.dtype}")
  if y.ndim != 1:
    raise ValueError(f"{where}: labels must be 1-D [N], got shape {y.shape}")
  if n is not None and y.shape[0] != n:
    raise ValueError(f"{where}: has {y.shape[0]} labels but {n} rows: the lengths must agree")
  if y.size:
    hi = num_classes if num_classes is not None else np.iinfo(np.int32).max + 1
    if y.min() < 0 or y.max() >= hi:
      raise ValueError(
        f"{where}: labels must be class indices in [0, {hi}), got min {y.min()}, max {y.max()}"
      )
  return y.astype(np.int32)


def _check_features(
  features, labels, split, where: str, keys=("features", "labels", "split")
) -> FeatureSet:
  fkey, lkey, skey = keys
  x = np.asarray(features)
  if x.dtype == object or x.dtype.kind not in "biuf":
    raise TypeError(f"{where}, {fkey!r}: features must be real numbers, got dtype {x.dtype}")
  if x.ndim != 2:
    raise ValueError(f"{where}, {fkey!r}: features must be 2-D [N, d], got shape {x.shape}")
  if x.shape[0] == 0 or x.shape[1] == 0:
    raise ValueError(f"{where}, {fkey!r}: empty features (shape {x.shape}); need N, d >= 1")
  with np.errstate(over="ignore", invalid="ignore"):  # overflow shows up as inf, refused below
    x32 = x.astype(np.float32)
  if not np.all(np.isfinite(x32)):
    bad = np.argwhere(~np.isfinite(x32))[0].tolist()
    raise ValueError(
      f"{where}, {fkey!r}: features must be finite float32 values, got "
      f"{x.reshape(-1)[np.ravel_multi_index(bad, x.shape)]} at row {bad[0]}, column {bad[1]}"
    )
  y = check_labels(labels, f"{where}, {lkey!r}", n=x.shape[0])
  return FeatureSet(x32, y, _check_split(split, f"{where}, {skey!r}", x.shape[0]), int(y.max()) + 1)


def _check_split(split, where: str, n: int) -> Optional[np.ndarray]:
  if split is None:
    return None
  s = np.asarray(split)
  if s.dtype == object:
    raise TypeError(f"{where}: object arrays are not supported; use bool, 0/1 or 'train'/'test'")
  if s.ndim != 1 or s.shape[0] != n:
    raise ValueError(f"{where}: split must be 1-D with {n} entries (one per row), got {s.shape}")
  if s.dtype.kind == "b":
    return s.copy()
  if s.dtype.kind in "iu":
    bad = ~np.isin(s, (0, 1))
    if np.any(bad):
      i = int(np.flatnonzero(bad)[0])
      raise ValueError(f"{where}: split must be 0 (train) or 1 (test), got {s[i]} at row {i}")
    return s.astype(bool)
  if s.dtype.kind in "US":
    t = np.char.strip(np.char.lower(s.astype(str)))
    bad = ~np.isin(t, ("train", "test"))
    if np.any(bad):
      i = int(np.flatnonzero(bad)[0])
      raise ValueError(f"{where}: split strings must be 'train' or 'test', got {s[i]!r} at row {i}")
    return t == "test"
  raise TypeError(
    f"{where}: split must be bool, integers 0/1 or strings 'train'/'test', got dtype {s.dtype}"
  )


# ---------------------------------------------------------------------------------------------
# Features files


def load_features(path: PathLike) -> FeatureSet:
  """Reads precomputed embeddings from an ``.npz``.

  The file holds ``features`` (``[N, d]``, real numbers, finite in float32), ``labels`` (``[N]``
  integers ``>= 0``) and optionally ``split`` (``[N]``: bool, 0/1 or the strings ``"train"`` /
  ``"test"``; True / 1 / ``"test"`` marks a held-out row). It is read with ``allow_pickle=False``.

  Args:
    path: the ``.npz`` file.

  Returns:
    A :class:`FeatureSet` (float32 features, int32 labels, bool split or None,
    ``num_classes = max(labels) + 1``).

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: not an ``.npz``, missing keys, wrong shapes, lengths that disagree, negative
      labels, NaN/inf features, split values other than 0/1/'train'/'test'.
    TypeError: object (pickled) arrays, non-numeric features, non-integer labels.
  """
  path = _existing_file(path, "features file")
  arrays = _read_npz(path, "features file", ("features", "labels"), ("split",))
  return _check_features(
    arrays["features"], arrays["labels"], arrays.get("split"), f"features file {path!r}"
  )


def write_features(path: PathLike, features, labels, split=None) -> str:
  """Writes a features file that :func:`load_features` reads back (the inverse).

  Args:
    path: the ``.npz`` to write (``.npz`` is appended if missing; the folder must exist).
    features: ``[N, d]`` real numbers (stored as float32).
    labels: ``[N]`` integers ``>= 0`` (stored as int32).
    split: optional ``[N]`` bool / 0/1 / ``'train'``/``'test'`` (stored as bool, True = test).

  Returns:
    The path written.

  Raises:
    ValueError, TypeError: the arrays are not what :func:`load_features` accepts.
  """
  path = as_path(path, "path")
  fs = _check_features(features, labels, split, "write_features")
  if not path.endswith(".npz"):
    path += ".npz"
  arrays = {"features": fs.features, "labels": fs.labels}
  if fs.split is not None:
    arrays["split"] = fs.split
  np.savez(path, **arrays)
  return path
