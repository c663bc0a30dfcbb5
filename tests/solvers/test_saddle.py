"""Tests for fedjax_dro.solvers.saddle (centralized DRO saddle-point solver).

Small quadratic client losses f_i(x) = 0.5 ||A_i x - b_i||^2 / m with concept shift between
clients (as in the SCAFF-PD synthetic task). Oracles:
* CVXPY + CLARABEL on convex reformulations of min_x max_lambda (chi^2 via its dual in eta,
  AFL via the epigraph form, CVaR via the Rockafellar-Uryasev form);
* the saddle-point conditions checked independently in NumPy (x* minimizes sum lambda*_i f_i,
  lambda* maximizes <lambda, f(x*)> - psi(lambda) over Lambda, the latter solved by CVXPY);
* exact ERM normal equations for alpha = 1 and the rho -> infinity limit.
"""

import warnings

import cvxpy as cp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro.solvers.dro import as_problem, chi2, cvar, kl, qffl
from fedjax_dro.solvers.saddle import (
  SaddleSolution,
  best_response,
  distance_to_optimum,
  robust_objective,
  solve_saddle,
)

# CLARABEL on the second-order-cone reformulations of the min-max problems stalls around
# 1e-10 in the objective and ~1e-6 in x (it reports "optimal_inaccurate" for tighter settings),
# so the x comparisons against these solves use atol 1e-5. The 1e-11 checks are the
# independent saddle-point conditions (NumPy gradient + CVXPY QP for the dual, which CLARABEL
# solves to ~1e-10) and the agreement of the two internal methods (Newton / interior point).
CLARABEL_OPTS = dict(
  tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, tol_ktratio=1e-9, max_iter=500
)
X_ATOL_CVX = 1e-5
N, D, M = 4, 3, 6


def make_problem(seed=0, n=N, d=D, m=M, shift=1.5):
  rng = np.random.default_rng(seed)
  A = rng.normal(size=(n, m, d))
  x_hat = rng.normal(size=d)
  deltas = rng.normal(size=(n, d)) * shift
  b = np.einsum("imd,id->im", A, x_hat + deltas) + 0.1 * rng.normal(size=(n, m))
  return A, b


A_NP, B_NP = make_problem()
A_J, B_J = jnp.asarray(A_NP), jnp.asarray(B_NP)


def losses(x):
  r = jnp.einsum("imd,d->im", A_J, x) - B_J
  return 0.5 * jnp.sum(r**2, axis=1) / M


def losses_np(x):
  r = np.einsum("imd,d->im", A_NP, x) - B_NP
  return 0.5 * np.sum(r**2, axis=1) / M


def grads_np(x):
  r = np.einsum("imd,d->im", A_NP, x) - B_NP
  return np.einsum("imd,im->id", A_NP, r) / M  # [n, d]


def cvx_losses(x):
  return cp.hstack([cp.sum_squares(A_NP[i] @ x - B_NP[i]) / (2 * M) for i in range(N)])


def x_erm():
  H = sum(A_NP[i].T @ A_NP[i] for i in range(N))
  g = sum(A_NP[i].T @ B_NP[i] for i in range(N))
  return np.linalg.solve(H, g)


def solve_cvx(objective, constraints=()):
  prob = cp.Problem(cp.Minimize(objective), list(constraints))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    prob.solve(solver=cp.CLARABEL, **CLARABEL_OPTS)
  assert prob.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE), prob.status
  return prob


def cvx_best_response(f, psi, **params):
  """argmax_{lambda in Lambda} <lambda, f> - psi(lambda) by CVXPY (concave QP / LP)."""
  lam = cp.Variable(N)
  cons = [lam >= 0, cp.sum(lam) == 1]
  if psi == "chi2":
    rho = params["rho"]
    obj = -f @ lam + (rho * N / 2) * cp.sum_squares(lam) - rho * cp.sum(lam) + rho / 2
  else:
    obj = -f @ lam
    cons.append(lam <= 1.0 / (params["alpha"] * N))
  prob = solve_cvx(obj, cons)
  return lam.value, -prob.value


_CACHE = {}


def solved(psi, method="auto", **params):
  key = (psi, method, tuple(sorted(params.items())))
  if key not in _CACHE:
    _CACHE[key] = solve_saddle(losses, jnp.zeros(D), psi=psi, psi_params=params, method=method)
  return _CACHE[key]


def check_certificates(sol, tol=1e-12):
  assert isinstance(sol, SaddleSolution)
  assert sol.converged, sol
  assert float(sol.residual) <= tol, float(sol.residual)
  assert -1e-12 <= float(sol.gap) <= tol, float(sol.gap)


def check_saddle_conditions(sol, psi, **params):
  """Independent NumPy / CVXPY check of the two saddle-point conditions."""
  x = np.asarray(sol.x_star)
  lam = np.asarray(sol.lambda_star)
  # lambda* in Lambda
  assert lam.min() >= 0 and abs(lam.sum() - 1) < 1e-12
  if psi == "cvar":
    assert lam.max() <= 1.0 / (params["alpha"] * N) * (1 + 1e-12)
  # x* minimizes sum_i lambda*_i f_i: gradient zero (strictly convex quadratic)
  assert np.max(np.abs(lam @ grads_np(x))) < 1e-11
  # lambda* maximizes <lambda, f(x*)> - psi(lambda)
  f = losses_np(x)
  lam_cvx, val_cvx = cvx_best_response(f, psi, **params)
  val = f @ lam - float(as_problem(psi, **params).value(jnp.asarray(lam)))
  assert abs(val - val_cvx) < 1e-9
  if psi == "chi2" and params["rho"] > 0:  # unique maximizer
    np.testing.assert_allclose(lam, lam_cvx, atol=1e-8)


# --------------------------------------------------------------------------------------------
# chi^2
# --------------------------------------------------------------------------------------------
def cvx_chi2(rho):
  """min_x max_{simplex} <lam, f> - psi
  = min_{x, eta} eta + sum_i (f_i + rho - eta)_+^2 / (2 rho n) - rho / 2   (dual in eta)."""
  x, eta = cp.Variable(D), cp.Variable()
  f = cvx_losses(x)
  obj = eta + cp.sum(cp.square(cp.pos(f + rho - eta))) / (2 * rho * N) - rho / 2
  prob = solve_cvx(obj)
  lam = np.maximum(losses_np(x.value) + rho - eta.value, 0) / (rho * N)
  return x.value, lam, prob.value


@pytest.mark.parametrize(
  "rho",
  [0.1, pytest.param(0.01, marks=pytest.mark.slow), pytest.param(1.0, marks=pytest.mark.slow)],
)
def test_chi2_matches_cvxpy(rho):
  sol = solved("chi2", rho=rho)
  assert sol.method == "ipm"
  check_certificates(sol)
  check_saddle_conditions(sol, "chi2", rho=rho)
  x_cvx, lam_cvx, val_cvx = cvx_chi2(rho)
  np.testing.assert_allclose(sol.x_star, x_cvx, atol=X_ATOL_CVX)
  np.testing.assert_allclose(sol.lambda_star, lam_cvx, atol=X_ATOL_CVX)
  assert abs(float(sol.objective) - val_cvx) < 1e-9
  assert float(sol.objective) <= val_cvx + 1e-12  # we are at least as good


def test_chi2_ipm_agrees_with_newton():
  a = solved("chi2", rho=0.1)
  b = solved("chi2", method="newton", rho=0.1)
  assert (a.method, b.method) == ("ipm", "newton")
  check_certificates(b)
  np.testing.assert_allclose(b.x_star, a.x_star, atol=1e-12)
  np.testing.assert_allclose(b.lambda_star, a.lambda_star, atol=1e-12)
  assert abs(float(a.objective) - float(b.objective)) < 1e-12


# --------------------------------------------------------------------------------------------
# AFL (rho = 0): min_x max_i f_i(x)
# --------------------------------------------------------------------------------------------
def test_afl_matches_cvxpy_epigraph():
  sol = solved("chi2", rho=0.0)
  assert sol.method == "ipm"
  check_certificates(sol)
  check_saddle_conditions(sol, "chi2", rho=0.0)
  x, t = cp.Variable(D), cp.Variable()
  cons = [cvx_losses(x) <= t]
  prob = solve_cvx(t, cons)
  np.testing.assert_allclose(sol.x_star, x.value, atol=X_ATOL_CVX)
  np.testing.assert_allclose(sol.lambda_star, cons[0].dual_value, atol=X_ATOL_CVX)
  assert abs(float(sol.objective) - prob.value) < 1e-9
  assert float(sol.objective) <= prob.value + 1e-12
  f = losses_np(np.asarray(sol.x_star))
  assert abs(float(sol.objective) - f.max()) < 1e-14
  # at the minimax point at least two clients are tied at the worst loss
  assert np.sum(f > f.max() - 1e-10) >= 2


# --------------------------------------------------------------------------------------------
# CVaR
# --------------------------------------------------------------------------------------------
def cvx_cvar(alpha):
  """Rockafellar-Uryasev: min_{x, eta} eta + (1/(alpha n)) sum_i (f_i(x) - eta)_+."""
  x, eta = cp.Variable(D), cp.Variable()
  prob = solve_cvx(eta + cp.sum(cp.pos(cvx_losses(x) - eta)) / (alpha * N))
  return x.value, prob.value


@pytest.mark.parametrize(
  "alpha",
  [0.5, pytest.param(0.3, marks=pytest.mark.slow), pytest.param(0.75, marks=pytest.mark.slow)],
)
def test_cvar_matches_cvxpy(alpha):
  sol = solved("cvar", alpha=alpha)
  assert sol.method == "ipm"
  check_certificates(sol)
  check_saddle_conditions(sol, "cvar", alpha=alpha)
  x_cvx, val_cvx = cvx_cvar(alpha)
  np.testing.assert_allclose(sol.x_star, x_cvx, atol=X_ATOL_CVX)
  assert abs(float(sol.objective) - val_cvx) < 1e-9
  assert float(sol.objective) <= val_cvx + 1e-12


def test_cvar_alpha_one_is_erm_with_pytree_parameters():
  """alpha = 1 (Lambda = {uniform}) is ERM; also exercises pytree parameters."""

  def tree_losses(params):
    return losses(jnp.concatenate([params["w"], params["b"][None]]))

  x0 = {"w": jnp.zeros(D - 1), "b": jnp.zeros(())}
  sol = solve_saddle(tree_losses, x0, psi="cvar", psi_params={"alpha": 1.0})
  assert sol.method == "erm"
  check_certificates(sol)
  np.testing.assert_allclose(sol.lambda_star, np.full(N, 1 / N), atol=0)
  assert set(sol.x_star) == {"w", "b"} and sol.x_star["b"].shape == ()
  flat = x_erm()
  np.testing.assert_allclose(sol.x_star["w"], flat[:-1], atol=1e-12)
  np.testing.assert_allclose(sol.x_star["b"], flat[-1], atol=1e-12)
  shifted = jax.tree.map(lambda a: a + 0.5, sol.x_star)
  np.testing.assert_allclose(distance_to_optimum(shifted, sol.x_star), 0.25 * D, rtol=1e-14)
  assert float(distance_to_optimum(sol.x_star, sol.x_star)) == 0.0


# --------------------------------------------------------------------------------------------
# rho -> infinity recovers ERM (paper, Section 3)
# --------------------------------------------------------------------------------------------
def test_large_rho_approaches_erm():
  xe = x_erm()
  sol = solved("chi2", rho=1e4)
  check_certificates(sol)
  # lambda* = 1/n + O(1/rho) hence ||x*_rho - x_erm|| = O(1/rho)
  assert float(distance_to_optimum(sol.x_star, jnp.asarray(xe))) < 1e-6 * np.sum(xe**2)
  np.testing.assert_allclose(sol.lambda_star, np.full(N, 1 / N), atol=1e-3)


@pytest.mark.slow
def test_small_rho_approaches_afl():
  sol = solved("chi2", rho=1e-6)
  check_certificates(sol)
  afl = solved("chi2", rho=0.0)
  assert float(distance_to_optimum(sol.x_star, afl.x_star)) < 1e-10


@pytest.mark.slow
def test_erm_limit_rate():
  xe = jnp.asarray(x_erm())
  d2 = float(distance_to_optimum(solved("chi2", rho=1e2).x_star, xe))
  d4 = float(distance_to_optimum(solved("chi2", rho=1e4).x_star, xe))
  assert 1e3 < d2 / d4 < 1e5  # squared distance ~ 1/rho^2


# --------------------------------------------------------------------------------------------
# q-FFL (Lambda = R^n, psi = sum |lambda|^(1+1/q))
# --------------------------------------------------------------------------------------------
def test_qffl_minimizes_sum_of_powers():
  q = 2.0
  sol = solve_saddle(losses, jnp.zeros(D), psi="qffl", psi_params={"q": q})
  assert sol.method == "newton"
  check_certificates(sol)
  x = np.asarray(sol.x_star)
  f = losses_np(x)
  p = 1 + 1 / q
  # best response lambda_i = (f_i / p)^q and x* minimizes sum f_i^(q+1) / (q+1)
  np.testing.assert_allclose(sol.lambda_star, (f / p) ** q, rtol=1e-13)
  assert np.max(np.abs((f**q) @ grads_np(x))) < 1e-10
  np.testing.assert_allclose(
    float(sol.objective), p ** (-q) / (q + 1) * np.sum(f ** (q + 1)), rtol=1e-13
  )
  # q-FFL is fairer than ERM: smaller worst-client loss
  assert f.max() < losses_np(x_erm()).max()


# --------------------------------------------------------------------------------------------
# non-quadratic smooth convex losses (regularized logistic regression)
# --------------------------------------------------------------------------------------------
def logistic_problem(seed=1, n=5, d=3, m=12):
  rng = np.random.default_rng(seed)
  X = jnp.asarray(rng.normal(size=(n, m, d)) + rng.normal(size=(n, 1, d)))
  y = jnp.asarray(np.sign(rng.normal(size=(n, m)) + 0.3))

  def fn(w):
    margins = jnp.einsum("imd,d->im", X, w) * y
    return jnp.mean(jax.nn.softplus(-margins), axis=1) + 0.01 * jnp.sum(w**2)

  return fn, d


def test_logistic_chi2_saddle_conditions():
  fn, d = logistic_problem()
  rho, n = 0.05, 5
  a = solve_saddle(fn, jnp.ones(d), psi="chi2", psi_params={"rho": rho})
  assert a.method == "ipm"
  check_certificates(a)
  # stationarity of sum lambda*_i f_i, computed by plain autodiff
  g = jax.grad(lambda w: jnp.dot(a.lambda_star, fn(w)))(a.x_star)
  assert float(jnp.max(jnp.abs(g))) < 1e-12
  # lambda* is the maximizer of <lambda, f(x*)> - psi over the simplex (CVXPY QP)
  f = np.asarray(fn(a.x_star))
  lam = cp.Variable(n)
  solve_cvx(
    -f @ lam + (rho * n / 2) * cp.sum_squares(lam) - rho * cp.sum(lam), [lam >= 0, cp.sum(lam) == 1]
  )
  np.testing.assert_allclose(a.lambda_star, lam.value, atol=1e-8)


@pytest.mark.slow
def test_logistic_newton_and_ipm_agree():
  fn, d = logistic_problem()
  x0 = jnp.ones(d)
  a = solve_saddle(fn, x0, psi="chi2", psi_params={"rho": 0.05}, method="newton")
  b = solve_saddle(fn, x0, psi="chi2", psi_params={"rho": 0.05})
  assert (a.method, b.method) == ("newton", "ipm")
  check_certificates(b)
  np.testing.assert_allclose(a.x_star, b.x_star, atol=1e-12)
  np.testing.assert_allclose(a.lambda_star, b.lambda_star, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("psi,params", [("cvar", {"alpha": 0.4}), ("chi2", {"rho": 0.0})])
def test_logistic_nonsmooth_cases(psi, params):
  fn, d = logistic_problem(seed=2)
  sol = solve_saddle(fn, jnp.zeros(d), psi=psi, psi_params=params)
  check_certificates(sol)
  # phi(x*) <= phi(x* + small perturbation): x* is a minimizer of the robust objective
  rng = np.random.default_rng(0)
  phi = lambda w: float(robust_objective(fn(w), psi, **params))
  for _ in range(10):
    assert phi(sol.x_star) <= phi(sol.x_star + 1e-4 * rng.normal(size=d)) + 1e-14


@pytest.mark.slow
def test_reports_non_convergence():
  sol = solve_saddle(
    losses, 10 * jnp.ones(D), psi="cvar", psi_params={"alpha": 0.5}, max_iterations=2
  )
  assert not sol.converged and sol.iterations == 2
  assert float(sol.residual) > 1e-6


# --------------------------------------------------------------------------------------------
# pytrees, helpers, validation
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
  "psi,params",
  [
    ("chi2", {"rho": 0.3}),
    ("chi2", {"rho": 0.0}),
    ("cvar", {"alpha": 0.5}),
    ("cvar", {"alpha": 0.3}),
  ],
)
def test_best_response_matches_cvxpy(psi, params):
  f = np.array([0.3, 1.2, 0.7, 1.1])
  lam = np.asarray(best_response(jnp.asarray(f), psi, **params))
  lam_cvx, val_cvx = cvx_best_response(f, psi, **params)
  assert abs(float(robust_objective(jnp.asarray(f), psi, **params)) - val_cvx) < 1e-10
  val = f @ lam - float(as_problem(psi, **params).value(jnp.asarray(lam)))
  assert abs(val - val_cvx) < 1e-10
  if not (psi == "chi2" and params["rho"] == 0.0):
    np.testing.assert_allclose(lam, lam_cvx, atol=1e-8)


def test_robust_objective_qffl_closed_form():
  f = jnp.array([0.3, 1.2, 0.7, 1.1])
  q, p = 3.0, 1 + 1 / 3.0
  lam = best_response(f, "qffl", q=q)
  want = float(jnp.dot(lam, f) - qffl(q).value(lam))
  np.testing.assert_allclose(robust_objective(f, "qffl", q=q), want, rtol=1e-14)
  np.testing.assert_allclose(want, p ** (-q) / (q + 1) * float(jnp.sum(f ** (q + 1))), rtol=1e-14)
  np.testing.assert_allclose(robust_objective(f, "qffl", q=0.0), float(jnp.sum(f)), rtol=0)


# --------------------------------------------------------------------------------------------
# problem objects: the same solutions as their names, and the KL problem
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
  "psi,params,problem",
  [
    ("chi2", {"rho": 0.3}, chi2(0.3)),
    ("chi2", {"rho": 0.0}, chi2(0.0)),
    ("cvar", {"alpha": 0.5}, cvar(0.5)),
    ("cvar", {"alpha": 1.0}, cvar(1.0)),
    ("qffl", {"q": 2.0}, qffl(2.0)),
  ],
)
def test_a_problem_object_solves_as_its_name(psi, params, problem):
  by_name = solved(psi, **params)
  by_object = solve_saddle(losses, jnp.zeros(D), psi=problem)
  assert by_object.method == by_name.method and by_object.iterations == by_name.iterations
  for field in ("x_star", "lambda_star", "objective", "gap", "residual"):
    np.testing.assert_array_equal(getattr(by_object, field), getattr(by_name, field))
  f = losses(jnp.asarray(by_name.x_star))
  np.testing.assert_array_equal(best_response(f, psi, **params), best_response(f, problem))
  np.testing.assert_array_equal(robust_objective(f, psi, **params), robust_objective(f, problem))


@pytest.mark.parametrize("lam", [0.2, 1.0, 5.0])
def test_kl_saddle_point(lam):
  """The KL-regularized problem (FGDRO-KL's problem (5)): x* minimizes lam log mean exp(f / lam)
  (its gradient, the softmax-weighted gradient, vanishes; CVXPY agrees), lambda* is the softmax."""
  sol = solve_saddle(losses, jnp.zeros(D), psi=kl(lam))
  assert sol.method == "newton"
  check_certificates(sol)
  x = np.asarray(sol.x_star)
  f = losses_np(x)
  w = np.exp((f - f.max()) / lam)
  w /= w.sum()
  np.testing.assert_allclose(sol.lambda_star, w, atol=1e-14)
  assert np.max(np.abs(w @ grads_np(x))) < 1e-11
  np.testing.assert_allclose(sol.objective, lam * np.log(np.mean(np.exp(f / lam))), rtol=1e-14)
  xv = cp.Variable(D)
  prob = solve_cvx(lam * cp.log_sum_exp(cvx_losses(xv) / lam) - lam * np.log(N))
  np.testing.assert_allclose(x, xv.value, atol=X_ATOL_CVX)
  np.testing.assert_allclose(float(sol.objective), prob.value, rtol=1e-8)
  # between the ERM optimum (lam -> infinity) and AFL's minimax value (lam -> 0)
  erm, afl = solved("cvar", alpha=1.0).objective, solved("chi2", rho=0.0).objective
  assert erm - 1e-12 <= sol.objective <= afl + 1e-12


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(psi="kl", psi_params={}), "psi"),
    (dict(psi="tv", psi_params={}), "psi"),
    (dict(psi=cvar(0.5), psi_params={"alpha": 0.5}), "psi"),
    (dict(psi="kl", psi_params={"lam": 1.0}, method="ipm"), "ipm"),
    (dict(psi=cvar(0.5), method="newton"), "newton"),
    (dict(psi="chi2", psi_params={}), "rho"),
    (dict(psi="chi2", psi_params={"rho": -1.0}), "rho"),
    (dict(psi="cvar", psi_params={"alpha": 0.0}), "alpha"),
    (dict(psi="qffl", psi_params={"q": -2.0}), "q"),
    (dict(psi="chi2", psi_params={"rho": 0.0}, method="newton"), "newton"),
    (dict(psi="qffl", psi_params={"q": 1.0}, method="ipm"), "ipm"),
    (dict(psi="chi2", psi_params={"rho": 0.1}, method="lbfgs"), "method"),
    (dict(psi="chi2", psi_params={"rho": 0.1}, tol=0.0), "tol"),
    (dict(psi="chi2", psi_params={"rho": 0.1}, max_iterations=0), "max_iterations"),
  ],
)
def test_validation_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    solve_saddle(losses, jnp.zeros(D), **kwargs)


def test_x0_must_be_float():
  with pytest.raises(ValueError, match="x0"):
    solve_saddle(losses, jnp.zeros(D, dtype=jnp.int32), psi="chi2", psi_params={"rho": 0.1})


def test_losses_fn_must_return_vector():
  with pytest.raises(ValueError, match="client_losses_fn"):
    solve_saddle(lambda x: jnp.sum(losses(x)), jnp.zeros(D), psi="chi2", psi_params={"rho": 0.1})
