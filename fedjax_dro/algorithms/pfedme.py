"""pFedMe: personalized federated learning with Moreau envelopes.

T. Dinh, N. Tran, T. Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS
2020, Algorithm 1. Client ``i`` keeps a personalized model ``theta_i`` regularised towards its
local copy ``w_i`` of the global model by ``lambda/2 ||theta_i - w_i||^2``. Round ``t``, on every
participant ``i``, from ``w_{i,0} = w^t`` and ``theta = w^t``, for ``r = 0..R-1``
(``R = local_steps``), on a fresh minibatch ``D_{i,r}``:

    theta <- theta - personal_lr (grad f_i(theta; D_{i,r}) + lambda (theta - w_{i,r}))   (K times)
    w_{i,r+1} = w_{i,r} - eta lambda (w_{i,r} - theta)

(the K inner steps approximately solve the Moreau-envelope problem
``theta_i(w_{i,r}) = argmin_theta f_i(theta; D_{i,r}) + lambda/2 ||theta - w_{i,r}||^2``;
``K = personal_steps``). The server then moves

    w^{t+1} = (1 - beta) w^t + beta mean_{i in S} w_{i,R}.

Hyper-parameters: ``lam`` (lambda), ``client_lr`` (eta, the step of the local copy ``w_i``; named
like every other algorithm's local step size), ``personal_lr`` and ``beta``.

Readings where the paper is silent or ambiguous (each reproduced by the numpy loop in
``tests/algorithms/test_personalized_baselines.py``):

* The inner solver is ``K`` plain gradient steps on ``h_i(theta) = f_i(theta; D) + lambda/2
  ||theta - w_{i,r}||^2``, all on the same minibatch ``D_{i,r}`` (one minibatch per local step
  ``r``), warm-started from the previous ``theta``; ``theta`` starts each round at the received
  ``w^t``. This is the authors' implementation (``pFedMeOptimizer``, ``UserpFedMe.train``).
* Only the round's participants train. The paper lets every client run the local loop and the
  server aggregate a sampled subset; the global model is the same in distribution (non-sampled
  clients' ``w_{i,R}`` are discarded), and non-participants keep their last ``theta_i``.
* The server average is unweighted over the participants (``sum_{i in S} w_{i,R} / S``), as in
  the paper.
* The personalized model of client ``i`` (``client_models``) is its last ``theta_i``; before a
  client first takes part it is the initial model.
* Minibatches, participants and per-client keys follow the key schedule of
  :func:`fedjax_dro.core.local.local_round`: participants ``sample_clients(sample_key, n, s)``,
  per-client keys ``split(local_key, s)``, one key per local step ``split(client_key, R)``, and the
  minibatch rows of step ``r`` drawn with that step's key (``batch_size=None``: the full local
  data). The ``K`` inner steps reuse step ``r``'s minibatch (the ``batch_step`` form of
  :func:`fedjax_dro.core.local.stateful_local_round`).

Persistent per-client state: ``personal`` ``[n, ...]`` (``theta_i``, params-shaped rows).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import (
  Algorithm,
  HParam,
  common_settings,
  participants,
  register,
)
from fedjax_dro.core.aggregation import scatter_rows, tree_add, tree_mean, tree_stack, tree_sub
from fedjax_dro.core.local import stateful_local_round, stateful_round_metrics


class PFedMeState(NamedTuple):
  params: Any  # w, the global model (params-shaped)
  personal: Any  # [n, ...] theta_i, each client's last personalized model
  round: jnp.ndarray  # [] int32 rounds done


HPARAMS = {
  "lam": HParam(15.0, "Moreau-envelope regularisation lambda (larger = closer to the global)"),
  "client_lr": HParam(0.005, "step size eta of the local copy w_i"),
  "personal_lr": HParam(0.1, "step size of the K inner steps on theta_i"),
  "beta": HParam(1.0, "server step beta: w <- (1 - beta) w + beta mean_S w_i"),
}


def _check_steps(value, name):
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")


@register(
  "pfedme",
  "pFedMe (Dinh 2020): Moreau-envelope personalized models, K inner steps per local step",
  family="personalized",
)
def pfedme(
  model,
  *,
  clients_per_round=None,
  local_steps=20,
  personal_steps=5,
  batch_size=20,
  backend="auto",
  chunk_size=None,
) -> Algorithm:
  """pFedMe; ``local_steps`` is R (local steps on ``w_i``), ``personal_steps`` is K (inner
  gradient steps on ``theta_i`` per local step); defaults R = 20, K = 5, ``|D| = 20`` as in the
  paper's experiments."""
  _check_steps(personal_steps, "personal_steps")
  settings = common_settings(
    clients_per_round=clients_per_round,
    local_steps=local_steps,
    batch_size=batch_size,
    backend=backend,
    chunk_size=chunk_size,
    weighting="uniform",
  )

  def init(params, data, key):
    del key
    participants(settings, data.num_clients)
    return PFedMeState(params, tree_stack(params, data.num_clients), jnp.zeros((), jnp.int32))

  def round_fn(state, data, key, hparams):
    lam, eta, plr = hparams["lam"], hparams["client_lr"], hparams["personal_lr"]

    def start(row):
      del row
      return {"params": state.params, "theta": state.params}

    def batch_step(carry, objective):
      w = carry["params"]

      def inner(th, _):
        loss, g = objective(th)
        th = jax.tree.map(
          lambda t, gi, wi: (t - plr * (gi + lam * (t - wi))).astype(t.dtype), th, g, w
        )
        return th, loss

      theta, losses = jax.lax.scan(inner, carry["theta"], None, length=personal_steps)
      w = jax.tree.map(lambda wi, t: (wi - eta * lam * (wi - t)).astype(wi.dtype), w, theta)
      # losses[0] at step 0 is f_i(w^t; D_{i,0}): theta starts the round at the received model
      return {"params": w, "theta": theta}, losses[0]

    update = stateful_local_round(model, settings, data, key, start=start, batch_step=batch_step)
    w_final, theta, idx = update.carries["params"], update.carries["theta"], update.idx
    params = tree_add(state.params, tree_sub(tree_mean(w_final), state.params), hparams["beta"])
    metrics = stateful_round_metrics(update)
    new_state = PFedMeState(params, scatter_rows(state.personal, idx, theta), state.round + 1)
    return new_state, metrics

  config = dict(settings._asdict(), personal_steps=personal_steps)
  return Algorithm("pfedme", model, init, round_fn, lambda s: s.personal, HPARAMS, True, config)
