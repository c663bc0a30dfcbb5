"""Partitioners that split pooled labelled arrays into clients."""

from __future__ import annotations

from typing import List

import numpy as np

from fedjax_dro.common.checks import integer, number


def dirichlet_partition(
  labels,
  num_clients: int,
  alpha: float,
  *,
  seed: int = 0,
  min_examples: int = 1,
  max_tries: int = 100,
) -> List[np.ndarray]:
  """Label-skew partition (Hsu et al. 2019): for every class, its rows are split among clients in
  proportions drawn from ``Dirichlet(alpha * 1_n)``. Small ``alpha`` gives few classes per client.

  Redraws (up to ``max_tries``) until every client has at least ``min_examples`` rows.
  Returns one index array per client.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise TypeError(
      f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}"
    )
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f"num_clients must be a positive integer, got {num_clients!r}")
  if not alpha > 0:
    raise ValueError(f"alpha must be > 0, got {alpha!r}")
  if num_clients * min_examples > labels.size:
    raise ValueError(
      f"cannot give {num_clients} clients {min_examples} rows each from {labels.size} rows"
    )
  rng = np.random.default_rng(seed)
  for _ in range(max_tries):
    parts = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
      rows = rng.permutation(np.flatnonzero(labels == c))
      p = rng.dirichlet(alpha * np.ones(num_clients))
      cuts = (np.cumsum(p) * rows.size).astype(int)[:-1]
      for i, chunk in enumerate(np.split(rows, cuts)):
        parts[i].extend(chunk.tolist())
    if min(len(p) for p in parts) >= min_examples:
      return [np.sort(np.array(p, int)) for p in parts]
  raise ValueError(
    f"could not draw a Dirichlet({alpha}) partition with >= {min_examples} rows per "
    f"client in {max_tries} tries; raise alpha or lower num_clients"
  )


# ------------------------------------------------------------------------------------------------
# The class imbalance and Dirichlet split of the code released with Shen, Cervino, Hassani,
# Ribeiro, "An agnostic approach to federated learning with class imbalance", ICLR 2021
# (github.com/shenzebang/Federated-Learning-Pytorch, utils/data_utils.py: create_imbalance and
# split_dataset's heterogeneity="dir" branch), which FGDRO (Guo and Yang 2024, Appendix G) uses
# for its imbalanced CIFAR-10 with ``--n_minority 5`` (classes 0, 2, 4, 6, 8) and
# ``--reduce_to_ratio 0.2``. The released code draws from unseeded global generators; here each
# step takes a seed (a ``np.random.RandomState``, the same calls in the same order).
# ------------------------------------------------------------------------------------------------

CLIMB_MINORITY_CLASSES = {1: (0,), 3: (0, 2, 4), 5: (0, 2, 4, 6, 8)}  # its --n_minority


def climb_imbalance(labels, reduce_classes, keep_fraction: float, *, seed: int) -> np.ndarray:
  """Row indices of the released code's ``create_imbalance``, in its order.

  The rows of all ``reduce_classes`` are pooled in dataset order and the first
  ``max(1, int(pooled * keep_fraction))`` of the pool are kept (so the cut is per pool, not per
  class: a class keeps about ``keep_fraction`` of its rows when the classes are interleaved); the
  kept rows come first, then every row of the other classes, and the whole is permuted
  (``RandomState(seed).permutation``). Returns ``int64`` indices into ``labels``.
  """
  labels = _labels(labels)
  classes = np.asarray(list(reduce_classes))
  if classes.size == 0:
    raise ValueError("reduce_classes must name at least one class")
  keep_fraction = number(keep_fraction, "keep_fraction", minimum=0.0, strict=True, maximum=1.0)
  reduce = np.isin(labels, classes)
  pooled = np.flatnonzero(reduce)
  if pooled.size == 0:
    raise ValueError(f"no row has a label in reduce_classes {classes.tolist()}")
  kept = pooled[: max(1, int(pooled.size * keep_fraction))]
  order = np.concatenate([kept, np.flatnonzero(~reduce)])
  return order[np.random.RandomState(_seed(seed)).permutation(order.size)].astype(np.int64)


def climb_dirichlet_partition(
  labels, num_clients: int, alpha: float, *, num_classes: int, seed: int
) -> List[np.ndarray]:
  """Client row indices of the released code's Dirichlet split (``heterogeneity="dir"``).

  Each client ``k`` gets class proportions ``p_k ~ Dirichlet(alpha 1_C)`` (one draw of shape
  ``[num_clients, C]``); then clients are filled one after another with exactly
  ``N // num_clients`` rows each (the last ``N mod num_clients`` rows are never assigned): a row's
  class is drawn by inverse CDF from ``p_k`` with one ``uniform()`` and the class's lowest
  remaining row index is taken. When the drawn class has no rows left, every client's
  proportions are renormalised without it and the class is redrawn from the flattened
  ``[num_clients, C]`` cumulative sums, that is from client 0's renormalised row (the released
  code's ``argmax`` over a 2-D array), until a class with rows left comes up; a client's first
  draw always uses its original ``p_k``. So every client holds ``N // num_clients`` rows, the
  classes run out in the order the clients use them, and late clients hold the classes left
  (even at a large ``alpha``).

  Raises ``ValueError`` where the released code would divide by zero (a client's proportions all
  on one class that runs out: an ``alpha`` too small for the split) instead of looping forever.
  """
  labels = _labels(labels)
  num_clients = integer(num_clients, "num_clients", maximum=labels.size)
  alpha = number(alpha, "alpha", minimum=0.0, strict=True)
  if not (isinstance(num_classes, (int, np.integer)) and num_classes > int(labels.max())):
    raise ValueError(f"num_classes must exceed the largest label {labels.max()}, got {num_classes}")
  rs = np.random.RandomState(_seed(seed))
  priors = rs.dirichlet([float(alpha)] * num_classes, size=num_clients)
  first_cumsum = np.cumsum(priors, axis=1)
  rows = [np.flatnonzero(labels == c) for c in range(num_classes)]  # each class's rows, in order
  taken = [0] * num_classes  # rows of each class already assigned
  out: List[List[int]] = [[] for _ in range(num_clients)]
  for k in range(num_clients):
    for _ in range(labels.size // num_clients):
      c = int(np.argmax(rs.uniform() <= first_cumsum[k]))
      while taken[c] >= rows[c].size:
        with np.errstate(divide="ignore", invalid="ignore"):
          priors = priors / (1.0 - priors[:, c])[:, None]
        if not np.all(np.isfinite(priors)):
          raise ValueError(
            f"alpha={alpha!r} is too small for this split: a client's proportions sit on one "
            "class that ran out (the released code divides by zero here)"
          )
        priors[:, c] = 0.0
        c = int(np.argmax(rs.uniform() <= np.cumsum(priors, axis=1)))
        if c >= num_classes:
          raise ValueError("the redraw fell past client 0's proportions (float rounding)")
      out[k].append(int(rows[c][taken[c]]))
      taken[c] += 1
  return [np.asarray(rows, np.int64) for rows in out]


def rows_with_label_mix(labels, proportions, size: int, *, seed: int = 0) -> np.ndarray:
  """Indices of ``size`` rows of a pool with the class mix ``proportions``: an evaluation set of a
  client, drawn from pooled held-out rows with the client's own label distribution.

  Class ``c`` gets ``k_c`` rows, ``k = size * p`` rounded by largest remainders (so the counts
  sum to ``size``). Its rows are the pool's class-``c`` rows in a random order, repeated as a
  whole when ``k_c`` exceeds them: every pool row of the class is used ``floor(k_c / m_c)`` or
  one more times (``m_c`` rows in the pool), so the set's accuracy is the client's expected
  accuracy ``sum_c p_c acc_c`` up to the rounding and the within-class draw, without the
  sampling noise of a small set.

  Args:
    labels: ``[m]`` non-negative integer labels of the pool.
    proportions: ``[K]`` non-negative class weights with a positive sum (normalized here);
      ``K`` covers every label with positive weight.
    size: rows to return (>= 1).
    seed: seed of the within-class orders.

  Returns:
    ``[size]`` int64 row indices into the pool, grouped by class.
  """
  labels = _labels(labels)
  p = np.asarray(proportions, np.float64)
  if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
    raise ValueError(
      f"proportions must be a 1-D array of non-negative class weights with a positive sum, "
      f"got {proportions!r}"
    )
  size = integer(size, "size")
  rng = np.random.default_rng(_seed(seed))
  target = size * p / p.sum()
  counts = np.floor(target).astype(np.int64)
  order = np.argsort(-(target - counts), kind="stable")
  counts[order[: size - int(counts.sum())]] += 1
  out = []
  for c in np.flatnonzero(counts):
    pool = np.flatnonzero(labels == c)
    if pool.size == 0:
      raise ValueError(f"class {int(c)} has weight {p[c]:.3g} in proportions but no rows in labels")
    reps = -(-int(counts[c]) // pool.size)
    out.append(np.tile(rng.permutation(pool), reps)[: counts[c]])
  return np.concatenate(out).astype(np.int64)


def _labels(labels) -> np.ndarray:
  arr = np.asarray(labels)
  if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0:
    raise ValueError(f"labels must be a non-empty 1-D array of non-negative integers, got {arr!r}")
  return arr


def _seed(seed) -> int:
  return integer(seed, "seed", minimum=0, maximum=2**32 - 1)
