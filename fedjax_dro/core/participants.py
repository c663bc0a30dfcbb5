"""One round's client plan: which clients take part (sampling), in which order they run (sorting
by their local step counts) and how many at a time (the backend and its chunks).

:func:`client_plan` draws the participants through the round's release mechanism
(:mod:`fedjax_dro.core.release`: a plain draw, or a private one), gathers their data and
returns a :class:`ClientPlan`; its :meth:`~ClientPlan.map` and :meth:`~ClientPlan.weighted_sum`
run a per-client function over them with the settings' backend (:mod:`fedjax_dro.core.clients`),
sorted by step counts into chunks where the round's tuning asks for it
(``Tuning.epoch_groups``), and return the outputs in the order of the draw.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_dro.core.aggregation import scatter_rows
from fedjax_dro.core.clients import (
  DEFAULT_CHUNK_SIZE,
  map_clients,
  map_clients_weighted_sum,
  plan_clients,
)


class ClientPlan(NamedTuple):
  """The participants of a round and how they run.

  Attributes:
    idx: ``[s]`` client indices (``n`` in a Poisson draw's empty slots: scatters drop it).
    rows: ``idx`` clamped into range (for gathers).
    present: ``[s]`` bool, which slots hold a participant (None: all).
    metrics: the draw's privacy metrics (none for a plain draw).
    clients: the participants' gathered data (the federation itself under full participation).
    local_key: the key the participants' local work derives from.
    full: every client takes part in client order (no gather, no scatter).
    backend: the settings' backend (``"auto"`` is planned per call).
    chunk_size: the settings' chunk size.
  """

  idx: Any
  rows: Any
  present: Any
  metrics: dict
  clients: Any
  local_key: Any
  full: bool
  backend: str
  chunk_size: Optional[int]

  @property
  def size(self) -> int:
    """``s``, the slots of the round."""
    return self.idx.shape[0]

  def keys(self):
    """``[s]`` per-participant keys (from :attr:`local_key`)."""
    return jax.random.split(self.local_key, self.size)

  def take(self, tree):
    """The participants' rows of a per-client ``[n, ...]`` pytree."""
    if self.full:
      return tree
    return jax.tree.map(lambda a: a[self.rows], tree)

  def put(self, tree, rows):
    """``tree`` with the participants' rows replaced by ``rows`` (empty slots dropped)."""
    if self.full:
      return rows
    if self.present is None:
      return scatter_rows(tree, self.idx, rows)
    return jax.tree.map(lambda a, r: a.at[self.idx].set(r, mode="drop"), tree, rows)

  def arranged(self, fn, inputs, counts=None, chunk=None, stacked=None):
    """``(inputs, backend, chunk_size, inverse)``: how the participants run.

    With step ``counts`` (sampled participants of a ``local_epochs`` round) and the ``map`` or
    ``chunked`` backend, the participants run in :func:`step_sorted_order` of their counts in the
    backend's own chunks (one, or ``chunk_size``, at a time): a vmapped sweep gains, since each
    configuration's ``i``-th participant runs beside the others' ``i``-th, and sorted, those have
    similar counts (on the FEMNIST-sized workload, 64 configurations: 169 client-steps executed
    per configuration and round instead of 252). With a ``chunk`` smaller than the participants
    and the ``auto`` backend, ``inputs`` (stacked over the participants) are put in that order
    and run in chunks of ``chunk`` (never larger than the memory plan of ``auto`` allows:
    :func:`~fedjax_dro.core.clients.plan_clients` of ``fn``, ``stacked`` its kept outputs).
    ``inverse`` puts per-participant outputs back in order (None: they are in order)."""
    backend, chunk_size = self.backend, self.chunk_size
    if counts is not None and backend in ("map", "chunked"):
      size = 1 if backend == "map" else min(chunk_size or DEFAULT_CHUNK_SIZE, self.size)
      order = step_sorted_order(counts, size)
      return jax.tree.map(lambda a: a[order], inputs), backend, chunk_size, jnp.argsort(order)
    if chunk is None or chunk >= self.size or backend != "auto":
      return inputs, backend, chunk_size, None
    clients, keys = inputs[0], inputs[1]
    args = (clients.x, clients.y, clients.num_examples, keys) + tuple(inputs[2:-1])
    planned, planned_size = plan_clients(fn, args, stacked=stacked)
    chunk = chunk if planned == "vmap" else min(chunk, planned_size or 1)
    order = step_sorted_order(counts, chunk)
    ran = jax.tree.map(lambda a: a[order], inputs)
    backend, size = ("map", None) if chunk == 1 else ("chunked", chunk)
    return ran, backend, size, jnp.argsort(order)

  def weighted_sum(self, fn: Callable, weights, *extra, folded: Optional[Callable] = None):
    """``(sum_k weights[k] * fn(...)[0], stacked fn(...)[1])`` over the participants
    (:func:`~fedjax_dro.core.clients.map_clients_weighted_sum` of ``fn(x, y, num_examples, key,
    *extra_k)``), the stacked outputs in the order of the draw."""
    clients = self.clients
    return map_clients_weighted_sum(
      fn,
      weights,
      clients.x,
      clients.y,
      clients.num_examples,
      self.keys(),
      *extra,
      backend=self.backend,
      chunk_size=self.chunk_size,
      folded=folded,
    )

  def map(self, fn: Callable, *extra, backend: Optional[str] = None):
    """``fn(x, y, num_examples, key, *extra_i)`` of every participant, stacked in the order of
    the draw (``extra``: per-participant stacked pytrees; ``backend``: instead of the
    settings')."""
    clients = self.clients
    return map_clients(
      fn,
      clients.x,
      clients.y,
      clients.num_examples,
      self.keys(),
      *extra,
      backend=backend or self.backend,
      chunk_size=self.chunk_size,
    )


def step_sorted_order(counts, chunk: int):
  """``[s]`` positions: the participants sorted by ``counts`` (their local steps) and laid out so
  that each chunk of :func:`~fedjax_dro.core.clients.map_clients` with ``chunk_size=chunk``
  holds consecutive ranks. When ``chunk`` divides ``s`` into several chunks the chunks are
  strided (chunk ``j`` holds positions ``j, j + s / chunk, ...``), else contiguous."""
  s = counts.shape[0]
  ranked = jnp.argsort(counts, stable=True)
  full, rest = divmod(s, chunk)
  if rest == 0 and full > 1:
    return ranked.reshape(full, chunk).T.reshape(-1)
  return ranked


def client_plan(
  settings, data, key, release, s: int, backend: str, sampling_weights=None
) -> ClientPlan:
  """The round's :class:`ClientPlan`: the key schedule every FedAvg-style round shares (the
  round key split into the draw's key and the participants' local key), ``s`` participants
  drawn by ``release`` (:mod:`fedjax_dro.core.release`), their data gathered. With every client
  drawn in order (``s == n``, no sampling weights, a plain or fixed-size draw) nothing is
  gathered; host-resident data is always gathered (its per-client state is on the device like
  any other)."""
  n = data.num_clients
  sample_key, local_key = jax.random.split(key)
  draw = release.draw(sample_key, n, s, sampling_weights)
  full = draw.present is None and s == n and sampling_weights is None
  if full and not getattr(data, "host_resident", False):
    clients = data
  else:
    clients = data.take_clients(draw.rows)
  return ClientPlan(
    draw.idx,
    draw.rows,
    draw.present,
    draw.metrics,
    clients,
    local_key,
    full,
    backend,
    settings.chunk_size,
  )
