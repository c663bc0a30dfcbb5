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

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import dual_round_metrics, local_round_and_losses
from fedjax_dro.core.precision import params_float_dtype
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.server import (
  check_optimizer,
  next_state,
  optimizer_config,
  optimizer_state_init,
  server_move,
)
from fedjax_dro.core.settings import CommonSettings, check_data_matches, round_zero
from fedjax_dro.solvers.dro import initial_lambda


class AgnosticFedAvgState(NamedTuple):
  params: Any  # w, the global model
  lam: jnp.ndarray  # [n] domain (client) weights lambda
  round: jnp.ndarray  # [] int32


class AgnosticFedAvgOptState(NamedTuple):
  """:class:`AgnosticFedAvgState` with a server optimizer's state (``server_optimizer=``)."""

  params: Any  # w, the global model
  lam: jnp.ndarray  # [n] domain (client) weights lambda
  opt_state: Any  # the server optimizer's state (an optax state pytree)
  round: jnp.ndarray  # [] int32


RELEASES = Releases(
  "each participant's model delta (clipped; the lambda-weighted sum over the expected weight "
  "q of the participants, noised for the largest lambda) and its full-data loss (clipped to [0, "
  "B] and noised), which drives lambda's exponentiated step (post-processing)",
  losses="loss",
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {
  "client_lr": HParam(0.05, "local SGD step size"),
  "server_lr": HParam(1.0, "server step on the lambda-weighted model difference"),
  "domain_lr": HParam(
    0.1, "exponentiated-gradient step size for lambda", minimum=0.0, strict=False
  ),
}


def initial_state(params, num_clients):
  """``w = params``, uniform ``lambda``."""
  lam = initial_lambda(num_clients, params_float_dtype(params))
  return AgnosticFedAvgState(params, lam, round_zero())


@register("agnostic_fedavg", family="dro")
@with_settings(fixed={"weighting": "uniform"})
def agnostic_fedavg(model, settings: CommonSettings, *, server_optimizer=None) -> Algorithm:
  """AgnosticFedAvg (Ro 2021): lambda-weighted FedAvg, exponentiated-gradient client weights.

  Every client is one domain; the server averages the model differences with the weights lambda.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of the global model ``w``.
    clients_per_round: the sampled clients ``S`` of a round (uniform, without replacement);
      ``None`` (default): all.
    local_steps: local SGD steps of each client in ``S`` per round (default 10).
    batch_size: examples per local SGD step; ``None`` (default): the whole client data (the
      domain losses ``L_k`` always use the full data).
    server_optimizer: an optax ``GradientTransformation`` in place of the server step on the
      lambda-weighted mean difference, applied to its negative and scaled by ``server_lr``
      (:mod:`fedjax_dro.core.server`); lambda's update is unchanged. None (default): the step.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (local SGD
    step, default 0.05), ``server_lr`` (server step on the lambda-weighted mean model difference,
    default 1.0) and ``domain_lr`` (the exponentiated-gradient step of lambda, ``>= 0``, default
    0.1; 0 keeps lambda uniform). A participant uploads ``P + 1`` floats (``P`` parameters):
    its model difference and its loss ``L_k``.
  """

  def round_fn(state, data, key, hparams, release=PLAIN):
    n = data.num_clients
    check_data_matches(data, state.lam.shape[0])
    lr = hparams["client_lr"]
    update, losses = local_round_and_losses(model, settings, state.params, data, key, lr, release)
    present = release.present(update.weights)
    # the lambda-weighted mean difference (private: a fixed denominator, E[sum_S lam] = q)
    lam_s = state.lam[jnp.minimum(update.idx, n - 1)]
    delta = release.weighted_average(update.deltas, lam_s, present, jnp.max(state.lam), n, key)
    losses = release.losses(losses, key)
    params, opt_state = server_move(
      server_optimizer, state, state.params, delta, hparams["server_lr"]
    )
    domain_loss = jnp.zeros((data.num_clients,), state.lam.dtype).at[update.idx].set(losses)
    # exp(eta L_i) / sum; shifting by max(L) changes nothing after normalization but cannot overflow
    lam = state.lam * jnp.exp(hparams["domain_lr"] * (domain_loss - jnp.max(domain_loss)))
    lam = lam / jnp.sum(lam)
    metrics = {**dual_round_metrics(losses, lam), **update.metrics}
    return next_state(state, opt_state, params, lam), metrics

  server_optimizer = check_optimizer(server_optimizer, "agnostic_fedavg")
  init = optimizer_state_init(settings, initial_state, server_optimizer, AgnosticFedAvgOptState)
  cost = local_training_costs(model, settings, scalars=1)  # delta_k and L_k
  extra = optimizer_config(server_optimizer)
  return build_algorithm(
    "agnostic_fedavg",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    **extra,
  )
