"""AFL: Agnostic Federated Learning (stochastic gradient descent-ascent).

Mohri, Sivek, Suresh, "Agnostic Federated Learning", ICML 2019 (Stochastic-AFL, Algorithm 1):
one stochastic gradient step per round on the model w with the lambda-weighted gradient, and a
projected gradient *ascent* step on the mixture weights lambda, both computed at the current
``(w, lambda)``::

    S = s clients drawn uniformly without replacement (all clients by default)
    g_w = (n/s) sum_{i in S} lambda_i g_i(w)               (unbiased for sum_i lambda_i grad f_i(w))
    v_i = (n/s) f_i(w; xi) for i in S, 0 otherwise          (unbiased for the loss vector)
    w <- w - lr_w g_w
    lambda <- argmin_{l in Lambda} psi(l) - <v, l> + ||l - lambda||^2 / (2 lr_lambda)

For ``psi="chi2"`` with ``rho = 0`` (the default) the dual step is exactly AFL's projected ascent
``Proj_simplex(lambda + lr_lambda v)``; ``psi="cvar"`` projects onto the capped simplex (a convex
subset of the simplex, covered by AFL's general Lambda); ``rho > 0`` and ``psi="qffl"`` are the
proximal extension to the regularized problem of SCAFF-PD eq. (1.1) (``solvers.simplex.dual_prox``).
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

from fedjax_dro.algorithms.base import (
  Algorithm,
  HParam,
  check_data_matches,
  common_settings,
  participants,
  register,
)
from fedjax_dro.algorithms.scaff_pd import (
  _float_dtype,
  check_psi,
  initial_lambda,
  psi_hparams,
  psi_params,
)
from fedjax_dro.core.aggregation import tree_add, weighted_sum
from fedjax_dro.core.local import local_round
from fedjax_dro.solvers.simplex import dual_prox


class AFLState(NamedTuple):
  params: Any  # w, the current model
  params_avg: Any  # running average of w^1..w^r (AFL's output)
  lam: jnp.ndarray  # [n] mixture weights lambda
  round: jnp.ndarray  # [] int32


@register(
  "afl",
  "AFL (Mohri 2019): stochastic gradient descent on w, projected ascent on lambda",
  family="dro",
)
def afl(
  model,
  *,
  psi: str = "chi2",
  clients_per_round=None,
  batch_size=None,
  backend="auto",
  chunk_size=None,
  return_average: bool = False,
) -> Algorithm:
  check_psi(psi)
  if not isinstance(return_average, bool):
    raise TypeError(f"return_average must be a bool, got {return_average!r}")
  settings = common_settings(
    clients_per_round=clients_per_round,
    local_steps=1,
    batch_size=batch_size,
    backend=backend,
    chunk_size=chunk_size,
    weighting="uniform",
  )
  hparam_specs = {
    "lr_w": HParam(0.1, "primal gradient step size"),
    "lr_lambda": HParam(0.1, "dual (projected ascent) step size"),
    **psi_hparams(psi, rho_default=0.0),
  }

  def init(params, data, key):
    del key
    participants(settings, data.num_clients)
    return AFLState(
      params,
      jax.tree.map(jnp.array, params),
      initial_lambda(data.num_clients, _float_dtype(params)),
      jnp.zeros((), jnp.int32),
    )

  def round_fn(state, data, key, hparams):
    n = data.num_clients
    check_data_matches(data, state.lam.shape[0])
    s = participants(settings, n)
    # one local step of size 1 from w returns delta = -g_i(w); losses = f_i(w; xi)
    update = local_round(model, settings, state.params, data, key, 1.0)
    scale = n / s
    lam_s = state.lam[update.idx]
    params = tree_add(state.params, weighted_sum(update.deltas, scale * lam_s), hparams["lr_w"])
    v = jnp.zeros((n,), update.losses.dtype).at[update.idx].set(scale * update.losses)
    lam = dual_prox(psi, state.lam, v, hparams["lr_lambda"], **psi_params(psi, hparams))
    r = (state.round + 1).astype(update.losses.dtype)
    avg = jax.tree.map(lambda a, p: a + (p - a) / r, state.params_avg, params)
    metrics = {
      "train_loss": jnp.mean(update.losses),
      "train_loss_max": jnp.max(update.losses),
      "lambda_max": jnp.max(lam),
      "lambda_min": jnp.min(lam),
    }
    return AFLState(params, avg, lam, state.round + 1), metrics

  client_models = (lambda st: st.params_avg) if return_average else (lambda st: st.params)
  config = {**settings._asdict(), "psi": psi, "return_average": return_average}
  return Algorithm("afl", model, init, round_fn, client_models, hparam_specs, False, config)
