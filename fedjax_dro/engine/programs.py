"""Compiled programs of rounds and evaluation, and the cache that reuses them.

One chunk of rounds is one XLA program (:func:`make_chunk_fn`): a ``lax.scan`` over rounds of
``alg.round`` with a finiteness check per round. Round ``r`` uses the key
``fold_in(run_key, r)``, so results do not depend on the chunking; rounds past ``rounds``
(padding of the last chunk) and rounds after a non-finite one are inactive (the state is left
unchanged). :func:`make_eval_fn` evaluates every client; :func:`evaluate_host` does it in chunks
of clients for host-resident data. :class:`ProgramCache` keeps compiled programs for later calls
with the same settings.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.base import Algorithm
from fedjax_dro.core.metrics import estimation_error, evaluate_clients
from fedjax_dro.core.sampling import sample_clients


def _all_finite(tree) -> jnp.ndarray:
  leaves = [
    jnp.all(jnp.isfinite(x))
    for x in jax.tree.leaves(tree)
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
  ]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def abstract_key(tree) -> tuple:
  """A hashable description of ``tree``'s structure, shapes and dtypes (for program caches)."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple(
    (tuple(np.shape(x)), str(jnp.result_type(x)), bool(getattr(x, "weak_type", False)))
    for x in leaves
  )


class ProgramCache:
  """Compiled programs of an algorithm, reused by later calls with the same settings.

  ``fedjax_dro.run`` and ``fedjax_dro.sweep`` compile their rounds ahead of time; a notebook that
  calls them again with the same algorithm object and data shapes (another seed, other
  hyper-parameters: both are arguments of the program, not constants in it; K-fold
  cross-validation on folds padded to one shape) reuses the compiled program instead of paying
  the compilation again. Keys hold what the program depends on besides its arguments' values:
  the algorithm object (entries keep a reference to it, so the ``id`` of a collected algorithm is
  never confused with a newer object's), the argument shapes, dtypes and shardings, the caller's
  static settings and the run's resolved :class:`~fedjax_dro.common.tuning.Tuning` (the caller
  puts it in the key: the program is traced inside its scope, and is a function of it alone).
  Least recently used entries are dropped beyond ``max_entries``.
  """

  def __init__(self, max_entries: int = 8):
    self.max_entries = max_entries
    self._entries: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()

  def _key(self, alg, key):
    return (id(alg),) + tuple(key)

  def get(self, alg, key):
    """The cached value for ``(alg, key)``, or None."""
    full = self._key(alg, key)
    hit = self._entries.get(full)
    if hit is None or hit[0] is not alg:
      return None
    self._entries.move_to_end(full)
    return hit[1]

  def put(self, alg, key, value) -> None:
    self._entries[self._key(alg, key)] = (alg, value)
    while len(self._entries) > self.max_entries:
      self._entries.popitem(last=False)

  def clear(self) -> None:
    self._entries.clear()

  def __len__(self) -> int:
    return len(self._entries)


def make_chunk_fn(alg: Algorithm, rounds: int, chunk: int, check_finite: bool):
  """``(state, status, start, hparams, run_key, data) -> (state, status, metrics[chunk])``.

  ``status = (failed, first_bad_round)``; rounds ``>= rounds`` and rounds after a failure are
  inactive (state unchanged).
  """

  def chunk_fn(state, status, start, hparams, run_key, data):
    def body(carry, r):
      state, failed, first_bad = carry
      new_state, metrics = alg.round(state, data, jax.random.fold_in(run_key, r), hparams)
      active = (r < rounds) & ~failed
      finite = (_all_finite(new_state) & _all_finite(metrics)) if check_finite else jnp.array(True)
      ok = active & finite
      # The state keeps its dtypes across rounds (float32 models stay float32 under x64 hparams).
      state = jax.tree.map(
        lambda new, old: jnp.where(ok, new, old).astype(old.dtype), new_state, state
      )
      newly_failed = active & ~finite
      first_bad = jnp.where(newly_failed & (first_bad < 0), r, first_bad)
      return (state, failed | newly_failed, first_bad), metrics

    (state, failed, first_bad), metrics = jax.lax.scan(
      body, (state, status[0], status[1]), start + jnp.arange(chunk, dtype=jnp.int32)
    )
    return state, (failed, first_bad), metrics

  return chunk_fn


def make_eval_fn(alg: Algorithm, true_params):
  """``(state, data) -> {metric: [n]}``: every client's metrics under ``alg``'s client models,
  and the ``estimation_error`` against ``true_params`` when they are given."""

  def eval_fn(state, data):
    params = alg.client_models(state)
    out = evaluate_clients(alg.model, params, data, alg.personalized)
    err = estimation_error(params, true_params, alg.personalized)
    if err is not None:
      out["estimation_error"] = jnp.broadcast_to(err, (data.num_clients,))
    return out

  return eval_fn


# ----------------------------------------------------------------------------------------------
# Host-resident data: evaluation in chunks of clients, and the sampler's predicted participants
# ----------------------------------------------------------------------------------------------
EVAL_CHUNK_CLIENTS = 1024
EVAL_ROWS = 1 << 18  # padded rows of a chunk of clients above which streamed clients go by batches


def evaluate_host(alg: Algorithm, state, data, true_params, *, batched: bool = False):
  """Per-client metrics ``{name: [n]}`` (``[B, n]`` with ``batched``) of host-resident ``data``.

  The clients are evaluated in chunks of :data:`EVAL_CHUNK_CLIENTS` (one compiled shape; the last
  chunk is padded by repeating its final client and the padding is dropped), so only one chunk of
  rows is on the device at a time. Equals ``make_eval_fn(alg, true_params)(state, data)`` on the
  device-resident data.
  """
  n = data.num_clients
  size = min(EVAL_CHUNK_CLIENTS, n)
  true_params = None if true_params is None else np.asarray(true_params)
  axis = 1 if batched else 0
  if getattr(data, "streamed", False) and size * data.max_examples > EVAL_ROWS:
    return _evaluate_streamed(alg, state, data, batched)

  def chunk_eval(params, chunk, true_rows):
    out = evaluate_clients(alg.model, params, chunk, alg.personalized)
    err = estimation_error(params, true_rows, alg.personalized)
    if err is not None:
      out["estimation_error"] = jnp.broadcast_to(err, (chunk.num_clients,))
    return out

  client_models = jax.jit(jax.vmap(alg.client_models) if batched else alg.client_models)
  if batched:
    chunk_eval = jax.vmap(chunk_eval, in_axes=(0, None, None))
  chunk_eval = jax.jit(chunk_eval)
  params = client_models(state)
  outs = []
  for start, chunk in data.client_chunks(size):
    stop = min(start + size, n)
    rows = np.concatenate([np.arange(start, stop), np.full(size - (stop - start), stop - 1)])
    take = functools.partial(jnp.take, indices=jnp.asarray(rows), axis=axis)
    p = jax.tree.map(take, params) if alg.personalized else params
    t = None if true_params is None else true_params[rows]
    out = jax.device_get(chunk_eval(p, chunk, t))
    outs.append({k: np.take(v, np.arange(stop - start), axis=axis) for k, v in out.items()})
  return {k: np.concatenate([o[k] for o in outs], axis=axis) for k in outs[0]}


def _evaluate_streamed(alg: Algorithm, state, data, batched: bool):
  """Per-client metrics of a streamed split whose padded clients are too many rows to evaluate
  in chunks of clients: each client's rows in batches
  (:func:`~fedjax_dro.core.split_eval.evaluate_split`; the loss and the model's metrics, a
  configuration at a time with ``batched``)."""
  from fedjax_dro.core.split_eval import evaluate_split

  params = jax.device_get(
    jax.jit(jax.vmap(alg.client_models) if batched else alg.client_models)(state)
  )
  configs = jax.tree.leaves(params)[0].shape[0] if batched else None
  outs = []
  for c in range(configs or 1):
    p = jax.tree.map(lambda a, c=c: a[c], params) if batched else params
    out = evaluate_split(alg.model, p, data, personalized=alg.personalized)["per_client"]
    outs.append({k: np.asarray(v, np.float32) for k, v in out.items() if k != "rows"})
  if not batched:
    return outs[0]
  return {k: np.stack([o[k] for o in outs]) for k in outs[0]}


def predicted_participants(alg: Algorithm, num_clients: int, run_key, rounds) -> np.ndarray:
  """``[len(rounds), s]`` clients that the uniform sampler of ``core.local.local_round`` draws in
  ``rounds`` (a prefetch hint for host-resident data; exact for the FedAvg family)."""
  s = alg.settings.clients_per_round if alg.settings is not None else None
  s = num_clients if s is None else int(s)

  @jax.jit
  def draw(rs):
    keys = jax.vmap(lambda r: jax.random.split(jax.random.fold_in(run_key, r))[0])(rs)
    return jax.vmap(lambda k: sample_clients(k, num_clients, s))(keys)

  return np.asarray(draw(jnp.asarray(list(rounds), jnp.int32)))
