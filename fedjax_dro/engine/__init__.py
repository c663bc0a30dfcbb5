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
* :mod:`fedjax_dro.engine.compile_cache`: :func:`enable_compile_cache`, compiled programs kept on
  disk between processes;
* :mod:`fedjax_dro.engine.errors`: :class:`NonFiniteError` and :class:`DeviceMemoryError`.

What runs leave behind (histories, files, checkpoints, plots) is :mod:`fedjax_dro.records`.

This package exports what a user calls: running (:func:`run`, :func:`sweep`,
:func:`compile_rounds` and their results), the errors a run raises, and the device-mesh and
multi-host helpers. The plumbing those share (argument checks, key derivation, the compiled
chunk and evaluation programs, their cache) stays importable from its module, as internals
whose names may change.
"""

from fedjax_dro.engine.errors import DeviceMemoryError
from fedjax_dro.engine.sharding import initialize_distributed, make_mesh, request_cpu_devices

__all__ = [
  "make_mesh",
  "initialize_distributed",
  "request_cpu_devices",
  "DeviceMemoryError",
]
