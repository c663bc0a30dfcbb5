"""One client's local minibatches: the schedule of its ``local_steps`` (drawn with replacement)
or ``local_epochs`` (passes over its own rows), the loop over them (a ``lax.scan``, or for
epochs the loop of :mod:`fedjax_dro.core.ragged` that stops at the client's own count), and the
step counts a round's participants take."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_dro.common import rows as client_rows
from fedjax_dro.common.model import step_rng
from fedjax_dro.core.ragged import epoch_loop
from fedjax_dro.core.sampling import (
  epoch_permutations,
  epoch_step_rows,
  epoch_steps,
  pad_permutations,
)


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
    return (*client_rows.take(x, y, rows), jnp.ones(rows.shape, bool))
  if schedule.perm is not None:
    rows, bmask = epoch_step_rows(schedule.perm, j, num_examples, schedule.batch_size)
    return (*client_rows.take(x, y, rows), bmask)
  return client_rows.whole(x, y, num_examples)


def _read_ahead(schedule: LocalSchedule, x, y, num_examples):
  """A streamed client's ``local_steps`` minibatches, read before the loop with one host call:
  ``(bx [T, B, ...], by [T, B, ...])`` of the rows :func:`schedule_batch` draws from each step
  key (the same draws), or the whole client once for full-batch steps."""
  if schedule.step_keys is None:
    return client_rows.whole(x, y, num_examples)
  draw = lambda k: jax.random.randint(k, (schedule.batch_size,), 0, schedule.bound)
  return client_rows.take(x, y, jax.vmap(draw)(schedule.step_keys))


def scan_schedule(
  step: Callable, carry, schedule: LocalSchedule, x, y, num_examples, masked_step=None, rng=None
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

  ``rng``: the client's local-round key of a model with a training mode: ``step`` then takes a
  fifth argument, step ``j``'s dropout key :func:`~fedjax_dro.common.model.step_rng` ``(rng, j)``
  (a function of the step's index, so the same under every loop form), and ``masked_step`` is
  not used.
  """
  if rng is not None:
    return _keyed_scan(step, carry, schedule, x, y, num_examples, rng)
  if schedule.steps is None and client_rows.is_rows(x):  # streamed: the rows read ahead
    batches = _read_ahead(schedule, x, y, num_examples)
    if schedule.step_keys is None:
      return jax.lax.scan(lambda c, _: step(c, *batches), carry, None, length=schedule.num_steps)
    ones = jnp.ones((schedule.batch_size,), bool)
    return jax.lax.scan(lambda c, b: step(c, *b, ones), carry, batches)
  if schedule.steps is None:

    def body(c, step_key):
      return step(c, *schedule_batch(schedule, None, x, y, num_examples, step_key))

    return jax.lax.scan(body, carry, schedule.step_keys, length=schedule.num_steps)

  def batch(j):
    return schedule_batch(schedule, j, x, y, num_examples)

  return epoch_loop(step, batch, schedule.steps, schedule.num_steps, carry, masked_step)


def _keyed_scan(step, carry, schedule, x, y, num_examples, rng):
  """:func:`scan_schedule` of a ``step(carry, bx, by, bmask, step_key)`` (dropout keys)."""
  if schedule.steps is None and client_rows.is_rows(x):  # streamed: the rows read ahead
    batches = _read_ahead(schedule, x, y, num_examples)
    steps = jnp.arange(schedule.num_steps)
    if schedule.step_keys is None:
      return jax.lax.scan(lambda c, j: step(c, *batches, step_rng(rng, j)), carry, steps)
    ones = jnp.ones((schedule.batch_size,), bool)
    body = lambda c, inputs: step(c, *inputs[1], ones, step_rng(rng, inputs[0]))
    return jax.lax.scan(body, carry, (steps, batches))
  if schedule.steps is None:

    def body(c, inputs):
      j, step_key = inputs
      batch = schedule_batch(schedule, None, x, y, num_examples, step_key)
      return step(c, *batch, step_rng(rng, j))

    inputs = (jnp.arange(schedule.num_steps), schedule.step_keys)
    return jax.lax.scan(body, carry, inputs, length=schedule.num_steps)

  def batch(j):
    return (*schedule_batch(schedule, j, x, y, num_examples), step_rng(rng, j))

  return epoch_loop(step, batch, schedule.steps, schedule.num_steps, carry)


def local_step_counts(settings, num_examples, num_steps: Optional[int] = None):
  """``[s]`` int32: the local steps each client with ``num_examples`` rows takes in a round
  (``local_steps``, or ``local_epochs * ceil(num_examples / batch_size)``)."""
  nex = jnp.asarray(num_examples, jnp.int32)
  if num_steps is not None or settings.local_epochs is None:
    return jnp.full(nex.shape, num_steps or settings.local_steps, jnp.int32)
  if settings.batch_size is None:
    return jnp.where(nex > 0, settings.local_epochs, 0).astype(jnp.int32)
  return epoch_steps(nex, settings.batch_size, settings.local_epochs)
