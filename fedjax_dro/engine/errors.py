"""The errors a run or sweep raises while running: a non-finite round (:class:`NonFiniteError`)
and device memory exhausted while compiling or running (:class:`DeviceMemoryError`)."""

from __future__ import annotations

import numpy as np


class NonFiniteError(FloatingPointError):
  """A round produced NaN/Inf. ``.round`` is its index, ``.state`` the last finite state,
  ``.history`` what was recorded before it."""

  def __init__(self, message, round_index, state, history):
    super().__init__(message)
    self.round = round_index
    self.state = state
    self.history = history


def nonfinite_error(alg, first_bad, hp, state, history) -> NonFiniteError:
  """The :class:`NonFiniteError` of a run of ``alg`` whose round ``first_bad`` (0-based) was not
  finite; its message names the hyper-parameters ``hp``."""
  shown = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in hp.items()}
  return NonFiniteError(
    f"{alg.name}: round {first_bad + 1} (0-based index {first_bad}) produced a non-finite "
    f"value (NaN/Inf) in the state or metrics; the run stopped and kept the state after "
    f"round {first_bad}. Lower the step sizes (hparams={shown}) or check the data.",
    first_bad,
    state,
    history,
  )


class DeviceMemoryError(MemoryError):
  """The accelerator (or host) ran out of memory compiling or running the rounds."""


MEMORY_ADVICE = (
  "lower the memory of one round: --backend chunked with a smaller --chunk-size (Python: "
  "backend='chunked', chunk_size=...), or --backend map, or fewer --clients-per-round, a smaller "
  "--batch-size, fewer sweep configurations; or keep the client data on the host (--host-data)"
)


def is_out_of_memory(error: BaseException) -> bool:
  """Whether ``error`` is XLA's (or the host's) out-of-memory error."""
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def memory_error(error: BaseException, what: str) -> DeviceMemoryError:
  """The :class:`DeviceMemoryError` of ``error`` raised while ``what`` (e.g. "compiling X's
  rounds"), with advice on lowering the memory of a round."""
  first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  return DeviceMemoryError(f"{what} ran out of device memory ({first[:200]}); {MEMORY_ADVICE}")
