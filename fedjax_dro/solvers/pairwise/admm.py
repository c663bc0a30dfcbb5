"""ADMM on the edge split ``V = D Theta`` (see :mod:`fedjax_dro.solvers.pairwise`, method ``"admm"``),
and the edge-array machinery it shares with :mod:`~fedjax_dro.solvers.pairwise.dykstra`."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_dro.solvers.pairwise.problem import (
  DEFAULT_MAX_ITERATIONS,
  Prepared,
  SolverOutput,
  as_2d_float,
  effective_tol,
  finfo_tiny,
  prepare,
  solve_reduced,
  validate_common,
)

_BALANCE_EVERY = 10


# ----------------------------------------------------------------------------------------------
# Edge arrays (ADMM and Dykstra)
# ----------------------------------------------------------------------------------------------
def edge_list(n):
  i, j = np.triu_indices(n, 1)
  return jnp.asarray(i, jnp.int32), jnp.asarray(j, jnp.int32)


def incidence_t(w, i, j, n):
  """``D^T w``: row ``k`` gets ``sum_{e=(k,.)} w_e - sum_{e=(.,k)} w_e``."""
  return jax.ops.segment_sum(w, i, num_segments=n) - jax.ops.segment_sum(w, j, num_segments=n)


def edge_loop(body, state, tol, max_iterations: int, residuals):
  """``(final state, converged)`` of an edge-array solver's ``lax.while_loop``: ``body`` from
  ``state`` until both relative residuals ``residuals(state)`` are ``<= tol`` or
  ``state.iteration`` reaches ``max_iterations``."""

  def converged(s):
    first, second = residuals(s)
    return (first <= tol) & (second <= tol)

  def cond(s):
    return (s.iteration < max_iterations) & ~converged(s)

  final = lax.while_loop(cond, body, state)
  return final, converged(final)


def edge_output(prep: Prepared, final, mu_e, i, j, residual, converged) -> SolverOutput:
  """The :class:`SolverOutput` of an edge-array solver's ``final`` state: its ``theta`` shifted
  back, the edge multipliers ``mu_e`` of the edges ``(i, j)`` as a symmetric ``[n, n]`` matrix
  (0 elsewhere), its iterations, its stopping ``residual`` and ``converged``."""
  n = final.theta.shape[0]
  mu = jnp.zeros((n, n), final.theta.dtype).at[i, j].set(mu_e)
  return SolverOutput(final.theta + prep.shift, mu + mu.T, final.iteration, residual, converged)


@functools.partial(jax.jit, static_argnames=("run", "max_iterations"))
def _solve_edges_jit(run, z, r, tol, max_iterations):
  return solve_reduced(lambda p: run(p, tol, max_iterations), prepare(z, r))


def solve_edges(run, z, r, tol, max_iterations: int) -> SolverOutput:
  """The edge-array solver ``run(prep, tol, max_iterations)`` (ADMM / Dykstra) on an ``[n, d]``
  array: the arguments checked, then one jitted program (:func:`solve_reduced` of
  :func:`prepare`)."""
  z = as_2d_float(z)
  r = jnp.asarray(r, z.dtype)
  validate_common(z.shape[0], r, tol, max_iterations, None)
  return _solve_edges_jit(run, z, r, jnp.asarray(tol, z.dtype), int(max_iterations))


# ----------------------------------------------------------------------------------------------
# ADMM
# ----------------------------------------------------------------------------------------------
class AdmmState(NamedTuple):
  iteration: jax.Array
  theta: jax.Array  # [n, k] (centred)
  u: jax.Array  # [m, k] scaled duals (the only edge array kept between iterations)
  dtv: jax.Array  # [n, k] D^T v of the last edge variables v
  dtu: jax.Array  # [n, k] D^T u
  beta: jax.Array
  primal_rel: jax.Array
  dual_rel: jax.Array


def _ball(v, rad):
  nrm = jnp.sqrt(jnp.sum(v * v, axis=1))
  scale = jnp.where(nrm > rad, rad / jnp.where(nrm > 0, nrm, 1.0), 1.0)
  return v * scale[:, None]


def run_admm(prep: Prepared, tol, max_iterations: int, beta0=None) -> SolverOutput:
  """Scaled ADMM on ``V = D Theta`` with residual balancing of ``beta`` (Boyd et al. 3.4.1).

  Only the scaled duals ``u`` are carried between iterations: the edge variables are
  ``v = ball(D Theta + u_old)`` and ``D^T v`` / ``D^T u`` (``n x k``) are kept for the next
  Theta-step and the dual residual; for a ball ``u = p - ball(p)`` is parallel to ``v`` with
  ``<u_e, v_e> = sqrt(r_e) ||u_e||``, so the multiplier estimate
  ``mu_e = beta <u_e, v_e> / r_e = beta ||u_e|| / sqrt(r_e)`` needs no ``v`` either. This is the
  textbook iteration (same iterates), with one ``[m, k]`` array of state instead of two.
  """
  z = prep.zavg
  n, d = z.shape
  dtype = z.dtype
  tol = effective_tol(tol, dtype)
  i, j = edge_list(n)
  rad = jnp.sqrt(prep.r[i, j])  # +inf: unconstrained copy
  tiny = jnp.sqrt(jnp.sum(prep.zc**2)) * 1e-14 + finfo_tiny(dtype)
  beta_init = jnp.asarray(1.0 / n if beta0 is None else beta0, dtype)

  def theta_step(dtv, dtu, beta):
    rhs = z + beta * (dtv - dtu)
    return (rhs + beta * jnp.sum(rhs, axis=0, keepdims=True)) / (1.0 + beta * n)

  m = i.shape[0]
  v0 = _ball(z[i] - z[j], rad)
  state = AdmmState(
    jnp.array(0, jnp.int32),
    z,
    jnp.zeros((m, d), dtype),
    incidence_t(v0, i, j, n),
    jnp.zeros((n, d), dtype),
    beta_init,
    jnp.asarray(jnp.inf, dtype),
    jnp.asarray(jnp.inf, dtype),
  )

  def body(s):
    theta = theta_step(s.dtv, s.dtu, s.beta)
    dth = theta[i] - theta[j]
    p = dth + s.u
    v = _ball(p, rad)
    u = p - v  # = u_old + D Theta - v
    dtv = incidence_t(v, i, j, n)
    dtu = incidence_t(u, i, j, n)
    r_pri = jnp.sqrt(jnp.sum((u - s.u) ** 2))  # ||D Theta - v||
    r_dual = s.beta * jnp.sqrt(jnp.sum((dtv - s.dtv) ** 2))
    pri_rel = r_pri / (jnp.maximum(jnp.sqrt(jnp.sum(dth**2)), jnp.sqrt(jnp.sum(v**2))) + tiny)
    dual_rel = r_dual / (s.beta * jnp.sqrt(jnp.sum(dtu**2)) + tiny)
    it = s.iteration + 1
    balance = (it % _BALANCE_EVERY) == 0
    up = balance & (pri_rel > 10 * dual_rel)
    down = balance & (dual_rel > 10 * pri_rel)
    factor = jnp.where(up, 2.0, jnp.where(down, 0.5, 1.0)).astype(dtype)
    return AdmmState(it, theta, u / factor, dtv, dtu / factor, s.beta * factor, pri_rel, dual_rel)

  st, converged = edge_loop(body, state, tol, max_iterations, lambda s: (s.primal_rel, s.dual_rel))
  r_e = prep.r[i, j]
  pos = jnp.isfinite(r_e) & (r_e > 0)
  u_norm = jnp.sqrt(jnp.sum(st.u * st.u, axis=1))
  mu_e = jnp.where(pos, st.beta * u_norm / jnp.sqrt(jnp.where(pos, r_e, 1.0)), 0.0)
  return edge_output(prep, st, mu_e, i, j, st.dual_rel, converged)


def solve_admm(
  z, r, *, tol=1e-8, max_iterations: int = DEFAULT_MAX_ITERATIONS["admm"]
) -> SolverOutput:
  """ADMM solver on an ``[n, d]`` array (memory ``O(n^2 min(n, d))``; see the module
  docstring)."""
  return solve_edges(run_admm, z, r, tol, max_iterations)
