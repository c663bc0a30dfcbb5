"""FedProx: FedAvg with a proximal term ``mu/2 ||w - w_global||^2`` in every local objective.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous Networks",
MLSys 2020, arXiv:1812.06127. Local problems are solved inexactly by ``local_steps`` SGD steps.
"""

from __future__ import annotations

import functools

import jax

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import local_round, round_metrics
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.server import FEDAVG_HPARAMS, global_model_setup, server_update
from fedjax_dro.core.settings import LOCAL_TRAINING, CommonSettings

RELEASES = Releases(
  "each participant's model delta (proximal local steps); the server reads "
  "the noised sum of the clipped updates over the expected participants"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {
  **FEDAVG_HPARAMS,  # client_lr and server_lr
  "mu": HParam(0.01, "proximal coefficient", strict=False),
}


@register("fedprox")
@with_settings((*LOCAL_TRAINING, "weighting"))
def fedprox(
  model, settings: CommonSettings, *, server_optimizer=None, client_optimizer=None
) -> Algorithm:
  """FedProx (Li 2020): FedAvg with a proximal term mu/2 ||w - w_global||^2.

  FedProx (Li et al. 2020): local problems solved inexactly by SGD.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of the global model.
    clients_per_round: participants per round, drawn uniformly without replacement; ``None``
      (default): all clients.
    local_steps: SGD steps on each participant's proximal objective per round (default 10): the
      inexact local solver.
    weighting: ``"num_examples"`` (default, sample-count weights) or ``"uniform"``: how the
      server averages the model differences.
    client_optimizer: an optax ``GradientTransformation`` in place of the local SGD step, at
      rate 1 and scaled by ``client_lr``, its state fresh every round
      (:mod:`fedjax_dro.core.client_opt`); None (default): plain SGD.
    server_optimizer: an optax ``GradientTransformation`` for the server step (as
      :func:`~fedjax_dro.algorithms.fedavg.fedavg`'s); None (default): the plain step.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. The state is the global model and a round
    counter. Hyper-parameters: ``client_lr`` (local step size, default 0.1), ``server_lr`` (server
    step, default 1.0) and ``mu`` (proximal coefficient ``mu >= 0``, default 0.01; 0 is FedAvg).
  """

  server_optimizer, client_optimizer, init, extra = global_model_setup(
    "fedprox", settings, server_optimizer, client_optimizer
  )
  train = functools.partial(
    local_round, model, settings, mean_only=True, client_optimizer=client_optimizer
  )

  def round_fn(state, data, key, hparams, release=PLAIN):
    center = state.params
    prox = lambda w, g, _: jax.tree.map(
      lambda gi, wi, ci: gi + hparams["mu"] * (wi - ci), g, w, center
    )
    update = train(center, data, key, hparams["client_lr"], grad_transform=prox, release=release)
    lr = hparams["server_lr"]
    new = server_update(server_optimizer, state, center, update.deltas, lr, model)
    return new, round_metrics(update)

  cost = local_training_costs(model, settings)
  return build_algorithm(
    "fedprox",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    model_states=("average", "frozen"),
    **extra,
  )
