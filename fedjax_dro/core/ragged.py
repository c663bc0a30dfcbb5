"""How a round runs its participants' unequal local work (``local_epochs``): how many local steps
run between two tests of the loop's exit condition (``Tuning.step_block``), in how many
step-sorted chunks the sampled participants run (``Tuning.epoch_groups`` / ``epoch_chunk``) and
how a done participant's step is masked (``Tuning.folded_step``). None changes a result, only the
speed; :func:`fedjax_dro.core.schedule.scan_schedule` and :func:`fedjax_dro.core.local.local_round`
read them from the traced program's :class:`~fedjax_dro.common.tuning.Tuning`."""

from __future__ import annotations

import contextlib
from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_dro.common.checks import is_int
from fedjax_dro.common.tuning import current, reset, tuned


# The named shorthands of fedjax_dro.common.tuning.tuned() for this module's three choices.
@contextlib.contextmanager
def local_step_block(k: int):
  """Within the block, programs traced for ``local_epochs`` test the loop's exit condition every
  ``k`` local steps (``fd.tuned(step_block=k)``; default: the platform's,
  :func:`fedjax_dro.common.tuning.platform_defaults`). The results do not depend on ``k`` (steps
  past a client's own count are masked); only the speed does."""
  if not is_int(k) or k < 1:
    raise ValueError(f"local_step_block needs a positive integer k, got {k!r}")
  with tuned(step_block=k):
    yield


@contextlib.contextmanager
def local_epoch_chunk(size: Optional[int]):
  """Within the block, ``local_epochs`` rounds with partial participation run their participants
  sorted by step count in chunks of ``size`` (``fd.tuned(epoch_chunk=size)``; None: in the
  backend's own plan, unsorted, ``epoch_groups=1``). Results do not depend on it (each
  participant keeps its own key and minibatches; sums run in another order: equal to rounding);
  only the speed and the memory of a round do."""
  if size is not None and (not is_int(size) or size < 1):
    raise ValueError(f"local_epoch_chunk needs a positive integer or None, got {size!r}")
  if size is None:
    with reset("epoch_chunk"), tuned(epoch_groups=1):
      yield
  else:
    with tuned(epoch_chunk=size):
      yield


@contextlib.contextmanager
def local_folded_step(enabled: bool):
  """Within the block, programs traced for ``local_epochs`` local SGD with participants side by
  side use the folded form of the masked step (``enabled``) or the select form
  (``fd.tuned(folded_step=enabled)``). The results are the same up to rounding (tested against
  the reference loop); only the speed differs."""
  if not isinstance(enabled, bool):
    raise ValueError(f"local_folded_step needs True or False, got {enabled!r}")
  with tuned(folded_step=enabled):
    yield


def step_block() -> int:
  """The local steps per exit test of the epoch loop (the traced program's tuning)."""
  return current().step_block


def epoch_chunk(participants: Optional[int] = None):
  """The participants per step-sorted chunk of a ``local_epochs`` round of ``participants``
  clients: the tuning's ``epoch_chunk``, else ``ceil(participants / epoch_groups)`` (None when
  ``participants`` is None)."""
  tuning = current()
  if tuning.epoch_chunk is not None:
    return tuning.epoch_chunk
  if participants is None:
    return None
  return -(-int(participants) // tuning.epoch_groups)


def folded_step() -> bool:
  """Whether local SGD folds its masked step (the traced program's tuning)."""
  return current().folded_step


def loop_body(one, steps, block: int):
  """The body of the epoch loop ``(j, carry, losses) -> (j', carry', losses')`` around
  ``one(j, carry) -> (carry, loss)``: one step (``block`` 1), or a fixed-length scan of
  ``block`` steps, those at or past the client's ``steps`` masked (carry kept, loss 0)."""
  if block == 1:

    def body(state):
      j, c, losses = state
      new, loss = one(j, c)
      return j + 1, new, losses.at[j].set(loss)

    return body

  def masked(inner, i):
    j, c, losses = inner
    new, loss = one(j, c)
    take = j < steps
    c = jax.tree.map(lambda a, b: jnp.where(take, a, b), new, c)
    losses = losses.at[j].set(jnp.where(take, loss, jnp.zeros_like(loss)), mode="drop")
    return (j + 1, c, losses), None

  return lambda state: jax.lax.scan(masked, state, None, length=block)[0]


def shared_exit(num_steps: int) -> bool:
  """Whether :func:`epoch_loop` of ``num_steps`` runs a given ``masked_step`` with one exit test
  shared by the clients: a block of 1 step (:func:`step_block`), :func:`folded_step` on, and the
  loop traced for clients side by side in a vmap over :data:`~fedjax_dro.core.clients.
  CLIENT_AXIS`."""
  from fedjax_dro.core.clients import client_axis_bound

  block = min(step_block(), num_steps)
  return block == 1 and folded_step() and client_axis_bound()


def epoch_loop(step, batch, steps, num_steps: int, carry, masked_step=None):
  """``(carry, losses[num_steps])``: the ``local_epochs`` loop of ``step(carry, *batch(j)) ->
  (carry, loss)`` over a client's ``steps`` minibatches (``losses[j]`` 0 past them).

  By default a ``while_loop`` on the client's own count, its exit tested every
  :func:`step_block` steps (:func:`loop_body`); under ``vmap`` JAX runs it until every client is
  done, selecting between each client's new and old carry at every step. With ``masked_step(j,
  active, carry, *batch(j)) -> (carry, loss)`` (step ``j``, keeping the carry itself where
  ``active`` is False) and :func:`shared_exit`, one exit test the clients share instead: the
  loop runs to the largest of their ``steps`` (their maximum over the client axis, an unbatched
  loop: no select) and ``masked_step`` masks each client's steps past its own count. The carry
  is the one ``masked_step`` takes, which may differ from ``step``'s (a caller that checks
  :func:`shared_exit` first may pass a ``step`` that is never called)."""
  from fedjax_dro.core.clients import CLIENT_AXIS

  def one(j, c):
    return step(c, *batch(j))

  if masked_step is None or not shared_exit(num_steps):
    loss_shape = jax.eval_shape(lambda c: one(jnp.int32(0), c)[1], carry)
    losses = jnp.zeros((num_steps,) + loss_shape.shape, loss_shape.dtype)
    body = loop_body(one, steps, min(step_block(), num_steps))
    _, carry, losses = jax.lax.while_loop(
      lambda state: state[0] < steps, body, (jnp.int32(0), carry, losses)
    )
    return carry, losses
  top = jax.lax.pmax(steps, CLIENT_AXIS)  # the same for every client side by side
  zero = jnp.int32(0)
  loss_shape = jax.eval_shape(lambda c: masked_step(zero, True, c, *batch(zero))[1], carry)
  losses = jnp.zeros((num_steps,) + loss_shape.shape, loss_shape.dtype)

  def shared(state):
    j, c, losses = state
    active = j < steps
    c, loss = masked_step(j, active, c, *batch(j))
    return j + 1, c, losses.at[j].set(jnp.where(active, loss, jnp.zeros_like(loss)))

  with jax.named_scope("shared_exit"):  # the form is visible in the compiled program
    _, carry, losses = jax.lax.while_loop(
      lambda state: state[0] < top, shared, (jnp.int32(0), carry, losses)
    )
  return carry, losses
