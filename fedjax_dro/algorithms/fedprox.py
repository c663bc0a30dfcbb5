"""FedProx: FedAvg with a proximal term ``mu/2 ||w - w_global||^2`` in every local objective.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous Networks",
MLSys 2020. Local problems are solved inexactly by ``local_steps`` SGD steps.
"""

from __future__ import annotations

import jax

from fedjax_dro.algorithms.base import Algorithm, HParam, common_settings, register
from fedjax_dro.algorithms.fedavg import FedAvgState, global_model_init
from fedjax_dro.core.aggregation import tree_add
from fedjax_dro.core.local import local_round, round_metrics

HPARAMS = {
  "client_lr": HParam(0.1, "local SGD step size"),
  "server_lr": HParam(1.0, "server step on the averaged model difference"),
  "mu": HParam(0.01, "proximal coefficient", strict=False),
}


@register("fedprox", "FedProx (Li 2020): FedAvg with a proximal term mu/2 ||w - w_global||^2")
def fedprox(
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
    center = state.params
    prox = lambda w, g, _: jax.tree.map(
      lambda gi, wi, ci: gi + hparams["mu"] * (wi - ci), g, w, center
    )
    update = local_round(
      model, settings, center, data, key, hparams["client_lr"], grad_transform=prox, mean_only=True
    )
    params = tree_add(center, update.deltas, hparams["server_lr"])
    return FedAvgState(params, state.round + 1), round_metrics(update)

  return Algorithm(
    "fedprox",
    model,
    global_model_init(settings),
    round_fn,
    lambda s: s.params,
    HPARAMS,
    False,
    settings._asdict(),
  )
