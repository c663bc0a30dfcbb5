"""SCAFFOLD, option II: stochastic controlled averaging.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020, arXiv:1910.06378, Algorithm 1 with control-variate option II:

    y <- y - eta_l (g_i(y) - c_i + c)                  (local_steps times, from y = x)
    c_i+ = c_i - c + (x - y) / (J eta_l)
    x <- x + eta_g mean_{i in S}(y_i - x)
    c <- c + (s / n) mean_{i in S}(c_i+ - c_i)

Averages over the participants are unweighted, as in the paper (``weighting="uniform"``, the
default); the fixed point is then the minimizer of the uniform average of the client objectives
(tested on heterogeneous quadratics). ``weighting="num_examples"`` optimizes the sample-weighted
objective ``sum_i p_i f_i``, ``p_i = n_i / sum_j n_j`` (FedAvg's): ``x`` moves by the
``p``-weighted mean of the participants' ``y_i - x`` and the server keeps ``c = sum_i p_i c_i``
exactly, ``c <- c + sum_{i in S} p_i (c_i+ - c_i)`` (with uniform ``p_i = 1 / n`` both updates are
the paper's). Persistent per-client state: ``client_controls`` ``[n, ...]``.

With ``local_epochs`` client ``i`` takes ``K_i = local_epochs * ceil(n_i / batch_size)`` steps
and ``J`` above is its own ``K_i`` (``c_i+`` is still the mean corrected gradient of its steps).

Client-level differential privacy (:func:`fedjax_dro.privacy.private`, :data:`RELEASES`): with ``local_steps`` a participant releases only its model
delta and ``c`` moves by post-processing the private mean; with ``local_epochs`` it releases its
model delta and ``u_i = c_i+ - c_i + c = -delta_i / (K_i eta_l)`` clipped together to ``C`` (the
server adds the public ``-c`` itself), and computes its own ``c_i+`` from its unclipped delta.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, HParam, build_algorithm, register, with_settings
from fedjax_dro.core.aggregation import tree_add, tree_stack, tree_zeros_like
from fedjax_dro.core.costs import local_training_costs
from fedjax_dro.core.local import local_round, round_metrics
from fedjax_dro.core.model_state import AVERAGED, averaged_state
from fedjax_dro.core.release import PLAIN, Releases
from fedjax_dro.core.schedule import local_step_counts
from fedjax_dro.core.server import (
  check_optimizer,
  next_state,
  optimizer_config,
  optimizer_state_init,
  server_move,
)
from fedjax_dro.core.settings import (
  LOCAL_TRAINING,
  CommonSettings,
  aggregation_weights,
  participants,
  round_zero,
)


class ScaffoldState(NamedTuple):
  params: Any  # global model x
  control: Any  # server control variate c (params-shaped)
  client_controls: Any  # [n, ...] client control variates c_i
  round: jnp.ndarray  # [] int32


class ScaffoldOptState(NamedTuple):
  """:class:`ScaffoldState` with a server optimizer's state (``server_optimizer=``)."""

  params: Any  # global model x
  control: Any  # server control variate c (params-shaped)
  client_controls: Any  # [n, ...] client control variates c_i
  opt_state: Any  # the server optimizer's state (an optax state pytree)
  round: jnp.ndarray  # [] int32


RELEASES = Releases(
  "each participant's model delta; with local_steps (J steps each) the server control variate "
  "moves by q (-c - mean delta / (J lr)) from the same private mean (post-processing); with "
  "local_epochs (K_i steps for client i) each participant releases its model delta delta_i and "
  "its control-variate delta less the public c, c_i+ - c_i + c = -delta_i / (K_i lr), clipped "
  "together to C (one vector); the server reads their noised sums over the expected "
  "participants (noise z C on each) and c moves by q (-c + the mean of the second); each "
  "client's own control variate c_i+ (from its unclipped delta) stays on the client"
)
"""What a participant releases (:func:`fedjax_dro.privacy.private`)."""

HPARAMS = {
  "client_lr": HParam(0.1, "local SGD step size eta_l"),
  "server_lr": HParam(1.0, "global step size eta_g"),
}


def initial_state(params, num_clients):
  """``x = params``, all control variates zero."""
  zeros = tree_zeros_like(params)
  return ScaffoldState(params, zeros, tree_stack(zeros, num_clients), round_zero())


@register("scaffold")
@with_settings((*LOCAL_TRAINING, "weighting"), defaults={"weighting": "uniform"})
def scaffold(model, settings: CommonSettings, *, server_optimizer=None) -> Algorithm:
  """SCAFFOLD option II (Karimireddy 2020): control variates correct client drift.

  SCAFFOLD with control-variate option II; unweighted averages by default, as in the paper.

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` of the server model ``x``.
    clients_per_round: the sampled set ``S`` of each round (uniform, without replacement);
      ``None`` (default): every client.
    local_steps: ``K``, the corrected local SGD steps per round (default 10).
    batch_size: examples in each local minibatch; ``None`` (default): full client data.
    weighting: the client weights ``p_i`` of the objective: ``"uniform"`` (default, the paper's
      unweighted averages: the minimizer of the mean of the client objectives) or
      ``"num_examples"`` (``p_i`` proportional to sample counts, the objective FedAvg's weights
      target; see the module docstring for the two server updates).
    server_optimizer: an optax ``GradientTransformation`` in place of the global step ``x +=
      eta_g mean(Delta_i)``, applied to ``-mean(Delta_i)`` and scaled by ``server_lr``
      (:mod:`fedjax_dro.core.server`); the control variates are unchanged. None (default): the
      paper's step.

  Returns:
    An :class:`~fedjax_dro.algorithms.base.Algorithm`. Hyper-parameters: ``client_lr``, the local
    step size eta_l (default 0.1), and ``server_lr``, the global step size eta_g (default 1.0).
    A participant uploads ``2P`` floats (``P`` parameters): its model and control-variate deltas.
  """

  train = functools.partial(local_round, model, settings)

  def round_fn(state, data, key, hparams, release=PLAIN):
    n = data.num_clients
    s = participants(settings, n)
    lr = hparams["client_lr"]
    correct = lambda w, g, c_i: jax.tree.map(lambda gi, ci, c: gi - ci + c, g, c_i, state.control)
    if settings.local_epochs is not None:
      return epochs_round(state, data, key, hparams, correct, release)
    # c_i+ = c_i - c + (x - y_i) / (J eta_l) = c_i - c - delta_i / (J eta_l), computed inside each
    # participant's update; only the mean delta leaves the round (no stacked deltas)
    new_control = lambda c_i, d: jax.tree.map(
      lambda ci, c, di: ci - c - di / (settings.local_steps * lr), c_i, state.control, d
    )
    update = train(
      state.params,
      data,
      key,
      lr,
      client_state=state.client_controls,
      grad_transform=correct,
      state_update=new_control,
      mean_only=True,
      release=release,
    )
    mean_delta = update.deltas  # the participants' p-weighted mean delta
    params, opt_state = server_move(
      server_optimizer, state, state.params, mean_delta, hparams["server_lr"]
    )
    params = averaged_state(model, params, state.params, mean_delta)
    # weighted mean of c_i+ - c_i = -c - delta_i / (J eta_l) over the participants: from the
    # weighted mean delta (a private round: post-processing of the released mean)
    dc = jax.tree.map(lambda c, d: -c - d / (settings.local_steps * lr), state.control, mean_delta)
    control = tree_add(state.control, dc, share(update, data, s / n, release))
    new_state = next_state(state, opt_state, params, control, update.client_state)
    return new_state, round_metrics(update)

  def epochs_round(state, data, key, hparams, correct, release):
    # K_i differs between participants: each computes its own c_i+ from its own (unclipped)
    # delta, and the server reads their deltas (and the control-variate changes) stacked
    n, lr = data.num_clients, hparams["client_lr"]

    def new_control(row, d):  # row: (c_i, n_i); c_i+ with the client's own K_i
      c_i, nex = row
      steps = jnp.maximum(local_step_counts(settings, nex), 1)
      new = jax.tree.map(
        lambda ci, c, di: ci - c - di / (steps * lr).astype(di.dtype), c_i, state.control, d
      )
      return new, nex

    update = train(
      state.params,
      data,
      key,
      lr,
      client_state=(state.client_controls, data.num_examples),
      grad_transform=lambda w, g, row: correct(w, g, row[0]),
      state_update=new_control,
      release=release,
    )
    s = update.idx.shape[0]
    controls = update.client_state[0]
    if release.per_participant:
      # each participant's release processed on its own (private: clipped): it sends delta_i
      # and u_i = c_i+ - c_i + c = -delta_i / (K_i lr) from its released delta (so that a clip of
      # the pair is one clip of delta_i), and the server reads their sums over the expected
      # participants; c moves by -c + the mean of u (post-processing)
      steps = jnp.maximum(local_step_counts(settings, update.num_examples), 1)
      u = jax.tree.map(
        lambda d: -d / (steps.reshape((-1,) + (1,) * (d.ndim - 1)) * lr).astype(d.dtype),
        update.deltas,
      )
      present = release.present(update.weights)
      sent, clipped = release.clip_each((update.deltas, u), present)
      m_inv = release.inverse_rate(n, s) / n  # 1 / m, m the expected participants (q n, or s)
      mean_delta, mean_u = release.sum(sent, update.weights * m_inv, present, m_inv, key)
      dc = jax.tree.map(lambda c, a: a - c, state.control, mean_u)
      metrics = {**round_metrics(update), **clipped}
    else:
      # the paper's: the mean of the deltas and of the control-variate changes c_i+ - c_i
      p = update.weights / jnp.sum(update.weights)  # the participants' p_i, normalized over S
      mean = lambda tree: jax.tree.map(
        lambda a: jnp.tensordot(p.astype(a.dtype), a, axes=1).astype(a.dtype), tree
      )
      if settings.weighting == "uniform":  # the plain mean, as the paper writes it
        mean = lambda tree: jax.tree.map(lambda a: jnp.mean(a, axis=0).astype(a.dtype), tree)
      old = jax.tree.map(lambda a: a[update.idx], state.client_controls)
      new = jax.tree.map(lambda a: a[update.idx], controls)
      mean_delta = mean(update.deltas)
      dc = mean(jax.tree.map(jnp.subtract, new, old))
      metrics = round_metrics(update)
    params, opt_state = server_move(
      server_optimizer, state, state.params, mean_delta, hparams["server_lr"]
    )
    params = averaged_state(model, params, state.params, mean_delta)
    control = tree_add(state.control, dc, share(update, data, s / n, release))
    return next_state(state, opt_state, params, control, controls), metrics

  def share(update, data, uniform_share, release):
    """``sum_{i in S} p_i``, the participants' share of the objective's weights (``s / n``
    uniformly): the step of ``c`` along the participants' weighted mean ``c_i+ - c_i``."""
    if settings.weighting == "uniform":  # q in a private round with Poisson participation
      return release.participation_share(uniform_share)
    total = jnp.sum(aggregation_weights(settings, data.num_examples))
    return jnp.sum(update.weights) / total

  server_optimizer = check_optimizer(server_optimizer, "scaffold")
  init = optimizer_state_init(settings, initial_state, server_optimizer, ScaffoldOptState)
  cost = local_training_costs(model, settings, models=2)  # delta_i and c_i+ - c_i
  extra = optimizer_config(server_optimizer)
  return build_algorithm(
    "scaffold",
    model,
    settings,
    init,
    round_fn,
    HPARAMS,
    cost=cost,
    releases=RELEASES,
    **extra,
    model_states=AVERAGED,
  )
