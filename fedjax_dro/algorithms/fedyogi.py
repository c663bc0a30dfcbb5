"""FedYogi: a Yogi-type server step on the averaged client update.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021 (arXiv:2003.00295), Algorithm 2 (FedYogi): FedAdam's update with Yogi's
additive second moment, which moves ``v`` towards ``Delta_t^2`` by ``(1 - beta2) Delta_t^2`` at
most, so a large difference cannot shrink the step as fast as Adam's. Round ``t``, with
``Delta_t`` the weighted mean of the participants' model differences after ``K = local_steps``
local SGD steps of size ``eta_l = client_lr`` (``m_{-1} = 0``, ``v_{-1} = initial_v``)::

    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t     = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)   (elementwise)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)                           (eta = server_lr)

The same machinery as :func:`~fedjax_dro.algorithms.fedadam.fedadam`
(:mod:`fedjax_dro.core.fedopt`); ``fedavg(server_optimizer=reddi_optimizer("yogi"))`` computes
the same iterates (tested). Readings as FedAdam's: ``tau`` outside the root, no bias correction,
weights ``p_i`` by ``weighting`` (the paper's plain mean is ``"uniform"``), defaults ``beta1 =
0.9``, ``beta2 = 0.99``, ``tau = 1e-3`` (the paper's experiments' decays), ``initial_v = 0``
(Algorithm 2's analysis asks for ``v_{-1} >= tau^2``: ``initial_v=tau**2``).
"""

from __future__ import annotations

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.fedopt import adaptive_fedopt, fedopt_hparams
from fedjax_dro.core.model_state import AVERAGED
from fedjax_dro.core.release import Releases
from fedjax_dro.core.settings import LOCAL_TRAINING, CommonSettings

RELEASES = Releases("as fedadam (Yogi's moments, on the server)")
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = fedopt_hparams(
  beta2=HParam(
    0.99, "second-moment rate beta2 (v moves by (1 - beta2) Delta^2)", strict=False, maximum=1.0
  )
)

SERVER_UPDATE = (
  "Reddi et al. Algorithm 2 (Yogi): v -= (1 - beta2) D^2 sign(v - D^2); "
  "x += eta m / (sqrt(v) + tau)"
)


@register("fedyogi")
@with_settings((*LOCAL_TRAINING, "weighting"))
def fedyogi(model, settings: CommonSettings, *, initial_v: float = 0.0) -> Algorithm:
  """FedYogi (Reddi 2021, Alg. 2): Yogi-type server step on the averaged update.

  FedAdam's step with Yogi's additive second moment, which moves towards ``Delta_t^2`` by at most
  ``(1 - beta2) Delta_t^2`` a round.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of the server model ``x``.
    initial_v: ``v_{-1}``, the second moment before the first round (default 0).

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (default
    0.1), ``server_lr`` (eta, default 0.01), ``beta1``, ``beta2`` (defaults 0.9, 0.99) and
    ``tau`` (default 1e-3).
  """
  init, round_fn, cost, config = adaptive_fedopt(
    "fedyogi", "yogi", model, settings, server_update=SERVER_UPDATE, initial_v=initial_v
  )
  return build_algorithm(
    "fedyogi",
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
