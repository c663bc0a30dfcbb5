"""The simulator: ``run`` scans rounds in jitted chunks (``sweep``, in :mod:`fedjax_dro.sweeps`,
vmaps whole runs over seeds and hyper-parameters; :func:`compile_rounds`, in
:mod:`fedjax_dro.rounds`, compiles and times chunks of rounds).

One chunk of ``eval_every`` rounds is one compiled XLA program (``lax.scan`` over rounds, no host
round-trip inside). Round ``r`` uses the key ``fold_in(run_key, r)``, so results do not depend on
the chunking. The last chunk is padded with inactive rounds (the state is left unchanged) so that a
run compiles exactly once whatever ``rounds`` is.

Non-finite values: every round checks its new state and metrics; the first non-finite round is
*not* applied (the state stays at the last finite one) and the run stops with
:class:`NonFiniteError` naming the round, carrying the last finite state and the history so far
(and, with ``out_dir``, the metrics already written to disk).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from contextlib import nullcontext
from typing import Any, Dict, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.base import Algorithm, make_hparams
from fedjax_dro.checkpoint import (
  CheckpointLock,
  load_checkpoint,
  save_checkpoint,
  scan as scan_checkpoints,
)
from fedjax_dro.core.clients import client_shards
from fedjax_dro.data.federated import FederatedData, FederatedDataset
from fedjax_dro.export import history_to_csv
from fedjax_dro.results import (
  History,
  append_lines,
  atomic_write,
  evaluation_record,
  json_default,
  jsonl_line,
  round_records,
)
from fedjax_dro.rounds import (
  CompiledRounds,
  ProgramCache,
  RoundTiming,
  _check_run_args,
  _keys,
  _main_metric,
  _split_data,
  _summaries,
  abstract_key,
  compile_rounds,
  evaluate_host,
  is_host_data,
  make_chunk_fn,
  make_eval_fn,
  predicted_participants,
)
from fedjax_dro.sharding import (
  axis_size,
  check_mesh,
  fetch,
  is_writer,
  place_data,
  place_replicated,
  sharding_key,
)
from fedjax_dro.sweeps import SweepResult, sweep
from fedjax_dro.validation import (
  check_hparams,
  check_run_inputs,
  is_out_of_memory,
  memory_error,
)

# Re-exported here, where they were defined before 0.2 (``from fedjax_dro.simulate import ...``).
__all__ = [
  "NonFiniteError",
  "History",
  "SweepResult",
  "CompiledRounds",
  "RoundTiming",
  "run",
  "sweep",
  "compile_rounds",
  "atomic_write",
]


class NonFiniteError(FloatingPointError):
  """A round produced NaN/Inf. ``.round`` is its index, ``.state`` the last finite state,
  ``.history`` what was recorded before it."""

  def __init__(self, message, round_index, state, history):
    super().__init__(message)
    self.round = round_index
    self.state = state
    self.history = history


# ----------------------------------------------------------------------------------------------
# run
# ----------------------------------------------------------------------------------------------


# Compiled programs of fd.run (the rounds and the evaluation), reused by a later call with the
# same algorithm object, settings and data shapes: a notebook's loop over seeds or
# hyper-parameters compiles once.
_RUN_PROGRAMS = ProgramCache(max_entries=8)


def _compile_run(alg, rounds, chunk, check_finite, true_params, args, eval_data, shards):
  """``(compiled chunk program, evaluation function, compile seconds)`` of a run."""
  chunk_fn = jax.jit(make_chunk_fn(alg, rounds, chunk, check_finite), donate_argnums=(0,))
  eval_fn = jax.jit(make_eval_fn(alg, true_params))
  t0 = time.perf_counter()
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    try:
      with client_shards(shards):
        compiled = chunk_fn.lower(*args).compile()
    except Exception as e:
      if is_out_of_memory(e):
        raise memory_error(e, f"compiling {alg.name}'s rounds") from None
      raise
    # The evaluation is compiled here too, for the state the chunk returns: its compilation is
    # compile time, not the first chunk's run time (benchmarks/speed.py measures both).
    if not is_host_data(eval_data):
      try:
        with client_shards(shards):
          lowered = eval_fn.lower(compiled.out_info[0], eval_data)
        eval_fn = _AheadOfTime(eval_fn, lowered.compile())
      except Exception as e:
        if is_out_of_memory(e):
          raise memory_error(e, f"compiling {alg.name}'s evaluation") from None
        raise
  return compiled, eval_fn, time.perf_counter() - t0


def run(
  alg: Algorithm,
  data: Union[FederatedDataset, FederatedData],
  *,
  rounds: int,
  seed: Union[int, jax.Array] = 0,
  hparams: Optional[Dict[str, Any]] = None,
  eval_data: Optional[FederatedData] = None,
  eval_every: Optional[int] = None,
  init_params=None,
  true_params=None,
  progress: bool = False,
  check_finite: bool = True,
  out_dir: Optional[str] = None,
  checkpoint_dir: Optional[str] = None,
  checkpoint_every: Optional[int] = None,
  keep_checkpoints: int = 2,
  mesh=None,
) -> History:
  """Runs ``rounds`` communication rounds of ``alg`` on ``data``.

  The rounds and the evaluation are compiled ahead of time (``History.compile_time``) and cached:
  a later call with the same algorithm object, settings and data shapes (another ``seed``, other
  ``hparams``, other data of the same shapes) reuses them and reports a compile time of 0.

  Args:
    alg: an :class:`~fedjax_dro.algorithms.base.Algorithm`.
    data: a :class:`FederatedDataset` (its ``test`` split is used for evaluation) or training
      :class:`FederatedData`.
    rounds: number of communication rounds.
    seed: int seed or PRNG key (model init, algorithm init and round keys derive from it).
    hparams: overrides of the algorithm's default hyper-parameters.
    eval_data: evaluation data (default: the test split, else the training data).
    eval_every: rounds per compiled chunk; evaluation happens after every chunk (default
      ``min(rounds, 10)``).
    init_params: initial model parameters (default ``alg.model.init``).
    true_params: ``[n, dim]`` true per-client parameters, for the estimation error.
    progress: show a tqdm progress bar (rounds, rate, mean and worst-20% of the main metric).
    check_finite: stop at the first round producing NaN/Inf (see :class:`NonFiniteError`).
    out_dir: if given, ``metrics.jsonl`` is appended after every chunk and ``summary.json`` is
      written at the end (atomically).
    checkpoint_dir: if given, the state and history are checkpointed there (arrays + JSON, atomic,
      checksummed; :mod:`fedjax_dro.checkpoint`) and a run started with the same configuration
      resumes from the newest checkpoint; the result is identical to an uninterrupted run (round
      keys depend only on the round index). The directory is locked for the run's duration.
    checkpoint_every: checkpoint at the first evaluation at or after every ``checkpoint_every``
      rounds (checkpoints happen at evaluation boundaries; default: at every evaluation), and
      always after the last round.
    keep_checkpoints: how many of the newest checkpoints to keep (>= 1).
    mesh: optional ``jax.sharding.Mesh`` (:func:`fedjax_dro.sharding.make_mesh`): the client axis
      of the data is split over its ``"clients"`` axis and XLA partitions the rounds (see
      :mod:`fedjax_dro.sharding`); with several processes (``jax.distributed``) only process 0
      writes ``out_dir`` and checkpoints.
  """
  rounds, chunk = _check_run_args(alg, rounds, eval_every)
  mesh = None if mesh is None else check_mesh(mesh)
  for name, value in (
    ("checkpoint_every", checkpoint_every),
    ("keep_checkpoints", keep_checkpoints),
  ):
    if value is not None and (
      isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
    ):
      raise ValueError(f"{name} must be a positive integer, got {value!r}")
  if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, os.PathLike)):
    raise TypeError(f"checkpoint_dir must be a path, got {type(checkpoint_dir).__name__}")
  if checkpoint_every is not None and checkpoint_dir is None:
    raise ValueError("checkpoint_every is given but checkpoint_dir is not: where should it save?")
  for name, flag in (("progress", progress), ("check_finite", check_finite)):
    if not isinstance(flag, (bool, np.bool_)):
      raise TypeError(f"{name} must be a bool, got {flag!r}")
  train, eval_data, true_params, data_name = _split_data(data, eval_data, true_params)
  check_run_inputs(
    alg, train, eval_data, init_params=init_params, out_dir=out_dir, checkpoint_dir=checkpoint_dir
  )
  hp = make_hparams(alg, hparams)
  check_hparams(alg, hp, init_params=init_params)
  model_key, init_key, run_key = _keys(seed)
  params = alg.model.init(model_key) if init_params is None else init_params
  # Fresh buffers: the state is donated between chunks, and an init may alias one array twice.
  state = jax.tree.map(jnp.copy, alg.init(params, train, init_key))
  # What the configuration does not say (the data's values, init_params, a precomputed
  # dissimilarity...): a checkpoint resumes only the run that wrote it.
  fingerprints = _fingerprints(train, eval_data, state) if checkpoint_dir is not None else None
  status = (jnp.array(False), jnp.array(-1, jnp.int32))
  host_data = is_host_data(train)
  eval_num_examples = np.asarray(eval_data.num_examples)  # host copy (before any sharding)
  if mesh is not None and (host_data or is_host_data(eval_data)):
    raise ValueError(
      "mesh and host-resident data (HostFederatedData) cannot be combined yet: shard "
      "device-resident data, or run host-resident data on one device"
    )
  if mesh is not None:
    train = place_data(train, mesh, what="data")
    eval_data = place_data(eval_data, mesh, what="eval_data")
    state, status, hp, run_key = place_replicated((state, status, hp, run_key), mesh)
  writer = is_writer()
  out_dir = out_dir if writer else None
  checkpoint_dir_write = checkpoint_dir if writer else None

  args = (state, status, jnp.int32(0), hp, run_key, train)
  shards = axis_size(mesh, "clients")
  key = (rounds, chunk, check_finite, abstract_key(args), sharding_key(args), shards)
  key += (abstract_key(eval_data), sharding_key(eval_data))
  cached = _RUN_PROGRAMS.get(alg, key) if true_params is None else None
  if cached is not None:  # same algorithm, settings and shapes: another seed or hparams
    compiled, eval_fn = cached
    compile_time = 0.0
  else:
    compiled, eval_fn, compile_time = _compile_run(
      alg, rounds, chunk, check_finite, true_params, args, eval_data, shards
    )
    if true_params is None:  # true_params is closed over: cache only the common case
      _RUN_PROGRAMS.put(alg, key, (compiled, eval_fn))

  config = {
    "algorithm": alg.name,
    "settings": alg.config,
    "hparams": {k: np.asarray(v).tolist() for k, v in hp.items()},
    "rounds": rounds,
    "eval_every": chunk,
    "seed": seed if isinstance(seed, int) else {"key": np.asarray(seed).tolist()},
    "dataset": data_name,
    "num_clients": train.num_clients,
  }
  if fingerprints is not None:
    config["fingerprints"] = fingerprints
  history = History(alg.name, config, {}, [])
  if checkpoint_dir is not None:
    scan_checkpoints(checkpoint_dir)  # foreign files: refused before the lock file is created
  lock = CheckpointLock(checkpoint_dir) if checkpoint_dir_write is not None else nullcontext()
  with lock:
    return _run_chunks(
      alg,
      rounds,
      chunk,
      compiled,
      eval_fn,
      state,
      status,
      hp,
      run_key,
      train,
      eval_data,
      true_params,
      eval_num_examples,
      history,
      compile_time,
      progress,
      out_dir,
      checkpoint_dir,
      checkpoint_dir_write,
      checkpoint_every,
      keep_checkpoints,
      mesh,
      host_data,
    )


def _run_chunks(
  alg,
  rounds,
  chunk,
  compiled,
  eval_fn,
  state,
  status,
  hp,
  run_key,
  train,
  eval_data,
  true_params,
  eval_num_examples,
  history,
  compile_time,
  progress,
  out_dir,
  checkpoint_dir,
  checkpoint_dir_write,
  checkpoint_every,
  keep_checkpoints,
  mesh,
  host_data,
):
  """The chunk loop of :func:`run`: resume, run, evaluate, record, checkpoint."""
  config = history.config
  metric_chunks: Dict[str, list] = {}
  wall, first_chunk = 0.0, 0
  resumed = load_checkpoint(checkpoint_dir, config, state) if checkpoint_dir else None
  if resumed is not None:
    payload, state = resumed
    first_chunk, wall = payload["next_chunk"], payload["wall_time"]
    status = (jnp.array(payload["status"][0]), jnp.array(payload["status"][1], jnp.int32))
    if mesh is not None:
      state, status = place_replicated((state, status), mesh)
    history.train_metrics, history.evaluations = payload["train_metrics"], payload["evaluations"]
    history.final_state = state
    metric_chunks = {k: [v] for k, v in history.train_metrics.items()}
    if payload["status"][0]:  # the run had stopped at a non-finite round: it stays stopped
      history.wall_time, history.compile_time = wall, compile_time
      raise _nonfinite_error(alg, int(payload["status"][1]), hp, state, history)
  bar = _progress_bar(rounds, alg.name) if progress else None
  if bar is not None and first_chunk:
    bar.update(min(rounds, first_chunk * chunk))
  jsonl_path = None
  if out_dir is not None:
    os.makedirs(out_dir, exist_ok=True)
    jsonl_path = os.path.join(out_dir, "metrics.jsonl")
    jsonl = _JsonlWriter(jsonl_path, [jsonl_line(rec) for rec in history.jsonl_records()])
  main = _main_metric(alg)
  last_checkpoint = first_chunk * chunk
  try:
    for c in range(first_chunk, math.ceil(rounds / chunk)):
      start = c * chunk
      t0 = time.perf_counter()
      if host_data:  # prefetch hint: the participants of this chunk's rounds
        train.store.expect(
          predicted_participants(alg, train.num_clients, run_key, range(start, start + chunk))
        )
      try:
        new_state, status, metrics = compiled(state, status, jnp.int32(start), hp, run_key, train)
        host_status, metrics = fetch((status, metrics))
      except Exception as e:
        if is_out_of_memory(e):
          raise memory_error(e, f"running {alg.name}'s rounds {start + 1}..") from None
        raise
      failed, first_bad = (bool(host_status[0]), int(host_status[1]))
      state = new_state
      done = min(rounds, start + chunk) if not failed else first_bad
      metrics = {k: np.asarray(v)[: done - start] for k, v in metrics.items()}
      per_client = (
        evaluate_host(alg, state, eval_data, true_params)
        if is_host_data(eval_data)
        else fetch(eval_fn(state, eval_data))
      )
      wall += time.perf_counter() - t0
      for k, v in metrics.items():
        metric_chunks.setdefault(k, []).append(v)
      history.train_metrics = {k: np.concatenate(v) for k, v in metric_chunks.items()}
      evaluation = {
        "round": done,
        "per_client": per_client,
        "summary": _summaries(per_client, eval_num_examples),
      }
      history.evaluations.append(evaluation)
      history.final_state = state
      if jsonl_path is not None:  # appended and flushed to disk as it happens
        lines = [jsonl_line(rec) for rec in round_records(metrics, start)]
        jsonl.write(lines + [jsonl_line(evaluation_record(evaluation))])
      last = failed or done >= rounds
      due = (
        checkpoint_every is None or done // checkpoint_every > last_checkpoint // checkpoint_every
      )
      if checkpoint_dir_write is not None and (due or last):
        save_checkpoint(
          checkpoint_dir_write,
          config,
          c + 1,
          done,
          fetch(state),
          host_status,
          history,
          wall,
          keep=keep_checkpoints,
        )
        last_checkpoint = done
      if bar is not None:
        s = evaluation["summary"].get(main, {})
        bar.update(done - start)
        bar.set_postfix(
          {
            f"{main}": f"{s.get('mean', float('nan')):.4f}",
            "worst20": f"{s.get('worst20', float('nan')):.4f}",
          }
        )
      if failed:
        history.wall_time, history.compile_time = wall, compile_time
        raise _nonfinite_error(alg, first_bad, hp, state, history)
  finally:
    if bar is not None:
      bar.close()
  history.wall_time, history.compile_time = wall, compile_time
  if out_dir is not None:
    atomic_write(
      os.path.join(out_dir, "summary.json"),
      json.dumps(history.summary(), indent=2, default=json_default),
    )
    history_to_csv(history, out_dir)
  return history


def _fingerprints(train, eval_data, state) -> Dict[str, str]:
  """SHA-256 of the training / evaluation arrays (host-resident data: not hashed) and of the
  initial algorithm state."""

  def digest(tree):
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
      if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
      arr = np.ascontiguousarray(jax.device_get(leaf))
      h.update(f"{arr.dtype.str}{arr.shape}".encode())
      h.update(arr.tobytes())
    return h.hexdigest()

  out = {"initial_state": digest(state)}
  for name, d in (("data", train), ("eval_data", eval_data)):
    out[name] = "host-resident" if is_host_data(d) else digest((d.x, d.y, d.num_examples))
  return out


def _nonfinite_error(alg, first_bad, hp, state, history) -> NonFiniteError:
  shown = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in hp.items()}
  return NonFiniteError(
    f"{alg.name}: round {first_bad + 1} (0-based index {first_bad}) produced a non-finite "
    f"value (NaN/Inf) in the state or metrics; the run stopped and kept the state after "
    f"round {first_bad}. Lower the step sizes (hparams={shown}) or check the data.",
    first_bad,
    state,
    history,
  )


class _AheadOfTime:
  """A compiled program with its ``jax.jit`` function as the fallback for inputs it was not
  compiled for (e.g. a state restored from a checkpoint with other shardings)."""

  def __init__(self, jitted, compiled):
    self.jitted, self.compiled = jitted, compiled

  def __call__(self, *args):
    try:
      return self.compiled(*args)
    except (TypeError, ValueError):
      return self.jitted(*args)


class _JsonlWriter:
  """``metrics.jsonl`` that never loses a finished evaluation.

  A fresh run starts the file. A resumed run keeps what is on disk when it starts with the
  checkpoint's records (evaluations a killed run finished after its last checkpoint stay in the
  file, only a partially written last line is dropped); the resumed run then recomputes those
  rounds identically and skips every line already present, so the file ends with no duplicates
  or gaps. Anything else on disk (another run's file) is replaced.
  """

  def __init__(self, path: str, prefix):
    self.path = path
    existing = []
    if prefix and os.path.exists(path):
      with open(path) as f:
        existing = f.read().splitlines(keepends=True)
      if existing and not existing[-1].endswith("\n"):
        existing = existing[:-1]  # a line cut by a kill
    if existing[: len(prefix)] == prefix:
      self.pending = existing[len(prefix) :]  # finished after the checkpoint: kept on disk
      atomic_write(path, "".join(existing))
    else:
      self.pending = []
      atomic_write(path, "".join(prefix))

  def write(self, lines) -> None:
    fresh = []
    for line in lines:
      if self.pending and self.pending[0] == line:
        self.pending.pop(0)  # recomputed identically: already on disk
        continue
      if self.pending:  # cannot happen for a deterministic run; keep the file consistent
        with open(self.path) as f:
          kept = f.read().splitlines(keepends=True)
        atomic_write(self.path, "".join(kept[: len(kept) - len(self.pending)]))
        self.pending = []
      fresh.append(line)
    if fresh:
      append_lines(self.path, fresh)


def _progress_bar(total, name):
  from tqdm.auto import tqdm

  return tqdm(total=total, desc=name, unit="round", leave=False)
