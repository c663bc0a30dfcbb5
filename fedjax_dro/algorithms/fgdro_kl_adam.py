"""FGDRO-KL-Adam: FGDRO-KL with Adam-type local steps.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization",
NeurIPS 2024, arXiv:2410.06369, Section 6, Algorithm 3. The estimators ``u`` (kept on
the client), ``v`` and ``h`` are those of FGDRO-KL (:mod:`fedjax_dro.algorithms.fgdro_kl`, with
the same readings: ``exp(u / lambda)`` in ``h``, ``v`` in the log domain); the local model takes
an Adam-type step, for ``t = 1..I``:

    m_{i,t} = (1 - beta3) m_{i,t-1} + beta3 h_{i,t}
    q_{i,t} = (1 - beta4) q_{i,t-1} + beta4 h_{i,t}^2
    w_{i,t} = w_{i,t-1} - eta m_{i,t} / (sqrt(q_{i,t}) + tau)

and at communication ``w``, ``v``, ``m`` and ``q`` are averaged; ``u`` stays on the client.

Reading: equation (8) in the text prints ``q_{i,t} = (1 - beta4) m_{i,t-1} + beta4 h_{i,t}``; we
follow Algorithm 3, line 8 (``q`` a moving average of ``h^2``, Adam's second moment, which the
text calls "the second-order momentum"). Backed by the reference-loop test.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.fgdro import (
  ADAM_HPARAMS,
  KL_ESTIMATOR_HPARAMS,
  adam_step,
  kl_initial,
  kl_round,
)
from fedjax_dro.core.model_state import AVERAGED
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.settings import CommonSettings, round_zero, state_init
from fedjax_dro.solvers.dro import kl


class FgdroKlAdamState(NamedTuple):
  params: Any  # w_bar, the global model
  momentum: Any  # m_bar, params-shaped first moment of the weighted gradient h
  second_moment: Any  # q_bar, params-shaped second moment of h
  log_v: jnp.ndarray  # [] log v_bar, the global estimate of g(w) = mean_i exp(l_i / lambda)
  loss_estimates: jnp.ndarray  # [n] u_i, each client's moving-average loss (never communicated)
  round: jnp.ndarray  # [] int32


RELEASES = Releases(
  "as fgdro_kl, with the second moment's delta q_i - q_bar clipped together with the others"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {
  "client_lr": HParam(0.001, "local Adam step size eta"),
  **kl(1.0).hparams(),  # FGDRO-KL's lam, beta1 and beta2
  **KL_ESTIMATOR_HPARAMS,
  **ADAM_HPARAMS,  # LocalAdam's beta3, beta4 and tau
}


def initial_state(params, num_clients):
  """``w_bar = params``; ``m_bar``, ``q_bar``, ``log v_bar`` and ``u`` zero."""
  momentum, log_v, u = kl_initial(params, num_clients)
  return FgdroKlAdamState(params, momentum, momentum, log_v, u, round_zero())


@register("fgdro_kl_adam", family="dro")
@with_settings(defaults={"local_steps": 32, "batch_size": 32}, fixed={"weighting": "uniform"})
def fgdro_kl_adam(model, settings: CommonSettings) -> Algorithm:
  """FGDRO-KL-Adam (Guo 2024, Alg. 3): FGDRO-KL with Adam-type local steps.

  FGDRO-KL's estimators with LocalAdam's step: ``w``, ``m``, ``q`` and ``v`` are averaged
  uniformly, ``u`` stays on the client.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of the averaged model ``w_bar``.
    clients_per_round: how many clients take part in a round (drawn without replacement);
      ``None`` (default): every client, as in the paper.
    local_steps: ``I``, the number of local Adam steps between communications (default 32).
    batch_size: examples in a local minibatch (default 32); ``None``: the full client data.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (the Adam
    step eta, default 0.001); FGDRO-KL's ``lam`` (default 1.0), ``beta1`` and ``beta2`` (default
    0.1 each); LocalAdam's ``beta3`` and ``beta4`` (the weights of the new ``h`` in the two
    moments, defaults 0.1 and 0.001) and ``tau`` (added to ``sqrt(q)``, default 1e-8). A
    participant uploads ``3P + 1`` floats (``P`` parameters): its model, ``m``, ``q`` and ``v``.
  """
  init = state_init(settings, initial_state)

  def round_fn(state, data, key, hparams, release=PLAIN):
    # lines 6-7 (FGDRO-KL's u, v and h) in kl_round; lines 8-9: the Adam-type step along h
    def move(carry, h):
      w, m, q = adam_step(carry, h, hparams)
      return {"params": w, "m": m, "q": q}

    shared = {"params": state.params, "m": state.momentum, "q": state.second_moment}
    final, log_v, u, metrics = kl_round(
      model, settings, state, data, key, hparams, release, shared=shared, move=move
    )
    params, m, q = final["params"], final["m"], final["q"]
    return FgdroKlAdamState(params, m, q, log_v, u, state.round + 1), metrics

  cost = local_training_costs(model, settings, models=3, scalars=1)  # w_i, m_i, q_i and v_i
  return build_algorithm(
    "fgdro_kl_adam",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    model_states=AVERAGED,
  )
