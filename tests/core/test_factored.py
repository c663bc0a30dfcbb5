"""Local SGD with wide dense layers kept factored (``experimental.factored``): ``W_0 + A^T G`` over the
epoch instead of a dense kernel per client. Against a plain per-client loop of local SGD and
against the dense rounds, in float64; which layers are chosen; the flax adapter's discovery of
its dense layers; bad input."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, models, run
from fedjax_dro.core.clients import map_clients
from fedjax_dro.core.local import local_sgd
from fedjax_dro.core.ragged import local_epoch_chunk, local_folded_step
from fedjax_dro.data import from_client_arrays
from fedjax_dro.experimental.factored import (
  DenseLayer,
  chosen_layers,
  factored_dense,
  local_factored_dense,
  worth_factoring,
)
from tests.helpers import dataset

SIZES = (9, 2, 11, 3, 7, 10)  # rows of each client


def _data(shape, k, seed=0):
  rng = np.random.default_rng(seed)
  xs = [rng.normal(size=(m,) + shape) for m in SIZES]
  ys = [rng.integers(0, k, m).astype(np.int32) for m in SIZES]
  return from_client_arrays(xs, ys)


def _counting(model):
  """``(model, traced)``: the model whose factored form records each trace in ``traced``."""
  traced = []

  def factored_apply(params, x, corrections):
    traced.append(tuple(sorted(corrections)))
    return model.factored_apply(params, x, corrections)

  return model._replace(factored_apply=factored_apply), traced


def _mlp():
  # Dense_0 40 x 64 is worth factoring over 2 epochs of <= 3 steps of 4 rows (24 < 2*40*64/104);
  # the head 64 x 3 is not (24 > 2*64*3/67)
  return models.mlp((40,), 3, (64,))


def _cnn():
  # one conv block 8x8 -> 4x4x2, Dense_0 32 x 32 (24 < 32), head 32 x 3
  return models.cnn((8, 8), 3, features=(2,), dense=32, conv="patches")


def _clients(model, factored, folded=True, **local):
  """Local SGD (default: 2 epochs of batch 4; ``local``: other ``local_sgd`` arguments) of the
  six clients side by side in ``map_clients``' vmap, from one start; ``(final params [6, ...],
  losses [6, T])``."""
  local = local or dict(batch_size=4, num_epochs=2)
  data = _data((40,) if model.input_size == 40 else (8, 8), 3)
  params = model.init(jax.random.PRNGKey(0))
  keys = jax.random.split(jax.random.PRNGKey(1), len(SIZES))

  def client(x, y, n, k):
    return local_sgd(model, params, x, y, n, k, lr=0.3, **local)

  def clients(x, y, n, k):
    return map_clients(client, x, y, n, k, backend="vmap")

  nex = data.num_examples.at[1].set(0)  # a client that takes no step
  args = (data.x, data.y, nex, keys)
  with local_folded_step(folded), local_factored_dense(factored):
    side_by_side = jax.jit(clients)(*args)
  # the plain per-client loop: one client at a time, no vmap (the dense step, own exit test)
  alone = [client(data.x[i], data.y[i], nex[i], keys[i]) for i in range(len(SIZES))]
  return side_by_side, alone


LOCAL = {
  "epochs": dict(batch_size=4, num_epochs=2),  # <= 6 steps of 4 rows: 24 rows
  "steps": dict(batch_size=5, num_steps=4),  # 4 steps of 5 rows drawn with replacement: 20
  "full_batch_steps": dict(batch_size=None, num_steps=2),  # 2 steps of all 11 padded rows: 22
}


@pytest.mark.parametrize("local", list(LOCAL))
@pytest.mark.parametrize("build", [_mlp, _cnn], ids=["mlp", "cnn"])
def test_factored_local_sgd_matches_the_per_client_loop(build, local):
  """Six clients of 0 to 11 rows (one with none) side by side, 2 epochs of batch 4, 4 steps of
  5 rows or 2 full-batch steps, the first dense layer factored: every client's final model and
  step losses equal a plain Python loop of local SGD over the clients to 1e-10 (float64)."""
  model, traced = _counting(build())
  (w, losses), alone = _clients(model, factored=True, **LOCAL[local])
  assert traced and all(t == (("Dense_0", "kernel"),) for t in traced)  # the factored path ran
  for i, (w_i, l_i) in enumerate(alone):
    row = jax.tree.map(lambda t, i=i: t[i], w)
    for a, b in zip(jax.tree.leaves(w_i), jax.tree.leaves(row)):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(losses[i]), np.asarray(l_i), rtol=0, atol=1e-10)
  # the clients did move (the comparison is not of untouched starts)
  start = model.init(jax.random.PRNGKey(0))["Dense_0"]["kernel"]
  assert float(jnp.max(jnp.abs(w["Dense_0"]["kernel"][0] - start))) > 1e-3


def test_factored_path_needs_the_shared_exit():
  """Without the folded step (each client's own exit test) the dense step runs: factored_apply
  is never traced."""
  model, traced = _counting(_mlp())
  _clients(model, factored=True, folded=False)
  assert traced == []


@pytest.mark.parametrize("chunk", [None, 2])
def test_fedavg_rounds_factored_equal_the_dense_rounds(chunk):
  """FedAvg, 4 of 6 clients a round, one local epoch of batch 4, 3 rounds (participants all at
  once, or step-sorted chunks of 2): the factored run's model equals the dense run's (select
  form, each client's own exit) to 1e-10."""
  train = _data((40,), 3, seed=3)
  hp = {"client_lr": 0.2, "server_lr": 1.0}
  finals = {}
  for factored in (False, True):
    with local_folded_step(factored), local_factored_dense(factored), local_epoch_chunk(chunk):
      alg = A.fedavg(_mlp(), clients_per_round=4, local_epochs=1, batch_size=4)
      hist = run(
        alg,
        dataset(train, task="classification", num_classes=3),
        rounds=3,
        seed=1,
        hparams=hp,
        eval_every=3,
      )
    finals[factored] = hist.final_state.params
  for a, b in zip(jax.tree.leaves(finals[False]), jax.tree.leaves(finals[True])):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-10)


def test_worth_factoring_by_hand():
  """The byte count worked by hand: the FEMNIST CNN's 3136 x 2048 layer over 47 steps of 20 rows
  (940 * 5184 = 4.87 M < 2 * 6.42 M = 12.85 M) is factored, its 2048 x 62 head (940 * 2110 =
  1.98 M > 2 * 126,976 = 0.25 M) is not; at the break-even 2 d_in d_out / (d_in + d_out) rows
  (a 4 x 4 layer: 4 rows) not."""
  assert worth_factoring(DenseLayer(("k",), 3136, 2048), 940)
  assert not worth_factoring(DenseLayer(("k",), 2048, 62), 940)
  assert worth_factoring(DenseLayer(("k",), 4, 4), 3)
  assert not worth_factoring(DenseLayer(("k",), 4, 4), 4)
  femnist = models.cnn((28, 28), 62, features=(32, 64), dense=2048)
  assert [layer.path for layer in chosen_layers(femnist, 47 * 20)] == [("Dense_0", "kernel")]
  assert chosen_layers(femnist, 2500) == ()  # 2500 * 5184 > 12.85 M
  assert chosen_layers(models.cnn((28, 28), 62, l2=1e-4), 20) == ()  # ridge: the dense step


def test_flax_dense_layer_discovery():
  """``from_flax`` declares the plain ``nn.Dense`` layers called once on the batch's rows: not
  one called twice (shared weights), not one applied to a 3-D input or to more rows than the
  batch has, not a subclass, not one with another compute dtype."""

  class Sub(nn.Dense):
    pass

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      shared = nn.Dense(5, name="shared")
      h = shared(nn.Dense(5, name="once")(x))
      h = shared(h)
      seq = nn.Dense(5, name="seq")(h[:, None, :])[:, 0]
      h = Sub(5, name="sub")(seq)
      h = nn.Dense(5, dtype=jnp.float32, name="cast")(h)
      h = nn.Dense(5, name="pairs")(jnp.concatenate([h, h], 0))[: h.shape[0]]
      return nn.Dense(3, name="head")(h)

  model = models.from_flax(Net(), jnp.zeros((2, 4)))
  assert [layer.path for layer in model.dense_layers] == [("once", "kernel"), ("head", "kernel")]
  assert model.dense_layers[0] == DenseLayer(("once", "kernel"), 4, 5)
  assert model.factored_apply is not None
  # a model without plain dense layers has no factored form
  assert models.from_flax(Sub(3), jnp.zeros((2, 4))).factored_apply is None
  # a layer declared by hand whose input is not one row per example: a clear error when traced
  wrong = model._replace(dense_layers=(DenseLayer(("pairs", "kernel"), 5, 5),))
  params = wrong.init(jax.random.PRNGKey(0))
  x, y = jnp.ones((1, 2, 4)), jnp.zeros((1, 2), jnp.int32)

  def client(x, y, n, k):
    return local_sgd(wrong, params, x, y, n, k, batch_size=2, lr=0.1, num_epochs=1)

  keys = jax.random.split(jax.random.PRNGKey(0), 1)
  with local_folded_step(True), local_factored_dense(True):
    with pytest.raises(ValueError, match="pairs/kernel takes one row per example, \\[2, 5\\]"):
      map_clients(client, x, y, jnp.array([2]), keys, backend="vmap")


def test_local_factored_dense_input():
  with pytest.raises(ValueError, match="local_factored_dense needs True or False"):
    with local_factored_dense("yes"):
      pass
  with local_factored_dense(True):
    assert factored_dense()
  assert factored_dense() is False
  from fedjax_dro.common.tuning import platform_defaults

  assert platform_defaults("cpu").factored_dense is platform_defaults("gpu").factored_dense is False


def test_sweep_factored_equals_the_dense_sweep():
  """``fd.sweep`` over 2 client step sizes x 2 seeds (each configuration its own ``W_0``): the
  factored sweep's training losses and final per-client metrics equal the dense sweep's to
  1e-10, and the factored form was traced."""
  from fedjax_dro import sweep

  train = _data((40,), 3, seed=4)
  results = {}
  for factored in (False, True):
    model, traced = _counting(_mlp())
    with local_folded_step(factored), local_factored_dense(factored):
      alg = A.fedavg(model, clients_per_round=3, local_epochs=1, batch_size=4)
      results[factored] = sweep(
        alg,
        dataset(train, task="classification", num_classes=3),
        rounds=2,
        grid={"client_lr": [0.1, 0.3]},
        seeds=[0, 1],
        eval_every=2,
      )
    assert bool(traced) == factored
  dense, fact = results[False], results[True]
  np.testing.assert_allclose(
    np.asarray(fact.train_metrics["train_loss"]),
    np.asarray(dense.train_metrics["train_loss"]),
    rtol=0,
    atol=1e-10,
  )
  for a, b in zip(jax.tree.leaves(dense.final_per_client), jax.tree.leaves(fact.final_per_client)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-10)


def test_factored_form_runs_under_the_precision_policy():
  """``with_precision`` wraps the factored form too: under ``"bf16"`` the layers (and their
  corrections) see bf16 inputs, and with zero corrections it computes what ``apply`` does."""
  from fedjax_dro.core.precision import with_precision

  model = with_precision(_mlp(), "bf16")
  params = jax.tree.map(lambda a: a.astype(jnp.float32), model.init(jax.random.PRNGKey(0)))
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 40)), jnp.float32)
  seen = []

  def zero(x_in):
    seen.append(x_in.dtype)
    return jnp.zeros((x_in.shape[0], 64), jnp.float32)

  out = model.factored_apply(params, x, {("Dense_0", "kernel"): zero})
  assert seen == [jnp.bfloat16] and out.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(out), np.asarray(model.apply(params, x)))
  # wrapping again re-wraps the original (policies do not nest)
  again = with_precision(model, "float32")
  seen.clear()
  again.factored_apply(params, x, {("Dense_0", "kernel"): zero})
  assert seen == [jnp.float32]


def test_private_fedavg_factored_equals_the_dense_rounds():
  """Client-level DP FedAvg (Poisson participation, clip 0.5, noise 0.8; the same keys), one
  local epoch of batch 4: the factored run's model equals the dense run's to 1e-10 (clipping
  and noise act on the delta, whichever form computed it)."""
  import fedjax_dro as fd

  train = _data((40,), 3, seed=6)
  finals = {}
  for factored in (False, True):
    model, traced = _counting(_mlp())
    with local_folded_step(factored), local_factored_dense(factored):
      alg = fd.private(
        A.fedavg(model, local_epochs=1, batch_size=4, weighting="uniform"),
        0.5,
        0.8,
        rate=0.5,
        delta=1e-5,
      )
      hist = run(
        alg,
        dataset(train, task="classification", num_classes=3),
        rounds=3,
        seed=2,
        hparams={"client_lr": 0.2},
        eval_every=3,
      )
    finals[factored] = hist.final_state
    assert bool(traced) == factored
  for a, b in zip(jax.tree.leaves(finals[False]), jax.tree.leaves(finals[True])):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-10)
