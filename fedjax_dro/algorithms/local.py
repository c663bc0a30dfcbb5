"""Local training: every client trains its own model and never communicates.

The personalized lower baseline of the Karula paper ("Local"). Each round ``clients_per_round``
clients (all by default) run ``local_steps`` SGD steps on their own model.
Persistent per-client state: ``client_params`` ``[n, ...]``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, common_settings, participants, register
from fedjax_dro.core.aggregation import tree_stack
from fedjax_dro.core.local import local_round, round_metrics


class LocalState(NamedTuple):
  client_params: Any  # [n, ...] one model per client
  round: jnp.ndarray  # [] int32


HPARAMS = {"client_lr": HParam(0.1, "local SGD step size")}


@register("local", "Local training: one model per client, no communication", family="personalized")
def local(
  model, *, clients_per_round=None, local_steps=1, batch_size=None, backend="auto", chunk_size=None
) -> Algorithm:
  settings = common_settings(
    clients_per_round=clients_per_round,
    local_steps=local_steps,
    batch_size=batch_size,
    backend=backend,
    chunk_size=chunk_size,
  )

  def init(params, data, key):
    del key
    participants(settings, data.num_clients)
    return LocalState(tree_stack(params, data.num_clients), jnp.zeros((), jnp.int32))

  def round_fn(state, data, key, hparams):
    update = local_round(
      model,
      settings,
      None,
      data,
      key,
      hparams["client_lr"],
      client_params=state.client_params,
      # w_i + delta_i written back inside each participant's update: no stacked deltas
      client_state=state.client_params,
      state_update=lambda w, d: jax.tree.map(jnp.add, w, d),
      mean_only=True,
    )
    return LocalState(update.client_state, state.round + 1), round_metrics(update)

  return Algorithm(
    "local", model, init, round_fn, lambda s: s.client_params, HPARAMS, True, settings._asdict()
  )
