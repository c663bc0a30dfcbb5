"""The projection problem of Karula, its outputs, shared preprocessing and input validation.

See :mod:`fedjax_dro.solvers.pairwise` for the problem, its KKT conditions and the methods.
"""

from __future__ import annotations

import types
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_dro.solvers.linalg import qr
from fedjax_dro.solvers.validation import concrete_or_none as _concrete_or_none

METHODS = ("dual", "admm", "dykstra")
DEFAULT_MAX_ITERATIONS = types.MappingProxyType({"dual": 2000, "admm": 50000, "dykstra": 200000})


# ----------------------------------------------------------------------------------------------
# Outputs
# ----------------------------------------------------------------------------------------------
class PairwiseProjectionOutput(NamedTuple):
  """Result of :func:`project_pairwise`.

  Attributes:
    theta: the projection, same pytree structure / shapes / dtypes as ``z``.
    iterations: solver iterations (int32; 0 when the input was already feasible).
    primal_residual: ``max_{i<j} (||theta_i - theta_j||^2 - r_ij)_+`` of the solver's iterate
      *before* restoration (absolute, in squared parameter units).
    dual_residual: the method's own stopping residual. ``"dual"``: certified relative duality
      gap ``(f(restored) - g(mu)) / f(restored)`` (an upper bound on the relative
      suboptimality of the restored point); ``"admm"``: Boyd's relative dual residual;
      ``"dykstra"``: relative KKT stationarity residual.
    converged: bool, the stopping rule was met within ``max_iterations``.
    restoration_scale: the shrink factor ``a`` in ``(0, 1]`` (1: nothing to restore). Reported
      also with ``restore_feasibility=False`` (then it is the factor that *would* be applied).
    multipliers: ``[n, n]`` symmetric estimate of the edge multipliers ``mu`` (exact for
      ``"dual"``, derived from the dual iterates for ``"admm"`` / ``"dykstra"``); 0 on the
      diagonal and on edges with ``r = 0`` or ``r = inf``.
  """

  theta: Any
  iterations: jax.Array
  primal_residual: jax.Array
  dual_residual: jax.Array
  converged: jax.Array
  restoration_scale: jax.Array
  multipliers: jax.Array

  @property
  def residuals(self):
    """``(primal_residual, dual_residual)``."""
    return (self.primal_residual, self.dual_residual)


class SolverOutput(NamedTuple):
  """Raw result of one solver on an ``[n, d]`` array, before feasibility restoration."""

  theta: jax.Array  # [n, d]
  multipliers: jax.Array  # [n, n]
  iterations: jax.Array  # int32
  residual: jax.Array  # the method's stopping residual (see PairwiseProjectionOutput)
  converged: jax.Array  # bool


class KKTResiduals(NamedTuple):
  """KKT residuals of (P) at ``(theta, mu)`` (see :func:`pairwise_kkt_residuals`)."""

  primal_infeasibility: jax.Array  # max (||theta_i - theta_j||^2 - r_ij)_+, absolute
  stationarity: jax.Array  # ||P_S(Theta - Z + L_mu Theta)||_F / ||Z - mean(Z)||_F
  complementarity: jax.Array  # max |mu_e (d_e^2 - r_e)| / mean_i ||z_i - mean(Z)||^2
  dual_infeasibility: jax.Array  # max (-mu_e)_+


# ----------------------------------------------------------------------------------------------
# Small shared helpers
# ----------------------------------------------------------------------------------------------
def pairwise_sq_distances(x):
  """``[n, n]`` squared distances between the rows of ``x`` (from the centred Gram matrix)."""
  x = jnp.asarray(x)
  xc = x - jnp.mean(x, axis=0, keepdims=True)
  sq = jnp.sum(xc * xc, axis=1)
  d2 = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * (xc @ xc.T), 0.0)
  return jnp.where(jnp.eye(x.shape[0], dtype=bool), 0.0, d2)


def finfo_tiny(dtype):
  return jnp.asarray(jnp.finfo(dtype).tiny, dtype)


def finfo_eps(dtype):
  return jnp.asarray(jnp.finfo(dtype).eps, dtype)


def sanitize_r(r):
  """Symmetric (elementwise min with the transpose), diagonal set to +inf (ignored)."""
  r = jnp.minimum(r, r.T)
  return jnp.where(jnp.eye(r.shape[0], dtype=bool), jnp.inf, r)


def zero_components(r):
  """Label of every node = smallest index in its component of the graph {r_ij == 0}.

  Min-label propagation with pointer jumping in a ``lax.while_loop`` (O(n^2) per sweep, at most
  n sweeps; typically a handful).
  """
  n = r.shape[0]
  zero = r == 0  # diagonal is +inf after sanitize_r
  idx = jnp.arange(n)

  def body(carry):
    labels, _, it = carry
    nb = jnp.min(jnp.where(zero, labels[None, :], n), axis=1)
    new = jnp.minimum(labels, nb)
    new = new[new]  # pointer jumping
    return new, jnp.any(new != labels), it + 1

  labels, _, _ = lax.while_loop(
    lambda c: c[1] & (c[2] < n + 1), body, (idx, jnp.array(True), jnp.array(0))
  )
  return labels


def segment_sum_rows(x, labels, n):
  return jax.ops.segment_sum(x, labels, num_segments=n)


class Prepared(NamedTuple):
  """Shared preprocessing: centring, zero-radius components and their averages."""

  z: jax.Array  # [n, d] the original input
  shift: jax.Array  # [d] mean row of z (the problem is translation invariant)
  zc: jax.Array  # [n, d] z - shift
  zavg: jax.Array  # [n, d] per-component averages of zc (P_S applied to zc)
  r: jax.Array  # [n, n] sanitised radii (symmetric, diagonal +inf)
  labels: jax.Array  # [n] component label = smallest member index
  counts: jax.Array  # [n] component sizes at the label index (0 elsewhere)


def prepare(z, r):
  n = z.shape[0]
  r = sanitize_r(r.astype(z.dtype))
  labels = zero_components(r)
  counts = segment_sum_rows(jnp.ones((n,), z.dtype), labels, n)
  shift = jnp.mean(z, axis=0)
  zc = z - shift
  sums = segment_sum_rows(zc, labels, n)
  zavg = sums[labels] / counts[labels][:, None]
  return Prepared(z, shift, zc, zavg, r, labels, counts)


def _row_space_reduce(prep: Prepared):
  """Exact reduction of (P) to ``k = n`` coordinates when ``d > n``: ``(prep_k, basis)``.

  With the thin QR factorisation ``Z_c^T = Q R`` (``Q``: ``[d, n]`` orthonormal columns),
  ``Z_c = Y Q^T`` for ``Y = R^T`` (``[n, n]``). The objective and the constraints only involve
  Euclidean norms of linear combinations of rows, which ``x -> x Q^T`` preserves, and every
  iterate of ADMM / Dykstra is a linear combination of the rows of ``Z_c`` passed through
  norm-dependent scalings; so running a solver on ``Y`` and mapping its output back with
  ``Q^T`` (then adding the shift) gives *the same iterates* as running it on ``Z`` (up to
  rounding) with ``[m, n]`` instead of ``[m, d]`` edge arrays. ``O(n^2 d)`` once.
  """
  n = prep.zc.shape[0]
  basis, upper = qr(prep.zc.T)  # [d, n], [n, n]
  y = upper.T
  yavg = average_components(y, prep.labels, prep.counts)
  zero = jnp.zeros((n,), y.dtype)
  return prep._replace(z=y, shift=zero, zc=y, zavg=yavg), basis


def solve_reduced(solver, prep: Prepared) -> "SolverOutput":
  """Run an edge-array solver (ADMM / Dykstra) on ``Y`` when ``d > n`` (static), else on Z."""
  n, d = prep.zc.shape
  if d <= n:
    return solver(prep)
  prep_k, basis = _row_space_reduce(prep)
  out = solver(prep_k)
  return out._replace(theta=out.theta @ basis.T + prep.shift)


def average_components(x, labels, counts):
  n = x.shape[0]
  return (segment_sum_rows(x, labels, n) / jnp.maximum(counts, 1)[:, None])[labels]


def max_violation(d2, r):
  fin = jnp.isfinite(r)
  return jnp.maximum(jnp.max(jnp.where(fin, d2 - jnp.where(fin, r, 0.0), 0.0)), 0.0)


def as_2d_float(z, name="z"):
  z = jnp.asarray(z)
  if z.ndim != 2:
    raise ValueError(f"`{name}` must be a 2-D [n, d] array here, got shape {z.shape}")
  if not jnp.issubdtype(z.dtype, jnp.floating):
    z = z.astype(jnp.result_type(float))
  return z


# ----------------------------------------------------------------------------------------------
# Validation and pytree flattening
# ----------------------------------------------------------------------------------------------
def flatten_clients(z, name="z"):
  """``([n, D] array, unflatten)`` with every leaf raveled per client."""
  leaves, treedef = jax.tree.flatten(z)
  if not leaves:
    raise ValueError(f"`{name}` must be an array or a pytree with at least one array leaf")
  arrays = []
  for leaf in leaves:
    try:
      arr = jnp.asarray(leaf)
    except TypeError as e:
      raise TypeError(f"`{name}` leaves must be numeric arrays, got {type(leaf).__name__}") from e
    if not (
      jnp.issubdtype(arr.dtype, jnp.floating)
      or jnp.issubdtype(arr.dtype, jnp.integer)
      or arr.dtype == jnp.bool_
    ):
      raise TypeError(f"`{name}` leaves must be real floating-point arrays, got dtype {arr.dtype}")
    if arr.ndim == 0:
      raise ValueError(f"`{name}` leaves must have a leading client axis, got a scalar")
    arrays.append(arr)
  n = arrays[0].shape[0]
  for arr in arrays:
    if arr.shape[0] != n:
      raise ValueError(
        f"all leaves of `{name}` must share the leading client axis, got "
        f"sizes {sorted({a.shape[0] for a in arrays})}"
      )
  if n == 0:
    raise ValueError(f"`{name}` must have at least one client (leading axis 0)")
  floats = [a.dtype for a in arrays if jnp.issubdtype(a.dtype, jnp.floating)]
  dtype = jnp.result_type(*floats) if floats else jnp.result_type(float)
  shapes = [a.shape for a in arrays]
  dtypes = [a.dtype for a in arrays]
  sizes = [int(np.prod(s[1:], dtype=np.int64)) for s in shapes]
  flat = jnp.concatenate([a.reshape(n, -1).astype(dtype) for a in arrays], axis=1)

  def unflatten(x):
    out, start = [], 0
    for shape, dt, size in zip(shapes, dtypes, sizes):
      piece = x[:, start : start + size].reshape(shape)
      out.append(piece.astype(dt) if jnp.issubdtype(dt, jnp.floating) else piece)
      start += size
    return jax.tree.unflatten(treedef, out)

  return flat, unflatten


def as_matrix(r, dtype, name="r"):
  try:
    arr = jnp.asarray(r)
  except TypeError as e:
    raise TypeError(f"`{name}` must be a numeric [n, n] matrix, got {type(r).__name__}") from e
  if not (jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)):
    raise TypeError(f"`{name}` must be a real numeric [n, n] matrix, got dtype {arr.dtype}")
  return arr.astype(dtype)


def validate_common(n, r, tol, max_iterations, mu):
  if r.ndim != 2 or r.shape[0] != r.shape[1]:
    raise ValueError(f"`r` must be a square [n, n] matrix, got shape {tuple(r.shape)}")
  if r.shape[0] != n:
    raise ValueError(f"`r` is {r.shape[0]} x {r.shape[1]} but `z` has n = {n} clients")
  if (
    isinstance(max_iterations, bool)
    or not isinstance(max_iterations, (int, np.integer))
    or max_iterations < 1
  ):
    raise ValueError(f"`max_iterations` must be a positive integer, got {max_iterations!r}")
  tc = _concrete_or_none(tol)
  if tc is not None:
    if tc.ndim != 0 or not np.isfinite(tc) or tc <= 0:
      raise ValueError(f"`tol` must be a positive finite scalar, got {tol!r}")
  rc = _concrete_or_none(r)
  if rc is not None:
    off = ~np.eye(n, dtype=bool)
    if np.isnan(rc).any():
      raise ValueError("`r` contains NaN")
    if (rc[off] < 0).any():
      raise ValueError(f"`r` must be nonnegative off the diagonal, got minimum {rc[off].min()!r}")
    both_inf = np.isinf(rc) & np.isinf(rc.T)
    with np.errstate(invalid="ignore"):
      close = np.isclose(rc, rc.T, rtol=1e-9, atol=0.0) | both_inf
    if not close[off].all():
      raise ValueError("`r` must be symmetric (r_ij == r_ji)")
  if mu is not None:
    mu = jnp.asarray(mu)
    if mu.shape != (n, n):
      raise ValueError(
        f"`initial_multipliers` / `mu` must have shape ({n}, {n}), got {tuple(mu.shape)}"
      )
    mc = _concrete_or_none(mu)
    if mc is not None and (np.isnan(mc).any() or (mc < 0).any()):
      raise ValueError("`initial_multipliers` / `mu` must be nonnegative and not NaN")


def effective_tol(tol, dtype):
  """``tol`` clipped below at 64 ulp of the working precision (float32: ~7.6e-6)."""
  return jnp.maximum(jnp.asarray(tol, dtype), 64 * finfo_eps(dtype))
