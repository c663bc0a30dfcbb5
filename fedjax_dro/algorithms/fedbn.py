"""FedBN: federated averaging with the normalization layers kept local.

X. Li, M. Jiang, X. Zhang, M. Kamp and Q. Dou, "FedBN: Federated Learning on Non-IID Features
via Local Batch Normalization", ICLR 2021 (arXiv:2102.07623), Algorithm 1: the clients train
from the server's model with their own batch-normalization layers, the server averages every
other parameter (weighted by sample counts) and never receives the normalization layers; each
client is evaluated with its own normalization layers.

The local leaves are, by default, the model's batch statistics and the parameters (scale,
bias) of every layer that holds them; ``local=`` a regular expression over the leaf paths
(``params/bn1/scale``) names others (a GroupNorm or LayerNorm model's normalization layers).
The mechanics are FedAvg's over a partition (:mod:`fedjax_dro.core.partitioned`).
"""

from __future__ import annotations

from fedjax_dro.algorithms.base import Algorithm, build_partitioned, register, with_settings
from fedjax_dro.core.model_state import default_partition, described
from fedjax_dro.core.settings import LOCAL_TRAINING, CommonSettings


@register("fedbn", family="personalized")
@with_settings((*LOCAL_TRAINING, "weighting"), defaults={"model_state": "local"})
def fedbn(model, settings: CommonSettings, *, local=None) -> Algorithm:
  """FedBN (Li et al. 2021): FedAvg with each client's normalization layers kept local.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` trained (with batch statistics, or with
      ``local`` naming its normalization layers).
    local: a regular expression searched in each leaf's path (keys joined by ``/``) naming the
      leaves each client keeps, or a predicate on the path; None (default): the batch
      statistics and the parameters of the layers that hold them.
    model_state: ``"local"`` (default, FedBN's) or ``"frozen"``.

  Returns:
    A personalized :class:`~fedjax_dro.algorithms.base.Algorithm`: the state is the global
    model, each client's local leaves ``[n, ...]`` and a round counter; each client's model is
    the shared leaves with its own local ones. Hyper-parameters: ``client_lr`` (default 0.1) and
    ``server_lr`` (default 1.0; 1 is plain averaging of the shared leaves).
  """
  return build_partitioned(
    "fedbn",
    model,
    settings,
    lambda p: default_partition("norm", model, p, local),
    model_states=("local", "frozen"),
    local=described(local),
  )
