"""Precision policies (fedjax_dro.core.precision): every factory takes ``precision=``; float32 is the
unwrapped model exactly; float64 models stay float64 under "float32"; bf16 tracks float32 on a small
real classification task within a stated tolerance."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.algorithms import fedavg, list_algorithms
from fedjax_dro.core.precision import (
  PRECISIONS,
  default_precision,
  model_precision,
  resolve_precision,
  with_precision,
)
from fedjax_dro.data import get_dataset

# bf16 vs float32 on digits-dirichlet (the CNN, 100 clients): the tolerance the tests promise.
BF16_ACCURACY_TOL = 0.03  # absolute, final mean client accuracy
BF16_LOSS_RTOL = 0.10  # relative, final mean client loss


def test_every_registered_factory_takes_precision():
  for name, entry in list_algorithms().items():
    params = inspect.signature(entry.factory).parameters
    assert "precision" in params, name
    assert params["precision"].default is None
    assert params["precision"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "precision" in (entry.factory.__doc__ or ""), name
    assert entry.factory.__name__ == name or name in entry.factory.__module__


@pytest.mark.parametrize("bad", ["fp16", "BF16", "float64", 32, jnp.bfloat16])
def test_bad_precision_refused(bad):
  model = models.softmax_regression(4, 3)
  with pytest.raises(ValueError, match="precision"):
    fedavg(model, precision=bad)
  with pytest.raises(ValueError, match="precision"):
    with_precision(model, bad)


def test_default_per_platform_and_recorded():
  assert default_precision("cpu") == "float32"
  assert default_precision("gpu") == default_precision("tpu") == "tf32"
  assert resolve_precision(None) == default_precision(jax.default_backend())
  model = models.softmax_regression(4, 3)
  assert fedavg(model).config["precision"] == default_precision()
  for p in PRECISIONS:
    alg = fedavg(model, precision=p)
    assert alg.config["precision"] == p and model_precision(alg.model) == p
  # re-wrapping replaces the policy (policies do not nest)
  twice = with_precision(with_precision(model, "bf16"), "float32")
  assert model_precision(twice) == "float32"
  assert twice.apply.__wrapped__ is model.apply


def _digits():
  return get_dataset("digits-dirichlet").load(0)


def test_float32_policy_is_the_unwrapped_model_exactly():
  ds = _digits()
  model = models.cnn((8, 8), 10, features=(4, 8), dense=None, conv="patches")
  settings = dict(local_steps=2, batch_size=8, clients_per_round=10)
  plain = fedavg.__wrapped__(model, **settings)  # the factory without the policy
  wrapped = fedavg(model, precision="float32", **settings)
  h0 = fd.run(plain, ds, rounds=3, seed=1)
  h1 = fd.run(wrapped, ds, rounds=3, seed=1)
  for a, b in zip(jax.tree.leaves(h0.final_state), jax.tree.leaves(h1.final_state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_float64_stays_float64_unless_asked():
  assert jax.config.jax_enable_x64  # tests run in x64 (conftest)
  model = models.mlp((5,), 3, (4,))
  params = model.init(jax.random.PRNGKey(0))
  x = jnp.ones((2, 5), jnp.float64)
  seen = {}

  def spy(p):
    def apply(params, x):
      seen[p] = (jax.tree.leaves(params)[0].dtype, x.dtype)
      return model.apply(params, x)

    return with_precision(model._replace(apply=apply), p)

  for p, compute in (("float32", jnp.float64), ("tf32", jnp.float32), ("bf16", jnp.bfloat16)):
    out = spy(p).apply(params, x)
    assert seen[p] == (compute, compute), p
    assert out.dtype == jnp.float64, p  # outputs (and so the loss) in the master dtype
    g = jax.grad(lambda w: spy(p).apply(w, x).sum())(params)  # noqa: B023
    assert all(leaf.dtype == jnp.float64 for leaf in jax.tree.leaves(g))
  np.testing.assert_array_equal(
    with_precision(model, "float32").apply(params, x), model.apply(params, x)
  )


def test_default_keeps_float64_models_in_float64_on_accelerators(monkeypatch):
  # precision=None on a GPU/TPU is "tf32" for float32 models, but a float64 model (x64) is
  # computed in float64 at full precision, as on CPU: x64 results do not depend on the device.
  import fedjax_dro.core.precision as precision_module

  monkeypatch.setattr(precision_module, "default_precision", lambda platform=None: "tf32")
  model = models.mlp((5,), 3, (4,))
  m = with_precision(model, None)
  assert model_precision(m) == "tf32"
  seen = []

  def spy(params, x):
    seen.append((jax.tree.leaves(params)[0].dtype, x.dtype))
    return model.apply(params, x)

  spied = with_precision(model._replace(apply=spy), None)
  p64 = model.init(jax.random.PRNGKey(0))
  x64 = jnp.ones((2, 5), jnp.float64)
  np.testing.assert_array_equal(spied.apply(p64, x64), model.apply(p64, x64))
  assert seen[-1] == (jnp.float64, jnp.float64)
  text = str(jax.make_jaxpr(jax.grad(lambda w: m.apply(w, x64).sum()))(p64))
  assert text.count("Precision.HIGHEST") >= 2 * 3
  assert text.count("Precision.HIGH") == text.count("Precision.HIGHEST")  # no TF32 product
  # float32 parameters get the accelerator policy: float32 compute, TF32 products
  p32 = jax.tree.map(lambda a: a.astype(jnp.float32), p64)
  spied.apply(p32, x64)
  assert seen[-1] == (jnp.float32, jnp.float32)
  text = str(jax.make_jaxpr(jax.grad(lambda w: m.apply(w, x64).sum()))(p32))
  assert text.count("Precision.HIGH") >= 2 * 3 and "Precision.HIGHEST" not in text
  # asked for explicitly, tf32 still casts a float64 model down
  with_precision(model._replace(apply=spy), "tf32").apply(p64, x64)
  assert seen[-1] == (jnp.float32, jnp.float32)


def test_matmul_precision_is_traced_into_forward_and_backward():
  model = models.mlp((5,), 3, (4,))
  params = model.init(jax.random.PRNGKey(0))
  x = jnp.ones((2, 5))
  for p, want in (("float32", "HIGHEST"), ("tf32", "HIGH")):
    m = with_precision(model, p)
    text = str(jax.make_jaxpr(jax.grad(lambda w: m.apply(w, x).sum()))(params))  # noqa: B023
    assert text.count(f"Precision.{want}") >= 2 * 3, p  # every dot of forward and backward


@pytest.mark.parametrize("conv", ["patches", pytest.param("lax", marks=pytest.mark.slow)])
def test_bf16_tracks_float32_on_digits(conv):
  """FedAvg, CNN on digits-dirichlet (100 clients), 40 rounds: bf16 vs float32 (float32 master
  parameters and data in both): final accuracy within 0.03, final loss within 10%."""
  ds = _digits()
  model = models.cnn((8, 8), 10, features=(8, 16), dense=None, conv=conv)
  params = jax.tree.map(
    lambda a: a.astype(jnp.float32), model.init(jax.random.PRNGKey(0))
  )  # float32 masters (the tests run in x64)
  ds = dataclasses.replace(
    ds,
    train=ds.train.replace(x=ds.train.x.astype(jnp.float32)),
    test=ds.test.replace(x=ds.test.x.astype(jnp.float32)),
  )
  out = {}
  for p in ("float32", "bf16"):
    alg = fedavg(model, local_steps=5, batch_size=16, clients_per_round=20, precision=p)
    h = fd.run(alg, ds, rounds=40, seed=0, init_params=params, hparams={"client_lr": 0.1})
    leaves = jax.tree.leaves(h.final_state.params)
    assert all(leaf.dtype == jnp.float32 for leaf in leaves)  # masters stay float32
    out[p] = h.evaluations[-1]["summary"]
  acc32, acc16 = out["float32"]["accuracy"]["mean"], out["bf16"]["accuracy"]["mean"]
  loss32, loss16 = out["float32"]["loss"]["mean"], out["bf16"]["loss"]["mean"]
  assert acc32 > 0.6  # the task is learned
  assert abs(acc16 - acc32) <= BF16_ACCURACY_TOL, (acc16, acc32)
  assert abs(loss16 - loss32) <= BF16_LOSS_RTOL * loss32, (loss16, loss32)
