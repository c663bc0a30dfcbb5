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

import numpy as np

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.fedopt import adaptive_fedopt, fedopt_hparams
from fedjax_dro.core.model_state import AVERAGED
from fedjax_dro.core.release import Releases
from fedjax_dro.core.settings import LOCAL_TRAINING, CommonSettings

SERVER_UPDATES = {
  False: "Reddi et al. Algorithm 2, no bias correction: x += eta m / (sqrt(v) + tau)",
  True: "bias-corrected (Adam): x += eta (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + tau)",
}


RELEASES = Releases(
  "each participant's model delta; Adam's moments are computed on the server from "
  "the noised sum of the clipped updates over the expected participants (post-processing)"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = fedopt_hparams(
  beta2=HParam(0.99, "second-moment decay beta2", strict=False, maximum=1.0),
  tau_doc="adaptivity tau of Reddi et al. (Adam epsilon)",
)


@register("fedadam")
@with_settings((*LOCAL_TRAINING, "weighting"))
def fedadam(
  model, settings: CommonSettings, *, bias_correction: bool = False, initial_v: float = 0.0
) -> Algorithm:
  """FedAdam (Reddi 2021, Alg. 2): Adam-type server step on the averaged update, no bias correction.

  The server keeps Adam-type moments of the averaged client update (the module docstring gives
  both update forms).

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of the server model ``x``.
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
  init, round_fn, cost, config = adaptive_fedopt(
    "fedadam",
    "adam",
    model,
    settings,
    server_update=SERVER_UPDATES[bias_correction],
    bias_correction=bias_correction,
    initial_v=initial_v,
  )
  return build_algorithm(
    "fedadam",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    **config,
    model_states=AVERAGED,
  )
