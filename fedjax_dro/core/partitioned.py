"""FedAvg over a parameter partition: some leaves shared and averaged, the others kept by each
client (FedBN's normalization layers, FedPer's head, the batch statistics of
``model_state="local"``).

Each round the participants start from the global shared leaves and their own local leaves, run
the local steps of the settings (training mode: dropout, batch statistics) and send their model
difference; the server moves the shared leaves by ``server_lr`` times the weighted mean
difference (the shared batch statistics by the mean itself, :func:`~fedjax_dro.core.model_state.
averaged_state`'s rule), and each participant keeps its new local leaves. A client that has not
yet taken part holds the initial local leaves. Every client is evaluated with its own model.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.core.local import local_round, round_metrics
from fedjax_dro.core.model_state import join_leaves, split_leaves, state_leaves
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.server import FEDAVG_HPARAMS
from fedjax_dro.core.settings import round_zero, state_init

RELEASES = Releases(
  "each participant's model delta, its local leaves clipped with the shared ones; the server "
  "reads the noised sum of the clipped updates over the expected participants and keeps its "
  "shared leaves"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""


class PartitionedState(NamedTuple):
  """The global model (its local leaves: the initial ones, the start of a client that has not
  taken part), each client's local leaves (a tuple of ``[n, ...]`` arrays, ``jax.tree`` order)
  and the round counter."""

  params: Any
  local: Any
  round: jnp.ndarray


HPARAMS = dict(FEDAVG_HPARAMS)
"""FedAvg's hyper-parameters: ``client_lr`` and ``server_lr``."""


class Partitioned(NamedTuple):
  """The pure functions of FedAvg over a partition (an algorithm passes them to
  ``build_personalized`` with :data:`HPARAMS` and :data:`RELEASES`)."""

  init: Callable
  round: Callable
  client_models: Callable


def partitioned_fedavg(model, settings, mask_of: Callable) -> Partitioned:
  """FedAvg over the partition ``mask_of(params) -> per-leaf bools`` (True: the leaf stays on
  the clients)."""

  def build(params, n):
    _, local = split_leaves(params, mask_of(params))
    rows = tuple(jnp.broadcast_to(a, (n,) + a.shape) for a in local)
    return PartitionedState(params, rows, round_zero())

  def round_fn(state, data, key, hparams, release=PLAIN):
    params = state.params
    mask = mask_of(params)

    def start(global_params, row):
      shared, _ = split_leaves(global_params, mask)
      return join_leaves(global_params, mask, shared, row)

    def keep(row, delta):
      _, moved = split_leaves(delta, mask)
      return tuple((r + d).astype(r.dtype) for r, d in zip(row, moved))

    update = local_round(
      model,
      settings,
      params,
      data,
      key,
      hparams["client_lr"],
      client_state=state.local,
      state_update=keep,
      personal_start=start,
      mean_only=True,
      release=release,
    )
    is_state = state_leaves(model, params)
    lr = hparams["server_lr"]
    leaves = [
      a if m else (a + (d if st else lr * d)).astype(a.dtype)
      for a, d, m, st in zip(
        jax.tree.leaves(params), jax.tree.leaves(update.deltas), mask, is_state
      )
    ]
    new = jax.tree.unflatten(jax.tree.structure(params), leaves)
    return PartitionedState(new, update.client_state, state.round + 1), round_metrics(update)

  def client_models(state):
    mask = mask_of(state.params)
    shared, _ = split_leaves(state.params, mask)
    n = state.local[0].shape[0]
    stacked = [jnp.broadcast_to(a, (n,) + a.shape) for a in shared]
    return join_leaves(state.params, mask, stacked, list(state.local))

  return Partitioned(state_init(settings, build), round_fn, client_models)
