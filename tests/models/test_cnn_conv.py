"""The CNN's convolution forms ("lax" and "patches", and "auto", which picks one of them per
platform and compute dtype) are the same function of the same parameters: outputs and gradients
agree, per client under vmap too; "auto" picks what its table of measurements says."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.common.tuning import platform_defaults
from fedjax_dro.core.precision import with_precision
from fedjax_dro.models.builtin import conv_form
from tests.helpers import load_benchmark


@pytest.mark.parametrize("shape", [(8, 8), (28, 28, 1), (9, 7, 2)])
@pytest.mark.parametrize("dense", [None, 16])
def test_patches_equal_lax_conv_outputs_and_gradients(shape, dense):
  a = models.cnn(shape, 10, features=(4, 8), dense=dense)
  b = models.cnn(shape, 10, features=(4, 8), dense=dense, conv="patches")
  params = a.init(jax.random.PRNGKey(0))
  assert jax.tree.structure(params) == jax.tree.structure(b.init(jax.random.PRNGKey(0)))
  x = jax.random.normal(jax.random.PRNGKey(1), (5,) + shape)
  y = jnp.arange(5) % 10
  np.testing.assert_allclose(a.apply(params, x), b.apply(params, x), rtol=0, atol=1e-10)
  loss = lambda m: jax.grad(lambda p: jnp.mean(m.loss(m.apply(p, x), y)))(params)
  for ga, gb in zip(jax.tree.leaves(loss(a)), jax.tree.leaves(loss(b))):
    np.testing.assert_allclose(ga, gb, rtol=0, atol=1e-10)


_MEASURED = load_benchmark("speedlib.measured")
CONV_MEASUREMENTS = _MEASURED.CONV_MEASUREMENTS
conv_choice = _MEASURED.conv_choice


def test_patches_equal_lax_conv_under_vmap_in_float32():
  with jax.enable_x64(False):
    a = models.cnn((8, 8), 10, features=(4, 8), dense=None)
    b = models.cnn((8, 8), 10, features=(4, 8), dense=None, conv="patches")
    params = jax.vmap(a.init)(jax.random.split(jax.random.PRNGKey(0), 6))
    x = jax.random.normal(jax.random.PRNGKey(1), (6, 4, 8, 8))
    out_a, out_b = jax.vmap(a.apply)(params, x), jax.vmap(b.apply)(params, x)
    assert out_a.dtype == jnp.float32
    np.testing.assert_allclose(out_a, out_b, rtol=0, atol=1e-5)


def test_conv_option_is_validated():
  with pytest.raises(ValueError, match="conv"):
    models.cnn((8, 8), 10, conv="fft")


# conv="auto": the form measured faster on the platform and in the compute dtype.


def _uses_lax_conv(model, params, x):
  """Whether the traced model computes with lax.conv (a conv_general_dilated in its jaxpr)."""
  # a fresh function each time: make_jaxpr remembers the traces of a function it has seen
  return "conv_general_dilated" in str(jax.make_jaxpr(lambda p, v: model.apply(p, v))(params, x))


@pytest.mark.parametrize("shape", [(8, 8), (9, 7, 2)])
def test_auto_equals_lax_and_patches_outputs_and_gradients(shape):
  auto = models.cnn(shape, 10, features=(4, 8), dense=16)
  params = auto.init(jax.random.PRNGKey(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (5,) + shape)
  y = jnp.arange(5) % 10
  grad = lambda m: jax.grad(lambda p: jnp.mean(m.loss(m.apply(p, x), y)))(params)
  for form in ("lax", "patches"):
    other = models.cnn(shape, 10, features=(4, 8), dense=16, conv=form)
    assert jax.tree.structure(other.init(jax.random.PRNGKey(0))) == jax.tree.structure(params)
    np.testing.assert_allclose(auto.apply(params, x), other.apply(params, x), rtol=0, atol=1e-10)
    for ga, gb in zip(jax.tree.leaves(grad(auto)), jax.tree.leaves(grad(other))):
      np.testing.assert_allclose(ga, gb, rtol=0, atol=1e-10)


def test_conv_defaults_are_the_faster_form_of_the_measurements():
  # an independent reading of the table: the larger rate at the largest measured n
  for (platform, dtype), by_n in CONV_MEASUREMENTS.items():
    rates = by_n[max(by_n)]
    assert set(rates) == {"lax", "patches"} and min(rates.values()) > 0
    faster = "patches" if rates["patches"] > rates["lax"] else "lax"
    assert conv_choice(by_n) == faster
    defaults = platform_defaults(platform)
    assert (defaults.conv_bf16 if dtype == "bfloat16" else defaults.conv) == faster
    assert conv_form(platform, getattr(jnp, dtype)) == faster
  # the GPU figures: lax.conv 3,520 / patches 9,501 in tf32 (H200), 6,216 / 3,766 in bf16 (H100)
  assert conv_form("gpu", jnp.float32) == "patches"
  assert conv_form("gpu", jnp.bfloat16) == "lax"
  assert conv_form("cuda", jnp.float32) == "patches"
  # float64 computes as the float32 row, float16 as the bfloat16 row; unmeasured platforms: lax
  assert conv_form("gpu", jnp.float64) == conv_form("gpu", jnp.float32)
  assert conv_form("gpu", jnp.float16) == conv_form("gpu", jnp.bfloat16)
  assert conv_form("tpu", jnp.float32) == "lax"
  with pytest.raises(TypeError, match="platform"):
    conv_form(3, jnp.float32)


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_auto_traces_the_form_of_this_platform_and_precision(precision):
  model = models.cnn((8, 8), 10, features=(4, 8), dense=None)
  params = model.init(jax.random.PRNGKey(0))
  x = jnp.zeros((2, 8, 8))
  wrapped = with_precision(model, precision)
  dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32
  expected = conv_form(jax.default_backend(), dtype)
  assert _uses_lax_conv(wrapped, params, x) == (expected == "lax")
  # the traced program's tuning decides, not the platform alone
  other = "lax" if expected == "patches" else "patches"
  field = "conv_bf16" if precision == "bf16" else "conv"
  with fd.tuned(**{field: other}):
    assert _uses_lax_conv(wrapped, params, x) == (other == "lax")
  # the explicit forms trace what they name
  for form in ("lax", "patches"):
    m = with_precision(models.cnn((8, 8), 10, features=(4, 8), dense=None, conv=form), precision)
    assert _uses_lax_conv(m, params, x) == (form == "lax")


def test_auto_model_name_records_the_resolved_forms():
  platform = jax.default_backend()
  name = models.cnn((8, 8), 10).name
  f32, bf16 = conv_form(platform, jnp.float32), conv_form(platform, jnp.bfloat16)
  assert "auto" in name and f32 in name and platform in name
  assert (bf16 in name) and (("in bf16" in name) == (f32 != bf16))
  assert models.cnn((8, 8), 10, conv="lax").name.endswith(", lax)")


@pytest.mark.parametrize("bad", ["fft", "LAX", "", None, 3])
def test_bad_conv_value_names_conv(bad):
  with pytest.raises(ValueError, match="conv must be one of"):
    models.cnn((8, 8), 10, conv=bad)


def test_cpu_rows_of_the_table_are_the_recorded_benchmark():
  """The CPU rows of the measurements are benchmarks/results/speed_conv.json's rates."""
  import json
  import pathlib

  path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks/results/speed_conv.json"
  recorded = json.loads(path.read_text())
  assert recorded["meta"]["platform"] == "cpu"
  for dtype, by_n in recorded["table"].items():
    assert CONV_MEASUREMENTS[("cpu", dtype)] == {int(n): rates for n, rates in by_n.items()}
