"""Ditto: fair and robust federated learning through personalization.

T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, arXiv:2012.04221, Algorithm 1. The global model ``w`` is trained by
FedAvg; every client also keeps a personal model ``v_i`` solving
``min_v f_i(v) + lam/2 ||v - w*||^2``. Round ``t``, every participant ``i in S_t`` receives
``w^t`` and

    w_i <- w_i - client_lr grad f_i(w_i)                   (local_steps steps from w_i = w^t)
    v_i <- v_i - personal_lr (grad f_i(v_i) + lam (v_i - w^t))        (personal_steps steps)

and the server averages the global updates, ``w^{t+1} = w^t + sum_{i in S_t} p_i (w_i - w^t)``.

Readings where the paper leaves a choice (each reproduced by the numpy loop in
``tests/algorithms/test_personalized_baselines.py``):

* The proximal term pulls towards the global model received this round, ``w^t``, held fixed
  during the personal steps (Algorithm 1; the authors' code does the same).
* The personal steps use the same minibatches as the global steps (the authors' code draws one
  batch per local iteration and takes both steps on it): both passes run on
  :func:`fedjax_dro.core.local.local_round` with the round key, hence the same participants,
  per-client and per-step keys. With ``personal_steps != local_steps`` the personal pass has its
  own ``personal_steps`` step keys split from the same per-client key.
* The global update is FedAvg's: the participants' model differences averaged with weights
  ``p_i`` proportional to their sample counts (``weighting="num_examples"``, McMahan's FedAvg;
  ``"uniform"`` for the plain mean), server step 1.
* Personal models start at the initial global model; non-participants keep theirs. The
  personalized output (``client_models``) is ``v_i``.

Round metrics: ``train_loss`` / ``train_loss_max`` (global model) and ``personal_loss`` /
``personal_loss_max`` (personal models), each on the participants' first local minibatch.

Persistent per-client state: ``personal`` ``[n, ...]`` (``v_i``, params-shaped rows).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import (
  Algorithm,
  HParam,
  build_personalized,
  register,
  with_settings,
)
from fedjax_dro.common.checks import is_int
from fedjax_dro.core.aggregation import tree_add, tree_stack
from fedjax_dro.core.costs import Costs, local_training_cost, parameter_count
from fedjax_dro.core.local import local_round, round_metrics
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.settings import LOCAL_TRAINING, CommonSettings, round_zero, state_init


class DittoState(NamedTuple):
  params: Any  # w, the global model (params-shaped)
  personal: Any  # [n, ...] v_i, each client's personal model
  round: jnp.ndarray  # [] int32 rounds done


RELEASES = Releases(
  "each participant's global-model delta; the personal models never leave the clients"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {
  "client_lr": HParam(0.1, "local SGD step size of the global model"),
  "personal_lr": HParam(0.1, "step size of the personal model v_i"),
  "lam": HParam(0.1, "pull lam of v_i towards the global model (0 = local training)", strict=False),
}


@register("ditto", family="personalized")
@with_settings((*LOCAL_TRAINING, "weighting"))
def ditto(model, settings: CommonSettings, *, personal_steps: Optional[int] = None) -> Algorithm:
  """Ditto (Li 2021): FedAvg global model plus personal models pulled towards it by lam.

  Ditto's Algorithm 1: the global model follows FedAvg; each participant's personal model takes
  ``personal_steps`` steps on its loss plus ``lam/2 ||v - w||^2``.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of ``w`` and of every ``v_i``.
    clients_per_round: the participants ``S_t`` (uniform, without replacement); ``None``
      (default): every client, every round.
    local_steps: SGD steps on the global model per participant and round (default 10).
    personal_steps: SGD steps on the personal model per participant and round (minibatches
      drawn with replacement); ``None`` (default): the global pass's local work, ``local_steps``
      steps or, with ``local_epochs``, the same passes over the same minibatches.
    batch_size: examples per step, shared by the two passes; ``None`` (default): full batches.
    weighting: the weights ``p_i`` of the global update: ``"num_examples"`` (default, sample
      counts) or ``"uniform"``.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr`` (the SGD
    step of the global model, default 0.1), ``personal_lr`` (the step of the personal models
    ``v_i``, default 0.1) and ``lam`` (the pull of ``v_i`` towards the global model, ``>= 0``,
    default 0.1; 0 is local training). A participant takes both passes' gradients (two per
    step by default) and uploads its ``P`` global-model floats; the passes are independent, so
    the critical path is the longer one (``local_steps``, not twice it).
  """
  if personal_steps is not None and (not is_int(personal_steps) or personal_steps < 1):
    raise ValueError(f"personal_steps must be a positive integer or None, got {personal_steps!r}")
  # None: the personal pass repeats the global pass's local work (steps or epochs)
  steps = personal_steps

  init = state_init(settings, lambda p, n: DittoState(p, tree_stack(p, n), round_zero()))

  def round_fn(state, data, key, hparams, release=PLAIN):
    lam, lr = hparams["lam"], hparams["client_lr"]
    update = local_round(
      model, settings, state.params, data, key, lr, mean_only=True, release=release
    )

    def prox(v, g, row):
      del row
      return jax.tree.map(lambda gi, vi, wi: gi + lam * (vi - wi), g, v, state.params)

    personal = local_round(
      model,
      settings,
      None,
      data,
      key,  # the same key: the same participants and minibatches as the global pass
      hparams["personal_lr"],
      client_params=state.personal,
      grad_transform=prox,
      num_steps=steps,
      # v_i + delta_i written back inside each participant's update: no stacked deltas
      client_state=state.personal,
      state_update=lambda v, d: jax.tree.map(jnp.add, v, d),
      mean_only=True,
      release=release,  # the same draw; nothing of this pass leaves the clients
    )
    metrics = round_metrics(update)
    personal_metrics = round_metrics(personal)
    metrics["personal_loss"] = personal_metrics["train_loss"]
    metrics["personal_loss_max"] = personal_metrics["train_loss_max"]
    new_state = DittoState(
      tree_add(state.params, update.deltas),
      personal.client_state,
      state.round + 1,
    )
    return new_state, metrics

  # the personal pass: personal_steps minibatch steps, or the global pass's local work
  personal_settings = settings._replace(local_steps=steps, local_epochs=None) if steps else settings

  def cost(data):
    # both passes' gradients; the two chains (from w^t and from v_i) are independent, so the
    # critical path is the longer one; only the global delta is uploaded
    glob = local_training_cost(settings, data, parameter_count(model))
    personal = local_training_cost(personal_settings, data, 0)
    return Costs(
      glob._replace(
        gradient_evaluations=glob.gradient_evaluations + personal.gradient_evaluations,
        sequential_steps=max(glob.sequential_steps, personal.sequential_steps),
      )
    )

  config = {"personal_steps": steps if steps is not None else settings.local_steps}
  return build_personalized(
    "ditto", model, settings, init, round_fn, HPARAMS, cost=cost, releases=RELEASES, **config
  )
