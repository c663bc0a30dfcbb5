"""FedAdam (Reddi et al., "Adaptive Federated Optimization", arXiv:2003.00295, Algorithm 2) against
a plain per-client NumPy loop (float64, the simulator's sampled clients and minibatch rows), for
the paper's form (no bias correction, the default) and the bias-corrected option; the two differ;
the round compiles once; bad inputs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dro import algorithms as A, run
from fedjax_dro.core.sampling import sample_clients
from tests.helpers import dataset, linreg, numpy_linreg_grad, regression_clients

L2 = 0.01
SIZES = [4, 9, 13, 6, 17, 8, 11]  # clients of different sizes
# Not the defaults, and beta1 != beta2, so a swapped or ignored hyper-parameter shows.
HP = {"client_lr": 0.05, "server_lr": 0.1, "beta1": 0.8, "beta2": 0.95, "tau": 0.01}


def _reference(data, rounds, seed, s, J, B, hp, bias_correction, weighting):
  """Algorithm 2 of Reddi et al. client by client, reusing only the simulator's key schedule.

  Returns the final ``(w, b)`` flattened into one vector."""
  n, d = data.num_clients, data.x.shape[-1]
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  _, _, run_key = jax.random.split(jax.random.PRNGKey(seed), 3)
  b1, b2, tau, eta = hp["beta1"], hp["beta2"], hp["tau"], hp["server_lr"]
  xt = np.zeros(d + 1)  # (w, b): the model starts at zero (linreg's init)
  m, v = np.zeros(d + 1), np.zeros(d + 1)  # m_0 = v_0 = 0
  adam = optax.scale_by_adam(b1=b1, b2=b2, eps=tau)  # the bias-corrected form's cross-check
  adam_state = adam.init(jnp.zeros(d + 1))
  for t in range(1, rounds + 1):
    key = jax.random.fold_in(run_key, t - 1)
    sample_key, local_key = jax.random.split(key)
    idx = np.asarray(sample_clients(sample_key, n, s))
    client_keys = jax.random.split(local_key, s)
    deltas, weights = [], []
    for k, i in enumerate(idx):
      uw, ub = xt[:d].copy(), xt[d]
      for step_key in jax.random.split(client_keys[k], J):
        if B is None:
          bx, by = x[i, : nex[i]], y[i, : nex[i]]
        else:
          rows = np.asarray(jax.random.randint(step_key, (B,), 0, nex[i]))
          bx, by = x[i, rows], y[i, rows]
        gw, gb = numpy_linreg_grad(uw, ub, bx, by, L2)
        uw, ub = uw - hp["client_lr"] * gw, ub - hp["client_lr"] * gb
      deltas.append(np.append(uw, ub) - xt)  # Delta_i^t = x_{i,K}^t - x_t
      weights.append(float(nex[i]) if weighting == "num_examples" else 1.0)
    p = np.array(weights) / np.sum(weights)
    delta = p @ np.array(deltas)  # Delta_t
    m = b1 * m + (1 - b1) * delta
    v = b2 * v + (1 - b2) * delta**2
    if bias_correction:
      step = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + tau)
      # optax.adam's direction on the pseudo-gradient -Delta_t is -step: the option is Adam.
      direction, adam_state = adam.update(jnp.asarray(-delta), adam_state)
      np.testing.assert_allclose(-np.asarray(direction), step, rtol=1e-12, atol=1e-14)
    else:
      step = m / (np.sqrt(v) + tau)
    xt = xt + eta * step
  return xt


def _flat(params):
  return np.append(np.asarray(params["w"]), float(params["b"]))


@pytest.mark.parametrize(
  "bias_correction, weighting, batch_size",
  [
    (False, "num_examples", 4),
    (True, "num_examples", 4),
    (False, "uniform", None),  # the paper's plain mean over S_t, full-batch local gradients
    (True, "uniform", 3),
  ],
)
def test_matches_reference_loop(bias_correction, weighting, batch_size):
  data = regression_clients(n=7, d=3, sizes=SIZES, seed=1)
  alg = A.fedadam(
    linreg(3, l2=L2),
    clients_per_round=3,
    local_steps=4,
    batch_size=batch_size,
    backend="vmap",
    weighting=weighting,
    bias_correction=bias_correction,
  )
  hist = run(alg, dataset(data), rounds=6, seed=3, hparams=HP, eval_every=3)
  ref = _reference(data, 6, 3, 3, 4, batch_size, HP, bias_correction, weighting)
  assert np.max(np.abs(ref)) > 0.05  # the runs moved: the comparison is not of two zeros
  np.testing.assert_allclose(_flat(hist.final_state.params), ref, rtol=0, atol=1e-10)
  assert int(hist.final_state.round) == 6
  assert alg.config["bias_correction"] is bias_correction
  assert ("no bias correction" in alg.config["server_update"]) is (not bias_correction)


def test_default_is_the_paper_form_without_bias_correction():
  """The default equals the no-bias-correction reference and is far from the bias-corrected
  one, which the explicit option reproduces: the two forms truly differ."""
  data = regression_clients(n=7, d=3, sizes=SIZES, seed=2)
  kw = dict(clients_per_round=4, local_steps=3, batch_size=4, backend="vmap")
  model = linreg(3, l2=L2)
  default = A.fedadam(model, **kw)
  corrected = A.fedadam(model, bias_correction=True, **kw)
  assert default.config["bias_correction"] is False
  h0 = run(default, dataset(data), rounds=5, seed=4, hparams=HP, eval_every=5)
  h1 = run(corrected, dataset(data), rounds=5, seed=4, hparams=HP, eval_every=5)
  paper = _reference(data, 5, 4, 4, 3, 4, HP, False, "num_examples")
  adam = _reference(data, 5, 4, 4, 3, 4, HP, True, "num_examples")
  np.testing.assert_allclose(_flat(h0.final_state.params), paper, rtol=0, atol=1e-10)
  np.testing.assert_allclose(_flat(h1.final_state.params), adam, rtol=0, atol=1e-10)
  assert np.max(np.abs(paper - adam)) > 1e-2, np.abs(paper - adam)
  assert np.max(np.abs(_flat(h0.final_state.params) - _flat(h1.final_state.params))) > 1e-2


def test_first_round_step_in_closed_form():
  """Round 1 from m_0 = v_0 = 0: the paper's step is eta (1 - b1) D / (sqrt(1 - b2) |D| + tau),
  Adam's eta D / (|D| + tau), with D the averaged delta (FedAvg's with server_lr 1)."""
  data = regression_clients(n=5, d=2, sizes=[3, 7, 5, 12, 4], seed=5)
  kw = dict(clients_per_round=2, local_steps=2, batch_size=2, backend="vmap")
  model = linreg(2, l2=L2)
  avg_hp = {"client_lr": HP["client_lr"], "server_lr": 1.0}
  fedavg = run(A.fedavg(model, **kw), dataset(data), rounds=1, seed=6, hparams=avg_hp)
  delta = _flat(fedavg.final_state.params)
  assert np.min(np.abs(delta)) > 1e-3
  b1, b2, tau, eta = HP["beta1"], HP["beta2"], HP["tau"], HP["server_lr"]
  expect = {
    False: eta * (1 - b1) * delta / (np.sqrt(1 - b2) * np.abs(delta) + tau),
    True: eta * delta / (np.abs(delta) + tau),
  }
  for bias_correction, step in expect.items():
    alg = A.fedadam(model, bias_correction=bias_correction, **kw)
    hist = run(alg, dataset(data), rounds=1, seed=6, hparams=HP)
    np.testing.assert_allclose(_flat(hist.final_state.params), step, rtol=0, atol=1e-12)


def test_many_rounds_and_hparams_trace_the_round_once():
  data = regression_clients(n=6, d=2, sizes=[3, 8, 5, 11, 6, 4], seed=7)
  for bias_correction in (False, True):
    alg = A.fedadam(
      linreg(2),
      clients_per_round=2,
      local_steps=2,
      batch_size=3,
      bias_correction=bias_correction,
    )
    counted = alg._replace(round=chex.assert_max_traces(alg.round, n=1))
    first = run(counted, dataset(data), rounds=30, eval_every=7, hparams={"tau": 1e-3})
    again = run(counted, dataset(data), rounds=30, eval_every=7, hparams={"tau": 1e-2}, seed=1)
    assert len(first.train_metrics["train_loss"]) == 30
    assert first.compile_time > 0 and again.compile_time == 0.0
    assert not np.allclose(_flat(first.final_state.params), _flat(again.final_state.params))
    chex.clear_trace_counter()


def test_state_keeps_the_parameter_dtype():
  """float32 master parameters keep float32 moments and model after a round (float64 hparams)."""
  data = regression_clients(n=4, d=2, sizes=[3, 6, 4, 5], seed=8)
  alg = A.fedadam(linreg(2), clients_per_round=2, local_steps=2, backend="vmap")
  params = jax.tree.map(lambda a: a.astype(jnp.float32), alg.model.init(jax.random.PRNGKey(0)))
  state = alg.init(params, data, jax.random.PRNGKey(1))
  hp = {k: jnp.asarray(v, jnp.float64) for k, v in HP.items()}
  state, _ = jax.jit(alg.round)(state, data, jax.random.PRNGKey(2), hp)
  for name in ("params", "m", "v"):
    for leaf in jax.tree.leaves(getattr(state, name)):
      assert leaf.dtype == jnp.float32, (name, leaf.dtype)
  assert np.any(np.asarray(state.m["w"]) != 0)


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, 1.0, "False"])
def test_non_bool_bias_correction_is_refused(bad):
  with pytest.raises(TypeError, match="bias_correction must be a bool"):
    A.fedadam(linreg(2), bias_correction=bad)


def test_numpy_bool_is_accepted_and_stored_as_bool():
  alg = A.fedadam(linreg(2), bias_correction=np.bool_(True))
  assert alg.config["bias_correction"] is True


def test_old_hparam_name_eps_and_bad_tau_are_refused():
  data = regression_clients(n=4, d=2, sizes=[3, 6, 4, 5], seed=9)
  alg = A.fedadam(linreg(2), clients_per_round=2, local_steps=1)
  assert "eps" not in alg.hparams and alg.hparams["tau"].default == 1e-3
  assert (alg.hparams["beta1"].default, alg.hparams["beta2"].default) == (0.9, 0.99)
  with pytest.raises(ValueError, match=r"unknown hyper-parameter\(s\) \['eps'\].*'tau'"):
    run(alg, dataset(data), rounds=1, hparams={"eps": 1e-3})
  for tau in (0.0, -1e-3):
    with pytest.raises(ValueError, match="'tau' of fedadam must be > 0"):
      run(alg, dataset(data), rounds=1, hparams={"tau": tau})
