"""Exact projections and dual prox steps for distributionally robust federated learning.

The dual variable of the DRO problem of SCAFF-PD (Yu, Karimireddy, Ma, Jordan, "Scaff-PD:
Communication Efficient Fair and Robust Federated Learning", eq. (1.1))

    min_x max_{lambda in Lambda}  sum_i lambda_i f_i(x) - psi(lambda)

is updated (Algorithm 1, eq. (4.1), with D(a, b) = ||a - b||^2 / 2) by the dual prox step

    lambda+ = argmin_{lambda in Lambda} psi(lambda) - <s, lambda>
                                       + ||lambda - lambda_r||^2 / (2 sigma)

where ``s`` is the extrapolated loss vector. Every function here is exact (no iterative
approximation beyond a fixed-length, machine-precision 1-D root bracket for q-FFL), jit-able,
works on a 1-D array of length n and can be ``jax.vmap``-ed over leading axes. Parameters
(``cap``, ``sigma``, ``rho``, ``alpha``, ``q``, ``total``) may be traced (e.g. swept with vmap);
when they are concrete Python / NumPy / JAX values they are validated and a ``ValueError``
naming the offending argument is raised.

Projections
-----------
``project_simplex(v, total)``
    Euclidean projection onto {lambda >= 0, sum(lambda) = total}; the classical sort-based
    threshold algorithm (Held et al. 1974; Duchi et al. 2008), O(n log n).
``project_capped_simplex(v, cap, total)``
    Euclidean projection onto {lambda in simplex, lambda_i <= cap} (the CVaR set with
    cap = 1 / (alpha n)). The solution is lambda_i = clip(v_i - tau, 0, cap) where tau solves
    g(tau) = sum_i clip(v_i - tau, 0, cap) = total. g is continuous, non-increasing and
    piecewise linear with breakpoints {v_i} U {v_i - cap}; we sort v once, evaluate g at all 2n
    breakpoints with prefix sums and ``searchsorted`` (O(n log n)), pick the last breakpoint with
    g >= total and then compute tau *in closed form* from the active sets on the next linear
    piece (tau = (sum_{free} v_i + cap |upper| - total) / |free|), so ties and coordinates at the
    cap are handled exactly. Degenerate case n cap == total (alpha = 1): the set is the single
    point total / n, returned exactly.

Dual prox steps (paper, Section 3 "Choosing psi and Lambda")
-----------------------------------------------------------
``prox_chi2(lambda_r, s, sigma, rho)``: psi = (rho / (2n)) sum_i (n lambda_i - 1)^2, Lambda =
    simplex (eq. (3.3); rho = 0 is AFL of Mohri et al. 2019). Expanding,
    psi = (rho n / 2)||lambda||^2 - rho <1, lambda> + rho / 2, so the prox objective is
    (rho n + 1/sigma)/2 ||lambda||^2 - <s + rho 1 + lambda_r / sigma, lambda> + const and

        lambda+ = P_simplex( (lambda_r + sigma s + sigma rho 1) / (1 + sigma rho n) )
                = P_simplex( (lambda_r + sigma s) / (1 + sigma rho n) ),

    the last step because the simplex projection is invariant to adding a multiple of 1.
``prox_cvar(lambda_r, s, sigma, alpha)``: psi = 0, Lambda = {lambda in simplex,
    lambda_i <= 1 / (alpha n)}; lambda+ = P_capped(lambda_r + sigma s, 1 / (alpha n)).
``prox_qffl(lambda_r, s, sigma, q, norm="lp")``: the paper writes psi = ||lambda||^{1 + 1/q},
    Lambda = R^n, and says this "recovers the q-FFL loss of Li et al. (2019)". The norm is not
    specified. We choose, by default, the reading that recovers q-FFL *exactly*:

        psi(lambda) = ||lambda||_p^p = sum_i |lambda_i|^p,    p = 1 + 1/q,

    because its convex conjugate gives max_lambda <lambda, f> - psi(lambda)
    = p^{-q} / (q + 1) * sum_i |f_i|^{q+1}, i.e. the q-FFL objective
    (1/(q+1)) sum_i F_i^{q+1} up to the positive constant p^{-q} (Hoelder duality between the
    p and q+1 norms), with best response lambda_i = sign(f_i) (|f_i| / p)^q. The literal
    Euclidean reading psi = ||lambda||_2^p is available with ``norm="l2"`` (its conjugate is
    p^{-q}/(q+1) ||f||_2^{q+1}, which equals q-FFL only for q = 1).
    The prox is separable (lp) or radial (l2): with z = lambda_r + sigma s,
    lambda+ = sign(z) t (lp, per coordinate, a = |z_i|) or z / ||z|| t (l2, a = ||z||), where
    t in [0, a] is the unique root of t + sigma p t^{p-1} = a (p - 1 = 1/q). The root is
    bracketed in [lo, hi] with hi = min(a, (a/(sigma p))^q), lo = min(a/2, (a/(2 sigma p))^q)
    (so hi/lo <= max(2, 2^q)) and found by a fixed number (96) of geometric bisection steps,
    which reaches machine precision for any q < 2^40. q = 0 is the limit p -> infinity: psi is
    the indicator of the unit l_inf ball (lp; q-FFL with q = 0 is ERM) or of the unit l2 ball
    (l2) and the prox is the projection onto that ball.

The problems themselves (psi, its value, best response and robust objective, with the prox steps
above as their ``prox``) are the objects of :mod:`fedjax_dro.solvers.dro`: ``chi2(rho).prox(lam,
s, sigma)`` is ``prox_chi2(lam, s, sigma, rho)``, and likewise for ``cvar`` and ``qffl``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.solvers.validation import concrete_or_none as _concrete_or_none

_QFFL_BISECTION_STEPS = 96


# --------------------------------------------------------------------------------------------
# validation helpers (only act on concrete values; traced values pass through)
# --------------------------------------------------------------------------------------------
def check_scalar(value, name, ok, requirement, allow_inf=False):
  c = _concrete_or_none(value)
  if c is None:
    return
  if c.ndim != 0:
    raise ValueError(f"`{name}` must be a scalar, got shape {c.shape}")
  if np.isnan(c) or (np.isinf(c) and not (allow_inf and c > 0)):
    raise ValueError(f"`{name}` must be finite, got {c.item()!r}")
  if not ok(c):
    raise ValueError(f"`{name}` must be {requirement}, got {c.item()!r}")


def check_vector(v, name):
  v = jnp.asarray(v)
  if v.ndim != 1:
    raise ValueError(
      f"`{name}` must be a 1-D array (use jax.vmap for batches), got shape {v.shape}"
    )
  if v.shape[0] == 0:
    raise ValueError(f"`{name}` must be non-empty")
  if not jnp.issubdtype(v.dtype, jnp.floating):
    v = v.astype(jnp.result_type(float))
  return v


def _check_same_shape(a, b, name_a, name_b):
  if a.shape != b.shape:
    raise ValueError(
      f"`{name_a}` and `{name_b}` must have the same shape, got {a.shape} and {b.shape}"
    )


def _check_sigma(sigma):
  check_scalar(sigma, "sigma", lambda c: c > 0, "> 0")


# --------------------------------------------------------------------------------------------
# projections
# --------------------------------------------------------------------------------------------
def project_simplex(v, total=1.0):
  """Euclidean projection of a 1-D array onto {lambda >= 0, sum(lambda) = total}.

  Sort-based, O(n log n), exact up to floating-point rounding. Shift invariant:
  project_simplex(v + c) == project_simplex(v). jit / vmap / grad compatible.

  Args:
    v: [n] array.
    total: positive scalar (may be traced).
  Returns:
    [n] array on the simplex of the given total.
  """
  v = check_vector(v, "v")
  check_scalar(total, "total", lambda c: c > 0, "> 0")
  return project_simplex_unchecked(v, jnp.asarray(total, v.dtype))


@jax.jit
def project_simplex_unchecked(v, total):
  n = v.shape[-1]
  v = v - jnp.max(v)  # shift invariance: centring reduces rounding for large offsets
  u = jnp.sort(v)[::-1]
  css = jnp.cumsum(u) - total
  ind = jnp.arange(1, n + 1, dtype=v.dtype)
  cond = u - css / ind > 0
  # cond is a prefix (true for k <= k*); the count is k* (>= 1 always, since u_1 - (u_1 -
  # total) = total > 0).
  k = jnp.maximum(jnp.sum(cond), 1)
  tau = css[k - 1] / k.astype(v.dtype)
  return jnp.maximum(v - tau, 0.0)


def project_capped_simplex(v, cap, total=1.0):
  """Euclidean projection onto {lambda >= 0, sum(lambda) = total, lambda_i <= cap}.

  With total = 1 and cap = 1 / (alpha n) this is the CVaR_alpha uncertainty set of SCAFF-PD.
  Requires n * cap >= total (non-empty set; checked with a relative slack of 1e-12 for
  concrete inputs). Exact sort + breakpoint algorithm, O(n log n); see the module docstring.

  Args:
    v: [n] array.
    cap: upper bound on each coordinate, > 0 (may be traced; +inf gives the simplex).
    total: positive scalar.
  Returns:
    [n] array in the capped simplex.
  """
  v = check_vector(v, "v")
  n = v.shape[0]
  check_scalar(total, "total", lambda c: c > 0, "> 0")
  check_scalar(cap, "cap", lambda c: c > 0, "> 0", allow_inf=True)
  cc, ct = _concrete_or_none(cap), _concrete_or_none(total)
  if cc is not None and ct is not None and cc.ndim == 0 and ct.ndim == 0:
    if cc * n < ct * (1.0 - 1e-12):
      raise ValueError(
        f"`cap` must satisfy cap * n >= total (non-empty capped simplex), got cap={cc!r}, "
        f"n={n}, total={ct!r} (cap * n = {cc * n!r}); for CVaR use alpha in (0, 1]"
      )
  return project_capped_simplex_unchecked(v, jnp.asarray(cap, v.dtype), jnp.asarray(total, v.dtype))


@jax.jit
def project_capped_simplex_unchecked(v, cap, total):
  n = v.shape[-1]
  dtype = v.dtype
  v = v - jnp.max(v)  # shift invariance: centring reduces rounding for large offsets
  finite_cap = jnp.isfinite(cap)
  cap_f = jnp.where(finite_cap, cap, 1.0)  # dummy finite value when cap = inf
  vs = jnp.sort(v)  # ascending
  ws = vs - cap_f  # ascending too (fl(x - c) is monotone in x)
  zero = jnp.zeros((1,), dtype)
  cv = jnp.concatenate([zero, jnp.cumsum(vs)])  # cv[k] = sum of the k smallest v
  bps = jnp.sort(jnp.concatenate([vs, ws]))  # the 2n breakpoints of g

  def pieces(t):
    # iv = #{v_i <= t}, iw = #{v_i - cap <= t}; in sorted order the "free" coordinates
    # (0 < v_i - t < cap) are vs[iv:iw], the coordinates at the cap are vs[iw:].
    iv = jnp.searchsorted(vs, t, side="right")
    iw = jnp.searchsorted(ws, t, side="right")
    iw = jnp.maximum(iw, iv)
    return iv, iw

  def g(t):
    iv, iw = pieces(t)
    n_free = (iw - iv).astype(dtype)
    n_up = (n - iw).astype(dtype)
    return (cv[iw] - cv[iv]) - t * n_free + cap_f * n_up

  gb = g(bps)  # non-increasing in the breakpoint
  k = jnp.clip(jnp.sum(gb >= total) - 1, 0, 2 * n - 2)
  t_lo, t_hi = bps[k], bps[k + 1]
  mid = 0.5 * (t_lo + t_hi)
  iv, iw = pieces(mid)
  n_free = iw - iv
  n_up = (n - iw).astype(dtype)
  tau_free = (cv[iw] - cv[iv] + cap_f * n_up - total) / jnp.maximum(n_free, 1).astype(dtype)
  # n_free == 0: g is constant (= total) on [t_lo, t_hi]; any tau there is optimal.
  tau = jnp.where(n_free > 0, tau_free, t_lo)
  lam = jnp.clip(v - tau, 0.0, cap_f)
  uniform = jnp.full_like(v, total / n)
  lam = jnp.where(n * cap_f <= total, uniform, lam)
  return jnp.where(finite_cap, lam, project_simplex_unchecked(v, total))


# --------------------------------------------------------------------------------------------
# dual prox steps
# --------------------------------------------------------------------------------------------
def _prox_inputs(lambda_r, s, sigma):
  lambda_r = check_vector(lambda_r, "lambda_r")
  s = check_vector(s, "s")
  _check_same_shape(lambda_r, s, "lambda_r", "s")
  _check_sigma(sigma)
  dtype = jnp.result_type(lambda_r.dtype, s.dtype)
  return lambda_r.astype(dtype), s.astype(dtype), jnp.asarray(sigma, dtype)


def prox_chi2(lambda_r, s, sigma, rho):
  """SCAFF-PD dual prox step for the chi^2 penalty on the simplex.

  argmin_{lambda in simplex} (rho/(2n)) sum_i (n lambda_i - 1)^2 - <s, lambda>
                             + ||lambda - lambda_r||^2 / (2 sigma)
  = project_simplex((lambda_r + sigma s) / (1 + sigma rho n)).

  rho = 0 is the AFL (minimax) case: a plain projected ascent step.
  """
  lambda_r, s, sigma = _prox_inputs(lambda_r, s, sigma)
  check_scalar(rho, "rho", lambda c: c >= 0, ">= 0")
  return _prox_chi2(lambda_r, s, sigma, jnp.asarray(rho, lambda_r.dtype))


@jax.jit
def _prox_chi2(lambda_r, s, sigma, rho):
  n = lambda_r.shape[-1]
  return project_simplex_unchecked(
    (lambda_r + sigma * s) / (1.0 + sigma * rho * n), jnp.asarray(1.0, lambda_r.dtype)
  )


def check_alpha(alpha):
  check_scalar(alpha, "alpha", lambda c: 0 < c <= 1, "in (0, 1]")


def prox_cvar(lambda_r, s, sigma, alpha):
  """SCAFF-PD dual prox step for CVaR_alpha: psi = 0, Lambda = {simplex, lambda_i <= 1/(alpha n)}.

  = project_capped_simplex(lambda_r + sigma s, 1 / (alpha n)). alpha = 1 gives the uniform
  vector (ERM); alpha <= 1/n gives the plain simplex projection (AFL).
  """
  lambda_r, s, sigma = _prox_inputs(lambda_r, s, sigma)
  check_alpha(alpha)
  return _prox_cvar(lambda_r, s, sigma, jnp.asarray(alpha, lambda_r.dtype))


@jax.jit
def _prox_cvar(lambda_r, s, sigma, alpha):
  n = lambda_r.shape[-1]
  cap = 1.0 / (alpha * n)
  return project_capped_simplex_unchecked(
    lambda_r + sigma * s, cap, jnp.asarray(1.0, lambda_r.dtype)
  )


def _power_root(a, sigma, q):
  """Unique t in [0, a] with t + sigma p t^(p - 1) = a, p = 1 + 1/q, q > 0, a >= 0.

  Elementwise on arrays. Geometric bisection on a bracket with hi/lo <= max(2, 2^q).
  """
  p = 1.0 + 1.0 / q
  c = a / (sigma * p)
  hi = jnp.minimum(a, c**q)
  lo = jnp.minimum(0.5 * a, (0.5 * c) ** q)

  def h(t):
    return t + sigma * p * t ** (1.0 / q) - a

  def body(_, bracket):
    lo, hi = bracket
    # geometric mean (without overflow); arithmetic if lo underflowed to 0
    mid = jnp.where(lo > 0, jnp.sqrt(lo) * jnp.sqrt(hi), 0.5 * hi)
    mid = jnp.clip(mid, lo, hi)
    pos = h(mid) >= 0
    return jnp.where(pos, lo, mid), jnp.where(pos, mid, hi)

  lo, hi = jax.lax.fori_loop(0, _QFFL_BISECTION_STEPS, body, (lo, hi))
  t = 0.5 * (lo + hi)
  return jnp.where(a > 0, t, jnp.zeros_like(a))


def check_q(q):
  check_scalar(q, "q", lambda c: c >= 0, ">= 0")


def check_norm(norm):
  if norm not in ("lp", "l2"):
    raise ValueError(f"`norm` must be 'lp' or 'l2', got {norm!r}")


def prox_qffl(lambda_r, s, sigma, q, norm="lp"):
  """SCAFF-PD dual prox step for the q-FFL penalty on Lambda = R^n.

  norm="lp" (default): psi(lambda) = sum_i |lambda_i|^(1 + 1/q) (recovers q-FFL exactly);
  norm="l2": psi(lambda) = ||lambda||_2^(1 + 1/q) (the literal Euclidean reading).
  q = 0: psi is the indicator of the unit l_inf (lp) / l2 (l2) ball; the prox is a projection.
  See the module docstring for the derivation.
  """
  lambda_r, s, sigma = _prox_inputs(lambda_r, s, sigma)
  check_q(q)
  check_norm(norm)
  return _prox_qffl(lambda_r, s, sigma, jnp.asarray(q, lambda_r.dtype), norm)


@jax.jit(static_argnums=4)
def _prox_qffl(lambda_r, s, sigma, q, norm):
  z = lambda_r + sigma * s
  q_pos = q > 0
  q_safe = jnp.where(q_pos, q, 1.0)
  if norm == "lp":
    a = jnp.abs(z)
    t = _power_root(a, sigma, q_safe)
    general = jnp.sign(z) * t
    limit = jnp.clip(z, -1.0, 1.0)
  else:
    a = jnp.linalg.norm(z)
    t = _power_root(a, sigma, q_safe)
    unit = z / jnp.where(a > 0, a, 1.0)
    general = unit * t
    limit = unit * jnp.minimum(a, 1.0)
  return jnp.where(q_pos, general, limit)
