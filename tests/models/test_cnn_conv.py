"""The CNN's two convolution forms ("lax" and "patches") are the same function of the same
parameters: outputs and gradients agree, per client under vmap too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import models


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
