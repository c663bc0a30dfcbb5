"""Local training: ``lax.scan`` over local steps for one client, and the per-round driver that
runs it for the participating clients with a chosen backend.

About 680 lines, over the house's 600 lines: the local step's forms, the participant draw (plain or
private, :mod:`fedjax_dro.core.privacy`) and the round drivers (plain, stateful, private
stateful) share one key schedule and are read together; splitting them would scatter that
schedule over modules."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp

from fedjax_dro.core.aggregation import scatter_rows
from fedjax_dro.core.client_opt import optimizer_step
from fedjax_dro.core.clients import map_clients, map_clients_weighted_sum
from fedjax_dro.core.privacy import (
  active as privacy_active,
  poisson_draw,
  present_loss_metrics,
  private_round,
)
from fedjax_dro.core.ragged import epoch_chunk, epoch_loop, shared_exit, sorted_participants
from fedjax_dro.core.sampling import (
  epoch_permutations,
  epoch_step_rows,
  epoch_steps,
  pad_permutations,
  sample_clients,
  step_rows,
)
from fedjax_dro.core.settings import aggregation_weights, backend_for, participants
from fedjax_dro.experimental.factored import (
  chosen_layers,
  factored_dense,
  factored_end,
  factored_start,
  factored_step,
)
from fedjax_dro.models.base import Model, client_loss, masked_mean


class LocalSchedule(NamedTuple):
  """The minibatches of one client's local steps (what the loop over them reads).

  Attributes:
    num_steps: the static number of steps ``T`` (``local_epochs``: the largest count any client
      of the federation can take, the length of the losses a loop returns).
    step_keys: ``local_steps`` with a ``batch_size``: the ``[T]`` step keys, each step drawing its
      rows ``[0, bound)`` inside the scan (the rows of :func:`~fedjax_dro.core.sampling.step_rows`,
      drawn where they are used: drawn all before the scan, the softmax round measured ~2.8x
      slower on the 2-core CPU).
    bound: the number of rows the step keys draw from (``max(num_examples, 1)``).
    batch_size: the rows of each minibatch (None: full-batch steps).
    steps: ``local_epochs``: the traced number of steps this client takes (``num_epochs *
      ceil(num_examples / batch_size)``); the loop stops there, so a round's local work lasts as
      long as its largest *participating* client needs (under ``vmap`` the loop runs until every
      client of the batch is done, the finished ones keeping their carry). None: all ``T``.
    perm: ``local_epochs`` with a ``batch_size``: ``[num_epochs, T']`` each epoch's order of the
      client's rows (:func:`~fedjax_dro.core.sampling.epoch_permutations`, padded to whole
      batches), cut into steps by :func:`~fedjax_dro.core.sampling.epoch_step_rows`.
  """

  num_steps: int
  step_keys: Any = None
  bound: Any = None
  batch_size: Optional[int] = None
  steps: Any = None
  perm: Any = None


def local_schedule(
  key,
  num_examples,
  max_examples: int,
  *,
  batch_size: Optional[int],
  num_steps: Optional[int] = None,
  num_epochs: Optional[int] = None,
) -> LocalSchedule:
  """One client's local minibatches: ``num_steps`` or ``num_epochs`` (exactly one).

  * ``num_steps`` (``local_steps``): ``num_steps`` minibatches of ``batch_size`` rows drawn with
    replacement (:func:`~fedjax_dro.core.sampling.step_rows`); with ``batch_size=None`` every
    step is a full-batch step.
  * ``num_epochs`` (``local_epochs``): ``num_epochs`` passes over the client's own
    ``num_examples`` rows without replacement, each in a fresh random order cut into consecutive
    batches of ``batch_size`` (:func:`~fedjax_dro.core.sampling.epoch_step_rows`). The last batch
    of an epoch holds the ``num_examples mod batch_size`` remaining rows when that is not zero (no
    row is dropped): its loss is the mean over those rows. A client takes ``num_epochs *
    ceil(num_examples / batch_size)`` steps and the loop over them stops there. With
    ``batch_size=None`` an epoch is one full-batch step (none for a client without rows).
  """
  if (num_steps is None) == (num_epochs is None):
    raise ValueError(
      f"give exactly one of num_steps and num_epochs, got {num_steps!r} and {num_epochs!r}"
    )
  if num_epochs is None:
    if batch_size is None:
      return LocalSchedule(num_steps)
    keys = jax.random.split(key, num_steps)
    bound = jnp.maximum(num_examples, 1)
    return LocalSchedule(num_steps, step_keys=keys, bound=bound, batch_size=batch_size)
  if batch_size is None:
    steps = jnp.where(num_examples > 0, num_epochs, 0).astype(jnp.int32)
    return LocalSchedule(num_epochs, steps=steps)
  perm = pad_permutations(
    epoch_permutations(key, num_examples, max_examples, num_epochs), batch_size
  )
  total = num_epochs * -(-max_examples // batch_size)
  steps = epoch_steps(num_examples, batch_size, num_epochs)
  return LocalSchedule(total, batch_size=batch_size, steps=steps, perm=perm)


def settings_schedule(settings, key, num_examples, max_examples: int, num_steps=None):
  """:func:`local_schedule` of the settings' ``local_steps`` / ``local_epochs`` and
  ``batch_size`` (``num_steps``, if given, overrides both with that many steps)."""
  epochs = None if num_steps is not None else settings.local_epochs
  steps = None if epochs is not None else (num_steps or settings.local_steps)
  return local_schedule(
    key,
    num_examples,
    max_examples,
    batch_size=settings.batch_size,
    num_steps=steps,
    num_epochs=epochs,
  )


def schedule_batch(schedule: LocalSchedule, j, x, y, num_examples, step_key=None):
  """``(bx, by, bmask)``: the minibatch of step ``j`` of ``schedule`` (``step_key``: that step's
  key under ``local_steps``)."""
  if step_key is not None:  # step_rows' draw of this step
    rows = jax.random.randint(step_key, (schedule.batch_size,), 0, schedule.bound)
    return x[rows], y[rows], jnp.ones(rows.shape, bool)
  if schedule.perm is not None:
    rows, bmask = epoch_step_rows(schedule.perm, j, num_examples, schedule.batch_size)
    return x[rows], y[rows], bmask
  return x, y, jnp.arange(x.shape[0]) < num_examples


def scan_schedule(
  step: Callable, carry, schedule: LocalSchedule, x, y, num_examples, masked_step=None
):
  """The loop of ``step(carry, bx, by, bmask) -> (carry, loss)`` over the minibatches of
  ``schedule``. Returns ``(final carry, losses[T])``: ``losses[j]`` is step ``j``'s minibatch
  loss, 0 for the steps a client does not take.

  ``local_steps``: a ``lax.scan`` of ``T`` steps. ``local_epochs``: a ``lax.while_loop`` that
  stops after the client's own ``schedule.steps``, so a round costs what its largest
  participating client (of a ``vmap`` batch or chunk) needs, not the federation's largest. The
  loop tests its exit condition every :func:`~fedjax_dro.core.ragged.step_block` steps (a
  fixed-length scan of that many steps per iteration, those past the client's count masked:
  carry kept, loss 0); the result is the same for every block.

  ``masked_step(j, active, carry, bx, by, bmask) -> (carry, loss)``, optional: step ``j``,
  keeping the carry itself where ``active`` is False (see :func:`~fedjax_dro.core.ragged.
  epoch_loop`).
  """
  if schedule.steps is None:

    def body(c, step_key):
      return step(c, *schedule_batch(schedule, None, x, y, num_examples, step_key))

    return jax.lax.scan(body, carry, schedule.step_keys, length=schedule.num_steps)

  def batch(j):
    return schedule_batch(schedule, j, x, y, num_examples)

  return epoch_loop(step, batch, schedule.steps, schedule.num_steps, carry, masked_step)


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

  if optimizer is not None:
    opt_step = optimizer_step(model, optimizer, lr, grad_transform)
    carry = (params, optimizer.init(params))
    (w, _), losses = scan_schedule(opt_step, carry, schedule, x, y, num_examples)
    return w, losses
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


def local_step_counts(settings, num_examples, num_steps: Optional[int] = None):
  """``[s]`` int32: the local steps each client with ``num_examples`` rows takes in a round
  (``local_steps``, or ``local_epochs * ceil(num_examples / batch_size)``)."""
  nex = jnp.asarray(num_examples, jnp.int32)
  if num_steps is not None or settings.local_epochs is None:
    return jnp.full(nex.shape, num_steps or settings.local_steps, jnp.int32)
  if settings.batch_size is None:
    return jnp.where(nex > 0, settings.local_epochs, 0).astype(jnp.int32)
  return epoch_steps(nex, settings.batch_size, settings.local_epochs)


def run_clients(fn: Callable, clients, keys, *extra, backend: str, chunk_size: Optional[int]):
  """Runs ``fn(x, y, num_examples, key, *extra_i)`` for every participating client.

  ``clients`` is the gathered :class:`FederatedData` of the participants (``mask`` is implied by
  ``num_examples``); ``extra`` are per-client stacked pytrees (persistent state rows).
  """
  return map_clients(
    lambda x, y, nex, k, *e: fn(x, y, nex, k, *e),
    clients.x,
    clients.y,
    clients.num_examples,
    keys,
    *extra,
    backend=backend,
    chunk_size=chunk_size,
  )


class LocalRound(NamedTuple):
  """What the participants of a FedAvg-style round send back.

  Attributes:
    idx: ``[s]`` participating client indices.
    deltas: ``[s, ...]`` model differences ``w_i^J - w_i^0`` (their weighted mean with
      ``mean_only=True``).
    weights: ``[s]`` aggregation weights (sample counts or ones).
    losses: ``[s]`` loss at the received model (first local minibatch).
    num_examples: ``[s]`` sample counts of the participants.
    client_state: with ``local_round(..., state_update=...)``, the ``[n, ...]`` per-client state
      with the participants' rows replaced by their updated rows; else None.
  """

  idx: Any
  deltas: Any
  weights: Any
  losses: Any
  num_examples: Any
  client_state: Any = None


def _draw_participants(settings, data, key, sampling_weights=None):
  """``(idx, clients, take, put, local_key, present)``: the round's participants (the key
  schedule every FedAvg-style round shares), their gathered data, functions gathering their rows
  of a per-client pytree and writing them back, the key their local work derives from, and
  ``[s]`` which slots hold a participant (None: all; a private round's Poisson draw,
  :func:`fedjax_dro.core.privacy.poisson_draw`)."""
  n = data.num_clients
  sample_key, local_key = jax.random.split(key)
  drawn = poisson_draw(sample_key, n, sampling_weights)
  if drawn is not None:
    idx, rows, present = drawn
    take = lambda tree: jax.tree.map(lambda a: a[rows], tree)
    put = lambda tree, new: jax.tree.map(lambda a, r: a.at[idx].set(r, mode="drop"), tree, new)
    return idx, data.take_clients(rows), take, put, local_key, present
  s = participants(settings, n)
  idx = sample_clients(sample_key, n, s, sampling_weights)
  # full participation: idx = arange(n), no gather or scatter (host-resident data is always
  # gathered; its per-client state is on the device like any other)
  full = s == n and sampling_weights is None
  clients = data if full and not getattr(data, "host_resident", False) else data.take_clients(idx)
  take = (lambda tree: tree) if full else (lambda tree: jax.tree.map(lambda a: a[idx], tree))
  put = (lambda tree, rows: rows) if full else (lambda tree, rows: scatter_rows(tree, idx, rows))
  return idx, clients, take, put, local_key, None


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
) -> LocalRound:
  """Samples participants and runs local SGD on each of them (the FedAvg skeleton, steps 1-3).

  Args:
    model: the :class:`~fedjax_dro.models.base.Model` trained.
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
  """
  if state_update is not None and client_state is None:
    raise ValueError("state_update needs the client_state it updates")
  idx, clients, take, put, local_key, present = _draw_participants(
    settings, data, key, sampling_weights
  )
  s = idx.shape[0]
  dp = private_round(mean_only, present, s, data.num_clients)
  starts = None if client_params is None else take(client_params)
  rows = None if client_state is None else take(client_state)
  reference = params if client_params is None else jax.tree.map(lambda a: a[0], client_params)
  backend = backend_for(settings, reference)

  def client_update(x, y, nex, k, start, row):
    w0 = params if start is None else start
    transform = None if grad_transform is None else (lambda w, g: grad_transform(w, g, row))
    epochs = None if num_steps is not None else settings.local_epochs
    steps = None if epochs is not None else (num_steps or settings.local_steps)
    kw = dict(batch_size=settings.batch_size, lr=lr, grad_transform=transform, num_epochs=epochs)
    w, losses = local_sgd(
      model, w0, x, y, nex, k, num_steps=steps, optimizer=client_optimizer, **kw
    )
    delta = jax.tree.map(jnp.subtract, w, w0)
    out = losses[0] if state_update is None else (losses[0], state_update(row, delta))
    return (delta, out) if dp is None else dp.send(delta, out)  # private: clipped, flagged

  keys = jax.random.split(local_key, s)
  weights = aggregation_weights(settings, clients.num_examples) if dp is None else dp.weights
  # local_epochs, sampled participants: sorted by step count into chunks (core.ragged)
  epochs = settings.local_epochs is not None and num_steps is None
  sampled = epochs and clients is not data
  chunk = epoch_chunk(participants=s) if sampled else None
  counts = local_step_counts(settings, clients.num_examples) if sampled else None
  stacked = (lambda out: out[1]) if mean_only else None
  inputs = (clients, keys, starts, rows, weights)
  ran, backend, chunk_size, inverse = sorted_participants(
    chunk, counts, client_update, inputs, backend, settings.chunk_size, stacked
  )
  r_clients, r_keys, r_starts, r_rows, r_weights = ran
  if mean_only:
    deltas, losses = map_clients_weighted_sum(
      client_update,
      r_weights / jnp.sum(r_weights) if dp is None else r_weights / dp.expected,
      r_clients.x,
      r_clients.y,
      r_clients.num_examples,
      r_keys,
      r_starts,
      r_rows,
      backend=backend,
      chunk_size=chunk_size,
    )
  else:
    deltas, losses = run_clients(
      client_update, r_clients, r_keys, r_starts, r_rows, backend=backend, chunk_size=chunk_size
    )
  if dp is not None:  # the participants' clip flags counted (in the order they ran)
    losses = dp.received(losses, r_weights)
  if inverse is not None:  # back to the order of idx
    losses = jax.tree.map(lambda a: a[inverse], losses)
    if not mean_only:
      deltas = jax.tree.map(lambda a: a[inverse], deltas)
  if dp is not None and mean_only:  # the noise on the sum, once, on the server
    deltas = dp.noised(deltas, key)
  if state_update is None:
    return LocalRound(idx, deltas, weights, losses, clients.num_examples)
  losses, new_rows = losses
  return LocalRound(idx, deltas, weights, losses, clients.num_examples, put(client_state, new_rows))


def federated_gradient(model: Model, settings, params, data, key) -> LocalRound:
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

  In a private round every participant's gradient must be clipped on its own, so the round is
  that per-client path (:func:`local_round`, whose private form clips each delta ``-g_k``).
  """
  if privacy_active() is not None:
    return local_round(model, settings, params, data, key, 1.0, num_steps=1, mean_only=True)
  idx, clients, _, _, local_key, _ = _draw_participants(settings, data, key)
  s = idx.shape[0]
  keys = jax.random.split(local_key, s)
  weights = aggregation_weights(settings, clients.num_examples)

  def client_loss_at(p, x, y, nex, k):
    # local_sgd's key schedule for one step (local_steps=1)
    if settings.batch_size is None:
      bx, by, bmask = x, y, jnp.arange(x.shape[0]) < nex
    else:
      rows = step_rows(k, nex, settings.batch_size, 1)[0]
      bx, by, bmask = x[rows], y[rows], jnp.ones(rows.shape, bool)
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

  deltas, losses = map_clients_weighted_sum(
    client_update,
    weights / jnp.sum(weights),
    clients.x,
    clients.y,
    clients.num_examples,
    keys,
    backend=backend_for(settings, params),
    chunk_size=settings.chunk_size,
    folded=folded,
  )
  return LocalRound(idx, deltas, weights, losses, clients.num_examples)


class StatefulRound(NamedTuple):
  """What the participants of a round with per-step local state send back.

  Attributes:
    idx: ``[s]`` participating client indices.
    carries: ``[s, ...]`` the participants' final local carries (model and estimators).
    losses: ``[s]`` minibatch loss of the first local step (at the received model).
    num_examples: ``[s]`` sample counts of the participants.
  """

  idx: Any
  carries: Any
  losses: Any
  num_examples: Any
  present: Any = None  # [s] bool: a private round's filled slots (None: all)


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

  In a private round (:func:`fedjax_dro.core.privacy.privatizing`) the participants are the
  private draw, and what they send is their carries' change from their start: the ``averaged``
  carries' deltas and the ``released`` carries' deltas, clipped together to the clip norm. The
  ``averaged`` carries (which must start the same for every client) come back as the start plus
  the noised sum of the clipped deltas over the expected participants; the ``released`` ones as
  the ``[s, ...]`` clipped deltas, for the algorithm to release (IFCA's per-cluster sums); the
  other keys (state kept on the clients) stacked, unchanged.
  """
  if (step is None) == (batch_step is None):
    raise ValueError("give exactly one of step and batch_step")
  n = data.num_clients
  s = participants(settings, n)
  dp = None
  if privacy_active() is not None:  # private: the shared draw (Poisson or fixed), clipped deltas
    idx, clients, take, _, local_key, present = _draw_participants(settings, data, key)
    s = idx.shape[0]
    dp = private_round(bool(averaged), present, s, n)
    if not averaged and not released:
      raise ValueError("a private stateful round must name the carries it releases")
    rows = None if client_state is None else take(client_state)
    update = _stateful_update(model, settings, start, step, batch_step, num_steps)
    return _private_stateful(
      dp, settings, clients, local_key, idx, rows, start, update, averaged, released
    )
  sample_key, local_key = jax.random.split(key)
  idx = sample_clients(sample_key, n, s)
  full = s == n and not getattr(data, "host_resident", False)
  clients = data if full else data.take_clients(idx)
  rows = None
  if client_state is not None:
    rows = client_state if full else jax.tree.map(lambda a: a[idx], client_state)

  client_update = _stateful_update(model, settings, start, step, batch_step, num_steps)

  reference = start(None if rows is None else jax.tree.map(lambda a: a[0], rows))["params"]
  backend = backend_for(settings, reference)
  keys = jax.random.split(local_key, s)
  if not averaged:
    carries, losses = run_clients(
      client_update, clients, keys, rows, backend=backend, chunk_size=settings.chunk_size
    )
    return StatefulRound(idx, carries, losses, clients.num_examples)

  def split_update(x, y, nex, k, row):
    carry, loss = client_update(x, y, nex, k, row)
    kept = {name: value for name, value in carry.items() if name not in averaged}
    return {name: carry[name] for name in averaged}, (kept, loss)

  means, (kept, losses) = map_clients_weighted_sum(
    split_update,
    jnp.full((s,), 1.0 / s),
    clients.x,
    clients.y,
    clients.num_examples,
    keys,
    rows,
    backend=backend,
    chunk_size=settings.chunk_size,
  )
  return StatefulRound(idx, {**kept, **means}, losses, clients.num_examples)


def _stateful_update(model, settings, start, step, batch_step, num_steps):
  """``(x, y, nex, key, row) -> (carry, first loss)``: one participant's stateful local round."""

  def client_update(x, y, nex, k, row):
    def one_step(carry, bx, by, bmask):
      objective = jax.value_and_grad(lambda p: client_loss(model, p, bx, by, bmask))
      if batch_step is not None:
        return batch_step(carry, objective)
      loss, g = objective(carry["params"])
      return step(carry, loss, g), loss

    schedule = settings_schedule(settings, k, nex, x.shape[0], num_steps)
    carry, losses = scan_schedule(one_step, start(row), schedule, x, y, nex)
    return carry, losses[0]

  return client_update


def _private_stateful(
  dp, settings, clients, local_key, idx, rows, start, update, averaged, released
):
  """A private :func:`stateful_local_round` (its docstring): each participant's deltas of the
  ``averaged`` and ``released`` carries from its start, clipped together
  (:class:`~fedjax_dro.core.privacy.PrivateRound`); the ``averaged`` ones summed over the expected
  participants and noised, the ``released`` ones returned clipped and stacked."""
  sent = tuple(averaged) + tuple(released)

  def one(x, y, nex, k, row):
    carry, loss = update(x, y, nex, k, row)
    base = start(row)
    deltas = {name: jax.tree.map(jnp.subtract, carry[name], base[name]) for name in sent}
    kept = {name: value for name, value in carry.items() if name not in sent}
    clipped, (aux, within) = dp.send(deltas, (kept, loss))
    rel = {name: clipped[name] for name in released}
    return {name: clipped[name] for name in averaged}, ((aux, rel), within)

  s = idx.shape[0]
  reference = start(None if rows is None else jax.tree.map(lambda a: a[0], rows))
  mean, out = map_clients_weighted_sum(
    one,
    dp.weights / dp.expected,
    clients.x,
    clients.y,
    clients.num_examples,
    jax.random.split(local_key, s),
    rows,
    backend=backend_for(settings, reference["params"]),
    chunk_size=settings.chunk_size,
  )
  (kept, losses), rel = dp.received(out, dp.weights)
  carries = {**kept, **rel}
  if averaged:
    mean = dp.noised(mean, jax.random.fold_in(local_key, 0))
    carries.update({name: jax.tree.map(jnp.add, reference[name], mean[name]) for name in averaged})
  return StatefulRound(idx, carries, losses, clients.num_examples, dp.weights > 0)


def stateful_round_metrics(update: StatefulRound) -> dict:
  """Uniform mean and max of the participants' first-step losses (scan-able; a private round's
  empty slots left out, 0 when none is filled)."""
  if update.present is None:
    return {"train_loss": jnp.mean(update.losses), "train_loss_max": jnp.max(update.losses)}
  return present_loss_metrics(update.losses, update.present)


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
    lambda xd, yd, md: client_loss(model, params, xd, yd, md),
    clients.x,
    clients.y,
    clients.mask,
    backend=backend_for(settings, params),
    chunk_size=settings.chunk_size,
  )


def local_round_and_losses(model: Model, settings, params, data, key, lr):
  """``(update, losses)``: :func:`local_round` from the global ``params`` (its ``[s, ...]``
  deltas, no mean) and the participants' full-data losses at ``params``
  (:func:`participant_losses`), the first pass of q-FFL and AgnosticFedAvg."""
  update = local_round(model, settings, params, data, key, lr)
  return update, participant_losses(model, settings, params, data, update.idx)


def round_metrics(update: LocalRound) -> dict:
  """Scan-able training metrics of a round: weighted mean and max of the participants' losses
  (slots of weight 0 left out: a private round's empty slots; 0 when no slot is filled)."""
  total = jnp.sum(update.weights)
  w = update.weights / jnp.where(total > 0, total, 1)
  top = jnp.max(jnp.where(update.weights > 0, update.losses, -jnp.inf))
  return {"train_loss": jnp.sum(w * update.losses), "train_loss_max": jnp.where(total > 0, top, 0)}
