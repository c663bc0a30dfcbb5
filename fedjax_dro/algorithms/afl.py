"""AFL: Agnostic Federated Learning (stochastic gradient descent-ascent).

Mohri, Sivek, Suresh, "Agnostic Federated Learning", ICML 2019, arXiv:1902.00146
(Stochastic-AFL, Algorithm 1): one stochastic gradient step per round on the model w with the
lambda-weighted gradient, and a projected gradient *ascent* step on the mixture weights lambda, both
computed at the current ``(w, lambda)``::

    S = s clients drawn uniformly without replacement (all clients by default)
    g_w = (n/s) sum_{i in S} lambda_i g_i(w)               (unbiased for sum_i lambda_i grad f_i(w))
    v_i = (n/s) f_i(w; xi) for i in S, 0 otherwise          (unbiased for the loss vector)
    w <- w - lr_w g_w
    lambda <- argmin_{l in Lambda} psi(l) - <v, l> + ||l - lambda||^2 / (2 lr_lambda)

For ``psi="chi2"`` with ``rho = 0`` (the default) the dual step is exactly AFL's projected ascent
``Proj_simplex(lambda + lr_lambda v)``; ``psi="cvar"`` projects onto the capped simplex (a convex
subset of the simplex, covered by AFL's general Lambda); ``rho > 0`` and ``psi="qffl"`` are the
proximal extension to the regularized problem of SCAFF-PD eq. (1.1) (the problem's ``prox``,
:mod:`fedjax_dro.solvers.dro`).
Gradients and losses come from one minibatch per client (``batch_size``; full batch by default).

AFL's guarantee is for the *averaged* iterates; the state keeps the running average
``params_avg`` and ``return_average=True`` makes it the evaluated model. lambda^0 is uniform.
Metrics: ``train_loss`` (unweighted mean of the participants' losses at w), ``train_loss_max``,
``lambda_max``, ``lambda_min``; lambda is ``state.lam``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.aggregation import tree_add
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import dual_round_metrics, local_round
from fedjax_dro.core.precision import params_float_dtype
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.settings import (
  CommonSettings,
  check_data_matches,
  participants,
  round_zero,
  state_init,
)
from fedjax_dro.solvers.dro import DROProblem, initial_lambda, resolve

RELEASES = Releases(
  "each participant's gradient (clipped; the server's lambda-weighted sum, scaled by 1 / q, "
  "noised for the largest weight any client has) and its minibatch loss (clipped to [0, B] and "
  "noised), which drives the lambda ascent (post-processing)",
  losses="loss",
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""


class AFLState(NamedTuple):
  params: Any  # w, the current model
  params_avg: Any  # running average of w^1..w^r (AFL's output)
  lam: jnp.ndarray  # [n] mixture weights lambda
  round: jnp.ndarray  # [] int32


def initial_state(params, num_clients):
  """``w = params`` (and its running average), uniform ``lambda``."""
  lam = initial_lambda(num_clients, params_float_dtype(params))
  return AFLState(params, jax.tree.map(jnp.array, params), lam, round_zero())


@register("afl", family="dro")
@with_settings(
  ("clients_per_round", "batch_size", "backend", "chunk_size"),
  fixed={"local_steps": 1, "weighting": "uniform"},
)
def afl(
  model,
  settings: CommonSettings,
  *,
  psi: str | DROProblem = "chi2",
  return_average: bool = False,
) -> Algorithm:
  """AFL (Mohri 2019): stochastic gradient descent on w, projected ascent on lambda.

  Stochastic-AFL: one gradient step on ``w`` and one (proximal) ascent step on ``lambda`` a
  round, unweighted over the participants.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of ``w``.
    psi: the regulariser of ``lambda``: a problem of :mod:`fedjax_dro.solvers.dro` with a prox
      step (``chi2(rho)``, ``cvar(alpha)``, ``qffl(q)``: its parameter becomes the default of
      the hyper-parameter) or its name, ``"chi2"`` (default, ``rho = 0``), ``"cvar"`` (capped
      simplex) or ``"qffl"``.
    clients_per_round: the ``s`` clients drawn uniformly without replacement each round;
      ``None`` (default): all (then the gradient and loss estimates are exact up to minibatching).
    batch_size: examples of each client's gradient and loss; ``None`` (default): full batch.
    return_average: ``False`` (default): the evaluated model is the last iterate ``w``;
      ``True``: the running average of the iterates, AFL's output.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``lr_w`` (the primal
    gradient step, default 0.1), ``lr_lambda`` (the dual step, default 0.1) and the parameter of
    ``psi``: ``rho`` (chi^2 penalty, default 0: plain AFL), ``alpha`` (CVaR level in ``(0, 1]``)
    or ``q`` (q-FFL exponent). A participant evaluates one gradient and uploads ``P + 1``
    floats (``P`` parameters): its gradient and its loss.
  """
  problem = resolve(psi, rho=0.0)  # a name: AFL's unregularized problem, rho = 0
  if not problem.has_prox:
    raise ValueError(
      f"afl needs a psi with a dual prox step (chi2, cvar or qffl), got psi={problem.name!r}"
    )
  if not isinstance(return_average, bool):
    raise TypeError(f"return_average must be a bool, got {return_average!r}")
  hparam_specs = {
    "lr_w": HParam(0.1, "primal gradient step size"),
    "lr_lambda": HParam(0.1, "dual (projected ascent) step size"),
    **problem.hparams(),
  }

  def round_fn(state, data, key, hparams, release=PLAIN):
    n = data.num_clients
    check_data_matches(data, state.lam.shape[0])
    s = participants(settings, n)
    # one local step of size 1 from w returns delta = -g_i(w); losses = f_i(w; xi)
    update = local_round(model, settings, state.params, data, key, 1.0, release=release)
    scale = release.inverse_rate(n, s)  # n / s (1 / q in a private round, Poisson participation)
    lam_s = state.lam[jnp.minimum(update.idx, n - 1)]
    # sum_i scale lam_i (-g_i); private: clipped, noised for the largest weight any client has
    present = release.present(update.weights)
    step = release.sum(update.deltas, scale * lam_s, present, scale * jnp.max(state.lam), key)
    params = tree_add(state.params, step, hparams["lr_w"])
    losses = release.losses(update.losses, key)
    v = jnp.zeros((n,), update.losses.dtype).at[update.idx].set(scale * losses)
    lam = problem.from_hparams(hparams).prox(state.lam, v, hparams["lr_lambda"])
    r = (state.round + 1).astype(update.losses.dtype)
    avg = jax.tree.map(lambda a, p: a + (p - a) / r, state.params_avg, params)
    metrics = {**dual_round_metrics(update.losses, lam), **update.metrics}
    return AFLState(params, avg, lam, state.round + 1), metrics

  return build_algorithm(
    "afl",
    model,
    settings,
    state_init(settings, initial_state),
    round_fn,
    hparam_specs,
    client_models=(lambda st: st.params_avg) if return_average else (lambda st: st.params),
    cost=local_training_costs(model, settings, scalars=1),  # g_i(w) and f_i(w; xi)
    releases=RELEASES,
    psi=problem.name,
    **problem.config(),
    return_average=return_average,
  )
