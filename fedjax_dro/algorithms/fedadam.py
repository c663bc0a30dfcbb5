"""FedAdam: an Adam-type server step on the averaged client update.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021 (arXiv:2003.00295), Algorithm 2 (FedAdam).

Round ``t`` (``S_t`` the ``s`` sampled clients, ``K = local_steps`` SGD steps of size
``eta_l = client_lr`` from ``x_t`` give client ``i`` its model ``x_{i,K}^t``)::

    Delta_i^t = x_{i,K}^t - x_t
    Delta_t   = sum_{i in S_t} p_i Delta_i^t           (p_i: weights below, summing to 1)
    m_t       = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t       = beta2 v_{t-1} + (1 - beta2) Delta_t^2  (elementwise)
    x_{t+1}   = x_t + eta m_t / (sqrt(v_t) + tau)      (eta = server_lr)

with ``m_0 = v_0 = 0``. This is the default (``bias_correction=False``): it is Algorithm 2 as
printed, the form the paper analyses, so a reproduction of the paper runs the paper's method.

``bias_correction=True`` is the Adam form of Kingma and Ba (what ``optax.adam`` does with
``eps = tau``), which earlier versions of this module used::

    x_{t+1} = x_t + eta (m_t / (1 - beta1^t)) / (sqrt(v_t / (1 - beta2^t)) + tau)

The two forms differ most in the first rounds (with the default ``beta2 = 0.99`` the paper's
``sqrt(v_1)`` is ``0.1 |Delta_1|``, so ``tau`` weighs ten times more against it) and approach
each other as ``beta1^t, beta2^t -> 0``; ``tests/algorithms/test_fedadam.py`` checks both against
plain per-client loops and that they differ. ``Algorithm.config`` records ``bias_correction``
and ``server_update`` (the formula in words), so a result states which form produced it.

Readings:

* Weights ``p_i``: the paper writes the plain mean ``1/|S_t|``, which is ``weighting="uniform"``;
  the default ``weighting="num_examples"`` weights by sample counts, as FedAvg and the other
  algorithms of this library do.
* ``tau`` ("adaptivity" in the paper, Adam's epsilon) is added outside the square root.
  Defaults: ``beta1 = 0.9``, ``beta2 = 0.99`` (the paper's experiments), ``tau = 1e-3``.
* The moments and the step keep the dtype of the parameters (float32 master parameters stay
  float32). ``beta1 = 1`` or ``beta2 = 1`` with ``bias_correction=True`` divides by zero; the run's
  non-finite check then stops it at the first round.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.aggregation import tree_zeros_like
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import local_round, round_metrics
from fedjax_dro.core.server import adaptive_step
from fedjax_dro.core.settings import LOCAL_TRAINING, CommonSettings, round_zero, state_init

SERVER_UPDATES = {
  False: "Reddi et al. Algorithm 2, no bias correction: x += eta m / (sqrt(v) + tau)",
  True: "bias-corrected (Adam): x += eta (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + tau)",
}


class FedAdamState(NamedTuple):
  params: Any  # global model x_t
  m: Any  # params-shaped first moment m_t of the pseudo-gradient Delta_t
  v: Any  # params-shaped second moment v_t (elementwise Delta_t^2 average)
  round: jnp.ndarray  # [] int32 rounds done (t of the next bias correction is round + 1)


HPARAMS = {
  "client_lr": HParam(0.1, "local SGD step size"),
  "server_lr": HParam(0.01, "server step size eta"),
  "beta1": HParam(0.9, "first-moment decay beta1", strict=False, maximum=1.0),
  "beta2": HParam(0.99, "second-moment decay beta2", strict=False, maximum=1.0),
  "tau": HParam(1e-3, "adaptivity tau of Reddi et al. (Adam epsilon)"),
}


def initial_state(params, num_clients, initial_v=0.0):
  """``x_0 = params``, ``m_0 = 0``, ``v_0 = initial_v`` (default 0)."""
  v = jax.tree.map(lambda a: jnp.full_like(a, initial_v), params)
  return FedAdamState(params, tree_zeros_like(params), v, round_zero())


@register("fedadam")
@with_settings((*LOCAL_TRAINING, "weighting"))
def fedadam(
  model, settings: CommonSettings, *, bias_correction: bool = False, initial_v: float = 0.0
) -> Algorithm:
  """FedAdam (Reddi 2021, Alg. 2): Adam-type server step on the averaged update, no bias correction.

  The server keeps Adam-type moments of the averaged client update (the module docstring gives
  both update forms).

  Args:
    model: the :class:`~fedjax_dro.models.base.Model` of the server model ``x``.
    clients_per_round: the sampled set ``S_t`` of a round (uniform, without replacement);
      ``None`` (default): all clients.
    local_steps: ``K``, the local SGD steps of a client per round (default 10).
    batch_size: examples in each local SGD step; ``None`` (default): full client data.
    weighting: the weights ``p_i`` of ``Delta_t``: ``"num_examples"`` (default, sample counts)
      or ``"uniform"`` (the paper's plain mean).
    bias_correction: ``False`` (default): the paper's update ``x + eta m / (sqrt(v) + tau)``;
      ``True``: Adam's bias-corrected moments ``m / (1 - beta1^t)``, ``v / (1 - beta2^t)``.
    initial_v: the second moment before the first round, ``v_{-1}`` (default 0; Algorithm 2's
      analysis asks for ``v_{-1} >= tau^2``: :mod:`fedjax_dro.core.server`).

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (the local
    SGD step eta_l, default 0.1), ``server_lr`` (the server step eta, default 0.01), ``beta1`` and
    ``beta2`` (the moment decays in ``[0, 1]``, defaults 0.9 and 0.99) and ``tau`` (the
    adaptivity, Adam's epsilon, default 1e-3).
  """
  if not isinstance(bias_correction, (bool, np.bool_)):
    raise TypeError(
      f"bias_correction must be a bool (False: Reddi et al. Algorithm 2, True: Adam's "
      f"bias-corrected moments), got {bias_correction!r}"
    )
  bias_correction = bool(bias_correction)
  return adaptive_fedopt(
    "fedadam",
    "adam",
    model,
    settings,
    HPARAMS,
    bias_correction=bias_correction,
    initial_v=initial_v,
    server_update=SERVER_UPDATES[bias_correction],
  )


def adaptive_fedopt(
  name, kind, model, settings, hparams, *, bias_correction=False, initial_v=0.0, **config
):
  """The FedOpt algorithm ``name`` of Algorithm 2 with the second moment of ``kind``
  (:func:`fedjax_dro.core.server.adaptive_step`): local SGD, the weighted mean difference, the
  server's adaptive step. ``hparams`` holds ``client_lr``, ``server_lr``, ``beta1``, ``tau`` and
  (Adam, Yogi) ``beta2``; ``config`` is recorded in ``Algorithm.config``."""
  if isinstance(initial_v, bool) or not isinstance(initial_v, (int, float)) or initial_v < 0:
    raise ValueError(f"{name}: initial_v must be a number >= 0 (v_-1), got {initial_v!r}")
  initial_v = float(initial_v)

  def round_fn(state, data, key, hparams):
    update = local_round(
      model, settings, state.params, data, key, hparams["client_lr"], mean_only=True
    )
    b1, tau, lr = hparams["beta1"], hparams["tau"], hparams["server_lr"]
    b2 = hparams.get("beta2", 0.0)
    t = (state.round + 1).astype(jnp.result_type(b1)) if bias_correction else None
    m, v, step = adaptive_step(kind, state.m, state.v, update.deltas, b1=b1, b2=b2, tau=tau, t=t)
    params = jax.tree.map(lambda x, s: (x + lr * s).astype(x.dtype), state.params, step)
    return FedAdamState(params, m, v, state.round + 1), round_metrics(update)

  return build_algorithm(
    name,
    model,
    settings,
    state_init(settings, lambda params, n: initial_state(params, n, initial_v)),
    round_fn,
    hparams,
    cost=local_training_costs(model, settings),
    bias_correction=bias_correction,
    initial_v=initial_v,
    **config,
  )
