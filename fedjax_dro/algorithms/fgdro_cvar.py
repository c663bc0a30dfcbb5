"""FGDRO-CVaR: federated group DRO with a CVaR constraint, as a compositional problem.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust
Optimization", NeurIPS 2024, arXiv:2410.06369, Section 4, Algorithm 1. With
``g_i(w) = E_{z ~ D_i} l(w; z)`` and ``f(.) = (.)_+`` the method solves problem (2)

    min_w min_s  F(w, s) = (1/N) sum_i f(g_i(w) - s) + (K/N) s,

whose minimiser over ``s`` is a threshold with only the ``K`` worst clients above it (the CVaR of
the client losses at level ``K/N``). Round ``r`` of Algorithm 1, on every participant ``i``,
starting from ``w_{i,0} = w_bar``, ``s_{i,0} = s_bar`` and its own ``u_{i,0} = u_{i,I}`` of its
previous round (``u`` is never communicated), for ``t = 1..I`` (``I = local_steps``):

    u_{i,t} = (1 - beta1) u_{i,t-1} + beta1 l(w_{i,t-1}; z_{i,t})
    v_{i,t} = -df(u_{i,t} - s_{i,t-1}) + K/N,           s_{i,t} = s_{i,t-1} - eta2 v_{i,t}
    m_{i,t} = df(u_{i,t} - s_{i,t-1}) grad l(w_{i,t-1}; z_{i,t}),   w_{i,t} = w_{i,t-1} - eta1 m_{i,t}

then ``w_bar`` and ``s_bar`` are the averages of ``w_{i,I}`` and ``s_{i,I}``.

Readings where the paper is terse (each backed by a test in ``tests/algorithms/test_fgdro.py``):

* ``df`` is the subgradient of ``(.)_+`` taking the value 0 at the kink: ``df(x) = 1[x > 0]``.
* ``K/N`` is the hyper-parameter ``alpha`` in ``(0, 1]`` (the CVaR level: the fraction of worst
  clients optimised); with fixed client losses ``s`` settles where a fraction ``alpha`` of the
  clients lie above it, i.e. between the ``K``-th and ``(K+1)``-th largest loss (tested).
* ``u`` starts at 0 (Algorithm 1, line 1), ``s_bar`` at 0.
* With partial participation (``clients_per_round < N``; the paper uses all clients) the averages
  run over the participants, and only their ``u`` rows advance.
* Averages are unweighted (``1/N``), as in the paper.

Private form (:func:`fedjax_dro.privacy.private`): a participant releases the change of its
model and of its threshold, ``(w_{i,I} - w_bar, s_{i,I} - s_bar)``, clipped together to the clip
norm; the server adds both noised sums over the expected participants to ``w_bar`` and ``s_bar``.
``u`` stays on the client (its row is written back only for the clients drawn).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.fgdro import estimator_round
from fedjax_dro.core.local import stateful_round_metrics
from fedjax_dro.core.model_state import AVERAGED
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.settings import CommonSettings, round_zero, state_init


class FgdroCvarState(NamedTuple):
  params: Any  # w_bar, the global model
  threshold: jnp.ndarray  # [] s_bar, the global CVaR threshold
  loss_estimates: jnp.ndarray  # [n] u_i, each client's moving-average loss (never communicated)
  round: jnp.ndarray  # [] int32


RELEASES = Releases(
  "each participant's model delta and threshold delta s_i - s_bar, clipped together to C; the "
  "server adds their noised sums over the expected participants to w_bar and s_bar; the loss "
  "estimator u stays on the client"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {
  "client_lr": HParam(0.1, "model step size eta1"),
  "threshold_lr": HParam(0.01, "threshold step size eta2"),
  "beta1": HParam(0.1, "moving-average weight of the loss estimator u", maximum=1.0),
  "alpha": HParam(0.2, "CVaR level K/N: fraction of worst clients optimised", maximum=1.0),
}


def initial_state(params, num_clients):
  """``w_bar = params``, ``s_bar = 0``, ``u = 0``."""
  dtype = jnp.result_type(float)
  return FgdroCvarState(
    params, jnp.zeros((), dtype), jnp.zeros((num_clients,), dtype), round_zero()
  )


@register("fgdro_cvar", family="dro")
@with_settings(defaults={"local_steps": 32, "batch_size": 32}, fixed={"weighting": "uniform"})
def fgdro_cvar(model, settings: CommonSettings) -> Algorithm:
  """FGDRO-CVaR (Guo 2024, Alg. 1): local threshold s and loss estimators, top-K/N client losses.

  Each participant keeps its loss estimator ``u``; the model and the threshold ``s`` are
  averaged uniformly.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of ``w_bar``.
    clients_per_round: participants of a round, drawn without replacement; ``None`` (default):
      all clients, as in the paper.
    local_steps: the communication interval ``I`` of the paper: local steps per round (default
      32).
    batch_size: examples of one ``z_{i,t}`` (default 32); ``None``: full batches.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (eta1, the
    model step, default 0.1), ``threshold_lr`` (eta2, the threshold step, default 0.01), ``beta1``
    (the moving-average weight of ``u``, default 0.1) and ``alpha`` (the CVaR level ``K/N`` in
    ``(0, 1]``: the fraction of worst clients optimised, default 0.2). A participant uploads
    ``P + 1`` floats (``P`` parameters): its model and its threshold ``s``.
  """
  init = state_init(settings, initial_state)

  def round_fn(state, data, key, hparams, release=PLAIN):
    lr, s_lr, beta1, alpha = (hparams[k] for k in ("client_lr", "threshold_lr", "beta1", "alpha"))

    def step(carry, loss, grad):
      u = (1 - beta1) * carry["u"] + beta1 * loss
      active = (u - carry["s"] > 0).astype(u.dtype)  # df(u - s_{t-1}), 0 at the kink
      s = carry["s"] - s_lr * (alpha - active)
      w = jax.tree.map(lambda p, g: (p - lr * active * g).astype(p.dtype), carry["params"], grad)
      return {"params": w, "s": s, "u": u}

    # the server averages the models and the thresholds s_i (private: their deltas released
    # together, clipped together)
    server = {"params": state.params, "s": state.threshold}
    update, loss_estimates = estimator_round(
      model, settings, state, data, key, release, server, step, averaged=("params",), means=("s",)
    )
    threshold = update.carries["s"]
    metrics = stateful_round_metrics(update)
    metrics["threshold"] = threshold
    params = update.carries["params"]
    return FgdroCvarState(params, threshold, loss_estimates, state.round + 1), metrics

  cost = local_training_costs(model, settings, scalars=1)  # w_i and s_i
  return build_algorithm(
    "fgdro_cvar",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    model_states=AVERAGED,
  )
