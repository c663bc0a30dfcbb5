"""Handwritten digits by writer: an offline stand-in and a LEAF FEMNIST reader (one client per
writer), for the neural-network experiment of Karula (Erickson and Johansson, "Personalized
Federated Learning under Model Dissimilarity Constraints", arXiv:2505.07575, Sec. 5.3).

The paper trains on LEAF's federated handwritten digits, one writer per client, where "some write
small and others write large, some write 1 with serifs and others write without". LEAF's FEMNIST
cannot ship with the package and nothing downloads at run time, so:

* :func:`digits_by_writer` makes a *stand-in* offline from the shipped UCI 8x8 digits
  (:func:`~fedjax_dro.data.load_digits`): every writer redraws digits in its own style (size,
  slant, stroke width, offset and class-specific quirks), the styles drawn around a few style
  groups. It is not FEMNIST: the digit shapes come from 1797 images of 43 people, and the
  writers' differences are the synthetic ones listed in its docstring.
* :func:`load_femnist_digits` reads LEAF FEMNIST JSON files (``data/train`` and ``data/test`` of
  LEAF's ``femnist`` task, or one folder of them) and keeps the digit classes.
"""

from __future__ import annotations

import glob
import numbers
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from fedjax_dro.data.digits import DIGITS_NUM_CLASSES, load_digits
from fedjax_dro.data.federated import FederatedDataset, from_client_arrays
from fedjax_dro.data.user_arrays import load_leaf_json

# The style groups of the stand-in: the prototype style of each group's writers. ``scale``
# multiplies the digit's size, ``slant`` shears it (columns shift by slant * rows above the
# centre: > 0 leans right), ``stroke`` is -1 (thin), 0 or +1 (thick), ``offset`` moves it by
# (rows, columns) in units of 1/16 of the image side, and the quirks redraw two digits: a "1"
# with a flag and a base serif (the continental 1, close to a 7) and a "7" crossed in the middle.
STYLE_GROUPS: Tuple[Dict[str, object], ...] = (
  dict(scale=0.72, slant=0.0, stroke=-1, offset=(-1.5, -1.5), serif_one=False, crossed_seven=False),
  dict(scale=1.12, slant=0.35, stroke=1, offset=(0.5, 0.5), serif_one=True, crossed_seven=True),
  dict(scale=0.92, slant=-0.3, stroke=0, offset=(1.0, 1.5), serif_one=True, crossed_seven=False),
  dict(scale=1.05, slant=0.1, stroke=1, offset=(-0.5, 0.0), serif_one=False, crossed_seven=True),
)
# A writer's own deviation from its group's prototype (standard deviations): log-scale, slant,
# offset (in 1/16 of the side); and the chance that a writer does not share its group's quirk.
WRITER_JITTER = dict(log_scale=0.06, slant=0.06, offset=0.5, quirk_flip=0.1)
PIXEL_NOISE = 0.03  # standard deviation of the pixel noise added after drawing (then clipped)
LEAF_DIGIT_CLASSES = 10  # LEAF FEMNIST labels: 0-9 digits, 10-35 'A'-'Z', 36-61 'a'-'z'


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def resize_images(images, size: int) -> np.ndarray:
  """Bilinear resize of ``[N, H, W]`` images to ``[N, size, size]`` (numpy only, float32).

  Pixel centres are mapped onto each other (``align_corners=False``), edges are clamped; the
  values stay in the input's range.
  """
  x = np.asarray(images, np.float32)
  if x.ndim != 3:
    raise ValueError(f"images must be [N, H, W], got shape {x.shape}")
  if not _is_int(size) or size < 1:
    raise ValueError(f"size must be a positive integer, got {size!r}")
  out = x
  for axis in (1, 2):
    n_in = out.shape[axis]
    pos = np.clip((np.arange(size) + 0.5) * n_in / size - 0.5, 0.0, n_in - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    w = (pos - lo).astype(np.float32)
    shape = [1, 1, 1]
    shape[axis] = size
    w = w.reshape(shape)
    out = np.take(out, lo, axis=axis) * (1 - w) + np.take(out, hi, axis=axis) * w
  return out.astype(np.float32)


def _warp(img: np.ndarray, scale: float, slant: float, offset) -> np.ndarray:
  """``img`` scaled about its centre, sheared (slant) and moved by ``offset`` (bilinear, zeros
  outside)."""
  s = img.shape[0]
  c = (s - 1) / 2.0
  r, q = np.meshgrid(np.arange(s, dtype=np.float64), np.arange(s, dtype=np.float64), indexing="ij")
  # output point (r, q) = centre + offset + scale * (src_r - c, src_q - c + slant * (c - src_r))
  rr = (r - c - offset[0]) / scale
  qq = (q - c - offset[1]) / scale
  src_r = rr + c
  src_q = qq + slant * rr + c
  r0, q0 = np.floor(src_r).astype(int), np.floor(src_q).astype(int)
  fr, fq = src_r - r0, src_q - q0
  out = np.zeros_like(img)
  for dr, wr in ((0, 1 - fr), (1, fr)):
    for dq, wq in ((0, 1 - fq), (1, fq)):
      rs, qs = r0 + dr, q0 + dq
      ok = (rs >= 0) & (rs < s) & (qs >= 0) & (qs < s)
      out += np.where(ok, img[np.clip(rs, 0, s - 1), np.clip(qs, 0, s - 1)], 0.0) * wr * wq
  return out


def _stroke(img: np.ndarray, stroke: int) -> np.ndarray:
  if stroke > 0:  # dilation: each pixel takes 0.8 of its brightest 4-neighbour
    p = np.pad(img, 1)
    nb = np.maximum.reduce([p[:-2, 1:-1], p[2:, 1:-1], p[1:-1, :-2], p[1:-1, 2:]])
    return np.maximum(img, 0.8 * nb)
  if stroke < 0:  # thinning: only the core of the stroke is kept
    return np.clip((img - 0.4) / 0.6, 0.0, 1.0)
  return img


def _ink_box(img: np.ndarray):
  rows, cols = np.nonzero(img > 0.3)
  if rows.size == 0:
    s = img.shape[0]
    return s // 4, 3 * s // 4, s // 4, 3 * s // 4
  return rows.min(), rows.max(), cols.min(), cols.max()


def _serif_one(img: np.ndarray) -> np.ndarray:
  """A "1" with a long flag from the top of its stem down to the left and a base serif (the
  continental 1, close to a 7)."""
  out = img.copy()
  top, bottom, left, right = _ink_box(img)
  s = img.shape[0]
  mid = (left + right) // 2
  for k in range(max(3, s // 3)):  # the flag, two pixels wide
    r, q = min(top + k, s - 1), mid - 1 - k
    out[r, max(q - 1, 0) : max(q + 1, 0)] = 1.0
  half = max(2, s // 6)
  out[bottom, max(mid - half, 0) : min(mid + half + 1, s)] = 1.0  # the base
  return out


def _crossed_seven(img: np.ndarray) -> np.ndarray:
  """A "7" with a bar across the middle of its stem."""
  out = img.copy()
  top, bottom, left, right = _ink_box(img)
  s = img.shape[0]
  r = (top + bottom) // 2 + 1
  centre = (left + right) // 2
  half = max(2, s // 5)
  out[r, max(centre - half, 0) : min(centre + half + 1, s)] = 1.0
  return out


def _check_writers_args(num_writers, examples_per_writer, image_size, test_fraction, seed):
  if not _is_int(seed):
    raise TypeError(f"seed must be an integer, got {seed!r}")
  if not _is_int(num_writers) or num_writers < 1:
    raise ValueError(f"num_writers must be a positive integer, got {num_writers!r}")
  if not _is_int(examples_per_writer) or not 2 <= examples_per_writer <= 1797:
    raise ValueError(
      f"examples_per_writer must be an integer in [2, 1797] (a writer redraws distinct shipped "
      f"digits), got {examples_per_writer!r}"
    )
  if not _is_int(image_size) or not 8 <= image_size <= 64:
    raise ValueError(f"image_size must be an integer in [8, 64], got {image_size!r}")
  if not isinstance(test_fraction, numbers.Real) or isinstance(test_fraction, (bool, np.bool_)):
    raise TypeError(f"test_fraction must be a number in (0, 1), got {test_fraction!r}")
  k = int(round(float(test_fraction) * examples_per_writer))
  if not 0.0 < float(test_fraction) < 1.0 or not 1 <= k < examples_per_writer:
    raise ValueError(
      f"test_fraction must be in (0, 1) and leave every writer >= 1 train and >= 1 test row: "
      f"test_fraction={test_fraction!r} of examples_per_writer={examples_per_writer} puts {k} "
      f"rows in the test split"
    )
  return k


def digits_by_writer(
  num_writers: int = 100,
  *,
  examples_per_writer: int = 40,
  image_size: int = 16,
  test_fraction: float = 0.25,
  seed: int = 0,
  style_mixing: float = 0.0,
) -> FederatedDataset:
  """A by-writer handwritten-digit **stand-in** (not FEMNIST) made offline from the shipped digits.

  Stands in for LEAF's federated handwritten digits (one client per writer) in the Karula
  reproduction ``karula-femnist`` when no LEAF files are given. Steps, all deterministic from
  ``seed``:

  1. the 1797 shipped 8x8 digits (:func:`~fedjax_dro.data.load_digits`) are upsampled to
     ``image_size x image_size`` (bilinear, :func:`resize_images`);
  2. every writer belongs to one of the :data:`STYLE_GROUPS` (``num_writers`` split as evenly as
     possible over the 4 groups, in a random order) and draws its own style around the group's
     prototype (:data:`WRITER_JITTER`): size (scale ``0.72`` to ``1.12``), slant (shear ``-0.3``
     to ``0.35``), stroke width (thin: only the stroke's core; thick: dilated), offset, and the
     class-specific quirks "1 with a flag and a base serif" (the continental 1, which resembles
     a 7) and "crossed 7" (each writer differs from its group's quirk with probability 0.1);
  3. every writer redraws ``examples_per_writer`` distinct shipped digits (drawn uniformly, so
     about balanced classes): quirks first, then the scale / slant / offset warp, the stroke,
     and pixel noise (s.d. 0.03, clipped to ``[0, 1]``);
  4. each writer's rows are split at random, ``round(test_fraction * examples_per_writer)`` to
     its test set.

  With ``style_mixing = m > 0`` the styles also vary continuously across the groups: each writer
  draws a second group ``h`` at random and a share ``u ~ U(0, m)``, and its prototype size, slant
  and offset are ``(1 - u)`` its group's plus ``u`` those of ``h`` (stroke and quirks stay its
  group's), so writers form a continuum between the groups' styles, not only four clusters.

  The digit shapes are shared by all writers (the same 1797 images are redrawn), so the writers
  differ only by the styles above: a global model can learn every group's style, and the quirks
  make a "1" of some groups look like a "7" of others, a conflict that personalized models can
  resolve and a pooled one cannot.

  Args:
    num_writers: clients, one per writer (>= 1).
    examples_per_writer: rows per writer, in ``[2, 1797]`` (train plus test).
    image_size: side of the square images, in ``[8, 64]`` (16 keeps a small CNN fast on CPU).
    test_fraction: share of each writer's rows in its test set; must leave >= 1 row on each side.
    seed: seed of the styles, the drawn digits, the noise and the split.
    style_mixing: the largest share ``m`` in ``[0, 1]`` of a second group's size, slant and
      offset in a writer's prototype (default 0: the four groups only).

  Returns:
    A classification :class:`~fedjax_dro.data.FederatedDataset` with 10 classes: ``x`` float32
    ``[num_writers, rows, image_size, image_size]`` in ``[0, 1]`` (ink 1, background 0), ``y``
    int32; ``client_names[i]`` is ``"writer{i:03d}/style{g}"`` with ``g`` the writer's style
    group.
  """
  k_test = _check_writers_args(num_writers, examples_per_writer, image_size, test_fraction, seed)
  if (
    isinstance(style_mixing, (bool, np.bool_))
    or not isinstance(style_mixing, numbers.Real)
    or not 0.0 <= float(style_mixing) <= 1.0
  ):
    raise ValueError(f"style_mixing must be a number in [0, 1], got {style_mixing!r}")
  x8, y = load_digits()
  base = resize_images(x8, int(image_size))
  rng = np.random.default_rng(np.random.SeedSequence([int(seed), 26]))
  groups = rng.permutation(np.arange(num_writers) % len(STYLE_GROUPS))
  unit = image_size / 16.0
  train_xs, train_ys, test_xs, test_ys, names = [], [], [], [], []
  # the continuous part (drawn from its own stream: style_mixing=0 leaves the data unchanged)
  mix_rng = np.random.default_rng(np.random.SeedSequence([int(seed), 27]))
  mixes = [(int(mix_rng.integers(len(STYLE_GROUPS))), float(mix_rng.uniform(0, 1))) for _ in groups]
  for i, g in enumerate(groups):
    proto = dict(STYLE_GROUPS[g])
    h, u = mixes[i][0], mixes[i][1] * float(style_mixing)
    if u > 0:
      other = STYLE_GROUPS[h]
      for name in ("scale", "slant"):
        proto[name] = (1 - u) * float(proto[name]) + u * float(other[name])
      proto["offset"] = tuple(
        (1 - u) * np.asarray(proto["offset"]) + u * np.asarray(other["offset"])
      )
    scale = float(proto["scale"]) * float(np.exp(rng.normal(0.0, WRITER_JITTER["log_scale"])))
    slant = float(proto["slant"]) + float(rng.normal(0.0, WRITER_JITTER["slant"]))
    offset = (np.asarray(proto["offset"]) + rng.normal(0.0, WRITER_JITTER["offset"], 2)) * unit
    flip = rng.random(2) < WRITER_JITTER["quirk_flip"]
    serif_one = bool(proto["serif_one"]) != bool(flip[0])
    crossed_seven = bool(proto["crossed_seven"]) != bool(flip[1])
    rows = rng.choice(y.size, examples_per_writer, replace=False)
    imgs = []
    for r in rows:
      img = base[r]
      if serif_one and y[r] == 1:
        img = _serif_one(img)
      if crossed_seven and y[r] == 7:
        img = _crossed_seven(img)
      img = _stroke(_warp(img, scale, slant, offset), int(proto["stroke"]))
      imgs.append(img)
    xi = np.clip(np.stack(imgs) + rng.normal(0.0, PIXEL_NOISE, (len(rows),) + base.shape[1:]), 0, 1)
    order = rng.permutation(examples_per_writer)
    test, train = order[:k_test], order[k_test:]
    train_xs.append(xi[train].astype(np.float32))
    train_ys.append(y[rows][train])
    test_xs.append(xi[test].astype(np.float32))
    test_ys.append(y[rows][test])
    names.append(f"writer{i:03d}/style{g}")
  return FederatedDataset(
    train=from_client_arrays(train_xs, train_ys, dtype=np.float32),
    test=from_client_arrays(test_xs, test_ys, dtype=np.float32),
    task="classification",
    num_classes=DIGITS_NUM_CLASSES,
    name="digits-by-writer",
    client_names=names,
    description=(
      f"stand-in: {num_writers} synthetic writers ({len(STYLE_GROUPS)} style groups) redrawing the "
      f"shipped UCI digits at {image_size}x{image_size}"
    ),
  )


def writer_style_groups(dataset: FederatedDataset) -> np.ndarray:
  """The style group of every writer of a :func:`digits_by_writer` data set (from its client
  names), ``int64 [num_writers]``."""
  names = dataset.client_names or ()
  groups = [n.rsplit("/style", 1) for n in names]
  if len(names) != dataset.num_clients or any(len(g) != 2 or not g[1].isdigit() for g in groups):
    raise ValueError("dataset has no 'writerNNN/styleG' client names (not from digits_by_writer)")
  return np.array([int(g[1]) for g in groups], np.int64)


def _leaf_files(folder: str) -> List[str]:
  files = sorted(glob.glob(os.path.join(glob.escape(folder), "*.json")))
  if not files:
    raise ValueError(f"LEAF directory {folder!r} has no *.json files")
  return files


def _digit_writers(folder: str, image_size: int, min_rows: int, what: str):
  """``{writer: (x, y)}`` of the digit rows of every writer in ``folder``'s LEAF files with
  >= ``min_rows`` of them, in file order; plus the number of writers seen and dropped."""
  out: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
  seen = 0
  for path in _leaf_files(folder):
    data, users = load_leaf_json(path)
    x, y = np.asarray(data.x), np.asarray(data.y)
    nex = np.asarray(data.num_examples)
    for i, user in enumerate(users):
      if user in out:
        raise ValueError(f"{what}: writer {user!r} appears in two LEAF files of {folder!r}")
      seen += 1
      xi, yi = x[i, : nex[i]], y[i, : nex[i]]
      keep = yi < LEAF_DIGIT_CLASSES
      if int(keep.sum()) < min_rows:
        continue
      xi = xi[keep].reshape(int(keep.sum()), -1)
      side = int(round(np.sqrt(xi.shape[1])))
      if side * side != xi.shape[1]:
        raise ValueError(
          f"LEAF file {path!r}, writer {user!r}: rows have {xi.shape[1]} values, not a square "
          f"image (FEMNIST rows are 28 x 28 = 784 pixels)"
        )
      out[user] = (xi.reshape(-1, side, side), yi[keep].astype(np.int32))
  return out, seen


def load_femnist_digits(
  leaf_dir,
  *,
  max_writers: Optional[int] = None,
  min_rows: int = 10,
  image_size: int = 16,
  test_fraction: float = 0.2,
  seed: int = 0,
) -> FederatedDataset:
  """LEAF FEMNIST writers as clients, reduced to the digit classes 0-9 (Karula, Sec. 5.3).

  The paper's task has "ten different classes corresponding to digits 0, ..., 9", one writer per
  client. LEAF's FEMNIST has 62 classes (labels 0-9 the digits, 10-35 upper-case and 36-61
  lower-case letters), so the 62-class split is reduced as follows: every row with a label >= 10
  is dropped, then every writer left with fewer than ``min_rows`` digit rows (in its training
  part) or without a test row is dropped; the labels 0-9 are kept as they are. The paper does
  not say how many writers it used; ``max_writers`` keeps the first writers in LEAF's file order
  (sorted file names, writers in file order).

  Layout: ``leaf_dir`` holds LEAF's ``train/`` and ``test/`` folders of ``*.json`` files (as
  written by LEAF's ``preprocess.sh``; a writer must be in both), or is itself one folder of
  ``*.json`` files (e.g. LEAF's ``all_data``), whose writers' rows are then split at random,
  ``test_fraction`` of each writer's digit rows to its test set. Images are resized from 28x28 to
  ``image_size`` (bilinear, :func:`resize_images`) and, when the background is light (mean pixel
  above 0.5, as in LEAF's files, which store ``pixel / 255`` of dark ink on white), inverted so
  that ink is 1 and background 0, like the stand-in :func:`digits_by_writer`.

  Args:
    leaf_dir: the folder described above.
    max_writers: keep at most this many writers (``None``: all that pass the filter).
    min_rows: the fewest digit rows a writer must keep (in its training part) to stay.
    image_size: side of the resized square images, in ``[8, 64]``.
    test_fraction: share of each writer's digit rows put in its test set (single-folder layout).
    seed: seed of that split (single-folder layout).

  Returns:
    A classification :class:`~fedjax_dro.data.FederatedDataset` with 10 classes; ``x`` float32
    ``[writers, rows, image_size, image_size]``; ``client_names`` are the LEAF writer ids.

  Raises:
    FileNotFoundError: ``leaf_dir`` does not exist.
    ValueError: no ``*.json`` files, no writer with enough digit rows, bad arguments.
  """
  try:
    leaf_dir = os.fspath(leaf_dir)
  except TypeError:
    raise TypeError(f"leaf_dir must be a path, got {type(leaf_dir).__name__}") from None
  if not os.path.isdir(leaf_dir):
    raise FileNotFoundError(f"leaf_dir {leaf_dir!r} is not an existing directory")
  if max_writers is not None and (not _is_int(max_writers) or max_writers < 1):
    raise ValueError(f"max_writers must be a positive integer or None, got {max_writers!r}")
  if not _is_int(min_rows) or min_rows < 1:
    raise ValueError(f"min_rows must be a positive integer, got {min_rows!r}")
  if not _is_int(image_size) or not 8 <= image_size <= 64:
    raise ValueError(f"image_size must be an integer in [8, 64], got {image_size!r}")
  if not isinstance(test_fraction, numbers.Real) or not 0.0 < float(test_fraction) < 1.0:
    raise ValueError(f"test_fraction must be a number in (0, 1), got {test_fraction!r}")
  if not _is_int(seed):
    raise TypeError(f"seed must be an integer, got {seed!r}")
  split = all(os.path.isdir(os.path.join(leaf_dir, p)) for p in ("train", "test"))
  if split:
    train, seen = _digit_writers(os.path.join(leaf_dir, "train"), image_size, min_rows, "train")
    test, _ = _digit_writers(os.path.join(leaf_dir, "test"), image_size, 1, "test")
    writers = [w for w in train if w in test]
    pairs = [(train[w], test[w]) for w in writers]
  else:
    rows, seen = _digit_writers(leaf_dir, image_size, 1, "LEAF")
    rng = np.random.default_rng(seed)
    writers, pairs = [], []
    for w, (x, y) in rows.items():
      k = int(round(float(test_fraction) * len(y)))
      if k < 1 or len(y) - k < min_rows:
        continue
      order = rng.permutation(len(y))
      writers.append(w)
      pairs.append(((x[order[k:]], y[order[k:]]), (x[order[:k]], y[order[:k]])))
  if max_writers is not None:
    writers, pairs = writers[:max_writers], pairs[:max_writers]
  if not writers:
    raise ValueError(
      f"leaf_dir {leaf_dir!r}: none of its {seen} writers has >= min_rows={min_rows} digit rows "
      f"(labels 0-9){' and a test row' if split else ''}; FEMNIST digit rows have labels < 10"
    )
  light = float(np.mean([p[0][0].mean() for p in pairs])) > 0.5

  def prep(x):
    x = resize_images(x, int(image_size))
    return (1.0 - x) if light else x

  return FederatedDataset(
    train=from_client_arrays(
      [prep(tr[0]) for tr, _ in pairs], [tr[1] for tr, _ in pairs], dtype=np.float32
    ),
    test=from_client_arrays(
      [prep(te[0]) for _, te in pairs], [te[1] for _, te in pairs], dtype=np.float32
    ),
    task="classification",
    num_classes=DIGITS_NUM_CLASSES,
    name="femnist-digits",
    client_names=list(writers),
    description=f"LEAF FEMNIST digits 0-9, {len(writers)} writers, {image_size}x{image_size}",
  )
