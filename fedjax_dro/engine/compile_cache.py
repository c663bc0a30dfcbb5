"""JAX's persistent compilation cache for this package's programs: :func:`enable_compile_cache`.

A run's round program takes seconds to compile (the FEMNIST-sized FedAvg run: 8-9 s on an H200,
against 13 ms a round), and a researcher runs the same program many times. JAX can keep the
compiled programs on disk; this function turns that on for every program size, and on a GPU
makes the cached programs loadable: while XLA calls cuBLASLt for its matrix products, loading a
cached program fails (jax 0.11.2 on an H100: ``INTERNAL: Failed to initialize BLASLT support``),
so the function asks XLA for the plain cuBLAS path (``--xla_gpu_enable_cublaslt=false``), which
the round programs' speed does not depend on: measured on an H200
(``benchmarks/results/femnist_levers_h200.md``), the FEMNIST-sized run's rounds take 13.1 ms with
cuBLASLt and 12.6 ms through this function, and its second run compiles in 1.0 s instead of 9.1 s
(whole: 20.0 s against 28.8 s).
"""

from __future__ import annotations

import os
import re

import jax

from fedjax_dro.records.files import check_writable_dir

CUBLASLT_OFF = "--xla_gpu_enable_cublaslt=false"


def _backends_started() -> bool:
  """Whether JAX's backends have started (XLA has read its flags); True when it cannot tell."""
  try:
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())
  except (ImportError, AttributeError):  # an older or newer JAX: assume the worst
    return True


def enable_compile_cache(path, *, gpu_loadable: bool = True) -> bool:
  """Keeps XLA's compiled programs in the directory ``path``, for every program size.

  The same program compiled again, in this process or a later one (the same command run twice,
  a notebook restarted), is read from ``path`` instead of compiled. Call it before any JAX
  computation, like :func:`~fedjax_dro.engine.sharding.request_cpu_devices`; the CLI's
  ``--compile-cache DIR`` calls it for you.

  Args:
    path: a directory this process can write into (created if absent).
    gpu_loadable: on a GPU, make the cached programs loadable by turning XLA's cuBLASLt path off
      (``--xla_gpu_enable_cublaslt=false`` appended to ``XLA_FLAGS``; see the module docstring
      for why and what it costs). Left alone when ``XLA_FLAGS`` already names a cuBLASLt
      setting (yours stays in charge) or when JAX's backends have already started. No effect on
      a CPU.

  Returns:
    True when ``XLA_FLAGS`` turns cuBLASLt off for this process (set now, or already there);
    False when it does not (``gpu_loadable=False``, your own cuBLASLt setting, or the backends
    had started: on a GPU a cached program may then fail to load; start a fresh process and call
    this first).

  Raises:
    TypeError: if ``path`` is not a path or ``gpu_loadable`` not a bool.
    ValueError: if ``path`` is not a writable directory.
  """
  if path is None:
    raise TypeError("path must be a directory path, got None")
  if not isinstance(gpu_loadable, bool):
    raise TypeError(f"gpu_loadable must be True or False, got {gpu_loadable!r}")
  check_writable_dir(path, "path")
  flags = os.environ.get("XLA_FLAGS", "")
  named = re.findall(r"--xla_gpu_enable_cublaslt=(\S*)", flags)
  if gpu_loadable and not named and not _backends_started():
    os.environ["XLA_FLAGS"] = f"{flags} {CUBLASLT_OFF}".strip()
    named = ["false"]
  jax.config.update("jax_compilation_cache_dir", os.path.abspath(os.fspath(path)))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  return bool(named) and named[-1].lower() in ("false", "0")
