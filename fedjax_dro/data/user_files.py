"""Readers for files the user already has on disk: CIFAR-10/100 (binary), TinyImageNet, features.

Nothing is downloaded and nothing is unpickled (every ``np.load`` uses ``allow_pickle=False``; the
CIFAR readers use the *binary* versions, ``cifar-10-batches-bin`` and ``cifar-100-binary``, never
the Python pickles). Every reader validates the whole layout before returning, and a malformed
file gets a ``ValueError`` / ``TypeError`` / ``FileNotFoundError`` naming the file and what was
expected. The ``write_*`` functions are the inverses, for making small stand-ins (and test
fixtures) in the same formats. This module holds the containers, the features and TinyImageNet
readers and the checks they share; the CIFAR readers are in :mod:`fedjax_dro.data.user_cifar`.
"""

from __future__ import annotations

import os
import zipfile
from typing import Dict, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from fedjax_dro.data.user_arrays import check_class_count, read_npz_member

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
  """``path`` as a str with ``~`` expanded, or a TypeError naming ``what`` (shared by the readers)."""
  try:
    return os.path.expanduser(os.fspath(path))
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
        + f", found {_listing(npz.files)}"
      )
    for key in list(required) + [k for k in optional if k in npz.files]:
      arr = read_npz_member(npz, key, f"{what} {path!r}")
      if arr.dtype == object:  # pragma: no cover - np.load refuses them first
        raise TypeError(f"{what} {path!r}, key {key!r}: object arrays are not supported")
      arrays[key] = arr
  return arrays


def _listing(names, limit: int = 10) -> str:
  names = sorted(names)
  more = f" ... ({len(names)} in all)" if len(names) > limit else ""
  return f"{names[:limit]}{more}"


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
      wanted = f"in [0, {hi})" if num_classes is not None else ">= 0 (and fit int32)"
      raise ValueError(
        f"{where}: labels must be class indices {wanted}, got min {y.min()}, max {y.max()}"
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
  check_class_count(int(y.max()), x.shape[0], f"{where}, {lkey!r}")
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
      raise ValueError(
        f"{where}: split strings must be 'train' or 'test', got {str(s[i])!r} at row {i}"
      )
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


# ---------------------------------------------------------------------------------------------
# TinyImageNet

_TINY_SHAPE = (64, 64, 3)
_TINY_KEYS = ("x_train", "y_train", "x_test", "y_test")
_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
_TINY_LAYOUT = (
  "tiny-imagenet-200/ with wnids.txt, train/<wnid>/images/*.JPEG, val/val_annotations.txt and "
  "val/images/*.JPEG"
)


def load_tiny_imagenet(path: PathLike) -> ImageSet:
  """Reads TinyImageNet (200 classes, 64x64 RGB) from an ``.npz`` or from its standard folder.

  The ``.npz`` holds ``x_train``, ``x_test`` (``[N, 64, 64, 3]``, uint8 or floats in
  ``[0, 1]``), ``y_train``, ``y_test`` (integers ``>= 0``) and optionally ``class_names``
  (strings; then ``num_classes = len(class_names)``, else ``max(label) + 1``); it is read with
  ``allow_pickle=False``. The folder is ``tiny-imagenet-200/`` as distributed (``path`` may also
  be the folder holding it): ``wnids.txt`` (one class id a line, in label order),
  ``train/<wnid>/images/*.JPEG`` and ``val/val_annotations.txt`` (``file<TAB>wnid...``) with
  ``val/images/``; the val split is the test set (the official test split has no labels).
  Images are decoded with Pillow (grayscale ones converted to RGB), imported only here; decoding
  the whole folder (110,000 JPEGs) takes of the order of a minute (about 0.4 ms an image), so
  saving the result once in the ``.npz`` form (uint8 pixels, ``np.round(x * 255)``) makes later
  reads fast and Pillow-free.

  Args:
    path: the ``.npz`` file or the TinyImageNet folder.

  Returns:
    An :class:`ImageSet` with ``x`` float32 ``[N, 64, 64, 3]`` in ``[0, 1]``; for the folder,
    ``class_names`` are the wnids.

  Raises:
    FileNotFoundError: ``path``, ``wnids.txt``, a class's ``images`` folder, the val annotations
      or an annotated image is missing.
    ValueError: a malformed ``.npz`` (missing keys, wrong shapes, float pixels outside
      ``[0, 1]``, lengths that disagree, negative labels), an empty or duplicated ``wnids.txt``,
      a malformed annotation line or unknown wnid, an unreadable image or one not 64x64.
    TypeError: object (pickled) arrays, images neither uint8 nor float, non-integer labels.
    ImportError: the folder form without Pillow installed.
  """
  path = as_path(path, "path")
  if not os.path.exists(path):
    raise FileNotFoundError(f"TinyImageNet path {path!r} does not exist")
  if os.path.isfile(path):
    if zipfile.is_zipfile(path):
      with zipfile.ZipFile(path) as z:
        if any(name.endswith("wnids.txt") for name in z.namelist()):
          raise ValueError(
            f"TinyImageNet npz {path!r} is the zipped TinyImageNet folder, not an .npz; unzip it "
            f"and pass the folder"
          )
    return _tiny_imagenet_npz(path)
  nested = os.path.join(path, "tiny-imagenet-200")
  if not os.path.exists(os.path.join(path, "wnids.txt")) and os.path.isdir(nested):
    path = nested
  return _tiny_imagenet_folder(path)


def _tiny_images(x: np.ndarray, where: str) -> np.ndarray:
  if x.dtype != np.uint8 and x.dtype.kind != "f":
    raise TypeError(f"{where}: images must be uint8 or floats in [0, 1], got dtype {x.dtype}")
  if x.ndim != 4 or x.shape[1:] != _TINY_SHAPE or x.shape[0] == 0:
    raise ValueError(f"{where}: images must be [N >= 1, 64, 64, 3], got shape {x.shape}")
  if x.dtype == np.uint8:
    return x.astype(np.float32) / np.float32(255)
  if not np.all(np.isfinite(x)):
    raise ValueError(f"{where}: float images must be finite and in [0, 1], got NaN or inf")
  if x.min() < 0 or x.max() > 1:
    raise ValueError(
      f"{where}: float images must be finite and in [0, 1] (store uint8 for 0-255 pixels), got "
      f"range [{x.min()}, {x.max()}]"
    )
  return x.astype(np.float32)


def _tiny_imagenet_npz(path: str) -> ImageSet:
  what = "TinyImageNet npz"
  arrays = _read_npz(path, what, _TINY_KEYS, ("class_names",))
  where = lambda key: f"{what} {path!r}, {key!r}"  # noqa: E731
  names, num_classes = (), None
  if "class_names" in arrays:
    c = arrays["class_names"]
    if c.dtype.kind not in "US" or c.ndim != 1 or c.size == 0:
      raise ValueError(
        f"{where('class_names')}: expected a non-empty 1-D string array, got {c.dtype} {c.shape}"
      )
    names = tuple(str(n) for n in c.astype(str))
    num_classes = len(names)
  out = []
  for split in ("train", "test"):
    x = _tiny_images(arrays[f"x_{split}"], where(f"x_{split}"))
    y = check_labels(arrays[f"y_{split}"], where(f"y_{split}"), x.shape[0], num_classes)
    out += [x, y]
  if num_classes is None:
    num_classes = int(max(out[1].max(), out[3].max())) + 1
  return ImageSet(*out, num_classes, names)


def _pillow():
  try:
    from PIL import Image  # noqa: PLC0415 - optional dependency, imported only where needed
  except ImportError as e:
    raise ImportError(
      "reading the TinyImageNet folder needs Pillow to decode its JPEGs (pip install pillow); "
      "or convert it once elsewhere to the .npz form (x_train, y_train, x_test, y_test) that "
      "load_tiny_imagenet reads without it"
    ) from e
  return Image


def _decode_into(image_module, path: str, out: np.ndarray) -> None:
  """Decodes the 64x64 image at ``path`` into ``out`` (float32 ``[64, 64, 3]`` in [0, 1])."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"TinyImageNet image {path!r} does not exist")
  try:
    with image_module.open(path) as im:
      size = im.size
      rgb = np.asarray(im.convert("RGB"), dtype=np.uint8) if size == (64, 64) else None
  except Exception as e:
    raise ValueError(f"TinyImageNet image {path!r} is not a readable image: {e}") from e
  if rgb is None:
    raise ValueError(f"TinyImageNet image {path!r} is {size[0]}x{size[1]}; expected 64x64")
  np.divide(rgb, np.float32(255), out=out, dtype=np.float32)


def _decode_all(image_module, paths, labels) -> Tuple[np.ndarray, np.ndarray]:
  x = np.empty((len(paths),) + _TINY_SHAPE, np.float32)
  for i, p in enumerate(paths):
    _decode_into(image_module, p, x[i])
  return x, np.asarray(labels, np.int32)


def _tiny_imagenet_folder(root: str) -> ImageSet:
  wnids_path = os.path.join(root, "wnids.txt")
  if not os.path.isfile(wnids_path):
    raise FileNotFoundError(
      f"TinyImageNet folder {root!r} has no wnids.txt; expected {_TINY_LAYOUT} (or an .npz file)"
    )
  with open(wnids_path, encoding="utf-8") as f:
    wnids = [line.strip() for line in f if line.strip()]
  if not wnids or len(set(wnids)) != len(wnids):
    raise ValueError(
      f"TinyImageNet file {wnids_path!r}: expected distinct class ids, one a line, got "
      f"{len(wnids)} lines with {len(set(wnids))} distinct"
    )
  index = {w: k for k, w in enumerate(wnids)}
  image_module = _pillow()
  train_paths, train_labels = [], []
  for k, wnid in enumerate(wnids):
    folder = os.path.join(root, "train", wnid, "images")
    if not os.path.isdir(folder):
      raise FileNotFoundError(
        f"TinyImageNet folder {folder!r} (class {wnid!r} of wnids.txt) does not exist; expected "
        f"{_TINY_LAYOUT}"
      )
    files = sorted(f for f in os.listdir(folder) if f.lower().endswith(_IMAGE_SUFFIXES))
    if not files:
      raise ValueError(f"TinyImageNet folder {folder!r} has no .JPEG/.jpg/.png images")
    train_paths += [os.path.join(folder, f) for f in files]
    train_labels += [k] * len(files)
  ann = os.path.join(root, "val", "val_annotations.txt")
  if not os.path.isfile(ann):
    raise FileNotFoundError(
      f"TinyImageNet folder {root!r} has no val/val_annotations.txt (the labelled test set); "
      f"expected {_TINY_LAYOUT}"
    )
  test_paths, test_labels = [], []
  with open(ann, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      fields = line.rstrip("\n").split("\t")
      if len(fields) < 2 or not fields[0]:
        raise ValueError(
          f"TinyImageNet file {ann!r}, line {lineno}: expected '<file>\\t<wnid>...', got "
          f"{line.strip()!r}"
        )
      if fields[1] not in index:
        raise ValueError(
          f"TinyImageNet file {ann!r}, line {lineno}: wnid {fields[1]!r} is not in wnids.txt"
        )
      test_paths.append(os.path.join(root, "val", "images", fields[0]))
      test_labels.append(index[fields[1]])
  if not test_paths:
    raise ValueError(f"TinyImageNet file {ann!r} lists no images")
  x_train, y_train = _decode_all(image_module, train_paths, train_labels)
  x_test, y_test = _decode_all(image_module, test_paths, test_labels)
  return ImageSet(x_train, y_train, x_test, y_test, len(wnids), tuple(wnids))
