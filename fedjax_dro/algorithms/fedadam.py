"""FedAdam: adaptive server optimizer on the FedAvg pseudo-gradient.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021. The server treats ``-mean(delta)`` as a gradient and applies
``optax.scale_by_adam`` (beta1, beta2, eps = the paper's tau); the step size ``server_lr`` and the
Adam constants are hyper-parameters (vmappable).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax

from fedjax_dro.algorithms.base import Algorithm, HParam, common_settings, participants, register
from fedjax_dro.core.aggregation import tree_add, tree_scale
from fedjax_dro.core.local import local_round, round_metrics


class FedAdamState(NamedTuple):
  params: Any  # global model
  opt_state: Any  # optax.ScaleByAdamState (mu, nu params-shaped, count [])
  round: jnp.ndarray  # [] int32


HPARAMS = {
  "client_lr": HParam(0.1, "local SGD step size"),
  "server_lr": HParam(0.01, "server Adam step size"),
  "beta1": HParam(0.9, "Adam first-moment decay", strict=False, maximum=1.0),
  "beta2": HParam(0.99, "Adam second-moment decay", strict=False, maximum=1.0),
  "eps": HParam(1e-3, "adaptivity tau (Adam epsilon)"),
}


@register("fedadam", "FedAdam (Reddi 2021): Adam server optimizer on the averaged update")
def fedadam(
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

  def init(params, data, key):
    del key
    participants(settings, data.num_clients)
    return FedAdamState(params, optax.scale_by_adam().init(params), jnp.zeros((), jnp.int32))

  def round_fn(state, data, key, hparams):
    update = local_round(
      model, settings, state.params, data, key, hparams["client_lr"], mean_only=True
    )
    pseudo_grad = tree_scale(update.deltas, -1.0)
    adam = optax.scale_by_adam(b1=hparams["beta1"], b2=hparams["beta2"], eps=hparams["eps"])
    direction, opt_state = adam.update(pseudo_grad, state.opt_state)
    params = tree_add(state.params, direction, -hparams["server_lr"])
    return FedAdamState(params, opt_state, state.round + 1), round_metrics(update)

  return Algorithm(
    "fedadam", model, init, round_fn, lambda s: s.params, HPARAMS, False, settings._asdict()
  )
