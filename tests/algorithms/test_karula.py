"""Karula (Algorithm 1): unbiasedness of the SAGA estimator (Monte Carlo), convergence to the
CVXPY solution of the constrained problem (full and partial participation), the t = 0 / t large
limits in closed form, the CLI, and bad input."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_dro import models, run, sweep
from fedjax_dro.algorithms import karula
from fedjax_dro.algorithms.karula import estimate_gradient, loss_weights, smoothness_constant
from fedjax_dro.data import from_client_arrays
from tests.helpers import dataset, numpy_linreg_grad

N, DIM, L2 = 6, 4, 0.1


def _ridge_clients(seed=0, n=N, d=DIM):
  """Heterogeneous ridge clients without intercept (three groups of true parameters)."""
  rng = np.random.default_rng(seed)
  sizes = [int(m) for m in rng.integers(8, 20, n)]
  xs, ys = [], []
  for i, m in enumerate(sizes):
    x = rng.normal(size=(m, d)) * (1.0 + 0.3 * (i % 3))
    w = 1.0 + 0.5 * (i % 3) + 0.3 * rng.normal(size=d)
    xs.append(x)
    ys.append(x @ w + 0.3 * rng.normal(size=m))
  return from_client_arrays(xs, ys, dtype=np.float64)


def _random_dissimilarity(n=N, seed=1):
  rng = np.random.default_rng(seed)
  a = rng.uniform(0.5, 2.0, (n, n))
  D = (a + a.T) / 2
  np.fill_diagonal(D, 0.0)
  return D


def _client_arrays(data):
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  return [(x[i, : nex[i]], y[i, : nex[i]]) for i in range(data.num_clients)], nex


def _alpha(nex):
  return len(nex) * nex / nex.sum()


def _local_ridge(data, l2=L2):
  clients, _ = _client_arrays(data)
  d = clients[0][0].shape[1]
  return np.stack(
    [np.linalg.solve(x.T @ x / len(y) + l2 * np.eye(d), x.T @ y / len(y)) for x, y in clients]
  )


def _pooled_ridge(data, l2=L2):
  """argmin sum_i alpha_i f_i(theta), alpha_i = n N_i / sum N  <=>  (X^T X + l2 sum N I) th = X^T y."""
  clients, nex = _client_arrays(data)
  X = np.concatenate([c[0] for c in clients])
  y = np.concatenate([c[1] for c in clients])
  return np.linalg.solve(X.T @ X + l2 * nex.sum() * np.eye(X.shape[1]), X.T @ y)


def _cvxpy_solution(data, D, t, l2=L2):
  """The solution of the constrained problem: CVXPY (CLARABEL, tight) and a Newton polish.

  The conic reformulation of ``sum_squares`` limits CLARABEL to ~1e-6 on theta here (its answers
  at tolerances 1e-8 / 1e-10 / 1e-12 differ by ~1e-6), so the CVXPY point and multipliers are
  polished by solving the KKT system restricted to CVXPY's active set (stationarity
  ``(alpha_i/n) grad f_i + sum_j 2 mu_ij (theta_i - theta_j) = 0`` and ``||theta_i - theta_j||^2 =
  t D_ij`` on active edges) with scipy's ``root``; the result is certified by the full KKT
  conditions (multipliers > 0, all constraints satisfied, residual < 1e-12).
  """
  import cvxpy as cp
  from scipy import optimize

  clients, nex = _client_arrays(data)
  n, d = len(clients), clients[0][0].shape[1]
  alpha = _alpha(nex)
  T = cp.Variable((n, d))
  obj = sum(
    alpha[i] / n * (0.5 / nex[i] * cp.sum_squares(x @ T[i] - y) + l2 / 2 * cp.sum_squares(T[i]))
    for i, (x, y) in enumerate(clients)
  )
  edges = [(i, j) for i in range(n) for j in range(i + 1, n)]
  cons = [cp.sum_squares(T[i] - T[j]) <= t * D[i, j] for i, j in edges]
  with warnings.catch_warnings():  # "solution may be inaccurate": polished below
    warnings.simplefilter("ignore", UserWarning)
    cp.Problem(cp.Minimize(obj), cons).solve(
      solver="CLARABEL",
      tol_gap_abs=1e-10,
      tol_gap_rel=1e-10,
      tol_feas=1e-10,
      tol_ktratio=1e-10,
      max_iter=500,
    )
  raw = T.value
  mu = np.array([float(np.ravel(c.dual_value)[0]) for c in cons])
  active = [e for e, m in zip(edges, mu) if m > 1e-6 * max(mu.max(), 1e-300)]
  H = [(alpha[i] / n) * (x.T @ x / nex[i] + l2 * np.eye(d)) for i, (x, y) in enumerate(clients)]
  b = [(alpha[i] / n) * x.T @ y / nex[i] for i, (x, y) in enumerate(clients)]

  def kkt(z, edges_, mus=None):
    th = z[: n * d].reshape(n, d)
    m = z[n * d :] if mus is None else mus
    station = np.stack([H[i] @ th[i] - b[i] for i in range(n)])
    for (i, j), mij in zip(edges_, m):
      station[i] += 2 * mij * (th[i] - th[j])
      station[j] -= 2 * mij * (th[i] - th[j])
    feas = [np.sum((th[i] - th[j]) ** 2) - t * D[i, j] for i, j in edges_]
    return np.concatenate([station.ravel(), feas])

  mu_a = np.array([m for e, m in zip(edges, mu) if e in active])
  sol = optimize.root(
    kkt, np.concatenate([raw.ravel(), mu_a]), args=(active,), method="hybr", options={"xtol": 1e-15}
  )
  theta, mu_a = sol.x[: n * d].reshape(n, d), sol.x[n * d :]
  assert np.all(mu_a > 0)
  assert np.max(np.abs(kkt(sol.x, active))) < 1e-12
  d2 = ((theta[:, None] - theta[None]) ** 2).sum(-1)
  assert np.max(d2 - t * D) < 1e-12
  assert np.max(np.abs(theta - raw)) < 1e-4
  return theta


def _model(intercept=False):
  return models.linear_regression(DIM, l2=L2, fit_intercept=intercept)


# ----------------------------------------------------------------------------------------------
# (1) Unbiasedness of the estimator nu (Monte Carlo over client samplings and minibatches)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [None, 3])
def test_estimator_is_unbiased_for_grad_F(batch_size):
  data = _ridge_clients(seed=3)
  if batch_size is not None:
    data = data.pad_to(data.max_examples + 7)  # padded rows must never be drawn
  model = _model(intercept=True)
  rng = np.random.default_rng(0)
  n, s, K = N, 3, 40_000
  theta = {"w": jnp.asarray(rng.normal(size=(n, DIM))), "b": jnp.asarray(rng.normal(size=n))}
  table = {"w": jnp.asarray(rng.normal(size=(n, DIM))), "b": jnp.asarray(rng.normal(size=n))}
  # exact grad F: block i = (alpha_i / n) grad f_i(theta_i), numpy; coordinates (w_i, b_i) per client
  clients, nex = _client_arrays(data)
  alpha = _alpha(nex)
  per_client = lambda w, b: np.concatenate([np.asarray(w), np.asarray(b)[..., None]], axis=-1)
  exact = np.concatenate(
    [
      alpha[i]
      / n
      * np.append(*numpy_linreg_grad(np.asarray(theta["w"][i]), float(theta["b"][i]), x, y, L2))
      for i, (x, y) in enumerate(clients)
    ]
  )
  est = jax.jit(
    jax.vmap(
      lambda k: (
        estimate_gradient(
          model, theta, table, data, k, clients_per_round=s, batch_size=batch_size, backend="vmap"
        ).nu
      )
    )
  )(jax.random.split(jax.random.PRNGKey(42), K))
  flat = per_client(est["w"], est["b"]).reshape(K, -1)
  stored = per_client(table["w"], table["b"]).reshape(-1)
  mean, se = flat.mean(0), flat.std(0, ddof=1) / np.sqrt(K)
  assert np.all(se > 0)
  z = (mean - exact) / se
  # every coordinate within 5.5 standard errors (family-wise false alarm ~ 30 * 4e-8), and the
  # chi-square statistic of all coordinates below its 1 - 1e-6 quantile
  assert np.max(np.abs(z)) < 5.5, np.max(np.abs(z))
  assert np.sum(z**2) < stats.chi2.ppf(1 - 1e-6, z.size)
  # the test has power: the paper's 1/s applied to the 1/n-scaled table (correction (n/s) -> 1/s)
  wrong = stored + (flat - stored) / n
  z_wrong = (wrong.mean(0) - exact) / (wrong.std(0, ddof=1) / np.sqrt(K))
  assert np.max(np.abs(z_wrong)) > 50


def test_full_participation_estimator_is_the_exact_gradient():
  data = _ridge_clients(seed=4)
  model = _model()
  rng = np.random.default_rng(1)
  theta = {"w": jnp.asarray(rng.normal(size=(N, DIM)))}
  table = {"w": jnp.asarray(rng.normal(size=(N, DIM)))}
  est = jax.jit(lambda k: estimate_gradient(model, theta, table, data, k, clients_per_round=N))(
    jax.random.PRNGKey(0)
  )
  clients, nex = _client_arrays(data)
  alpha = _alpha(nex)
  exact = np.stack(
    [
      alpha[i] / N * numpy_linreg_grad(np.asarray(theta["w"][i]), 0.0, x, y, L2)[0]
      for i, (x, y) in enumerate(clients)
    ]
  )
  np.testing.assert_allclose(np.asarray(est.nu["w"]), exact, rtol=1e-12, atol=1e-13)
  np.testing.assert_allclose(np.asarray(est.grad_table["w"]), exact, rtol=1e-12, atol=1e-13)
  np.testing.assert_allclose(np.asarray(loss_weights(data.num_examples)), alpha, rtol=1e-14)


# ----------------------------------------------------------------------------------------------
# (2) + (3) full gradients, s = n: the CVXPY solution, t = 0 (global) and t large (local)
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def problem():
  data = _ridge_clients(seed=0)
  D = _random_dissimilarity()
  loc = _local_ridge(data)
  d2 = ((loc[:, None] - loc[None]) ** 2).sum(-1)
  iu = np.triu_indices(N, 1)
  t_free = float(np.max(d2[iu] / D[iu]))  # every constraint is inactive for t >= t_free
  model = _model()
  L = smoothness_constant(model, model.init(jax.random.PRNGKey(0)), data)  # max_i alpha_i L_i
  return dict(data=data, D=D, t_free=t_free, L=L, model=model)


@pytest.fixture(scope="module")
def full_gradient_sweep(problem):
  ts = [0.0, 0.05 * problem["t_free"], 0.3 * problem["t_free"], 1e6]
  alg = karula(problem["model"], dissimilarity=problem["D"], projection_tol=1e-12)
  res = sweep(
    alg,
    dataset(problem["data"]),
    rounds=600,
    grid={"t": ts},
    hparams={"eta": N / problem["L"]},
    eval_every=300,
  )  # F is (L/n)-smooth
  return ts, res


def test_smoothness_constant_is_max_alpha_L(problem):
  clients, nex = _client_arrays(problem["data"])
  L = max(
    a * (np.linalg.eigvalsh(x.T @ x / len(y)).max() + L2) for a, (x, y) in zip(_alpha(nex), clients)
  )
  np.testing.assert_allclose(problem["L"], L, rtol=1e-6)


def test_full_gradient_karula_matches_cvxpy(problem, full_gradient_sweep):
  ts, res = full_gradient_sweep
  assert not res.diverged.any()
  for row in (1, 2):
    theta = np.asarray(res.final_state.params["w"][row])
    ref = _cvxpy_solution(problem["data"], problem["D"], ts[row])
    np.testing.assert_allclose(theta, ref, atol=1e-8, rtol=0)
    # the constraints bind at these t (so the test is not the unconstrained one)
    d2 = ((ref[:, None] - ref[None]) ** 2).sum(-1)
    assert np.max(d2 / np.where(problem["D"] > 0, problem["D"] * ts[row], np.inf)) > 0.999
  m = res.train_metrics
  assert np.all(m["constraint_violation"][:, -1] < 1e-9)
  assert np.all(m["projection_converged"][:, -1] == 1)
  assert np.all(m["projection_iterations"] >= 0)
  assert np.all(np.isfinite(m["projection_residual"]))
  assert np.all(m["gradient_mapping_sq"][:, -1] < 1e-14)


def test_t_zero_is_the_pooled_global_model_and_t_large_is_local_training(
  problem, full_gradient_sweep
):
  ts, res = full_gradient_sweep
  theta_global = np.asarray(res.final_state.params["w"][0])
  np.testing.assert_allclose(
    theta_global, np.broadcast_to(_pooled_ridge(problem["data"]), (N, DIM)), atol=1e-8, rtol=0
  )
  theta_local = np.asarray(res.final_state.params["w"][3])
  np.testing.assert_allclose(theta_local, _local_ridge(problem["data"]), atol=1e-8, rtol=0)


@pytest.mark.parametrize("method", ["admm", "dykstra"])
def test_other_projection_methods_reach_the_same_solution(problem, method):
  t = 0.3 * problem["t_free"]
  alg = karula(
    problem["model"], dissimilarity=problem["D"], projection=method, projection_tol=1e-10
  )
  hist = run(
    alg,
    dataset(problem["data"]),
    rounds=600,
    eval_every=600,
    hparams={"eta": N / problem["L"], "t": t},
  )
  ref = _cvxpy_solution(problem["data"], problem["D"], t)
  np.testing.assert_allclose(np.asarray(hist.final_state.params["w"]), ref, atol=1e-8, rtol=0)
  assert hist.train_metrics["projection_converged"][-1] == 1
  assert hist.train_metrics["constraint_violation"][-1] < 1e-9


# ----------------------------------------------------------------------------------------------
# (4) partial participation (SAGA), s < n
# ----------------------------------------------------------------------------------------------


def test_partial_participation_converges_to_cvxpy_solution(problem):
  """With exact (full-batch) client gradients the SAGA estimator's variance vanishes at the
  solution (the table converges to grad F(theta*)), so with the theory step 3/(8L) the iterates
  converge linearly to theta* itself (Theorem 4.5 with sigma = 0, delta ~ 0): the tolerance is
  only a rounds budget (measured: error 1e-2 after 1000 rounds, 1e-4 after 2000)."""
  t = 0.3 * problem["t_free"]
  alg = karula(
    problem["model"], dissimilarity=problem["D"], clients_per_round=3, projection_tol=1e-12
  )
  hist = run(
    alg,
    dataset(problem["data"]),
    rounds=5000,
    seed=7,
    eval_every=2500,
    hparams={"eta": 3.0 / (8.0 * problem["L"]), "t": t},
  )
  ref = _cvxpy_solution(problem["data"], problem["D"], t)
  err = np.abs(np.asarray(hist.final_state.params["w"]) - ref).max()
  assert err < 1e-8, err
  assert hist.train_metrics["constraint_violation"][-1] < 1e-9


# ----------------------------------------------------------------------------------------------
# (5) the CLI
# ----------------------------------------------------------------------------------------------


def test_cli_runs_karula_on_synthetic_ridge_with_ot_dissimilarities(capsys):
  from fedjax_dro.cli import main

  # default: D from the OT embeddings of the training data, full participation, eta = 1
  rc = main(
    [
      "run",
      "--algorithm",
      "karula",
      "--dataset",
      "synthetic-ridge",
      "--rounds",
      "50",
      "--no-progress",
    ]
  )
  out = capsys.readouterr().out
  assert rc == 0, out
  assert "karula on synthetic-ridge" in out
  row = [line for line in out.splitlines() if line.startswith("| estimation_error")]
  assert row, out
  # better than the zero initialization (mean ||theta_i*||^2 ~ 50 * 1.5^2) after 50 rounds
  assert float(row[0].split("|")[3]) < 40


# ----------------------------------------------------------------------------------------------
# (6) bad input
# ----------------------------------------------------------------------------------------------


def test_bad_input_raises_clear_errors_naming_the_argument(problem):
  model, D, data = problem["model"], problem["D"], problem["data"]
  with pytest.raises(ValueError, match="hyper-parameter 't'"):
    run(karula(model, dissimilarity=D), dataset(data), rounds=1, hparams={"t": -0.1})
  with pytest.raises(ValueError, match="hyper-parameter 'eta'"):
    run(karula(model, dissimilarity=D), dataset(data), rounds=1, hparams={"eta": 0.0})
  asym = D.copy()
  asym[0, 1] += 0.5
  with pytest.raises(ValueError, match="dissimilarity.*symmetric"):
    karula(model, dissimilarity=asym)
  neg = D.copy()
  neg[0, 1] = neg[1, 0] = -1.0
  with pytest.raises(ValueError, match="dissimilarity.*nonnegative"):
    karula(model, dissimilarity=neg)
  with pytest.raises(ValueError, match="dissimilarity.*square"):
    karula(model, dissimilarity=D[:, :3])
  with pytest.raises(ValueError, match="dissimilarity"):
    karula(model, dissimilarity="wasserstein")
  with pytest.raises(TypeError, match="dissimilarity"):
    karula(model, dissimilarity=np.array([["a"]]))
  wrong = karula(model, dissimilarity=_random_dissimilarity(n=N + 1))
  with pytest.raises(ValueError, match=r"dissimilarity is \(7, 7\).*6 clients"):
    wrong.init(model.init(jax.random.PRNGKey(0)), data, jax.random.PRNGKey(0))
  for s in (1, 0):
    with pytest.raises(ValueError, match="clients_per_round"):
      karula(model, dissimilarity=D, clients_per_round=s)
  too_many = karula(model, dissimilarity=D, clients_per_round=N + 1)
  with pytest.raises(ValueError, match="clients_per_round.*7"):
    too_many.init(model.init(jax.random.PRNGKey(0)), data, jax.random.PRNGKey(0))
  with pytest.raises(TypeError, match="clients_per_round"):
    karula(model, dissimilarity=D, clients_per_round=2.5)
  with pytest.raises(ValueError, match="projection must be one of"):
    karula(model, dissimilarity=D, projection="bregman")
  with pytest.raises(ValueError, match="projection_tol"):
    karula(model, dissimilarity=D, projection_tol=-1.0)
  with pytest.raises(ValueError, match="projection_max_iterations"):
    karula(model, dissimilarity=D, projection_max_iterations=0)
  with pytest.raises(ValueError, match="batch_size"):
    karula(model, dissimilarity=D, batch_size=0)
  with pytest.raises(ValueError, match="weighting"):
    karula(model, dissimilarity=D, weighting="softmax")
  with pytest.raises(ValueError, match="ot_options"):
    karula(model, ot_options={"num_refs": 3})
  with pytest.raises(TypeError, match="model"):
    karula("linear", dissimilarity=D)
