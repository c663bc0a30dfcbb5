"""softmax_regression's head forms: the transposed read of the weights (behind an optimization
barrier) is the same model as ``x @ w``: values, gradients, forward-mode derivatives and
Hessian-vector products agree; ``head="auto"`` follows the measurements."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.common.model import client_loss
from fedjax_dro.common.tuning import platform_defaults
from fedjax_dro.models.builtin import head_form
from tests.helpers import load_benchmark

_MEASURED = load_benchmark("speedlib.measured")
HEAD_MEASUREMENTS = _MEASURED.HEAD_MEASUREMENTS
head_limit = _MEASURED.head_limit


def _problem(k, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((7, 5)))
  y = jnp.asarray(rng.integers(0, k, 7))
  params = {"w": jnp.asarray(rng.standard_normal((5, k))), "b": jnp.asarray(rng.standard_normal(k))}
  return x, y, params


@pytest.mark.parametrize("k", [3, 40])
def test_transposed_head_is_the_same_model_to_second_order(k):
  x, y, params = _problem(k)
  mask = jnp.ones(7, bool)
  plain, transposed = (
    models.softmax_regression(5, k, l2=0.1, head=h) for h in ("plain", "transposed")
  )
  np.testing.assert_allclose(
    transposed.apply(params, x), plain.apply(params, x), rtol=0, atol=1e-12
  )

  def loss(model):
    return lambda p: client_loss(model, p, x, y, mask)

  for fn in (jax.grad, lambda f: jax.jacfwd(jax.grad(f))):  # reverse, forward over reverse
    a, b = fn(loss(plain))(params), fn(loss(transposed))(params)
    for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_allclose(lb, la, rtol=0, atol=1e-11)
  v = jax.tree.map(jnp.ones_like, params)
  hvp = [jax.jvp(jax.grad(loss(m)), (params,), (v,))[1] for m in (plain, transposed)]
  for la, lb in zip(*(jax.tree.leaves(h) for h in hvp)):
    np.testing.assert_allclose(lb, la, rtol=0, atol=1e-11)
  assert float(jnp.max(jnp.abs(hvp[0]["w"]))) > 1e-3  # a non-trivial Hessian


def _has_barrier(model, k):
  x, _, params = _problem(k)
  # a fresh function each time: make_jaxpr remembers the traces of a function it has seen
  return "optimization_barrier" in str(jax.make_jaxpr(lambda p, v: model.apply(p, v))(params, x))


def test_auto_head_follows_the_measurements_on_this_platform():
  limit = platform_defaults(jax.default_backend()).head_transposed_max_classes
  for k in (2, 10, 16, 17, 62):
    expected = k <= limit
    assert _has_barrier(models.softmax_regression(5, k), k) == expected, k
  # the traced program's tuning decides
  with fd.tuned(head_transposed_max_classes=62):
    assert _has_barrier(models.softmax_regression(5, 62), 62)
  with fd.tuned(head_transposed_max_classes=0):
    assert not _has_barrier(models.softmax_regression(5, 2), 2)
  assert not _has_barrier(models.softmax_regression(5, 2, head="plain"), 2)
  assert _has_barrier(models.softmax_regression(5, 62, head="transposed"), 62)


def test_head_form_rule():
  # CPU: transposed up to the largest k below which every measured k was faster transposed
  rates = HEAD_MEASUREMENTS["cpu"]
  limit = platform_defaults("cpu").head_transposed_max_classes
  assert head_limit(rates) == limit
  assert limit in rates and all(
    rates[k]["transposed"] > rates[k]["plain"] for k in rates if k <= limit
  )
  slower = [k for k in rates if rates[k]["transposed"] <= rates[k]["plain"]]
  assert slower and min(slower) > limit
  assert head_form(limit, "cpu") == "transposed" and head_form(limit + 1, "cpu") == "plain"
  for platform in ("gpu", "cuda", "rocm", "tpu"):
    assert head_form(2, platform) == "plain"
  with pytest.raises(TypeError, match="platform must be a string"):
    head_form(2, 3)


def test_head_name():
  assert models.softmax_regression(5, 3).name == "softmax_regression(d=5, k=3)"
  assert (
    models.softmax_regression(5, 3, head="plain").name == "softmax_regression(d=5, k=3, head=plain)"
  )


@pytest.mark.parametrize("bad", ["transpose", "PLAIN", "", None, 3])
def test_bad_head_value_names_head(bad):
  with pytest.raises(ValueError, match="head must be one of"):
    models.softmax_regression(5, 3, head=bad)


def test_cpu_row_of_the_table_is_the_recorded_benchmark():
  """The measurements' CPU row is benchmarks/results/speed_head.json's rates."""
  import json
  import pathlib

  path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks/results/speed_head.json"
  recorded = json.loads(path.read_text())
  assert recorded["meta"]["platform"] == "cpu"
  assert HEAD_MEASUREMENTS["cpu"] == {int(k): r for k, r in recorded["table"]["cpu"].items()}
