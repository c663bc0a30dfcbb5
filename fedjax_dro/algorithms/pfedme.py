"""pFedMe: personalized federated learning with Moreau envelopes.

T. Dinh, N. Tran, T. Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS
2020 (arXiv:2006.08848), Algorithm 1. Client ``i`` keeps a personalized model ``theta_i``
regularised towards its local copy ``w_i`` of the global model by ``lambda/2 ||theta_i -
w_i||^2``. Round ``t``: the server sends ``w^t`` to all clients; every client ``i`` runs, from
``w_{i,0} = w^t`` and ``theta = w^t``, for ``r = 0..R-1`` (``R = local_steps``), on a fresh
minibatch ``D_{i,r}``:

    theta <- theta - personal_lr (grad f_i(theta; D_{i,r}) + lambda (theta - w_{i,r}))   (K times)
    w_{i,r+1} = w_{i,r} - eta lambda (w_{i,r} - theta)

(the K inner steps approximately solve the Moreau-envelope problem
``theta_i(w_{i,r}) = argmin_theta f_i(theta; D_{i,r}) + lambda/2 ||theta - w_{i,r}||^2``;
``K = personal_steps``). The server then samples a subset ``S`` of ``s = clients_per_round``
clients and moves

    w^{t+1} = (1 - beta) w^t + beta sum_{i in S} p_i w_{i,R},     sum_{i in S} p_i = 1

with ``p_i = 1/s`` in the paper (``weighting="uniform"``).

Hyper-parameters: ``lam`` (lambda), ``client_lr`` (eta, the step of the local copy ``w_i``; named
like every other algorithm's local step size), ``personal_lr`` and ``beta``.

Settings beside those of every algorithm:

* ``personal_updates="all"`` (default, the paper's Algorithm 1): every client runs the local loop
  every round, so every ``theta_i`` is updated every round, and only the sampled ``S`` are
  aggregated. A round costs ``n`` clients' local loops whatever ``s`` is, and reads every client's
  data (host-resident data is gathered whole every round).
  ``personal_updates="participants"``: only the sampled ``S`` run the local loop; the other
  clients keep their last ``theta_i`` (the cheaper variant: ``s`` local loops per round). The
  global model is the same in distribution (the non-sampled ``w_{i,R}`` are discarded in both),
  the personalized models are not. With full participation the two are the same computation
  (identical results, tested).
* ``weighting="uniform"`` (default): ``p_i = 1/s``, the paper's server average (the library
  follows each personalized baseline's paper, as IFCA does; Ditto's global model is FedAvg's and
  weights by sample counts). ``weighting="num_examples"``: ``p_i = N_i / sum_{j in S} N_j``,
  proportional to the participants' sample counts and normalised over ``S`` (the aggregation of
  the authors' code, ``persionalized_aggregate_parameters``).

Readings where the paper is silent or ambiguous (each reproduced by the numpy loop in
``tests/algorithms/test_personalized_baselines.py``):

* The inner solver is ``K`` plain gradient steps on ``h_i(theta) = f_i(theta; D) + lambda/2
  ||theta - w_{i,r}||^2``, all on the same minibatch ``D_{i,r}`` (one minibatch per local step
  ``r``), warm-started from the previous ``theta``; ``theta`` starts each round at the received
  ``w^t``. This is the authors' implementation (``pFedMeOptimizer``, ``UserpFedMe.train``).
* The personalized model of client ``i`` (``client_models``) is its last ``theta_i``: after every
  round for ``"all"``; for ``"participants"`` the ``theta_i`` of the last round it took part in
  (the initial model before that).
* Key schedule. Round key ``k`` -> ``sample_key, local_key = split(k)``; the participants are
  ``S = sample_clients(sample_key, n, s)`` in both modes (the same clients as every FedAvg-style
  algorithm). ``"participants"``: the schedule of :func:`fedjax_dro.core.local.local_round`,
  participant ``S[j]`` gets ``split(local_key, s)[j]``. ``"all"``: every client ``i`` gets
  ``split(local_key, n)[i]`` (the same schedule with all ``n`` clients taking part, run by
  :func:`fedjax_dro.core.local.stateful_local_round`). Each client splits its key into one key
  per local step, ``split(client_key, R)``, and draws step ``r``'s minibatch rows with it
  (``batch_size=None``: the full local data); the ``K`` inner steps reuse step ``r``'s minibatch
  (the ``batch_step`` form of ``stateful_local_round``). With full participation ``S = arange(n)``
  and the two schedules coincide.

Round metrics: ``train_loss`` / ``train_loss_max``, the unweighted mean and the max over the
participants ``S`` of the first local minibatch loss ``f_i(w^t; D_{i,0})`` (in both modes: the
clients outside ``S`` also train under ``"all"`` but are not counted).

Persistent per-client state: ``personal`` ``[n, ...]`` (``theta_i``, params-shaped rows).

Private form (:func:`fedjax_dro.privacy.private`): the drawn clients (Poisson or the fixed-size
sample, in place of ``S``) release ``w_{i,R} - w^t``, clipped to the clip norm; the server forms
``w^t`` plus the noised sum over the expected participants and takes its ``beta`` step from
that. The personalized models ``theta_i`` never leave the clients: under ``"all"`` every client
still trains and updates its own every round, under ``"participants"`` the drawn ones do.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import (
  Algorithm,
  HParam,
  build_personalized,
  register,
  with_settings,
)
from fedjax_dro.common.checks import integer
from fedjax_dro.core.aggregation import (
  gather_rows,
  scatter_rows,
  tree_add,
  tree_stack,
  tree_sub,
)
from fedjax_dro.core.costs import Costs, local_training_cost, parameter_count
from fedjax_dro.core.local import StatefulRound, stateful_local_round, stateful_round_metrics
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.settings import (
  LOCAL_TRAINING,
  CommonSettings,
  aggregation_weights,
  participants,
  round_zero,
  state_init,
)

PERSONAL_UPDATES = ("all", "participants")

RELEASES = Releases(
  "each drawn participant's global-model delta w_{i,R} - w^t; the server reads the noised sum "
  "of the clipped updates over the expected participants and takes its beta step from it; the "
  "personalized models theta_i never leave the clients (under personal_updates='all' every "
  "client still updates its own every round)"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""


class PFedMeState(NamedTuple):
  params: Any  # w, the global model (params-shaped)
  personal: Any  # [n, ...] theta_i, each client's last personalized model
  round: jnp.ndarray  # [] int32 rounds done


HPARAMS = {
  "lam": HParam(15.0, "Moreau-envelope regularisation lambda (larger = closer to the global)"),
  "client_lr": HParam(0.005, "step size eta of the local copy w_i"),
  "personal_lr": HParam(0.1, "step size of the K inner steps on theta_i"),
  "beta": HParam(1.0, "server step beta: w <- (1 - beta) w + beta sum_S p_i w_i"),
}


def _check_personal_updates(value):
  if not isinstance(value, str):
    raise TypeError(
      f"personal_updates must be a string, one of {PERSONAL_UPDATES}, got "
      f"{type(value).__name__} {value!r}"
    )
  if value not in PERSONAL_UPDATES:
    raise ValueError(
      f"personal_updates must be 'all' (every client updates its personalized model every "
      f"round, the paper's Algorithm 1) or 'participants' (only the sampled clients train), "
      f"got {value!r}"
    )


@register("pfedme", family="personalized")
@with_settings(
  (*LOCAL_TRAINING, "weighting"),
  defaults={"local_steps": 20, "batch_size": 20, "weighting": "uniform"},
)
def pfedme(
  model, settings: CommonSettings, *, personal_steps=5, personal_updates="all"
) -> Algorithm:
  """pFedMe (Dinh 2020): Moreau-envelope personalized models, K inner steps per local step.

  pFedMe (Algorithm 1); the defaults R = 20, K = 5, ``|D| = 20`` are the paper's.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of ``w`` and of every ``theta_i``.
    clients_per_round: the sampled clients ``S`` aggregated each round (uniform, without
      replacement); ``None`` (default): all.
    local_steps: ``R``, the local steps on ``w_i`` per round (default 20).
    personal_steps: ``K``, the inner gradient steps on ``theta_i`` per local step (default 5).
    batch_size: ``|D|``, the examples of a local minibatch (default 20); ``None``: full batches.
    personal_updates: ``"all"`` (default: every client trains and updates its ``theta_i`` every
      round, only the sampled clients are aggregated: the paper's Algorithm 1) or
      ``"participants"`` (only the sampled clients train).
    weighting: ``"uniform"`` (default, the paper's server average) or ``"num_examples"`` (the
      participants weighted by their sample counts).

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``lam`` (the Moreau-
    envelope regularisation lambda, default 15; larger keeps the personalized models closer to the
    global one), ``client_lr`` (the step eta of the local copy ``w_i``, default 0.005),
    ``personal_lr`` (the step of the K inner steps on ``theta_i``, default 0.1) and ``beta`` (the
    server step, default 1.0: plain averaging). A round costs ``R K`` gradients on the critical
    path and ``R K`` per trained client (every client under ``"all"``); the ``s`` sampled clients
    upload ``P`` floats each (``P`` parameters).
  """
  integer(personal_steps, "personal_steps")
  _check_personal_updates(personal_updates)
  # "all": the local loop runs on every client (the same settings with full participation)
  trained = settings._replace(clients_per_round=None) if personal_updates == "all" else settings

  init = state_init(settings, lambda p, n: PFedMeState(p, tree_stack(p, n), round_zero()))

  def round_fn(state, data, key, hparams, release=PLAIN):
    lam, eta, plr = hparams["lam"], hparams["client_lr"], hparams["personal_lr"]
    n = data.num_clients
    s = participants(settings, n)

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

    if personal_updates == "participants":
      # the participants (the round's draw) train and send their w_{i,R}
      update = stateful_local_round(
        model, settings, data, key, start=start, batch_step=batch_step, release=release
      )
      theta = update.carries["theta"]
      personal = theta if s == n else scatter_rows(state.personal, update.idx, theta)
      sent, models = update, update.carries["params"]
    else:
      # "all": every client trains on the client (nothing of it leaves), and the server
      # aggregates the clients S drawn with the round's sample key (that of local_round)
      update = stateful_local_round(
        model, trained, data, key, start=start, batch_step=batch_step, release=release.plain
      )
      draw = release.draw(jax.random.split(key)[0], n, s)
      personal = update.carries["theta"]
      if s == n and draw.present is None:  # every client, in order: nothing to gather
        sent = update._replace(metrics=draw.metrics)
        models = update.carries["params"]
      else:
        rows = draw.rows
        nex = update.num_examples[rows]
        sent = StatefulRound(draw.idx, {}, update.losses[rows], nex, draw.present, draw.metrics)
        models = gather_rows(update.carries["params"], rows)
    weights = aggregation_weights(settings, sent.num_examples)
    average, released = release.model_mean(models, state.params, weights, sent.present, n, key)
    params = tree_add(state.params, tree_sub(average, state.params), hparams["beta"])
    new_state = PFedMeState(params, personal, state.round + 1)
    return new_state, {**stateful_round_metrics(sent), **released}

  def cost(data):
    # the trained clients (all n under "all") take K gradients, in sequence, per local step;
    # only the s sampled clients upload their w_{i,R}
    p = parameter_count(model)
    work = local_training_cost(trained, data, p, grads_per_step=personal_steps)
    sent = local_training_cost(settings, data, p)
    return Costs(
      sent._replace(
        gradient_evaluations=work.gradient_evaluations,
        sequential_steps=personal_steps * work.sequential_steps,
      )
    )

  config = {"personal_steps": personal_steps, "personal_updates": personal_updates}
  return build_personalized(
    "pfedme", model, settings, init, round_fn, HPARAMS, cost=cost, releases=RELEASES, **config
  )
