"""Statistics of a comparison over seeds: mean +- 2 standard errors and paired differences."""

from __future__ import annotations

import math
from typing import Dict, Sequence

import numpy as np


def mean_2se(values: Sequence[float]):
  """``(mean, 2 * standard error)`` of ``values`` (standard error ``std(ddof=1) / sqrt(k)``; NaN
  for fewer than two values; ``(NaN, NaN)`` for none).

  Args:
    values: the per-seed numbers.
  """
  v = np.asarray(values, np.float64).reshape(-1)
  if v.size == 0:
    return float("nan"), float("nan")
  if v.size < 2:
    return float(v.mean()), float("nan")
  return float(v.mean()), float(2 * v.std(ddof=1) / math.sqrt(v.size))


def paired_difference(
  mine: Sequence[float], reference: Sequence[float], *, higher_is_better: bool
) -> Dict[str, float]:
  """``mine - reference`` paired over seeds: the mean difference, twice its standard error, the
  paired t statistic (``mean / se``; NaN when the differences have no spread) and the seeds
  where ``mine`` is better (``wins``), worse (``losses``) or equal (``ties``).

  Args:
    mine: per-seed values of a strategy.
    reference: the reference strategy's values on the same seeds.
    higher_is_better: the direction of a win.
  """
  a, b = np.asarray(mine, np.float64), np.asarray(reference, np.float64)
  if a.shape != b.shape or a.ndim != 1:
    raise ValueError(f"paired values need equal 1-D shapes, got {a.shape} and {b.shape}")
  diff = a - b
  m, two_se = mean_2se(diff)
  se = two_se / 2
  t = m / se if se > 0 else float("nan")
  better = diff > 0 if higher_is_better else diff < 0
  worse = diff < 0 if higher_is_better else diff > 0
  return {
    "difference": m,
    "difference_2se": two_se,
    "t": float(t),
    "wins": int(better.sum()),
    "losses": int(worse.sum()),
    "ties": int((diff == 0).sum()),
    "seeds": int(diff.size),
  }
