"""Tests for fedjax_dro.solvers.simplex: projections and SCAFF-PD dual prox steps.

Oracles: CVXPY + CLARABEL with tight tolerances, an exact rational-arithmetic (fractions)
implementation of the capped-simplex projection (for ties), and an extended-precision
(long double) bisection for the scalar q-FFL root. Property tests (hypothesis): feasibility,
idempotence, non-expansiveness.
"""

import warnings
from fractions import Fraction

import cvxpy as cp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fedjax_dro.solvers.dro import chi2, cvar, qffl
from fedjax_dro.solvers.simplex import (
  project_capped_simplex,
  project_simplex,
  prox_chi2,
  prox_cvar,
  prox_qffl,
)

CLARABEL_OPTS = dict(
  tol_gap_abs=1e-13, tol_gap_rel=1e-13, tol_feas=1e-13, tol_ktratio=1e-10, max_iter=500
)
ATOL = 1e-9

# The public functions validate concrete inputs and then call jitted cores (one compile per
# shape), so the tests call them directly and reuse a few sizes to keep the suite fast.


def _solve(objective, constraints=()):
  prob = cp.Problem(cp.Minimize(objective), list(constraints))
  prob.solve(solver=cp.CLARABEL, **CLARABEL_OPTS)
  assert prob.status == cp.OPTIMAL, prob.status
  return prob


def cvx_project(v, cap=None, total=1.0):
  lam = cp.Variable(v.shape[0])
  cons = [lam >= 0, cp.sum(lam) == total]
  if cap is not None:
    cons.append(lam <= cap)
  # expanded QP form: CLARABEL is more accurate on it than on sum_squares(lam - v)
  _solve(0.5 * cp.sum_squares(lam) - v @ lam, cons)
  return lam.value


def exact_capped(v, cap, total=1):
  """Exact projection in rational arithmetic: lambda_i = clip(v_i - tau, 0, cap)."""
  v = [Fraction(x) for x in v]
  cap, total = Fraction(cap), Fraction(total)

  def g(t):
    return sum(min(max(x - t, 0), cap) for x in v)

  bps = sorted(set(v) | {x - cap for x in v})
  lo = hi = None
  for a, b in zip(bps[:-1], bps[1:]):
    if g(a) >= total >= g(b):
      lo, hi = a, b
      break
  if lo is None or g(lo) == g(hi):
    tau = bps[0] if lo is None else lo
  else:
    tau = lo + (g(lo) - total) * (hi - lo) / (g(lo) - g(hi))
  out = [min(max(x - tau, 0), cap) for x in v]
  assert sum(out) == total
  return np.array([float(x) for x in out])


def rand_vec(rng, n, scale=1.0):
  return rng.normal(size=n) * scale


# --------------------------------------------------------------------------------------------
# simplex projection
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
  "n,scale,total",
  [(1, 1.0, 1.0), (2, 1.0, 1.0), (8, 1.0, 1.0), (8, 10.0, 2.5), (40, 0.1, 1.0), (40, 3.0, 0.3)],
)
def test_project_simplex_matches_cvxpy(n, scale, total):
  rng = np.random.default_rng(n)
  for _ in range(3):
    v = rand_vec(rng, n, scale)
    got = np.asarray(project_simplex(jnp.asarray(v), total))
    np.testing.assert_allclose(got, cvx_project(v, total=total), atol=ATOL)
    assert abs(got.sum() - total) < 1e-12 and got.min() >= 0


def test_project_simplex_ties_and_feasible_input():
  v = jnp.array([0.5, 0.5, 0.5, -1.0, -2.0])
  np.testing.assert_allclose(project_simplex(v), [1 / 3, 1 / 3, 1 / 3, 0, 0], atol=1e-15)
  u = jnp.array([0.1, 0.2, 0.7, 0.0, 0.0])
  np.testing.assert_allclose(project_simplex(u), u, atol=1e-15)
  np.testing.assert_allclose(project_simplex(u + 5.0), u, atol=1e-14)  # shift invariance
  np.testing.assert_allclose(project_simplex(jnp.zeros(5)), np.full(5, 0.2), atol=1e-16)


# --------------------------------------------------------------------------------------------
# capped simplex
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
  "n,alpha,scale",
  [
    (2, 0.5, 1.0),
    (8, 0.3, 1.0),
    (40, 0.05, 1.0),
    (40, 0.9, 1.0),
    pytest.param(5, 0.5, 1.0, marks=pytest.mark.slow),
    pytest.param(8, 0.1, 5.0, marks=pytest.mark.slow),
    pytest.param(40, 0.2, 0.1, marks=pytest.mark.slow),
  ],
)
def test_project_capped_simplex_matches_cvxpy(n, alpha, scale):
  rng = np.random.default_rng(100 + n)
  cap = 1.0 / (alpha * n)
  for _ in range(3):
    v = rand_vec(rng, n, scale)
    got = np.asarray(project_capped_simplex(jnp.asarray(v), cap))
    np.testing.assert_allclose(got, cvx_project(v, cap=cap), atol=ATOL)
    np.testing.assert_allclose(got, exact_capped(v, cap), atol=1e-15)
    assert abs(got.sum() - 1) < 1e-12 and got.min() >= 0 and got.max() <= cap


def test_capped_simplex_degenerate_alpha_one_is_uniform():
  for n in (1, 8):
    v = jnp.asarray(np.random.default_rng(n).normal(size=n))
    got = project_capped_simplex(v, 1.0 / n)
    np.testing.assert_array_equal(got, np.full(n, 1.0 / n))
    got = prox_cvar(jnp.full(n, 1.0 / n), v, 0.7, 1.0)
    np.testing.assert_array_equal(got, np.full(n, 1.0 / n))


@pytest.mark.parametrize(
  "v,cap",
  [
    ([1.0, 1.0, 1.0, 0.0, 0.0], 0.3),  # ties above the cap
    ([1.0, 1.0, 1.0, 1.0, 1.0], 0.25),  # all tied
    ([2.0, 2.0, 0.5, 0.5, 0.5, 0.5], 0.25),  # two tie groups
    ([0.0, 0.0, 0.0, 0.0], 0.5),  # zero vector
    ([3.0, 3.0, 3.0, 3.0, -1.0, -1.0], 0.2),  # many at the cap, rest at zero
    ([0.5, 0.25, 0.25, 0.25, 0.0], 0.375),  # v_i - cap equal to other v_j
    ([1.0, 0.75, 0.5, 0.25, 0.0], 0.25),  # breakpoints coincide
    ([5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 0.0, -3.0], 0.125),  # exactly 8 at the cap
  ],
)
def test_capped_simplex_ties_exact(v, cap):
  got = np.asarray(project_capped_simplex(jnp.asarray(v), cap))
  np.testing.assert_allclose(got, exact_capped(v, cap), atol=1e-15)
  # ties at breakpoints make the problem degenerate (no strict complementarity), which
  # limits interior-point accuracy: CLARABEL gets ~1e-7 here, the exact oracle above 0.
  np.testing.assert_allclose(got, cvx_project(np.asarray(v), cap=cap), atol=1e-6)


def test_capped_simplex_many_at_cap_random():
  rng = np.random.default_rng(7)
  n, alpha = 40, 0.125
  cap = 1.0 / (alpha * n)  # 0.2
  # 4 distinct large values sit at the cap (mass 0.8); the rest shares 0.2
  v = np.concatenate([4.0 + rng.uniform(size=4), rng.normal(size=36)])
  got = np.asarray(project_capped_simplex(jnp.asarray(v), cap))
  np.testing.assert_allclose(got, cvx_project(v, cap=cap), atol=ATOL)
  np.testing.assert_allclose(got, exact_capped(v, cap), atol=1e-15)
  np.testing.assert_array_equal(got[:4], np.full(4, cap))
  # a tie group larger than 1/cap shares the mass equally, none at the cap
  v = np.concatenate([np.full(8, 4.0), rng.normal(size=32)])
  got = np.asarray(project_capped_simplex(jnp.asarray(v), cap))
  np.testing.assert_allclose(got[:8], np.full(8, 1 / 8), atol=1e-15)
  np.testing.assert_allclose(got, exact_capped(v, cap), atol=1e-15)


def test_capped_simplex_inactive_cap_is_simplex():
  v = jnp.asarray(np.random.default_rng(3).normal(size=8))
  np.testing.assert_allclose(project_capped_simplex(v, 1.0), project_simplex(v), atol=1e-15)
  np.testing.assert_allclose(project_capped_simplex(v, jnp.inf), project_simplex(v), atol=0)


def test_capped_simplex_total():
  v = np.random.default_rng(4).normal(size=8)
  got = project_capped_simplex(jnp.asarray(v), 0.5, 2.0)
  np.testing.assert_allclose(got, cvx_project(v, cap=0.5, total=2.0), atol=ATOL)


# --------------------------------------------------------------------------------------------
# dual prox steps
# --------------------------------------------------------------------------------------------
def _prox_inputs(rng, n):
  lam_r = np.asarray(project_simplex(jnp.asarray(rng.normal(size=n))))
  s = rng.exponential(size=n) * 3.0
  return lam_r, s


@pytest.mark.parametrize(
  "n,sigma,rho",
  [
    (5, 0.5, 0.1),
    (5, 2.0, 0.0),
    (40, 1.0, 5.0),
    pytest.param(8, 0.1, 1.0, marks=pytest.mark.slow),
    pytest.param(8, 10.0, 0.01, marks=pytest.mark.slow),
  ],
)
def test_prox_chi2_matches_cvxpy(n, sigma, rho):
  rng = np.random.default_rng(n + int(100 * sigma))
  lam_r, s = _prox_inputs(rng, n)
  lam = cp.Variable(n)
  # expanded: rho/(2n) sum (n l - 1)^2 = rho n/2 ||l||^2 - rho 1^T l + rho/2
  obj = (rho * n / 2 + 1 / (2 * sigma)) * cp.sum_squares(lam) - (s + rho + lam_r / sigma) @ lam
  _solve(obj, [lam >= 0, cp.sum(lam) == 1])
  got = np.asarray(prox_chi2(jnp.asarray(lam_r), jnp.asarray(s), sigma, rho))
  np.testing.assert_allclose(got, lam.value, atol=ATOL)
  np.testing.assert_allclose(got, chi2(rho).prox(lam_r, s, sigma), atol=0)


@pytest.mark.parametrize(
  "n,sigma,alpha",
  [
    (5, 0.5, 0.5),
    (40, 0.3, 0.25),
    pytest.param(8, 2.0, 0.1, marks=pytest.mark.slow),
    pytest.param(40, 1.0, 1.0, marks=pytest.mark.slow),
    pytest.param(8, 1.0, 0.05, marks=pytest.mark.slow),
  ],
)
def test_prox_cvar_matches_cvxpy(n, sigma, alpha):
  rng = np.random.default_rng(n + 7)
  lam_r, s = _prox_inputs(rng, n)
  lam = cp.Variable(n)
  obj = cp.sum_squares(lam) / (2 * sigma) - (s + lam_r / sigma) @ lam
  _solve(obj, [lam >= 0, cp.sum(lam) == 1, lam <= 1.0 / (alpha * n)])
  got = np.asarray(prox_cvar(jnp.asarray(lam_r), jnp.asarray(s), sigma, alpha))
  np.testing.assert_allclose(got, lam.value, atol=ATOL)
  np.testing.assert_allclose(got, cvar(alpha).prox(lam_r, s, sigma), atol=0)


LONG = np.longdouble
LONG_IS_EXTENDED = np.finfo(LONG).eps < 1e-18


def qffl_oracle(lam_r, s, sigma, q, norm="lp"):
  """Root of u^q + sigma p u = a (t = u^q) by 200 bisection steps in extended precision."""
  q_, sigma_ = LONG(q), LONG(sigma)
  p = LONG(1) + LONG(1) / q_
  z = np.asarray(lam_r, LONG) + sigma_ * np.asarray(s, LONG)

  def root(a):
    lo, hi = LONG(0), a ** (LONG(1) / q_)
    for _ in range(200):
      mid = (lo + hi) / 2
      if mid**q_ + sigma_ * p * mid - a >= 0:
        hi = mid
      else:
        lo = mid
    return ((lo + hi) / 2) ** q_

  if norm == "lp":
    return (np.sign(z) * np.array([root(abs(zi)) for zi in z])).astype(float)
  a = np.sqrt(np.sum(z * z))
  return (z / a * root(a)).astype(float)


@pytest.mark.parametrize("q", [0.05, 0.3, 1.0, 2.0, 5.0, 20.0, 200.0])
@pytest.mark.parametrize("norm", ["lp", "l2"])
def test_prox_qffl_matches_scalar_oracle(q, norm):
  rng = np.random.default_rng(int(q * 100))
  n, sigma = 8, 0.7
  lam_r = rng.normal(size=n)
  s = rng.normal(size=n) * 2.0
  got = np.asarray(prox_qffl(jnp.asarray(lam_r), jnp.asarray(s), sigma, q, norm=norm))
  want = qffl_oracle(lam_r, s, sigma, q, norm)
  # the root t is conditioned like q in relative terms (t = u^q), hence rtol ~ q eps
  rtol = 2e-15 * max(10.0, q) if LONG_IS_EXTENDED else 1e-12 * max(1.0, q)
  np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-300)


@pytest.mark.parametrize(
  "q,norm", [(2.0, "lp"), (2.0, "l2"), pytest.param(0.5, "lp", marks=pytest.mark.slow)]
)
def test_prox_qffl_matches_cvxpy(q, norm):
  rng = np.random.default_rng(11)
  n, sigma = 5, 0.5
  lam_r, s = rng.normal(size=n), rng.normal(size=n)
  p = 1 + 1 / q
  lam = cp.Variable(n)
  psi = cp.sum(cp.power(cp.abs(lam), p)) if norm == "lp" else cp.power(cp.norm(lam, 2), p)
  prob = cp.Problem(cp.Minimize(psi - s @ lam + cp.sum_squares(lam - lam_r) / (2 * sigma)))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    prob.solve(solver=cp.CLARABEL, **CLARABEL_OPTS)
  got = np.asarray(prox_qffl(jnp.asarray(lam_r), jnp.asarray(s), sigma, q, norm=norm))
  # power cones: CLARABEL only reaches ~1e-6 here (it reports "optimal_inaccurate"); the
  # extended-precision scalar oracle above is the 1e-13 check. Ours must not be worse.
  np.testing.assert_allclose(got, lam.value, atol=1e-5)
  val = lambda l: float(
    qffl(q, norm).value(jnp.asarray(l)) - s @ l + np.sum((l - lam_r) ** 2) / (2 * sigma)
  )
  assert val(got) <= val(lam.value) + 1e-12


def test_prox_qffl_closed_forms():
  z_r = jnp.array([0.3, -2.0, 0.0, 1.5, 0.1])
  s = jnp.array([1.0, 0.5, -0.2, 0.0, -0.1])
  sigma = 0.5
  z = z_r + sigma * s
  # q = 1: p = 2, psi = ||lambda||^2, prox = z / (1 + 2 sigma)
  np.testing.assert_allclose(prox_qffl(z_r, s, sigma, 1.0), z / (1 + 2 * sigma), rtol=1e-15)
  # q = 0: indicator of the unit box / ball
  np.testing.assert_allclose(prox_qffl(z_r, s, sigma, 0.0), jnp.clip(z, -1, 1), atol=0)
  zn = jnp.linalg.norm(z)
  np.testing.assert_allclose(prox_qffl(z_r, s, sigma, 0.0, norm="l2"), z / zn, rtol=1e-15)
  # tiny q approaches the box projection
  np.testing.assert_allclose(prox_qffl(z_r, s, sigma, 1e-3), jnp.clip(z, -1, 1), atol=1e-2)
  # zero input
  np.testing.assert_array_equal(prox_qffl(jnp.zeros(5), jnp.zeros(5), 1.0, 2.0), np.zeros(5))


# --------------------------------------------------------------------------------------------
# hypothesis property tests
# --------------------------------------------------------------------------------------------
SIZES = st.sampled_from([1, 2, 5, 8])
floats = st.floats(min_value=-50, max_value=50, allow_nan=False, allow_infinity=False)


@st.composite
def vectors(draw, n=None, k=1):
  n = draw(SIZES) if n is None else n
  vs = [np.array(draw(st.lists(floats, min_size=n, max_size=n))) for _ in range(k)]
  return vs


@st.composite
def capped_case(draw):
  n = draw(SIZES)
  alpha = draw(st.floats(min_value=0.01, max_value=1.0))
  u, v = draw(vectors(n=n, k=2))
  return u, v, 1.0 / (alpha * n)


@settings(max_examples=60, deadline=None)
@given(vectors(k=2))
def test_simplex_properties(uv):
  u, v = uv
  pu = np.asarray(project_simplex(jnp.asarray(u)))
  pv = np.asarray(project_simplex(jnp.asarray(v)))
  assert pu.min() >= 0 and abs(pu.sum() - 1) < 1e-12
  np.testing.assert_allclose(np.asarray(project_simplex(jnp.asarray(pu))), pu, atol=1e-13)
  assert np.linalg.norm(pu - pv) <= np.linalg.norm(u - v) + 1e-12


@settings(max_examples=60, deadline=None)
@given(capped_case())
def test_capped_simplex_properties(case):
  u, v, cap = case
  pu = np.asarray(project_capped_simplex(jnp.asarray(u), cap))
  pv = np.asarray(project_capped_simplex(jnp.asarray(v), cap))
  assert pu.min() >= 0 and pu.max() <= cap * (1 + 1e-15) and abs(pu.sum() - 1) < 1e-12
  ppu = np.asarray(project_capped_simplex(jnp.asarray(pu), cap))
  np.testing.assert_allclose(ppu, pu, atol=1e-13)
  assert np.linalg.norm(pu - pv) <= np.linalg.norm(u - v) + 1e-12
  # variational inequality: <u - P(u), w - P(u)> <= 0 for w in the set (w = P(v))
  assert np.dot(u - pu, pv - pu) <= 1e-10 * (1 + np.abs(u).max())


@settings(max_examples=40, deadline=None)
@given(
  vectors(k=2),
  st.floats(min_value=0.0, max_value=30.0),
  st.floats(min_value=0.05, max_value=5.0),
  st.sampled_from(["lp", "l2"]),
)
def test_qffl_prox_properties(uv, q, sigma, norm):
  u, v = uv
  pu = np.asarray(prox_qffl(jnp.asarray(u), jnp.zeros(len(u)), sigma, q, norm=norm))
  pv = np.asarray(prox_qffl(jnp.asarray(v), jnp.zeros(len(v)), sigma, q, norm=norm))
  # prox of a convex function: non-expansive and shrinks towards 0 (psi minimized at 0)
  assert np.linalg.norm(pu - pv) <= np.linalg.norm(u - v) * (1 + 1e-12) + 1e-12
  assert np.linalg.norm(pu) <= np.linalg.norm(u) * (1 + 1e-14) + 1e-300
  if q == 0.0:  # projection: idempotent
    np.testing.assert_allclose(
      prox_qffl(jnp.asarray(pu), jnp.zeros(len(u)), sigma, q, norm=norm), pu, atol=1e-14
    )


@settings(max_examples=40, deadline=None)
@given(
  vectors(k=2), st.floats(min_value=0.0, max_value=10.0), st.floats(min_value=0.01, max_value=10.0)
)
def test_chi2_prox_properties(uv, rho, sigma):
  lam_r, s = uv
  n = len(lam_r)
  lam_r = np.asarray(project_simplex(jnp.asarray(lam_r)))
  out = np.asarray(prox_chi2(jnp.asarray(lam_r), jnp.asarray(s), sigma, rho))
  assert out.min() >= 0 and abs(out.sum() - 1) < 1e-12
  # fixed point: lambda+ = prox(lambda+, s - grad psi... ) is characterized by the VI
  # <grad obj(out), w - out> >= 0 for w in simplex, i.e. min_i grad_i == grad on support
  grad = rho * (n * out - 1) - s + (out - lam_r) / sigma
  support = out > 1e-12
  assert np.all(grad[support] <= grad.min() + 1e-8 * (1 + np.abs(grad).max()))


# --------------------------------------------------------------------------------------------
# jit / vmap / traced parameters
# --------------------------------------------------------------------------------------------
def test_jit_vmap_and_traced_parameters():
  rng = np.random.default_rng(0)
  V = jnp.asarray(rng.normal(size=(4, 5)))
  caps = jnp.array([0.2, 0.25, 0.5, 1.0])
  batched = jax.jit(jax.vmap(project_capped_simplex))(V, caps)
  for i in range(4):
    np.testing.assert_allclose(batched[i], project_capped_simplex(V[i], float(caps[i])), atol=1e-15)
  np.testing.assert_allclose(jax.vmap(project_simplex)(V)[2], project_simplex(V[2]), atol=0)
  lam_r = jnp.full((4, 5), 1 / 5)
  rhos = jnp.array([0.0, 0.1, 1.0, 10.0])
  out = jax.jit(jax.vmap(prox_chi2, in_axes=(0, 0, None, 0)))(lam_r, V, 0.5, rhos)
  for i in range(4):
    np.testing.assert_allclose(out[i], prox_chi2(lam_r[i], V[i], 0.5, float(rhos[i])), atol=1e-15)
  qs = jnp.array([0.0, 0.5, 1.0, 4.0])
  out = jax.jit(jax.vmap(prox_qffl, in_axes=(0, 0, 0, 0)))(lam_r, V, jnp.full(4, 0.5), qs)
  for i in range(4):
    np.testing.assert_allclose(
      out[i], prox_qffl(lam_r[i], V[i], 0.5, float(qs[i])), rtol=1e-14, atol=1e-15
    )
  # the CVaR problem with a traced alpha under jit + vmap
  alphas = jnp.array([0.1, 0.3, 0.7, 1.0])
  f = jax.jit(jax.vmap(lambda l, s, a: cvar(a).prox(l, s, 1.0)))
  out = f(lam_r, V, alphas)
  np.testing.assert_allclose(out[1], prox_cvar(lam_r[1], V[1], 1.0, 0.3), atol=1e-15)
  np.testing.assert_allclose(out[3], np.full(5, 1 / 5), atol=1e-15)


def test_gradients_flow_through_simplex_projection():
  v = jnp.array([0.3, 0.9, -0.5, 0.4])
  J = jax.jacfwd(project_simplex)(v)
  # support {0, 1, 3}: Jacobian is I - 11^T/|S| on the support, 0 elsewhere
  S = np.array([1, 1, 0, 1], bool)
  want = np.zeros((4, 4))
  want[np.ix_(S, S)] = np.eye(3) - 1 / 3
  np.testing.assert_allclose(J, want, atol=1e-15)


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
L3 = jnp.full(3, 1 / 3)
S3 = jnp.ones(3)


@pytest.mark.parametrize(
  "call,argname",
  [
    (lambda: project_simplex(jnp.ones(3), total=0.0), "total"),
    (lambda: project_simplex(jnp.ones((2, 3))), "v"),
    (lambda: project_simplex(jnp.ones(0)), "v"),
    (lambda: project_capped_simplex(jnp.ones(3), -0.1), "cap"),
    (lambda: project_capped_simplex(jnp.ones(3), 0.3), "cap"),  # cap * n < 1
    (lambda: project_capped_simplex(jnp.ones(3), float("nan")), "cap"),
    (lambda: prox_chi2(L3, S3, 0.0, 0.1), "sigma"),
    (lambda: prox_chi2(L3, S3, -1.0, 0.1), "sigma"),
    (lambda: prox_chi2(L3, S3, 1.0, -0.1), "rho"),
    (lambda: prox_chi2(L3, jnp.ones(4), 1.0, 0.1), "s"),
    (lambda: prox_cvar(L3, S3, 1.0, 0.0), "alpha"),
    (lambda: prox_cvar(L3, S3, 1.0, 1.5), "alpha"),
    (lambda: prox_cvar(L3, S3, 1.0, -0.5), "alpha"),
    (lambda: prox_qffl(L3, S3, 1.0, -1.0), "q"),
    (lambda: prox_qffl(L3, S3, 1.0, 1.0, norm="l1"), "norm"),
  ],
)
def test_validation_errors(call, argname):
  with pytest.raises(ValueError, match=argname):
    call()


def test_capped_alpha_one_rounding_is_accepted():
  n = 49
  cap = 1.0 / n
  assert cap * n < 1.0  # rounds below 1: must be accepted as alpha = 1
  out = project_capped_simplex(jnp.arange(n, dtype=jnp.float64), cap)
  np.testing.assert_allclose(out, np.full(n, 1 / n), atol=1e-16)
