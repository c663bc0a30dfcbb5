"""``client_optimizer=`` of FedAvg and FedProx (core.client_opt): heavy-ball local steps against a
plain per-client NumPy loop (float64, momentum restarting every round, FedProx's correction
before the optimizer), optax.sgd(1.0) as plain local SGD (local steps and local epochs), a sweep
over client and server learning rates compiling once, bad inputs."""

import chex
import jax
import numpy as np
import optax
import pytest

from fedjax_dro import algorithms as A, run, sweep
from fedjax_dro.core.sampling import sample_clients
from tests.helpers import dataset, linreg, numpy_linreg_grad, regression_clients

L2 = 0.01
SIZES = [4, 9, 13, 6, 17, 8, 11]
KW = dict(clients_per_round=3, local_steps=4, batch_size=4, backend="vmap")


def _reference(data, rounds, seed, lr, server_lr, beta, mu=0.0):
  """FedAvg / FedProx whose participants take heavy-ball steps ``t <- g + beta t``,
  ``w <- w - lr t`` (``t = 0`` at the start of every round), sample-count weights."""
  s, J, B = KW["clients_per_round"], KW["local_steps"], KW["batch_size"]
  n, d = data.num_clients, data.x.shape[-1]
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  _, _, run_key = jax.random.split(jax.random.PRNGKey(seed), 3)
  xt = np.zeros(d + 1)
  for t in range(rounds):
    sample_key, local_key = jax.random.split(jax.random.fold_in(run_key, t))
    idx = np.asarray(sample_clients(sample_key, n, s))
    deltas, weights = [], []
    for k, i in enumerate(idx):
      w = xt.copy()
      trace = np.zeros(d + 1)
      for step_key in jax.random.split(jax.random.split(local_key, s)[k], J):
        rows = np.asarray(jax.random.randint(step_key, (B,), 0, nex[i]))
        gw, gb = numpy_linreg_grad(w[:d], w[d], x[i, rows], y[i, rows], L2)
        g = np.append(gw, gb) + mu * (w - xt)
        trace = g + beta * trace
        w = w - lr * trace
      deltas.append(w - xt)
      weights.append(float(nex[i]))
    xt = xt + server_lr * (np.array(weights) / np.sum(weights)) @ np.array(deltas)
  return xt


def _flat(params):
  return np.append(np.asarray(params["w"]), float(params["b"]))


@pytest.mark.parametrize("name,mu", [("fedavg", 0.0), ("fedprox", 0.3)])
def test_heavy_ball_local_steps_match_the_reference_loop(name, mu):
  data = regression_clients(n=7, d=3, sizes=SIZES, seed=1)
  opt = optax.sgd(1.0, momentum=0.7)
  alg = A.get_algorithm(name).factory(linreg(3, l2=L2), client_optimizer=opt, **KW)
  hp = {"client_lr": 0.04, "server_lr": 0.8} | ({"mu": mu} if name == "fedprox" else {})
  got = _flat(run(alg, dataset(data), rounds=5, seed=2, hparams=hp).final_state.params)
  ref = _reference(data, 5, 2, 0.04, 0.8, 0.7, mu)
  assert np.max(np.abs(ref - _reference(data, 5, 2, 0.04, 0.8, 0.0, mu))) > 1e-3  # momentum acts
  np.testing.assert_allclose(got, ref, rtol=0, atol=1e-10)
  assert "fresh each round" in alg.config["client_optimizer"]


@pytest.mark.parametrize("work", [{"local_steps": 4}, {"local_epochs": 2}])
def test_sgd_client_optimizer_is_plain_local_sgd(work):
  data = regression_clients(n=7, d=3, sizes=SIZES, seed=1)
  kw = dict(clients_per_round=3, batch_size=4, backend="vmap", **work)
  hp = {"client_lr": 0.05, "server_lr": 0.9}
  plain = run(A.fedavg(linreg(3, l2=L2), **kw), dataset(data), rounds=4, seed=3, hparams=hp)
  alg = A.fedavg(linreg(3, l2=L2), client_optimizer=optax.sgd(1.0), **kw)
  got = run(alg, dataset(data), rounds=4, seed=3, hparams=hp)
  np.testing.assert_allclose(
    _flat(got.final_state.params), _flat(plain.final_state.params), rtol=0, atol=1e-12
  )


def test_a_sweep_over_client_and_server_rates_compiles_once():
  data = regression_clients(n=6, d=2, sizes=[3, 8, 5, 11, 6, 4], seed=7)
  alg = A.fedavg(
    linreg(2), client_optimizer=optax.sgd(1.0, momentum=0.5), server_optimizer=optax.adam(1.0), **KW
  )
  counted = alg._replace(round=chex.assert_max_traces(alg.round, n=1))
  grid = {"client_lr": [0.01, 0.03, 0.1], "server_lr": [0.01, 0.1]}
  res = sweep(counted, dataset(data), rounds=4, grid=grid, seeds=[0])
  chex.clear_trace_counter()
  losses = np.asarray(res.train_metrics["train_loss"])
  assert losses.shape[0] == 6 and len({tuple(np.round(r, 12)) for r in losses}) == 6
  cfg = res.configs[4]
  single = run(alg, dataset(data), rounds=4, seed=0, hparams=cfg["hparams"])
  np.testing.assert_allclose(losses[4], single.train_metrics["train_loss"], atol=1e-10)


def test_bad_client_optimizers_are_refused_by_name():
  for bad in ("sgd", 0.9):
    with pytest.raises(TypeError, match="fedavg: client_optimizer must be an optax"):
      A.fedavg(linreg(2), client_optimizer=bad)
  for name in ("fedadam", "scaffold", "local_adam"):
    with pytest.raises(TypeError, match=f"{name} takes no client_optimizer"):
      A.get_algorithm(name).factory(linreg(2), client_optimizer=optax.sgd(1.0))
