"""LocalAdam: Adam-type steps on the clients, moments averaged with the model.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization",
NeurIPS 2024, arXiv:2410.06369, Appendix D, Algorithm 4 (an ERM baseline used to
isolate the effect of local adaptive steps; FedAdam adapts only at the server). Round ``r`` on
every participant ``i``, from ``w_{i,0} = w_bar``, ``m_{i,0} = m_bar``, ``q_{i,0} = q_bar``, for
``t = 1..I`` (``I = local_steps``):

    h_{i,t} = grad l(w_{i,t-1}; z_{i,t})
    m_{i,t} = (1 - beta3) m_{i,t-1} + beta3 h_{i,t}
    q_{i,t} = (1 - beta4) q_{i,t-1} + beta4 h_{i,t}^2
    w_{i,t} = w_{i,t-1} - eta m_{i,t} / (sqrt(q_{i,t}) + tau)

then ``w_bar``, ``m_bar`` and ``q_bar`` are the averages over the participants.

Readings: there is no bias correction (the paper has none); ``m_bar = q_bar = 0`` initially;
``beta3, beta4`` weight the *new* term (``beta3 = 0.1, beta4 = 0.001`` are Adam's usual
``0.9, 0.999``). On identical clients with full batches this is exactly centralised
(uncorrected) Adam on the pooled objective (tested).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.aggregation import tree_zeros_like
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.fgdro import ADAM_HPARAMS, adam_step
from fedjax_dro.core.local import stateful_local_round, stateful_round_metrics
from fedjax_dro.core.model_state import AVERAGED
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.settings import CommonSettings, round_zero, state_init


class LocalAdamState(NamedTuple):
  params: Any  # w_bar, the global model
  momentum: Any  # m_bar, params-shaped first moment
  second_moment: Any  # q_bar, params-shaped second moment
  round: jnp.ndarray  # [] int32


RELEASES = Releases(
  "each participant's model, first- and second-moment deltas, clipped together to C (one "
  "vector); the server adds their noised sums over the expected participants to w_bar, m_bar "
  "and q_bar"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {
  "client_lr": HParam(0.001, "local Adam step size eta"),
  **ADAM_HPARAMS,  # beta3, beta4, tau
}


def initial_state(params, num_clients):
  """``w_bar = params``, ``m_bar = q_bar = 0``."""
  zeros = tree_zeros_like(params)
  return LocalAdamState(params, zeros, zeros, round_zero())


@register("local_adam")
@with_settings(defaults={"local_steps": 32, "batch_size": 32}, fixed={"weighting": "uniform"})
def local_adam(model, settings: CommonSettings) -> Algorithm:
  """LocalAdam (Guo 2024, Alg. 4): Adam steps on the clients, model and moments averaged.

  LocalAdam; model and moments are averaged uniformly every ``local_steps`` steps.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of ``w_bar``.
    clients_per_round: participants of a round (uniform, without replacement); ``None``
      (default): all, as in the paper.
    local_steps: the communication interval ``I`` of the paper: Adam steps per round (default
      32).
    batch_size: examples per local stochastic gradient (default 32); ``None``: full batches.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (the Adam
    step size eta, default 0.001), ``beta3`` and ``beta4`` (the weights of the new gradient in the
    first and second moments, defaults 0.1 and 0.001, i.e. Adam's 0.9 and 0.999) and ``tau``
    (added to ``sqrt(q)``, default 1e-8). A participant uploads ``3P`` floats (``P``
    parameters): its model and both moments.
  """
  init = state_init(settings, initial_state)

  def round_fn(state, data, key, hparams, release=PLAIN):
    def start(row):
      del row
      return {"params": state.params, "m": state.momentum, "q": state.second_moment}

    def step(carry, loss, grad):
      del loss
      w, m, q = adam_step(carry, grad, hparams)
      return {"params": w, "m": m, "q": q}

    averaged = ("params", "m", "q")  # all of the carry: the model and both moments
    update = stateful_local_round(
      model, settings, data, key, start=start, step=step, averaged=averaged, release=release
    )
    final = update.carries
    new_state = LocalAdamState(final["params"], final["m"], final["q"], state.round + 1)
    return new_state, stateful_round_metrics(update)

  cost = local_training_costs(model, settings, models=3)  # w_i, m_i and q_i
  return build_algorithm(
    "local_adam",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    model_states=AVERAGED,
  )
