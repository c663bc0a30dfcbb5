"""``solvers.linalg``: the factorizations equal jax.numpy's, and under ``vmap`` (a sweep over
Karula's hyper-parameters) every LAPACK call of the pairwise projection is on a single matrix.

A batched LAPACK call makes jaxlib split the batch over XLA's CPU thread pool and wait; with
every pool thread inside such a wait the program never finishes (seen as a hang of
``fd.sweep`` over Karula with a CNN on a 2-core CPU). The projection's compiled program is
checked here for ``num_batch_dims = "0"`` on every LAPACK custom call."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.linalg import cho_solve

from fedjax_dro.solvers import linalg, project_pairwise


def _spd(rng, b, n):
  a = rng.normal(size=(b, n, n))
  return a @ np.swapaxes(a, 1, 2) + n * np.eye(n)


def test_factorizations_equal_jax_numpy_alone_and_under_vmap():
  rng = np.random.default_rng(0)
  a = jnp.asarray(_spd(rng, 3, 5))
  rhs = jnp.asarray(rng.normal(size=(3, 5, 2)))
  tall = jnp.asarray(rng.normal(size=(3, 7, 4)))
  chol = jax.vmap(jnp.linalg.cholesky)(a)
  pairs = [
    (linalg.cholesky, jnp.linalg.cholesky, (a,)),
    (linalg.cho_solve_lower, lambda c, b: cho_solve((c, True), b), (chol, rhs)),
    (linalg.qr_r, lambda m: jnp.linalg.qr(m, mode="r"), (tall,)),
    (linalg.qr, jnp.linalg.qr, (tall,)),
  ]
  for ours, theirs, args in pairs:
    want = jax.vmap(theirs)(*args)
    got = jax.jit(jax.vmap(ours))(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=1e-12)
    one = ours(*(x[1] for x in args))
    for g, w in zip(jax.tree.leaves(one), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w)[1], rtol=0, atol=1e-12)


def _lapack_batch_dims(lowered_text):
  calls = [line for line in lowered_text.splitlines() if "custom_call @lapack_" in line]
  return [re.search(r'num_batch_dims = "(\d+)"', line).group(1) for line in calls]


@pytest.mark.parametrize("method,d", [("dual", 3), ("dual", 40), ("admm", 40)])
def test_projection_under_vmap_calls_lapack_one_matrix_at_a_time(method, d):
  rng = np.random.default_rng(1)
  n = 6
  z = jnp.asarray(rng.normal(size=(3, n, d)))  # three sweep rows
  r = jnp.asarray(np.full((3, n, n), 0.5))

  def project(z, r):
    return project_pairwise(z, r, method=method, max_iterations=50).theta

  dims = _lapack_batch_dims(jax.jit(jax.vmap(project)).lower(z, r).as_text())
  assert dims, "expected LAPACK calls (Cholesky / QR) in the projection"
  assert set(dims) == {"0"}, f"batched LAPACK calls in the vmapped projection: {dims}"
  batched = jax.vmap(project)(z, r)
  for i in range(3):  # and the result is each row's own projection
    np.testing.assert_allclose(
      np.asarray(batched[i]), np.asarray(project(z[i], r[i])), rtol=0, atol=1e-10
    )


def test_the_check_sees_batched_calls():
  """The same check on jax.numpy's Cholesky under vmap finds the batch dimension."""
  a = jnp.asarray(_spd(np.random.default_rng(2), 3, 4))
  assert _lapack_batch_dims(jax.jit(jax.vmap(jnp.linalg.cholesky)).lower(a).as_text()) == ["1"]
  assert _lapack_batch_dims(jax.jit(jax.vmap(linalg.cholesky)).lower(a).as_text()) == ["0"]
