"""FGDRO-KL: federated group DRO with KL regularization, as a three-level composition.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization",
NeurIPS 2024, arXiv:2410.06369, Section 5, Algorithm 2. The KL-regularised group
DRO problem is, by its KKT conditions, equation (5)

    min_w F(w) = lambda log( (1/N) sum_i exp(l(w; D_i) / lambda) ),

with gradient (6) ``(1/N) sum_i g_i(w) / g(w) grad l(w; D_i)``, ``g_i = exp(l(w; D_i)/lambda)``
and ``g = (1/N) sum_i g_i``. Round ``r`` on every participant ``i``, from ``w_{i,0} = w_bar``,
``m_{i,0} = m_bar``, ``v_{i,0} = v_bar`` and its own ``u_{i,0} = u_{i,I}`` of its previous round,
for ``t = 1..I`` (``I = local_steps``):

    u_{i,t} = (1 - beta1) u_{i,t-1} + beta1 l(w_{i,t-1}; z_{i,t})          (kept on the client)
    v_{i,t} = (1 - beta2) v_{i,t-1} + beta2 exp(u_{i,t} / lambda)          (averaged)
    h_{i,t} = exp(u_{i,t} / lambda) / v_{i,t} grad l(w_{i,t-1}; z_{i,t})
    m_{i,t} = (1 - beta3) m_{i,t-1} + beta3 h_{i,t}                        (averaged)
    w_{i,t} = w_{i,t-1} - eta m_{i,t}                                      (averaged)

Readings where the paper is terse (each backed by a test in ``tests/algorithms/test_fgdro.py``):

* Line 7 of Algorithm 2 prints ``exp(u_{i,t}) / v_{i,t}``; we use ``exp(u_{i,t} / lambda)``, the
  estimator of ``g_i`` that ``v`` averages and that (6) needs. With the printed form the fixed
  point is the optimum of (5) only for ``lambda = 1``; with ours FGDRO-KL reaches the closed-form
  optimum of (5) for any ``lambda`` (tested on quadratics with known client losses).
* ``v`` is stored as ``log v`` and updated in the log domain
  (``log v <- logaddexp(log(1 - beta2) + log v, log beta2 + u / lambda)``; the average of ``v``
  over clients is ``logsumexp(log v_i) - log s``), which is the same arithmetic as the paper's
  in exact arithmetic but does not overflow when ``u / lambda`` exceeds ~88 in float32.
* Initial values, not given by the paper: ``u = 0``, ``v_bar = 1 = exp(0 / lambda)`` (consistent
  with ``u``), ``m_bar = 0``.
* Averages are unweighted over the participants (all clients by default, as in the paper); only
  the participants' ``u`` rows advance.

Private form (:func:`fedjax_dro.privacy.private`; FGDRO-KL-Adam the same with ``q``): a
participant releases the changes of its model and of ``m`` and the relative change of its ``v``,
``(w_{i,I} - w_bar, m_{i,I} - m_bar, v_{i,I} / v_bar - 1)``, clipped together to the clip norm;
the server adds the noised sums over the expected participants to ``w_bar`` and ``m_bar`` and
multiplies ``v_bar`` by one plus the third (the mean of ``v_i`` over the participants is
``v_bar (1 + mean(v_i / v_bar - 1))``, so with no noise and no clipping this is the plain
average). Noise can take that factor below 0, where ``log v`` is undefined: it is raised to at
least ``1e-6`` (post-processing). ``u`` stays on the client.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.fgdro import (
  KL_ESTIMATOR_HPARAMS,
  MOMENTUM_HPARAMS,
  kl_initial,
  kl_round,
  momentum_step,
)
from fedjax_dro.core.model_state import AVERAGED
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.settings import CommonSettings, round_zero, state_init
from fedjax_dro.solvers.dro import kl


class FgdroKlState(NamedTuple):
  params: Any  # w_bar, the global model
  momentum: Any  # m_bar, params-shaped moving average of the weighted gradient
  log_v: jnp.ndarray  # [] log v_bar, the global estimate of g(w) = mean_i exp(l_i / lambda)
  loss_estimates: jnp.ndarray  # [n] u_i, each client's moving-average loss (never communicated)
  round: jnp.ndarray  # [] int32


RELEASES = Releases(
  "each participant's model and m deltas and the relative change v_i / v_bar - 1 of its v, "
  "clipped together to C; the server adds the noised sums over the expected participants to "
  "w_bar and m_bar and scales v_bar by one plus the third (at least 1e-6); u stays on the client"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {
  "client_lr": HParam(0.1, "local step size eta"),
  **kl(1.0).hparams(),  # lam, the parameter of the KL problem (5)
  **KL_ESTIMATOR_HPARAMS,  # beta1, beta2
  **MOMENTUM_HPARAMS,  # beta3
}


@register("fgdro_kl", family="dro")
@with_settings(defaults={"local_steps": 32, "batch_size": 32}, fixed={"weighting": "uniform"})
def fgdro_kl(model, settings: CommonSettings) -> Algorithm:
  """FGDRO-KL (Guo 2024, Alg. 2): KL-regularised group DRO with local u, averaged v and m.

  The loss estimators ``u`` stay on the clients; ``w``, ``m`` and ``v`` (in the log domain) are
  averaged uniformly.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of ``w_bar``.
    clients_per_round: clients of a round, drawn without replacement; ``None`` (default): all,
      as in the paper.
    local_steps: the paper's communication interval ``I``, in local steps (default 32).
    batch_size: size of a local minibatch ``z_{i,t}`` (default 32); ``None``: full batches.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (the local
    step eta, default 0.1), ``lam`` (the KL regularisation lambda, default 1.0; smaller is closer
    to the worst client) and the moving-average weights ``beta1`` (of ``u``), ``beta2`` (of ``v``)
    and ``beta3`` (of ``m``), each in ``(0, 1]``, default 0.1. A participant uploads ``2P + 1``
    floats (``P`` parameters): its model, its ``m`` and its ``v``.
  """
  init = state_init(settings, lambda p, n: FgdroKlState(p, *kl_initial(p, n), round_zero()))

  def round_fn(state, data, key, hparams, release=PLAIN):
    # lines 6-7 (u, v and h) in kl_round; lines 8-9: the moving average m of h and the step on w
    def move(carry, h):
      w, m = momentum_step(carry, h, hparams)
      return {"params": w, "m": m}

    shared = {"params": state.params, "m": state.momentum}  # averaged, with v
    final, log_v, u, metrics = kl_round(
      model, settings, state, data, key, hparams, release, shared=shared, move=move
    )
    return FgdroKlState(final["params"], final["m"], log_v, u, state.round + 1), metrics

  cost = local_training_costs(model, settings, models=2, scalars=1)  # w_i, m_i and v_i
  return build_algorithm(
    "fgdro_kl",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    model_states=AVERAGED,
  )
