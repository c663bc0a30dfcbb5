"""Karula-like projection instances with known hard structure, for tests and benchmarks.

``sq_distances`` and ``max_relative_violation`` are the float64 NumPy measures the benchmarks
report. Both generators return NumPy float64 arrays ``(z, r)`` (``z: [n, d]``, ``r: [n, n]`` symmetric,
zero diagonal), so that callers cast them to the dtype they test.

* :func:`separated_groups`: three well separated groups of client models (group means of
  ``separation`` standard deviations of the within-group noise per coordinate) and radii
  ``r = t D`` from a latent geometry that follows the groups (``D`` = l1 distance of noisy
  latent group positions, as OT dissimilarities between clients of different groups are large
  and those within a group small). ``t`` makes the radii a fraction ``t_frac`` of the median
  squared distance: most constraints are violated by ``z``, and at the optimum a few percent of
  the ``n (n - 1) / 2`` constraints are active, with the worst-violated edges of the dual
  iterates changing for hundreds of iterations. With ``n = 1000, d = 10^4`` this is the
  instance on which the dual method used to stop early ("stagnated" at a certified gap of
  2.6e-3 in float64 and 1.4e-3 in float32) before its progress rule counted the dual value.
* :func:`all_active`: the same groups with ``r_ij = scale ||z_i - z_j||^2``, ``0 < scale <= 1``:
  every constraint is active at the optimum and the projection has the closed form
  ``mean(z) + sqrt(scale) (z - mean(z))`` (the multipliers are uniform: ``L_mu = mu (n I - 1
  1^T)`` maps the centred ``Z`` to ``n mu Z_c``, so stationarity holds with
  ``n mu = (1 - sqrt(scale)) / sqrt(scale)``); a closed-form oracle at any size.
"""

from __future__ import annotations

import numpy as np


def sq_distances(x):
  """``[n, n]`` squared distances between the rows of a NumPy array (centred Gram, float64)."""
  x = np.asarray(x, np.float64)
  xc = x - x.mean(0)
  sq = np.einsum("ij,ij->i", xc, xc)
  d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (xc @ xc.T), 0.0)
  np.fill_diagonal(d2, 0.0)
  return d2


def max_relative_violation(theta, r):
  """``max((||theta_i - theta_j||^2 - r_ij) / r_ij, 0)`` over pairs with ``0 < r_ij < inf``."""
  r = np.asarray(r, np.float64)
  d2 = sq_distances(theta)
  pos = np.isfinite(r) & (r > 0)
  np.fill_diagonal(pos, False)
  if not pos.any():
    return 0.0
  return float(max(np.max((d2[pos] - r[pos]) / r[pos]), 0.0))


def _groups(rng, n, d, separation):
  groups = rng.integers(0, 3, n)
  z = separation * rng.normal(size=(3, d))[groups] + rng.normal(size=(n, d))
  return groups, z


def separated_groups(n: int, d: int, *, seed: int = 0, separation: float = 10.0, t_frac=0.01):
  """Three well separated groups, radii from a latent geometry that follows them."""
  if n < 2 or d < 1:
    raise ValueError(f"n must be >= 2 and d >= 1, got n={n}, d={d}")
  rng = np.random.default_rng(seed)
  groups, z = _groups(rng, n, d, separation)
  latent = rng.normal(size=(3, 4))[groups] + 0.2 * rng.normal(size=(n, 4))
  dis = np.abs(latent[:, None] - latent[None]).sum(-1)
  iu = np.triu_indices(n, 1)
  r = t_frac * np.median(sq_distances(z)[iu]) / np.median(dis[iu]) * dis
  r = np.minimum(r, r.T)
  np.fill_diagonal(r, 0.0)
  return z, r


def all_active(n: int, d: int, *, seed: int = 0, separation: float = 10.0, scale: float = 0.1):
  """Three separated groups with ``r = scale * d2(z)``; returns ``(z, r, solution)``."""
  if not 0.0 < scale <= 1.0:
    raise ValueError(f"scale must be in (0, 1], got {scale}")
  rng = np.random.default_rng(seed)
  _, z = _groups(rng, n, d, separation)
  r = scale * sq_distances(z)
  mean = z.mean(0, keepdims=True)
  return z, r, mean + np.sqrt(scale) * (z - mean)
