"""FedSGD: one (minibatch or full) gradient per participant per round, averaged by the server.

McMahan et al., AISTATS 2017 (the FedSGD baseline). With full participation, full batches and
sample-count weights one round is exactly one step of centralized gradient descent on the pooled
data (tested).

The participants share the model, so their weighted mean gradient is computed as the gradient of
their weighted loss with the client axis folded into the batch
(:func:`fedjax_dro.core.local.federated_gradient`): one matmul / convolution per layer over all
participants' minibatch rows instead of one per client. Equal to one local SGD step of size 1 per
client, averaged (tested).
"""

from __future__ import annotations

from fedjax_dro.algorithms.base import Algorithm, HParam, common_settings, register
from fedjax_dro.algorithms.fedavg import FedAvgState, global_model_init
from fedjax_dro.core.aggregation import tree_add
from fedjax_dro.core.local import federated_gradient, round_metrics

HPARAMS = {"lr": HParam(0.1, "server gradient step size")}


@register("fedsgd", "FedSGD: one gradient per participant per round, server gradient step")
def fedsgd(
  model,
  *,
  clients_per_round=None,
  batch_size=None,
  backend="auto",
  chunk_size=None,
  weighting="num_examples",
) -> Algorithm:
  settings = common_settings(
    clients_per_round=clients_per_round,
    local_steps=1,
    batch_size=batch_size,
    backend=backend,
    chunk_size=chunk_size,
    weighting=weighting,
  )

  def round_fn(state, data, key, hparams):
    # delta = -(weighted mean of the participants' gradients); the server applies lr * delta.
    update = federated_gradient(model, settings, state.params, data, key)
    params = tree_add(state.params, update.deltas, hparams["lr"])
    return FedAvgState(params, state.round + 1), round_metrics(update)

  return Algorithm(
    "fedsgd",
    model,
    global_model_init(settings),
    round_fn,
    lambda s: s.params,
    HPARAMS,
    False,
    settings._asdict(),
  )
