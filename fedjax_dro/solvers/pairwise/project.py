"""The public entry point :func:`project_pairwise` and the KKT residuals."""

from __future__ import annotations

import functools
import time
import types
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_dro.solvers.pairwise.admm import run_admm
from fedjax_dro.solvers.pairwise.dual import project_dual_row_space, run_dual
from fedjax_dro.solvers.pairwise.dykstra import run_dykstra
from fedjax_dro.solvers.pairwise.problem import (
  DEFAULT_MAX_ITERATIONS,
  METHODS,
  KKTResiduals,
  PairwiseProjectionOutput,
  SolverOutput,
  as_matrix,
  average_components,
  finfo_tiny,
  flatten_clients,
  max_violation,
  pairwise_sq_distances,
  prepare,
  sanitize_r,
  segment_sum_rows,
  solve_reduced,
  validate_common,
  zero_components,
)
from fedjax_dro.solvers.pairwise.restoration import input_feasible, shrink_factor, shrink_to_center

# ----------------------------------------------------------------------------------------------
# The public entry point
# ----------------------------------------------------------------------------------------------
_SOLVERS = types.MappingProxyType(
  {
    "dual": lambda prep, tol, it, mu0: run_dual(prep, tol, it, mu0),
    "admm": lambda prep, tol, it, mu0: solve_reduced(lambda p: run_admm(p, tol, it), prep),
    "dykstra": lambda prep, tol, it, mu0: solve_reduced(lambda p: run_dykstra(p, tol, it), prep),
  }
)


@functools.partial(jax.jit, static_argnames=("method", "max_iterations", "restore"))
def _project_2d(z, r, tol, mu0, method: str, max_iterations: int, restore: bool):
  n, d = z.shape
  if method == "dual" and d > n:  # no [n, d] intermediate (see project_dual_row_space)
    theta, iterations, primal, gap, converged, a, mu = project_dual_row_space(
      z, r, tol, max_iterations, mu0, restore
    )
    return PairwiseProjectionOutput(theta, iterations, primal, gap, converged, a, mu)
  prep = prepare(z, r)
  feasible = input_feasible(prep, pairwise_sq_distances(z))

  def trivial():
    return SolverOutput(
      z,
      jnp.zeros((n, n), z.dtype),
      jnp.array(0, jnp.int32),
      jnp.zeros((), z.dtype),
      jnp.array(True),
    )

  def solve():
    return _SOLVERS[method](prep, tol, max_iterations, mu0)

  out = lax.cond(feasible, trivial, solve)
  d2 = pairwise_sq_distances(out.theta)
  primal = max_violation(d2, prep.r)
  if method == "dual":
    avg, d2_avg = out.theta, d2  # components already coincide
  else:
    avg = average_components(out.theta, prep.labels, prep.counts)
    d2_avg = pairwise_sq_distances(avg)
  a = shrink_factor(d2_avg, prep.r)
  if restore:
    theta = jnp.where(feasible, z, shrink_to_center(avg, a))
  else:
    theta = out.theta
  a = jnp.where(feasible, jnp.ones_like(a), a)
  return PairwiseProjectionOutput(
    theta, out.iterations, primal, out.residual, out.converged, a, out.multipliers
  )


def project_pairwise(
  z,
  r,
  *,
  method: str = "dual",
  tol=1e-8,
  max_iterations: Optional[int] = None,
  restore_feasibility: bool = True,
  initial_multipliers=None,
) -> PairwiseProjectionOutput:
  """Euclidean projection of ``z`` onto ``K = {||theta_i - theta_j||^2 <= r_ij, i < j}``.

  Args:
    z: ``[n, d]`` array (one row per client) or a pytree whose leaves all have leading axis
      ``n`` (each client is raveled into one row; the output has the same structure, shapes
      and dtypes). Integer leaves are promoted to float.
    r: ``[n, n]`` symmetric matrix of squared radii (``t * D``), entries ``>= 0``; ``0``
      forces equality, ``inf`` removes the constraint; the diagonal is ignored.
    method: ``"dual"`` (default; ``O(n^3)`` per iteration, independent of ``d``), ``"admm"`` or
      ``"dykstra"`` (both ``O(n^2 min(n, d))`` memory). See the module docstring.
    tol: stopping tolerance (> 0) of the method's relative residual (dual: certified relative
      duality gap of the restored point).
    max_iterations: iteration cap (static; default ``DEFAULT_MAX_ITERATIONS[method]``).
    restore_feasibility: shrink the result into ``K`` (always exactly feasible on return).
    initial_multipliers: optional ``[n, n]`` warm start of the dual multipliers (``"dual"``
      only), e.g. the ``multipliers`` of the previous call.

  Returns:
    :class:`PairwiseProjectionOutput`.

  Raises:
    TypeError: an argument of the wrong type (the message names it).
    ValueError: a malformed argument, named in the message (values are checked only when
      concrete; shapes always).
  """
  flat, unflatten, r, max_iterations = _checked(
    z, r, method, tol, max_iterations, restore_feasibility, initial_multipliers
  )
  mu0 = None if initial_multipliers is None else jnp.asarray(initial_multipliers, flat.dtype)
  out = _project_2d(
    flat,
    r,
    jnp.asarray(tol, flat.dtype),
    mu0,
    method,
    max_iterations,
    bool(restore_feasibility),
  )
  return out._replace(theta=unflatten(out.theta))


def _checked(z, r, method, tol, max_iterations, restore_feasibility, initial_multipliers=None):
  """``(flat, unflatten, r, max_iterations)``: the arguments of :func:`project_pairwise` (and of
  :func:`compile_projection`) checked, ``z`` flattened to ``[n, d]``, ``r`` a matrix of its
  dtype and ``max_iterations`` the method's default where None."""
  if not isinstance(method, str) or method not in METHODS:
    raise ValueError(f"`method` must be one of {METHODS}, got {method!r}")
  if max_iterations is None:
    max_iterations = DEFAULT_MAX_ITERATIONS[method]
  if not isinstance(restore_feasibility, (bool, np.bool_)):
    raise TypeError(f"`restore_feasibility` must be a bool, got {restore_feasibility!r}")
  if initial_multipliers is not None and method != "dual":
    raise ValueError(f"`initial_multipliers` is only used by method='dual', got method={method!r}")
  flat, unflatten = flatten_clients(z)
  r = as_matrix(r, flat.dtype)
  validate_common(flat.shape[0], r, tol, max_iterations, initial_multipliers)
  return flat, unflatten, r, int(max_iterations)


class CompiledProjection(NamedTuple):
  """An ahead-of-time compiled :func:`project_pairwise` for one shape, dtype and method.

  Built by :func:`compile_projection`; call it as ``proj(z, r)`` (or ``proj(z, r, tol)``) with
  arguments of the shapes and dtypes it was compiled for. Compilation is separate from the call,
  so repeated calls (benchmarks, a projection inside a Python loop) pay no tracing or
  compilation. ``compile_time`` is in seconds.
  """

  program: Any
  compile_time: float
  method: str
  max_iterations: int
  tol: Any
  unflatten: Callable

  def __call__(self, z, r, tol=None) -> PairwiseProjectionOutput:
    flat = z if getattr(z, "ndim", None) == 2 else flatten_clients(z)[0]
    tol = self.tol if tol is None else jnp.asarray(tol, flat.dtype)
    out = self.program(flat, jnp.asarray(r, flat.dtype), tol, None)
    return out if getattr(z, "ndim", None) == 2 else out._replace(theta=self.unflatten(out.theta))


def compile_projection(
  z,
  r,
  *,
  method: str = "dual",
  tol=1e-8,
  max_iterations: Optional[int] = None,
  restore_feasibility: bool = True,
) -> CompiledProjection:
  """Compiles :func:`project_pairwise` for the shapes of ``z`` and ``r`` (same arguments).

  Returns a :class:`CompiledProjection` whose calls give the same result as
  ``project_pairwise(z, r, method=method, tol=tol, ...)``; it records the compile time, which
  the benchmark (``benchmarks/projection_scaling.py``) reports apart from the run time.
  """
  flat, unflatten, r, max_iterations = _checked(
    z, r, method, tol, max_iterations, restore_feasibility
  )
  tol = jnp.asarray(tol, flat.dtype)
  lowered = _project_2d.lower(
    flat,
    r,
    tol,
    None,
    method=method,
    max_iterations=max_iterations,
    restore=bool(restore_feasibility),
  )
  t0 = time.perf_counter()
  program = lowered.compile()
  return CompiledProjection(
    program, time.perf_counter() - t0, method, max_iterations, tol, unflatten
  )


# ----------------------------------------------------------------------------------------------
# KKT residuals
# ----------------------------------------------------------------------------------------------
def pairwise_kkt_residuals(theta, z, r, mu) -> KKTResiduals:
  """KKT residuals of the projection problem at ``(theta, mu)``.

  ``theta``, ``z``: ``[n, d]`` arrays or pytrees with a leading client axis; ``r``, ``mu``:
  ``[n, n]``. Multipliers on edges with ``r = 0`` or ``r = inf`` are ignored; stationarity
  ``Theta - Z + L_mu Theta`` is summed over every zero-radius component (``P_S``), where the
  (possibly non-existent) multipliers of the equality pairs cancel. Normalisations:
  stationarity by ``||Z - mean(Z)||_F``, complementarity by the mean squared distance of the
  rows of ``Z`` to their centroid; infeasibilities are absolute.
  """
  t2, _ = flatten_clients(theta, "theta")
  z2, _ = flatten_clients(z, "z")
  if t2.shape != z2.shape:
    raise ValueError(f"`theta` and `z` must have the same shape, got {t2.shape} and {z2.shape}")
  dtype = jnp.result_type(t2.dtype, z2.dtype)
  n = t2.shape[0]
  r = as_matrix(r, dtype)
  mu = as_matrix(mu, dtype, name="mu")
  validate_common(n, r, 1.0, 1, mu)
  return _kkt_jit(t2.astype(dtype), z2.astype(dtype), r, mu)


@jax.jit
def _kkt_jit(theta, z, r, mu):
  n = theta.shape[0]
  r = sanitize_r(r)
  labels = zero_components(r)
  pos = jnp.isfinite(r) & (r > 0)
  mu = jnp.where(pos, 0.5 * (mu + mu.T), 0.0)
  d2 = pairwise_sq_distances(theta)
  lap = jnp.diag(jnp.sum(mu, axis=1)) - mu
  stat = segment_sum_rows(theta - z + lap @ theta, labels, n)
  zc = z - jnp.mean(z, axis=0)
  znorm = jnp.sqrt(jnp.sum(zc * zc)) + finfo_tiny(z.dtype)
  spread = jnp.sum(zc * zc) / n + finfo_tiny(z.dtype)
  comp = jnp.max(jnp.abs(mu * jnp.where(pos, d2 - jnp.where(pos, r, 0.0), 0.0)))
  return KKTResiduals(
    max_violation(d2, r),
    jnp.sqrt(jnp.sum(stat * stat)) / znorm,
    comp / spread,
    jnp.maximum(jnp.max(-mu), 0.0),
  )
