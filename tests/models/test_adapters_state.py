"""Batch statistics and dropout through the three adapters (from_flax, from_nnx, from_equinox).

For each adapter: ``apply`` is the module's own inference call, ``train_apply`` its own training
call with the same key (outputs and new state), ``train_apply`` under ``jax.vmap`` over stacked
parameters equals separate calls, dropout depends on the key only, what is still refused is
refused by name, and a module without state or randomness keeps the stateless form."""

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fedjax_dro import models
from fedjax_dro.common.model import train_value_and_grad
from fedjax_dro.models.cifar_cnn import CifarCNN

X = jnp.asarray(np.random.default_rng(0).normal(size=(5, 6)), jnp.float32)
Y = jnp.asarray([0, 1, 2, 0, 1])
MASK = jnp.asarray([True, True, True, False, True])
RNG = jax.random.PRNGKey(7)


def close(a, b, atol=1e-6):
  jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5, atol=atol), a, b)


def stacked(params, n=3):
  """``n`` different copies of ``params`` stacked on a new leading axis."""
  return jax.tree.map(
    lambda a: jnp.stack(
      [a * (1.0 + 0.1 * i) if jnp.issubdtype(a.dtype, jnp.inexact) else a for i in range(n)]
    ),
    params,
  )


def check_vmap(model, params, x=X, mask=MASK):
  """train_apply vmapped over 3 stacked copies and 3 keys equals 3 separate calls."""
  ps, keys = stacked(params), jax.random.split(RNG, 3)
  out, state = jax.jit(jax.vmap(model.train_apply, in_axes=(0, None, None, 0)))(ps, x, mask, keys)
  for i in range(3):
    row = lambda tree, i=i: jax.tree.map(lambda a: a[i], tree)  # noqa: E731
    o, s = model.train_apply(row(ps), x, mask, keys[i])
    close(out[i], o)
    close(row(state), s)


def check_dropout(model, params, x=X):
  a, _ = model.train_apply(params, x, MASK, jax.random.PRNGKey(1))
  b, _ = model.train_apply(params, x, MASK, jax.random.PRNGKey(2))
  c, _ = model.train_apply(params, x, MASK, jax.random.PRNGKey(1))
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(a, c)
  np.testing.assert_array_equal(model.apply(params, x), model.apply(params, x))


def check_state_gradient_zero(model, params):
  loss, grad, state = train_value_and_grad(model, params, X, Y, MASK, RNG)
  assert np.isfinite(loss)
  for key in model.state_keys:
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(grad[key]))
    assert jax.tree.structure(state[key]) == jax.tree.structure(params[key])
  assert any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(grad["params"]))


# ---- flax.linen ----


class LinenNet(nn.Module):
  """Dense, BatchNorm over the valid rows, Dropout (Flax's ImageNet example's train flag)."""

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    h = nn.Dense(4)(x)
    h = nn.BatchNorm(use_running_average=not train, momentum=0.9)(
      h, mask=None if mask is None else mask[:, None]
    )
    h = nn.Dropout(0.5, deterministic=not train)(nn.relu(h))
    return nn.Dense(3)(h)


class LinenDropout(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    return nn.Dense(3)(nn.Dropout(0.5)(nn.Dense(4)(x), deterministic=deterministic))


def test_linen_batch_norm_and_dropout_match_the_module():
  module = LinenNet()
  model = models.from_flax(module, X)
  assert model.state_keys == ("batch_stats",) and model.state_masked
  assert model.dense_layers == () and model.factored_apply is None
  params = model.init(jax.random.PRNGKey(0))
  assert set(params) == {"params", "batch_stats"}
  close(model.apply(params, X), module.apply(params, X, train=False))
  out, state = model.train_apply(params, X, MASK, RNG)
  want, new = module.apply(
    params, X, train=True, mask=MASK, rngs={"dropout": RNG}, mutable=["batch_stats"]
  )
  close(out, want)
  close(state, {"batch_stats": new["batch_stats"]})
  # masked rows are left out of the statistics: garbage there changes nothing
  garbage = X.at[3].set(1e3)
  close(model.train_apply(params, garbage, MASK, RNG)[1], state)
  check_vmap(model, params)
  check_dropout(model, params)
  check_state_gradient_zero(model, params)


def test_linen_dropout_without_state_and_the_deterministic_keyword():
  module = LinenDropout()
  model = models.from_flax(module, X)
  assert model.state_keys == () and not model.state_masked and model.train_apply is not None
  params = model.init(jax.random.PRNGKey(0))
  assert "Dense_0" in params  # the bare weights
  close(model.apply(params, X), module.apply({"params": params}, X))
  out, state = model.train_apply(params, X, MASK, RNG)
  assert state == {}
  close(out, module.apply({"params": params}, X, deterministic=False, rngs={"dropout": RNG}))
  check_vmap(model, params)
  check_dropout(model, params)


def test_zoo_batch_norm_leaves_out_masked_rows():
  x = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4, 4, 2)), jnp.float32)
  mask = jnp.asarray([True, False, True])
  for net in (
    models.resnet.ResNet((1,), num_classes=3, num_filters=2, stem="cifar"),
    models.densenet.DenseNet(2, (1,), num_init_features=2, bn_size=1, num_classes=3),
  ):
    model = models.from_flax(net, x)
    assert model.state_masked
    params = model.init(jax.random.PRNGKey(0))
    close(model.apply(params, x), net.apply(params, x))  # unchanged inference
    train = jax.jit(model.train_apply)
    out, state = train(params, x, mask, RNG)
    want, new = net.apply(params, x[mask], train=True, mutable=["batch_stats"])
    close(out[mask], want, atol=1e-5)
    close(state, new, atol=1e-5)
    close(train(params, x.at[1].set(1e3), mask, RNG)[1], state, atol=1e-5)


def test_linen_zoo_modules_pass():
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 8, 8, 3)), jnp.float32)
  cnn = models.from_flax(CifarCNN(3), x)
  assert cnn.train_apply is not None and cnn.state_keys == ()
  net = models.resnet18(3, stem="cifar", num_filters=2)
  resnet = models.from_flax(net, x)
  assert resnet.state_keys == ("batch_stats",) and resnet.state_masked
  # traced abstractly (compiling the ResNet takes seconds): the training mode's state is the
  # batch_stats entry of the parameters
  params = jax.eval_shape(resnet.init, jax.random.PRNGKey(0))
  _, state = jax.eval_shape(resnet.train_apply, params, x, jnp.ones(2, bool), RNG)
  assert jax.tree.structure(state) == jax.tree.structure({"batch_stats": params["batch_stats"]})
  # GroupNorm: a train flag that changes nothing, the stateless form (factored layers kept)
  gn = models.from_flax(models.resnet18(3, stem="cifar", num_filters=2, norm="group", groups=2), x)
  assert gn.train_apply is None and gn.state_keys == ()


class LinenCache(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    calls = self.variable("cache", "calls", jnp.zeros, (), jnp.int32)
    calls.value += 1
    return nn.Dense(3)(x)


class LinenBatchNormNoFlag(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.BatchNorm(use_running_average=False)(nn.Dense(3)(x))


def test_linen_refusals_name_the_collection_or_the_convention():
  with pytest.raises(ValueError, match=r"collections \['cache'\]"):
    models.from_flax(LinenCache(), X)
  with pytest.raises(ValueError, match=r"'batch_stats'.*no `train` keyword.*use_running_average"):
    models.from_flax(LinenBatchNormNoFlag(), X)


def test_linen_stateless_module_without_flag_is_unchanged():
  model = models.from_flax(nn.Dense(3), X)
  assert model.train_apply is None and model.state_keys == () and not model.state_masked
  assert model.factored_apply is not None


# ---- flax.nnx ----


class NnxNet(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(6, 4, rngs=rngs)
    self.bn = nnx.BatchNorm(4, momentum=0.9, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)
    self.out = nnx.Linear(4, 3, rngs=rngs)

  def __call__(self, x, mask=None):
    h = self.bn(self.lin(x), mask=None if mask is None else mask[:, None])
    return self.out(self.drop(nnx.relu(h)))


class NnxLSTM(nnx.Module):
  def __init__(self, rngs):
    self.embed = nnx.Embed(11, 4, rngs=rngs)
    self.rnn = nnx.RNN(nnx.OptimizedLSTMCell(4, 5, rngs=rngs), rngs=rngs)
    self.out = nnx.Linear(5, 11, rngs=rngs)

  def __call__(self, tokens):
    return self.out(self.rnn(self.embed(tokens)))


def _nnx_reference(instance, params, rng):
  """A copy of ``instance`` with ``params``, its one RNG stream seeded as train_apply seeds it."""
  ref = nnx.clone(instance)
  nnx.update(ref, params["params"], params["batch_stats"])
  ref.drop.rngs.key[...] = jax.random.fold_in(jax.random.wrap_key_data(rng), 0)
  ref.drop.rngs.count[...] = 0
  return ref


@pytest.mark.parametrize("given", ["instance", "constructor"])
def test_nnx_batch_norm_and_dropout_match_the_module(given):
  instance = NnxNet(nnx.Rngs(0))
  model = models.from_nnx(instance if given == "instance" else NnxNet)
  assert model.state_keys == ("batch_stats",) and model.state_masked
  params = model.init(jax.random.PRNGKey(0))
  assert set(params) == {"params", "batch_stats"} and set(params["batch_stats"]) == {"bn"}
  if given == "constructor":
    instance = NnxNet(nnx.Rngs(jax.random.PRNGKey(0)))
  close(params["params"], nnx.to_pure_dict(nnx.state(instance, nnx.Param)))
  # stats moved away from their initial values, so that inference mode is seen to use them
  params["batch_stats"]["bn"]["mean"] = params["batch_stats"]["bn"]["mean"] + 0.5
  ref = _nnx_reference(instance, params, RNG)
  ref.eval()
  close(model.apply(params, X), ref(X))
  out, state = model.train_apply(params, X, MASK, RNG)
  ref = _nnx_reference(instance, params, RNG)
  ref.train()
  close(out, ref(X, mask=MASK))
  close(state, {"batch_stats": nnx.to_pure_dict(nnx.state(ref, nnx.BatchStat))})
  close(model.train_apply(params, X.at[3].set(1e3), MASK, RNG)[1], state)
  check_vmap(model, params)
  check_dropout(model, params)
  check_state_gradient_zero(model, params)


def test_nnx_rnn_keeps_an_rng_stream_but_no_state():
  instance = NnxLSTM(nnx.Rngs(0))
  model = models.from_nnx(instance)
  assert model.state_keys == () and model.train_apply is not None
  params = model.init(jax.random.PRNGKey(0))
  assert set(params) == {"embed", "rnn", "out"}  # the plain Param dict
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 11, (3, 7)))
  close(model.apply(params, tokens), instance(tokens))
  out, state = model.train_apply(params, tokens, jnp.ones(3, bool), RNG)
  assert state == {}
  close(out, instance(tokens))
  check_vmap(model, params, tokens, jnp.ones(3, bool))


class Counter(nnx.Variable):
  pass


class NnxCounts(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(6, 3, rngs=rngs)
    self.calls = Counter(jnp.zeros((), jnp.int32))

  def __call__(self, x):
    return self.lin(x)


def test_nnx_refusal_names_the_variable_and_stateless_is_unchanged():
  with pytest.raises(ValueError, match=r"\['calls'\] \(Counter\)"):
    models.from_nnx(NnxCounts)
  model = models.from_nnx(lambda rngs: nnx.Linear(6, 3, rngs=rngs))
  assert model.train_apply is None and model.state_keys == ()
  assert set(model.init(jax.random.PRNGKey(0))) == {"kernel", "bias"}


# ---- Equinox ----


class EqxNet(eqx.Module):
  lin: eqx.nn.Linear
  bn: eqx.nn.BatchNorm
  drop: eqx.nn.Dropout
  out: eqx.nn.Linear

  def __init__(self, key):
    k1, k2 = jax.random.split(key)
    self.lin = eqx.nn.Linear(6, 4, key=k1)
    self.bn = eqx.nn.BatchNorm(4, axis_name="batch", momentum=0.9, mode="ema")
    self.drop = eqx.nn.Dropout(0.5)
    self.out = eqx.nn.Linear(4, 3, key=k2)

  def __call__(self, x, state, *, key=None):  # one example
    h, state = self.bn(self.lin(x), state)
    return self.out(self.drop(jax.nn.relu(h), key=key)), state


class EqxDropout(eqx.Module):
  lin: eqx.nn.Linear
  drop: eqx.nn.Dropout

  def __init__(self, key):
    self.lin = eqx.nn.Linear(6, 3, key=key)
    self.drop = eqx.nn.Dropout(0.5)

  def __call__(self, x, *, key=None):
    return self.drop(self.lin(x), key=key)


def _eqx_leaves(state):
  return tuple(jnp.asarray(a, jnp.float32) for a in jax.tree.leaves(state))


@pytest.mark.parametrize("given", ["instance", "make_with_state", "constructor"])
def test_equinox_batch_norm_and_dropout_match_the_module(given):
  key = jax.random.PRNGKey(0)
  net, state0 = eqx.nn.make_with_state(EqxNet)(key)
  module = {"instance": EqxNet(key), "make_with_state": (net, state0), "constructor": EqxNet}
  model = models.from_equinox(module[given])
  assert model.state_keys == ("state",) and not model.state_masked
  params = model.init(key)
  assert set(params) == {"params", "state"} and isinstance(params["state"], tuple)
  close(params["state"], _eqx_leaves(state0))
  batch = dict(axis_name="batch", in_axes=(0, None), out_axes=(0, None))
  close(model.apply(params, X), jax.vmap(eqx.nn.inference_mode(net), **batch)(X, state0)[0])
  out, state = model.train_apply(params, X, MASK, RNG)
  keys = jax.random.split(RNG, X.shape[0])
  want, new = jax.vmap(
    lambda x, s, k: net(x, s, key=k), axis_name="batch", in_axes=(0, None, 0), out_axes=(0, None)
  )(X, state0, keys)
  close(out, want)
  close(state, {"state": _eqx_leaves(new)})
  # the new state goes back in: its flag (a bool, stored as a float) is read as the bool again
  out2, _ = model.train_apply({**params, **state}, X, MASK, RNG)
  want2, _ = jax.vmap(
    lambda x, s, k: net(x, s, key=k), axis_name="batch", in_axes=(0, None, 0), out_axes=(0, None)
  )(X, new, keys)
  close(out2, want2)
  check_vmap(model, params)
  check_dropout(model, params)
  check_state_gradient_zero(model, params)


def test_equinox_dropout_without_state():
  net = EqxDropout(jax.random.PRNGKey(0))
  model = models.from_equinox(net)
  assert model.state_keys == () and model.train_apply is not None
  params = model.init(jax.random.PRNGKey(0))
  close(model.apply(params, X), jax.vmap(eqx.nn.inference_mode(net))(X))
  out, state = model.train_apply(params, X, MASK, RNG)
  assert state == {}
  keys = jax.random.split(RNG, X.shape[0])
  close(out, jax.vmap(lambda x, k: net(x, key=k))(X, keys))
  check_vmap(model, params)
  check_dropout(model, params)
  seq = eqx.nn.Sequential([eqx.nn.Lambda(lambda x, key=None: x), eqx.nn.Dropout(0.5)])
  batched = models.from_equinox(seq, per_example=False)
  a = batched.train_apply(batched.init(RNG), X, MASK, RNG)[0]
  np.testing.assert_array_equal(a, seq(X, key=RNG))


def test_equinox_refusal_and_stateless_is_unchanged():
  with pytest.raises(TypeError, match="the constructor returned tuple"):
    models.from_equinox(lambda key: (EqxDropout(key), 3))
  with pytest.raises(TypeError, match="axis_name must be"):
    models.from_equinox(EqxNet, axis_name=3)
  model = models.from_equinox(lambda key: eqx.nn.Linear(6, 3, key=key))
  assert model.train_apply is None and model.state_keys == ()
