"""Euclidean projection onto the pairwise-ball set of Karula.

Karula (Erickson & Johansson, ``shared/papers/karula.txt``, Section 3 and Algorithm 1) trains one
model per client under pairwise dissimilarity constraints and, after every (variance-reduced)
gradient step, projects the stacked models onto

    K = {Theta in R^{n x d} : ||theta_i - theta_j||^2 <= r_ij  for all i < j},   r = t D,

i.e. it solves

    minimize_Theta  f(Theta) = 0.5 ||Theta - Z||_F^2    subject to  Theta in K.          (P)

The paper notes that the projection has no closed form and analyses a *delta-inexact*
projection: a *feasible* point whose objective is within delta of the optimum. This module
returns exactly that: every method ends with a feasibility restoration and reports how inexact
the result is. ``r`` is an ``[n, n]`` symmetric nonnegative matrix; ``r_ij = 0`` forces
``theta_i = theta_j`` and ``r_ij = inf`` switches the constraint off. The diagonal is ignored.

Input: an ``[n, d]`` array (one row per client) or any pytree whose leaves share a leading
client axis ``n``; each client is raveled into one row and the result is unraveled back.

Optimality (KKT) conditions
---------------------------
With one multiplier ``mu_e >= 0`` per edge ``e = (i, j)``, ``a_e = e_i - e_j`` and the weighted
graph Laplacian ``L_mu = sum_e mu_e a_e a_e^T``, the Lagrangian of (P) is
``0.5 ||Theta - Z||^2 + sum_e mu_e / 2 (||a_e^T Theta||^2 - r_e)`` and a point is optimal iff

* primal feasibility    ``||theta_i - theta_j||^2 <= r_ij``;
* stationarity          ``Theta - Z + L_mu Theta = 0``;
* complementarity       ``mu_e (||theta_i - theta_j||^2 - r_e) = 0``;
* dual feasibility      ``mu_e >= 0``.

Edges with ``r_e = 0`` violate constraint qualification (their multipliers need not exist), so
they are eliminated exactly: the zero-radius edges split the clients into connected components
``S`` that must share one model. Projection onto the subspace ``{theta_i = theta_j on S}`` is the
per-component average and ``P_K(Z) = P_K(avg_S(Z))`` because ``K`` lies in that subspace.
Every solver starts from the averaged input; the dual method additionally *contracts* each
component into one weighted node (weight = component size, radius between two components = the
smallest ``r`` between their members). ``pairwise_kkt_residuals`` measures stationarity after
summing it over each component (the zero-radius edges' forces cancel there).

Methods (``method=``)
---------------------
``"dual"`` (default): maximize the concave dual over the edge multipliers,

    g(mu) = min_Theta L(Theta, mu),   Theta(mu) = (I + L_mu)^{-1} Z,
    dg/dmu_e = (||theta_i(mu) - theta_j(mu)||^2 - r_e) / 2,

over ``mu >= 0`` (edges with ``r = inf`` keep ``mu = 0``). Everything happens in the ``n x n``
Gram space: for ``d > n`` the Gram matrix ``G = Z Z^T`` is formed once (``O(n^2 d)``) and
replaced by its square-root factor ``Y`` (``Y Y^T = G``, an eigendecomposition, ``O(n^3)``
once); for ``d <= n``, ``Y = Z``. Each evaluation of ``g`` then costs one Cholesky factorisation
of ``I + L_mu``, one solve with ``k = min(n, d)`` right-hand sides and one ``n x n x k`` product
for the pairwise distances (``||theta_i - theta_j||^2`` from the Gram matrix of
``Theta(mu) = M Y``, ``M = (I + L_mu)^{-1}``): ``O(n^3)`` per iteration whatever ``d``. Only at
the end is ``Theta = M Z`` formed (``O(n^2 d)``), for the iterate with the best certificate.

The optimiser is a projected limited-memory BFGS method (Kim, Sra & Dhillon 2010 style):
Bertsekas' epsilon-active set (multipliers at or near 0 whose gradient points outside) moves
along the scaled gradient; on the free edges the L-BFGS direction is built from the curvature
pairs restricted to them, on top of the *exact diagonal of the dual Hessian*,
``(a_e^T M a_e) ||theta_i - theta_j||^2``, scaled by the usual ``s'y / y'Dy`` factor; a
projected Armijo search along the arc with safeguarded quadratic backtracking globalises it.
The iteration stops on a *certified duality gap*: the restored point ``a Theta(mu)`` (below) is
feasible, hence ``0 <= f(a Theta(mu)) - f* <= f(a Theta(mu)) - g(mu)``, and the method stops when
this gap, relative to ``f(a Theta(mu))``, is at most ``tol``; the gap is evaluated without
cancellation as ``(a - 1)(...) + sum_e mu_e (r_e - d_e^2) / 2``. ``tol`` is used as given down to
64 ulp of the working precision (float32 inputs: ~7.6e-6). The loop also ends (with
``converged=False``) when the best certificate has not dropped by 1% in 100 iterations (rounding
floor reached). ``initial_multipliers`` warm-starts
the method (e.g. with the previous round's multipliers in Karula).

Cost in practice (``benchmarks/projection_scaling.py``, 2-core CPU, cold start): ``n = 1000,
d = 10^4`` takes ~210 iterations of ~0.16 s (one Cholesky, one solve with ``n`` right-hand sides,
one ``n x n x n`` product) to a certified gap of 1e-6 in float64 (~35 s) and ~14 s in float32 at
1e-5; ``n <= 300`` takes under 2 s. Warm starts (Karula's later rounds) need a handful of
iterations. Note that JAX's CPU Cholesky and triangular solves run in OpenBLAS: on small shared
machines set ``OPENBLAS_NUM_THREADS=1`` before importing NumPy / JAX (OpenBLAS threads competing
with XLA's can slow factorisations down 10-100x).

``"admm"``: ADMM on the split ``V = D Theta`` (``D`` the edge-node incidence matrix of the
complete graph, rows ``a_e^T``): the Theta-step solves ``(I + beta L) Theta = Z + beta D^T (V - U)``
in closed form, ``Theta = (R + beta 1 (1^T R)) / (1 + beta n)`` (``L = D^T D = n I - 1 1^T``); the
V-step projects every edge vector onto its ball ``||v_e||^2 <= r_e``; ``U += D Theta - V``.
Boyd et al. (2011, Sec. 3.3) relative primal / dual residual stopping, with residual balancing of
``beta`` (Sec. 3.4.1) every 10 iterations. Edges with ``r = inf`` keep an unconstrained copy so
that the closed form stays valid. Only the scaled duals ``U`` are kept between iterations
(``V`` is recomputed from them), so the state is one ``[m, k]`` edge array.

``"dykstra"``: parallel Dykstra in the product space of per-edge copies. Each edge ``e = (i, j)``
owns copies of rows ``i`` and ``j``; the product space carries the weights ``omega_i = 1/deg(i)``
(``deg`` = number of finite-radius edges at ``i``), which makes the consensus subspace isometric
to the original space, so Dykstra's algorithm for the two sets (product of edge sets,
consensus subspace) converges to the true projection. The edge step is the weighted closed form:
if ``||u_i - u_j|| > sqrt(r)``, keep the weighted mean ``omega_i u_i + omega_j u_j`` and shrink the
difference to length ``sqrt(r)`` (for equal degrees, e.g. all radii finite, this is the symmetric
move toward the midpoint); the consensus step averages the copies of row ``i`` with weights
``1/deg(i)``. With ``Q_e`` the correction of edge ``e`` this collapses to one vector per edge:
``delta_e = theta_i - theta_j + Q_e``, ``Q_e <- (1 - sqrt(r_e)/||delta_e||)_+ delta_e``,
``Theta <- Theta - D^T (kappa * (Q_new - Q_old))`` with ``kappa_e = omega_i omega_j /
(omega_i + omega_j)``; the multiplier estimate is ``mu_e = kappa_e ||Q_e|| / sqrt(r_e)``. Stops when
the relative KKT stationarity residual and the maximum relative violation are below ``tol``.

Memory of ADMM and Dykstra: ``O(n^2 k)`` with ``k = min(n, d)``. For ``d > n`` both run on the
exact ``n``-dimensional row-space coordinates ``Y`` of the centred input (thin QR
``Z_c^T = Q Y^T``, once, ``O(n^2 d)``) and map back with ``Q^T``: the problem only sees norms of
row combinations, so the iterates are the same as on ``Z`` (see ``_row_space_reduce``). For
``n = 1000`` that is still ``~4 GB`` per edge array in float64.

Feasibility restoration (``restore_feasibility=True``, all methods)
-------------------------------------------------------------------
1. Rows of each zero-radius component are replaced by their average (so those pairs coincide
   exactly). 2. With ``a = min(1, min_{r_ij > 0} sqrt(r_ij) / ||theta_i - theta_j||)`` every row is
shrunk toward the unweighted centroid, ``theta_i <- c + a (theta_i - c)``: every pairwise
difference is scaled by exactly ``a``, so the output is feasible (``a`` is reduced by 4 ulp when
``< 1`` to absorb rounding; coinciding rows stay coinciding). The factor ``a`` is reported; for
the exact projection the centroid of ``Theta`` equals the centroid of ``Z``, so the cost of the
restoration is second order in the violation. An input that is already feasible is returned
unchanged (bit for bit).

Everything is jitted with ``method`` / ``max_iterations`` static, uses fixed shapes and
``lax.while_loop`` (no Python loops over clients), and works under ``jit`` / ``vmap``
(validation of values is skipped for traced arguments; shapes are always checked).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.linalg import cho_solve

from fedjax_dro.core.validation import concrete_or_none as _concrete_or_none

__all__ = [
    "PairwiseProjectionOutput",
    "SolverOutput",
    "KKTResiduals",
    "project_pairwise",
    "solve_dual",
    "solve_admm",
    "solve_dykstra",
    "shrink_to_feasible",
    "pairwise_kkt_residuals",
    "pairwise_sq_distances",
    "METHODS",
    "DEFAULT_MAX_ITERATIONS",
]

METHODS = ("dual", "admm", "dykstra")
DEFAULT_MAX_ITERATIONS = {"dual": 2000, "admm": 50000, "dykstra": 200000}

_LBFGS_MEMORY = 8
_MAX_LINE_SEARCH = 30
_ARMIJO = 1e-4
_BALANCE_EVERY = 10
_HISTORY_DTYPE = jnp.float32   # L-BFGS pairs (see _two_loop)
_HINV_REFRESH = 10     # recompute the diagonal preconditioner every few iterations
_STAGNATION = 100      # stop when the certified gap has not dropped by 1% for this many iterations


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
    theta: jax.Array          # [n, d]
    multipliers: jax.Array    # [n, n]
    iterations: jax.Array     # int32
    residual: jax.Array       # the method's stopping residual (see PairwiseProjectionOutput)
    converged: jax.Array      # bool


class KKTResiduals(NamedTuple):
    """KKT residuals of (P) at ``(theta, mu)`` (see :func:`pairwise_kkt_residuals`)."""
    primal_infeasibility: jax.Array   # max (||theta_i - theta_j||^2 - r_ij)_+, absolute
    stationarity: jax.Array           # ||P_S(Theta - Z + L_mu Theta)||_F / ||Z - mean(Z)||_F
    complementarity: jax.Array        # max |mu_e (d_e^2 - r_e)| / mean_i ||z_i - mean(Z)||^2
    dual_infeasibility: jax.Array     # max (-mu_e)_+


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


def _tiny(dtype):
    return jnp.asarray(jnp.finfo(dtype).tiny, dtype)


def _eps(dtype):
    return jnp.asarray(jnp.finfo(dtype).eps, dtype)


def _sanitize_r(r):
    """Symmetric (elementwise min with the transpose), diagonal set to +inf (ignored)."""
    r = jnp.minimum(r, r.T)
    return jnp.where(jnp.eye(r.shape[0], dtype=bool), jnp.inf, r)


def _zero_components(r):
    """Label of every node = smallest index in its component of the graph {r_ij == 0}.

    Min-label propagation with pointer jumping in a ``lax.while_loop`` (O(n^2) per sweep, at most
    n sweeps; typically a handful).
    """
    n = r.shape[0]
    zero = r == 0   # diagonal is +inf after _sanitize_r
    idx = jnp.arange(n)

    def body(carry):
        labels, _, it = carry
        nb = jnp.min(jnp.where(zero, labels[None, :], n), axis=1)
        new = jnp.minimum(labels, nb)
        new = new[new]                       # pointer jumping
        return new, jnp.any(new != labels), it + 1

    labels, _, _ = lax.while_loop(lambda c: c[1] & (c[2] < n + 1), body,
                                  (idx, jnp.array(True), jnp.array(0)))
    return labels


def _segment_sum_rows(x, labels, n):
    return jax.ops.segment_sum(x, labels, num_segments=n)


class _Prepared(NamedTuple):
    """Shared preprocessing: centring, zero-radius components and their averages."""
    z: jax.Array          # [n, d] the original input
    shift: jax.Array      # [d] mean row of z (the problem is translation invariant)
    zc: jax.Array         # [n, d] z - shift
    zavg: jax.Array       # [n, d] per-component averages of zc (P_S applied to zc)
    r: jax.Array          # [n, n] sanitised radii (symmetric, diagonal +inf)
    labels: jax.Array     # [n] component label = smallest member index
    counts: jax.Array     # [n] component sizes at the label index (0 elsewhere)


def _prepare(z, r):
    n = z.shape[0]
    r = _sanitize_r(r.astype(z.dtype))
    labels = _zero_components(r)
    counts = _segment_sum_rows(jnp.ones((n,), z.dtype), labels, n)
    shift = jnp.mean(z, axis=0)
    zc = z - shift
    sums = _segment_sum_rows(zc, labels, n)
    zavg = sums[labels] / counts[labels][:, None]
    return _Prepared(z, shift, zc, zavg, r, labels, counts)


def _row_space_reduce(prep: _Prepared):
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
    basis, upper = jnp.linalg.qr(prep.zc.T)          # [d, n], [n, n]
    y = upper.T
    yavg = _average_components(y, prep.labels, prep.counts)
    zero = jnp.zeros((n,), y.dtype)
    return prep._replace(z=y, shift=zero, zc=y, zavg=yavg), basis


def _solve_reduced(solver, prep: _Prepared) -> "SolverOutput":
    """Run an edge-array solver (ADMM / Dykstra) on ``Y`` when ``d > n`` (static), else on Z."""
    n, d = prep.zc.shape
    if d <= n:
        return solver(prep)
    prep_k, basis = _row_space_reduce(prep)
    out = solver(prep_k)
    return out._replace(theta=out.theta @ basis.T + prep.shift)


def _average_components(x, labels, counts):
    n = x.shape[0]
    return (_segment_sum_rows(x, labels, n) / jnp.maximum(counts, 1)[:, None])[labels]


def _max_violation(d2, r):
    fin = jnp.isfinite(r)
    return jnp.maximum(jnp.max(jnp.where(fin, d2 - jnp.where(fin, r, 0.0), 0.0)), 0.0)


def _shrink_factor(d2, r):
    """``min(1, min_{r_ij>0} sqrt(r_ij / d2_ij))`` minus 4 ulp when < 1."""
    pos = jnp.isfinite(r) & (r > 0)
    ratio2 = jnp.where(pos & (d2 > r), jnp.where(pos, r, 1.0) / jnp.where(d2 > 0, d2, 1.0), 1.0)
    a = jnp.sqrt(jnp.min(ratio2, initial=1.0))
    return jnp.where(a < 1, a * (1 - 4 * _eps(d2.dtype)), jnp.ones_like(a))


def _shrink(theta, a):
    c = jnp.mean(theta, axis=0, keepdims=True)
    return jnp.where(a < 1, c + a * (theta - c), theta)


# ----------------------------------------------------------------------------------------------
# The dual method
# ----------------------------------------------------------------------------------------------
class _DualProblem(NamedTuple):
    """The contracted, weighted problem: min 0.5 sum_c w_c ||theta_c - b_c / w_c||^2 s.t. K."""
    w: jax.Array          # [n] node weights (component size at representatives, 1 at dummies)
    b: jax.Array          # [n, d] w_c * (component mean), 0 at dummy slots (centred data)
    rep: jax.Array        # [n] bool, slot is a component representative
    rc: jax.Array         # [n, n] contracted radii (min over member pairs), +inf where no edge
    edge: jax.Array       # [n, n] bool, finite contracted edges between representatives
    y: jax.Array          # [n, k] iteration factor, y y^T = b b^T (y = b if d <= n, else n x n)
    sy: jax.Array         # sum_c ||b_c||^2 / w_c
    c0: jax.Array         # 0.5 sum_i ||z_i - mean of its component||^2 (constant of P)
    scale: jax.Array      # 0.5 ||z - mean(z)||^2 (for relative tolerances)


class _DualEval(NamedTuple):
    value: jax.Array      # g(mu)
    grad: jax.Array       # [n, n] dg/dmu_e = c_e = (d2_e - r_e) / 2 on edges, 0 elsewhere
    d2: jax.Array         # [n, n] squared distances of Theta(mu)
    f: jax.Array          # primal objective at Theta(mu) (contracted, without c0)
    sum_wk: jax.Array     # sum_c w_c ||theta_c||^2
    tr_xy: jax.Array      # sum_c <theta_c, b_c>
    chol: jax.Array       # Cholesky factor of W + L_mu


class DualState(NamedTuple):
    """State of the projected L-BFGS iteration on the dual (fixed shapes)."""
    iteration: jax.Array
    mu: jax.Array           # [n, n] symmetric multipliers (contracted problem)
    ev: _DualEval
    hinv: jax.Array         # [n, n] inverse diagonal of -Hessian (L-BFGS initial matrix)
    s_hist: jax.Array       # [m, n, n]
    y_hist: jax.Array       # [m, n, n]  (y = -(grad_new - grad_old): curvature of -g)
    norm_hist: jax.Array    # [m] ||s|| ||y|| (full space)
    n_hist: jax.Array       # number of stored pairs (<= m)
    head: jax.Array         # slot of the newest pair
    gap: jax.Array          # relative certified gap at mu
    best_mu: jax.Array
    best_gap: jax.Array
    stalled: jax.Array      # bool: line search failed with the plain scaled-gradient direction
    evaluations: jax.Array  # number of dual evaluations (factorisations) so far
    last_progress: jax.Array  # iteration at which best_gap last dropped by >= 1%


def _gram_factor(b):
    """``[n, n]`` Y with ``Y Y^T = b b^T`` (eigendecomposition of the Gram matrix).

    For ``d > n`` the dual only needs the Gram matrix ``G = B B^T`` (``O(n^2 d)``, once); its
    square-root factor makes every later step independent of ``d``. ``Y = B Q`` for an orthonormal
    ``Q``, so distances, inner products with ``B`` and the objective are preserved.
    """
    lam, u = jnp.linalg.eigh(b @ b.T)
    return u * jnp.sqrt(jnp.maximum(lam, 0.0))[None, :]


def _dual_problem(prep: _Prepared) -> _DualProblem:
    z = prep.zc
    n, d = z.shape
    dtype = z.dtype
    idx = jnp.arange(n)
    rep = prep.labels == idx
    w = jnp.where(rep, prep.counts, 1.0).astype(dtype)
    b = _segment_sum_rows(z, prep.labels, n)                   # zero rows at dummy slots
    # contracted radii: rc[c, c'] = min over members i of c, j of c' of r_ij
    rr = jax.ops.segment_min(prep.r, prep.labels, num_segments=n)
    rc = jax.ops.segment_min(rr.T, prep.labels, num_segments=n).T
    offdiag = ~jnp.eye(n, dtype=bool)
    edge = rep[:, None] & rep[None, :] & offdiag & jnp.isfinite(rc)
    rc = jnp.where(edge, rc, jnp.inf)
    y = _gram_factor(b) if d > n else b
    sy = jnp.sum(jnp.sum(y * y, axis=1) / w)
    c0 = 0.5 * jnp.sum((z - prep.zavg) ** 2)
    scale = 0.5 * jnp.sum(z * z)
    return _DualProblem(w, b, rep, rc, edge, y, sy, c0, scale)


def _laplacian_system(w, mu):
    return jnp.diag(w + jnp.sum(mu, axis=1)) - mu


def _dual_eval(prob: _DualProblem, mu) -> _DualEval:
    """Dual value, gradient and the primal quantities at ``Theta(mu) = (W + L_mu)^{-1} Y``.

    One Cholesky factorisation (``n^3 / 3``), one solve with ``k = min(n, d)`` right-hand sides
    and one ``n x n x k`` product for the pairwise distances.
    """
    A = _laplacian_system(prob.w, mu)
    chol = jnp.linalg.cholesky(A)
    X = cho_solve((chol, True), prob.y)                   # Theta(mu) in Y coordinates
    K = X @ X.T
    dk = jnp.sum(X * X, axis=1)
    tr_xy = jnp.sum(X * prob.y)
    sum_wk = jnp.sum(prob.w * dk)
    f = 0.5 * jnp.sum(prob.w[:, None] * (X - prob.y / prob.w[:, None]) ** 2)
    d2 = jnp.maximum(dk[:, None] + dk[None, :] - 2.0 * K, 0.0)
    r = jnp.where(prob.edge, prob.rc, 0.0)
    grad = jnp.where(prob.edge, 0.5 * (d2 - r), 0.0)
    value = f + 0.5 * jnp.sum(mu * grad)                  # g(mu) = L(Theta(mu), mu)
    return _DualEval(value, grad, d2, f, sum_wk, tr_xy, chol)


def _dual_gap(prob: _DualProblem, mu, ev: _DualEval):
    """Relative certified gap (f(a Theta) + c0 - g(mu)) / (f(a Theta) + c0), a = shrink factor."""
    dtype = mu.dtype
    r = jnp.where(prob.edge, prob.rc, 1.0)
    ratio2 = jnp.where(prob.edge & (ev.d2 > r), r / jnp.where(ev.d2 > 0, ev.d2, 1.0), 1.0)
    a = jnp.sqrt(jnp.min(ratio2, initial=1.0))
    # f(a Theta) - f(Theta) = (a - 1) (0.5 (a + 1) sum_w ||theta||^2 - <Theta, B>); the centroid
    # (weighted) of Theta(mu) is that of Z, i.e. 0 after centring, so a Theta is the restoration.
    restore_cost = (a - 1.0) * (0.5 * (a + 1.0) * ev.sum_wk - ev.tr_xy)
    gap = restore_cost - 0.5 * jnp.sum(mu * ev.grad)      # f(a Theta) - g(mu)
    full = ev.f + restore_cost + prob.c0
    denom = jnp.maximum(full, 1e3 * _eps(dtype) * prob.scale) + _tiny(dtype)
    return jnp.maximum(gap, 0.0) / denom


def _dual_hinv(prob: _DualProblem, ev: _DualEval):
    """Inverse of the exact diagonal of ``-Hessian(g)``: ``1 / ((a_e^T M a_e) d_e^2)``."""
    n = ev.d2.shape[0]
    M = cho_solve((ev.chol, True), jnp.eye(n, dtype=ev.d2.dtype))
    dm = jnp.diag(M)
    p = jnp.maximum(dm[:, None] + dm[None, :] - M - M.T, 0.0)   # a_e^T M a_e
    rmean = jnp.sum(jnp.where(prob.edge, prob.rc, 0.0)) / jnp.maximum(jnp.sum(prob.edge), 1)
    floor = 1e-12 * rmean + _tiny(ev.d2.dtype)
    h = p * jnp.maximum(ev.d2, floor)
    return jnp.where(prob.edge, 1.0 / jnp.maximum(h, _tiny(h.dtype) * 1e10), 0.0)


def _two_loop(q, s_hist, y_hist, norm_hist, n_hist, head, h0, free):
    """L-BFGS two-loop recursion restricted to the ``free`` edges (symmetric storage).

    Returns ``H_F q`` where ``H_F`` is the limited-memory inverse-Hessian approximation of
    ``-g`` *on the free subspace*: every stored pair ``(s, y)`` is masked to the free edges (pairs
    with ``<s_F, y_F>`` not safely positive are skipped) and the initial matrix is
    ``gamma diag(h0)``, ``gamma = s_F'y_F / y_F' diag(h0) y_F`` of the newest pair.
    ``norm_hist[k] = ||s_k|| ||y_k||`` (full space) sets the positivity threshold. The history is
    stored in ``s_hist.dtype`` (float32: it only shapes a search direction, and the recursion is
    memory-bound for large n); ``q`` is cast to it and the result back to ``q.dtype``.
    """
    m = s_hist.shape[0]
    out_dtype = q.dtype
    dt = s_hist.dtype
    q = q.astype(dt)
    h0 = h0.astype(dt)
    fm = free.astype(dt)

    def first(i, carry):
        q, alphas, rhos = carry
        k = (head - i) % m
        yf = y_hist[k] * fm
        s = s_hist[k]
        sy = jnp.sum(s * yf)
        ok = (i < n_hist) & (sy > 1e-6 * norm_hist[k])
        rho = jnp.where(ok, 1.0 / jnp.where(ok, sy, 1.0), 0.0)
        alpha = rho * jnp.sum(s * q)                   # q is supported on the free edges
        return q - alpha * yf, alphas.at[k].set(alpha), rhos.at[k].set(rho)

    zeros = jnp.zeros((m,), dt)
    q, alphas, rhos = lax.fori_loop(0, m, first, (q, zeros, zeros))
    yf = y_hist[head] * fm
    gamma = rhos[head] * jnp.sum(yf * h0 * yf)
    gamma = jnp.where((rhos[head] > 0) & (gamma > 0) & jnp.isfinite(gamma),
                      1.0 / jnp.where(gamma > 0, gamma, 1.0), 1.0)
    r = gamma * h0 * q

    def second(i, r):
        k = (head - (m - 1 - i)) % m
        beta = rhos[k] * jnp.sum(y_hist[k] * r)        # r is supported on the free edges
        return r + (s_hist[k] * fm) * (alphas[k] - beta)

    return lax.fori_loop(0, m, second, r).astype(out_dtype)


def _dual_loop(prob: _DualProblem, mu0, tol, max_iterations: int, memory: int):
    n = mu0.shape[0]
    dtype = mu0.dtype
    eps = _eps(dtype)
    ev0 = _dual_eval(prob, mu0)
    gap0 = _dual_gap(prob, mu0, ev0)
    state = DualState(
        iteration=jnp.array(0, jnp.int32), mu=mu0, ev=ev0, hinv=_dual_hinv(prob, ev0),
        s_hist=jnp.zeros((memory, n, n), _HISTORY_DTYPE),
        y_hist=jnp.zeros((memory, n, n), _HISTORY_DTYPE),
        norm_hist=jnp.zeros((memory,), dtype),
        n_hist=jnp.array(0, jnp.int32), head=jnp.array(memory - 1, jnp.int32),
        gap=gap0, best_mu=mu0, best_gap=gap0, stalled=jnp.array(False),
        evaluations=jnp.array(1, jnp.int32), last_progress=jnp.array(0, jnp.int32))

    def cond(s: DualState):
        stagnated = s.iteration - s.last_progress > _STAGNATION
        return (s.iteration < max_iterations) & (s.best_gap > tol) & ~s.stalled & ~stagnated

    def body(s: DualState):
        mu, ev, hinv = s.mu, s.ev, s.hinv
        grad = ev.grad
        # Bertsekas' epsilon-active set: multipliers (almost) at 0 whose gradient points outside.
        step = jnp.where(prob.edge, mu - jnp.maximum(mu + hinv * grad, 0.0), 0.0)
        eps_k = jnp.minimum(jnp.max(jnp.abs(step)), 1e-3)
        free = prob.edge & ~((mu <= eps_k) & (grad < 0))
        qn = _two_loop(jnp.where(free, grad, 0.0), s.s_hist, s.y_hist, s.norm_hist, s.n_hist,
                       s.head, hinv, free)
        direction = jnp.where(free, qn, hinv * grad)
        gradient_dir = hinv * grad
        slope = jnp.sum(grad * direction)
        use_grad = ~(slope > 0) | ~jnp.isfinite(slope) | (s.n_hist == 0)
        direction = jnp.where(use_grad, gradient_dir, direction)
        slack = 64 * eps * (jnp.abs(ev.value) + 0.5 * prob.sy)

        def trial(t):
            mu_t = jnp.where(prob.edge, jnp.maximum(mu + t * direction, 0.0), 0.0)
            return mu_t, _dual_eval(prob, mu_t)

        def armijo(mu_t, ev_t):
            gain = 0.5 * jnp.sum(grad * (mu_t - mu))
            return ev_t.value >= ev.value + _ARMIJO * gain - slack

        def ls_cond(c):
            t, mu_t, ev_t, k = c
            return (k == 0) | (~armijo(mu_t, ev_t) & (k <= _MAX_LINE_SEARCH))

        def ls_body(c):
            t, mu_t, ev_t, k = c
            # first trial t = 1; then safeguarded quadratic interpolation of phi(t) = g(mu(t))
            # along the arc: phi ~ phi(0) + slope t - curv t^2, maximiser slope / (2 curv),
            # kept in [t/10, t/2]
            slope = 0.5 * jnp.sum(grad * (mu_t - mu)) / t
            curv = (ev.value + slope * t - ev_t.value) / (t * t)
            t_q = slope / jnp.maximum(2.0 * curv, _tiny(dtype))
            t_new = jnp.where(jnp.isfinite(t_q) & (curv > 0), jnp.clip(t_q, 0.1 * t, 0.5 * t),
                              0.5 * t)
            t_new = jnp.where(k == 0, jnp.ones_like(t), t_new)
            mu_t, ev_t = trial(t_new)
            return t_new, mu_t, ev_t, k + 1

        # the carry starts with the current point as a placeholder (replaced by the t = 1 trial)
        t, mu_t, ev_t, k = lax.while_loop(ls_cond, ls_body,
                                          (jnp.asarray(1.0, dtype), mu, ev, jnp.array(0)))
        k = k - 1
        accepted = armijo(mu_t, ev_t)
        stalled = ~accepted & use_grad
        # a failed quasi-Newton search: keep the iterate, drop the memory (gradient step next)
        mu_new, ev_new = lax.cond(accepted, lambda: (mu_t, ev_t), lambda: (mu, ev))
        sv = mu_new - mu
        yv = -(ev_new.grad - grad)
        sy = jnp.sum(sv * yv)
        snorm, ynorm = jnp.sqrt(jnp.sum(sv * sv)), jnp.sqrt(jnp.sum(yv * yv))
        store = accepted & (sy > 1e-10 * snorm * ynorm)
        head = jnp.where(store, (s.head + 1) % memory, s.head)
        s_hist = s.s_hist.at[head].set(jnp.where(store, sv.astype(_HISTORY_DTYPE), s.s_hist[head]))
        y_hist = s.y_hist.at[head].set(jnp.where(store, yv.astype(_HISTORY_DTYPE), s.y_hist[head]))
        norm_hist = s.norm_hist.at[head].set(jnp.where(store, snorm * ynorm, s.norm_hist[head]))
        n_hist = jnp.where(accepted, jnp.minimum(s.n_hist + store.astype(jnp.int32), memory), 0)
        refresh = accepted & ((s.iteration + 1) % _HINV_REFRESH == 0)
        hinv_new = lax.cond(refresh, lambda: _dual_hinv(prob, ev_new), lambda: hinv)
        gap = _dual_gap(prob, mu_new, ev_new)
        better = gap < s.best_gap
        progress = gap < 0.99 * s.best_gap
        best_mu = lax.cond(better, lambda: mu_new, lambda: s.best_mu)
        return DualState(s.iteration + 1, mu_new, ev_new, hinv_new, s_hist, y_hist, norm_hist,
                         n_hist, head, gap, best_mu, jnp.where(better, gap, s.best_gap), stalled,
                         s.evaluations + 1 + k.astype(jnp.int32),
                         jnp.where(progress, s.iteration + 1, s.last_progress))

    return lax.while_loop(cond, body, state)


def _expand_multipliers(prep: _Prepared, prob: _DualProblem, mu_c):
    """Spread contracted multipliers over the original pairs attaining the contracted radius."""
    n = mu_c.shape[0]
    li, lj = prep.labels[:, None], prep.labels[None, :]
    rc_full = prob.rc[li, lj]
    hit = (prep.r == rc_full) & jnp.isfinite(prep.r) & (li != lj)
    hitf = hit.astype(mu_c.dtype)
    cnt = jax.ops.segment_sum(jax.ops.segment_sum(hitf, prep.labels, n).T, prep.labels, n).T
    return jnp.where(hit, mu_c[li, lj] / jnp.maximum(cnt[li, lj], 1.0), 0.0)


def _contract_multipliers(prep: _Prepared, prob: _DualProblem, mu):
    n = mu.shape[0]
    mu = jnp.maximum(0.5 * (mu + mu.T), 0.0)
    mc = jax.ops.segment_sum(jax.ops.segment_sum(mu, prep.labels, n).T, prep.labels, n).T
    return jnp.where(prob.edge, mc, 0.0)


def _effective_tol(tol, dtype):
    """``tol`` clipped below at 64 ulp of the working precision (float32: ~7.6e-6)."""
    return jnp.maximum(jnp.asarray(tol, dtype), 64 * _eps(dtype))


def _dual(prep: _Prepared, tol, max_iterations: int, mu_init=None,
          memory: int = _LBFGS_MEMORY) -> SolverOutput:
    n, d = prep.zc.shape
    tol = _effective_tol(tol, prep.zc.dtype)
    prob = _dual_problem(prep)
    if mu_init is None:
        mu0 = jnp.zeros((n, n), prep.zc.dtype)
    else:
        mu0 = _contract_multipliers(prep, prob, mu_init.astype(prep.zc.dtype))
    st = _dual_loop(prob, mu0, tol, max_iterations, memory)
    A = _laplacian_system(prob.w, st.best_mu)
    theta_c = cho_solve((jnp.linalg.cholesky(A), True), prob.b)      # M B, the only O(n^2 d) step
    theta = theta_c[prep.labels] + prep.shift
    mu = _expand_multipliers(prep, prob, st.best_mu)
    return SolverOutput(theta, mu, st.iteration, st.best_gap, st.best_gap <= tol)


# ----------------------------------------------------------------------------------------------
# ADMM
# ----------------------------------------------------------------------------------------------
class AdmmState(NamedTuple):
    iteration: jax.Array
    theta: jax.Array        # [n, k] (centred)
    u: jax.Array            # [m, k] scaled duals (the only edge array kept between iterations)
    dtv: jax.Array          # [n, k] D^T v of the last edge variables v
    dtu: jax.Array          # [n, k] D^T u
    beta: jax.Array
    primal_rel: jax.Array
    dual_rel: jax.Array


def _edges(n):
    i, j = np.triu_indices(n, 1)
    return jnp.asarray(i, jnp.int32), jnp.asarray(j, jnp.int32)


def _incidence_t(w, i, j, n):
    """``D^T w``: row ``k`` gets ``sum_{e=(k,.)} w_e - sum_{e=(.,k)} w_e``."""
    return jax.ops.segment_sum(w, i, num_segments=n) - jax.ops.segment_sum(w, j, num_segments=n)


def _ball(v, rad):
    nrm = jnp.sqrt(jnp.sum(v * v, axis=1))
    scale = jnp.where(nrm > rad, rad / jnp.where(nrm > 0, nrm, 1.0), 1.0)
    return v * scale[:, None]


def _admm(prep: _Prepared, tol, max_iterations: int, beta0=None) -> SolverOutput:
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
    tol = _effective_tol(tol, dtype)
    i, j = _edges(n)
    rad = jnp.sqrt(prep.r[i, j])                 # +inf: unconstrained copy
    tiny = jnp.sqrt(jnp.sum(prep.zc ** 2)) * 1e-14 + _tiny(dtype)
    beta_init = jnp.asarray(1.0 / n if beta0 is None else beta0, dtype)

    def theta_step(dtv, dtu, beta):
        rhs = z + beta * (dtv - dtu)
        return (rhs + beta * jnp.sum(rhs, axis=0, keepdims=True)) / (1.0 + beta * n)

    m = i.shape[0]
    v0 = _ball(z[i] - z[j], rad)
    state = AdmmState(jnp.array(0, jnp.int32), z, jnp.zeros((m, d), dtype),
                      _incidence_t(v0, i, j, n), jnp.zeros((n, d), dtype), beta_init,
                      jnp.asarray(jnp.inf, dtype), jnp.asarray(jnp.inf, dtype))

    def cond(s):
        return (s.iteration < max_iterations) & ~((s.primal_rel <= tol) & (s.dual_rel <= tol))

    def body(s):
        theta = theta_step(s.dtv, s.dtu, s.beta)
        dth = theta[i] - theta[j]
        p = dth + s.u
        v = _ball(p, rad)
        u = p - v                                  # = u_old + D Theta - v
        dtv = _incidence_t(v, i, j, n)
        dtu = _incidence_t(u, i, j, n)
        r_pri = jnp.sqrt(jnp.sum((u - s.u) ** 2))  # ||D Theta - v||
        r_dual = s.beta * jnp.sqrt(jnp.sum((dtv - s.dtv) ** 2))
        pri_rel = r_pri / (jnp.maximum(jnp.sqrt(jnp.sum(dth ** 2)), jnp.sqrt(jnp.sum(v ** 2)))
                           + tiny)
        dual_rel = r_dual / (s.beta * jnp.sqrt(jnp.sum(dtu ** 2)) + tiny)
        it = s.iteration + 1
        balance = (it % _BALANCE_EVERY) == 0
        up = balance & (pri_rel > 10 * dual_rel)
        down = balance & (dual_rel > 10 * pri_rel)
        factor = jnp.where(up, 2.0, jnp.where(down, 0.5, 1.0)).astype(dtype)
        return AdmmState(it, theta, u / factor, dtv, dtu / factor, s.beta * factor, pri_rel,
                         dual_rel)

    st = lax.while_loop(cond, body, state)
    r_e = prep.r[i, j]
    pos = jnp.isfinite(r_e) & (r_e > 0)
    u_norm = jnp.sqrt(jnp.sum(st.u * st.u, axis=1))
    mu_e = jnp.where(pos, st.beta * u_norm / jnp.sqrt(jnp.where(pos, r_e, 1.0)), 0.0)
    mu = jnp.zeros((n, n), dtype).at[i, j].set(mu_e)
    mu = mu + mu.T
    converged = (st.primal_rel <= tol) & (st.dual_rel <= tol)
    return SolverOutput(st.theta + prep.shift, mu, st.iteration, st.dual_rel, converged)


# ----------------------------------------------------------------------------------------------
# Parallel Dykstra
# ----------------------------------------------------------------------------------------------
class DykstraState(NamedTuple):
    iteration: jax.Array
    theta: jax.Array        # [n, d] (centred); invariant: theta = z - D^T (kappa * q)
    q: jax.Array            # [m, d] per-edge corrections
    stationarity: jax.Array
    violation: jax.Array


def _dykstra(prep: _Prepared, tol, max_iterations: int) -> SolverOutput:
    z = prep.zavg
    n, d = z.shape
    dtype = z.dtype
    tol = _effective_tol(tol, dtype)
    i, j = _edges(n)
    r_e = prep.r[i, j]
    active = jnp.isfinite(r_e)
    pos = active & (r_e > 0)
    rad = jnp.sqrt(jnp.where(active, r_e, 0.0))
    deg = (jax.ops.segment_sum(active.astype(dtype), i, num_segments=n)
           + jax.ops.segment_sum(active.astype(dtype), j, num_segments=n))
    omega = jnp.where(deg > 0, 1.0 / jnp.maximum(deg, 1.0), 0.0)
    kappa = jnp.where(active, omega[i] * omega[j] / jnp.maximum(omega[i] + omega[j], _tiny(dtype)),
                      0.0)
    znorm = jnp.sqrt(jnp.sum(prep.zc ** 2)) + _tiny(dtype)
    spread = 2.0 * jnp.sum(prep.zc ** 2) / n + _tiny(dtype)
    state = DykstraState(jnp.array(0, jnp.int32), z, jnp.zeros((i.shape[0], d), dtype),
                         jnp.asarray(jnp.inf, dtype), jnp.asarray(jnp.inf, dtype))

    def residuals(theta, q, diff):
        # multiplier estimate mu_e = kappa_e ||q_e|| / sqrt(r_e) (at a fixed point
        # kappa_e q_e = mu_e (theta_i - theta_j)); stationarity P_S(Theta - Z + L_mu Theta).
        qn = jnp.sqrt(jnp.sum(q * q, axis=1))
        mu = jnp.where(pos, kappa * qn / jnp.where(pos, rad, 1.0), 0.0)
        res = theta - z + _incidence_t(mu[:, None] * diff, i, j, n)
        res = _segment_sum_rows(res, prep.labels, n)          # P_S (component sums)
        viol = jnp.max(jnp.where(active, jnp.sum(diff * diff, axis=1) - rad ** 2, 0.0),
                       initial=0.0)
        return jnp.sqrt(jnp.sum(res * res)) / znorm, jnp.maximum(viol, 0.0) / spread, mu

    def cond(s):
        return (s.iteration < max_iterations) & ~((s.stationarity <= tol) & (s.violation <= tol))

    def body(s):
        diff = s.theta[i] - s.theta[j]
        delta = diff + s.q
        nrm = jnp.sqrt(jnp.sum(delta * delta, axis=1))
        shrink = jnp.where(active & (nrm > rad), 1.0 - rad / jnp.where(nrm > 0, nrm, 1.0), 0.0)
        q = shrink[:, None] * delta
        theta = s.theta - _incidence_t(kappa[:, None] * (q - s.q), i, j, n)
        stat, viol, _ = residuals(theta, q, theta[i] - theta[j])
        return DykstraState(s.iteration + 1, theta, q, stat, viol)

    st = lax.while_loop(cond, body, state)
    _, _, mu_e = residuals(st.theta, st.q, st.theta[i] - st.theta[j])
    mu = jnp.zeros((n, n), dtype).at[i, j].set(mu_e)
    mu = mu + mu.T
    converged = (st.stationarity <= tol) & (st.violation <= tol)
    return SolverOutput(st.theta + prep.shift, mu, st.iteration, st.stationarity, converged)


# ----------------------------------------------------------------------------------------------
# Public jitted solvers on [n, d] arrays (no restoration)
# ----------------------------------------------------------------------------------------------
def _as_2d_float(z, name="z"):
    z = jnp.asarray(z)
    if z.ndim != 2:
        raise ValueError(f"`{name}` must be a 2-D [n, d] array here, got shape {z.shape}")
    if not jnp.issubdtype(z.dtype, jnp.floating):
        z = z.astype(jnp.result_type(float))
    return z


@functools.partial(jax.jit, static_argnames=("max_iterations", "memory"))
def _solve_dual_jit(z, r, tol, initial_multipliers, max_iterations, memory):
    prep = _prepare(z, r)
    return _dual(prep, tol, max_iterations, initial_multipliers, memory)


def solve_dual(z, r, *, tol=1e-8, max_iterations: int = DEFAULT_MAX_ITERATIONS["dual"],
               initial_multipliers=None, memory: int = _LBFGS_MEMORY) -> SolverOutput:
    """Dual projected L-BFGS solver on an ``[n, d]`` array (see the module docstring).

    ``initial_multipliers`` (``[n, n]``, e.g. the previous round's ``multipliers``) warm-starts
    the dual. Returns the raw :class:`SolverOutput` (no feasibility restoration).
    """
    z = _as_2d_float(z)
    r = jnp.asarray(r, z.dtype)
    _validate_common(z.shape[0], r, tol, max_iterations, initial_multipliers)
    mu0 = None if initial_multipliers is None else jnp.asarray(initial_multipliers, z.dtype)
    return _solve_dual_jit(z, r, jnp.asarray(tol, z.dtype), mu0, int(max_iterations), int(memory))


@functools.partial(jax.jit, static_argnames=("max_iterations",))
def _solve_admm_jit(z, r, tol, max_iterations):
    return _solve_reduced(lambda p: _admm(p, tol, max_iterations), _prepare(z, r))


def solve_admm(z, r, *, tol=1e-8,
               max_iterations: int = DEFAULT_MAX_ITERATIONS["admm"]) -> SolverOutput:
    """ADMM solver on an ``[n, d]`` array (memory ``O(n^2 min(n, d))``; see the module
    docstring)."""
    z = _as_2d_float(z)
    r = jnp.asarray(r, z.dtype)
    _validate_common(z.shape[0], r, tol, max_iterations, None)
    return _solve_admm_jit(z, r, jnp.asarray(tol, z.dtype), int(max_iterations))


@functools.partial(jax.jit, static_argnames=("max_iterations",))
def _solve_dykstra_jit(z, r, tol, max_iterations):
    return _solve_reduced(lambda p: _dykstra(p, tol, max_iterations), _prepare(z, r))


def solve_dykstra(z, r, *, tol=1e-8,
                  max_iterations: int = DEFAULT_MAX_ITERATIONS["dykstra"]) -> SolverOutput:
    """Parallel (product-space) Dykstra solver on an ``[n, d]`` array (memory
    ``O(n^2 min(n, d))``)."""
    z = _as_2d_float(z)
    r = jnp.asarray(r, z.dtype)
    _validate_common(z.shape[0], r, tol, max_iterations, None)
    return _solve_dykstra_jit(z, r, jnp.asarray(tol, z.dtype), int(max_iterations))


def shrink_to_feasible(theta, r):
    """Feasibility restoration of an ``[n, d]`` array: ``(theta_feasible, a)``.

    Averages the rows of every zero-radius component, then shrinks all rows toward their
    centroid by ``a = min(1, min_{r_ij > 0} sqrt(r_ij) / ||theta_i - theta_j||)``.
    """
    theta = _as_2d_float(theta, "theta")
    r = jnp.asarray(r, theta.dtype)
    _validate_common(theta.shape[0], r, 1.0, 1, None)
    return _shrink_to_feasible_jit(theta, r)


@jax.jit
def _shrink_to_feasible_jit(theta, r):
    r = _sanitize_r(r)
    labels = _zero_components(r)
    counts = _segment_sum_rows(jnp.ones((theta.shape[0],), theta.dtype), labels, theta.shape[0])
    avg = _average_components(theta, labels, counts)
    a = _shrink_factor(pairwise_sq_distances(avg), r)
    return _shrink(avg, a), a


# ----------------------------------------------------------------------------------------------
# The public entry point
# ----------------------------------------------------------------------------------------------
_SOLVERS = {
    "dual": lambda prep, tol, it, mu0: _dual(prep, tol, it, mu0),
    "admm": lambda prep, tol, it, mu0: _solve_reduced(lambda p: _admm(p, tol, it), prep),
    "dykstra": lambda prep, tol, it, mu0: _solve_reduced(lambda p: _dykstra(p, tol, it), prep),
}


def _input_feasible(prep: _Prepared, d2):
    """Exactly feasible input: members of zero components identical, other radii respected."""
    same = jnp.all(prep.z == prep.z[prep.labels])
    pos = jnp.isfinite(prep.r) & (prep.r > 0)
    ok = jnp.all(jnp.where(pos, d2 <= prep.r, True))
    return same & ok


@functools.partial(jax.jit, static_argnames=("method", "max_iterations", "restore"))
def _project_2d(z, r, tol, mu0, method: str, max_iterations: int, restore: bool):
    n = z.shape[0]
    prep = _prepare(z, r)
    feasible = _input_feasible(prep, pairwise_sq_distances(z))

    def trivial():
        return SolverOutput(z, jnp.zeros((n, n), z.dtype), jnp.array(0, jnp.int32),
                            jnp.zeros((), z.dtype), jnp.array(True))

    def solve():
        return _SOLVERS[method](prep, tol, max_iterations, mu0)

    out = lax.cond(feasible, trivial, solve)
    d2 = pairwise_sq_distances(out.theta)
    primal = _max_violation(d2, prep.r)
    if method == "dual":
        avg, d2_avg = out.theta, d2          # components already coincide
    else:
        avg = _average_components(out.theta, prep.labels, prep.counts)
        d2_avg = pairwise_sq_distances(avg)
    a = _shrink_factor(d2_avg, prep.r)
    if restore:
        theta = jnp.where(feasible, z, _shrink(avg, a))
    else:
        theta = out.theta
    a = jnp.where(feasible, jnp.ones_like(a), a)
    return PairwiseProjectionOutput(theta, out.iterations, primal, out.residual,
                                    out.converged, a, out.multipliers)


def project_pairwise(z, r, *, method: str = "dual", tol=1e-8,
                     max_iterations: Optional[int] = None, restore_feasibility: bool = True,
                     initial_multipliers=None) -> PairwiseProjectionOutput:
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
      TypeError / ValueError naming the argument for malformed inputs (values are checked only
      when concrete; shapes always).
    """
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}, got {method!r}")
    if max_iterations is None:
        max_iterations = DEFAULT_MAX_ITERATIONS[method]
    if not isinstance(restore_feasibility, (bool, np.bool_)):
        raise TypeError(f"`restore_feasibility` must be a bool, got {restore_feasibility!r}")
    if initial_multipliers is not None and method != "dual":
        raise ValueError(f"`initial_multipliers` is only used by method='dual', got method="
                         f"{method!r}")
    flat, unflatten = _flatten_clients(z)
    n = flat.shape[0]
    r = _as_matrix(r, flat.dtype)
    _validate_common(n, r, tol, max_iterations, initial_multipliers)
    mu0 = None if initial_multipliers is None else jnp.asarray(initial_multipliers, flat.dtype)
    out = _project_2d(flat, r, jnp.asarray(tol, flat.dtype), mu0, method, int(max_iterations),
                      bool(restore_feasibility))
    return out._replace(theta=unflatten(out.theta))


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
    t2, _ = _flatten_clients(theta, "theta")
    z2, _ = _flatten_clients(z, "z")
    if t2.shape != z2.shape:
        raise ValueError(f"`theta` and `z` must have the same shape, got {t2.shape} and "
                         f"{z2.shape}")
    dtype = jnp.result_type(t2.dtype, z2.dtype)
    n = t2.shape[0]
    r = _as_matrix(r, dtype)
    mu = _as_matrix(mu, dtype, name="mu")
    _validate_common(n, r, 1.0, 1, mu)
    return _kkt_jit(t2.astype(dtype), z2.astype(dtype), r, mu)


@jax.jit
def _kkt_jit(theta, z, r, mu):
    n = theta.shape[0]
    r = _sanitize_r(r)
    labels = _zero_components(r)
    pos = jnp.isfinite(r) & (r > 0)
    mu = jnp.where(pos, 0.5 * (mu + mu.T), 0.0)
    d2 = pairwise_sq_distances(theta)
    lap = jnp.diag(jnp.sum(mu, axis=1)) - mu
    stat = _segment_sum_rows(theta - z + lap @ theta, labels, n)
    zc = z - jnp.mean(z, axis=0)
    znorm = jnp.sqrt(jnp.sum(zc * zc)) + _tiny(z.dtype)
    spread = jnp.sum(zc * zc) / n + _tiny(z.dtype)
    comp = jnp.max(jnp.abs(mu * jnp.where(pos, d2 - jnp.where(pos, r, 0.0), 0.0)))
    return KKTResiduals(_max_violation(d2, r), jnp.sqrt(jnp.sum(stat * stat)) / znorm,
                        comp / spread, jnp.maximum(jnp.max(-mu), 0.0))


# ----------------------------------------------------------------------------------------------
# Validation and pytree flattening
# ----------------------------------------------------------------------------------------------
def _flatten_clients(z, name="z"):
    """``([n, D] array, unflatten)`` with every leaf raveled per client."""
    leaves, treedef = jax.tree.flatten(z)
    if not leaves:
        raise ValueError(f"`{name}` must be an array or a pytree with at least one array leaf")
    arrays = []
    for leaf in leaves:
        try:
            arr = jnp.asarray(leaf)
        except TypeError as e:
            raise TypeError(f"`{name}` leaves must be numeric arrays, got "
                            f"{type(leaf).__name__}") from e
        if not (jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)
                or arr.dtype == jnp.bool_):
            raise TypeError(f"`{name}` leaves must be real floating-point arrays, got dtype "
                            f"{arr.dtype}")
        if arr.ndim == 0:
            raise ValueError(f"`{name}` leaves must have a leading client axis, got a scalar")
        arrays.append(arr)
    n = arrays[0].shape[0]
    for arr in arrays:
        if arr.shape[0] != n:
            raise ValueError(f"all leaves of `{name}` must share the leading client axis, got "
                             f"sizes {sorted({a.shape[0] for a in arrays})}")
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
            piece = x[:, start:start + size].reshape(shape)
            out.append(piece.astype(dt) if jnp.issubdtype(dt, jnp.floating) else piece)
            start += size
        return jax.tree.unflatten(treedef, out)

    return flat, unflatten


def _as_matrix(r, dtype, name="r"):
    try:
        arr = jnp.asarray(r)
    except TypeError as e:
        raise TypeError(f"`{name}` must be a numeric [n, n] matrix, got "
                        f"{type(r).__name__}") from e
    if not (jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)):
        raise TypeError(f"`{name}` must be a real numeric [n, n] matrix, got dtype {arr.dtype}")
    return arr.astype(dtype)


def _validate_common(n, r, tol, max_iterations, mu):
    if r.ndim != 2 or r.shape[0] != r.shape[1]:
        raise ValueError(f"`r` must be a square [n, n] matrix, got shape {tuple(r.shape)}")
    if r.shape[0] != n:
        raise ValueError(f"`r` is {r.shape[0]} x {r.shape[1]} but `z` has n = {n} clients")
    if isinstance(max_iterations, bool) or not isinstance(max_iterations, (int, np.integer)) \
            or max_iterations < 1:
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
            raise ValueError(f"`r` must be nonnegative off the diagonal, got minimum "
                             f"{rc[off].min()!r}")
        both_inf = np.isinf(rc) & np.isinf(rc.T)
        with np.errstate(invalid="ignore"):
            close = np.isclose(rc, rc.T, rtol=1e-9, atol=0.0) | both_inf
        if not close[off].all():
            raise ValueError("`r` must be symmetric (r_ij == r_ji)")
    if mu is not None:
        mu = jnp.asarray(mu)
        if mu.shape != (n, n):
            raise ValueError(f"`initial_multipliers` / `mu` must have shape ({n}, {n}), got "
                             f"{tuple(mu.shape)}")
        mc = _concrete_or_none(mu)
        if mc is not None and (np.isnan(mc).any() or (mc < 0).any()):
            raise ValueError("`initial_multipliers` / `mu` must be nonnegative and not NaN")
