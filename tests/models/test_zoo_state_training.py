"""Models with batch statistics and dropout train through the simulator: the zoo's ResNet-18 with
BatchNorm and pfl-research's CIFAR CNN with its dropout (from ``from_flax``), a user's own NNX
module with BatchNorm and Dropout and a user's NNX character LSTM (``nnx.RNN``, which holds an RNG
stream) on integer tokens run through ``fd.run`` and ``fd.sweep``; a second sweep of the same
shapes traces nothing, and the batch statistics move."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import fedjax_dro as fd
from fedjax_dro import algorithms as A, data, models
from fedjax_dro.models.cifar_cnn import cifar_cnn
from fedjax_dro.models.resnet import resnet18

CLASSES = 5


def _images(n=4, size=8, seed=0):
  rng = np.random.default_rng(seed)
  sizes = [4 + i % 3 for i in range(n)]
  xs = [rng.normal(size=(m, size, size, 3)).astype(np.float32) for m in sizes]
  ys = [rng.integers(0, CLASSES, size=m) for m in sizes]
  train = data.from_client_arrays(xs, ys)
  return xs, data.FederatedDataset(train=train, test=train, name="cifar-shaped")


def _counted(model, traces):
  """``model`` whose training form counts its traces in ``traces["n"]``."""
  train_apply = model.train_apply

  def counted(*args):
    traces["n"] += 1
    return train_apply(*args)

  return model._replace(train_apply=counted)


def _sweeps_trace_once(alg, ds, traces, grids):
  """The first sweep traces the training form; the second, of other values, traces nothing."""
  fd.sweep(alg, ds, rounds=1, grid=grids[0], seeds=[0, 1])
  first = traces["n"]
  assert first > 0
  fd.sweep(alg, ds, rounds=1, grid=grids[1], seeds=[0, 1])
  assert traces["n"] == first


def _moved(before, after):
  return max(
    float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))
  )


@pytest.mark.slow  # about a minute on two cores; the NNX BatchNorm test below is the fast one
def test_resnet18_with_batch_norm_runs_and_sweeps_compiling_once():
  xs, ds = _images()
  net = resnet18(CLASSES, norm="batch", stem="cifar", num_filters=4)
  model = models.from_flax(net, xs[0][:2], name="resnet18-bn")
  assert model.state_keys == ("batch_stats",) and model.state_masked
  traces = {"n": 0}
  alg = A.fedavg(_counted(model, traces), local_steps=2, batch_size=2, clients_per_round=2)
  hist = fd.run(alg, ds, rounds=2, hparams={"client_lr": 0.05})
  start = model.init(jax.random.PRNGKey(0))["batch_stats"]
  assert _moved(start, hist.final_state.params["batch_stats"]) > 1e-4
  assert np.isfinite(hist.final["accuracy"]["mean"])
  _sweeps_trace_once(alg, ds, traces, [{"client_lr": [0.01, 0.1]}, {"client_lr": [0.02, 0.05]}])
  fedbn = A.fedbn(model, local_steps=1, batch_size=2)  # the normalization layers local
  hist = fd.run(fedbn, ds, rounds=1, hparams={"client_lr": 0.05})
  assert hist.final_state.local[0].shape[0] == 4


def test_cifar_cnn_trains_with_its_dropout():
  xs, ds = _images(size=8)
  model = models.from_flax(cifar_cnn(CLASSES), xs[0][:2], name="cifar-cnn")
  assert model.train_apply is not None and model.state_keys == ()
  params = model.init(jax.random.PRNGKey(0))
  x = jnp.asarray(xs[0])
  mask = jnp.ones(len(x), bool)
  one, _ = model.train_apply(params, x, mask, jax.random.PRNGKey(1))
  two, _ = model.train_apply(params, x, mask, jax.random.PRNGKey(2))
  assert float(jnp.max(jnp.abs(one - two))) > 0  # dropout draws from the key
  hist = fd.run(A.fedavg(model, local_steps=2, batch_size=2), ds, rounds=2)
  assert np.isfinite(hist.final["accuracy"]["mean"])


class _UserNet(nnx.Module):
  """A user's own NNX module with a BatchNorm and a Dropout."""

  def __init__(self, rngs):
    self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)
    self.bn = nnx.BatchNorm(4, rngs=rngs)
    self.drop = nnx.Dropout(0.3, rngs=rngs)
    self.out = nnx.Linear(4, CLASSES, rngs=rngs)

  def __call__(self, x):
    h = self.drop(nnx.relu(self.bn(self.conv(x))))
    return self.out(h.mean(axis=(1, 2)))


def test_a_users_nnx_module_with_batch_norm_and_dropout_runs_and_sweeps_compiling_once():
  _, ds = _images()
  model = models.from_nnx(_UserNet, name="user-bn")
  assert model.state_keys == ("batch_stats",)
  traces = {"n": 0}
  alg = A.fedavg(_counted(model, traces), local_steps=2, batch_size=2)
  hist = fd.run(alg, ds, rounds=2, hparams={"client_lr": 0.05})
  start = model.init(jax.random.PRNGKey(0))["batch_stats"]
  assert _moved(start, hist.final_state.params["batch_stats"]) > 1e-4
  _sweeps_trace_once(alg, ds, traces, [{"client_lr": [0.01, 0.1]}, {"client_lr": [0.02, 0.05]}])


VOCAB, LENGTH = 12, 6


class _CharLSTM(nnx.Module):
  """A user's character LSTM built on ``nnx.RNN(nnx.OptimizedLSTMCell)`` (an RNG stream)."""

  def __init__(self, rngs):
    self.embed = nnx.Embed(VOCAB, 4, rngs=rngs)
    self.rnn = nnx.RNN(nnx.OptimizedLSTMCell(4, 8, rngs=rngs), rngs=rngs)
    self.drop = nnx.Dropout(0.2, rngs=rngs)
    self.out = nnx.Linear(8, VOCAB, rngs=rngs)

  def __call__(self, tokens):
    return self.out(self.drop(self.rnn(self.embed(tokens))))


def test_a_users_nnx_lstm_trains_on_integer_tokens_and_sweeps_compiling_once():
  rng = np.random.default_rng(0)
  seqs = [rng.integers(1, VOCAB, size=(3 + i, LENGTH + 1)) for i in range(3)]
  xs = [s[:, :-1] for s in seqs]
  ys = [s[:, 1:] for s in seqs]
  train = data.from_client_arrays(xs, ys, dtype=np.int32)
  ds = data.FederatedDataset(train=train, test=train, name="tokens")
  loss, metrics = models.lm_loss_and_metrics()
  model = models.from_nnx(_CharLSTM, loss=loss, metrics=metrics, task="classification")
  assert model.train_apply is not None and model.state_keys == ()
  traces = {"n": 0}
  alg = A.fedavg(_counted(model, traces), local_steps=2, batch_size=2)
  hist = fd.run(alg, ds, rounds=2, hparams={"client_lr": 0.5})
  assert np.isfinite(hist.final["loss"]["mean"])
  _sweeps_trace_once(alg, ds, traces, [{"client_lr": [0.1, 0.5]}, {"client_lr": [0.2, 0.3]}])


@pytest.mark.slow  # ~25 s on two cores: two transformers compiled twice each
def test_the_transformers_train_with_their_dropout():
  """GPT-2 (``deterministic``) and DistilBERT in their tiny forms, with dropout: a training form
  whose outputs depend on the key, through fd.run on integer tokens."""
  from fedjax_dro.models import distilbert, gpt2

  rng = np.random.default_rng(1)
  toks = [rng.integers(1, 90, size=(3 + i, 9)) for i in range(3)]
  loss, metrics = models.lm_loss_and_metrics()
  lm = models.from_flax(
    gpt2("tiny", dropout=0.1), toks[0][:2, :-1], loss=loss, metrics=metrics, task="classification"
  )
  labels = [rng.integers(0, 2, size=len(t)) for t in toks]
  clf = models.from_flax(distilbert("tiny", dropout=0.1), toks[0][:2], name="distilbert-tiny")
  for model, xs, ys in [
    (lm, [t[:, :-1] for t in toks], [t[:, 1:] for t in toks]),
    (clf, toks, labels),
  ]:
    assert model.train_apply is not None
    params = model.init(jax.random.PRNGKey(0))
    x = jnp.asarray(xs[0])
    mask = jnp.ones(len(x), bool)
    one = model.train_apply(params, x, mask, jax.random.PRNGKey(1))[0]
    two = model.train_apply(params, x, mask, jax.random.PRNGKey(2))[0]
    assert float(jnp.max(jnp.abs(one - two))) > 0
    train = data.from_client_arrays(xs, ys, dtype=np.int32)
    ds = data.FederatedDataset(train=train, test=train, name="tokens")
    hist = fd.run(A.fedavg(model, local_steps=2, batch_size=2), ds, rounds=1)
    assert np.isfinite(hist.final["loss"]["mean"])


class _LinenUserNet(nn.Module):
  """A user's own linen module with BatchNorm and Dropout under Flax's ``train`` convention."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    h = nn.Conv(4, (3, 3))(x)
    h = nn.BatchNorm(use_running_average=not train, momentum=0.9)(h)
    h = nn.Dropout(0.3, deterministic=not train)(nn.relu(h))
    return nn.Dense(CLASSES)(h.mean(axis=(1, 2)))


def test_a_users_linen_module_with_batch_norm_and_dropout_runs_and_sweeps_compiling_once():
  xs, ds = _images()
  model = models.from_flax(_LinenUserNet(), xs[0][:2], name="user-linen-bn")
  assert model.state_keys == ("batch_stats",) and not model.state_masked
  traces = {"n": 0}
  alg = A.fedavg(_counted(model, traces), local_steps=2, batch_size=2)
  hist = fd.run(alg, ds, rounds=2, hparams={"client_lr": 0.05})
  start = model.init(jax.random.PRNGKey(0))["batch_stats"]
  assert _moved(start, hist.final_state.params["batch_stats"]) > 1e-4
  _sweeps_trace_once(alg, ds, traces, [{"client_lr": [0.01, 0.1]}, {"client_lr": [0.02, 0.05]}])
