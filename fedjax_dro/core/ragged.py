"""How a round runs its participants' unequal local work (``local_epochs``): how many local steps
run between two tests of the loop's exit condition (:func:`local_step_block`), and in how many
step-sorted chunks the sampled participants run (:func:`local_epoch_chunk`). Neither changes a
result, only the speed; :func:`fedjax_dro.core.local.scan_schedule` and
:func:`fedjax_dro.core.local.local_round` read them when a program is traced."""

from __future__ import annotations

import contextlib
from typing import Optional

import jax
import jax.numpy as jnp


@contextlib.contextmanager
def overriding(stack: list, value):
  """Within the block, ``value`` is the innermost entry of the override ``stack`` (the body of
  :func:`local_step_block`, :func:`local_epoch_chunk`, :func:`local_folded_step` and
  :func:`fedjax_dro.core.factored.local_factored_dense`)."""
  stack.append(value)
  try:
    yield
  finally:
    stack.pop()


def platform_name(platform: Optional[str] = None) -> str:
  """``platform`` (default ``jax.default_backend()``) with ``cuda`` and ``rocm`` named ``gpu``:
  the key of the ``*_AUTO`` tables."""
  platform = platform or jax.default_backend()
  return "gpu" if platform in ("cuda", "rocm") else platform


# Local steps per test of the epoch loop's exit condition, by platform (``local_epochs``; see
# :func:`scan_schedule`). XLA's GPU runtime copies a ``while_loop``'s predicate to the host and
# waits for it on every iteration; a block of k steps is a fixed-length ``lax.scan`` (a loop of
# known trip count, run without that round trip) inside the ``while_loop``, so the host waits
# once per k steps, at the price of up to k - 1 masked steps at the end. Measured on an H100
# (``benchmarks/anchors.py``, the FEMNIST-sized round): the device stays busy over 90% of the
# round at k = 1 and the masked steps cost more than the round trips saved (k = 1, 4, 8: 22.7,
# 26.6, 27.7 ms a round), so 1 everywhere; ``local_step_block`` chooses another k.
STEP_BLOCK_AUTO = {"cpu": 1, "gpu": 1}
_STEP_BLOCK: list = []  # the override of local_step_block(), innermost last


@contextlib.contextmanager
def local_step_block(k: int):
  """Within the block, programs traced for ``local_epochs`` test the loop's exit condition every
  ``k`` local steps (default: :data:`STEP_BLOCK_AUTO` of the platform). The results do not
  depend on ``k`` (steps past a client's own count are masked); only the speed does. Takes
  effect on programs traced inside the block (a new algorithm object, or a new run)."""
  if not isinstance(k, int) or isinstance(k, bool) or k < 1:
    raise ValueError(f"local_step_block needs a positive integer k, got {k!r}")
  with overriding(_STEP_BLOCK, k):
    yield


def step_block(platform: Optional[str] = None) -> int:
  """The local steps per exit test of the epoch loop: :func:`local_step_block`'s ``k`` inside
  one, else :data:`STEP_BLOCK_AUTO` of ``platform`` (default ``jax.default_backend()``; ``cuda``
  and ``rocm`` count as ``gpu``; other platforms 1)."""
  if _STEP_BLOCK:
    return _STEP_BLOCK[-1]
  platform = platform_name(platform)
  return STEP_BLOCK_AUTO.get(platform, 1)


# Groups of participants of a ``local_epochs`` round, by platform (None: as the backend plans).
# Side by side, a round's participants run until the one with the most steps is done, the others
# masked; on a GPU a masked step costs what a real one does (each client's weights are read and
# written every step: the round is bound by memory traffic), so the participants of a sampled
# round are sorted by their step counts and run in this many chunks, each until its own largest
# is done. Measured on an H100 (``benchmarks/anchors.py``, the FEMNIST-sized round: 10
# participants of 1 to 47 steps): one group 22.8 ms a round, 2 groups of 5 18.7 ms, 5 groups of
# 2 19.3 ms, one at a time 17.9 ms with the device idle 40% of the round (each chunk's loop is
# launched and waited for step by step). More groups cost more loop iterations where the
# participants' step counts are equal (a cohort of equal clients gains nothing from sorting), so
# 2. The CPU keeps the backend's plan: None.
EPOCH_GROUPS_AUTO = {"cpu": None, "gpu": 2}
_EPOCH_CHUNK: list = []  # the override of local_epoch_chunk(), innermost last


@contextlib.contextmanager
def local_epoch_chunk(size: Optional[int]):
  """Within the block, ``local_epochs`` rounds with partial participation run their participants
  sorted by step count in chunks of ``size`` (None: in the backend's own plan, unsorted; default:
  :data:`EPOCH_GROUPS_AUTO` of the platform). Results do not depend on it (each participant keeps
  its own key and minibatches; sums run in another order: equal to rounding); only the speed
  and the memory of a round do. Takes effect on programs traced inside the block."""
  if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
    raise ValueError(f"local_epoch_chunk needs a positive integer or None, got {size!r}")
  with overriding(_EPOCH_CHUNK, size):
    yield


def epoch_chunk(platform: Optional[str] = None, participants: Optional[int] = None):
  """The participants per step-sorted chunk of a ``local_epochs`` round of ``participants``
  clients: the innermost :func:`local_epoch_chunk`, else ``ceil(participants / groups)`` with
  ``groups`` from :data:`EPOCH_GROUPS_AUTO` of ``platform`` (default ``jax.default_backend()``;
  ``cuda`` and ``rocm`` count as ``gpu``; other platforms, or ``participants`` None: None)."""
  if _EPOCH_CHUNK:
    return _EPOCH_CHUNK[-1]
  platform = platform_name(platform)
  groups = EPOCH_GROUPS_AUTO.get(platform)
  if groups is None or participants is None:
    return None
  return -(-int(participants) // groups)


# How local SGD masks the steps of participants that are done (``local_epochs``, participants
# side by side under ``vmap``, no gradient correction), by platform. False: each client's loop
# tests its own count, and JAX runs the batched loop until all are done, selecting between the
# new and the old weights of every client at every step (a read of both and a write of the
# weights, the largest kernel of the FEMNIST-sized round on an H100). True: one loop to the
# chunk's largest count (an unbatched exit test, the count's maximum over the client axis), and
# the step size, 0 for a client past its own steps, folded into the loss before differentiating:
# ``w + grad(-lr * active * loss)``, an update XLA fuses into the weight gradient's product.
# Measured on an H100 (``benchmarks/femnist_levers.py``, 5 FEMNIST participants of 19 to 47
# steps): 0.545 -> 0.398 ms a step, the weights closer to a full-precision run than the select
# form's (TF32 products: 0.0069 and 0.012 apart); the FEMNIST-sized round 18.7 -> 14.3 ms
# (``benchmarks/anchors.py``). On the 2-core CPU no faster, so off there. A
# done client's step still runs on its padded minibatch with step size 0: a model whose loss is
# not finite on padding rows (zeros) would make its weights NaN, which the run reports (the
# select form would have hidden it).
FOLDED_STEP_AUTO = {"cpu": False, "gpu": True}
_FOLDED_STEP: list = []  # the override of local_folded_step(), innermost last


@contextlib.contextmanager
def local_folded_step(enabled: bool):
  """Within the block, programs traced for ``local_epochs`` local SGD with participants side by
  side use the folded form of the masked step (``enabled``) or the select form (default:
  :data:`FOLDED_STEP_AUTO` of the platform). The results are the same up to rounding (tested
  against the reference loop); only the speed differs. Takes effect on programs traced inside
  the block."""
  if not isinstance(enabled, bool):
    raise ValueError(f"local_folded_step needs True or False, got {enabled!r}")
  with overriding(_FOLDED_STEP, enabled):
    yield


def folded_step(platform: Optional[str] = None) -> bool:
  """Whether local SGD folds its masked step (:func:`local_folded_step` inside one, else
  :data:`FOLDED_STEP_AUTO` of ``platform``, default ``jax.default_backend()``; ``cuda`` and
  ``rocm`` count as ``gpu``; other platforms False)."""
  if _FOLDED_STEP:
    return _FOLDED_STEP[-1]
  platform = platform_name(platform)
  return FOLDED_STEP_AUTO.get(platform, False)


def step_sorted_order(counts, chunk: int):
  """``[s]`` positions: the participants sorted by ``counts`` (their local steps) and laid out so
  that each chunk of :func:`~fedjax_dro.core.clients.map_clients` with ``chunk_size=chunk``
  holds consecutive ranks. When ``chunk`` divides ``s`` into several chunks the chunks are
  strided (chunk ``j`` holds positions ``j, j + s / chunk, ...``), else contiguous."""
  s = counts.shape[0]
  ranked = jnp.argsort(counts, stable=True)
  full, rest = divmod(s, chunk)
  if rest == 0 and full > 1:
    return ranked.reshape(full, chunk).T.reshape(-1)
  return ranked


def sorted_participants(chunk, counts, client_update, inputs, backend, chunk_size, stacked=None):
  """``(inputs, backend, chunk_size, inverse)``: how :func:`~fedjax_dro.core.local.local_round`
  runs its participants. With a ``chunk`` smaller than their number and the ``auto`` backend,
  ``inputs`` (``(clients, keys, starts, rows, weights)``, each stacked over the participants)
  are put in :func:`step_sorted_order` of their step ``counts`` and run in chunks of ``chunk``
  (never larger than the memory plan of ``auto`` allows: :func:`~fedjax_dro.core.clients.
  plan_clients` of ``client_update``, ``stacked`` its kept outputs); ``inverse`` puts the
  per-participant outputs back in order. With the ``map`` or ``chunked`` backend and step
  ``counts`` (sampled participants of a ``local_epochs`` round), the participants run in
  :func:`step_sorted_order` of their counts in the backend's own chunks: one participant, or
  ``chunk_size``, at a time. A single run gains what a chunk of equal counts gains; a vmapped
  sweep (``fd.sweep``) gains more, since each configuration's ``i``-th participant runs beside
  the others' ``i``-th, and sorted, those have similar counts (on the FEMNIST-sized workload,
  64 configurations: 169 client-steps executed per configuration and round instead of 252, of
  116 their own). Otherwise ``inputs``, ``backend`` and ``chunk_size`` as they are, and
  ``inverse`` None."""
  from fedjax_dro.core.clients import DEFAULT_CHUNK_SIZE, plan_clients

  clients, keys, starts, rows, _ = inputs
  if counts is not None and backend in ("map", "chunked"):
    size = 1 if backend == "map" else min(chunk_size or DEFAULT_CHUNK_SIZE, keys.shape[0])
    order = step_sorted_order(counts, size)
    return jax.tree.map(lambda a: a[order], inputs), backend, chunk_size, jnp.argsort(order)
  if chunk is None or chunk >= keys.shape[0] or backend != "auto":
    return inputs, backend, chunk_size, None
  args = (clients.x, clients.y, clients.num_examples, keys, starts, rows)
  planned, planned_size = plan_clients(client_update, args, stacked=stacked)
  chunk = chunk if planned == "vmap" else min(chunk, planned_size or 1)
  order = step_sorted_order(counts, chunk)
  ran = jax.tree.map(lambda a: a[order], inputs)
  backend, size = ("map", None) if chunk == 1 else ("chunked", chunk)
  return ran, backend, size, jnp.argsort(order)


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

  _, carry, losses = jax.lax.while_loop(
    lambda state: state[0] < top, shared, (jnp.int32(0), carry, losses)
  )
  return carry, losses
