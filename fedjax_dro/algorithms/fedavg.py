"""FedAvg: Federated Averaging.

McMahan, Moore, Ramage, Hampson, Aguera y Arcas, "Communication-Efficient Learning of Deep
Networks from Decentralized Data", AISTATS 2017, arXiv:1602.05629.

Each round s clients run ``local_steps`` SGD steps (step ``client_lr``) from the global model; the
server moves by ``server_lr`` times the average model difference, weighted by sample counts
(``weighting="num_examples"``, McMahan's choice) or uniformly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.aggregation import tree_add
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import local_round, round_metrics
from fedjax_dro.core.settings import LOCAL_TRAINING, CommonSettings, round_zero, state_init


class FedAvgState(NamedTuple):
  params: Any  # global model pytree
  round: jnp.ndarray  # [] int32 rounds done


def global_model_init(settings):
  """``init`` of the algorithms whose whole state is the global model and a round counter."""
  return state_init(settings, lambda params, num_clients: FedAvgState(params, round_zero()))


HPARAMS = {
  "client_lr": HParam(0.1, "local SGD step size"),
  "server_lr": HParam(1.0, "server step on the averaged model difference"),
}


@register("fedavg")
@with_settings((*LOCAL_TRAINING, "weighting"))
def fedavg(model, settings: CommonSettings) -> Algorithm:
  """FedAvg (McMahan 2017): local SGD, sample-weighted model averaging.

  Participants run local SGD from the global model; the server adds ``server_lr`` times their
  weighted mean model difference.

  Args:
    model: the :class:`~fedjax_dro.models.base.Model` whose global parameters are trained.
    clients_per_round: clients drawn uniformly without replacement each round; ``None``
      (default): every client.
    local_steps: local SGD steps ``E`` each participant takes per round (default 10).
    weighting: ``"num_examples"`` (default: weights proportional to sample counts, McMahan's
      choice) or ``"uniform"``: the weights of the participants' model differences.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. The state is the global model and a round
    counter. Hyper-parameters (round arguments): ``client_lr`` (local SGD step size, default 0.1)
    and ``server_lr`` (server step on the averaged model difference, default 1.0; 1 is plain
    averaging).
  """

  def round_fn(state, data, key, hparams):
    update = local_round(
      model, settings, state.params, data, key, hparams["client_lr"], mean_only=True
    )
    params = tree_add(state.params, update.deltas, hparams["server_lr"])
    return FedAvgState(params, state.round + 1), round_metrics(update)

  init = global_model_init(settings)
  cost = local_training_costs(model, settings)
  return build_algorithm("fedavg", model, settings, init, round_fn, HPARAMS, cost=cost)
