"""Integer token inputs: ``from_client_arrays(..., dtype=np.int32)`` keeps token ids as integers
(checked to fit), a language model's per-position labels ``y [m, T]`` against outputs
``[m, T, vocab]`` pass the label check (and labels outside the vocabulary are refused), and a
Flax LSTM language model trains on them through ``fd.run`` and ``fd.sweep``, compiling once,
equal to a plain per-client loop of FedAvg's pseudo-code (float64, 1e-10)."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_dro as fd
from fedjax_dro import algorithms as A, data, models
from fedjax_dro.core.precision import float64
from fedjax_dro.engine.prepare import derive_keys

VOCAB, T, PAD = 11, 6, 0


class CharLSTM(nn.Module):
  """Embedding, one LSTM layer (Flax's own ``nn.RNN`` / ``OptimizedLSTMCell``), vocabulary head."""

  @nn.compact
  def __call__(self, tokens):
    h = nn.Embed(VOCAB, 4, param_dtype=jnp.float64)(tokens)
    h = nn.RNN(nn.OptimizedLSTMCell(8, param_dtype=jnp.float64))(h)
    return nn.Dense(VOCAB, param_dtype=jnp.float64)(h)


def lm_loss(outputs, y):
  """Next-token cross-entropy averaged over each sequence's non-padding positions."""
  valid = y != PAD
  ce = optax.softmax_cross_entropy_with_integer_labels(outputs, y)
  return jnp.sum(ce * valid, -1) / jnp.maximum(jnp.sum(valid, -1), 1)


def lm_metrics(outputs, y):
  valid = y != PAD
  hit = (jnp.argmax(outputs, -1) == y) * valid
  return {"loss": lm_loss(outputs, y), "accuracy": hit.sum(-1) / jnp.maximum(valid.sum(-1), 1)}


def _token_clients(sizes=(3, 5, 4, 2), seed=0):
  rng = np.random.default_rng(seed)
  xs, ys = [], []
  for i, m in enumerate(sizes):
    seq = rng.integers(1, VOCAB, size=(m, T + 1))
    seq[: m // 2, T - 1 - i % 3 :] = PAD  # padded tails of different lengths
    xs.append(seq[:, :-1].astype(np.int32))
    ys.append(seq[:, 1:].astype(np.int32))
  return xs, ys


def test_integer_tokens_stay_integers_and_must_fit_their_dtype():
  xs, ys = _token_clients()
  d = data.from_client_arrays(xs, ys, dtype=np.int32)
  assert d.x.dtype == jnp.int32 and d.y.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(d.x[1, :5]), xs[1])
  with pytest.raises(ValueError, match=r"xs\[0\] has integers outside the int8 range"):
    data.from_client_arrays([xs[0] * 100], [ys[0]], dtype=np.int8)
  with pytest.raises(TypeError, match=r"keeps x as integers .* xs\[0\] has dtype float64"):
    data.from_client_arrays([xs[0].astype(float)], [ys[0]], dtype=np.int32)
  with pytest.raises(TypeError, match="integer dtype such as np.int32"):
    data.from_client_arrays(xs, ys, dtype=np.complex64)


def _lm_model(sample):
  return models.from_flax(
    CharLSTM(), sample, loss=lm_loss, metrics=lm_metrics, task="classification", name="lstm"
  )


def test_labels_outside_the_vocabulary_are_refused_naming_the_range():
  xs, ys = _token_clients()
  ys[2][0, 0] = VOCAB
  ds = data.FederatedDataset(train=data.from_client_arrays(xs, ys, dtype=np.int32), test=None)
  alg = A.fedavg(_lm_model(xs[0][:2]), local_steps=1)
  with pytest.raises(ValueError, match=rf"labels in \[0, {VOCAB}\] .* \[0, {VOCAB}\)"):
    fd.run(alg, ds, rounds=1)


def _reference_fedavg(model, params, xs, ys, rounds, steps, lr):
  """FedAvg's pseudo-code, one client at a time: full-batch local SGD from the global model,
  then the average of the client models weighted by their example counts."""

  def client_loss(w, x, y):
    return jnp.mean(model.loss(model.apply(w, x), y))

  grad = jax.jit(jax.grad(client_loss))
  sizes = np.array([len(x) for x in xs], float)
  for _ in range(rounds):
    finals = []
    for x, y in zip(xs, ys):
      w = params
      for _ in range(steps):
        w = jax.tree.map(lambda a, g: a - lr * g, w, grad(w, x, y))
      finals.append(w)
    params = jax.tree.map(
      lambda *ws: sum(s * wi for s, wi in zip(sizes, ws)) / sizes.sum(), *finals
    )
  return params


def test_an_lstm_language_model_trains_on_tokens_as_the_reference_loop_and_compiles_once():
  with float64():
    xs, ys = _token_clients()
    train = data.from_client_arrays(xs, ys, dtype=np.int32)
    ds = data.FederatedDataset(train=train, test=train, name="tokens")
    model = _lm_model(xs[0][:2])
    alg = A.fedavg(model, local_steps=3, batch_size=None)
    hist = fd.run(alg, ds, rounds=2, seed=0, hparams={"client_lr": 0.3})
    init = model.init(derive_keys(0)[0])
    ref = _reference_fedavg(model, init, xs, ys, rounds=2, steps=3, lr=0.3)
    chex.assert_trees_all_close(hist.final_state.params, ref, rtol=1e-10, atol=1e-12)

    traces = {"n": 0}
    counted = model._replace(apply=_counting(model.apply, traces))
    alg2 = A.fedavg(counted, local_steps=2, batch_size=2, clients_per_round=2)
    res = fd.sweep(alg2, ds, rounds=3, grid={"client_lr": [0.1, 0.3, 1.0]}, seeds=[0, 1])
    assert len(res.configs) == 6 and np.all(
      np.isfinite([s["loss"]["mean"] for s in res.final_summary])
    )
    first = traces["n"]
    fd.sweep(alg2, ds, rounds=3, grid={"client_lr": [0.2, 0.4, 0.5]}, seeds=[0, 1])
    assert traces["n"] == first  # the second sweep of the same shapes traced nothing new


def _counting(apply, traces):
  def counted(params, x):
    traces["n"] += 1
    return apply(params, x)

  return counted
