"""The simulator: ``run`` scans rounds in jitted chunks; ``sweep`` vmaps whole runs over seeds and
hyper-parameters.

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

import collections
import dataclasses
import itertools
import json
import math
import os
import pickle
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.base import Algorithm, make_hparams
from fedjax_dro.core.metrics import HIGHER_IS_BETTER, estimation_error, evaluate_clients, summarize_all
from fedjax_dro.data.federated import FederatedData, FederatedDataset, validate_data


class NonFiniteError(FloatingPointError):
  """A round produced NaN/Inf. ``.round`` is its index, ``.state`` the last finite state,
  ``.history`` what was recorded before it."""

  def __init__(self, message, round_index, state, history):
    super().__init__(message)
    self.round = round_index
    self.state = state
    self.history = history


@dataclasses.dataclass
class History:
  """What a run recorded.

  Attributes:
    algorithm: name.
    config: algorithm settings, hyper-parameters, rounds, seed, dataset name.
    train_metrics: ``{name: [rounds_done]}`` per-round training metrics.
    evaluations: one dict per evaluation: ``round`` (rounds done), ``per_client`` ``{metric: [n]}``
      and ``summary`` ``{metric: {mean, weighted_mean, worst20, best20, worst, q10...}}``.
    final_state: the algorithm state after the last round.
    wall_time: seconds spent running rounds (compilation excluded).
    compile_time: seconds spent compiling the chunk program.
  """
  algorithm: str
  config: Dict[str, Any]
  train_metrics: Dict[str, np.ndarray]
  evaluations: List[Dict[str, Any]]
  final_state: Any = None
  wall_time: float = 0.0
  compile_time: float = 0.0

  @property
  def final(self) -> Dict[str, Dict[str, float]]:
    return self.evaluations[-1]["summary"] if self.evaluations else {}

  def summary(self) -> Dict[str, Any]:
    return {"algorithm": self.algorithm, "config": self.config, "final": self.final,
            "rounds_done": int(self.evaluations[-1]["round"]) if self.evaluations else 0,
            "wall_time_s": self.wall_time, "compile_time_s": self.compile_time}

  def jsonl_records(self):
    """One record per round (training metrics), and one per evaluation."""
    num_rounds = len(next(iter(self.train_metrics.values()))) if self.train_metrics else 0
    for r in range(num_rounds):
      yield {"type": "round", "round": r + 1,
             **{k: float(v[r]) for k, v in self.train_metrics.items()}}
    for ev in self.evaluations:
      yield _evaluation_record(ev)

  def save(self, out_dir: str) -> None:
    """Writes ``metrics.jsonl`` and ``summary.json`` atomically into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    atomic_write(os.path.join(out_dir, "metrics.jsonl"),
                 "".join(json.dumps(rec) + "\n" for rec in self.jsonl_records()))
    atomic_write(os.path.join(out_dir, "summary.json"), json.dumps(self.summary(), indent=2, default=_json_default))


def _evaluation_record(ev):
  return {"type": "eval", "round": int(ev["round"]), "summary": ev["summary"],
          "per_client": {k: np.asarray(v).tolist() for k, v in ev["per_client"].items()}}


def _json_default(obj):
  if isinstance(obj, (np.generic,)):
    return obj.item()
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  return str(obj)


def atomic_write(path: str, text: Union[str, bytes]) -> None:
  """Writes ``text`` to a temporary file beside ``path`` and renames it into place."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
  try:
    with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
      f.write(text)
    umask = os.umask(0); os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)   # mkstemp creates 0600; give results the usual permissions
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


# ----------------------------------------------------------------------------------------------
# Compiled pieces shared by run and sweep
# ----------------------------------------------------------------------------------------------

def _all_finite(tree) -> jnp.ndarray:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def _make_chunk_fn(alg: Algorithm, rounds: int, chunk: int, check_finite: bool):
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
      state = jax.tree.map(lambda new, old: jnp.where(ok, new, old).astype(old.dtype), new_state, state)
      newly_failed = active & ~finite
      first_bad = jnp.where(newly_failed & (first_bad < 0), r, first_bad)
      return (state, failed | newly_failed, first_bad), metrics
    (state, failed, first_bad), metrics = jax.lax.scan(
        body, (state, status[0], status[1]), start + jnp.arange(chunk, dtype=jnp.int32))
    return state, (failed, first_bad), metrics
  return chunk_fn


def _make_eval_fn(alg: Algorithm, true_params):
  def eval_fn(state, data):
    params = alg.client_models(state)
    out = evaluate_clients(alg.model, params, data, alg.personalized)
    err = estimation_error(params, true_params, alg.personalized)
    if err is not None:
      out["estimation_error"] = jnp.broadcast_to(err, (data.num_clients,))
    return out
  return eval_fn


# Compiled sweep programs, reused across calls with the same algorithm object, settings and
# argument shapes (K-fold cross-validation calls ``sweep`` once per fold on folds padded to one
# shape: one compilation instead of K). Entries hold a reference to the algorithm, so an ``id``
# is never confused with that of a newer object.
_SWEEP_PROGRAMS: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
_SWEEP_PROGRAMS_MAX = 8


def _abstract_key(tree):
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple((tuple(np.shape(x)), str(jnp.result_type(x)), bool(getattr(x, "weak_type", False)))
                        for x in leaves)


def _sweep_programs(alg: Algorithm, rounds: int, chunk: int, check_finite: bool, args, true_params):
  """``(compiled chunk program, vmapped eval function, compile seconds)``, cached."""
  key = (id(alg), rounds, chunk, check_finite, _abstract_key(args), true_params is None)
  hit = _SWEEP_PROGRAMS.get(key)
  if hit is not None and hit[0] is alg and true_params is None:
    _SWEEP_PROGRAMS.move_to_end(key)
    return hit[1], hit[2], 0.0
  vchunk = jax.jit(jax.vmap(_make_chunk_fn(alg, rounds, chunk, check_finite), in_axes=(0, 0, None, 0, 0, None)))
  t0 = time.perf_counter()
  compiled = vchunk.lower(*args).compile()
  compile_time = time.perf_counter() - t0
  evaluate = jax.jit(jax.vmap(_make_eval_fn(alg, true_params), in_axes=(0, None)))
  if true_params is None:     # true_params is closed over: cache only the common case
    _SWEEP_PROGRAMS[key] = (alg, compiled, evaluate)
    while len(_SWEEP_PROGRAMS) > _SWEEP_PROGRAMS_MAX:
      _SWEEP_PROGRAMS.popitem(last=False)
  return compiled, evaluate, compile_time


def _split_data(data, eval_data, true_params):
  if isinstance(data, FederatedDataset):
    train = data.train
    eval_data = eval_data if eval_data is not None else (data.test if data.test is not None else data.train)
    true_params = true_params if true_params is not None else data.true_params
    name = data.name
  elif isinstance(data, FederatedData):
    train, name = data, "custom"
    eval_data = eval_data if eval_data is not None else data
  else:
    raise TypeError(f"data must be a FederatedDataset or FederatedData, got {type(data).__name__}")
  validate_data(train, "data")
  validate_data(eval_data, "eval_data")
  if eval_data.num_clients != train.num_clients:
    raise ValueError(f"eval_data has {eval_data.num_clients} clients, data has {train.num_clients}")
  return train, eval_data, true_params, name


def _check_run_args(alg, rounds, eval_every):
  if not isinstance(alg, Algorithm):
    raise TypeError(f"alg must be an Algorithm (e.g. fedjax_dro.algorithms.fedavg(model)), got "
                    f"{type(alg).__name__}")
  if not isinstance(rounds, (int, np.integer)) or isinstance(rounds, bool) or rounds < 1:
    raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
  if eval_every is not None and (not isinstance(eval_every, (int, np.integer)) or eval_every < 1):
    raise ValueError(f"eval_every must be a positive integer, got {eval_every!r}")
  return int(rounds), int(min(eval_every or max(1, min(rounds, 10)), rounds))


def _keys(seed_or_key):
  if isinstance(seed_or_key, (int, np.integer)) and not isinstance(seed_or_key, bool):
    key = jax.random.PRNGKey(int(seed_or_key))
  elif isinstance(seed_or_key, jax.Array) and seed_or_key.shape == (2,):
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
# run
# ----------------------------------------------------------------------------------------------

def run(alg: Algorithm, data: Union[FederatedDataset, FederatedData], *, rounds: int,
        seed: Union[int, jax.Array] = 0, hparams: Optional[Dict[str, Any]] = None,
        eval_data: Optional[FederatedData] = None, eval_every: Optional[int] = None,
        init_params=None, true_params=None, progress: bool = False, check_finite: bool = True,
        out_dir: Optional[str] = None, checkpoint_dir: Optional[str] = None) -> History:
  """Runs ``rounds`` communication rounds of ``alg`` on ``data``.

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
    checkpoint_dir: if given, the state and history are saved there (atomically) after every
      chunk, and a run started with the same configuration resumes from the saved checkpoint; the
      result is identical to an uninterrupted run (round keys depend only on the round index).
  """
  rounds, chunk = _check_run_args(alg, rounds, eval_every)
  train, eval_data, true_params, data_name = _split_data(data, eval_data, true_params)
  hp = make_hparams(alg, hparams)
  model_key, init_key, run_key = _keys(seed)
  params = alg.model.init(model_key) if init_params is None else init_params
  # Fresh buffers: the state is donated between chunks, and an init may alias one array twice.
  state = jax.tree.map(jnp.copy, alg.init(params, train, init_key))

  chunk_fn = jax.jit(_make_chunk_fn(alg, rounds, chunk, check_finite), donate_argnums=(0,))
  eval_fn = jax.jit(_make_eval_fn(alg, true_params))
  status = (jnp.array(False), jnp.array(-1, jnp.int32))
  t0 = time.perf_counter()
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    compiled = chunk_fn.lower(state, status, jnp.int32(0), hp, run_key, train).compile()
  compile_time = time.perf_counter() - t0

  config = {"algorithm": alg.name, "settings": alg.config, "hparams": {k: np.asarray(v).tolist() for k, v in hp.items()},
            "rounds": rounds, "eval_every": chunk, "seed": seed if isinstance(seed, int) else "key",
            "dataset": data_name, "num_clients": train.num_clients}
  history = History(alg.name, config, {}, [])
  metric_chunks: Dict[str, list] = {}
  wall, first_chunk = 0.0, 0
  resumed = _load_checkpoint(checkpoint_dir, config, state) if checkpoint_dir else None
  if resumed is not None:
    payload, state = resumed
    first_chunk, wall = payload["next_chunk"], payload["wall_time"]
    status = (jnp.array(payload["status"][0]), jnp.array(payload["status"][1], jnp.int32))
    history.train_metrics, history.evaluations = payload["train_metrics"], payload["evaluations"]
    history.final_state = state
    metric_chunks = {k: [v] for k, v in history.train_metrics.items()}
  bar = _progress_bar(rounds, alg.name) if progress else None
  if bar is not None and first_chunk:
    bar.update(min(rounds, first_chunk * chunk))
  jsonl_path = None
  if out_dir is not None:
    os.makedirs(out_dir, exist_ok=True)
    jsonl_path = os.path.join(out_dir, "metrics.jsonl")
    atomic_write(jsonl_path, "".join(json.dumps(rec, default=_json_default) + "\n"
                                     for rec in history.jsonl_records()))
  main = _main_metric(alg)
  try:
    for c in range(first_chunk, math.ceil(rounds / chunk)):
      start = c * chunk
      t0 = time.perf_counter()
      new_state, status, metrics = compiled(state, status, jnp.int32(start), hp, run_key, train)
      failed, first_bad = (bool(status[0]), int(status[1]))
      state = new_state
      done = min(rounds, start + chunk) if not failed else first_bad
      metrics = {k: np.asarray(v)[: done - start] for k, v in metrics.items()}
      per_client = jax.device_get(eval_fn(state, eval_data))
      wall += time.perf_counter() - t0
      for k, v in metrics.items():
        metric_chunks.setdefault(k, []).append(v)
      history.train_metrics = {k: np.concatenate(v) for k, v in metric_chunks.items()}
      evaluation = {"round": done, "per_client": per_client,
                    "summary": _summaries(per_client, eval_data.num_examples)}
      history.evaluations.append(evaluation)
      history.final_state = state
      if jsonl_path is not None:
        with open(jsonl_path, "a") as f:
          for r in range(len(next(iter(metrics.values()), []))):
            f.write(json.dumps({"type": "round", "round": start + r + 1,
                                **{k: float(v[r]) for k, v in metrics.items()}}) + "\n")
          f.write(json.dumps(_evaluation_record(evaluation), default=_json_default) + "\n")
      if checkpoint_dir is not None:
        _save_checkpoint(checkpoint_dir, config, c + 1, state, status, history, wall)
      if bar is not None:
        s = evaluation["summary"].get(main, {})
        bar.update(done - start)
        bar.set_postfix({f"{main}": f"{s.get('mean', float('nan')):.4f}",
                         "worst20": f"{s.get('worst20', float('nan')):.4f}"})
      if failed:
        history.wall_time, history.compile_time = wall, compile_time
        raise NonFiniteError(
            f"{alg.name}: round {first_bad + 1} (0-based index {first_bad}) produced a non-finite "
            f"value (NaN/Inf) in the state or metrics; the run stopped and kept the state after "
            f"round {first_bad}. Lower the step sizes (hparams={ {k: float(np.asarray(v).reshape(-1)[0]) for k, v in hp.items()} }) "
            f"or check the data.", first_bad, state, history)
  finally:
    if bar is not None:
      bar.close()
  history.wall_time, history.compile_time = wall, compile_time
  if out_dir is not None:
    atomic_write(os.path.join(out_dir, "summary.json"),
                 json.dumps(history.summary(), indent=2, default=_json_default))
  return history


CHECKPOINT_FILE = "checkpoint.pkl"


def _save_checkpoint(directory, config, next_chunk, state, status, history, wall):
  """Everything needed to resume after chunk ``next_chunk - 1`` (written atomically)."""
  os.makedirs(directory, exist_ok=True)
  payload = {"config": config, "next_chunk": next_chunk,
             "state_leaves": [np.asarray(x) for x in jax.device_get(jax.tree.leaves(state))],
             "status": (bool(status[0]), int(status[1])), "train_metrics": history.train_metrics,
             "evaluations": history.evaluations, "wall_time": wall}
  atomic_write(os.path.join(directory, CHECKPOINT_FILE), pickle.dumps(payload))


def _load_checkpoint(directory, config, state):
  path = os.path.join(directory, CHECKPOINT_FILE)
  if not os.path.exists(path):
    return None
  with open(path, "rb") as f:
    payload = pickle.load(f)
  if payload["config"] != config:
    diff = sorted(k for k in set(config) | set(payload["config"])
                  if config.get(k) != payload["config"].get(k))
    raise ValueError(f"checkpoint_dir {directory!r} holds a checkpoint of a different run "
                     f"(differs in {diff}); use another directory or delete {path}")
  leaves, treedef = jax.tree.flatten(state)
  if len(leaves) != len(payload["state_leaves"]):
    raise ValueError(f"checkpoint in {directory!r} does not match the algorithm state structure")
  restored = jax.tree.unflatten(treedef, [jnp.asarray(x, dtype=l.dtype)
                                          for x, l in zip(payload["state_leaves"], leaves)])
  return payload, restored


def _progress_bar(total, name):
  from tqdm.auto import tqdm
  return tqdm(total=total, desc=name, unit="round", leave=False)


# ----------------------------------------------------------------------------------------------
# sweep
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class SweepResult:
  """Results of a sweep: one row per (hyper-parameter combination, seed).

  Attributes:
    configs: list of ``{"hparams": {...}, "seed": s}``, one per row.
    train_metrics: ``{name: [num_configs, rounds]}``.
    final_per_client: ``{metric: [num_configs, n]}`` at the end.
    final_summary: list (per row) of ``{metric: {mean, worst20, ...}}``.
    diverged: ``[num_configs]`` bool — rows stopped by a non-finite round (their results are those
      of the last finite state; ``diverged_round`` says where).
    compile_time: seconds spent compiling; ``0.0`` when the program of an earlier ``sweep`` call
      with the same algorithm object, settings and shapes was reused (e.g. the folds of
      :func:`fedjax_dro.model_selection.cross_validate`).
  """
  algorithm: str
  configs: List[Dict[str, Any]]
  train_metrics: Dict[str, np.ndarray]
  final_per_client: Dict[str, np.ndarray]
  final_summary: List[Dict[str, Dict[str, float]]]
  diverged: np.ndarray
  diverged_round: np.ndarray
  wall_time: float
  compile_time: float
  final_state: Any = None   # stacked states, leading axis = rows

  def table(self, metric: str, stat: str = "mean") -> List[Dict[str, Any]]:
    return [{**c["hparams"], "seed": c["seed"], f"{metric}_{stat}": s[metric][stat],
             "diverged": bool(d)} for c, s, d in zip(self.configs, self.final_summary, self.diverged)]

  def best(self, metric: str, stat: str = "mean") -> Dict[str, Any]:
    """The hyper-parameters with the best ``stat`` of ``metric`` averaged over seeds."""
    sign = 1.0 if HIGHER_IS_BETTER.get(metric, True) else -1.0
    scores: Dict[tuple, list] = {}
    for c, s, d in zip(self.configs, self.final_summary, self.diverged):
      key = tuple(sorted(c["hparams"].items()))
      scores.setdefault(key, []).append(-np.inf if d else sign * s[metric][stat])
    best = max(scores, key=lambda k: np.mean(scores[k]))
    return dict(best)


def sweep(alg: Algorithm, data: Union[FederatedDataset, FederatedData], *, rounds: int,
          grid: Optional[Dict[str, Sequence[float]]] = None, seeds: Sequence[int] = (0,),
          hparams: Optional[Dict[str, Any]] = None, eval_data: Optional[FederatedData] = None,
          eval_every: Optional[int] = None, true_params=None, check_finite: bool = True) -> SweepResult:
  """Runs every combination of ``grid`` x ``seeds`` as one vmapped program.

  Row ``k`` equals ``run(alg, data, rounds=rounds, seed=seeds[j], hparams={**hparams, **combo})``
  (tested). A row that hits a non-finite round is frozen at its last finite state and flagged in
  ``diverged``; the other rows go on.
  """
  rounds, chunk = _check_run_args(alg, rounds, eval_every)
  train, eval_data, true_params, _ = _split_data(data, eval_data, true_params)
  grid = dict(grid or {})
  for name, values in grid.items():
    if name not in alg.hparams:
      raise ValueError(f"grid has unknown hyper-parameter {name!r} for {alg.name}; expected one of {sorted(alg.hparams)}")
    if len(list(values)) == 0:
      raise ValueError(f"grid[{name!r}] is empty")
  if len(seeds) == 0:
    raise ValueError("seeds must contain at least one seed")
  names = sorted(grid)
  combos = list(itertools.product(*[list(grid[k]) for k in names])) or [()]
  configs = [{"hparams": dict(zip(names, map(float, combo))), "seed": int(seed)}
             for combo in combos for seed in seeds]
  base = dict(hparams or {})
  hp = make_hparams(alg, {**base, **{k: np.array([c["hparams"][k] for c in configs]) for k in names}})
  num = len(configs)
  hp = {k: jnp.broadcast_to(v, (num,)) for k, v in hp.items()}
  keys = [_keys(c["seed"]) for c in configs]
  model_keys, init_keys, run_keys = (jnp.stack([k[i] for k in keys]) for i in range(3))
  params = jax.vmap(alg.model.init)(model_keys)
  state = jax.vmap(lambda p, k: alg.init(p, train, k))(params, init_keys)

  status = (jnp.zeros((num,), bool), jnp.full((num,), -1, jnp.int32))
  compiled, evaluate, compile_time = _sweep_programs(
      alg, rounds, chunk, check_finite, (state, status, jnp.int32(0), hp, run_keys, train), true_params)
  t0 = time.perf_counter()
  curves: Dict[str, list] = {}
  for c in range(math.ceil(rounds / chunk)):
    state, status, metrics = compiled(state, status, jnp.int32(c * chunk), hp, run_keys, train)
    for k, v in metrics.items():
      curves.setdefault(k, []).append(np.asarray(v)[:, : min(chunk, rounds - c * chunk)])
  per_client = jax.device_get(evaluate(state, eval_data))
  wall = time.perf_counter() - t0
  train_metrics = {k: np.concatenate(v, axis=1) for k, v in curves.items()}
  diverged = np.asarray(status[0])
  for k in train_metrics:   # rounds after a divergence were not applied
    for row in np.flatnonzero(diverged):
      train_metrics[k][row, int(status[1][row]):] = np.nan
  summaries = [_summaries({k: v[i] for k, v in per_client.items()}, eval_data.num_examples)
               for i in range(num)]
  return SweepResult(alg.name, configs, train_metrics, per_client, summaries, diverged,
                     np.asarray(status[1]), wall, compile_time, state)
