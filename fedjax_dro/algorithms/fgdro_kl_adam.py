"""FGDRO-KL-Adam: FGDRO-KL with Adam-type local steps.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization",
NeurIPS 2024, Section 6, Algorithm 3. The estimators ``u`` (kept on
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

from fedjax_dro.algorithms.base import Algorithm, HParam, common_settings, register
from fedjax_dro.algorithms.fgdro_kl import (
  HPARAMS as KL_HPARAMS,
  kl_estimators,
  kl_state_init,
  mean_log,
)
from fedjax_dro.algorithms.local_adam import HPARAMS as ADAM_HPARAMS, adam_step
from fedjax_dro.core.aggregation import scatter_rows
from fedjax_dro.core.local import stateful_local_round, stateful_round_metrics


class FgdroKlAdamState(NamedTuple):
  params: Any  # w_bar, the global model
  momentum: Any  # m_bar, params-shaped first moment of the weighted gradient h
  second_moment: Any  # q_bar, params-shaped second moment of h
  log_v: jnp.ndarray  # [] log v_bar, the global estimate of g(w) = mean_i exp(l_i / lambda)
  loss_estimates: jnp.ndarray  # [n] u_i, each client's moving-average loss (never communicated)
  round: jnp.ndarray  # [] int32


HPARAMS = {
  "client_lr": HParam(0.001, "local Adam step size eta"),
  **{k: KL_HPARAMS[k] for k in ("lam", "beta1", "beta2")},
  **{k: ADAM_HPARAMS[k] for k in ("beta3", "beta4", "tau")},
}


@register(
  "fgdro_kl_adam",
  "FGDRO-KL-Adam (Guo 2024, Alg. 3): FGDRO-KL with Adam-type local steps",
  family="dro",
)
def fgdro_kl_adam(
  model, *, clients_per_round=None, local_steps=32, batch_size=32, backend="auto", chunk_size=None
) -> Algorithm:
  """FGDRO-KL-Adam; ``local_steps`` is the communication interval ``I`` of the paper."""
  settings = common_settings(
    clients_per_round=clients_per_round,
    local_steps=local_steps,
    batch_size=batch_size,
    backend=backend,
    chunk_size=chunk_size,
    weighting="uniform",
  )
  initial = kl_state_init(settings)

  def init(params, data, key):
    momentum, log_v, u = initial(params, data, key)
    return FgdroKlAdamState(params, momentum, momentum, log_v, u, jnp.zeros((), jnp.int32))

  def round_fn(state, data, key, hparams):
    def start(u):
      return {
        "params": state.params,
        "m": state.momentum,
        "q": state.second_moment,
        "log_v": state.log_v,
        "u": u,
      }

    def step(carry, loss, grad):
      u, log_v, h = kl_estimators(carry, loss, grad, hparams)
      w, m, q = adam_step(carry, h, hparams)
      return {"params": w, "m": m, "q": q, "log_v": log_v, "u": u}

    update = stateful_local_round(
      model,
      settings,
      data,
      key,
      start=start,
      step=step,
      client_state=state.loss_estimates,
      averaged=("params", "m", "q"),
    )
    final = update.carries
    log_v = mean_log(final["log_v"])
    metrics = stateful_round_metrics(update)
    metrics["log_v"] = log_v
    new_state = FgdroKlAdamState(
      final["params"],
      final["m"],
      final["q"],
      log_v,
      scatter_rows(state.loss_estimates, update.idx, final["u"]),
      state.round + 1,
    )
    return new_state, metrics

  return Algorithm(
    "fgdro_kl_adam", model, init, round_fn, lambda s: s.params, HPARAMS, False, settings._asdict()
  )
