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

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.aggregation import tree_add, tree_sq_norm
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import local_round_and_losses
from fedjax_dro.core.precision import params_float_dtype
from fedjax_dro.core.release import PLAIN, Releases, loss_metrics
from fedjax_dro.core.settings import CommonSettings, check_data_matches, round_zero, state_init

LOSS_EPS = 1e-10  # F_k + LOSS_EPS in the powers (reference implementation)


class QFFLState(NamedTuple):
  params: Any  # w, the global model
  lam: jnp.ndarray  # [n] F_k^q / sum F^q of the last round's participants (0 elsewhere)
  round: jnp.ndarray  # [] int32


RELEASES = Releases(
  "each participant's F_k^q Delta_k (clipped to C; the server's sum noised with std z C) and its "
  "h_k = q F_k^(q-1) ||Delta_k||^2 + L F_k^q (clipped to [0, B]; the sum noised with std z_l B); "
  "the server steps by the first sum over the second floored at z_l B (post-processing)",
  losses="h_k = q F_k^(q-1) ||Delta_k||^2 + L F_k^q",
  mechanism="DP-FedAvg (clipped updates, Gaussian noise on the sum, the step a ratio of two "
  "noised sums)",
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

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
    model: the :class:`~fedjax_dro.common.model.Model` of ``w``.
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

  def round_fn(state, data, key, hparams, release=PLAIN):
    check_data_matches(data, state.lam.shape[0])
    # private: the participants clip what they release, F_k^q Delta_k, not their delta_k
    update, losses = local_round_and_losses(
      model, settings, state.params, data, key, hparams["client_lr"], release.unclipped()
    )
    present = release.present(update.weights)
    q, L = hparams["q"], hparams["L"]
    f = losses + LOSS_EPS
    fq = f**q
    # Delta_k = L (w - w_k) = -L delta_k
    sq = jax.vmap(tree_sq_norm)(update.deltas) * L**2
    h = q * f ** (q - 1.0) * sq + L * fq
    # sum_k F_k^q Delta_k over sum_k h_k (private: each clipped, both sums noised)
    step, clipped = release.scaled_sum(update.deltas, -L * fq, present, key)
    params = tree_add(state.params, step, -1.0 / release.ratio_denominator(h, present, key))
    if present is not None:
      fq = jnp.where(present, fq, 0.0)
    share = fq / jnp.maximum(jnp.sum(fq), jnp.finfo(fq.dtype).tiny)
    lam = jnp.zeros((data.num_clients,), state.lam.dtype).at[update.idx].set(share, mode="drop")
    metrics = {**loss_metrics(losses, present), "lambda_max": jnp.max(lam)}
    # the draw's metrics, and the clip flags of what is released
    metrics.update({k: v for k, v in update.metrics.items() if k != "dp_unclipped"}, **clipped)
    return QFFLState(params, lam, state.round + 1), metrics

  init = state_init(settings, initial_state)
  cost = local_training_costs(model, settings, scalars=1)  # Delta_k and F_k
  return build_algorithm(
    "qffl", model, settings, init, round_fn, HPARAMS, cost=cost, releases=RELEASES
  )
