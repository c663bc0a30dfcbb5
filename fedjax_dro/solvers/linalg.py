"""Dense factorizations that stay unbatched under ``vmap``.

On CPU, jaxlib runs a *batched* LAPACK call (Cholesky, QR, triangular solve, ...) by
splitting the batch over XLA's intra-op thread pool and blocking until the pieces are done. When
every thread of that pool is itself inside such a blocking call (XLA runs independent operations
of a program concurrently, and continues a program on the pool's threads), nothing is left to run
the pieces and the program never finishes: no thread computes and the caller waits forever. On a
2-core machine two concurrent batched calls suffice. It occurred with ``fedjax_dro.sweep`` over
Karula with a CNN (three values of ``t``, 50 or 100 clients): the projection's Cholesky and QR
were batched over the sweep rows.

The functions here compute the same factorizations, and under ``vmap`` map over the batch one
matrix at a time (``jax.custom_batching.sequential_vmap``), so LAPACK is only ever called on a
single matrix, which jaxlib runs inline. The batches they see are the rows of a sweep (a few to
a few dozen), so running them in sequence costs nothing measurable beside the rest of a round.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.custom_batching import sequential_vmap
from jax.scipy.linalg import cho_solve as _cho_solve


@sequential_vmap
def cholesky(a):
  """Lower Cholesky factor of the symmetric positive definite ``a`` (``jnp.linalg.cholesky``)."""
  return jnp.linalg.cholesky(a)


@sequential_vmap
def cho_solve_lower(chol, b):
  """``A^{-1} b`` from the lower Cholesky factor ``chol`` of ``A`` (``cho_solve((chol, True),
  b)``)."""
  return _cho_solve((chol, True), b)


@sequential_vmap
def qr(a):
  """Thin QR factorization ``(Q, R)`` of ``a`` (``jnp.linalg.qr(a)``)."""
  return jnp.linalg.qr(a)


@sequential_vmap
def qr_r(a):
  """The ``R`` factor of the thin QR factorization of ``a`` (``jnp.linalg.qr(a, mode="r")``)."""
  return jnp.linalg.qr(a, mode="r")
