"""FedAvg-M: local SGD with the momentum of FGDRO-KL and uniform (ERM) client weights.

The ERM control of FGDRO-KL in Guo and Yang, "Communication-Efficient Federated Group
Distributionally Robust Optimization", NeurIPS 2024, arXiv:2410.06369, Section 5, Algorithm 2:
the same local steps, the same moving average ``m`` of the gradient, averaged with the model at
every communication, but with the KL weight ``exp(u_{i,t} / lambda) / v_{i,t}`` of line 7 replaced
by 1. Round ``r`` on every participant ``i``, from ``w_{i,0} = w_bar`` and ``m_{i,0} = m_bar``,
for ``t = 1..I`` (``I = local_steps``):

    h_{i,t} = grad l(w_{i,t-1}; z_{i,t})
    m_{i,t} = (1 - beta3) m_{i,t-1} + beta3 h_{i,t}                        (averaged)
    w_{i,t} = w_{i,t-1} - eta m_{i,t}                                      (averaged)

then ``w_bar`` and ``m_bar`` are the uniform means over the participants, as in Algorithm 2.
FGDRO-KL with ``lambda -> infinity`` is this algorithm (its weights tend to 1), so the difference
"FGDRO-KL minus FedAvg-M" at the same ``eta`` and ``beta3`` isolates the reweighting from the
momentum. This is local momentum SGD with averaged momentum buffers (Yu, Jin and Yang, "On the
Linear Speedup Analysis of Communication Efficient Momentum SGD for Distributed Non-Convex
Optimization", ICML 2019, arXiv:1905.03817) written in FGDRO's moving-average form (their
``u <- beta u + g; w <- w - lr u`` is ours with ``beta = 1 - beta3`` and ``lr = eta beta3``).
``m_bar`` starts at 0, as in FGDRO-KL.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.aggregation import tree_zeros_like
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.fgdro import MOMENTUM_HPARAMS, momentum_step
from fedjax_dro.core.local import stateful_local_round, stateful_round_metrics
from fedjax_dro.core.model_state import AVERAGED
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.settings import CommonSettings, round_zero, state_init


class FedAvgMomentumState(NamedTuple):
  params: Any  # w_bar, the global model
  momentum: Any  # m_bar, params-shaped moving average of the gradient
  round: jnp.ndarray  # [] int32


RELEASES = Releases(
  "each participant's model and momentum deltas, clipped together to C (one vector); the server "
  "reads their noised sums over the expected participants"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {
  "client_lr": HParam(0.1, "local step size eta"),
  **MOMENTUM_HPARAMS,  # FGDRO-KL's beta3
}


def initial_state(params, num_clients):
  """``w_bar = params``, ``m_bar = 0``."""
  del num_clients
  return FedAvgMomentumState(params, tree_zeros_like(params), round_zero())


@register("fedavg_momentum")
@with_settings(defaults={"local_steps": 32, "batch_size": 32}, fixed={"weighting": "uniform"})
def fedavg_momentum(model, settings: CommonSettings) -> Algorithm:
  """FedAvg-M: local SGD with FGDRO-KL's averaged momentum and uniform (ERM) weights.

  Model and momentum are averaged uniformly every ``local_steps`` steps; FGDRO-KL (Guo 2024,
  Alg. 2) with every client weight set to 1.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of ``w_bar``.
    clients_per_round: participants of a round (uniform, without replacement); ``None``
      (default): all, as in FGDRO's experiments.
    local_steps: the communication interval ``I``: momentum steps per round (default 32).
    batch_size: examples per local stochastic gradient (default 32); ``None``: full batches.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (the local
    step eta, default 0.1) and ``beta3`` (the weight of the new gradient in the momentum ``m``,
    in ``(0, 1]``, default 0.1, the same as FGDRO-KL's ``beta3``; 1 is plain local SGD).
    A participant uploads ``2P`` floats (``P`` parameters): its model and momentum.
  """
  init = state_init(settings, initial_state)

  def round_fn(state, data, key, hparams, release=PLAIN):
    def start(row):
      del row
      return {"params": state.params, "m": state.momentum}

    def step(carry, loss, grad):  # FGDRO-KL's momentum step with h the plain gradient
      del loss
      w, m = momentum_step(carry, grad, hparams)
      return {"params": w, "m": m}

    update = stateful_local_round(
      model, settings, data, key, start=start, step=step, averaged=("params", "m"), release=release
    )
    final = update.carries
    new_state = FedAvgMomentumState(final["params"], final["m"], state.round + 1)
    return new_state, stateful_round_metrics(update)

  cost = local_training_costs(model, settings, models=2)  # w_i and m_i
  return build_algorithm(
    "fedavg_momentum",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    model_states=AVERAGED,
  )
