"""fedjax_dro: federated learning simulation where the federation is an array axis.

All clients are one stacked pytree, local updates are vmapped, rounds are jit-compiled and
scanned, and seeds and hyper-parameters are one more vectorized axis.
"""

from fedjax_dro import algorithms, compare, core, data, engine, models, privacy, records, solvers
from fedjax_dro.algorithms import (
  Algorithm,
  describe,
  get_algorithm,
  list_algorithms,
  make_hparams,
)
from fedjax_dro.common.tuning import Tuning, tuned
from fedjax_dro.data import FederatedData, FederatedDataset, from_arrays, from_client_arrays
from fedjax_dro.engine import (
  CompiledRounds,
  NonFiniteError,
  RoundTiming,
  SweepResult,
  compile_rounds,
  enable_compile_cache,
  run,
  sweep,
)
from fedjax_dro.models import Model
from fedjax_dro.privacy import privacy_budget, private
from fedjax_dro.records import History

__version__ = "0.1.0"
__all__ = [
  "algorithms",
  "compare",
  "core",
  "data",
  "engine",
  "models",
  "privacy",
  "records",
  "solvers",
  "Algorithm",
  "get_algorithm",
  "describe",
  "list_algorithms",
  "make_hparams",
  "FederatedData",
  "FederatedDataset",
  "from_arrays",
  "from_client_arrays",
  "Model",
  "History",
  "NonFiniteError",
  "SweepResult",
  "run",
  "sweep",
  "compile_rounds",
  "CompiledRounds",
  "RoundTiming",
  "enable_compile_cache",
  "Tuning",
  "tuned",
  "private",
  "privacy_budget",
  "__version__",
]
