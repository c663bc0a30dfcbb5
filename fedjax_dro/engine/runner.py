""":func:`run`: rounds scanned in jitted chunks, evaluated, recorded and checkpointed.

(:func:`~fedjax_dro.engine.sweeps.sweep` vmaps whole runs over seeds and hyper-parameters;
:func:`~fedjax_dro.engine.compiled.compile_rounds` compiles and times chunks of rounds.)

One chunk of ``eval_every`` rounds is one compiled XLA program (``lax.scan`` over rounds, no host
round-trip inside). Round ``r`` uses the key ``fold_in(run_key, r)``, so results do not depend on
the chunking. The last chunk is padded with inactive rounds (the state is left unchanged) so that a
run compiles exactly once whatever ``rounds`` is. :func:`run` prepares a
:class:`~fedjax_dro.engine.plan.RunPlan` and :func:`run_chunks` executes it.

Non-finite values: every round checks its new state and metrics; the first non-finite round is
*not* applied (the state stays at the last finite one) and the run stops with
:class:`~fedjax_dro.engine.errors.NonFiniteError` naming the round, carrying the last finite
state and the history so far (and, with ``out_dir``, the metrics already written to disk).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import numbers
import os
import sys
import time
import warnings
from typing import Any, Dict, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.base import Algorithm
from fedjax_dro.common.model import model_identity
from fedjax_dro.common.tuning import Tuning, resolve, scope
from fedjax_dro.data.federated import FederatedData, FederatedDataset
from fedjax_dro.engine.errors import is_out_of_memory, memory_error, nonfinite_error
from fedjax_dro.engine.plan import RunPlan
from fedjax_dro.engine.prepare import (
  check_run_args,
  checked_data,
  compile_program,
  derive_keys,
  evaluate_per_client,
  is_host_data,
  main_metric,
  place_run_data,
  prepare_hparams,
  program_key,
  summarize_per_client,
)
from fedjax_dro.engine.programs import (
  ProgramCache,
  make_chunk_fn,
  make_eval_fn,
  predicted_participants,
)
from fedjax_dro.engine.sharding import (
  axis_size,
  check_mesh,
  fetch,
  is_writer,
  place_replicated,
  real_clients,
)
from fedjax_dro.privacy.accounting import run_epsilon
from fedjax_dro.records.checkpoint import (
  CheckpointLock,
  load_checkpoint,
  save_checkpoint,
  scan as scan_checkpoints,
)
from fedjax_dro.records.files import DirectoryLock, atomic_write
from fedjax_dro.records.history import (
  History,
  JsonlWriter,
  evaluation_record,
  history_to_csv,
  json_text,
  jsonl_line,
  round_records,
)
from fedjax_dro.records.loggers import check_loggers, log_evaluation, log_rounds

# ----------------------------------------------------------------------------------------------
# run
# ----------------------------------------------------------------------------------------------


# Compiled programs of fd.run (the rounds and the evaluation), reused by a later call with the
# same algorithm object, settings and data shapes: a notebook's loop over seeds or
# hyper-parameters compiles once.
_RUN_PROGRAMS = ProgramCache(max_entries=8)


def _compile_run(alg, rounds, chunk, check_finite, true_params, args, eval_data, tuning):
  """``(compiled chunk program, evaluation function, compile seconds)`` of a run, traced with
  the resolved ``tuning``."""
  # real_clients: data padded for a mesh (PaddedClients) is sliced back to its n clients inside
  chunk_fn = jax.jit(
    real_clients(make_chunk_fn(alg, rounds, chunk, check_finite)), donate_argnums=(0,)
  )
  eval_fn = jax.jit(real_clients(make_eval_fn(alg, true_params)))
  t0 = time.perf_counter()
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    compiled = compile_program(chunk_fn, args, tuning, f"compiling {alg.name}'s rounds")
    # The evaluation is compiled here too, for the state the chunk returns: its compilation is
    # compile time, not the first chunk's run time (benchmarks/speed.py measures both).
    if not is_host_data(eval_data):
      what = f"compiling {alg.name}'s evaluation"
      program = compile_program(eval_fn, (compiled.out_info[0], eval_data), tuning, what)
      eval_fn = _AheadOfTime(eval_fn, program)
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
  loggers=None,
  metadata: Optional[Dict[str, Any]] = None,
  tuning: Optional[Tuning] = None,
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
    true_params: ``[n, dim]`` true per-client parameters, for the estimation error: finite, ``dim``
      the model's parameter count (else a ValueError). A dataset's own ``true_params`` are used
      only when their size matches the model's.
    progress: show a tqdm progress bar (rounds, rate, mean and worst-20% of the main metric).
    check_finite: stop at the first round producing NaN/Inf (see
      :class:`~fedjax_dro.engine.errors.NonFiniteError`).
    out_dir: if given, ``metrics.jsonl`` is appended after every chunk and ``summary.json`` is
      written at the end (atomically).
    checkpoint_dir: if given, the state and history are checkpointed there (arrays + JSON, atomic,
      checksummed; :mod:`fedjax_dro.records.checkpoint`) and a run started with the same configuration
      resumes from the newest checkpoint; the result is identical to an uninterrupted run (round
      keys depend only on the round index). The directory is locked for the run's duration.
    checkpoint_every: checkpoint at the first evaluation at or after every ``checkpoint_every``
      rounds (checkpoints happen at evaluation boundaries; default: at every evaluation), and
      always after the last round.
    keep_checkpoints: how many of the newest checkpoints to keep (>= 1).
    mesh: optional ``jax.sharding.Mesh`` (:func:`fedjax_dro.engine.sharding.make_mesh`): the
      client axis of the data is split over its ``"clients"`` axis and XLA partitions the rounds
      (see :mod:`fedjax_dro.engine.sharding`); with several processes (``jax.distributed``) only process 0
      writes ``out_dir`` and checkpoints.
    loggers: experiment trackers (:mod:`fedjax_dro.records.loggers`: ``TensorBoardLogger``,
      ``MLflowLogger`` or any object with their methods) that receive each round's training
      metrics and each evaluation (summary statistics and per-client histograms) as the run goes;
      left open for the caller (only process 0 logs).
    metadata: JSON-able facts about the run that the engine does not use, recorded in its
      configuration (``History.config["metadata"]``, ``summary.json``, checkpoints): the seed the
      data were drawn with (``{"data_seed": 0}``; ``seed`` is the training seed), a note.
    tuning: performance choices (:class:`~fedjax_dro.common.tuning.Tuning`) over those of an
      enclosing ``fd.tuned`` block and the platform's defaults; they change how the rounds are
      computed, not what (the cache keys on the resolved value).
  """
  rounds, chunk = check_run_args(alg, rounds, eval_every)
  if metadata is not None:
    if not isinstance(metadata, dict):
      raise TypeError(f"metadata must be a dict of JSON-able values, got {type(metadata).__name__}")
    try:
      json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as e:
      raise TypeError(f"metadata must hold JSON-able values (numbers, strings, lists): {e}") from e
  mesh = None if mesh is None else check_mesh(mesh)
  loggers = check_loggers(loggers)
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
  train, eval_data, true_params, data_name = checked_data(
    alg,
    data,
    eval_data,
    true_params,
    init_params=init_params,
    out_dir=out_dir,
    checkpoint_dir=checkpoint_dir,
  )
  hp = prepare_hparams(alg, hparams, init_params=init_params)
  model_key, init_key, run_key = derive_keys(seed)
  params = alg.model.init(model_key) if init_params is None else init_params
  # Fresh buffers: the state is donated between chunks, and an init may alias one array twice.
  state = jax.tree.map(jnp.copy, alg.init(params, train, init_key))
  # What the configuration does not say (the data's values, init_params, a precomputed
  # dissimilarity...): a checkpoint resumes only the run that wrote it.
  fingerprints = _fingerprints(train, eval_data, state) if checkpoint_dir is not None else None
  status = (jnp.array(False), jnp.array(-1, jnp.int32))
  train, eval_data, eval_num_examples = place_run_data(mesh, train, eval_data)
  if mesh is not None:
    state, status, hp, run_key = place_replicated((state, status, hp, run_key), mesh)
  writer = is_writer()

  args = (state, status, jnp.int32(0), hp, run_key, train)
  shards = axis_size(mesh, "clients")
  resolved = resolve(tuning).replace(client_shards=shards)
  key = program_key((rounds, chunk, check_finite, resolved), args, eval_data)
  cached = _RUN_PROGRAMS.get(alg, key) if true_params is None else None
  if cached is not None:  # same algorithm, settings and shapes: another seed or hparams
    compiled, eval_fn = cached
    compile_time = 0.0
  else:
    compiled, eval_fn, compile_time = _compile_run(
      alg, rounds, chunk, check_finite, true_params, args, eval_data, resolved
    )
    if true_params is None:  # true_params is closed over: cache only the common case
      _RUN_PROGRAMS.put(alg, key, (compiled, eval_fn))

  config = {
    "algorithm": alg.name,
    "model": model_identity(alg.model),
    "settings": alg.config,
    "hparams": {k: shortest_floats(v) for k, v in hp.items()},
    "rounds": rounds,
    "eval_every": chunk,
    "seed": int(seed) if isinstance(seed, numbers.Integral) else {"key": np.asarray(seed).tolist()},
    "dataset": data_name,
    "num_clients": train.num_clients,
  }
  if metadata:
    config["metadata"] = dict(metadata)
  if fingerprints is not None:
    config["fingerprints"] = fingerprints
  history = History(alg.name, config, {}, [])
  if checkpoint_dir is not None:
    scan_checkpoints(checkpoint_dir)  # foreign files: refused before the lock file is created
  plan = RunPlan(
    alg=alg,
    rounds=rounds,
    chunk=chunk,
    hparams=hp,
    run_key=run_key,
    train=train,
    eval_data=eval_data,
    true_params=true_params,
    eval_num_examples=eval_num_examples,
    program=compiled,
    evaluate=eval_fn,
    compile_time=compile_time,
    progress=progress,
    out_dir=out_dir if writer else None,
    checkpoint_dir=checkpoint_dir,
    write_checkpoints=writer and checkpoint_dir is not None,
    checkpoint_every=checkpoint_every,
    keep_checkpoints=keep_checkpoints,
    mesh=mesh,
    check_finite=check_finite,
  )
  with contextlib.ExitStack() as locks:  # one writer per output directory
    if plan.out_dir is not None:
      locks.enter_context(DirectoryLock(plan.out_dir, "out_dir"))
    if plan.write_checkpoints:
      locks.enter_context(CheckpointLock(checkpoint_dir))
    with scope(resolved):  # what the loop traces (host-resident evaluation) has the run's tuning
      return run_chunks(plan, state, status, history, loggers=loggers if writer else ())


def run_chunks(plan: RunPlan, state, status, history: History, loggers=()) -> History:
  """The chunk loop of :func:`run`: resume, run, evaluate, record, checkpoint.

  Runs ``plan`` from ``state`` and ``status`` (``(failed, first_bad_round)``, device arrays),
  filling ``history`` (whose ``config`` identifies the run's checkpoints) and returning it;
  ``loggers`` (:mod:`fedjax_dro.records.loggers`) receive each chunk's rounds and evaluation.
  """
  alg, rounds, chunk, hp, run_key = plan.alg, plan.rounds, plan.chunk, plan.hparams, plan.run_key
  train, eval_data, checkpoint_every = plan.train, plan.eval_data, plan.checkpoint_every
  config = history.config
  metric_chunks: Dict[str, list] = {}
  wall, first_chunk = 0.0, 0
  resumed = (
    load_checkpoint(plan.checkpoint_dir, config, state, require_finite=plan.check_finite)
    if plan.checkpoint_dir
    else None
  )
  if resumed is not None:
    payload, state = resumed
    print(
      f"resuming from round {payload['rounds_done']} (checkpoint {payload['path']})",
      file=sys.stderr,
    )
    first_chunk, wall = payload["next_chunk"], payload["wall_time"]
    status = (jnp.array(payload["status"][0]), jnp.array(payload["status"][1], jnp.int32))
    if plan.mesh is not None:
      state, status = place_replicated((state, status), plan.mesh)
    history.train_metrics, history.evaluations = payload["train_metrics"], payload["evaluations"]
    history.final_state = state
    metric_chunks = {k: [v] for k, v in history.train_metrics.items()}
    if payload["status"][0]:  # the run had stopped at a non-finite round: it stays stopped
      history.wall_time, history.compile_time = wall, plan.compile_time
      raise nonfinite_error(alg, int(payload["status"][1]), hp, state, history)
  bar = _progress_bar(rounds, alg.name) if plan.progress else None
  if bar is not None and first_chunk:
    bar.update(min(rounds, first_chunk * chunk))
  jsonl_path = None
  if plan.out_dir is not None:
    os.makedirs(plan.out_dir, exist_ok=True)
    jsonl_path = os.path.join(plan.out_dir, "metrics.jsonl")
    jsonl = JsonlWriter(jsonl_path, [jsonl_line(rec) for rec in history.jsonl_records()])
  main = main_metric(alg)
  last_checkpoint = first_chunk * chunk
  try:
    for c in range(first_chunk, plan.num_chunks):
      start = c * chunk
      t0 = time.perf_counter()
      if plan.host_data and not getattr(train, "streamed", False):  # prefetch hint: the
        # participants of this chunk's rounds (streamed data reads its rows inside the round)
        train.store.expect(
          predicted_participants(alg, train.num_clients, run_key, range(start, start + chunk))
        )
      try:
        new_state, status, metrics = plan.program(
          state, status, jnp.int32(start), hp, run_key, train
        )
        host_status, metrics = fetch((status, metrics))
      except Exception as e:
        if is_out_of_memory(e):
          raise memory_error(e, f"running {alg.name}'s rounds {start + 1}..") from None
        raise
      failed, first_bad = (bool(host_status[0]), int(host_status[1]))
      state = new_state
      done = min(rounds, start + chunk) if not failed else first_bad
      metrics = {k: np.asarray(v)[: done - start] for k, v in metrics.items()}
      per_client = evaluate_per_client(alg, state, eval_data, plan.true_params, plan.evaluate)
      wall += time.perf_counter() - t0
      for k, v in metrics.items():
        metric_chunks.setdefault(k, []).append(v)
      history.train_metrics = {k: np.concatenate(v) for k, v in metric_chunks.items()}
      evaluation = {
        "round": done,
        "per_client": per_client,
        "summary": summarize_per_client(per_client, plan.eval_num_examples),
      }
      if alg.privacy is not None:  # epsilon after the rounds done (dp-accounting)
        noises = {k: float(np.asarray(v)) for k, v in hp.items() if k.startswith("dp_")}
        evaluation["privacy"] = run_epsilon(alg.privacy, done, noises, train.num_clients)
      history.evaluations.append(evaluation)
      history.final_state = state
      if jsonl_path is not None:  # appended and flushed to disk as it happens
        lines = [jsonl_line(rec) for rec in round_records(metrics, start)]
        jsonl.write(lines + [jsonl_line(evaluation_record(evaluation))])
      if loggers:  # experiment tracking: the same rounds and evaluation
        log_rounds(loggers, metrics, start)
        log_evaluation(loggers, evaluation)
      last = failed or done >= rounds
      due = (
        checkpoint_every is None or done // checkpoint_every > last_checkpoint // checkpoint_every
      )
      if plan.write_checkpoints and (due or last):
        save_checkpoint(
          plan.checkpoint_dir,
          config,
          c + 1,
          done,
          fetch(state),
          host_status,
          history,
          wall,
          keep=plan.keep_checkpoints,
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
        history.wall_time, history.compile_time = wall, plan.compile_time
        raise nonfinite_error(alg, first_bad, hp, state, history)
  finally:
    if bar is not None:
      bar.close()
  history.wall_time, history.compile_time = wall, plan.compile_time
  if plan.out_dir is not None:
    atomic_write(
      os.path.join(plan.out_dir, "summary.json"),
      json_text(history.summary(), indent=2),
    )
    history_to_csv(history, plan.out_dir)
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


def shortest_floats(value):
  """``value`` (a scalar or array) as JSON-able Python numbers, each float the shortest decimal
  that rounds to it in its own precision: a float32 ``0.1`` is written ``0.1``, not
  ``0.10000000149011612`` (the number the user gave, and the same float32 when read back)."""
  arr = np.asarray(value)
  if arr.dtype.kind != "f":
    return arr.tolist()
  kind = arr.dtype.type
  flat = [float(np.format_float_scientific(kind(x), unique=True)) for x in arr.reshape(-1)]
  return flat[0] if arr.ndim == 0 else np.array(flat, dtype=object).reshape(arr.shape).tolist()


def _progress_bar(total, name):
  from tqdm.auto import tqdm

  return tqdm(total=total, desc=name, unit="round", leave=False)
