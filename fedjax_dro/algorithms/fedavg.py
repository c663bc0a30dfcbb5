"""FedAvg: Federated Averaging.

McMahan, Moore, Ramage, Hampson, Aguera y Arcas, "Communication-Efficient Learning of Deep
Networks from Decentralized Data", AISTATS 2017, arXiv:1602.05629.

Each round s clients run ``local_steps`` SGD steps (step ``client_lr``) from the global model; the
server moves by ``server_lr`` times the average model difference, weighted by sample counts
(``weighting="num_examples"``, McMahan's choice) or uniformly.

``server_optimizer``: any optax transformation in place of the plain server step, applied to the
negative averaged difference as a pseudo-gradient, the model moving by ``server_lr`` times its
update (FedJAX's convention; :mod:`fedjax_dro.core.server`): ``optax.sgd(1.0)`` is the plain step,
``reddi_optimizer("yogi")`` FedYogi's. Its state is part of the algorithm's state.
"""

from __future__ import annotations

import functools

from fedjax_dro.algorithms.base import (
  Algorithm,
  build_algorithm,
  build_partitioned,
  register,
  with_settings,
)
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import local_round, round_metrics
from fedjax_dro.core.model_state import default_partition
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.server import FEDAVG_HPARAMS, global_model_setup, server_update
from fedjax_dro.core.settings import LOCAL_TRAINING, CommonSettings

RELEASES = Releases(
  "each participant's model delta; the server reads the noised sum of the clipped updates over "
  "the expected participants"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = dict(FEDAVG_HPARAMS)  # client_lr and server_lr


@register("fedavg")
@with_settings((*LOCAL_TRAINING, "weighting"))
def fedavg(
  model, settings: CommonSettings, *, server_optimizer=None, client_optimizer=None
) -> Algorithm:
  """FedAvg (McMahan 2017): local SGD, sample-weighted model averaging.

  Participants run local SGD from the global model; the server adds ``server_lr`` times their
  weighted mean model difference.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` whose global parameters are trained.
    clients_per_round: clients drawn uniformly without replacement each round; ``None``
      (default): every client.
    local_steps: local SGD steps ``E`` each participant takes per round (default 10).
    weighting: ``"num_examples"`` (default: weights proportional to sample counts, McMahan's
      choice) or ``"uniform"``: the weights of the participants' model differences.
    client_optimizer: an optax ``GradientTransformation`` in place of the local SGD step, at
      rate 1 and scaled by ``client_lr``, its state fresh every round
      (:mod:`fedjax_dro.core.client_opt`); None (default): plain SGD.
    server_optimizer: an optax ``GradientTransformation`` for the server step (see the module
      docstring); None (default): the plain step.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. The state is the global model and a round
    counter (:class:`~fedjax_dro.core.server.FedAvgState`; with a ``server_optimizer``,
    :class:`~fedjax_dro.core.server.ServerOptState`). Hyper-parameters (round arguments):
    ``client_lr`` (local SGD step size, default 0.1) and ``server_lr`` (server step on the
    averaged model difference, default 1.0; 1 is plain averaging).
  """

  if model.state_keys and settings.model_state == "local":
    # the statistics kept by each client (SiloBN's), the rest averaged: FedAvg over a partition
    if server_optimizer is not None or client_optimizer is not None:
      raise ValueError(
        'fedavg with model_state="local" takes no server_optimizer or client_optimizer'
      )
    return build_partitioned(
      "fedavg",
      model,
      settings,
      lambda params: default_partition("state", model, params, None),
      model_states=("local",),
    )
  server_optimizer, client_optimizer, init, extra = global_model_setup(
    "fedavg", settings, server_optimizer, client_optimizer
  )
  # the participants' local steps; the server reads only their weighted mean difference
  train = functools.partial(
    local_round, model, settings, mean_only=True, client_optimizer=client_optimizer
  )

  def round_fn(state, data, key, hparams, release=PLAIN):
    update = train(state.params, data, key, hparams["client_lr"], release=release)
    lr = hparams["server_lr"]
    new = server_update(server_optimizer, state, state.params, update.deltas, lr, model)
    return new, round_metrics(update)

  cost = local_training_costs(model, settings)
  return build_algorithm(
    "fedavg",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    model_states=("average", "local", "frozen"),
    **extra,
  )
