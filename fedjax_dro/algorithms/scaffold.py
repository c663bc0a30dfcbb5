"""SCAFFOLD, option II: stochastic controlled averaging.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020, Algorithm 1 with control-variate option II:

    y <- y - eta_l (g_i(y) - c_i + c)                  (local_steps times, from y = x)
    c_i+ = c_i - c + (x - y) / (J eta_l)
    x <- x + eta_g mean_{i in S}(y_i - x)
    c <- c + (s / n) mean_{i in S}(c_i+ - c_i)

Averages over the participants are unweighted, as in the paper; the fixed point is then the
minimizer of the uniform average of the client objectives (tested on heterogeneous quadratics).
Persistent per-client state: ``client_controls`` ``[n, ...]``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, common_settings, participants, register
from fedjax_dro.core.aggregation import tree_add, tree_stack, tree_zeros_like
from fedjax_dro.core.local import local_round, round_metrics


class ScaffoldState(NamedTuple):
  params: Any  # global model x
  control: Any  # server control variate c (params-shaped)
  client_controls: Any  # [n, ...] client control variates c_i
  round: jnp.ndarray  # [] int32


HPARAMS = {
  "client_lr": HParam(0.1, "local SGD step size eta_l"),
  "server_lr": HParam(1.0, "global step size eta_g"),
}


@register(
  "scaffold", "SCAFFOLD option II (Karimireddy 2020): control variates correct client drift"
)
def scaffold(
  model, *, clients_per_round=None, local_steps=10, batch_size=None, backend="auto", chunk_size=None
) -> Algorithm:
  settings = common_settings(
    clients_per_round=clients_per_round,
    local_steps=local_steps,
    batch_size=batch_size,
    backend=backend,
    chunk_size=chunk_size,
    weighting="uniform",
  )

  def init(params, data, key):
    del key
    participants(settings, data.num_clients)
    zeros = tree_zeros_like(params)
    return ScaffoldState(
      params, zeros, tree_stack(zeros, data.num_clients), jnp.zeros((), jnp.int32)
    )

  def round_fn(state, data, key, hparams):
    n = data.num_clients
    s = participants(settings, n)
    lr = hparams["client_lr"]
    correct = lambda w, g, c_i: jax.tree.map(lambda gi, ci, c: gi - ci + c, g, c_i, state.control)
    # c_i+ = c_i - c + (x - y_i) / (J eta_l) = c_i - c - delta_i / (J eta_l), computed inside each
    # participant's update; only the mean delta leaves the round (no stacked deltas)
    new_control = lambda c_i, d: jax.tree.map(
      lambda ci, c, di: ci - c - di / (settings.local_steps * lr), c_i, state.control, d
    )
    update = local_round(
      model,
      settings,
      state.params,
      data,
      key,
      lr,
      client_state=state.client_controls,
      grad_transform=correct,
      state_update=new_control,
      mean_only=True,
    )
    mean_delta = update.deltas  # uniform weighting: the participants' mean delta
    params = tree_add(state.params, mean_delta, hparams["server_lr"])
    # mean of c_i+ - c_i = -c - delta_i / (J eta_l) over the participants: from the mean delta
    dc = jax.tree.map(lambda c, d: -c - d / (settings.local_steps * lr), state.control, mean_delta)
    control = tree_add(state.control, dc, s / n)
    return (
      ScaffoldState(params, control, update.client_state, state.round + 1),
      round_metrics(update),
    )

  return Algorithm(
    "scaffold", model, init, round_fn, lambda s: s.params, HPARAMS, False, settings._asdict()
  )
