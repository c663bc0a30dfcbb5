"""FedAvg: Federated Averaging.

McMahan, Moore, Ramage, Hampson, Aguera y Arcas, "Communication-Efficient Learning of Deep
Networks from Decentralized Data", AISTATS 2017.

Each round s clients run ``local_steps`` SGD steps (step ``client_lr``) from the global model; the
server moves by ``server_lr`` times the average model difference, weighted by sample counts
(``weighting="num_examples"``, McMahan's choice) or uniformly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, common_settings, participants, register
from fedjax_dro.core.aggregation import tree_add
from fedjax_dro.core.local import local_round, round_metrics


class FedAvgState(NamedTuple):
  params: Any  # global model pytree
  round: jnp.ndarray  # [] int32 rounds done


def global_model_init(settings):
  """``init`` of the algorithms whose whole state is the global model and a round counter."""

  def init(params, data, key):
    del key
    participants(settings, data.num_clients)  # validates clients_per_round against n
    return FedAvgState(params, jnp.zeros((), jnp.int32))

  return init


HPARAMS = {
  "client_lr": HParam(0.1, "local SGD step size"),
  "server_lr": HParam(1.0, "server step on the averaged model difference"),
}


@register("fedavg", "FedAvg (McMahan 2017): local SGD, sample-weighted model averaging")
def fedavg(
  model,
  *,
  clients_per_round=None,
  local_steps=10,
  batch_size=None,
  backend="auto",
  chunk_size=None,
  weighting="num_examples",
) -> Algorithm:
  settings = common_settings(
    clients_per_round=clients_per_round,
    local_steps=local_steps,
    batch_size=batch_size,
    backend=backend,
    chunk_size=chunk_size,
    weighting=weighting,
  )

  def round_fn(state, data, key, hparams):
    update = local_round(
      model, settings, state.params, data, key, hparams["client_lr"], mean_only=True
    )
    params = tree_add(state.params, update.deltas, hparams["server_lr"])
    return FedAvgState(params, state.round + 1), round_metrics(update)

  return Algorithm(
    "fedavg",
    model,
    global_model_init(settings),
    round_fn,
    lambda s: s.params,
    HPARAMS,
    False,
    settings._asdict(),
  )
