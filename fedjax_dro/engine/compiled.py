""":func:`compile_rounds`: the public way to run and time compiled chunks of rounds, the
programs :func:`fedjax_dro.run` executes (:func:`~fedjax_dro.engine.programs.make_chunk_fn`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.base import Algorithm
from fedjax_dro.common.checks import is_int
from fedjax_dro.common.tuning import Tuning, resolve, scope
from fedjax_dro.data.federated import FederatedData, FederatedDataset
from fedjax_dro.engine.prepare import (
  check_run_args,
  check_run_inputs,
  derive_keys,
  prepare_hparams,
  split_data,
)
from fedjax_dro.engine.programs import make_chunk_fn
from fedjax_dro.engine.sharding import axis_size, check_mesh, place_data, place_replicated


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
    if not is_int(repeats) or repeats < 1:
      raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if not is_int(warmup) or warmup < 0:
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
  tuning: Optional[Tuning] = None,
) -> CompiledRounds:
  """Compiles ``rounds`` rounds of ``alg`` on ``data`` into one program (see
  :class:`CompiledRounds`); the keys, initial state and hyper-parameters derive from ``seed``
  and ``hparams`` exactly as in :func:`fedjax_dro.run`, so ``compile_rounds(...)()`` runs the
  rounds ``run`` would run. ``.time()`` gives the steady-state throughput::

      prog = fd.compile_rounds(alg, data, rounds=20, hparams={"client_lr": 0.05})
      timing = prog.time(repeats=3)
      print(timing.rounds_per_second, prog.compile_time)

  ``mesh`` shards the client axis of the data over the mesh's ``"clients"`` axis as in
  :func:`fedjax_dro.run` (see :mod:`fedjax_dro.engine.sharding`); ``tuning`` the performance
  choices as there (:class:`~fedjax_dro.common.tuning.Tuning`).
  """
  rounds, _ = check_run_args(alg, rounds, None)
  train, _, _, _ = split_data(data, None, None)
  check_run_inputs(alg, train, None, init_params=init_params)
  hp = prepare_hparams(alg, hparams, init_params=init_params)
  model_key, init_key, run_key = derive_keys(seed)
  params = alg.model.init(model_key) if init_params is None else init_params
  state = jax.tree.map(jnp.copy, alg.init(params, train, init_key))
  status = (jnp.array(False), jnp.array(-1, jnp.int32))
  if mesh is not None:
    mesh = check_mesh(mesh)
    train = place_data(train, mesh, what="data")
    state, status, hp, run_key = place_replicated((state, status, hp, run_key), mesh)
  # every round of a call is active, whatever start_round (no total-rounds cut-off)
  chunk_fn = jax.jit(make_chunk_fn(alg, np.iinfo(np.int32).max, rounds, check_finite))
  t0 = time.perf_counter()
  shards = 1
  if mesh is not None:
    shards = axis_size(mesh, "clients")
  with scope(resolve(tuning).replace(client_shards=shards)):
    program = chunk_fn.lower(state, status, jnp.int32(0), hp, run_key, train).compile()
  compile_time = time.perf_counter() - t0
  return CompiledRounds(alg, train, rounds, hp, run_key, state, program, compile_time, status)
