"""The FedOpt family (Reddi et al., "Adaptive Federated Optimization", arXiv:2003.00295,
Algorithm 2): FedYogi, FedAdagrad and FedAdam against a plain per-client NumPy loop (float64, the
simulator's sampled clients and minibatch rows); ``server_optimizer=`` of FedAvg and FedProx with
the same steps as optax transformations, optax's own Adam and SGD; a sweep over the server
learning rate compiling once; bad inputs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dro import algorithms as A, run, sweep
from fedjax_dro.core.sampling import sample_clients
from fedjax_dro.core.server import reddi_optimizer
from tests.helpers import dataset, linreg, numpy_linreg_grad, regression_clients

L2 = 0.01
SIZES = [4, 9, 13, 6, 17, 8, 11]
# Not the defaults, and beta1 != beta2, so a swapped or ignored hyper-parameter shows.
HP = {"client_lr": 0.05, "server_lr": 0.1, "beta1": 0.8, "beta2": 0.95, "tau": 0.01}
KW = dict(clients_per_round=3, local_steps=4, batch_size=4, backend="vmap")


def _reference(kind, data, rounds, seed, hp, *, bias_correction=False, initial_v=0.0):
  """Algorithm 2 client by client (``KW``'s settings, sample-count weights), reusing only the
  simulator's key schedule. Returns the final ``(w, b)`` flattened into one vector."""
  s, J, B = KW["clients_per_round"], KW["local_steps"], KW["batch_size"]
  n, d = data.num_clients, data.x.shape[-1]
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  _, _, run_key = jax.random.split(jax.random.PRNGKey(seed), 3)
  b1, b2, tau, eta = hp["beta1"], hp.get("beta2", 0.0), hp["tau"], hp["server_lr"]
  xt = np.zeros(d + 1)
  m, v = np.zeros(d + 1), np.full(d + 1, initial_v)
  for t in range(1, rounds + 1):
    sample_key, local_key = jax.random.split(jax.random.fold_in(run_key, t - 1))
    idx = np.asarray(sample_clients(sample_key, n, s))
    deltas, weights = [], []
    for k, i in enumerate(idx):
      uw, ub = xt[:d].copy(), xt[d]
      for step_key in jax.random.split(jax.random.split(local_key, s)[k], J):
        rows = np.asarray(jax.random.randint(step_key, (B,), 0, nex[i]))
        gw, gb = numpy_linreg_grad(uw, ub, x[i, rows], y[i, rows], L2)
        uw, ub = uw - hp["client_lr"] * gw, ub - hp["client_lr"] * gb
      deltas.append(np.append(uw, ub) - xt)
      weights.append(float(nex[i]))
    delta = (np.array(weights) / np.sum(weights)) @ np.array(deltas)
    m = b1 * m + (1 - b1) * delta
    if kind == "adagrad":
      v = v + delta**2
    elif kind == "adam":
      v = b2 * v + (1 - b2) * delta**2
    else:  # yogi
      v = v - (1 - b2) * delta**2 * np.sign(v - delta**2)
    if bias_correction:
      xt = xt + eta * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + tau)
    else:
      xt = xt + eta * m / (np.sqrt(v) + tau)
  return xt


def _flat(params):
  return np.append(np.asarray(params["w"]), float(params["b"]))


def _run(alg, data, hp, rounds=6, seed=3):
  return _flat(run(alg, dataset(data), rounds=rounds, seed=seed, hparams=hp).final_state.params)


@pytest.mark.parametrize("name,kind", [("fedyogi", "yogi"), ("fedadagrad", "adagrad")])
@pytest.mark.parametrize("initial_v", [0.0, 1e-4])
def test_fedyogi_and_fedadagrad_match_the_reference_loop(name, kind, initial_v):
  data = regression_clients(n=7, d=3, sizes=SIZES, seed=1)
  hp = {k: v for k, v in HP.items() if k in A.get_algorithm(name).factory(linreg(3)).hparams}
  alg = A.get_algorithm(name).factory(linreg(3, l2=L2), initial_v=initial_v, **KW)
  ref = _reference(kind, data, 6, 3, hp, initial_v=initial_v)
  assert np.max(np.abs(ref)) > 0.05  # the runs moved
  np.testing.assert_allclose(_run(alg, data, hp), ref, rtol=0, atol=1e-10)
  assert alg.config["initial_v"] == initial_v and kind.capitalize() in alg.config["server_update"]


def test_the_three_second_moments_differ():
  data = regression_clients(n=7, d=3, sizes=SIZES, seed=1)
  refs = {k: _reference(k, data, 6, 3, HP) for k in ("adam", "yogi", "adagrad")}
  assert (
    min(
      np.max(np.abs(refs[a] - refs[b]))
      for a, b in [("adam", "yogi"), ("adam", "adagrad"), ("yogi", "adagrad")]
    )
    > 1e-3
  )


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox"])
def test_server_optimizer_reddi_steps_match_the_reference_loop(kind, algorithm):
  """FedAvg (and FedProx at mu = 0) with Algorithm 2's step as an optax server optimizer: the
  reference loop's iterates, ``server_lr`` as eta."""
  data = regression_clients(n=7, d=3, sizes=SIZES, seed=1)
  opt = reddi_optimizer(kind, b1=HP["beta1"], b2=HP["beta2"], tau=HP["tau"])
  alg = A.get_algorithm(algorithm).factory(linreg(3, l2=L2), server_optimizer=opt, **KW)
  hp = {"client_lr": HP["client_lr"], "server_lr": HP["server_lr"]}
  if algorithm == "fedprox":
    hp["mu"] = 0.0
  np.testing.assert_allclose(_run(alg, data, hp), _reference(kind, data, 6, 3, HP), atol=1e-10)
  assert alg.config["server_optimizer"].startswith(f"reddi_optimizer({kind!r}, b1=0.8")


def test_fedadam_equals_fedavg_with_either_server_optimizer():
  """FedAdam's paper form equals FedAvg with reddi_optimizer('adam'); its bias-corrected form
  equals FedAvg with optax.adam (eps = tau)."""
  data = regression_clients(n=7, d=3, sizes=SIZES, seed=1)
  model, avg_hp = linreg(3, l2=L2), {"client_lr": HP["client_lr"], "server_lr": HP["server_lr"]}
  for bias, opt in [
    (False, reddi_optimizer("adam", b1=HP["beta1"], b2=HP["beta2"], tau=HP["tau"])),
    (True, optax.adam(1.0, b1=HP["beta1"], b2=HP["beta2"], eps=HP["tau"])),
  ]:
    fedadam = _run(A.fedadam(model, bias_correction=bias, **KW), data, HP)
    fedavg = _run(A.fedavg(model, server_optimizer=opt, **KW), data, avg_hp)
    np.testing.assert_allclose(fedavg, fedadam, rtol=0, atol=1e-10)
    np.testing.assert_allclose(
      fedadam, _reference("adam", data, 6, 3, HP, bias_correction=bias), atol=1e-10
    )


def test_sgd_server_optimizer_is_the_plain_step():
  data = regression_clients(n=7, d=3, sizes=SIZES, seed=1)
  hp = {"client_lr": 0.05, "server_lr": 0.7}
  plain = _run(A.fedavg(linreg(3, l2=L2), **KW), data, hp)
  sgd = _run(A.fedavg(linreg(3, l2=L2), server_optimizer=optax.sgd(1.0), **KW), data, hp)
  np.testing.assert_allclose(sgd, plain, rtol=0, atol=1e-12)


def test_a_sweep_over_optax_learning_rates_compiles_once():
  """Three server learning rates (scaling the optimizer's update) and two seeds: one trace of
  the round, and each row equals its own run."""
  data = regression_clients(n=6, d=2, sizes=[3, 8, 5, 11, 6, 4], seed=7)
  alg = A.fedavg(linreg(2), server_optimizer=optax.adam(1.0), **KW)
  counted = alg._replace(round=chex.assert_max_traces(alg.round, n=1))
  grid = {"server_lr": [0.01, 0.03, 0.1]}
  res = sweep(counted, dataset(data), rounds=5, grid=grid, seeds=[0, 1])
  chex.clear_trace_counter()
  assert len(res.configs) == 6
  losses = np.asarray(res.train_metrics["train_loss"])
  for row in (0, 5):
    cfg = res.configs[row]
    single = run(alg, dataset(data), rounds=5, seed=cfg["seed"], hparams=cfg["hparams"])
    np.testing.assert_allclose(losses[row], single.train_metrics["train_loss"], atol=1e-10)
  assert not np.allclose(losses[0], losses[2])  # the learning rate moves the run


def test_state_keeps_the_parameter_dtype():
  data = regression_clients(n=4, d=2, sizes=[3, 6, 4, 5], seed=8)
  for alg in (
    A.fedyogi(linreg(2), **KW),
    A.fedavg(linreg(2), server_optimizer=reddi_optimizer("yogi"), **KW),
  ):
    params = jax.tree.map(lambda a: a.astype(jnp.float32), alg.model.init(jax.random.PRNGKey(0)))
    state = alg.init(params, data, jax.random.PRNGKey(1))
    hp = {k: jnp.asarray(v.default, jnp.float64) for k, v in alg.hparams.items()}
    state, _ = jax.jit(alg.round)(state, data, jax.random.PRNGKey(2), hp)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state.params))


def test_bad_inputs_name_the_argument():
  model = linreg(2)
  for bad in ("adam", 3, optax):
    with pytest.raises(TypeError, match="fedavg: server_optimizer must be an optax"):
      A.fedavg(model, server_optimizer=bad)
  for name in ("fedadam", "scaff_pd", "fedyogi", "afl"):
    with pytest.raises(TypeError, match=f"{name} takes no server_optimizer"):
      A.get_algorithm(name).factory(model, server_optimizer=optax.sgd(1.0))
  for bad in (-1.0, "0", True):
    with pytest.raises(ValueError, match="fedyogi: initial_v must be a number >= 0"):
      A.fedyogi(model, initial_v=bad)
  with pytest.raises(ValueError, match="kind must be one of"):
    reddi_optimizer("rmsprop")
  with pytest.raises(ValueError, match="bias_correction is Adam's"):
    reddi_optimizer("yogi", bias_correction=True)
  with pytest.raises(ValueError, match="b2 must be a number in"):
    reddi_optimizer("yogi", b2=1.5)


def test_named_server_optimizers_and_the_command_line(tmp_path):
  """``--server-optimizer yogi --server-option b2=...`` builds Algorithm 2's Yogi step with that
  ``b2`` (the reference loop's iterates), recorded in the run's summary."""
  import json

  from fedjax_dro import cli
  from fedjax_dro.core.server import NAMED, named_server_optimizer

  data = regression_clients(n=7, d=3, sizes=SIZES, seed=1)
  opt = named_server_optimizer("yogi", b1=HP["beta1"], b2=HP["beta2"], tau=HP["tau"])
  alg = A.fedavg(linreg(3, l2=L2), server_optimizer=opt, **KW)
  hp = {"client_lr": HP["client_lr"], "server_lr": HP["server_lr"]}
  np.testing.assert_allclose(_run(alg, data, hp), _reference("yogi", data, 6, 3, HP), atol=1e-10)
  sgd = A.fedavg(linreg(3, l2=L2), server_optimizer=named_server_optimizer("sgd"), **KW)
  np.testing.assert_allclose(
    _run(sgd, data, hp), _run(A.fedavg(linreg(3, l2=L2), **KW), data, hp), atol=1e-12
  )
  assert sorted(NAMED) == ["adagrad", "adam", "momentum", "reddi-adam", "sgd", "yogi"]
  out = tmp_path / "run"
  argv = ["run", "--algorithm", "fedavg", "--rounds", "2", "--out", str(out)]
  cli.main(argv + ["--server-optimizer", "yogi", "--server-option", "b2=0.999"])
  settings = json.loads((out / "summary.json").read_text())["config"]["settings"]
  assert settings["server_optimizer"].startswith("reddi_optimizer('yogi', b1=0.9, b2=0.999")
  for bad, match in [
    (["--server-optimizer", "rmsprop"], "server optimizer must be one of"),
    (["--server-optimizer", "yogi", "--server-option", "eps=1"], "takes the options"),
    (["--server-option", "b2=0.9"], "--server-option needs --server-optimizer"),
    (["--server-optimizer", "adam", "--server-option", "b2=high"], "b2 must be a number"),
  ]:
    with pytest.raises(ValueError, match=match):
      cli._server_optimizer(cli.build_parser().parse_args(argv + bad))


@pytest.mark.parametrize("name", ["scaffold", "agnostic_fedavg"])
@pytest.mark.parametrize("work", [{"local_steps": 3}, {"local_epochs": 1}])
def test_scaffold_and_agnostic_fedavg_take_a_server_optimizer(name, work):
  """optax.sgd(1.0) is the paper's server step (4 rounds, 1e-12); Yogi's first round is
  Algorithm 2's step on the paper's averaged difference (the plain step's at server_lr 1)."""
  data = regression_clients(n=7, d=3, sizes=SIZES, seed=1)
  kw = dict(clients_per_round=3, batch_size=4, backend="vmap", **work)
  factory = A.get_algorithm(name).factory
  hp = {"client_lr": 0.05, "server_lr": 0.7}
  plain = _run(factory(linreg(3, l2=L2), **kw), data, hp, rounds=4)
  sgd = _run(factory(linreg(3, l2=L2), server_optimizer=optax.sgd(1.0), **kw), data, hp, rounds=4)
  np.testing.assert_allclose(sgd, plain, rtol=0, atol=1e-12)
  one = {"client_lr": 0.05, "server_lr": 1.0}
  delta = _run(factory(linreg(3, l2=L2), **kw), data, one, rounds=1)  # x_0 = 0: x_1 = Delta
  b1, b2, tau = 0.8, 0.95, 0.01
  yogi = reddi_optimizer("yogi", b1=b1, b2=b2, tau=tau)
  got = _run(
    factory(linreg(3, l2=L2), server_optimizer=yogi, **kw),
    data,
    {**one, "server_lr": 0.1},
    rounds=1,
  )
  v = (1 - b2) * delta**2  # v_0 = 0: sign(0 - Delta^2) = -1
  np.testing.assert_allclose(got, 0.1 * (1 - b1) * delta / (np.sqrt(v) + tau), rtol=0, atol=1e-12)
