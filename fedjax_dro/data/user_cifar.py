"""CIFAR-10 / CIFAR-100 binary versions (``cifar-10-batches-bin``, ``cifar-100-binary``).

The readers never touch the Python (pickle) versions. A file is read in one ``np.fromfile`` and
checked whole: an empty file, a length that is not a whole number of records or a label byte out of
range is refused with an error naming the file (and the record). The writers are the inverses, for
small stand-ins in the real layout (and test fixtures).
"""

from __future__ import annotations

import os
from typing import Sequence, Tuple

import numpy as np

from fedjax_dro.data.user_files import ImageSet, PathLike, as_path, check_labels

_CIFAR_SIDE = 32
_CIFAR_PIXELS = 3 * _CIFAR_SIDE * _CIFAR_SIDE  # 3072: the R plane, then G, then B, row-major
_CIFAR10_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))


def _cifar_dir(data_dir, subdir: str, files: Sequence[str], what: str) -> str:
  """``data_dir`` or ``data_dir/subdir``, whichever holds all of ``files``."""
  data_dir = as_path(data_dir, "data_dir")
  if not os.path.exists(data_dir):
    raise FileNotFoundError(f"data_dir {data_dir!r} does not exist")
  if not os.path.isdir(data_dir):
    raise ValueError(f"data_dir {data_dir!r} is not a folder; expected the {what} folder")
  candidates = (data_dir, os.path.join(data_dir, subdir))
  for folder in candidates:
    if all(os.path.isfile(os.path.join(folder, f)) for f in files):
      return folder
  folder = candidates[1] if os.path.isdir(candidates[1]) else candidates[0]
  missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
  raise FileNotFoundError(
    f"{what}: {missing} not found in {folder!r}; expected {list(files)} (the binary version, "
    f"{subdir}) in data_dir or data_dir/{subdir} (the Python/pickle version is not read)"
  )


def _read_cifar_records(path: str, num_labels: int, label_limits: Sequence[Tuple[str, int]]):
  """(uint8 labels ``[N, num_labels]``, uint8 pixels ``[N, 3072]``) of one binary file."""
  record = num_labels + _CIFAR_PIXELS
  size = os.path.getsize(path)
  layout = " + ".join(f"1 {name} label byte" for name, _ in label_limits)
  if size == 0:
    raise ValueError(f"CIFAR file {path!r} is empty; expected records of {record} bytes")
  if size % record:
    raise ValueError(
      f"CIFAR file {path!r} has {size} bytes, not a multiple of the record size {record} "
      f"({layout} + {_CIFAR_PIXELS} pixel bytes); is it the right dataset's binary version?"
    )
  raw = np.fromfile(path, dtype=np.uint8).reshape(-1, record)
  for column, (name, limit) in enumerate(label_limits):
    bad = raw[:, column] >= limit
    if np.any(bad):
      i = int(np.flatnonzero(bad)[0])
      raise ValueError(
        f"CIFAR file {path!r}, record {i}: {name} label byte {raw[i, column]} is out of range "
        f"[0, {limit}); is it the right dataset's binary version?"
      )
  return raw[:, :num_labels], raw[:, num_labels:]


def _cifar_images(pixels: np.ndarray, out=None) -> np.ndarray:
  """float32 ``[N, 32, 32, 3]`` in [0, 1] from uint8 rows of R, G, B planes (one pass)."""
  planes = pixels.reshape(-1, 3, _CIFAR_SIDE, _CIFAR_SIDE).transpose(0, 2, 3, 1)
  if out is None:
    out = np.empty(planes.shape, np.float32)
  return np.divide(planes, np.float32(255), out=out, dtype=np.float32)


def _class_names(path: str, num_classes: int) -> Tuple[str, ...]:
  """Names (one a line, blank lines skipped) from ``path``, or ``()`` if there is no such file."""
  if not os.path.isfile(path):
    return ()
  with open(path, encoding="utf-8") as f:
    names = tuple(line.strip() for line in f if line.strip())
  if len(names) != num_classes:
    raise ValueError(
      f"class names file {path!r} has {len(names)} names; expected {num_classes}, one a line"
    )
  return names


def load_cifar10(data_dir: PathLike) -> ImageSet:
  """Reads CIFAR-10 from its binary version (``cifar-10-batches-bin``).

  The files ``data_batch_1.bin`` .. ``data_batch_5.bin`` (train, in that order) and
  ``test_batch.bin`` are read from ``data_dir`` or ``data_dir/cifar-10-batches-bin``. Each record
  is 1 label byte (0-9) and 3072 pixel bytes: the red, green and blue 32x32 planes, row-major;
  pixel ``(i, j)`` of record ``n`` becomes ``x[n, i, j, :]``. Class names come from
  ``batches.meta.txt`` when present.

  Args:
    data_dir: the ``cifar-10-batches-bin`` folder or the folder holding it.

  Returns:
    An :class:`ImageSet` with ``x`` float32 ``[N, 32, 32, 3]`` in ``[0, 1]`` and 10 classes.

  Raises:
    FileNotFoundError: ``data_dir`` or one of the six files is missing.
    ValueError: an empty file, a length that is not a whole number of 3073-byte records, a label
      byte >= 10, or a names file without 10 names.
  """
  folder = _cifar_dir(
    data_dir, "cifar-10-batches-bin", _CIFAR10_TRAIN + ("test_batch.bin",), "CIFAR-10"
  )
  limits = [("class", 10)]
  parts = {}
  for split, files in (("train", _CIFAR10_TRAIN), ("test", ("test_batch.bin",))):
    records = [_read_cifar_records(os.path.join(folder, f), 1, limits) for f in files]
    y = np.concatenate([labels[:, 0] for labels, _ in records]).astype(np.int32)
    x = np.empty((y.shape[0], _CIFAR_SIDE, _CIFAR_SIDE, 3), np.float32)
    start = 0
    for _, pixels in records:
      _cifar_images(pixels, out=x[start : start + pixels.shape[0]])
      start += pixels.shape[0]
    parts[split] = (x, y)
  names = _class_names(os.path.join(folder, "batches.meta.txt"), 10)
  return ImageSet(*parts["train"], *parts["test"], 10, names)


def load_cifar100(data_dir: PathLike, *, label: str = "fine") -> ImageSet:
  """Reads CIFAR-100 from its binary version (``cifar-100-binary``).

  The files ``train.bin`` and ``test.bin`` are read from ``data_dir`` or
  ``data_dir/cifar-100-binary``. Each record is 1 coarse label byte (0-19), 1 fine label byte
  (0-99) and 3072 pixel bytes laid out as in CIFAR-10 (:func:`load_cifar10`). Class names come
  from ``fine_label_names.txt`` / ``coarse_label_names.txt`` when present.

  Args:
    data_dir: the ``cifar-100-binary`` folder or the folder holding it.
    label: ``"fine"`` (100 classes) or ``"coarse"`` (20 superclasses).

  Returns:
    An :class:`ImageSet` with ``x`` float32 ``[N, 32, 32, 3]`` in ``[0, 1]``.

  Raises:
    FileNotFoundError: ``data_dir``, ``train.bin`` or ``test.bin`` is missing.
    ValueError: ``label`` is neither "fine" nor "coarse", an empty file, a length that is not a
      whole number of 3074-byte records, a label byte out of range, or a names file with the
      wrong number of names.
  """
  if label not in ("fine", "coarse"):
    raise ValueError(f"label must be 'fine' or 'coarse', got {label!r}")
  folder = _cifar_dir(data_dir, "cifar-100-binary", ("train.bin", "test.bin"), "CIFAR-100")
  limits = [("coarse", 20), ("fine", 100)]
  column, num_classes = (1, 100) if label == "fine" else (0, 20)
  parts = []
  for name in ("train.bin", "test.bin"):
    labels, pixels = _read_cifar_records(os.path.join(folder, name), 2, limits)
    parts += [_cifar_images(pixels), labels[:, column].astype(np.int32)]
  names = _class_names(os.path.join(folder, f"{label}_label_names.txt"), num_classes)
  return ImageSet(*parts, num_classes, names)


def _cifar_pixel_rows(x, where: str) -> np.ndarray:
  """uint8 ``[N, 3072]`` rows (R, G, B planes) from ``[N, 32, 32, 3]`` uint8 or [0, 1] floats."""
  x = np.asarray(x)
  if x.dtype == object or x.dtype.kind not in "biuf":
    raise TypeError(f"{where}: images must be numbers, got dtype {x.dtype}")
  if x.ndim != 4 or x.shape[1:] != (_CIFAR_SIDE, _CIFAR_SIDE, 3):
    raise ValueError(f"{where}: images must be [N, 32, 32, 3], got shape {x.shape}")
  if x.dtype.kind == "f":
    if x.size and not (np.all(np.isfinite(x)) and x.min() >= 0 and x.max() <= 1):
      raise ValueError(f"{where}: float images must be finite and in [0, 1]")
    x = np.round(x * 255)
  elif x.size and (x.min() < 0 or x.max() > 255):
    raise ValueError(f"{where}: integer images must be in [0, 255]")
  return x.astype(np.uint8).transpose(0, 3, 1, 2).reshape(x.shape[0], _CIFAR_PIXELS)


def _write_records(path: str, label_columns: Sequence[np.ndarray], pixels: np.ndarray) -> None:
  columns = [np.asarray(c, np.uint8)[:, None] for c in label_columns]
  np.ascontiguousarray(np.concatenate(columns + [pixels], axis=1)).tofile(path)


def _names_text(names, num_classes: int, where: str):
  """The names file's text (one name a line), or None when ``names`` is None."""
  if names is None:
    return None
  names = [str(n) for n in names]
  if len(names) != num_classes or any(not n.strip() or "\n" in n for n in names):
    raise ValueError(f"{where}: expected {num_classes} non-empty one-line names")
  return "\n".join(names) + "\n"


def _write_text(path: str, text) -> None:
  if text is not None:
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)


def _prepare_dir(data_dir) -> str:
  data_dir = as_path(data_dir, "data_dir")
  os.makedirs(data_dir, exist_ok=True)
  return data_dir


def write_cifar10_bin(data_dir: PathLike, x_train, y_train, x_test, y_test, *, class_names=None):
  """Writes CIFAR-10 binary files that :func:`load_cifar10` reads back (the inverse).

  Makes small stand-ins (and test fixtures) in the real layout: the training rows are cut into
  ``data_batch_1.bin`` .. ``data_batch_5.bin`` in order, the test rows go to ``test_batch.bin``.

  Args:
    data_dir: the folder to write into (created if missing).
    x_train: ``[N, 32, 32, 3]`` images, uint8 or floats in ``[0, 1]`` (rounded to ``k / 255``);
      ``N >= 5`` (one row per batch file at least).
    y_train: ``[N]`` labels in ``[0, 10)``.
    x_test: ``[M, 32, 32, 3]`` images, ``M >= 1``.
    y_test: ``[M]`` labels in ``[0, 10)``.
    class_names: optional 10 names, written to ``batches.meta.txt``.

  Returns:
    ``data_dir``.
  """
  train = _cifar_pixel_rows(x_train, "x_train")
  test = _cifar_pixel_rows(x_test, "x_test")
  y_train = check_labels(y_train, "y_train", n=train.shape[0], num_classes=10)
  y_test = check_labels(y_test, "y_test", n=test.shape[0], num_classes=10)
  if train.shape[0] < 5 or test.shape[0] < 1:
    raise ValueError(
      f"x_train needs >= 5 rows (one per batch file) and x_test >= 1, got {train.shape[0]} "
      f"and {test.shape[0]}"
    )
  names = _names_text(class_names, 10, "class_names")
  data_dir = _prepare_dir(data_dir)
  _write_text(os.path.join(data_dir, "batches.meta.txt"), names)
  for name, rows in zip(_CIFAR10_TRAIN, np.array_split(np.arange(train.shape[0]), 5)):
    _write_records(os.path.join(data_dir, name), [y_train[rows]], train[rows])
  _write_records(os.path.join(data_dir, "test_batch.bin"), [y_test], test)
  return data_dir


def write_cifar100_bin(
  data_dir: PathLike,
  x_train,
  y_train,
  x_test,
  y_test,
  *,
  coarse_train=None,
  coarse_test=None,
  fine_names=None,
  coarse_names=None,
):
  """Writes CIFAR-100 binary files that :func:`load_cifar100` reads back (the inverse).

  Args:
    data_dir: the folder to write into (created if missing); gets ``train.bin`` and ``test.bin``.
    x_train: ``[N, 32, 32, 3]`` images, uint8 or floats in ``[0, 1]``, ``N >= 1``.
    y_train: ``[N]`` fine labels in ``[0, 100)``.
    x_test: ``[M, 32, 32, 3]`` images, ``M >= 1``.
    y_test: ``[M]`` fine labels in ``[0, 100)``.
    coarse_train: ``[N]`` coarse labels in ``[0, 20)`` (default ``y_train // 5``, a stand-in,
      not the real CIFAR-100 superclass map).
    coarse_test: ``[M]`` coarse labels (default ``y_test // 5``).
    fine_names: optional 100 names, written to ``fine_label_names.txt``.
    coarse_names: optional 20 names, written to ``coarse_label_names.txt``.

  Returns:
    ``data_dir``.
  """
  written = []
  for split, x, y, coarse in (
    ("train", x_train, y_train, coarse_train),
    ("test", x_test, y_test, coarse_test),
  ):
    rows = _cifar_pixel_rows(x, f"x_{split}")
    if rows.shape[0] < 1:
      raise ValueError(f"x_{split} needs >= 1 row, got shape {np.shape(x)}")
    fine = check_labels(y, f"y_{split}", n=rows.shape[0], num_classes=100)
    coarse = fine // 5 if coarse is None else coarse
    coarse = check_labels(coarse, f"coarse_{split}", n=rows.shape[0], num_classes=20)
    written.append((f"{split}.bin", [coarse, fine], rows))
  fine_text = _names_text(fine_names, 100, "fine_names")
  coarse_text = _names_text(coarse_names, 20, "coarse_names")
  data_dir = _prepare_dir(data_dir)
  _write_text(os.path.join(data_dir, "fine_label_names.txt"), fine_text)
  _write_text(os.path.join(data_dir, "coarse_label_names.txt"), coarse_text)
  for name, labels, rows in written:
    _write_records(os.path.join(data_dir, name), labels, rows)
  return data_dir
