"""Tests for fedjax_dro.solvers.dro: the DRO problems as objects.

Oracles: the dual prox dispatcher these objects replaced (copied below as it was: it called the
prox steps of ``solvers.simplex``), the closed forms of psi, CVXPY + CLARABEL for the best
responses (the maximization over Lambda solved as a conic program), random feasible points for
the optimality of each prox, and loops of scalar problems for ``jax.vmap`` over the parameter.
"""

import warnings

import cvxpy as cp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import solvers
from fedjax_dro.core.hparams import HParam
from fedjax_dro.core.precision import float64
from fedjax_dro.solvers.dro import (
  KL,
  PSI_NAMES,
  QFFL,
  Chi2,
  CVaR,
  DROProblem,
  as_problem,
  chi2,
  cvar,
  initial_lambda,
  kl,
  qffl,
  resolve,
)
from fedjax_dro.solvers.simplex import (
  project_capped_simplex,
  project_simplex,
  prox_chi2,
  prox_cvar,
  prox_qffl,
)

CLARABEL_OPTS = dict(
  tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, tol_ktratio=1e-9, max_iter=500
)

# (name, params, problem): every problem and the corner cases of its parameter
PROBLEMS = [
  ("chi2", {"rho": 0.0}, chi2(0.0)),
  ("chi2", {"rho": 0.3}, chi2(0.3)),
  ("chi2", {"rho": 50.0}, chi2(50.0)),
  ("cvar", {"alpha": 0.1}, cvar(0.1)),  # alpha <= 1/n: the simplex
  ("cvar", {"alpha": 0.4}, cvar(0.4)),
  ("cvar", {"alpha": 1.0}, cvar(1.0)),  # the uniform point
  ("qffl", {"q": 0.0}, qffl(0.0)),
  ("qffl", {"q": 0.5}, qffl(0.5)),
  ("qffl", {"q": 3.0}, qffl(3.0)),
  ("qffl", {"q": 0.0, "norm": "l2"}, qffl(0.0, "l2")),
  ("qffl", {"q": 2.0, "norm": "l2"}, qffl(2.0, "l2")),
]
IDS = [f"{name}-{params}" for name, params, _ in PROBLEMS]


def old_dual_prox(name, lambda_r, s, sigma, **params):
  """``solvers.simplex.dual_prox`` as it was before the problem objects (the oracle of their
  ``prox``)."""
  fns = {"chi2": prox_chi2, "cvar": prox_cvar, "qffl": prox_qffl}
  return fns[name](lambda_r, s, sigma, **params)


def old_psi_value(name, lam, **params):
  """``solvers.simplex.psi_value`` as it was (closed forms in NumPy)."""
  lam = np.asarray(lam, np.float64)
  n = lam.shape[0]
  if name == "chi2":
    return params["rho"] / (2.0 * n) * np.sum((n * lam - 1.0) ** 2)
  if name == "cvar":
    return 0.0
  q, norm = params["q"], params.get("norm", "lp")
  if q == 0:
    inside = np.max(np.abs(lam)) <= 1 if norm == "lp" else np.linalg.norm(lam) <= 1
    return 0.0 if inside else np.inf
  p = 1 + 1 / q
  return np.sum(np.abs(lam) ** p) if norm == "lp" else np.linalg.norm(lam) ** p


def _inputs(seed, n=7):
  rng = np.random.default_rng(seed)
  lam_r = rng.dirichlet(np.ones(n))
  s = rng.normal(size=n) * 2.0
  return jnp.asarray(lam_r), jnp.asarray(s)


# --------------------------------------------------------------------------------------------
# prox: the existing dual prox step, and the minimizer of its objective
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params,problem", PROBLEMS, ids=IDS)
def test_prox_equals_the_existing_dual_prox(name, params, problem):
  with float64():
    for seed in range(4):
      lam_r, s = _inputs(seed)
      for sigma in (0.05, 0.7, 20.0):
        got = problem.prox(lam_r, s, sigma)
        want = old_dual_prox(name, lam_r, s, sigma, **params)
        assert got.dtype == want.dtype == jnp.float64
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        # and the same object built from the name
        np.testing.assert_array_equal(as_problem(name, **params).prox(lam_r, s, sigma), got)


def _random_feasible(rng, problem, n, count):
  """Random points of Lambda (the simplex, its capped subset, or R^n for q-FFL)."""
  if isinstance(problem, QFFL):
    pts = rng.normal(size=(count, n))
    if float(problem.q) == 0:  # psi is the indicator of the unit ball: stay inside it
      if problem.norm == "lp":
        pts = np.clip(pts, -1, 1)
      else:
        pts = pts / np.maximum(1, np.linalg.norm(pts, axis=1, keepdims=True))
    return pts
  pts = rng.dirichlet(np.ones(n) * 0.5, size=count)
  if isinstance(problem, CVaR):
    cap = 1 / (float(problem.alpha) * n)
    pts = np.stack([np.asarray(project_capped_simplex(jnp.asarray(p), cap)) for p in pts])
  return pts


@pytest.mark.parametrize("name,params,problem", PROBLEMS, ids=IDS)
def test_prox_minimizes_its_objective(name, params, problem):
  """The prox output beats random points of Lambda and random feasible perturbations of itself
  on psi(l) - <s, l> + ||l - lam_r||^2 / (2 sigma) (psi by its closed form)."""
  rng = np.random.default_rng(11)
  n, sigma = 6, 0.8
  lam_r, s = _inputs(3, n)
  lam_r_np, s_np = np.asarray(lam_r), np.asarray(s)
  with float64():
    out = np.asarray(problem.prox(lam_r, s, sigma))

  def obj(l):
    return old_psi_value(name, l, **params) - s_np @ l + np.sum((l - lam_r_np) ** 2) / (2 * sigma)

  best = obj(out)
  assert np.isfinite(best)
  for trial in _random_feasible(rng, problem, n, 200):
    assert best <= obj(trial) + 1e-12
  for _ in range(50):
    d = rng.normal(size=n) * 1e-4
    if isinstance(problem, QFFL):
      trial = out + d
      if float(problem.q) == 0 and problem.norm == "lp":  # stay in the unit box
        trial = np.clip(trial, -1, 1)
      elif float(problem.q) == 0:  # stay in the unit ball
        trial = trial / max(1.0, np.linalg.norm(trial))
    elif isinstance(problem, CVaR):
      cap = 1 / (float(problem.alpha) * n)
      trial = np.asarray(project_capped_simplex(jnp.asarray(out + d), cap))
    else:
      trial = np.asarray(project_simplex(jnp.asarray(out + d)))
    assert best <= obj(trial) + 1e-12


def test_chi2_prox_kkt():
  """The chi^2 prox on the simplex: grad of the prox objective + eta is 0 on the support and
  >= 0 off it, for one multiplier eta."""
  n, sigma, rho = 8, 0.6, 0.4
  lam_r, s = _inputs(5, n)
  with float64():
    out = np.asarray(chi2(rho).prox(lam_r, s, sigma))
  g = rho * (n * out - 1) - np.asarray(s) + (out - np.asarray(lam_r)) / sigma
  support = out > 1e-14
  eta = -np.mean(g[support])
  np.testing.assert_allclose(g[support] + eta, 0, atol=1e-12)
  assert np.all(g[~support] + eta >= -1e-12)
  assert abs(out.sum() - 1) < 1e-14 and out.min() >= 0


# --------------------------------------------------------------------------------------------
# value and best response: closed forms and CVXPY
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params,problem", PROBLEMS, ids=IDS)
def test_value_matches_the_closed_form(name, params, problem):
  rng = np.random.default_rng(2)
  pts = [rng.dirichlet(np.ones(5)), rng.normal(size=5) * 0.3, rng.normal(size=5) * 3.0]
  for lam in pts:
    got = float(problem.value(jnp.asarray(lam)))
    want = old_psi_value(name, lam, **params)
    if np.isinf(want):
      assert got == want
    else:
      np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)


def test_value_special_points():
  lam = jnp.array([0.1, 0.2, 0.3, 0.4])
  assert float(chi2(3.0).value(jnp.full(4, 0.25))) == 0.0
  assert float(cvar(0.5).value(lam)) == 0.0
  assert float(qffl(0.0).value(2 * lam / 0.4)) == np.inf
  assert float(kl(0.7).value(jnp.full(4, 0.25))) == 0.0
  # kl: lam sum p log(n p), with 0 log 0 = 0
  p = np.array([0.5, 0.5, 0.0, 0.0])
  np.testing.assert_allclose(kl(0.7).value(jnp.asarray(p)), 0.7 * np.log(2), rtol=1e-15)
  np.testing.assert_allclose(
    kl(2.0).value(lam), 2.0 * np.sum(np.asarray(lam) * np.log(4 * np.asarray(lam))), rtol=1e-14
  )


def _cvx_best_response(problem, f):
  """argmax_{l in Lambda} <l, f> - psi(l) by CLARABEL, and the maximum."""
  n = f.shape[0]
  lam = cp.Variable(n)
  cons = []
  if isinstance(problem, Chi2):
    rho = float(problem.rho)
    obj = f @ lam - rho / (2 * n) * cp.sum_squares(n * lam - 1)
    cons = [lam >= 0, cp.sum(lam) == 1]
  elif isinstance(problem, CVaR):
    obj = f @ lam
    cons = [lam >= 0, cp.sum(lam) == 1, lam <= 1 / (float(problem.alpha) * n)]
  elif isinstance(problem, KL):
    t = float(problem.lam)
    obj = f @ lam + t * cp.sum(cp.entr(lam)) - t * np.log(n)
    cons = [lam >= 0, cp.sum(lam) == 1]
  else:
    q, norm = float(problem.q), problem.norm
    if q == 0:
      obj = f @ lam
      cons = [cp.norm(lam, "inf") <= 1] if norm == "lp" else [cp.norm(lam, 2) <= 1]
    else:
      p = 1 + 1 / q
      psi = cp.sum(cp.power(cp.abs(lam), p)) if norm == "lp" else cp.power(cp.norm(lam, 2), p)
      obj = f @ lam - psi
  prob = cp.Problem(cp.Maximize(obj), cons)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    prob.solve(solver=cp.CLARABEL, **CLARABEL_OPTS)
  assert prob.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE), prob.status
  return lam.value, prob.value


BR_PROBLEMS = [p for _, _, p in PROBLEMS if not (isinstance(p, Chi2) and float(p.rho) == 0)]
BR_PROBLEMS += [kl(0.3), kl(1.0), kl(5.0)]


@pytest.mark.parametrize("problem", BR_PROBLEMS, ids=repr)
def test_best_response_and_robust_objective_match_cvxpy(problem):
  rng = np.random.default_rng(4)
  # distinct losses: the argmax of a non-strongly-concave problem (CVaR) is then unique
  f = np.sort(rng.uniform(0.2, 2.0, size=6))[rng.permutation(6)]
  with float64():
    lam = np.asarray(problem.best_response(jnp.asarray(f)))
    phi = float(problem.robust_objective(jnp.asarray(f)))
  lam_cvx, phi_cvx = _cvx_best_response(problem, f)
  # power and exponential cones: CLARABEL reaches ~1e-7 in the point, ~1e-9 in the value
  np.testing.assert_allclose(lam, lam_cvx, atol=2e-5)
  np.testing.assert_allclose(phi, phi_cvx, rtol=1e-7, atol=1e-8)
  # the robust objective is the value at the best response, and no point of Lambda beats it
  own = f @ lam - float(problem.value(jnp.asarray(lam)))
  np.testing.assert_allclose(phi, own, rtol=1e-13, atol=1e-14)
  for trial in _random_feasible(rng, problem, 6, 100) if not isinstance(problem, KL) else []:
    assert own >= f @ trial - float(problem.value(jnp.asarray(trial))) - 1e-12


def test_best_response_closed_forms():
  f = jnp.array([0.3, 1.2, 0.7, 1.2])
  # chi2, rho = 0: one-hot on the first argmax
  np.testing.assert_array_equal(chi2(0.0).best_response(f), [0, 1, 0, 0])
  np.testing.assert_allclose(chi2(0.0).robust_objective(f), 1.2, rtol=0)
  # kl: the softmax weights, and lam log mean exp(f / lam)
  t = 0.4
  w = np.exp(np.asarray(f) / t)
  np.testing.assert_allclose(kl(t).best_response(f), w / w.sum(), rtol=1e-14)
  np.testing.assert_allclose(kl(t).robust_objective(f), t * np.log(np.mean(w)), rtol=1e-14)
  # kl: large lam -> the mean (ERM), small lam -> the max (AFL)
  np.testing.assert_allclose(kl(1e6).robust_objective(f), np.mean(f), rtol=1e-6)
  np.testing.assert_allclose(kl(1e-3).robust_objective(f), 1.2, atol=1e-2)
  # cvar: alpha = 1 is the mean, alpha = 1/n the max
  np.testing.assert_allclose(cvar(1.0).robust_objective(f), np.mean(f), rtol=1e-15)
  np.testing.assert_allclose(cvar(0.25).robust_objective(f), 1.2, rtol=1e-15)
  # qffl: q = 1 is (1/2) sum f^2 / 2
  np.testing.assert_allclose(qffl(1.0).robust_objective(f), np.sum(np.asarray(f) ** 2) / 4)


def test_kl_robust_objective_is_stable_for_large_losses():
  f = jnp.array([800.0, 1000.0, 900.0])
  np.testing.assert_allclose(kl(1.0).robust_objective(f), 1000.0 - np.log(3), rtol=1e-15)
  assert np.all(np.isfinite(kl(1.0).best_response(f)))


# --------------------------------------------------------------------------------------------
# pytrees: jit and vmap over the parameter
# --------------------------------------------------------------------------------------------
def test_problems_are_pytrees_with_a_static_norm():
  assert jax.tree.leaves(qffl(2.0, "l2")) == [2.0]
  assert jax.tree.structure(qffl(2.0, "l2")) != jax.tree.structure(qffl(2.0))
  assert jax.tree.leaves(cvar(0.3)) == [0.3]
  for problem in (chi2(0.2), cvar(0.3), qffl(2.0, "l2"), kl(0.5)):
    again = jax.tree.unflatten(jax.tree.structure(problem), jax.tree.leaves(problem))
    assert again == problem and isinstance(again, DROProblem)


@pytest.mark.parametrize(
  "factory,values",
  [
    (chi2, [0.0, 0.1, 2.0]),
    (cvar, [0.1, 0.5, 1.0]),
    (qffl, [0.0, 0.5, 4.0]),
    (lambda q: qffl(q, "l2"), [0.0, 0.5, 4.0]),
    (kl, [0.2, 1.0, 3.0]),
  ],
)
def test_vmap_and_jit_over_the_parameter(factory, values):
  lam_r, s = _inputs(8, 5)
  f = jnp.abs(s)
  params = jnp.asarray(values)

  def all_of(problem):
    out = {"value": problem.value(lam_r), "best": problem.best_response(f)}
    out["phi"] = problem.robust_objective(f)
    if problem.has_prox:
      out["prox"] = problem.prox(lam_r, s, 0.5)
    return out

  built_inside = jax.jit(jax.vmap(lambda v: all_of(factory(v))))(params)
  batched = jax.vmap(all_of)(factory(params))  # a batch of problems, one pytree
  for i, v in enumerate(values):
    one = all_of(factory(v))
    for key, want in one.items():
      np.testing.assert_allclose(built_inside[key][i], want, rtol=1e-14, atol=1e-15)
      np.testing.assert_allclose(batched[key][i], want, rtol=1e-14, atol=1e-15)


def test_jit_takes_the_problem_as_an_argument():
  lam_r, s = _inputs(9, 5)
  step = jax.jit(lambda problem, l, v: problem.prox(l, v, 0.5))
  for problem in (chi2(0.3), cvar(0.4), qffl(1.5)):
    np.testing.assert_array_equal(step(problem, lam_r, s), problem.prox(lam_r, s, 0.5))


# --------------------------------------------------------------------------------------------
# hyper-parameters and strings
# --------------------------------------------------------------------------------------------
def test_hparams_specs_and_rebuilding_from_hparams():
  assert chi2().hparams() == {
    "rho": HParam(0.1, "chi^2 penalty strength rho (0 = AFL, large = ERM)", 0.0, False, None)
  }
  assert cvar(0.3).hparams()["alpha"] == HParam(
    0.3, "CVaR level alpha: Lambda = {simplex, lambda_i <= 1/(alpha n)}", 0.0, True, 1.0
  )
  assert qffl().hparams()["q"].default == 1.0
  assert kl(2.0).hparams("doc")["lam"] == HParam(2.0, "doc", 0.0, True, None)
  rebuilt = cvar(0.3).from_hparams({"alpha": jnp.float64(0.7), "client_lr": 1.0})
  assert isinstance(rebuilt, CVaR) and float(rebuilt.alpha) == 0.7
  assert qffl(2.0, "l2").from_hparams({"q": 3.0}).norm == "l2"
  # traced: a round rebuilds the problem inside jit
  out = jax.jit(lambda h: chi2().from_hparams(h).rho * 2)({"rho": 0.25})
  assert float(out) == 0.5


def test_strings_become_problems():
  assert PSI_NAMES == ("chi2", "cvar", "qffl", "kl")
  assert as_problem("cvar", alpha=0.3) == cvar(0.3)
  assert as_problem("qffl", q=2.0, norm="l2") == qffl(2.0, "l2")
  assert as_problem(kl(0.5)) == kl(0.5)
  assert resolve("chi2") == chi2(0.1)
  assert resolve("chi2", rho=0.0) == chi2(0.0)
  assert resolve("cvar", rho=0.0) == cvar(0.5)  # a default for another problem is ignored
  assert resolve(cvar(0.2), alpha=0.9) == cvar(0.2)
  assert [resolve(n).name for n in PSI_NAMES] == list(PSI_NAMES)
  assert solvers.cvar is cvar and solvers.as_problem is as_problem
  np.testing.assert_array_equal(initial_lambda(4), np.full(4, 0.25))


def test_kl_has_no_prox():
  with pytest.raises(NotImplementedError, match="prox"):
    kl(1.0).prox(jnp.full(3, 1 / 3), jnp.ones(3), 1.0)
  assert not KL.has_prox and Chi2.has_prox


L3 = jnp.full(3, 1 / 3)
S3 = jnp.ones(3)


@pytest.mark.parametrize(
  "call,argname",
  [
    (lambda: chi2(-0.1), "rho"),
    (lambda: chi2(float("nan")), "rho"),
    (lambda: cvar(0.0), "alpha"),
    (lambda: cvar(1.5), "alpha"),
    (lambda: cvar(jnp.array([0.5, 2.0])), "alpha"),
    (lambda: qffl(-1.0), "q"),
    (lambda: qffl(1.0, norm="l1"), "norm"),
    (lambda: kl(0.0), "lam"),
    (lambda: as_problem("tv"), "psi"),
    (lambda: as_problem(0.5), "psi"),
    (lambda: resolve("entropy"), "psi"),
    (lambda: as_problem("chi2"), "rho"),
    (lambda: as_problem("chi2", rho=1.0, alpha=0.5), "alpha"),
    (lambda: as_problem(chi2(0.1), rho=1.0), "psi"),
    (lambda: Chi2(-1.0).value(L3), "rho"),
    (lambda: CVaR(2.0).prox(L3, S3, 1.0), "alpha"),
    (lambda: QFFL(1.0, "l3").best_response(S3), "norm"),
    (lambda: chi2(0.1).prox(L3, S3, 0.0), "sigma"),
    (lambda: chi2(0.1).prox(L3, jnp.ones(4), 1.0), "s"),
    (lambda: chi2(0.1).best_response(jnp.ones((2, 3))), "losses"),
    (lambda: cvar(0.5).value(jnp.ones(0)), "lam"),
    (lambda: chi2(0.1).from_hparams({"alpha": 0.5}), "rho"),
    (lambda: chi2(jnp.array([0.1, 0.2])).hparams(), "rho"),
  ],
)
def test_bad_inputs_raise_value_errors_naming_the_argument(call, argname):
  with pytest.raises(ValueError, match=argname):
    call()
