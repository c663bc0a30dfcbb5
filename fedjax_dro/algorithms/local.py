"""Local training: every client trains its own model and never communicates.

The personalized lower baseline of the Karula paper (Erickson and Johansson, "Personalized
Federated Learning under Model Dissimilarity Constraints", arXiv:2505.07575): "Local".
Each round ``clients_per_round``
clients (all by default) run ``local_steps`` SGD steps on their own model.
Persistent per-client state: ``client_params`` ``[n, ...]``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.aggregation import tree_stack
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import local_round, round_metrics
from fedjax_dro.core.release import Refused
from fedjax_dro.core.settings import CommonSettings, round_zero, state_init


class LocalState(NamedTuple):
  client_params: Any  # [n, ...] one model per client
  round: jnp.ndarray  # [] int32


HPARAMS = {"client_lr": HParam(0.1, "local SGD step size")}

NO_SERVER = Refused("it has no server: nothing leaves a client, so there is nothing to privatize")


@register("local", family="personalized")
@with_settings(defaults={"local_steps": 1, "model_state": "local"})
def local(model, settings: CommonSettings) -> Algorithm:
  """Local training: one model per client, no communication.

  Local training, the personalized lower baseline.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` each client trains a copy of.
    clients_per_round: clients that train in a round (drawn without replacement); ``None``
      (default): all.
    local_steps: SGD steps per training client and round (default 1).
    batch_size: examples per SGD step; ``None`` (default): the client's full data.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Every client starts from the initial model
    and trains its own copy; its evaluated model is that copy. The one hyper-parameter is
    ``client_lr``, the local SGD step size (default 0.1). Its cost is the training clients'
    local steps; nothing is uploaded.
  """
  init = state_init(settings, lambda params, n: LocalState(tree_stack(params, n), round_zero()))

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

  return build_algorithm(
    "local",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=local_training_costs(model, settings, models=0),  # nothing is uploaded
    model_states=("local", "frozen"),  # each client's statistics are its own
    client_models=lambda s: s.client_params,
    personalized=True,
    releases=NO_SERVER,
  )
