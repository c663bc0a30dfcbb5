"""FedAdagrad: an Adagrad-type server step on the averaged client update.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021 (arXiv:2003.00295), Algorithm 2 (FedAdagrad).

Round ``t``, with ``Delta_t`` the weighted mean of the participants' model differences after
``K = local_steps`` local SGD steps of size ``eta_l = client_lr`` (``m_{-1} = 0``,
``v_{-1} = initial_v``)::

    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t     = v_{t-1} + Delta_t^2                    (elementwise)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)      (eta = server_lr)

Algorithm 2 keeps the momentum ``m_t`` for all three methods, so ``beta1`` is a hyper-parameter
here too (default 0.9, as for FedAdam and FedYogi); ``beta1 = 0`` is the momentum-free Adagrad
step (``optax.adagrad``'s form, up to its initial accumulator and ``eps`` inside the root). The
same machinery as :func:`~fedjax_dro.algorithms.fedadam.fedadam` (:mod:`fedjax_dro.core.fedopt`);
``fedavg(server_optimizer=reddi_optimizer("adagrad"))`` computes the same iterates (tested).
``initial_v = 0`` by default (Algorithm 2's analysis asks for ``v_{-1} >= tau^2``:
``initial_v=tau**2``).
"""

from __future__ import annotations

from fedjax_dro.algorithms.base import Algorithm, build_algorithm, register, with_settings
from fedjax_dro.core.fedopt import adaptive_fedopt, fedopt_hparams
from fedjax_dro.core.model_state import AVERAGED
from fedjax_dro.core.release import Releases
from fedjax_dro.core.settings import LOCAL_TRAINING, CommonSettings

RELEASES = Releases("as fedadam (Adagrad's accumulator, on the server)")
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = fedopt_hparams()  # client_lr, server_lr, beta1 and tau: Adagrad has no beta2

SERVER_UPDATE = "Reddi et al. Algorithm 2 (Adagrad): v += D^2; x += eta m / (sqrt(v) + tau)"


@register("fedadagrad")
@with_settings((*LOCAL_TRAINING, "weighting"))
def fedadagrad(model, settings: CommonSettings, *, initial_v: float = 0.0) -> Algorithm:
  """FedAdagrad (Reddi 2021, Alg. 2): Adagrad-type server step on the averaged update.

  The server's second moment accumulates every round's ``Delta_t^2``, so its step along a
  coordinate shrinks with the differences seen there so far.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of the server model ``x``.
    initial_v: ``v_{-1}``, the accumulator before the first round (default 0).

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (default
    0.1), ``server_lr`` (eta, default 0.01), ``beta1`` (default 0.9) and ``tau`` (default 1e-3).
  """
  init, round_fn, cost, config = adaptive_fedopt(
    "fedadagrad", "adagrad", model, settings, server_update=SERVER_UPDATE, initial_v=initial_v
  )
  return build_algorithm(
    "fedadagrad",
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
