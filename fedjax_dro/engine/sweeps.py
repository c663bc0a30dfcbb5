"""``sweep``: whole runs vmapped over hyper-parameter combinations and seeds, in one program."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Any, Dict, List, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.base import Algorithm
from fedjax_dro.common.tuning import Tuning, resolve, scope
from fedjax_dro.core.metrics import HIGHER_IS_BETTER
from fedjax_dro.data.federated import FederatedData, FederatedDataset
from fedjax_dro.engine.errors import is_out_of_memory, memory_error
from fedjax_dro.engine.prepare import (
  check_run_args,
  checked_data,
  compile_program,
  derive_keys,
  evaluate_per_client,
  place_run_data,
  prepare_hparams,
  program_key,
  summarize_per_client,
)
from fedjax_dro.engine.programs import ProgramCache, make_chunk_fn, make_eval_fn
from fedjax_dro.engine.sharding import (
  axis_size,
  check_mesh,
  fetch,
  is_writer,
  real_clients,
  shard_leading,
)
from fedjax_dro.records.history import sweep_to_csv

# Compiled sweep programs, reused across calls with the same algorithm object, settings and
# argument shapes (K-fold cross-validation calls ``sweep`` once per fold on folds padded to one
# shape: one compilation instead of K).
_SWEEP_PROGRAMS = ProgramCache(max_entries=8)


def _sweep_programs(
  alg: Algorithm,
  rounds: int,
  chunk: int,
  check_finite: bool,
  args,
  true_params,
  shards: int = 1,
  sweep_shards: int = 1,
  tuning: Optional[Tuning] = None,
):
  """``(compiled chunk program, vmapped eval function, compile seconds)``, cached. ``shards`` /
  ``sweep_shards``: devices the client axis / the rows are split over; ``tuning``: the
  sweep's (resolved here with the rows of one device side by side)."""
  # the rows of one device run side by side: the auto backend plans each into its share
  rows_per_device = math.ceil(int(np.shape(args[1][0])[0]) / max(1, sweep_shards))
  resolved = resolve(tuning)
  resolved = resolved.replace(
    memory_share=resolved.memory_share * rows_per_device, client_shards=shards
  )
  key = program_key((rounds, chunk, check_finite, sweep_shards, resolved), args)
  hit = _SWEEP_PROGRAMS.get(alg, key) if true_params is None else None
  if hit is not None:
    return hit[0], hit[1], 0.0
  # real_clients: data padded for a mesh (PaddedClients) is sliced back to its n clients inside
  vchunk = jax.jit(
    real_clients(
      jax.vmap(make_chunk_fn(alg, rounds, chunk, check_finite), in_axes=(0, 0, None, 0, 0, None))
    )
  )
  t0 = time.perf_counter()
  compiled = compile_program(vchunk, args, resolved, f"compiling the {alg.name} sweep")
  compile_time = time.perf_counter() - t0
  evaluate = _in_scope(
    jax.jit(real_clients(jax.vmap(make_eval_fn(alg, true_params), in_axes=(0, None)))),
    resolved.replace(client_shards=1),
  )
  if true_params is None:  # true_params is closed over: cache only the common case
    _SWEEP_PROGRAMS.put(alg, key, (compiled, evaluate))
  return compiled, evaluate, compile_time


def _in_scope(fn, tuning):
  """``fn`` traced (on its first call) with ``tuning`` (the sweep's: the ``auto`` backend plans
  each of the evaluations that run side by side into its share of the memory)."""

  def call(*args):
    with scope(tuning):
      return fn(*args)

  return call


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
    metadata: JSON-able facts about the sweep that it does not use (the data seed: ``seeds`` are
      training seeds), written to ``sweep.json``.
    privacy: for a private algorithm (:func:`fedjax_dro.privacy.private`), every row's privacy
      record after its rounds (``{"epsilon", "delta", ...}``, its own noise multipliers; a
      diverged row counts the rounds before it stopped); else None.
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
  final_state: Any = None  # stacked states, leading axis = rows
  metadata: Dict[str, Any] = dataclasses.field(default_factory=dict)
  privacy: Optional[List[Dict[str, Any]]] = None

  def save(self, out_dir: str) -> List[str]:
    """Writes ``sweep.json`` and ``sweep.csv``
    (:func:`~fedjax_dro.records.history.sweep_to_csv`); their paths."""
    return sweep_to_csv(self, out_dir)

  def table(self, metric: str, stat: str = "mean") -> List[Dict[str, Any]]:
    return [
      {**c["hparams"], "seed": c["seed"], f"{metric}_{stat}": s[metric][stat], "diverged": bool(d)}
      for c, s, d in zip(self.configs, self.final_summary, self.diverged)
    ]

  def best(self, metric: str, stat: str = "mean") -> Dict[str, Any]:
    """The hyper-parameters with the best ``stat`` of ``metric`` averaged over seeds."""
    sign = 1.0 if HIGHER_IS_BETTER.get(metric, True) else -1.0
    scores: Dict[tuple, list] = {}
    for c, s, d in zip(self.configs, self.final_summary, self.diverged):
      key = tuple(sorted(c["hparams"].items()))
      scores.setdefault(key, []).append(-np.inf if d else sign * s[metric][stat])
    best = max(scores, key=lambda k: np.mean(scores[k]))
    return dict(best)


def sweep(
  alg: Algorithm,
  data: Union[FederatedDataset, FederatedData],
  *,
  rounds: int,
  grid: Optional[Dict[str, Sequence[float]]] = None,
  seeds: Sequence[int] = (0,),
  hparams: Optional[Dict[str, Any]] = None,
  eval_data: Optional[FederatedData] = None,
  eval_every: Optional[int] = None,
  true_params=None,
  check_finite: bool = True,
  mesh=None,
  loggers=None,
  tuning: Optional[Tuning] = None,
) -> SweepResult:
  """Runs every combination of ``grid`` x ``seeds`` as one vmapped program.

  Row ``k`` equals ``run(alg, data, rounds=rounds, seed=seeds[j], hparams={**hparams, **combo})``
  (tested). A row that hits a non-finite round is frozen at its last finite state and flagged in
  ``diverged``; the other rows go on.

  ``mesh`` (a ``jax.sharding.Mesh`` from :func:`fedjax_dro.engine.sharding.make_mesh`) splits
  the configuration rows over its ``"sweep"`` axis and the client axis of the data over its
  ``"clients"`` axis (see :mod:`fedjax_dro.engine.sharding`); the rows are padded to a multiple of the
  ``"sweep"`` size with copies of row 0, which are dropped from the result. A client count that the
  ``"clients"`` size does not divide is padded in storage only: the program sees the real clients
  (:class:`~fedjax_dro.engine.sharding.PaddedClients`).

  ``loggers``: ``loggers(row, config) -> [Logger]`` (:mod:`fedjax_dro.records.loggers`), called
  once per row after the sweep with the row's ``{"hparams", "seed"}``: each row becomes its own
  tracked run with its per-round training metrics and its final evaluation
  (:func:`~fedjax_dro.records.loggers.log_sweep`); the loggers are closed after their row. For
  example ``loggers=lambda row, c: [TensorBoardLogger(f"tb/{sweep_row_name(c)}")]``.

  ``tuning``: performance choices (:class:`~fedjax_dro.common.tuning.Tuning`) as in
  :func:`fedjax_dro.run`.
  """
  if loggers is not None and not callable(loggers):
    raise TypeError(
      "loggers must be a callable loggers(row, config) -> [Logger] (one tracked run per row), "
      f"got {type(loggers).__name__}"
    )
  rounds, chunk = check_run_args(alg, rounds, eval_every)
  mesh = None if mesh is None else check_mesh(mesh)
  train, eval_data, true_params, _ = checked_data(alg, data, eval_data, true_params)
  num_clients = train.num_clients  # before a mesh pads the client axis
  if grid is not None and not isinstance(grid, dict):
    raise TypeError(
      f"grid must be a dict mapping hyper-parameter names to lists of values, like "
      f"{{'client_lr': [0.01, 0.1]}}, got {type(grid).__name__}"
    )
  grid = dict(grid or {})
  for name, values in grid.items():
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
      raise TypeError(f"grid[{name!r}] must be a list of numbers, got {values!r}")
    for v in values:
      if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"grid[{name!r}] must hold numbers, got {v!r}")
    if name not in alg.hparams:
      raise ValueError(
        f"grid has unknown hyper-parameter {name!r} for {alg.name}; expected one of {sorted(alg.hparams)}"
      )
    if len(list(values)) == 0:
      raise ValueError(f"grid[{name!r}] is empty")
  if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__len__"):
    raise TypeError(f"seeds must be a list of non-negative integers, got {seeds!r}")
  if len(seeds) == 0:
    raise ValueError("seeds must contain at least one seed")
  for seed in seeds:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
      raise TypeError(f"seeds must be non-negative integers, got {seed!r}")
    if seed < 0 or seed >= 2**32:
      raise ValueError(f"seeds must be integers in [0, 2**32), got {seed}")
  names = sorted(grid)
  combos = list(itertools.product(*[list(grid[k]) for k in names])) or [()]
  configs = [
    {"hparams": dict(zip(names, map(float, combo))), "seed": int(seed)}
    for combo in combos
    for seed in seeds
  ]
  if hparams is not None and not isinstance(hparams, dict):
    prepare_hparams(alg, hparams)  # raises the TypeError naming hparams
  base = dict(hparams or {})
  for name, value in base.items():
    if np.ndim(value) != 0:
      raise ValueError(
        f"hparams[{name!r}] must be a scalar shared by every sweep row, got shape "
        f"{np.shape(value)} (put several values in grid[{name!r}])"
      )
  num = len(configs)
  hp = prepare_hparams(
    alg,
    {**base, **{k: np.array([c["hparams"][k] for c in configs]) for k in names}},
    batched=True,
    num_rows=num,
  )
  rows = num + (-num) % axis_size(mesh, "sweep")  # padded with copies of row 0
  take = np.concatenate([np.arange(num), np.zeros(rows - num, int)])
  hp = {k: jnp.broadcast_to(v, (num,))[take] for k, v in hp.items()}
  # each distinct seed's keys derived once and gathered per row (a large grid has few seeds)
  seeds_used, row_seed = np.unique(
    np.array([c["seed"] for c in configs], np.int64)[take], return_inverse=True
  )
  keys = [derive_keys(int(s)) for s in seeds_used]
  model_keys, init_keys, run_keys = (jnp.stack([k[i] for k in keys])[row_seed] for i in range(3))
  params = jax.vmap(alg.model.init)(model_keys)
  state = jax.vmap(lambda p, k: alg.init(p, train, k))(params, init_keys)

  status = (jnp.zeros((rows,), bool), jnp.full((rows,), -1, jnp.int32))
  train, eval_data, eval_num_examples = place_run_data(mesh, train, eval_data)
  if mesh is not None:
    state, status, hp, run_keys = shard_leading(
      (state, status, hp, run_keys), mesh, "sweep", what="sweep rows"
    )
  compiled, evaluate, compile_time = _sweep_programs(
    alg,
    rounds,
    chunk,
    check_finite,
    (state, status, jnp.int32(0), hp, run_keys, train),
    true_params,
    axis_size(mesh, "clients"),
    axis_size(mesh, "sweep"),
    tuning,
  )
  t0 = time.perf_counter()
  curves: Dict[str, list] = {}
  for c in range(math.ceil(rounds / chunk)):
    try:
      state, status, metrics = compiled(state, status, jnp.int32(c * chunk), hp, run_keys, train)
      metrics = fetch(metrics)
    except Exception as e:
      if is_out_of_memory(e):
        raise memory_error(e, f"running the {alg.name} sweep") from None
      raise
    for k, v in metrics.items():
      curves.setdefault(k, []).append(fetch(v)[:num, : min(chunk, rounds - c * chunk)])
  with scope(resolve(tuning)):  # what it traces (host-resident evaluation) has the sweep's tuning
    per_client = evaluate_per_client(alg, state, eval_data, true_params, evaluate, batched=True)
  per_client = jax.tree.map(lambda a: a[:num], per_client)
  status = jax.tree.map(lambda a: a[:num], fetch(status))
  wall = time.perf_counter() - t0
  train_metrics = {k: np.concatenate(v, axis=1) for k, v in curves.items()}
  diverged = np.asarray(status[0])
  for k in train_metrics:  # rounds after a divergence were not applied
    for row in np.flatnonzero(diverged):
      train_metrics[k][row, int(status[1][row]) :] = np.nan
  summaries = [
    summarize_per_client({k: v[i] for k, v in per_client.items()}, eval_num_examples)
    for i in range(num)
  ]
  result = SweepResult(
    alg.name,
    configs,
    train_metrics,
    per_client,
    summaries,
    diverged,
    np.asarray(status[1]),
    wall,
    compile_time,
    jax.tree.map(lambda a: a[:num], state),
  )
  if alg.privacy is not None:  # each row's epsilon from its own noise multipliers
    from fedjax_dro.privacy.accounting import run_epsilon

    dp = {k: np.asarray(fetch(v)) for k, v in hp.items() if k.startswith("dp_")}
    result.privacy = [
      run_epsilon(
        alg.privacy,
        int(status[1][i]) if diverged[i] else rounds,
        {k: v.reshape(-1)[i] if v.ndim else v for k, v in dp.items()},
        num_clients,
      )
      for i in range(num)
    ]
  if loggers is not None and is_writer():
    from fedjax_dro.records.loggers import log_sweep

    log_sweep(result, loggers)
  return result
