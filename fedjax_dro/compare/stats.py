"""Statistics of a comparison over seeds: mean +- 2 standard errors and paired differences
with the paired t-test (two-sided p-value, 95% t-interval), the sign test of the wins and Holm's
adjustment of a table's p-values.

The Student t distribution is computed here (the package does not depend on SciPy): its CDF
through the regularized incomplete beta function (a continued fraction, Lentz's method), its
quantile by bisection on the CDF; the tests check both against ``scipy.stats``.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

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
  paired t statistic (``mean / se``; NaN when the differences have no spread), its two-sided
  p-value (``p_value``, Student t with ``seeds - 1`` degrees of freedom: ``scipy.stats.ttest_rel``),
  the 95% t-interval of the mean difference (``ci95_low``, ``ci95_high``), the seeds where
  ``mine`` is better (``wins``), worse (``losses``) or equal (``ties``), and the one-sided sign
  test of the wins (``sign_p``: :func:`sign_test`).

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
  df = diff.size - 1
  p = t_sf2(t, df) if math.isfinite(t) else float("nan")
  half = t_quantile(0.975, df) * se if df >= 1 and math.isfinite(se) else float("nan")
  better = diff > 0 if higher_is_better else diff < 0
  worse = diff < 0 if higher_is_better else diff > 0
  wins, losses = int(better.sum()), int(worse.sum())
  return {
    "difference": m,
    "difference_2se": two_se,
    "t": float(t),
    "p_value": float(p),
    "ci95_low": float(m - half),
    "ci95_high": float(m + half),
    "wins": wins,
    "losses": losses,
    "ties": int((diff == 0).sum()),
    "seeds": int(diff.size),
    "sign_p": sign_test(wins, losses),
  }


def _beta_cf(a: float, b: float, x: float) -> float:
  """The continued fraction of the incomplete beta function (modified Lentz's method)."""
  tiny, eps = 1e-300, 1e-16
  qab, qap, qam = a + b, a + 1.0, a - 1.0
  c, d = 1.0, 1.0 - qab * x / qap
  d = 1.0 / (d if abs(d) > tiny else tiny)
  h = d
  for m in range(1, 100000):
    m2 = 2 * m
    aa = m * (b - m) * x / ((qam + m2) * (a + m2))
    d = 1.0 + aa * d
    d = 1.0 / (d if abs(d) > tiny else tiny)
    c = 1.0 + aa / c
    c = c if abs(c) > tiny else tiny
    h *= d * c
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
    d = 1.0 + aa * d
    d = 1.0 / (d if abs(d) > tiny else tiny)
    c = 1.0 + aa / c
    c = c if abs(c) > tiny else tiny
    delta = d * c
    h *= delta
    if abs(delta - 1.0) < eps:
      break
  return h


def betainc(a: float, b: float, x: float, y: Optional[float] = None) -> float:
  """The regularized incomplete beta function ``I_x(a, b)`` (``y = 1 - x``, given separately to
  keep its precision when ``x`` is close to one).

  Args:
    a, b: positive shape parameters.
    x: in ``[0, 1]``.
    y: ``1 - x`` (default: computed).
  """
  y = 1.0 - x if y is None else y
  if x <= 0.0:
    return 0.0
  if y <= 0.0:
    return 1.0
  log_front = (
    math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
  )
  if x < (a + 1.0) / (a + b + 2.0):
    return math.exp(log_front) * _beta_cf(a, b, x) / a
  return 1.0 - math.exp(log_front) * _beta_cf(b, a, y) / b


def t_sf2(t: float, df: float) -> float:
  """The two-sided tail ``P(|T| >= |t|)`` of Student's t with ``df`` degrees of freedom (the
  paired t-test's p-value; NaN for ``df < 1`` or a NaN ``t``).

  Args:
    t: the statistic.
    df: degrees of freedom.
  """
  if not df >= 1 or math.isnan(t):
    return float("nan")
  if math.isinf(t):
    return 0.0
  t2 = t * t
  return min(1.0, betainc(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2)))


def t_cdf(t: float, df: float) -> float:
  """``P(T <= t)`` for Student's t with ``df`` degrees of freedom.

  Args:
    t: the point.
    df: degrees of freedom.
  """
  tail = t_sf2(t, df) / 2.0
  return tail if t < 0 else 1.0 - tail


def t_quantile(q: float, df: float) -> float:
  """The ``q`` quantile of Student's t with ``df`` degrees of freedom (``scipy.stats.t.ppf``),
  by bisection on the two-sided tail to the last bit.

  Args:
    q: in ``(0, 1)``.
    df: degrees of freedom, at least one.
  """
  if not 0.0 < q < 1.0 or not df >= 1:
    return float("nan")
  if q == 0.5:
    return 0.0
  target = 2.0 * min(q, 1.0 - q)  # the two-sided tail beyond the quantile
  lo, hi = 0.0, 1.0
  while t_sf2(hi, df) > target:
    lo, hi = hi, 2.0 * hi
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    if t_sf2(mid, df) > target:
      lo = mid
    else:
      hi = mid
  x = 0.5 * (lo + hi)
  return x if q > 0.5 else -x


def sign_test(wins: int, losses: int) -> float:
  """The one-sided sign test of ``wins`` among the ``wins + losses`` seeds that are not tied:
  ``P(X >= wins)`` for ``X ~ Binomial(wins + losses, 1/2)`` (``scipy.stats.binomtest(wins,
  wins + losses, alternative="greater")``; 1 when every seed is tied). A strategy better "on
  every seed" of ``k`` has ``2 ** -k``: 0.125 on three seeds.

  Args:
    wins: seeds where the strategy is better.
    losses: seeds where it is worse.
  """
  n = int(wins) + int(losses)
  if n == 0:
    return 1.0
  return float(sum(math.comb(n, k) for k in range(int(wins), n + 1)) / 2.0**n)


def holm(pvalues: Sequence[float]) -> List[float]:
  """Holm's step-down adjustment of a family of p-values, in the input's order: sorted
  ascending, the ``i``-th smallest (from 0) of ``m`` becomes ``max over j <= i of
  min(1, (m - j) p_(j))``. NaN p-values stay NaN and are not counted in ``m``.

  Args:
    pvalues: the family's p-values.
  """
  p = [float(v) for v in pvalues]
  order = sorted((i for i, v in enumerate(p) if not math.isnan(v)), key=lambda i: p[i])
  m = len(order)
  out = [float("nan")] * len(p)
  running = 0.0
  for j, i in enumerate(order):
    running = max(running, min(1.0, (m - j) * p[i]))
    out[i] = running
  return out


def verdict(d: Dict[str, float], *, higher_is_better: bool, alpha: float = 0.05) -> str:
  """A paired difference in words: ``"ahead (p = ...)"`` or ``"behind (p = ...)"`` when its
  p-value (Holm-adjusted when the record has ``holm_p``) is below ``alpha``, the direction that
  of the mean difference; else ``"within noise (p = ...)"``; ``"within noise"`` alone for a
  record without a finite p-value (an old record, or differences without spread).

  Args:
    d: a :func:`paired_difference` record.
    higher_is_better: the metric's direction.
    alpha: the level.
  """
  p = d.get("holm_p", d.get("p_value"))
  if p is None or not math.isfinite(p):
    return "within noise"
  shown = f"p = {p:.2g}" + (", Holm-adjusted" if "holm_p" in d else "")
  if p >= alpha:
    return f"within noise ({shown})"
  better = d["difference"] > 0 if higher_is_better else d["difference"] < 0
  return ("ahead" if better else "behind") + f" ({shown})"
