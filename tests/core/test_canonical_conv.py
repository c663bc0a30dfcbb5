"""Convolutions in canonical layout (``fedjax_dro.common.conv``): the same values and gradients as
XLA's own form (float64, several layouts, strides, paddings, dilations, 1-D and 2-D), only
canonical convolutions left in a loop's compiled body, functions without convolutions untouched,
and the simulator's rounds equal with the tuning on and off."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import fedjax_dro as fd
from fedjax_dro import algorithms as A, data, models
from fedjax_dro.common.conv import canonical_convs
from fedjax_dro.common.tuning import platform_defaults
from fedjax_dro.models.resnet import resnet18

CASES = [
  # (lhs shape, rhs shape, dimension numbers, strides, padding, lhs dilation, rhs dilation)
  ((2, 9, 9, 3), (3, 3, 3, 5), ("NHWC", "HWIO", "NHWC"), (1, 1), "SAME", (1, 1), (1, 1)),
  ((2, 3, 9, 9), (5, 3, 3, 3), ("NCHW", "OIHW", "NCHW"), (2, 2), "VALID", (1, 1), (1, 1)),
  ((2, 9, 9, 3), (3, 3, 3, 5), ("NHWC", "HWIO", "NHWC"), (2, 1), ((1, 2), (0, 1)), (1, 1), (2, 2)),
  ((2, 9, 9, 3), (2, 2, 3, 4), ("NHWC", "HWIO", "NHWC"), (1, 1), ((1, 1), (0, 1)), (2, 2), (1, 1)),
  ((3, 11, 4), (3, 4, 6), ("NWC", "WIO", "NWC"), (1,), "SAME", (1,), (1,)),
]


def _conv(case):
  _, _, dn, strides, padding, lhs_dil, rhs_dil = case

  def f(x, w):
    out = lax.conv_general_dilated(x, w, strides, padding, lhs_dil, rhs_dil, dimension_numbers=dn)
    return jnp.sum(jnp.sin(out) * out)

  return f


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_values_and_gradients_equal_xlas_form(case):
  rng = np.random.default_rng(0)
  x, w = rng.normal(size=case[0]), rng.normal(size=case[1])
  f = _conv(case)
  g = canonical_convs(f)
  np.testing.assert_allclose(g(x, w), f(x, w), rtol=1e-12)
  for a, b in zip(jax.grad(g, (0, 1))(x, w), jax.grad(f, (0, 1))(x, w)):
    assert a.shape == b.shape
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-10)


def _conv_labels(fn, *args):
  text = jax.jit(fn).lower(*args).compile().as_text()
  return re.findall(r"convolution\(.*?dim_labels=([^,\s]+)", text)


def test_inside_a_loop_every_convolution_of_the_gradient_is_canonical():
  """XLA's own form leaves the gradient's convolutions non-canonical in a loop body (the slow
  path on XLA:CPU); the rewrite leaves only canonical ones."""
  case = CASES[0]
  f = _conv(case)
  x = jnp.ones((4,) + case[0])
  w = jnp.ones(case[1])

  def looped(g):
    return lambda x, w: lax.map(lambda xi: jax.grad(g, 1)(xi, w), x)

  plain = _conv_labels(looped(f), x, w)
  assert any(label != "b01f_01io->b01f" for label in plain), plain  # the check can fail
  rewritten = _conv_labels(looped(canonical_convs(f)), x, w)
  assert rewritten and all(label == "b01f_01io->b01f" for label in rewritten), rewritten


def test_functions_without_convolutions_and_grouped_convolutions_keep_their_form():
  def dense(p, x):
    return jnp.tanh(x @ p)

  x, p = jnp.ones((3, 4)), jnp.ones((4, 2))
  assert str(jax.make_jaxpr(canonical_convs(dense))(p, x)) == str(jax.make_jaxpr(dense)(p, x))

  def depthwise(x, w):
    return lax.conv_general_dilated(
      x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=3
    )

  x, w = jnp.ones((1, 5, 5, 3)), jnp.ones((3, 3, 1, 3))
  jaxpr = str(jax.make_jaxpr(canonical_convs(depthwise))(x, w))
  assert "optimization_barrier" not in jaxpr and "custom_vjp" not in jaxpr


def test_the_tuning_is_on_by_default_on_the_cpu_only():
  assert platform_defaults("cpu").canonical_conv is True
  assert platform_defaults("gpu").canonical_conv is False
  with pytest.raises(ValueError, match="canonical_conv"):
    fd.Tuning(canonical_conv="yes")


def test_resnet_rounds_equal_with_the_tuning_on_and_off():
  """The zoo's ResNet-18 with GroupNorm through fd.run (float64): the same final model whether
  the convolutions are rewritten or not."""
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(4 + i, 8, 8, 3)) for i in range(3)]
  ys = [rng.integers(0, 3, size=len(x)) for x in xs]
  train = data.from_client_arrays(xs, ys, dtype=np.float64)
  ds = data.FederatedDataset(train=train, test=train, name="cifar-shaped")
  net = resnet18(3, norm="group", groups=2, stem="cifar", num_filters=4)
  model = models.from_flax(net, xs[0][:2])
  init = model.init
  model = model._replace(init=lambda k: jax.tree.map(lambda a: a.astype(jnp.float64), init(k)))
  alg = A.fedavg(model, local_steps=2, batch_size=2, backend="map")
  finals = []
  for on in (True, False):
    hist = fd.run(alg, ds, rounds=1, tuning=fd.Tuning(canonical_conv=on))
    finals.append(hist.final_state.params)
  for a, b in zip(jax.tree.leaves(finals[0]), jax.tree.leaves(finals[1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-10)
