"""models.from_nnx and models.from_equinox: the same function as the built-in (linen) MLP with the
same weights (outputs and gradients of the client loss, 1e-6), CNNs written in each through
``fd.run`` and ``fd.sweep`` (a sweep row equals its run), initial weights from the run's key for a
constructor and the instance's own for an instance, and modules with state refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fedjax_dro import algorithms as A, models, run, sweep
from fedjax_dro.common.model import client_loss
from fedjax_dro.data import from_client_arrays
from tests.helpers import dataset

eqx = pytest.importorskip("equinox")


class NnxMLP(nnx.Module):
  def __init__(self, rngs):
    self.l1 = nnx.Linear(6, 8, rngs=rngs)
    self.l2 = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    return self.l2(nnx.relu(self.l1(x.reshape(x.shape[0], -1))))


class EqxMLP(eqx.Module):
  l1: eqx.nn.Linear
  l2: eqx.nn.Linear

  def __init__(self, key):
    k1, k2 = jax.random.split(key)
    self.l1 = eqx.nn.Linear(6, 8, key=k1)
    self.l2 = eqx.nn.Linear(8, 3, key=k2)

  def __call__(self, x):  # one example
    return self.l2(jax.nn.relu(self.l1(x.reshape(-1))))


class NnxCNN(nnx.Module):
  def __init__(self, rngs):
    self.conv = nnx.Conv(1, 4, (3, 3), rngs=rngs)
    self.out = nnx.Linear(4 * 6 * 6, 3, rngs=rngs)

  def __call__(self, x):
    h = nnx.relu(self.conv(x))
    return self.out(h.reshape(h.shape[0], -1))


class EqxCNN(eqx.Module):
  conv: eqx.nn.Conv2d
  out: eqx.nn.Linear

  def __init__(self, key):
    k1, k2 = jax.random.split(key)
    self.conv = eqx.nn.Conv2d(1, 4, 3, padding=1, key=k1)
    self.out = eqx.nn.Linear(4 * 6 * 6, 3, key=k2)

  def __call__(self, x):  # one example [6, 6, 1]
    h = jax.nn.relu(self.conv(jnp.transpose(x, (2, 0, 1))))
    return self.out(h.reshape(-1))


def _batch(seed=0, m=5, shape=(6,)):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.normal(size=(m,) + shape)), jnp.asarray(rng.integers(0, 3, m))


def _images(n=6, seed=0):
  rng = np.random.default_rng(seed)
  sizes = rng.integers(4, 10, n)
  xs = [rng.normal(size=(int(m), 6, 6, 1)) + 0.3 * (i % 3) for i, m in enumerate(sizes)]
  ys = [rng.integers(0, 3, int(m)) for m in sizes]
  return from_client_arrays(xs, ys, dtype=np.float64)


def _assert_same_model(model, ref, params, ref_params):
  x, y = _batch()
  mask = jnp.ones(x.shape[0], bool)
  np.testing.assert_allclose(model.apply(params, x), ref.apply(ref_params, x), atol=1e-6)
  g = jax.grad(lambda p: client_loss(model, p, x, y, mask))(params)
  g_ref = jax.grad(lambda p: client_loss(ref, p, x, y, mask))(ref_params)
  return g, g_ref


def test_nnx_mlp_equals_the_builtin_mlp_with_the_same_weights():
  ref = models.mlp((6,), 3, hidden=(8,))
  rp = ref.init(jax.random.PRNGKey(0))
  model = models.from_nnx(NnxMLP)
  params = model.init(jax.random.PRNGKey(1))
  assert set(params) == {"l1", "l2"} and set(params["l1"]) == {"kernel", "bias"}
  params = {"l1": dict(rp["Dense_0"]), "l2": dict(rp["Dense_1"])}  # both [in, out]
  g, g_ref = _assert_same_model(model, ref, params, rp)
  for ours, theirs in (("l1", "Dense_0"), ("l2", "Dense_1")):
    for k in ("kernel", "bias"):
      np.testing.assert_allclose(g[ours][k], g_ref[theirs][k], atol=1e-6)


def test_equinox_mlp_equals_the_builtin_mlp_with_the_same_weights():
  ref = models.mlp((6,), 3, hidden=(8,))
  rp = ref.init(jax.random.PRNGKey(0))
  model = models.from_equinox(EqxMLP)
  params = model.init(jax.random.PRNGKey(1))
  params = eqx.tree_at(
    lambda m: (m.l1.weight, m.l1.bias, m.l2.weight, m.l2.bias),
    params,
    (
      rp["Dense_0"]["kernel"].T,
      rp["Dense_0"]["bias"],
      rp["Dense_1"]["kernel"].T,
      rp["Dense_1"]["bias"],
    ),
  )
  g, g_ref = _assert_same_model(model, ref, params, rp)
  np.testing.assert_allclose(g.l1.weight, g_ref["Dense_0"]["kernel"].T, atol=1e-6)
  np.testing.assert_allclose(g.l2.bias, g_ref["Dense_1"]["bias"], atol=1e-6)
  batched = models.from_equinox(lambda k: EqxBatched(EqxMLP(k)), per_example=False)
  np.testing.assert_allclose(
    batched.apply(EqxBatched(params), _batch()[0]), model.apply(params, _batch()[0]), atol=1e-12
  )


class EqxBatched(eqx.Module):
  inner: EqxMLP

  def __call__(self, x):  # a batch
    return jax.vmap(self.inner)(x)


@pytest.mark.parametrize("make", [NnxCNN, EqxCNN], ids=["nnx", "equinox"])
def test_a_cnn_in_each_runs_through_run_and_sweep(make):
  adapt = models.from_nnx if make is NnxCNN else models.from_equinox
  model = adapt(make)
  data = dataset(_images(), task="classification", num_classes=3)
  alg = A.fedavg(model, clients_per_round=3, local_steps=2, batch_size=4)
  single = run(alg, data, rounds=3, seed=1, hparams={"client_lr": 0.1})
  res = sweep(alg, data, rounds=3, grid={"client_lr": [0.1, 0.3]}, seeds=[1])
  np.testing.assert_allclose(
    res.train_metrics["train_loss"][0], single.train_metrics["train_loss"], atol=1e-6
  )
  assert np.all(np.isfinite(res.train_metrics["train_loss"]))
  assert not np.allclose(res.train_metrics["train_loss"][0], res.train_metrics["train_loss"][1])


def test_constructor_draws_from_the_key_and_an_instance_keeps_its_weights():
  for adapt, make, build in [
    (models.from_nnx, NnxMLP, lambda: NnxMLP(nnx.Rngs(5))),
    (models.from_equinox, EqxMLP, lambda: EqxMLP(jax.random.PRNGKey(5))),
  ]:
    drawn = adapt(make)
    a, b = (jax.tree.leaves(drawn.init(jax.random.PRNGKey(k))) for k in (1, 2))
    assert any(not np.allclose(x, y) for x, y in zip(a, b))
    fixed = adapt(build())
    a, b = (jax.tree.leaves(fixed.init(jax.random.PRNGKey(k))) for k in (1, 2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


class NnxWithCache(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(6, 3, rngs=rngs)
    self.seen = nnx.Cache(jnp.zeros(3))
    self.drop = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x):
    return self.drop(self.lin(x))


def test_unsupported_variables_and_non_modules_are_refused_by_name():
  # Batch statistics and RNG streams are accepted (tests/models/test_adapters_state.py); other
  # mutable variables are not.
  with pytest.raises(ValueError, match=r"NNX module holds state.*\['seen'\] \(Cache\)"):
    models.from_nnx(NnxWithCache)
  with pytest.raises(TypeError, match="the constructor returned tuple"):
    models.from_equinox(lambda key: (EqxMLP(key), 3))
  with pytest.raises(TypeError, match="module must be a flax.nnx.Module or a constructor"):
    models.from_nnx(3)
  with pytest.raises(TypeError, match="the constructor returned"):
    models.from_nnx(lambda rngs: 3)
  with pytest.raises(
    TypeError, match="module must be an equinox.Module, a pair .* or a constructor"
  ):
    models.from_equinox("mlp")
  with pytest.raises(TypeError, match="per_example must be a bool"):
    models.from_equinox(EqxMLP, per_example=1)
  with pytest.raises(ValueError, match="loss must be one of"):
    models.from_nnx(NnxMLP, loss="hinge")
