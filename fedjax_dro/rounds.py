"""Compiled chunks of rounds, the pieces :func:`fedjax_dro.run` and :func:`fedjax_dro.sweep` share,
and :func:`compile_rounds`, the public way to run and time them.

One chunk of rounds is one XLA program: a ``lax.scan`` over rounds of ``alg.round`` with a
finiteness check per round. Round ``r`` uses the key ``fold_in(run_key, r)``, so results do not
depend on the chunking; rounds past ``rounds`` (padding of the last chunk) and rounds after a
non-finite one are inactive (the state is left unchanged).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Any, Dict, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.base import Algorithm, make_hparams
from fedjax_dro.core.clients import budget_override, client_shards
from fedjax_dro.core.metrics import estimation_error, evaluate_clients, summarize_all
from fedjax_dro.data.federated import FederatedData, FederatedDataset, validate_data
from fedjax_dro.validation import check_hparams, check_run_inputs


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
  static settings, and an enclosing :func:`~fedjax_dro.core.clients.memory_budget_limit`. Least
  recently used entries are dropped beyond ``max_entries``.
  """

  def __init__(self, max_entries: int = 8):
    self.max_entries = max_entries
    self._entries: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()

  def _key(self, alg, key):
    return (id(alg), budget_override()) + tuple(key)

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


def is_host_data(data) -> bool:
  return bool(getattr(data, "host_resident", False))


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


def predicted_participants(alg: Algorithm, num_clients: int, run_key, rounds) -> np.ndarray:
  """``[len(rounds), s]`` clients that the uniform sampler of ``core.local.local_round`` draws in
  ``rounds`` (a prefetch hint for host-resident data; exact for the FedAvg family)."""
  from fedjax_dro.core.sampling import sample_clients

  s = alg.config.get("clients_per_round") if isinstance(alg.config, dict) else None
  s = num_clients if s is None else int(s)

  @jax.jit
  def draw(rs):
    keys = jax.vmap(lambda r: jax.random.split(jax.random.fold_in(run_key, r))[0])(rs)
    return jax.vmap(lambda k: sample_clients(k, num_clients, s))(keys)

  return np.asarray(draw(jnp.asarray(list(rounds), jnp.int32)))


def _validate(data, name):
  if is_host_data(data):  # validated when built (to_host / load_npy_dir)
    return
  validate_data(data, name)


def _split_data(data, eval_data, true_params):
  if isinstance(data, FederatedDataset):
    train = data.train
    eval_data = (
      eval_data if eval_data is not None else (data.test if data.test is not None else data.train)
    )
    true_params = true_params if true_params is not None else data.true_params
    name = data.name
  elif isinstance(data, FederatedData) or is_host_data(data):
    train, name = data, "custom"
    eval_data = eval_data if eval_data is not None else data
  else:
    raise TypeError(f"data must be a FederatedDataset or FederatedData, got {type(data).__name__}")
  _validate(train, "data")
  _validate(eval_data, "eval_data")
  if eval_data.num_clients != train.num_clients:
    raise ValueError(f"eval_data has {eval_data.num_clients} clients, data has {train.num_clients}")
  return train, eval_data, true_params, name


def _check_run_args(alg, rounds, eval_every):
  if not isinstance(alg, Algorithm):
    raise TypeError(
      f"alg must be an Algorithm (e.g. fedjax_dro.algorithms.fedavg(model)), got "
      f"{type(alg).__name__}"
    )
  if not isinstance(rounds, (int, np.integer)) or isinstance(rounds, bool) or rounds < 1:
    raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
  if eval_every is not None and (
    not isinstance(eval_every, (int, np.integer)) or isinstance(eval_every, bool) or eval_every < 1
  ):
    raise ValueError(f"eval_every must be a positive integer, got {eval_every!r}")
  return int(rounds), int(min(eval_every or max(1, min(rounds, 10)), rounds))


def _keys(seed_or_key):
  if isinstance(seed_or_key, (int, np.integer)) and not isinstance(seed_or_key, bool):
    if not 0 <= seed_or_key < 2**32:  # a negative seed would wrap silently
      raise ValueError(f"seed must be an integer in [0, 2**32), got {seed_or_key}")
    key = jax.random.PRNGKey(int(seed_or_key))
  elif (
    isinstance(seed_or_key, jax.Array)
    and seed_or_key.shape == (2,)
    and seed_or_key.dtype == jnp.uint32
  ):
    key = seed_or_key
  else:
    raise TypeError(f"seed must be an int or a PRNG key, got {seed_or_key!r}")
  model_key, init_key, run_key = jax.random.split(key, 3)
  return model_key, init_key, run_key


def _summaries(per_client, num_examples):
  return summarize_all({k: np.asarray(v) for k, v in per_client.items()}, np.asarray(num_examples))


def _main_metric(alg):
  return "accuracy" if alg.model.task == "classification" else "r2"


# ----------------------------------------------------------------------------------------------
# compile_rounds: the public way to run and time compiled chunks
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RoundTiming:
  """Steady-state timing of a :class:`CompiledRounds` program (compilation excluded).

  Attributes:
    seconds_per_round: median over the timed calls of (call time / rounds per call).
    rounds_per_second: ``1 / seconds_per_round``.
    call_seconds: wall time of every timed call (``block_until_ready`` included).
    rounds_per_call: rounds each call runs.
    compile_time: seconds spent compiling the program.
    device: the device the program ran on (``str(jax.devices()[0])``).
  """

  seconds_per_round: float
  rounds_per_second: float
  call_seconds: Tuple[float, ...]
  rounds_per_call: int
  compile_time: float
  device: str


class CompiledRounds:
  """``rounds`` communication rounds of an algorithm as one compiled program.

  The same program :func:`fedjax_dro.run` executes for one chunk of rounds (a ``lax.scan`` over
  ``alg.round`` with the per-round finiteness check), built by :func:`compile_rounds`. Calling it
  runs the rounds ``start_round .. start_round + rounds - 1`` from ``state`` (default: the
  initial state) and returns ``(state, metrics)`` with ``metrics[name]`` of shape ``[rounds]``.
  The input state is not donated, so the same state can be passed again (benchmarks).

  Attributes:
    algorithm, data, rounds, hparams: what was compiled.
    initial_state: ``alg.init`` of the initial parameters.
    compile_time: seconds spent compiling.
  """

  def __init__(
    self, algorithm, data, rounds, hparams, run_key, initial_state, program, compile_time, status
  ):
    self.algorithm = algorithm
    self.data = data
    self.rounds = rounds
    self.hparams = hparams
    self.run_key = run_key
    self.initial_state = initial_state
    self.compile_time = compile_time
    self._program = program
    self._status = status

  def __call__(self, state=None, start_round: int = 0):
    state = self.initial_state if state is None else state
    new_state, status, metrics = self._program(
      state, self._status, jnp.int32(start_round), self.hparams, self.run_key, self.data
    )
    if bool(np.asarray(jax.device_get(status[0]))):
      raise FloatingPointError(
        f"{self.algorithm.name}: round {int(status[1]) + 1} produced a non-finite value"
      )
    return new_state, metrics

  def as_text(self) -> str:
    """The compiled (optimized) HLO of the program, e.g. to check its collectives."""
    return self._program.as_text()

  def memory_analysis(self) -> Dict[str, int]:
    """XLA's memory plan of the program in bytes: ``argument``, ``output``, ``temp`` (the
    working memory of the rounds), ``alias`` and ``total`` (``argument + output + temp -
    alias``, the device memory the program needs at its peak); empty where the platform does
    not report it."""
    stats = self._program.memory_analysis()
    if stats is None:
      return {}
    out = {
      k: int(getattr(stats, f"{k}_size_in_bytes", 0))
      for k in ("argument", "output", "temp", "alias")
    }
    out["total"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out

  def time(self, repeats: int = 3, warmup: int = 1) -> RoundTiming:
    """Times ``repeats`` calls after ``warmup`` untimed ones (each from the initial state)."""
    if not isinstance(repeats, int) or repeats < 1:
      raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
      raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    for _ in range(warmup):
      jax.block_until_ready(self()[0])
    calls = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(self()[0])
      calls.append(time.perf_counter() - t0)
    per_round = float(np.median(calls)) / self.rounds
    return RoundTiming(
      per_round,
      1.0 / per_round,
      tuple(calls),
      self.rounds,
      self.compile_time,
      str(jax.devices()[0]),
    )


def compile_rounds(
  alg: Algorithm,
  data: Union[FederatedDataset, FederatedData],
  *,
  rounds: int,
  hparams: Optional[Dict[str, Any]] = None,
  seed: Union[int, jax.Array] = 0,
  init_params=None,
  check_finite: bool = True,
  mesh=None,
) -> CompiledRounds:
  """Compiles ``rounds`` rounds of ``alg`` on ``data`` into one program (see
  :class:`CompiledRounds`); the keys, initial state and hyper-parameters derive from ``seed``
  and ``hparams`` exactly as in :func:`fedjax_dro.run`, so ``compile_rounds(...)()`` runs the
  rounds ``run`` would run. ``.time()`` gives the steady-state throughput::

      prog = fd.compile_rounds(alg, data, rounds=20, hparams={"client_lr": 0.05})
      timing = prog.time(repeats=3)
      print(timing.rounds_per_second, prog.compile_time)

  ``mesh`` shards the client axis of the data over the mesh's ``"clients"`` axis as in
  :func:`fedjax_dro.run` (see :mod:`fedjax_dro.sharding`).
  """
  rounds, _ = _check_run_args(alg, rounds, None)
  train, _, _, _ = _split_data(data, None, None)
  check_run_inputs(alg, train, None, init_params=init_params)
  hp = make_hparams(alg, hparams)
  check_hparams(alg, hp, init_params=init_params)
  model_key, init_key, run_key = _keys(seed)
  params = alg.model.init(model_key) if init_params is None else init_params
  state = jax.tree.map(jnp.copy, alg.init(params, train, init_key))
  status = (jnp.array(False), jnp.array(-1, jnp.int32))
  if mesh is not None:
    from fedjax_dro.sharding import check_mesh, place_data, place_replicated

    mesh = check_mesh(mesh)
    train = place_data(train, mesh, what="data")
    state, status, hp, run_key = place_replicated((state, status, hp, run_key), mesh)
  # every round of a call is active, whatever start_round (no total-rounds cut-off)
  chunk_fn = jax.jit(make_chunk_fn(alg, np.iinfo(np.int32).max, rounds, check_finite))
  t0 = time.perf_counter()
  shards = 1
  if mesh is not None:
    from fedjax_dro.sharding import axis_size

    shards = axis_size(mesh, "clients")
  with client_shards(shards):
    program = chunk_fn.lower(state, status, jnp.int32(0), hp, run_key, train).compile()
  compile_time = time.perf_counter() - t0
  return CompiledRounds(alg, train, rounds, hp, run_key, state, program, compile_time, status)
