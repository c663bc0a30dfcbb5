"""Feasibility restoration: shrink toward the centroid (see :mod:`fedjax_dro.solvers.pairwise`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dro.solvers.pairwise.problem import (
  Prepared,
  as_2d_float,
  average_components,
  finfo_eps,
  pairwise_sq_distances,
  sanitize_r,
  segment_sum_rows,
  validate_common,
  zero_components,
)


def shrink_factor(d2, r):
  """``min(1, min_{r_ij>0} sqrt(r_ij / d2_ij))`` minus 4 ulp when < 1."""
  pos = jnp.isfinite(r) & (r > 0)
  ratio2 = jnp.where(pos & (d2 > r), jnp.where(pos, r, 1.0) / jnp.where(d2 > 0, d2, 1.0), 1.0)
  a = jnp.sqrt(jnp.min(ratio2, initial=1.0))
  return jnp.where(a < 1, a * (1 - 4 * finfo_eps(d2.dtype)), jnp.ones_like(a))


def shrink_to_center(theta, a):
  c = jnp.mean(theta, axis=0, keepdims=True)
  return jnp.where(a < 1, c + a * (theta - c), theta)


def input_feasible(prep: Prepared, d2):
  """Exactly feasible input: members of zero components identical, other radii respected."""
  same = jnp.all(prep.z == prep.z[prep.labels])
  pos = jnp.isfinite(prep.r) & (prep.r > 0)
  ok = jnp.all(jnp.where(pos, d2 <= prep.r, True))
  return same & ok


def shrink_to_feasible(theta, r):
  """Feasibility restoration of an ``[n, d]`` array: ``(theta_feasible, a)``.

  Averages the rows of every zero-radius component, then shrinks all rows toward their
  centroid by ``a = min(1, min_{r_ij > 0} sqrt(r_ij) / ||theta_i - theta_j||)``.
  """
  theta = as_2d_float(theta, "theta")
  r = jnp.asarray(r, theta.dtype)
  validate_common(theta.shape[0], r, 1.0, 1, None)
  return _shrink_to_feasible_jit(theta, r)


@jax.jit
def _shrink_to_feasible_jit(theta, r):
  r = sanitize_r(r)
  labels = zero_components(r)
  counts = segment_sum_rows(jnp.ones((theta.shape[0],), theta.dtype), labels, theta.shape[0])
  avg = average_components(theta, labels, counts)
  a = shrink_factor(pairwise_sq_distances(avg), r)
  return shrink_to_center(avg, a), a
