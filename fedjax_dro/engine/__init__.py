"""The engine that runs rounds: compiled programs, argument preparation, ``run``, ``sweep`` and
sharding.

* :mod:`fedjax_dro.engine.programs`: the compiled chunk of rounds and the evaluation, and the
  :class:`ProgramCache` that reuses them;
* :mod:`fedjax_dro.engine.prepare`: what ``run``, ``sweep`` and ``compile_rounds`` share before
  anything compiles (argument checks, data split, keys, hyper-parameters, the model x data check);
* :mod:`fedjax_dro.engine.plan`: :class:`RunPlan`, a prepared run;
* :mod:`fedjax_dro.engine.runner`: :func:`run` and its chunk loop :func:`run_chunks`;
* :mod:`fedjax_dro.engine.sweeps`: :func:`sweep` and :class:`SweepResult`;
* :mod:`fedjax_dro.engine.compiled`: :func:`compile_rounds`, :class:`CompiledRounds`,
  :class:`RoundTiming`;
* :mod:`fedjax_dro.engine.sharding`: device meshes, multi-core CPU and multi-host runs;
* :mod:`fedjax_dro.engine.errors`: :class:`NonFiniteError` and :class:`DeviceMemoryError`.

What runs leave behind (histories, files, checkpoints, plots) is :mod:`fedjax_dro.records`.
"""

from fedjax_dro.engine.compiled import CompiledRounds, RoundTiming, compile_rounds
from fedjax_dro.engine.errors import DeviceMemoryError, NonFiniteError
from fedjax_dro.engine.plan import RunPlan
from fedjax_dro.engine.prepare import (
  check_model_data,
  check_run_args,
  check_run_inputs,
  derive_keys,
  is_host_data,
  main_metric,
  prepare_hparams,
  split_data,
  summarize_per_client,
)
from fedjax_dro.engine.programs import (
  ProgramCache,
  abstract_key,
  evaluate_host,
  make_chunk_fn,
  make_eval_fn,
)
from fedjax_dro.engine.runner import run, run_chunks
from fedjax_dro.engine.sharding import (
  even_devices,
  initialize_distributed,
  is_writer,
  local_cpu_cores,
  make_mesh,
  parse_mesh,
  request_cpu_devices,
)
from fedjax_dro.engine.sweeps import SweepResult, sweep

__all__ = [
  "run",
  "run_chunks",
  "RunPlan",
  "sweep",
  "SweepResult",
  "compile_rounds",
  "CompiledRounds",
  "RoundTiming",
  "NonFiniteError",
  "DeviceMemoryError",
  "ProgramCache",
  "abstract_key",
  "evaluate_host",
  "make_chunk_fn",
  "make_eval_fn",
  "check_model_data",
  "check_run_args",
  "check_run_inputs",
  "derive_keys",
  "is_host_data",
  "main_metric",
  "prepare_hparams",
  "split_data",
  "summarize_per_client",
  "even_devices",
  "initialize_distributed",
  "is_writer",
  "local_cpu_cores",
  "make_mesh",
  "parse_mesh",
  "request_cpu_devices",
]
