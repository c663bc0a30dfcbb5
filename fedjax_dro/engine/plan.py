""":class:`RunPlan`: what the chunk loop of :func:`fedjax_dro.run` runs, prepared once.

:func:`fedjax_dro.run` checks its arguments, places the data, compiles (or finds in its cache)
the programs, and hands the loop (:func:`~fedjax_dro.engine.runner.run_chunks`) one frozen plan
together with the three things the loop changes: the algorithm state, the status
``(failed, first_bad_round)`` and the :class:`~fedjax_dro.records.history.History`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional

import numpy as np

from fedjax_dro.algorithms.base import Algorithm
from fedjax_dro.engine.prepare import is_host_data


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """One prepared run of :func:`fedjax_dro.run`.

  Attributes:
    alg: the algorithm.
    rounds: communication rounds in all.
    chunk: rounds per compiled chunk (``eval_every``); evaluation after every chunk.
    hparams: the validated hyper-parameters (arrays, placed on the mesh if any).
    run_key: the key the round keys derive from (``fold_in(run_key, r)``).
    train: the training data (placed on the mesh if any).
    eval_data: the evaluation data (placed on the mesh if any).
    true_params: ``[n, dim]`` true per-client parameters, or None.
    eval_num_examples: host copy of ``eval_data.num_examples`` (summary weights).
    program: the compiled chunk ``(state, status, start, hparams, run_key, data) -> (state,
      status, metrics)`` (state donated).
    evaluate: ``(state, eval_data) -> {metric: [n]}`` (device-resident evaluation data).
    compile_time: seconds spent compiling (0.0 for programs found in the cache).
    progress: whether to show a progress bar.
    out_dir: where ``metrics.jsonl``, ``summary.json`` and the CSV files go (None: nowhere; None
      also on every process but the writer).
    checkpoint_dir: where checkpoints are read from (resume), or None.
    write_checkpoints: whether this process writes checkpoints (the writer process, with a
      ``checkpoint_dir``).
    checkpoint_every: checkpoint at the first evaluation at or after every this many rounds
      (None: at every evaluation); always after the last round.
    keep_checkpoints: how many of the newest checkpoints to keep.
    mesh: the ``jax.sharding.Mesh`` of a sharded run, or None.
    check_finite: whether the run stops at a non-finite round (and so refuses to resume from a
      checkpoint whose state is not finite).
  """

  alg: Algorithm
  rounds: int
  chunk: int
  hparams: Dict[str, Any]
  run_key: Any
  train: Any
  eval_data: Any
  true_params: Any
  eval_num_examples: np.ndarray
  program: Callable
  evaluate: Callable
  compile_time: float
  progress: bool = False
  out_dir: Optional[str] = None
  checkpoint_dir: Optional[str] = None
  write_checkpoints: bool = False
  checkpoint_every: Optional[int] = None
  keep_checkpoints: int = 2
  mesh: Any = None
  check_finite: bool = True

  @property
  def num_chunks(self) -> int:
    """Compiled chunks of the whole run (the last one padded with inactive rounds)."""
    return math.ceil(self.rounds / self.chunk)

  @property
  def host_data(self) -> bool:
    """Whether the training data is host-resident (its participants are prefetched)."""
    return is_host_data(self.train)
