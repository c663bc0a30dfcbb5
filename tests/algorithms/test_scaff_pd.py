"""SCAFF-PD: a plain numpy per-client reference loop (float64, same keys), the parameter rules,
linear convergence to the saddle point of ``solvers.saddle.solve_saddle`` (and DRFA's failure to get
there), the rho -> infinity (ERM) and rho = 0 (AFL, min-max) limits, and bad inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, models, run, sweep
from fedjax_dro.algorithms.scaff_pd import next_step_ratio, parameter_schedule
from fedjax_dro.algorithms.wrappers import with_distances
from fedjax_dro.common.model import client_loss
from fedjax_dro.data.synthetic import synthetic_shift
from fedjax_dro.solvers.saddle import solve_saddle
from tests.helpers import (
  dataset,
  linreg,
  numpy_epoch_batches,
  numpy_linreg_grad,
  regression_clients,
)

L2 = 0.01


# ----------------------------------------------------------------------------------------------
# numpy references (also used by test_dro_baselines.py)
# ----------------------------------------------------------------------------------------------


def np_proj_simplex(v):
  u = np.sort(v)[::-1]
  css = np.cumsum(u) - 1.0
  ind = np.arange(1, v.size + 1)
  cond = u - css / ind > 0
  k = ind[cond][-1]
  return np.maximum(v - css[cond][-1] / k, 0.0)


def np_proj_capped(v, cap):
  lo, hi = v.min() - 1.0, v.max()
  for _ in range(300):
    mid = 0.5 * (lo + hi)
    if np.clip(v - mid, 0.0, cap).sum() > 1.0:
      lo = mid
    else:
      hi = mid
  return np.clip(v - 0.5 * (lo + hi), 0.0, cap)


def np_prox_qffl(z, sigma, q):
  p = 1.0 + 1.0 / q
  out = np.zeros_like(z)
  for i, zi in enumerate(z):
    a, lo, hi = abs(zi), 0.0, abs(zi)
    for _ in range(300):
      mid = 0.5 * (lo + hi)
      if mid + sigma * p * mid ** (1.0 / q) > a:
        hi = mid
      else:
        lo = mid
    out[i] = np.sign(zi) * 0.5 * (lo + hi)
  return out


def np_dual_prox(psi, lam, s, sigma, hp):
  n = lam.size
  if psi == "chi2":
    return np_proj_simplex((lam + sigma * s) / (1.0 + sigma * hp["rho"] * n))
  if psi == "cvar":
    return np_proj_capped(lam + sigma * s, 1.0 / (hp["alpha"] * n))
  return np_prox_qffl(lam + sigma * s, sigma, hp["q"])


def np_batch(data, i, key, batch_size):
  nex = int(data.num_examples[i])
  x, y = np.asarray(data.x[i]), np.asarray(data.y[i])
  if batch_size is None:
    return x[:nex], y[:nex]
  rows = np.asarray(jax.random.randint(key, (batch_size,), 0, nex))
  return x[rows], y[rows]


def np_loss_grad(w, b, x, y, l2):
  r = x @ w + b - y
  loss = 0.5 * np.mean(r**2) + 0.5 * l2 * (w @ w + b * b)
  gw, gb = numpy_linreg_grad(w, b, x, y, l2)
  return loss, gw, gb


def run_keys(seed):
  return jax.random.split(jax.random.PRNGKey(seed), 3)[2]


def ref_scaff_pd(data, rounds, seed, J, B, hp, psi, rule, epochs=None):
  n, d = data.num_clients, data.x.shape[-1]
  w, b = np.zeros(d), 0.0
  lam, prev = np.full(n, 1.0 / n), None
  t, t_prev = 1.0, 1.0
  for r in range(rounds):
    key = jax.random.fold_in(run_keys(seed), r)
    eval_key, local_key = jax.random.split(key)
    ekeys, lkeys = jax.random.split(eval_key, n), jax.random.split(local_key, n)
    L, cw, cb = np.zeros(n), np.zeros((n, d)), np.zeros(n)
    for i in range(n):
      L[i], cw[i], cb[i] = np_loss_grad(w, b, *np_batch(data, i, ekeys[i], B), L2)
    if rule == "user":
      tau, sigma, theta = hp["tau"], hp["sigma"], hp["theta"]
    elif rule == "condition_5_1":
      tau, sigma, theta = hp["tau"] * t, hp["sigma"] / t, t / t_prev
    else:
      kappa = hp["L"] / hp["mu"] + hp["L_lx"] / np.sqrt(hp["mu"] * hp["rho"] * n)
      sk = hp["safety"] * kappa
      tau, sigma, theta = 1 / (sk * hp["mu"]), 1 / (sk * hp["rho"] * n), sk / (1 + sk)
    prev = L if prev is None else prev
    lam = np_dual_prox(psi, lam, (1 + theta) * L - theta * prev, sigma, hp)
    Cw, Cb = lam @ cw, lam @ cb
    duw, dub = np.zeros((n, d)), np.zeros(n)
    for i in range(n):
      uw, ub, steps = w.copy(), b, 0
      if epochs is None:
        batches = (np_batch(data, i, k, B) for k in jax.random.split(lkeys[i], J))
      else:
        xi, yi = np.asarray(data.x[i]), np.asarray(data.y[i])
        batches = numpy_epoch_batches(xi, yi, int(data.num_examples[i]), lkeys[i], B, epochs)
      for batch in batches:
        _, gw, gb = np_loss_grad(uw, ub, *batch, L2)
        uw, ub = uw - hp["client_lr"] * (gw - cw[i] + Cw), ub - hp["client_lr"] * (gb - cb[i] + Cb)
        steps += 1
      duw[i], dub[i] = (w - uw) / (hp["client_lr"] * steps), (b - ub) / (hp["client_lr"] * steps)
    w, b = w - tau * lam @ duw, b - tau * lam @ dub
    prev = L
    if rule == "condition_5_1":
      t_prev, t = t, t / np.sqrt(1 + hp["mu"] * hp["tau"] * t)
  return w, b, lam


@pytest.mark.parametrize(
  "psi,rule,batch_size,epochs",
  [
    ("chi2", "condition_5_1", 4, None),
    ("cvar", "user", None, None),
    ("qffl", "user", None, None),
    ("chi2", "condition_5_2", None, None),
    ("chi2", "user", 4, 2),  # local_epochs over clients of 3 to 16 rows: J_i from 2 to 8
  ],
)
def test_matches_numpy_reference(psi, rule, batch_size, epochs):
  sizes = None if epochs is None else [3, 7, 12, 5, 16]
  data = regression_clients(n=5, d=3, seed=1, shift=0.2, sizes=sizes)
  model = linreg(3, l2=L2)
  work = {"local_steps": 3} if epochs is None else {"local_epochs": epochs}
  alg = A.scaff_pd(
    model, psi=psi, parameter_rule=rule, batch_size=batch_size, backend="vmap", **work
  )
  hp = {
    "client_lr": 0.02,
    "rho": 0.05,
    "alpha": 0.5,
    "q": 2.0,
    "tau": 0.3,
    "sigma": 0.3,
    "theta": 0.6,
    "mu": 0.4,
    "L": 20.0,
    "L_lx": 30.0,
    "safety": 0.5,
  }
  hp = {k: v for k, v in hp.items() if k in alg.hparams}
  hist = run(alg, dataset(data), rounds=4, seed=3, hparams=hp, eval_every=4)
  w, b, lam = ref_scaff_pd(data, 4, 3, 3, batch_size, hp, psi, rule, epochs)
  st = hist.final_state
  np.testing.assert_allclose(np.asarray(st.params["w"]), w, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(st.params["b"]), b, rtol=0, atol=1e-10)
  np.testing.assert_allclose(np.asarray(st.lam), lam, rtol=0, atol=1e-10)
  for name in ("train_loss", "train_loss_max", "lambda_max", "tau", "sigma", "theta"):
    assert hist.train_metrics[name].shape == (4,)
  if psi == "cvar":
    assert np.all(np.asarray(st.lam) <= 1.0 / (0.5 * 5) + 1e-12)


# ----------------------------------------------------------------------------------------------
# parameter rules
# ----------------------------------------------------------------------------------------------


def test_condition_5_1_schedule_follows_the_recurrence():
  """sigma_r = gamma_r tau_r, theta_r = sigma_{r-1}/sigma_r, gamma_{r+1} = gamma_r (1 + mu tau_r),
  sigma_{-1} = gamma_0 tau_0, and tau_r sigma_r constant (tau_{r+1} = tau_r sqrt(gamma_r/gamma_{r+1}))."""
  hp = {"tau": jnp.float64(0.3), "sigma": jnp.float64(2.0), "mu": jnp.float64(0.5)}
  gamma, tau_ref = 2.0 / 0.3, 0.3
  sigma_prev = gamma * tau_ref
  t, t_prev = jnp.float64(1.0), jnp.float64(1.0)
  for _ in range(30):
    tau, sigma, theta = parameter_schedule("condition_5_1", hp, t, t_prev, 5)
    sigma_ref = gamma * tau_ref
    np.testing.assert_allclose(
      [float(tau), float(sigma), float(theta)],
      [tau_ref, sigma_ref, sigma_prev / sigma_ref],
      rtol=1e-12,
    )
    np.testing.assert_allclose(float(tau * sigma), 0.6, rtol=1e-12)
    gamma_next = gamma * (1 + 0.5 * tau_ref)
    tau_ref, gamma, sigma_prev = tau_ref * np.sqrt(gamma / gamma_next), gamma_next, sigma_ref
    t, t_prev = next_step_ratio("condition_5_1", hp, t), t
  assert float(theta) < 1.0 and float(tau) < 0.3 / 3  # accelerated: tau_r ~ 2 / (mu r)


def test_condition_5_2_parameters():
  hp = {"mu": 0.5, "L": 3.0, "L_lx": 2.0, "rho": 0.1, "safety": 2.0}
  n = 4
  tau, sigma, theta = parameter_schedule("condition_5_2", hp, 1.0, 1.0, n)
  kappa = 3.0 / 0.5 + 2.0 / np.sqrt(0.5 * 0.4)
  np.testing.assert_allclose(0.5 * tau, (1 - theta) / theta, rtol=1e-12)
  np.testing.assert_allclose(0.4 * sigma, (1 - theta) / theta, rtol=1e-12)
  np.testing.assert_allclose(1 / (1 - theta), 1 + 2.0 * kappa, rtol=1e-12)


# ----------------------------------------------------------------------------------------------
# convergence to the saddle point of the centralized solver
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shift_problem():
  ds = synthetic_shift(1, num_clients=4, dim=4, num_examples=30)
  model = models.linear_regression(4, l2=L2, fit_intercept=False)
  tr = ds.train
  losses = lambda p: jax.vmap(lambda x, y, m: client_loss(model, p, x, y, m))(tr.x, tr.y, tr.mask)
  return ds, model, losses


def test_linear_convergence_deterministic_and_drfa_stays_far(shift_problem):
  ds, model, losses = shift_problem
  rho = 0.05
  sol = solve_saddle(losses, model.init(jax.random.PRNGKey(0)), psi="chi2", psi_params={"rho": rho})
  assert sol.converged
  R = 60
  alg = with_distances(A.scaff_pd(model, psi="chi2", local_steps=20, backend="vmap"), [sol.x_star])
  hist = run(
    alg,
    ds,
    rounds=R,
    hparams={"rho": rho, "tau": 1.0, "sigma": 1.0, "theta": 1.0, "client_lr": 0.01},
    eval_every=R,
  )
  dist = hist.train_metrics["dist_to_opt_0"]
  assert dist[-1] < 1e-10, dist[-1]
  # a straight line on the log plot until round-off: constant contraction factor
  logd = np.log10(dist)
  mid = np.flatnonzero((dist < 1e-2) & (dist > 1e-20))
  assert mid.size >= 10
  slope, icpt = np.polyfit(mid, logd[mid], 1)
  assert slope < -0.2
  assert np.max(np.abs(logd[mid] - (slope * mid + icpt))) < 1.5
  # DRFA-Prox (lambda-sampled clients, as in the paper) over a small step-size grid
  drfa = with_distances(
    A.drfa(model, psi="chi2", prox=True, local_steps=20, backend="vmap"), [sol.x_star]
  )
  res = sweep(
    drfa,
    ds,
    rounds=R,
    grid={"client_lr": [0.003, 0.01, 0.03], "gamma": [1e-3, 1e-2]},
    hparams={"rho": rho},
    eval_every=R,
  )
  best_drfa = np.nanmin(res.train_metrics["dist_to_opt_0"][:, -1])
  assert best_drfa > 1e4 * max(dist[-1], 1e-20) and best_drfa > 1e-6, best_drfa


def _uniform_erm(ds, l2):
  tr = ds.train
  d = tr.x.shape[-1]
  H, g = np.zeros((d, d)), np.zeros(d)
  for i, k in enumerate(np.asarray(tr.num_examples)):
    x, y = np.asarray(tr.x[i, :k]), np.asarray(tr.y[i, :k])
    H += x.T @ x / k / tr.num_clients
    g += x.T @ y / k / tr.num_clients
  return np.linalg.solve(H + l2 * np.eye(d), g)


def test_large_rho_approaches_erm(shift_problem):
  ds, model, losses = shift_problem
  erm = _uniform_erm(ds, L2)
  x0 = model.init(jax.random.PRNGKey(0))
  gaps = []
  for rho in (1.0, 100.0):
    sol = solve_saddle(losses, x0, psi="chi2", psi_params={"rho": rho})
    gaps.append(np.linalg.norm(np.asarray(sol.x_star["w"]) - erm))
  assert 0.005 < gaps[1] / gaps[0] < 0.02 and gaps[1] < 1e-4, gaps  # ||x*_rho - x_ERM|| ~ 1/rho
  np.testing.assert_allclose(np.asarray(sol.lambda_star), 0.25, atol=1e-3)
  alg = A.scaff_pd(model, psi="chi2", local_steps=20, backend="vmap")
  hist = run(
    alg,
    ds,
    rounds=60,
    hparams={"rho": 100.0, "tau": 1.0, "sigma": 0.3, "client_lr": 0.02},
    eval_every=60,
  )
  np.testing.assert_allclose(
    np.asarray(hist.final_state.params["w"]), np.asarray(sol.x_star["w"]), atol=1e-9
  )


def test_rho_zero_minimizes_worst_client_loss(shift_problem):
  """rho = 0 is AFL: x* minimizes max_i f_i; SCAFF-PD (Condition 5.1) gets there."""
  ds, model, losses = shift_problem
  sol = solve_saddle(losses, model.init(jax.random.PRNGKey(0)), psi="chi2", psi_params={"rho": 0.0})
  assert sol.converged
  worst_star = float(jnp.max(losses(sol.x_star)))
  np.testing.assert_allclose(worst_star, float(sol.objective), rtol=1e-9)
  erm = {"w": jnp.asarray(_uniform_erm(ds, L2))}
  assert float(jnp.max(losses(erm))) > worst_star + 1e-3
  alg = A.scaff_pd(
    model, psi="chi2", parameter_rule="condition_5_1", local_steps=20, backend="vmap"
  )
  hist = run(
    alg,
    ds,
    rounds=80,
    hparams={"rho": 0.0, "tau": 3.0, "sigma": 1.0, "mu": 0.3, "client_lr": 0.03},
    eval_every=80,
  )
  x = hist.final_state.params
  assert float(jnp.sum((x["w"] - sol.x_star["w"]) ** 2)) < 1e-12
  np.testing.assert_allclose(float(jnp.max(losses(x))), worst_star, rtol=1e-6)
  assert hist.train_metrics["theta"][-1] < 1.0  # accelerated schedule is active


# ----------------------------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------------------------


def test_bad_inputs():
  model = linreg(3)
  with pytest.raises(ValueError, match="psi"):
    A.scaff_pd(model, psi="kl")
  with pytest.raises(ValueError, match="parameter_rule"):
    A.scaff_pd(model, parameter_rule="condition_9")
  with pytest.raises(ValueError, match="condition_5_2"):
    A.scaff_pd(model, psi="cvar", parameter_rule="condition_5_2")
  with pytest.raises(ValueError, match="local_steps"):
    A.scaff_pd(model, local_steps=0)
  with pytest.raises(ValueError, match="batch_size"):
    A.scaff_pd(model, batch_size=0)
  alg = A.scaff_pd(model)
  for bad in (
    {"sigma": -0.1},
    {"tau": -1.0},
    {"tau": 0.0},
    {"client_lr": 0.0},
    {"theta": 1.5},
    {"rho": -1.0},
    {"sigma": float("nan")},
  ):
    with pytest.raises(ValueError, match=list(bad)[0]):
      A.make_hparams(alg, bad)
  with pytest.raises(ValueError, match="alpha"):
    A.make_hparams(A.scaff_pd(model, psi="cvar"), {"alpha": 1.5})
  with pytest.raises(ValueError, match="alpha"):
    A.make_hparams(A.scaff_pd(model, psi="cvar"), {"alpha": 0.0})
  with pytest.raises(ValueError, match="q"):
    A.make_hparams(A.scaff_pd(model, psi="qffl"), {"q": -1.0})
  with pytest.raises(ValueError, match="rho"):  # Condition 5.2 needs strong concavity
    A.make_hparams(A.scaff_pd(model, parameter_rule="condition_5_2"), {"rho": 0.0})
  with pytest.raises(ValueError, match="unknown hyper-parameter"):
    A.make_hparams(alg, {"mu": 0.1})  # mu belongs to the Condition 5.x rules
