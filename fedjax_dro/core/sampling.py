"""Fixed-size client sampling (static shapes, so a round compiles once)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.common.checks import ArgumentError, is_int


def sample_clients(
  key, num_clients: int, clients_per_round: int, weights=None, *, replace: bool = False
):
  """Indices ``[clients_per_round]`` of the clients taking part in a round.

  Args:
    key: PRNG key.
    num_clients: n.
    clients_per_round: s (static).
    weights: optional ``[n]`` non-negative sampling weights. ``None`` is uniform sampling without
      replacement. With weights and ``replace=False`` clients are drawn sequentially proportional
      to their weights without replacement (Gumbel top-k); with ``replace=True`` i.i.d. draws.
  """
  if clients_per_round == num_clients and weights is None and not replace:
    return jnp.arange(num_clients)  # full participation: no randomness, fixed order
  if weights is None:
    return jax.random.choice(key, num_clients, (clients_per_round,), replace=replace)
  p = jnp.asarray(weights) / jnp.sum(weights)
  return jax.random.choice(key, num_clients, (clients_per_round,), replace=replace, p=p)


def validate_clients_per_round(
  clients_per_round, num_clients: int, name: str = "clients_per_round"
) -> int:
  if clients_per_round is None:
    return num_clients
  if not is_int(clients_per_round):
    raise TypeError(f"{name} must be an int, got {type(clients_per_round).__name__}")
  if clients_per_round < 1 or clients_per_round > num_clients:
    raise ArgumentError(
      name, f" must be in [1, num_clients={num_clients}], got {clients_per_round}"
    )
  return int(clients_per_round)


# ----------------------------------------------------------------------------------------------
# The minibatch rows of one client's local steps (the key schedule every local update shares)
# ----------------------------------------------------------------------------------------------
def step_rows(key, num_examples, batch_size: int, num_steps: int):
  """``[num_steps, batch_size]`` int32 rows of one client's ``local_steps`` minibatches.

  Drawn uniformly with replacement from the client's valid rows ``[0, num_examples)`` (the data
  layout puts them first): step ``t``'s rows are ``randint(split(key, num_steps)[t],
  (batch_size,), 0, max(num_examples, 1))``. Every local update of the package (and the
  reference loops of its tests) takes its minibatch rows from here.
  """
  bound = jnp.maximum(num_examples, 1)
  draw = lambda k: jax.random.randint(k, (batch_size,), 0, bound)
  return jax.vmap(draw)(jax.random.split(key, num_steps))


def epoch_permutations(key, num_examples, max_examples: int, num_epochs: int):
  """``[num_epochs, max_examples]`` int32: row ``e`` lists the client's valid rows
  ``[0, num_examples)`` in a fresh uniformly random order (epoch ``e``'s pass), then its padding
  rows in order.

  One ``jax.random.bits`` draw of ``[num_epochs, max_examples]`` from ``key``, sorted (stable)
  with the padding rows' keys set to the largest value, so valid rows always come first.
  """
  bits = jax.random.bits(key, (num_epochs, max_examples), jnp.uint32)
  valid = jnp.arange(max_examples) < num_examples
  keys = jnp.where(valid, bits, jnp.array(np.iinfo(np.uint32).max, jnp.uint32))
  return jnp.argsort(keys, axis=-1, stable=True).astype(jnp.int32)


def epoch_steps(num_examples, batch_size: int, num_epochs: int):
  """The number of local steps one client with ``num_examples`` rows takes in ``num_epochs``
  passes of ``batch_size``: ``num_epochs * ceil(num_examples / batch_size)`` (int32)."""
  nex = jnp.asarray(num_examples, jnp.int32)
  return jnp.int32(num_epochs) * (-(-nex // batch_size))


def epoch_step_rows(perm, step, num_examples, batch_size: int):
  """``(rows, row_mask)`` of a client's local step ``step`` under ``local_epochs``.

  ``perm`` is :func:`epoch_permutations`' ``[num_epochs, max_examples]`` (padded on the right to
  a multiple of ``batch_size``). With ``S = ceil(num_examples / batch_size)`` steps an epoch,
  step ``j`` is slice ``j mod S`` of epoch ``j // S``'s order: ``[batch_size]`` int32 rows and
  the mask of those that are valid (the epoch's last batch holds the ``num_examples mod
  batch_size`` remaining rows when that is not zero; no row is dropped or repeated).
  """
  per_epoch = jnp.maximum(-(-jnp.asarray(num_examples, jnp.int32) // batch_size), 1)
  epoch, slot = step // per_epoch, step % per_epoch
  start = slot * batch_size
  rows = jax.lax.dynamic_slice(perm, (epoch, start), (1, batch_size))[0]
  return rows, start + jnp.arange(batch_size) < num_examples


def pad_permutations(perm, batch_size: int):
  """``perm`` padded on the right with row 0 to a multiple of ``batch_size`` columns (the slices
  of :func:`epoch_step_rows` never read past it; the padding rows are masked)."""
  width = perm.shape[-1]
  return jnp.pad(perm, ((0, 0), (0, -(-width // batch_size) * batch_size - width)))
