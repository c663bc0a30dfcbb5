"""Local training: ``lax.scan`` over local steps for one client, and the per-round drivers that
run it for the participating clients (:mod:`fedjax_dro.core.participants`' client plan) and
aggregate what they send through the round's release mechanism (:mod:`fedjax_dro.core.release`:
plain, or private)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from fedjax_dro.common import rows as client_rows
from fedjax_dro.common.model import (
  Model,
  client_loss,
  masked_mean,
  step_rng,
  train_loss,
  train_value_and_grad,
  with_state,
)
from fedjax_dro.core.client_opt import optimizer_step
from fedjax_dro.core.clients import map_clients, map_clients_weighted_sum
from fedjax_dro.core.participants import client_plan
from fedjax_dro.core.ragged import epoch_chunk, epoch_loop, shared_exit
from fedjax_dro.core.release import PLAIN, loss_metrics
from fedjax_dro.core.sampling import step_rows
from fedjax_dro.core.schedule import (
  local_schedule,
  local_step_counts,
  scan_schedule,
  schedule_batch,
  settings_schedule,
)
from fedjax_dro.core.settings import aggregation_weights, backend_for, participants
from fedjax_dro.experimental.factored import (
  chosen_layers,
  factored_dense,
  factored_end,
  factored_start,
  factored_step,
)


def local_sgd(
  model: Model,
  params,
  x,
  y,
  num_examples,
  key,
  *,
  num_steps: Optional[int] = None,
  batch_size: Optional[int],
  lr,
  grad_transform: Optional[Callable] = None,
  num_epochs: Optional[int] = None,
  optimizer=None,
):
  """Local SGD on one client's objective: ``num_steps`` steps or ``num_epochs`` passes.

  Args:
    num_steps: SGD steps on minibatches drawn with replacement (``local_steps``).
    batch_size: rows of each minibatch; None: full-batch steps.
    num_epochs: instead of ``num_steps``, passes over the client's rows without replacement
      (``local_epochs``; see :func:`local_schedule`).
    grad_transform: optional ``(w, g) -> g'`` applied to every stochastic gradient before the
      step (SCAFFOLD's ``g - c_i + c``, FedProx's ``g + mu (w - w_global)``, ...).
    optimizer: an optax step in place of the SGD step (:mod:`fedjax_dro.core.client_opt`).

  A model with a training mode (``Model.train_apply``) takes every step in it: step ``j``'s
  dropout drawn from :func:`~fedjax_dro.common.model.step_rng` ``(key, j)``, the gradient of
  the state entries zero and the state entries replaced by the state the step returns (so the
  final params carry the client's batch statistics after its last step).

  Returns:
    ``(final_params, losses[T])`` where ``losses[k]`` is the minibatch loss at step ``k``
    (``losses[0]`` is the loss at the received model; 0 for steps the client does not take).
  """
  schedule = local_schedule(
    key, num_examples, x.shape[0], batch_size=batch_size, num_steps=num_steps, num_epochs=num_epochs
  )

  def step(w, bx, by, bmask):
    loss, g = jax.value_and_grad(lambda p: client_loss(model, p, bx, by, bmask))(w)
    if grad_transform is not None:
      g = grad_transform(w, g)
    # Keep each leaf's dtype (float32 params with a float64 step size stay float32).
    return jax.tree.map(lambda a, b: (a - lr * b).astype(a.dtype), w, g), loss

  def folded(j, active, w, bx, by, bmask):
    # the step size (0 past the client's own steps) folded into the loss: w + grad(-lr * loss)
    # is the weight gradient's product plus the weights (Tuning.folded_step)
    def scaled(p):
      loss = client_loss(model, p, bx, by, bmask)
      return jnp.where(active, -lr, 0).astype(loss.dtype) * loss, loss

    g, loss = jax.grad(scaled, has_aux=True)(w)
    return jax.tree.map(lambda a, b: (a + b).astype(a.dtype), w, g), loss

  rng = None if model.train_apply is None else key  # dropout keys: step_rng(key, j)
  if optimizer is not None:
    opt_step = optimizer_step(model, optimizer, lr, grad_transform)
    carry = (params, optimizer.init(params))
    (w, _), losses = scan_schedule(opt_step, carry, schedule, x, y, num_examples, rng=rng)
    return w, losses
  if rng is not None:  # training mode: dropout keys, the model state replaced after each step

    def train_step(w, bx, by, bmask, step_key):
      loss, g, state = train_value_and_grad(model, w, bx, by, bmask, step_key)
      if grad_transform is not None:
        g = grad_transform(w, g)
      w = jax.tree.map(lambda a, b: (a - lr * b).astype(a.dtype), w, g)
      return with_state(model, w, state), loss

    return scan_schedule(train_step, params, schedule, x, y, num_examples, rng=rng)
  if grad_transform is None and factored_dense():
    # wide dense layers kept as W_0 + A^T G over the local steps (experimental.factored)
    rows = schedule.num_steps * (x.shape[0] if batch_size is None else batch_size)
    layers = chosen_layers(model, rows)
    if layers and (schedule.steps is None or shared_exit(schedule.num_steps)):
      return _factored_sgd(model, layers, params, lr, schedule, x, y, num_examples, rows)
  masked = folded if grad_transform is None else None
  return scan_schedule(step, params, schedule, x, y, num_examples, masked_step=masked)


def _factored_sgd(model, layers, params, lr, schedule, x, y, num_examples, rows: int):
  """Local SGD of ``schedule`` with ``layers`` kept as ``W_0 + A^T G`` (``rows`` stacked rows:
  :mod:`fedjax_dro.experimental.factored`): a scan over the steps (``local_steps``) or the epoch loop's
  shared exit (``local_epochs``). Returns ``(final_params, losses[T])`` as :func:`local_sgd`."""
  objective = lambda out, by, bmask: masked_mean(model, out, by, bmask)  # noqa: E731
  step = factored_step(model, layers, params, lr, objective)
  start = factored_start(params, layers, rows)
  if schedule.steps is None:

    def body(carry, inputs):
      j, step_key = inputs
      return step(j, True, carry, *schedule_batch(schedule, None, x, y, num_examples, step_key))

    steps = (jnp.arange(schedule.num_steps), schedule.step_keys)
    carry, losses = jax.lax.scan(body, start, steps)
  else:
    carry, losses = epoch_loop(
      None,
      lambda j: schedule_batch(schedule, j, x, y, num_examples),
      schedule.steps,
      schedule.num_steps,
      start,
      step,
    )
  return factored_end(carry, layers, params), losses


class LocalRound(NamedTuple):
  """What the participants of a FedAvg-style round send back.

  Attributes:
    idx: ``[s]`` participating client indices.
    deltas: ``[s, ...]`` model differences ``w_i^J - w_i^0`` (their weighted mean with
      ``mean_only=True``); in a private round clipped (and their mean noised).
    weights: ``[s]`` aggregation weights (sample counts or ones; a private round's 1 for a
      participant and 0 for an empty slot).
    losses: ``[s]`` loss at the received model (first local minibatch).
    num_examples: ``[s]`` sample counts of the participants.
    client_state: with ``local_round(..., state_update=...)``, the ``[n, ...]`` per-client state
      with the participants' rows replaced by their updated rows; else None.
    metrics: the round's privacy metrics (participants drawn and dropped, updates within the
      clip); empty when plain.
  """

  idx: Any
  deltas: Any
  weights: Any
  losses: Any
  num_examples: Any
  client_state: Any = None
  metrics: dict = {}


def local_round(
  model: Model,
  settings,
  params,
  data,
  key,
  lr,
  *,
  client_params=None,
  client_state=None,
  grad_transform: Optional[Callable] = None,
  num_steps: Optional[int] = None,
  sampling_weights=None,
  mean_only: bool = False,
  state_update: Optional[Callable] = None,
  client_optimizer=None,
  release=PLAIN,
  personal_start: Optional[Callable] = None,
) -> LocalRound:
  """Samples participants and runs local SGD on each of them (the FedAvg skeleton, steps 1-3).

  Args:
    model: the :class:`~fedjax_dro.common.model.Model` trained.
    settings: the validated :class:`~fedjax_dro.core.settings.CommonSettings`.
    params: the global model every participant starts from (ignored if ``client_params``).
    client_params: optional ``[n, ...]`` per-client starting models (personalized algorithms).
    client_state: optional ``[n, ...]`` persistent per-client state; the participant's row is
      passed to ``grad_transform(w, g, state_row)``.
    grad_transform: ``(w, g, state_row) -> g'`` correction of every local gradient.
    num_steps: that many ``local_steps``-style steps instead of the settings' ``local_steps`` /
      ``local_epochs``.
    sampling_weights: optional ``[n]`` client sampling weights.
    mean_only: return in ``deltas`` only the weighted mean of the participants' deltas (not the
      stacked ``[s, ...]`` deltas); with the ``map`` / ``chunked`` backends it is accumulated chunk
      by chunk, so memory stays that of one chunk (FedAvg-type aggregation of large models).
    state_update: ``(state_row, delta) -> new_row``: the participant's new row of
      ``client_state``, computed inside its local update, where its delta is at hand (SCAFFOLD's
      control variate), and returned as ``LocalRound.client_state`` (all ``n`` rows, the others
      unchanged). With ``mean_only`` no participant's delta is ever stacked.
    client_optimizer: an optax step in place of local SGD (:mod:`fedjax_dro.core.client_opt`).
    release: the round's release mechanism (:mod:`fedjax_dro.core.release`): :data:`PLAIN`, or
      a private one, whose participants are its draw, whose deltas are clipped (``mean_only``:
      summed over the expected participants and noised) and whose metrics are returned.
    personal_start: ``(params, state_row) -> w0``: the model a participant starts from, built
      from the global ``params`` and its row of ``client_state`` (the parameters it keeps,
      :mod:`fedjax_dro.core.partitioned`); None: ``params`` (or its row of ``client_params``).
  """
  if state_update is not None and client_state is None:
    raise ValueError("state_update needs the client_state it updates")
  reference = params if client_params is None else jax.tree.map(lambda a: a[0], client_params)
  s = participants(settings, data.num_clients)
  plan = client_plan(
    settings, data, key, release, s, backend_for(settings, reference), sampling_weights
  )
  clients, s = plan.clients, plan.size
  agg = release.aggregation(
    aggregation_weights(settings, clients.num_examples), plan.present, s, data.num_clients
  )
  starts = None if client_params is None else plan.take(client_params)
  rows = None if client_state is None else plan.take(client_state)

  def client_update(x, y, nex, k, start, row):
    w0 = params if start is None else start
    if personal_start is not None:
      w0 = personal_start(params, row)
    transform = None if grad_transform is None else (lambda w, g: grad_transform(w, g, row))
    epochs = None if num_steps is not None else settings.local_epochs
    steps = None if epochs is not None else (num_steps or settings.local_steps)
    kw = dict(batch_size=settings.batch_size, lr=lr, grad_transform=transform, num_epochs=epochs)
    w, losses = local_sgd(
      model, w0, x, y, nex, k, num_steps=steps, optimizer=client_optimizer, **kw
    )
    delta = jax.tree.map(jnp.subtract, w, w0)
    out = losses[0] if state_update is None else (losses[0], state_update(row, delta))
    return agg.send(delta, out)  # private: clipped, flagged

  weights = agg.weights
  # local_epochs, sampled participants: sorted by step count into chunks (Tuning.epoch_groups)
  epochs = settings.local_epochs is not None and num_steps is None
  sampled = epochs and clients is not data
  chunk = epoch_chunk(participants=s) if sampled else None
  counts = local_step_counts(settings, clients.num_examples) if sampled else None
  stacked = (lambda out: out[1]) if mean_only else None
  inputs = (clients, plan.keys(), starts, rows, weights)
  ran, backend, chunk_size, inverse = plan.arranged(client_update, inputs, counts, chunk, stacked)
  r_clients, r_keys, r_starts, r_rows, r_weights = ran
  args = (r_clients.x, r_clients.y, r_clients.num_examples, r_keys, r_starts, r_rows)
  if mean_only:
    deltas, losses = map_clients_weighted_sum(
      client_update,
      agg.normalized(r_weights),
      *args,
      backend=backend,
      chunk_size=chunk_size,
    )
  else:
    deltas, losses = map_clients(client_update, *args, backend=backend, chunk_size=chunk_size)
  # a private round's clip flags counted (in the order the participants ran)
  losses, metrics = agg.received(losses, r_weights)
  if inverse is not None:  # back to the order of the draw
    losses = jax.tree.map(lambda a: a[inverse], losses)
    if not mean_only:
      deltas = jax.tree.map(lambda a: a[inverse], deltas)
  if mean_only:  # a private round's noise on the sum, once, on the server
    deltas = agg.noised(deltas, key)
  metrics = {**plan.metrics, **metrics}
  nex = clients.num_examples
  if state_update is None:
    return LocalRound(plan.idx, deltas, weights, losses, nex, metrics=metrics)
  losses, new_rows = losses
  return LocalRound(
    plan.idx, deltas, weights, losses, nex, plan.put(client_state, new_rows), metrics
  )


def federated_gradient(model: Model, settings, params, data, key, release=PLAIN) -> LocalRound:
  """FedSGD's round: every participant's minibatch gradient at the shared ``params``, averaged.

  Returns the :class:`LocalRound` of ``local_round(..., lr=1.0, num_steps=1, mean_only=True)``
  (``deltas`` = ``-sum_k w_k g_k`` with normalized weights; the same participants, keys and
  minibatches), computed differently: the clients share one model, so the weighted mean of
  their gradients is the gradient of their weighted loss, taken in one backward pass over the
  minibatches of a whole chunk of clients. JAX's batching folds the client axis into the batch
  (one matmul or convolution over all the chunk's rows for every layer, not one per client),
  which is what makes this cheap on accelerators; the chunks are planned from the per-client
  update's memory like every ``map_clients`` call. Equal to the per-client path up to the order
  of floating-point sums (tested).

  A ``release`` that processes each participant's update on its own (a private one clips each
  gradient) takes the per-client path instead (:func:`local_round`, whose private form clips
  each delta ``-g_k``).
  """
  if release.per_participant:  # each gradient on its own: no folded backward pass
    return local_round(
      model, settings, params, data, key, 1.0, num_steps=1, mean_only=True, release=release
    )
  s = participants(settings, data.num_clients)
  plan = client_plan(settings, data, key, release, s, backend_for(settings, params))
  clients = plan.clients
  weights = aggregation_weights(settings, clients.num_examples)

  def client_loss_at(p, x, y, nex, k):
    # local_sgd's key schedule for one step (local_steps=1)
    if settings.batch_size is None:
      bx, by, bmask = client_rows.whole(x, y, nex)
    else:
      rows = step_rows(k, nex, settings.batch_size, 1)[0]
      bx, by, bmask = (*client_rows.take(x, y, rows), jnp.ones(rows.shape, bool))
    if model.train_apply is not None:  # training mode, step 0's dropout key; the state kept
      return train_loss(model, p, bx, by, bmask, step_rng(k, 0))[0]
    return client_loss(model, p, bx, by, bmask)

  def client_update(x, y, nex, k):  # the per-client form (memory planning)
    loss, g = jax.value_and_grad(client_loss_at)(params, x, y, nex, k)
    return jax.tree.map(jnp.negative, g), loss

  def folded(w, x, y, nex, k):
    def weighted_loss(p):
      losses = jax.vmap(client_loss_at, in_axes=(None, 0, 0, 0, 0))(p, x, y, nex, k)
      return jnp.sum(w.astype(losses.dtype) * losses), losses

    g, losses = jax.grad(weighted_loss, has_aux=True)(params)
    return jax.tree.map(lambda a: (-a).astype(a.dtype), g), losses

  deltas, losses = plan.weighted_sum(client_update, weights / jnp.sum(weights), folded=folded)
  return LocalRound(plan.idx, deltas, weights, losses, clients.num_examples)


class StatefulRound(NamedTuple):
  """What the participants of a round with per-step local state send back.

  Attributes:
    idx: ``[s]`` participating client indices.
    carries: ``[s, ...]`` the participants' final local carries (model and estimators).
    losses: ``[s]`` minibatch loss of the first local step (at the received model).
    num_examples: ``[s]`` sample counts of the participants.
    present: ``[s]`` bool: a private round's filled slots (None: all).
    metrics: the round's privacy metrics (empty when plain).
  """

  idx: Any
  carries: Any
  losses: Any
  num_examples: Any
  present: Any = None
  metrics: dict = {}


def stateful_local_round(
  model: Model,
  settings,
  data,
  key,
  *,
  start: Callable,
  step: Optional[Callable] = None,
  batch_step: Optional[Callable] = None,
  client_state=None,
  num_steps: Optional[int] = None,
  averaged: Tuple[str, ...] = (),
  released: Tuple[str, ...] = (),
  means: Tuple[str, ...] = (),
  log_means=(),
  release=PLAIN,
) -> StatefulRound:
  """Samples participants and runs local steps that carry more than the model.

  The skeleton of algorithms whose local step updates estimators next to the model (the moving
  averages of FGDRO, the moments of local Adam). The key schedule (participant sampling,
  per-client and per-step keys, minibatch rows) is that of :func:`local_round`, so algorithms
  built on either see the same clients and minibatches.

  Args:
    start: ``start(row) -> carry``: the participant's local carry at the start of the round, a
      dict with the model under ``"params"``; ``row`` is its row of ``client_state`` (or None).
    step: ``step(carry, loss, grad) -> carry``: one local step, given the minibatch loss and
      gradient at ``carry["params"]``.
    batch_step: instead of ``step``, ``batch_step(carry, objective) -> (carry, loss)`` where
      ``objective(p) -> (loss, grad)`` is the client objective on this step's minibatch, for
      steps that take several gradients on one minibatch (pFedMe's inner Moreau-envelope solve).
    client_state: optional ``[n, ...]`` persistent per-client state passed row-wise to ``start``.
    num_steps: that many ``local_steps``-style steps instead of the settings' ``local_steps`` /
      ``local_epochs`` (steps a client does not take under ``local_epochs`` keep its carry).
    averaged: keys of the carry of which only the participants' uniform mean is needed (the
      model and the moments the server averages): ``carries[key]`` is that mean, without the
      client axis, accumulated chunk by chunk with the ``map`` / ``chunked`` backends as in
      ``local_round(mean_only=True)``, so a round never holds every participant's copy of a
      model-sized carry (with the MLP 784-200-200-62 and 100 clients, three such carries
      stacked are 250 MB written and read back per round). The other keys stay stacked.
    released: keys of the carry the algorithm releases itself, stacked (IFCA's per-cluster
      models): their values when plain, their clipped changes from the start when private.
    means: keys of small carries whose uniform mean over the participants the server reads
      (FGDRO-CVaR's threshold): the mean of their stacked values when plain, released with the
      ``averaged`` ones when private.
    log_means: ``(key, ratio key, reference)`` of positive carries held in the log domain whose
      mean the server reads in the log domain (FGDRO-KL's ``v``): ``log mean exp`` of their
      stacked values when plain; when private each participant releases its ratio to the
      public ``reference`` (``exp`` of the difference, under the ``ratio key``) less 1 with the
      ``averaged`` deltas, and the key becomes ``reference + log(max(mean ratio, 1e-6))``.
    release: the round's release mechanism (:mod:`fedjax_dro.core.release`). A private one
      draws the participants, and what they send is their carries' change from their start:
      the ``averaged`` and ``released`` carries' deltas, clipped together to the clip norm. The
      ``averaged`` carries (which must start the same for every client) come back as the start
      plus the noised sum of the clipped deltas over the expected participants; the
      ``released`` ones as the ``[s, ...]`` clipped deltas; the other keys (state kept on the
      clients) stacked, unchanged.
  """
  if (step is None) == (batch_step is None):
    raise ValueError("give exactly one of step and batch_step")
  n = data.num_clients
  s = participants(settings, n)
  client_update = _stateful_update(model, settings, start, step, batch_step, num_steps)
  # the backend is chosen for the model the participants start from (their first row's)
  probe = None if client_state is None else jax.tree.map(lambda a: a[0], client_state)
  backend = backend_for(settings, start(probe)["params"])
  plan = client_plan(settings, data, key, release, s, backend)
  s = plan.size
  rows = None if client_state is None else plan.take(client_state)
  agg = release.stateful(s, n, start, averaged, released, plan.present, means, log_means)
  if agg.stacked:  # nothing averaged: every carry stacked
    carries, losses = plan.map(client_update, rows)
    nex = plan.clients.num_examples
    return StatefulRound(plan.idx, agg.finish(carries), losses, nex, plan.present, plan.metrics)

  def one(x, y, nex, k, row):
    carry, loss = client_update(x, y, nex, k, row)
    return agg.client(carry, row, loss)

  mean, out = plan.weighted_sum(one, agg.weights, rows)
  reference = start(None if rows is None else jax.tree.map(lambda a: a[0], rows))
  noise_key = jax.random.fold_in(plan.local_key, 0)
  carries, losses, metrics = agg.received(mean, out, reference, noise_key)
  metrics = {**plan.metrics, **metrics}
  return StatefulRound(plan.idx, carries, losses, plan.clients.num_examples, agg.present, metrics)


def _stateful_update(model, settings, start, step, batch_step, num_steps):
  """``(x, y, nex, key, row) -> (carry, first loss)``: one participant's stateful local round."""

  def client_update(x, y, nex, k, row):
    def one_step(carry, bx, by, bmask, step_key=None):
      if model.train_apply is not None:  # training mode (see local_sgd)
        if batch_step is not None:  # several gradients on one minibatch: the state kept

          def objective(p):
            return train_value_and_grad(model, p, bx, by, bmask, step_key)[:2]

          return batch_step(carry, objective)
        loss, g, state = train_value_and_grad(model, carry["params"], bx, by, bmask, step_key)
        carry = step(carry, loss, g)
        return {**carry, "params": with_state(model, carry["params"], state)}, loss
      objective = jax.value_and_grad(lambda p: client_loss(model, p, bx, by, bmask))
      if batch_step is not None:
        return batch_step(carry, objective)
      loss, g = objective(carry["params"])
      return step(carry, loss, g), loss

    schedule = settings_schedule(settings, k, nex, x.shape[0], num_steps)
    rng = None if model.train_apply is None else k
    carry, losses = scan_schedule(one_step, start(row), schedule, x, y, nex, rng=rng)
    return carry, losses[0]

  return client_update


def stateful_round_metrics(update: StatefulRound) -> dict:
  """Uniform mean and max of the participants' first-step losses (scan-able; a private round's
  empty slots left out, 0 when none is filled), and the round's privacy metrics."""
  return {**loss_metrics(update.losses, update.present), **update.metrics}


def map_client_data(fn: Callable, data, keys, *, backend: str, chunk_size: Optional[int]):
  """``fn(x, y, num_examples, key)`` of every client of ``data`` (a federation or the rows
  ``data.take_clients(idx)``), one key of ``keys`` each, stacked over the clients."""
  return map_clients(
    fn, data.x, data.y, data.num_examples, keys, backend=backend, chunk_size=chunk_size
  )


def dual_round_metrics(losses, lam, *, lambda_min: bool = True) -> dict:
  """Scan-able metrics of the algorithms with client weights ``lam``: the unweighted mean and the
  max of the participants' ``losses``, the largest and (``lambda_min``) the smallest weight."""
  metrics = {
    "train_loss": jnp.mean(losses),
    "train_loss_max": jnp.max(losses),
    "lambda_max": jnp.max(lam),
  }
  if lambda_min:
    metrics["lambda_min"] = jnp.min(lam)
  return metrics


def participant_losses(model: Model, settings, params, data, idx):
  """``[s]`` full-data losses ``f_k(params)`` of the clients ``idx`` at the model ``params``.

  The loss weights of q-FFL and AgnosticFedAvg (each participant's objective at the model it
  received), evaluated with the settings' backend.
  """
  clients = data.take_clients(jnp.minimum(idx, data.num_clients - 1))  # a private round's slots
  return map_clients(
    lambda xd, yd, nex: client_loss(model, params, *client_rows.whole(xd, yd, nex)),
    clients.x,
    clients.y,
    clients.num_examples,
    backend=backend_for(settings, params),
    chunk_size=settings.chunk_size,
  )


def local_round_and_losses(model: Model, settings, params, data, key, lr, release=PLAIN):
  """``(update, losses)``: :func:`local_round` from the global ``params`` (its ``[s, ...]``
  deltas, no mean) and the participants' full-data losses at ``params``
  (:func:`participant_losses`), the first pass of q-FFL and AgnosticFedAvg."""
  update = local_round(model, settings, params, data, key, lr, release=release)
  return update, participant_losses(model, settings, params, data, update.idx)


def round_metrics(update: LocalRound) -> dict:
  """Scan-able training metrics of a round: weighted mean and max of the participants' losses
  (slots of weight 0 left out: a private round's empty slots; 0 when no slot is filled), and
  the round's privacy metrics."""
  total = jnp.sum(update.weights)
  w = update.weights / jnp.where(total > 0, total, 1)
  top = jnp.max(jnp.where(update.weights > 0, update.losses, -jnp.inf))
  return {
    "train_loss": jnp.sum(w * update.losses),
    "train_loss_max": jnp.where(total > 0, top, 0),
    **update.metrics,
  }
