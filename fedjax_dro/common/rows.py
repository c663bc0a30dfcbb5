"""Streamed clients' rows, read when a minibatch asks for them (the handle the local loops meet).

A streamed federation (:mod:`fedjax_dro.data.streamed`) hands a round's participants to the
local loops as :class:`ClientRows` handles instead of padded arrays. The few places where a
round takes rows of a client go through :func:`take` (a minibatch's rows) and :func:`whole` (all
of a client's rows, padded): plain arrays are indexed as always, handles read their rows from
the host. The store behind a handle is duck-typed (``gather(client, rows) -> (x, y)``,
``max_examples``, ``x_shape``, ``x_dtype``, ``y_shape``, ``y_dtype``, ``counts``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.tree_util.register_pytree_node_class
class ClientRows:
  """The rows of clients ``client`` (``[...]`` int32 indices), read when indexed.

  ``handle[rows]`` is ``(x, y)``, the inputs and labels of rows ``rows`` (``[..., k]`` row
  positions within each client) through one host call; ``shape`` is that of the client's padded
  rows (``[..., max_examples, *x_shape]``) as the loops that size their work read it. Anything
  else (converting it to an array) is refused: the data is streamed.
  """

  def __init__(self, client, store):
    self.client, self.store = client, store

  def tree_flatten(self):
    return (self.client,), self.store

  @classmethod
  def tree_unflatten(cls, store, children):
    return cls(children[0], store)

  @property
  def shape(self) -> tuple:
    return tuple(jnp.shape(self.client)) + (self.store.max_examples,) + self.store.x_shape

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def read(self, rows):
    """``(x, y)`` of ``rows`` (int array ``[..., k]``) of the handle's clients."""
    rows = jnp.asarray(rows, jnp.int32)
    store = self.store
    lead = jnp.broadcast_shapes(jnp.shape(self.client), rows.shape[: jnp.ndim(self.client)])
    shape = lead + rows.shape[jnp.ndim(self.client) :]
    out = (
      jax.ShapeDtypeStruct(shape + store.x_shape, store.x_dtype),
      jax.ShapeDtypeStruct(shape + store.y_shape, store.y_dtype),
    )
    return jax.pure_callback(store.gather, out, self.client, rows, vmap_method="broadcast_all")

  def whole(self):
    """``(x, y, mask)``: every row of the handle's clients, padded to ``max_examples``."""
    m = self.store.max_examples
    rows = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), jnp.shape(self.client) + (m,))
    x, y = self.read(rows)
    count = jnp.asarray(self.store.counts)[self.client]
    return x, y, jnp.arange(m) < count[..., None]

  def __jax_array__(self):
    raise ValueError(
      "this computation reads a streamed client's rows as one array; streamed data "
      "(load_prepared) reaches the rows through the local steps' minibatches only"
    )


def is_rows(x) -> bool:
  """Whether ``x`` is a streamed client's :class:`ClientRows` handle."""
  return isinstance(x, ClientRows)


def take(x, y, rows):
  """``(x[rows], y[rows])``: rows ``rows`` of one client's arrays, or of a handle's client."""
  if isinstance(x, ClientRows):
    return x.read(rows)
  return x[rows], y[rows]


def whole(x, y, num_examples):
  """``(x, y, mask)``: all of one client's rows (padded) and the mask of its valid ones."""
  if isinstance(x, ClientRows):
    return x.whole()
  return x, y, jnp.arange(x.shape[0]) < num_examples
