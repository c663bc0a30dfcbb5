"""FedAvg / FedProx / SCAFFOLD / FedSGD against plain per-client Python reference loops (numpy
gradients, float64, the same sampled clients and minibatch rows)."""

import jax
import numpy as np
import pytest

from fedjax_dro import algorithms as A, run
from fedjax_dro.core.sampling import sample_clients, step_rows
from tests.helpers import dataset, linreg, numpy_linreg_grad, regression_clients

L2 = 0.01


def _reference(name, data, rounds, seed, s, J, B, hp, weighting=None):
  """Plain Python re-implementation reusing only the key schedule of the simulator.

  ``weighting`` (SCAFFOLD): ``None``/``"uniform"``, the paper's plain means, or
  ``"num_examples"``: ``x`` moves by the ``p``-weighted mean of the participants' deltas and
  ``c <- c + sum_{i in S} p_i (c_i+ - c_i)`` with ``p_i = n_i / sum_j n_j``."""
  n, d = data.num_clients, data.x.shape[-1]
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  _, _, run_key = jax.random.split(jax.random.PRNGKey(seed), 3)
  w, b = np.zeros(d), 0.0
  c_w, c_b = np.zeros(d), 0.0
  ci_w, ci_b = np.zeros((n, d)), np.zeros(n)
  for r in range(rounds):
    key = jax.random.fold_in(run_key, r)
    sample_key, local_key = jax.random.split(key)
    idx = np.asarray(sample_clients(sample_key, n, s))
    client_keys = jax.random.split(local_key, s)
    dws, dbs, weights, new_c = [], [], [], []
    for k, i in enumerate(idx):
      uw, ub = w.copy(), b
      # the minibatch rows of every step from the simulator's key schedule
      all_rows = None if B is None else np.asarray(step_rows(client_keys[k], nex[i], B, J))
      for t in range(J):
        if B is None:
          bx, by = x[i, : nex[i]], y[i, : nex[i]]
        else:
          bx, by = x[i, all_rows[t]], y[i, all_rows[t]]
        gw, gb = numpy_linreg_grad(uw, ub, bx, by, L2)
        if name == "fedprox":
          gw, gb = gw + hp["mu"] * (uw - w), gb + hp["mu"] * (ub - b)
        if name == "scaffold":
          gw, gb = gw - ci_w[i] + c_w, gb - ci_b[i] + c_b
        uw, ub = uw - hp["client_lr"] * gw, ub - hp["client_lr"] * gb
      dws.append(uw - w)
      dbs.append(ub - b)
      uniform = name == "scaffold" and weighting in (None, "uniform")
      weights.append(1.0 if uniform else float(nex[i]))
      if name == "scaffold":
        new_c.append(
          (
            ci_w[i] - c_w - (uw - w) / (J * hp["client_lr"]),
            ci_b[i] - c_b - (ub - b) / (J * hp["client_lr"]),
          )
        )
    wts = np.array(weights) / np.sum(weights)
    w = w + hp["server_lr"] * np.tensordot(wts, np.array(dws), 1)
    b = b + hp["server_lr"] * float(np.dot(wts, dbs))
    if name == "scaffold" and weighting == "num_examples":
      p = nex / np.sum(nex)  # c = sum_i p_i c_i, kept exactly
      for nc, i in zip(new_c, idx):
        c_w, c_b = c_w + p[i] * (nc[0] - ci_w[i]), c_b + p[i] * (nc[1] - ci_b[i])
        ci_w[i], ci_b[i] = nc
    elif name == "scaffold":
      dcw = np.mean([nc[0] - ci_w[i] for nc, i in zip(new_c, idx)], axis=0)
      dcb = np.mean([nc[1] - ci_b[i] for nc, i in zip(new_c, idx)])
      for nc, i in zip(new_c, idx):
        ci_w[i], ci_b[i] = nc
      c_w, c_b = c_w + s / n * dcw, c_b + s / n * dcb
  return w, b


@pytest.mark.parametrize(
  "name,batch_size",
  [("fedavg", 4), ("fedavg", None), ("fedprox", 4), ("scaffold", 4), ("scaffold", None)],
)
def test_matches_reference_loop(name, batch_size):
  data = regression_clients(n=7, d=3, seed=1)
  model = linreg(3, l2=L2)
  alg = A.get_algorithm(name).factory(
    model, clients_per_round=3, local_steps=4, batch_size=batch_size, backend="vmap"
  )
  hp = {"client_lr": 0.05, "server_lr": 0.9}
  if name == "fedprox":
    hp["mu"] = 0.3
  hist = run(alg, dataset(data), rounds=6, seed=3, hparams=hp, eval_every=3)
  w_ref, b_ref = _reference(name, data, 6, 3, 3, 4, batch_size, hp)
  params = hist.final_state.params
  np.testing.assert_allclose(np.asarray(params["w"]), w_ref, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(params["b"]), b_ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("weighting", ["uniform", "num_examples"])
@pytest.mark.parametrize("batch_size", [4, None])
def test_scaffold_under_both_weightings_matches_reference_loop(weighting, batch_size):
  data = regression_clients(n=7, d=3, seed=1)  # client sizes 5..19: the weightings differ
  model = linreg(3, l2=L2)
  alg = A.scaffold(
    model,
    clients_per_round=3,
    local_steps=4,
    batch_size=batch_size,
    backend="vmap",
    weighting=weighting,
  )
  assert alg.config["weighting"] == weighting
  hp = {"client_lr": 0.05, "server_lr": 0.9}
  hist = run(alg, dataset(data), rounds=6, seed=3, hparams=hp, eval_every=3)
  w_ref, b_ref = _reference("scaffold", data, 6, 3, 3, 4, batch_size, hp, weighting)
  params = hist.final_state.params
  np.testing.assert_allclose(np.asarray(params["w"]), w_ref, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(params["b"]), b_ref, rtol=0, atol=1e-10)
  if weighting == "num_examples":  # the comparison can fail: the uniform loop lands elsewhere
    w_uni, _ = _reference("scaffold", data, 6, 3, 3, 4, batch_size, hp, "uniform")
    assert np.max(np.abs(w_uni - w_ref)) > 1e-4


def test_weighted_scaffold_reaches_the_sample_weighted_minimizer():
  """With ``weighting="num_examples"`` the fixed point is argmin sum_i p_i f_i (p_i ~ n_i),
  FedAvg's objective, not the uniform one."""
  data = regression_clients(n=6, d=3, seed=4, shift=2.0)
  model = linreg(3, l2=L2)
  opt_w = _minimizer(data, L2, np.asarray(data.num_examples, float))
  opt_u = _uniform_minimizer(data, L2)
  assert np.linalg.norm(opt_w - opt_u) > 1e-2  # the two objectives differ here
  alg = A.scaffold(model, local_steps=50, backend="vmap", weighting="num_examples")
  hp = {"client_lr": 0.02, "server_lr": 1.0}
  h = run(alg, dataset(data), rounds=600, hparams=hp, eval_every=600)
  flat = np.append(np.asarray(h.final_state.params["w"]), float(h.final_state.params["b"]))
  assert np.linalg.norm(flat - opt_w) < 1e-8, np.linalg.norm(flat - opt_w)


def test_fedsgd_full_participation_is_centralized_gradient_descent():
  data = regression_clients(n=5, d=4, seed=2)
  model = linreg(4, l2=L2)
  alg = A.fedsgd(model, backend="vmap")
  hist = run(alg, dataset(data), rounds=15, hparams={"lr": 0.1}, eval_every=5)
  x = np.concatenate(
    [np.asarray(data.x[i, :k]) for i, k in enumerate(np.asarray(data.num_examples))]
  )
  y = np.concatenate(
    [np.asarray(data.y[i, :k]) for i, k in enumerate(np.asarray(data.num_examples))]
  )
  w, b = np.zeros(4), 0.0
  for _ in range(15):
    gw, gb = numpy_linreg_grad(w, b, x, y, L2)
    w, b = w - 0.1 * gw, b - 0.1 * gb
  np.testing.assert_allclose(np.asarray(hist.final_state.params["w"]), w, atol=1e-12)
  np.testing.assert_allclose(float(hist.final_state.params["b"]), b, atol=1e-12)


def _minimizer(data, l2, weights):
  """argmin sum_i p_i f_i, ``p = weights / sum(weights)``, for linear regression with intercept
  (closed form)."""
  d = data.x.shape[-1]
  p = np.asarray(weights, float) / np.sum(weights)
  H, g = np.zeros((d + 1, d + 1)), np.zeros(d + 1)
  for i, k in enumerate(np.asarray(data.num_examples)):
    xa = np.hstack([np.asarray(data.x[i, :k]), np.ones((k, 1))])
    H += p[i] * xa.T @ xa / k
    g += p[i] * xa.T @ np.asarray(data.y[i, :k]) / k
  return np.linalg.solve(H + l2 * np.eye(d + 1), g)


def _uniform_minimizer(data, l2):
  """argmin (1/n) sum_i f_i for linear regression with intercept (closed form)."""
  return _minimizer(data, l2, np.ones(data.num_clients))


def test_scaffold_reaches_global_minimizer_while_fedavg_is_biased():
  data = regression_clients(n=6, d=3, seed=4, shift=2.0)
  model = linreg(3, l2=L2)
  opt = _uniform_minimizer(data, L2)
  common = dict(local_steps=50, backend="vmap")
  hp = {"client_lr": 0.02, "server_lr": 1.0}
  h_s = run(A.scaffold(model, **common), dataset(data), rounds=600, hparams=hp, eval_every=600)
  h_f = run(
    A.fedavg(model, weighting="uniform", **common),
    dataset(data),
    rounds=600,
    hparams=hp,
    eval_every=600,
  )
  flat = lambda p: np.append(np.asarray(p["w"]), float(p["b"]))
  err_s = np.linalg.norm(flat(h_s.final_state.params) - opt)
  err_f = np.linalg.norm(flat(h_f.final_state.params) - opt)
  assert err_s < 1e-8, err_s
  assert err_f > 1e-2, err_f  # FedAvg's fixed point with 50 local steps is not the minimizer


def _momentum_reference(data, rounds, seed, s, J, B, hp):
  """FedAvg-M as a plain loop: per client ``m <- (1 - beta3) m + beta3 g; w <- w - eta m`` from
  the averaged ``(w_bar, m_bar)``, then uniform means of the participants' ``w`` and ``m``."""
  n, d = data.num_clients, data.x.shape[-1]
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  _, _, run_key = jax.random.split(jax.random.PRNGKey(seed), 3)
  w, b, mw, mb = np.zeros(d), 0.0, np.zeros(d), 0.0
  for r in range(rounds):
    sample_key, local_key = jax.random.split(jax.random.fold_in(run_key, r))
    idx = np.asarray(sample_clients(sample_key, n, s))
    finals = []
    for k, i in enumerate(idx):
      uw, ub, umw, umb = w.copy(), b, mw.copy(), mb
      for rows in np.asarray(step_rows(jax.random.split(local_key, s)[k], nex[i], B, J)):
        gw, gb = numpy_linreg_grad(uw, ub, x[i, rows], y[i, rows], L2)
        umw, umb = (
          (1 - hp["beta3"]) * umw + hp["beta3"] * gw,
          (1 - hp["beta3"]) * umb + hp["beta3"] * gb,
        )
        uw, ub = uw - hp["client_lr"] * umw, ub - hp["client_lr"] * umb
      finals.append((uw, ub, umw, umb))
    w = np.mean([f[0] for f in finals], axis=0)
    b = float(np.mean([f[1] for f in finals]))
    mw = np.mean([f[2] for f in finals], axis=0)
    mb = float(np.mean([f[3] for f in finals]))
  return w, b, mw, mb


def test_fedavg_momentum_matches_reference_loop_and_is_fgdro_kl_without_reweighting():
  data = regression_clients(n=7, d=3, seed=1)
  model = linreg(3, l2=L2)
  common = dict(clients_per_round=3, local_steps=4, batch_size=4, backend="vmap")
  hp = {"client_lr": 0.05, "beta3": 0.3}
  hist = run(A.fedavg_momentum(model, **common), dataset(data), rounds=6, seed=3, hparams=hp)
  w, b, mw, mb = _momentum_reference(data, 6, 3, 3, 4, 4, hp)
  state = hist.final_state
  np.testing.assert_allclose(np.asarray(state.params["w"]), w, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(state.params["b"]), b, rtol=0, atol=1e-10)
  np.testing.assert_allclose(np.asarray(state.momentum["w"]), mw, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(state.momentum["b"]), mb, rtol=0, atol=1e-10)
  # FGDRO-KL's weights exp(u / lambda) / v tend to 1 as lambda grows: the same trajectory.
  kl = run(
    A.fgdro_kl(model, **common), dataset(data), rounds=6, seed=3, hparams={**hp, "lam": 1e12}
  )
  np.testing.assert_allclose(np.asarray(kl.final_state.params["w"]), w, rtol=0, atol=1e-10)
  # ... and at a small lambda the reweighting moves it: the comparison above can fail.
  kl1 = run(
    A.fgdro_kl(model, **common), dataset(data), rounds=6, seed=3, hparams={**hp, "lam": 0.5}
  )
  assert np.max(np.abs(np.asarray(kl1.final_state.params["w"]) - w)) > 1e-3
