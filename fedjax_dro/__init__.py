"""fedjax_dro: federated learning simulation where the federation is an array axis.

All clients are one stacked pytree, local updates are vmapped, rounds are jit-compiled and
scanned, and seeds and hyper-parameters are one more vectorized axis.
"""

import importlib

from fedjax_dro import algorithms, compare, core, data, engine, models, privacy, records, solvers
from fedjax_dro.algorithms import (
  Algorithm as Algorithm,  # also here for convenience:
  describe as describe,  # documented at their home
  get_algorithm as get_algorithm,
  list_algorithms as list_algorithms,
  make_hparams as make_hparams,
)
from fedjax_dro.common.tuning import Tuning, tuned
from fedjax_dro.data import (
  FederatedData as FederatedData,
  FederatedDataset as FederatedDataset,
  from_arrays as from_arrays,
  from_client_arrays as from_client_arrays,
)
from fedjax_dro.engine.compile_cache import enable_compile_cache
from fedjax_dro.engine.compiled import CompiledRounds, RoundTiming, compile_rounds
from fedjax_dro.engine.errors import NonFiniteError
from fedjax_dro.engine.runner import run
from fedjax_dro.engine.sweeps import SweepResult, sweep
from fedjax_dro.models import Model as Model
from fedjax_dro.privacy import privacy_budget as privacy_budget
from fedjax_dro.privacy.wrapper import private
from fedjax_dro.records.history import History

# Loaded on first use (ott-jax, the reproductions' experiments): `import fedjax_dro` stays quick.
_LAZY = ("experimental", "model_selection", "ot", "reproduce")


def __getattr__(name):
  if name in _LAZY:
    return importlib.import_module(f"fedjax_dro.{name}")
  raise AttributeError(f"module 'fedjax_dro' has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = [
  "algorithms",
  "compare",
  "core",
  "data",
  "engine",
  "experimental",
  "model_selection",
  "models",
  "ot",
  "privacy",
  "records",
  "reproduce",
  "solvers",
  "run",
  "sweep",
  "compile_rounds",
  "CompiledRounds",
  "RoundTiming",
  "SweepResult",
  "History",
  "NonFiniteError",
  "enable_compile_cache",
  "Tuning",
  "tuned",
  "private",
  "__version__",
]
