"""FedSGD: one (minibatch or full) gradient per participant per round, averaged by the server.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017, arXiv:1602.05629 (the FedSGD baseline). With full participation, full batches and
sample-count weights one round is exactly one step of centralized gradient descent on the pooled
data (tested).

The participants share the model, so their weighted mean gradient is computed as the gradient of
their weighted loss with the client axis folded into the batch
(:func:`fedjax_dro.core.local.federated_gradient`): one matmul / convolution per layer over all
participants' minibatch rows instead of one per client. Equal to one local SGD step of size 1 per
client, averaged (tested).
"""

from __future__ import annotations

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.aggregation import tree_add
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import federated_gradient, round_metrics
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.server import FedAvgState, global_model_init
from fedjax_dro.core.settings import CommonSettings

RELEASES = Releases(
  "each participant's minibatch gradient at the global model (clipped on its own: the "
  "private round takes the per-client path, not FedSGD's folded backward pass); the server "
  "reads the noised sum of the clipped updates over the expected participants"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {"lr": HParam(0.1, "server gradient step size")}


@register("fedsgd")
@with_settings(
  ("clients_per_round", "batch_size", "backend", "chunk_size", "weighting"),
  fixed={"local_steps": 1},
)
def fedsgd(model, settings: CommonSettings) -> Algorithm:
  """FedSGD: one gradient per participant per round, server gradient step.

  FedSGD: every round one gradient step of the global model.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` trained.
    clients_per_round: clients whose gradients are averaged each round (drawn without
      replacement); ``None`` (default): all of them.
    batch_size: examples in each participant's gradient; ``None`` (default): its full data.
    weighting: ``"num_examples"`` (default: the gradients weighted by sample counts) or
      ``"uniform"``.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. The state is the global model and a round
    counter. Its one hyper-parameter is ``lr``, the server's gradient step size (default 0.1).
  """

  def round_fn(state, data, key, hparams, release=PLAIN):
    # delta = -(weighted mean of the participants' gradients); the server applies lr * delta.
    update = federated_gradient(model, settings, state.params, data, key, release)
    params = tree_add(state.params, update.deltas, hparams["lr"])
    return FedAvgState(params, state.round + 1), round_metrics(update)

  init = global_model_init(settings)
  cost = local_training_costs(model, settings)  # one gradient each: local_steps=1
  return build_algorithm(
    "fedsgd", model, settings, init, round_fn, HPARAMS, cost=cost, releases=RELEASES
  )
