"""Real image data: imbalanced, label-skewed handwritten digits (the FGDRO image setting).

The FGDRO paper's image experiment (Appendix G) takes CIFAR-10, makes it class-imbalanced by
reducing the data of 5 classes by 80%, and splits it over 100 clients with a Dirichlet label
partition (Dirichlet(0.3) for strong heterogeneity, Dirichlet(10) for mild). CIFAR-10 cannot ship
with the package and nothing may download at run time, so this module reproduces the *setting*
on a small real image set that does ship: the UCI "Optical Recognition of Handwritten Digits"
test set (Alpaydin & Kaynak 1998, CC BY 4.0, https://doi.org/10.24432/C50P49) as distributed by
scikit-learn's ``load_digits`` -- 1797 grey-level 8x8 images of the digits 0..9, values 0..16.
See ``DIGITS_LICENSE.md`` next to this file.

:func:`digits_dirichlet` = stratified train/test split -> :func:`reduce_classes` on the train part
(classes 5..9 keep 20%) -> :func:`~fedjax_dro.data.partition.dirichlet_partition` of the train
rows over 100 clients. The test part stays balanced and pooled; worst-client accuracy is scored
with :func:`~fedjax_dro.core.metrics.class_weighted_accuracy` (each client's expected accuracy under its own label mix).
"""

from __future__ import annotations

import numbers
import os
from typing import NamedTuple, Sequence

import numpy as np

from fedjax_dro.common.checks import choice
from fedjax_dro.data.federated import FederatedDataset, from_client_arrays
from fedjax_dro.data.partition import (
  climb_dirichlet_partition,
  climb_imbalance,
  dirichlet_partition,
)

DIGITS_PATH = os.path.join(os.path.dirname(__file__), "digits.npz")
DIGITS_NUM_ROWS = 1797
DIGITS_NUM_CLASSES = 10
DIGITS_MAX_PIXEL = 16
TEST_ROWS_PER_CLIENT = 64


def load_digits(path: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
  """The shipped digits: ``x`` float32 ``[1797, 8, 8]`` in ``[0, 1]`` (pixel / 16), ``y`` int32
  ``[1797]`` in ``0..9``.

  Args:
    path: the ``.npz`` to read (default: the copy shipped next to this module). Tests use it to
      point at a corrupted file.

  Raises:
    ValueError: the file is missing, not a valid ``.npz``, or its arrays have the wrong keys,
      shapes, dtypes or values (a corrupted or truncated copy).
  """
  path = os.fspath(path) if path is not None else DIGITS_PATH
  if not os.path.isfile(path):
    raise ValueError(
      f"digits file {path!r} is missing: it ships with fedjax_dro (package data "
      f"data/digits.npz); reinstall the package"
    )
  try:
    with np.load(path, allow_pickle=False) as npz:
      arrays = {key: npz[key] for key in ("x", "y")}
  except Exception as e:  # zipfile.BadZipFile, KeyError, ValueError, OSError, ...
    raise ValueError(
      f"digits file {path!r} is corrupted (could not read arrays 'x' and 'y': {e}); reinstall "
      f"fedjax_dro"
    ) from e
  x, y = arrays["x"], arrays["y"]
  if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
    raise ValueError(f"digits file {path!r} is corrupted: 'x' or 'y' is not a .npy array")
  expected = (
    (
      x.shape == (DIGITS_NUM_ROWS, 8, 8),
      f"x has shape {x.shape}, expected ({DIGITS_NUM_ROWS}, 8, 8)",
    ),
    (y.shape == (DIGITS_NUM_ROWS,), f"y has shape {y.shape}, expected ({DIGITS_NUM_ROWS},)"),
    (x.dtype == np.uint8, f"x has dtype {x.dtype}, expected uint8"),
    (y.dtype == np.uint8, f"y has dtype {y.dtype}, expected uint8"),
  )
  for ok, what in expected:
    if not ok:
      raise ValueError(f"digits file {path!r} is corrupted: {what}")
  if x.max() > DIGITS_MAX_PIXEL:
    raise ValueError(
      f"digits file {path!r} is corrupted: pixel values must be in 0..{DIGITS_MAX_PIXEL}, got "
      f"max {x.max()}"
    )
  counts = np.bincount(y, minlength=DIGITS_NUM_CLASSES)
  if y.max() >= DIGITS_NUM_CLASSES or np.any(counts == 0):
    raise ValueError(
      f"digits file {path!r} is corrupted: labels must cover 0..{DIGITS_NUM_CLASSES - 1}, got "
      f"counts {counts.tolist()}"
    )
  return (x.astype(np.float32) / DIGITS_MAX_PIXEL).astype(np.float32), y.astype(np.int32)


def _int_labels(labels, name: str) -> np.ndarray:
  arr = np.asarray(labels)
  if arr.ndim != 1:
    raise ValueError(f"{name} must be a 1-D array of integer labels, got shape {arr.shape}")
  if arr.dtype.kind not in "iu":
    raise TypeError(f"{name} must hold integer labels, got dtype {arr.dtype}")
  return arr


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def reduce_classes(labels, classes: Sequence[int], fraction: float, *, seed: int) -> np.ndarray:
  """Row indices kept by the FGDRO imbalance step ("reduce the data of 5 classes by 80%").

  Every class ``c`` in ``classes`` keeps ``round_half_up(fraction * count_c)`` of its rows, drawn
  without replacement from ``np.random.default_rng(seed)``; rows of the other classes are all kept.
  Rounding is half up, ``floor(fraction * count + 0.5)`` (a 1e-9 slack absorbs float error, so
  ``0.35 * 10`` keeps 4): with ``fraction=0.2`` a class of 178 rows keeps 36, one of 174 keeps 35.
  A class with ``fraction * count < 0.5`` keeps no row.

  Args:
    labels: ``[N]`` integer labels.
    classes: the non-empty, duplicate-free classes to reduce; each must occur in ``labels``.
    fraction: the share of each reduced class that is kept, in ``(0, 1]``.
    seed: seed of the draw (same seed, same rows).

  Returns:
    The sorted ``int64`` indices of the kept rows.
  """
  labels = _int_labels(labels, "labels")
  if isinstance(classes, (str, bytes)) or not isinstance(classes, (Sequence, np.ndarray)):
    raise TypeError(f"classes must be a sequence of integer labels, got {type(classes).__name__}")
  classes = list(np.asarray(classes).tolist()) if isinstance(classes, np.ndarray) else list(classes)
  if not classes:
    raise ValueError("classes must name at least one class to reduce, got an empty sequence")
  for c in classes:
    if not _is_int(c):
      raise TypeError(f"classes must hold integers, got {c!r} ({type(c).__name__})")
  if len(set(int(c) for c in classes)) != len(classes):
    raise ValueError(f"classes has duplicates: {classes}")
  present = set(np.unique(labels).tolist())
  missing = [int(c) for c in classes if int(c) not in present]
  if missing:
    raise ValueError(f"classes {missing} do not occur in labels (present: {sorted(present)})")
  if not isinstance(fraction, numbers.Real) or isinstance(fraction, (bool, np.bool_)):
    raise TypeError(f"fraction must be a number in (0, 1], got {fraction!r}")
  if not 0.0 < float(fraction) <= 1.0:  # also rejects NaN
    raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
  if not _is_int(seed):
    raise TypeError(f"seed must be an integer, got {seed!r}")
  rng = np.random.default_rng(seed)
  keep = np.ones(labels.size, bool)
  for c in sorted(int(c) for c in classes):
    rows = np.flatnonzero(labels == c)
    k = int(np.floor(float(fraction) * rows.size + 0.5 + 1e-9))
    keep[rows] = False
    keep[rng.choice(rows, k, replace=False)] = True
  return np.flatnonzero(keep).astype(np.int64)


def label_proportions(labels_per_client: Sequence, num_classes: int) -> np.ndarray:
  """``[n, num_classes]`` float64: row ``i`` is client ``i``'s class frequencies (sums to 1).

  Args:
    labels_per_client: one 1-D integer array of labels per client (each non-empty).
    num_classes: number of classes; every label must be in ``[0, num_classes)``.
  """
  if not _is_int(num_classes) or num_classes < 1:
    raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
  if isinstance(labels_per_client, np.ndarray) and labels_per_client.ndim == 2:
    labels_per_client = list(labels_per_client)
  if not isinstance(labels_per_client, (list, tuple)):
    raise TypeError(
      f"labels_per_client must be a list of per-client label arrays, got "
      f"{type(labels_per_client).__name__}"
    )
  if not labels_per_client:
    raise ValueError("labels_per_client is empty: at least one client is required")
  out = np.zeros((len(labels_per_client), num_classes), np.float64)
  for i, labels in enumerate(labels_per_client):
    labels = _int_labels(labels, f"labels_per_client[{i}]")
    if labels.size == 0:
      raise ValueError(f"labels_per_client[{i}] is empty: proportions need >= 1 label")
    if labels.min() < 0 or labels.max() >= num_classes:
      raise ValueError(
        f"labels_per_client[{i}] has labels outside [0, {num_classes}): min {labels.min()}, "
        f"max {labels.max()}"
      )
    out[i] = np.bincount(labels, minlength=num_classes) / labels.size
  return out


class DigitsExtras(NamedTuple):
  """What :func:`digits_dirichlet_with_extras` returns next to the dataset.

  Attributes:
    proportions: ``[num_clients, 10]`` float64, each client's exact train label proportions (the
      weights of :func:`~fedjax_dro.core.metrics.class_weighted_accuracy`).
    test_x: ``[N_test, 8, 8]`` float32, the pooled balanced (stratified) test images.
    test_y: ``[N_test]`` int32, their labels.
  """

  proportions: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray


def _check_args(num_clients, alpha, reduced_classes, fraction, test_fraction, seed):
  if not _is_int(seed):
    raise TypeError(f"seed must be an integer, got {seed!r}")
  if not _is_int(num_clients) or num_clients < 1:
    raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}")
  for name, value in (("alpha", alpha), ("fraction", fraction), ("test_fraction", test_fraction)):
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
      raise TypeError(f"{name} must be a number, got {value!r}")
  if not (0.0 < float(alpha) < np.inf):
    raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
  if not 0.0 < float(test_fraction) < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
  if not 0.0 < float(fraction) <= 1.0:
    raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
  if isinstance(reduced_classes, (str, bytes)) or not isinstance(reduced_classes, Sequence):
    raise TypeError(
      f"reduced_classes must be a sequence of digits, got {type(reduced_classes).__name__}"
    )
  for c in reduced_classes:
    if not _is_int(c) or not 0 <= c < DIGITS_NUM_CLASSES:
      raise ValueError(f"reduced_classes must hold digits 0..9, got {c!r}")
  if len(set(reduced_classes)) != len(reduced_classes):
    raise ValueError(f"reduced_classes has duplicates: {tuple(reduced_classes)}")


def digits_dirichlet_with_extras(
  seed: int = 0,
  *,
  num_clients: int = 100,
  alpha: float = 0.3,
  reduced_classes: Sequence[int] = (5, 6, 7, 8, 9),
  fraction: float = 0.2,
  test_fraction: float = 0.3,
  split: str = "per_class",
) -> tuple[FederatedDataset, DigitsExtras]:
  """:func:`digits_dirichlet` plus the exact label proportions and the pooled balanced test set.

  Steps (all seeded from ``seed``, through independent child seeds):

  1. a stratified split of the 1797 pooled images: each class puts ``round(test_fraction * n_c)``
     rows in the test part (~54 per class at 0.3; balanced, pooled, never reduced);
  2. :func:`reduce_classes` on the train part: each of ``reduced_classes`` keeps ``fraction`` of
     its train rows (an empty ``reduced_classes`` or ``fraction=1`` skips this step);
  3. :func:`~fedjax_dro.data.partition.dirichlet_partition` of the remaining train rows over
     ``num_clients`` clients with ``Dirichlet(alpha)``, ``min_examples=1`` (the default setting
     has ~755 train rows for 100 clients, ~7.5 per client, so larger minimums rarely exist);
     With ``split="climb"``, steps 2 and 3 are those of the code released with Shen et al. (ICLR
     2021), which FGDRO uses: :func:`~fedjax_dro.data.partition.climb_imbalance` (the first
     ``fraction`` of the reduced classes' pooled rows kept) and
     :func:`~fedjax_dro.data.partition.climb_dirichlet_partition` (per-client Dirichlet
     proportions, clients filled in turn with ``N // num_clients`` rows each);
  4. per-client test sets: client ``i`` draws, without replacement, at most 64 rows of the pooled
     test part among the classes it holds, row ``r`` with probability proportional to
     ``p_i[y_r] / n_test[y_r]`` (so the class mix follows the client's train mix ``p_i``, only
     approximately: drawing without replacement flattens it when a class runs out of rows).
     These are small and noisy; prefer :func:`~fedjax_dro.core.metrics.class_weighted_accuracy` with
     ``extras.proportions`` and per-class accuracy on ``extras.test_x, extras.test_y``.

  Returns:
    ``(dataset, extras)``: ``dataset.train`` and ``dataset.test`` have ``num_clients`` clients,
    ``x`` float32 ``[n, max_examples, 8, 8]`` in ``[0, 1]``, ``y`` int32; ``extras`` is a
    :class:`DigitsExtras`.
  """
  _check_args(num_clients, alpha, reduced_classes, fraction, test_fraction, seed)
  choice(split, "split", ("per_class", "climb"))
  x, y = load_digits()
  split_seed, reduce_seed, partition_seed, test_seed = (
    int(s) for s in np.random.SeedSequence(seed).generate_state(4)
  )

  # 1. Stratified train/test split of the pooled images.
  rng = np.random.default_rng(split_seed)
  is_test = np.zeros(y.size, bool)
  for c in range(DIGITS_NUM_CLASSES):
    rows = np.flatnonzero(y == c)
    k = int(round(test_fraction * rows.size))
    if not 0 < k < rows.size:
      raise ValueError(
        f"test_fraction={test_fraction!r} puts {k} of the {rows.size} images of digit {c} in the "
        f"test split: every class needs >= 1 train and >= 1 test image"
      )
    is_test[rng.choice(rows, k, replace=False)] = True
  test_x, test_y = x[is_test], y[is_test]
  train_x, train_y = x[~is_test], y[~is_test]

  # 2. Imbalance on the train part only; 3. Dirichlet label-skew partition of the train rows.
  if split == "climb":
    keep = climb_imbalance(train_y, list(reduced_classes), float(fraction), seed=reduce_seed)
    train_x, train_y = train_x[keep], train_y[keep]
    parts = climb_dirichlet_partition(
      train_y, num_clients, float(alpha), num_classes=DIGITS_NUM_CLASSES, seed=partition_seed
    )
  else:
    if len(reduced_classes) and float(fraction) < 1.0:
      keep = reduce_classes(train_y, list(reduced_classes), fraction, seed=reduce_seed)
      train_x, train_y = train_x[keep], train_y[keep]
    parts = dirichlet_partition(
      train_y, num_clients, float(alpha), seed=partition_seed, min_examples=1
    )
  train_xs = [train_x[p] for p in parts]
  train_ys = [train_y[p] for p in parts]
  proportions = label_proportions(train_ys, DIGITS_NUM_CLASSES)

  # 4. Per-client test sets drawn from the pooled balanced test part.
  rng = np.random.default_rng(test_seed)
  test_counts = np.bincount(test_y, minlength=DIGITS_NUM_CLASSES)
  test_xs, test_ys = [], []
  for p in proportions:
    weight = p[test_y] / test_counts[test_y]
    candidates = np.flatnonzero(weight > 0)
    k = min(TEST_ROWS_PER_CLIENT, candidates.size)
    chosen = np.sort(
      rng.choice(candidates, k, replace=False, p=weight[candidates] / weight[candidates].sum())
    )
    test_xs.append(test_x[chosen])
    test_ys.append(test_y[chosen])

  dataset = FederatedDataset(
    train=from_client_arrays(train_xs, train_ys, dtype=np.float32),
    test=from_client_arrays(test_xs, test_ys, dtype=np.float32),
    task="classification",
    num_classes=DIGITS_NUM_CLASSES,
    name="digits-dirichlet",
    description=(
      f"UCI handwritten digits 8x8, classes {tuple(reduced_classes)} cut to {fraction:g}, "
      f"Dirichlet({alpha:g}) over {num_clients} clients (FGDRO App. G setting)"
    ),
  )
  return dataset, DigitsExtras(proportions=proportions, test_x=test_x, test_y=test_y)


def digits_dirichlet(seed: int = 0, **options) -> FederatedDataset:
  """Imbalanced, Dirichlet label-skewed digits over ``num_clients`` clients (the FGDRO Appendix G
  CIFAR-10 setting on the shipped UCI digits). ``options`` are those of
  :func:`digits_dirichlet_with_extras` (``num_clients=100``, ``alpha=0.3``,
  ``reduced_classes=(5, 6, 7, 8, 9)``, ``fraction=0.2``, ``test_fraction=0.3``, ...), which
  gives the steps; this returns only the :class:`~fedjax_dro.data.federated.FederatedDataset`."""
  dataset, _ = digits_dirichlet_with_extras(seed, **options)
  return dataset
