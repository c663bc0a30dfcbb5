"""The round of the adaptive FedOpt algorithms (FedAdagrad, FedAdam, FedYogi).

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021 (arXiv:2003.00295), Algorithm 2: local SGD from the server model, the
weighted mean of the participants' model differences ``Delta_t``, then the server's adaptive
step with the second moment of ``kind`` (:func:`fedjax_dro.core.server.adaptive_step`). The three
algorithms of :mod:`fedjax_dro.algorithms` differ only in ``kind``, their second moment's
hyper-parameter (:func:`fedopt_hparams`) and the words of their ``Algorithm.config``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_dro.common.checks import is_real
from fedjax_dro.core.aggregation import tree_zeros_like
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.hparams import HParam
from fedjax_dro.core.local import local_round, round_metrics
from fedjax_dro.core.model_state import averaged_state
from fedjax_dro.core.release import PLAIN
from fedjax_dro.core.server import adaptive_step
from fedjax_dro.core.settings import round_zero, state_init


def fedopt_hparams(
  beta2: Optional[HParam] = None, tau_doc: str = "adaptivity tau of Reddi et al."
) -> Dict[str, HParam]:
  """The hyper-parameters of Algorithm 2: ``client_lr`` (``eta_l``), ``server_lr`` (``eta``),
  ``beta1``, the second moment's ``beta2`` if given (Adam, Yogi) and ``tau`` (documented
  ``tau_doc``), with the defaults of the paper's experiments."""
  second = {} if beta2 is None else {"beta2": beta2}
  return {
    "client_lr": HParam(0.1, "local SGD step size"),
    "server_lr": HParam(0.01, "server step size eta"),
    "beta1": HParam(0.9, "first-moment decay beta1", strict=False, maximum=1.0),
    **second,
    "tau": HParam(1e-3, tau_doc),
  }


class FedAdamState(NamedTuple):
  params: Any  # global model x_t
  m: Any  # params-shaped first moment m_t of the pseudo-gradient Delta_t
  v: Any  # params-shaped second moment v_t (elementwise Delta_t^2 average)
  round: jnp.ndarray  # [] int32 rounds done (t of the next bias correction is round + 1)


def initial_state(params, num_clients, initial_v=0.0):
  """``x_0 = params``, ``m_0 = 0``, ``v_0 = initial_v`` (default 0)."""
  v = jax.tree.map(lambda a: jnp.full_like(a, initial_v), params)
  return FedAdamState(params, tree_zeros_like(params), v, round_zero())


class AdaptiveFedOpt(NamedTuple):
  """What :func:`adaptive_fedopt` builds for :func:`~fedjax_dro.algorithms.base.build_algorithm`,
  with the ``Algorithm.config`` entries of the options and of the server's update in words."""

  init: Callable
  round: Callable
  cost: Callable
  config: dict


def adaptive_fedopt(
  name, kind, model, settings, *, server_update, bias_correction=False, initial_v=0.0
):
  """The FedOpt algorithm ``name`` of Algorithm 2 with the second moment of ``kind``: local SGD,
  the weighted mean difference, the server's adaptive step (``server_update``: its formula in
  words, for ``Algorithm.config``). The round reads ``client_lr``, ``server_lr``, ``beta1``,
  ``tau`` and (Adam, Yogi) ``beta2`` from its hyper-parameters (:func:`fedopt_hparams`)."""
  if not is_real(initial_v) or initial_v < 0:
    raise ValueError(f"{name}: initial_v must be a number >= 0 (v_-1), got {initial_v!r}")
  initial_v = float(initial_v)

  def round_fn(state, data, key, hparams, release=PLAIN):
    eta_l, eta = hparams["client_lr"], hparams["server_lr"]
    update = local_round(
      model, settings, state.params, data, key, eta_l, mean_only=True, release=release
    )
    b1, tau = hparams["beta1"], hparams["tau"]
    b2 = hparams.get("beta2", 0.0)
    t = (state.round + 1).astype(jnp.result_type(b1)) if bias_correction else None
    m, v, step = adaptive_step(kind, state.m, state.v, update.deltas, b1=b1, b2=b2, tau=tau, t=t)
    params = jax.tree.map(lambda x, s: (x + eta * s).astype(x.dtype), state.params, step)
    params = averaged_state(model, params, state.params, update.deltas)
    return FedAdamState(params, m, v, state.round + 1), round_metrics(update)

  return AdaptiveFedOpt(
    state_init(settings, lambda params, n: initial_state(params, n, initial_v)),
    round_fn,
    local_training_costs(model, settings),
    {"bias_correction": bias_correction, "initial_v": initial_v, "server_update": server_update},
  )
