"""``core.smoothness``: power iteration against ``numpy.linalg.eigvalsh``, and the bound against
the largest Hessian eigenvalue of the models' own losses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from fedjax_dro import models
from fedjax_dro.core.smoothness import smoothness, top_eigenvalue


def _rows(m=300, d=6, seed=0):
  rng = np.random.default_rng(seed)
  scales = np.linspace(0.5, 3.0, d)  # anisotropic: a clear top eigenvalue
  return rng.normal(size=(m, d)) * scales + rng.normal(size=d)


def _augmented(x):
  return np.hstack([x, np.ones((x.shape[0], 1))])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_power_iteration_equals_eigvalsh(seed):
  x = _rows(seed=seed)
  exact = np.linalg.eigvalsh(x.T @ x / len(x))[-1]
  assert abs(top_eigenvalue(x, seed=seed) - exact) <= 1e-9 * exact


@pytest.mark.parametrize("loss, factor", [("softmax", 0.5), ("squared", 1.0)])
def test_full_batch_and_trace_values(loss, factor):
  x = _rows()
  xa = _augmented(x)
  s = smoothness(x, loss=loss)
  exact = factor * np.linalg.eigvalsh(xa.T @ xa / len(xa))[-1]
  assert abs(s.full_batch - exact) <= 1e-9 * exact
  assert s.trace_bound == pytest.approx(factor * np.mean(np.sum(xa**2, 1)), rel=1e-12)
  assert s.minibatch is None and s.full_batch < s.trace_bound
  no_intercept = smoothness(x, loss=loss, fit_intercept=False).full_batch
  assert abs(no_intercept - factor * np.linalg.eigvalsh(x.T @ x / len(x))[-1]) <= 1e-9 * exact


def test_minibatch_value_between_full_batch_and_trace():
  x = _rows(m=200)
  s = smoothness(x, batch_size=16, num_batches=64)
  assert s.full_batch < s.minibatch < s.trace_bound, s
  whole = smoothness(x, batch_size=200, num_batches=2)  # a batch of every row is the full batch
  assert whole.minibatch == pytest.approx(whole.full_batch, rel=1e-9)
  one = smoothness(x, batch_size=1, num_batches=300)  # one row: ||x||^2, the trace in the mean
  assert one.minibatch == pytest.approx(one.trace_bound, rel=0.15)


@pytest.mark.parametrize("loss", ["softmax", "squared"])
def test_bound_holds_for_the_models_hessian(loss):
  """The largest eigenvalue of the Hessian of the model's mean loss (JAX, at random parameters)
  is at most the full-batch value, and for the squared loss equal to it."""
  x = _rows(m=80, d=4)
  if loss == "softmax":
    model = models.softmax_regression(4, 3)
    y = np.random.default_rng(1).integers(0, 3, size=80)
  else:
    model = models.linear_regression(4, fit_intercept=True)
    y = np.random.default_rng(1).normal(size=80)
  params = model.init(jax.random.PRNGKey(0))
  params = jax.tree.map(
    lambda a: a + 0.3 * jax.random.normal(jax.random.PRNGKey(2), a.shape), params
  )
  flat, unravel = ravel_pytree(params)
  mean_loss = lambda v: jnp.mean(
    model.loss(model.apply(unravel(v), jnp.asarray(x)), jnp.asarray(y))
  )
  top = np.linalg.eigvalsh(np.asarray(jax.hessian(mean_loss)(flat)))[-1]
  bound = smoothness(x, loss=loss).full_batch
  assert top <= bound * (1 + 1e-9)
  if loss == "squared":
    assert top == pytest.approx(bound, rel=1e-9)


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match="loss must be one of"):
    smoothness(_rows(), loss="hinge")
  with pytest.raises(ValueError, match=r"batch_size must be an integer in \[1, 300\]"):
    smoothness(_rows(), batch_size=301)
  with pytest.raises(ValueError, match="x must be a non-empty"):
    top_eigenvalue(np.zeros((0, 3)))
  with pytest.raises(ValueError, match="x must be finite"):
    top_eigenvalue(np.full((2, 2), np.nan))
