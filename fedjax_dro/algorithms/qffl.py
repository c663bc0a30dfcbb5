"""q-FFL, trained with q-FedAvg.

Li, Sanjabi, Beirami, Smith, "Fair Resource Allocation in Federated Learning", ICLR 2020
(Algorithm 2, q-FedAvg). The objective is (1/(q+1)) sum_k F_k^{q+1}(w). One round::

    S = s clients drawn uniformly without replacement (all by default)
    each k in S: F_k = f_k(w) (full-data loss at the received model), local SGD -> w_k
                 Delta_k = L (w - w_k),   h_k = q F_k^{q-1} ||Delta_k||^2 + L F_k^q
    w <- w - sum_k F_k^q Delta_k / sum_k h_k

``L`` is the Lipschitz-constant estimate of the paper (their code uses L = 1 / client_lr). As in the
authors' reference implementation (``qffedavg.py``), F_k is replaced by F_k + 1e-10 in the powers
so that F_k = 0 and q < 1 stay finite. ``q = 0`` with ``L = 1/client_lr`` is uniform FedAvg.
The implied dual weights lambda_k = F_k^q / sum_{j in S} F_j^q of the last round's participants
(zero elsewhere) are kept in ``state.lam``. Metrics: ``train_loss`` (unweighted mean of F_k over
S), ``train_loss_max``, ``lambda_max``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import (
  Algorithm,
  HParam,
  check_data_matches,
  common_settings,
  participants,
  register,
)
from fedjax_dro.algorithms.scaff_pd import _float_dtype
from fedjax_dro.core.aggregation import tree_add, tree_sq_norm, weighted_sum
from fedjax_dro.core.local import local_round, participant_losses

LOSS_EPS = 1e-10  # F_k + LOSS_EPS in the powers (reference implementation)


class QFFLState(NamedTuple):
  params: Any  # w, the global model
  lam: jnp.ndarray  # [n] F_k^q / sum F^q of the last round's participants (0 elsewhere)
  round: jnp.ndarray  # [] int32


@register(
  "qffl", "q-FFL / q-FedAvg (Li 2020): losses^q-weighted updates for fairness", family="dro"
)
def qffl(
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
  hparam_specs = {
    "client_lr": HParam(0.05, "local SGD step size"),
    "q": HParam(1.0, "fairness exponent q (0 = FedAvg)", minimum=0.0, strict=False),
    "L": HParam(20.0, "Lipschitz estimate L (reference code: 1 / client_lr)"),
  }

  def init(params, data, key):
    del key
    participants(settings, data.num_clients)
    return QFFLState(
      params, jnp.zeros((data.num_clients,), _float_dtype(params)), jnp.zeros((), jnp.int32)
    )

  def round_fn(state, data, key, hparams):
    n = data.num_clients
    check_data_matches(data, state.lam.shape[0])
    update = local_round(model, settings, state.params, data, key, hparams["client_lr"])
    losses = participant_losses(model, settings, state.params, data, update.idx)
    q, L = hparams["q"], hparams["L"]
    f = losses + LOSS_EPS
    fq = f**q
    # Delta_k = L (w - w_k) = -L delta_k
    sq = jax.vmap(tree_sq_norm)(update.deltas) * L**2
    h = q * f ** (q - 1.0) * sq + L * fq
    step = weighted_sum(update.deltas, -L * fq)  # sum_k F_k^q Delta_k
    params = tree_add(state.params, step, -1.0 / jnp.sum(h))
    lam = jnp.zeros((n,), state.lam.dtype).at[update.idx].set(fq / jnp.sum(fq))
    metrics = {
      "train_loss": jnp.mean(losses),
      "train_loss_max": jnp.max(losses),
      "lambda_max": jnp.max(lam),
    }
    return QFFLState(params, lam, state.round + 1), metrics

  return Algorithm(
    "qffl", model, init, round_fn, lambda s: s.params, hparam_specs, False, settings._asdict()
  )
