"""Parallel (product-space) Dykstra (see :mod:`fedjax_dro.solvers.pairwise`, method ``"dykstra"``)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.solvers.pairwise.admm import (
  edge_list,
  edge_loop,
  edge_output,
  incidence_t,
  solve_edges,
)
from fedjax_dro.solvers.pairwise.problem import (
  DEFAULT_MAX_ITERATIONS,
  Prepared,
  SolverOutput,
  effective_tol,
  finfo_tiny,
  segment_sum_rows,
)


# ----------------------------------------------------------------------------------------------
# Parallel Dykstra
# ----------------------------------------------------------------------------------------------
class DykstraState(NamedTuple):
  iteration: jax.Array
  theta: jax.Array  # [n, d] (centred); invariant: theta = z - D^T (kappa * q)
  q: jax.Array  # [m, d] per-edge corrections
  stationarity: jax.Array
  violation: jax.Array


def run_dykstra(prep: Prepared, tol, max_iterations: int) -> SolverOutput:
  z = prep.zavg
  n, d = z.shape
  dtype = z.dtype
  tol = effective_tol(tol, dtype)
  i, j = edge_list(n)
  r_e = prep.r[i, j]
  active = jnp.isfinite(r_e)
  pos = active & (r_e > 0)
  rad = jnp.sqrt(jnp.where(active, r_e, 0.0))
  deg = jax.ops.segment_sum(active.astype(dtype), i, num_segments=n) + jax.ops.segment_sum(
    active.astype(dtype), j, num_segments=n
  )
  omega = jnp.where(deg > 0, 1.0 / jnp.maximum(deg, 1.0), 0.0)
  kappa = jnp.where(
    active, omega[i] * omega[j] / jnp.maximum(omega[i] + omega[j], finfo_tiny(dtype)), 0.0
  )
  znorm = jnp.sqrt(jnp.sum(prep.zc**2)) + finfo_tiny(dtype)
  spread = 2.0 * jnp.sum(prep.zc**2) / n + finfo_tiny(dtype)
  state = DykstraState(
    jnp.array(0, jnp.int32),
    z,
    jnp.zeros((i.shape[0], d), dtype),
    jnp.asarray(jnp.inf, dtype),
    jnp.asarray(jnp.inf, dtype),
  )

  def residuals(theta, q, diff):
    # multiplier estimate mu_e = kappa_e ||q_e|| / sqrt(r_e) (at a fixed point
    # kappa_e q_e = mu_e (theta_i - theta_j)); stationarity P_S(Theta - Z + L_mu Theta).
    qn = jnp.sqrt(jnp.sum(q * q, axis=1))
    mu = jnp.where(pos, kappa * qn / jnp.where(pos, rad, 1.0), 0.0)
    res = theta - z + incidence_t(mu[:, None] * diff, i, j, n)
    res = segment_sum_rows(res, prep.labels, n)  # P_S (component sums)
    viol = jnp.max(jnp.where(active, jnp.sum(diff * diff, axis=1) - rad**2, 0.0), initial=0.0)
    return jnp.sqrt(jnp.sum(res * res)) / znorm, jnp.maximum(viol, 0.0) / spread, mu

  def body(s):
    diff = s.theta[i] - s.theta[j]
    delta = diff + s.q
    nrm = jnp.sqrt(jnp.sum(delta * delta, axis=1))
    shrink = jnp.where(active & (nrm > rad), 1.0 - rad / jnp.where(nrm > 0, nrm, 1.0), 0.0)
    q = shrink[:, None] * delta
    theta = s.theta - incidence_t(kappa[:, None] * (q - s.q), i, j, n)
    stat, viol, _ = residuals(theta, q, theta[i] - theta[j])
    return DykstraState(s.iteration + 1, theta, q, stat, viol)

  st, converged = edge_loop(
    body, state, tol, max_iterations, lambda s: (s.stationarity, s.violation)
  )
  _, _, mu_e = residuals(st.theta, st.q, st.theta[i] - st.theta[j])
  return edge_output(prep, st, mu_e, i, j, st.stationarity, converged)


def solve_dykstra(
  z, r, *, tol=1e-8, max_iterations: int = DEFAULT_MAX_ITERATIONS["dykstra"]
) -> SolverOutput:
  """Parallel (product-space) Dykstra solver on an ``[n, d]`` array (memory
  ``O(n^2 min(n, d))``)."""
  return solve_edges(run_dykstra, z, r, tol, max_iterations)
