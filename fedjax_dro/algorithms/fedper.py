"""FedPer: federated averaging of the base layers, the personalization layers kept local.

M. G. Arivazhagan, V. Aggarwal, A. K. Singh and S. Choudhary, "Federated Learning with
Personalization Layers", 2019 (arXiv:1912.00818): the base layers are trained by federated
averaging, the personalization layers (the top of the network) by each client alone, and each
client is evaluated with its own personalization layers.

The personalization layers are, by default, the model's output layer (an entry of its trainable
parameters named like the zoo's heads, ``fc``, ``classifier``..., or Flax's last ``Dense_k``:
:func:`~fedjax_dro.core.model_state.last_layer`); ``head=`` a regular expression over the leaf
paths (``params/fc/kernel``) names others. The mechanics are FedAvg's over
a partition (:mod:`fedjax_dro.core.partitioned`); the base layers' batch statistics follow
``model_state``.
"""

from __future__ import annotations

from fedjax_dro.algorithms.base import Algorithm, build_partitioned, register, with_settings
from fedjax_dro.core.model_state import default_partition, described, state_leaves
from fedjax_dro.core.settings import LOCAL_TRAINING, CommonSettings


@register("fedper", family="personalized")
@with_settings((*LOCAL_TRAINING, "weighting"))
def fedper(model, settings: CommonSettings, *, head=None) -> Algorithm:
  """FedPer (Arivazhagan et al. 2019): FedAvg of the base layers, each client's head local.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` trained.
    head: a regular expression searched in each leaf's path (keys joined by ``/``) naming the
      personalization layers, or a predicate on the path; None (default): the output layer.
    model_state: what the base layers' batch statistics do: ``"average"`` (default),
      ``"local"`` (kept by each client with its head) or ``"frozen"``.

  Returns:
    A personalized :class:`~fedjax_dro.algorithms.base.Algorithm`: the state is the global
    model, each client's local leaves ``[n, ...]`` and a round counter. Hyper-parameters:
    ``client_lr`` (default 0.1) and ``server_lr`` (default 1.0).
  """

  def mask_of(params):
    mask = default_partition("head", model, params, head)
    if settings.model_state == "local" and model.state_keys:
      mask = tuple(a or b for a, b in zip(mask, state_leaves(model, params)))
    return mask

  return build_partitioned(
    "fedper",
    model,
    settings,
    mask_of,
    model_states=("average", "local", "frozen"),
    head=described(head),
  )
