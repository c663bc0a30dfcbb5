"""q-FFL, trained with q-FedAvg.

Li, Sanjabi, Beirami, Smith, "Fair Resource Allocation in Federated Learning", ICLR 2020,
arXiv:1905.10497 (Algorithm 2, q-FedAvg). The objective is (1/(q+1)) sum_k F_k^{q+1}(w). One round::

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

Private form (:func:`fedjax_dro.privacy.private`, ``loss_bound=B``): the server step reads two sums
over the same participants, and each participant's part of each is bounded and the sum noised::

    u_k = clip_C(F_k^q Delta_k)              (the whole vector, L2 norm <= C)
    h~_k = min(max(h_k, 0), B)               (h_k computed from the unclipped Delta_k)
    U = sum_k u_k + N(0, (z C)^2 I),   H = sum_k h~_k + N(0, (z_l B)^2)
    w <- w - U / max(H, z_l B)

Both sums are over the participants the round drew (Poisson or fixed), with no fixed denominator:
the step is their ratio, in which the participant count cancels as in the plain algorithm. The
floor ``z_l B`` (the standard deviation of H's noise; the smallest positive float when ``z_l =
0``) is post-processing: a noised H below one noise standard deviation does not tell the true sum
from 0 (it can even be negative), and the plain step divides by a positive sum; flooring there can
only shorten the step, to at most ``||U|| / (z_l B)``, never flip its direction. The two releases
are Gaussian mechanisms on the same participants (sensitivities C and B): the accountant composes
them into one of multiplier ``(z^-2 + z_l^-2)^(-1/2)``. ``state.lam`` and the metrics are the
simulator's diagnostics from the participants' losses, not released (the model is all that
depends on the releases). No noise and huge bounds give the plain algorithm.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import (
  Algorithm,
  HParam,
  build_algorithm,
  check_data_matches,
  register,
  with_settings,
)
from fedjax_dro.core.aggregation import tree_add, tree_sq_norm, weighted_sum
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import dual_round_metrics, local_round_and_losses
from fedjax_dro.core.precision import params_float_dtype
from fedjax_dro.core.privacy import (
  active as privacy_active,
  clip_each,
  present_loss_metrics,
  release_bounded_sum,
  release_sum,
  unclipped_updates,
)
from fedjax_dro.core.settings import CommonSettings, round_zero, state_init

LOSS_EPS = 1e-10  # F_k + LOSS_EPS in the powers (reference implementation)


class QFFLState(NamedTuple):
  params: Any  # w, the global model
  lam: jnp.ndarray  # [n] F_k^q / sum F^q of the last round's participants (0 elsewhere)
  round: jnp.ndarray  # [] int32


HPARAMS = {
  "client_lr": HParam(0.05, "local SGD step size"),
  "q": HParam(1.0, "fairness exponent q (0 = FedAvg)", minimum=0.0, strict=False),
  "L": HParam(20.0, "Lipschitz estimate L (reference code: 1 / client_lr)"),
}


def initial_state(params, num_clients):
  """``w = params``; no participant weights yet (``lambda = 0``)."""
  return QFFLState(params, jnp.zeros((num_clients,), params_float_dtype(params)), round_zero())


@register("qffl", family="dro")
@with_settings(fixed={"weighting": "uniform"})
def qffl(model, settings: CommonSettings) -> Algorithm:
  """q-FFL / q-FedAvg (Li 2020): losses^q-weighted updates for fairness.

  q-FedAvg (Algorithm 2 of the paper).

  Args:
    model: the :class:`~fedjax_dro.models.base.Model` of ``w``.
    clients_per_round: the clients ``S`` of a round (uniform, without replacement); ``None``
      (default): every client.
    local_steps: SGD steps a client in ``S`` takes from ``w`` to its ``w_k`` (default 10).
    batch_size: local minibatch size; ``None`` (default): full batches (``F_k`` is always the
      full-data loss).

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (local SGD
    step, default 0.05), ``q`` (the fairness exponent, ``>= 0``, default 1.0; 0 with ``L =
    1/client_lr`` is uniform FedAvg) and ``L`` (the Lipschitz estimate, default 20 = 1 / the
    default ``client_lr``). A participant uploads ``P + 1`` floats (``P`` parameters): its
    update ``Delta_k`` and its loss ``F_k`` (a loss without gradient, not counted as one).
  """

  def round_fn(state, data, key, hparams):
    check_data_matches(data, state.lam.shape[0])
    if privacy_active() is not None:
      return private_round_fn(state, data, key, hparams)
    lr = hparams["client_lr"]
    update, losses = local_round_and_losses(model, settings, state.params, data, key, lr)
    q, L = hparams["q"], hparams["L"]
    f = losses + LOSS_EPS
    fq = f**q
    # Delta_k = L (w - w_k) = -L delta_k
    sq = jax.vmap(tree_sq_norm)(update.deltas) * L**2
    h = q * f ** (q - 1.0) * sq + L * fq
    step = weighted_sum(update.deltas, -L * fq)  # sum_k F_k^q Delta_k
    params = tree_add(state.params, step, -1.0 / jnp.sum(h))
    lam = jnp.zeros((data.num_clients,), state.lam.dtype).at[update.idx].set(fq / jnp.sum(fq))
    metrics = dual_round_metrics(losses, lam, lambda_min=False)
    return QFFLState(params, lam, state.round + 1), metrics

  def private_round_fn(state, data, key, hparams):
    # the module docstring's private form: u_k clipped to C, h_k to [0, B], both sums noised
    with unclipped_updates():  # the participants clip F_k^q Delta_k themselves, not delta_k
      update, losses = local_round_and_losses(
        model, settings, state.params, data, key, hparams["client_lr"]
      )
    present = update.weights > 0
    q, L = hparams["q"], hparams["L"]
    f = losses + LOSS_EPS
    fq = f**q
    sq = jax.vmap(tree_sq_norm)(update.deltas) * L**2
    h = q * f ** (q - 1.0) * sq + L * fq
    coef = -L * fq  # F_k^q Delta_k = -L F_k^q delta_k
    scaled = jax.tree.map(
      lambda d: d * coef.reshape((-1,) + (1,) * (d.ndim - 1)).astype(d.dtype), update.deltas
    )
    step = release_sum(clip_each(scaled, present), jnp.ones_like(fq), present, 1.0, key)
    act = privacy_active()
    tiny = jnp.finfo(fq.dtype).tiny
    floor = jnp.maximum(act.loss_noise * act.loss_bound, tiny)
    total_h = jnp.maximum(release_bounded_sum(h, present, key), floor)
    params = tree_add(state.params, step, -1.0 / total_h)
    fq = jnp.where(present, fq, 0.0)
    share = fq / jnp.maximum(jnp.sum(fq), tiny)
    lam = jnp.zeros((data.num_clients,), state.lam.dtype).at[update.idx].set(share, mode="drop")
    metrics = {**present_loss_metrics(losses, present), "lambda_max": jnp.max(lam)}
    return QFFLState(params, lam, state.round + 1), metrics

  init = state_init(settings, initial_state)
  cost = local_training_costs(model, settings, scalars=1)  # Delta_k and F_k
  return build_algorithm("qffl", model, settings, init, round_fn, HPARAMS, cost=cost)
