"""AgnosticFedAvg: FedAvg with exponentiated-gradient domain weights.

Ro, Chen, Mathews, Mohri, Suresh, "Communication-Efficient Agnostic Federated Averaging",
Interspeech 2021 (arXiv:2104.02748); FedJAX implementation ``fedjax/algorithms/agnostic_fed_avg.py``
(``agnostic_federated_averaging`` with ``domain_algorithm='eg'``). Here every client is one domain.
One round::

    S = s clients drawn uniformly without replacement (all by default)
    each k in S: L_k = f_k(w) on its full data at the received model (FedJAX's first,
                 "domain metrics" pass), then local SGD from w -> delta_k = w_k - w
    w <- w + server_lr sum_{k in S} lambda_k delta_k / sum_{k in S} lambda_k
    lambda_i <- lambda_i exp(domain_lr * L_i) (L_i = 0 for clients not in S), then normalized

Mapping to FedJAX: with one domain per client FedJAX's scaling weight is
beta_k = alpha_k N_k = lambda_k N_k / window(N_k); with window size 1 the window holds N_k, so
beta_k = lambda_k, the aggregation weight above; the client's domain-scaled loss reduces to its
mean loss (plain local SGD); a domain without examples this round has mean loss
safe_div(0, 0) = 0, i.e. its weight is only renormalized. ``server_lr`` is FedJAX's server SGD
step on the mean pseudo-gradient. lambda^0 is uniform. Metrics: ``train_loss`` (unweighted mean
of L_k over S), ``train_loss_max``, ``lambda_max``, ``lambda_min``; lambda is ``state.lam``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from fedjax_dro.algorithms.base import (
  Algorithm,
  HParam,
  check_data_matches,
  common_settings,
  participants,
  register,
)
from fedjax_dro.algorithms.scaff_pd import _float_dtype, initial_lambda
from fedjax_dro.core.aggregation import tree_add, weighted_mean
from fedjax_dro.core.local import local_round, participant_losses


class AgnosticFedAvgState(NamedTuple):
  params: Any  # w, the global model
  lam: jnp.ndarray  # [n] domain (client) weights lambda
  round: jnp.ndarray  # [] int32


@register(
  "agnostic_fedavg",
  "AgnosticFedAvg (Ro 2021): lambda-weighted FedAvg, exponentiated-gradient client weights",
  family="dro",
)
def agnostic_fedavg(
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
    "server_lr": HParam(1.0, "server step on the lambda-weighted model difference"),
    "domain_lr": HParam(
      0.1, "exponentiated-gradient step size for lambda", minimum=0.0, strict=False
    ),
  }

  def init(params, data, key):
    del key
    participants(settings, data.num_clients)
    return AgnosticFedAvgState(
      params, initial_lambda(data.num_clients, _float_dtype(params)), jnp.zeros((), jnp.int32)
    )

  def round_fn(state, data, key, hparams):
    n = data.num_clients
    check_data_matches(data, state.lam.shape[0])
    update = local_round(model, settings, state.params, data, key, hparams["client_lr"])
    losses = participant_losses(model, settings, state.params, data, update.idx)
    params = tree_add(
      state.params, weighted_mean(update.deltas, state.lam[update.idx]), hparams["server_lr"]
    )
    domain_loss = jnp.zeros((n,), state.lam.dtype).at[update.idx].set(losses)
    # exp(eta L_i) / sum; shifting by max(L) changes nothing after normalization but cannot overflow
    lam = state.lam * jnp.exp(hparams["domain_lr"] * (domain_loss - jnp.max(domain_loss)))
    lam = lam / jnp.sum(lam)
    metrics = {
      "train_loss": jnp.mean(losses),
      "train_loss_max": jnp.max(losses),
      "lambda_max": jnp.max(lam),
      "lambda_min": jnp.min(lam),
    }
    return AgnosticFedAvgState(params, lam, state.round + 1), metrics

  return Algorithm(
    "agnostic_fedavg",
    model,
    init,
    round_fn,
    lambda s: s.params,
    hparam_specs,
    False,
    settings._asdict(),
  )
