"""fedjax_dro: federated learning simulation where the federation is an array axis.

All clients are one stacked pytree, local updates are vmapped, rounds are jit-compiled and
scanned, and seeds and hyper-parameters are one more vectorized axis.
"""

import importlib
from typing import TYPE_CHECKING

from fedjax_dro.common.version import __version__

# Every public name loads on first use (PEP 562): `import fedjax_dro` itself imports nothing
# heavy, so the command line can take over Ctrl-C before JAX loads, and a notebook pays for what
# it touches. Static tools (type checkers, the API reference) read the imports below.
if TYPE_CHECKING:
  from fedjax_dro import (
    algorithms,
    compare,
    core,
    data,
    engine,
    experimental,
    model_selection,
    models,
    ot,
    privacy,
    records,
    reproduce,
    solvers,
  )
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

# name -> the module it lives in
_HOMES = {
  "Algorithm": "fedjax_dro.algorithms",
  "describe": "fedjax_dro.algorithms",
  "get_algorithm": "fedjax_dro.algorithms",
  "list_algorithms": "fedjax_dro.algorithms",
  "make_hparams": "fedjax_dro.algorithms",
  "Tuning": "fedjax_dro.common.tuning",
  "tuned": "fedjax_dro.common.tuning",
  "FederatedData": "fedjax_dro.data",
  "FederatedDataset": "fedjax_dro.data",
  "from_arrays": "fedjax_dro.data",
  "from_client_arrays": "fedjax_dro.data",
  "enable_compile_cache": "fedjax_dro.engine.compile_cache",
  "CompiledRounds": "fedjax_dro.engine.compiled",
  "RoundTiming": "fedjax_dro.engine.compiled",
  "compile_rounds": "fedjax_dro.engine.compiled",
  "NonFiniteError": "fedjax_dro.engine.errors",
  "run": "fedjax_dro.engine.runner",
  "SweepResult": "fedjax_dro.engine.sweeps",
  "sweep": "fedjax_dro.engine.sweeps",
  "Model": "fedjax_dro.models",
  "privacy_budget": "fedjax_dro.privacy",
  "private": "fedjax_dro.privacy.wrapper",
  "History": "fedjax_dro.records.history",
}


def __getattr__(name):
  if name in _HOMES:
    value = getattr(importlib.import_module(_HOMES[name]), name)
  elif name in __all__:  # a subpackage (every other public name is in _HOMES or defined here)
    value = importlib.import_module(f"fedjax_dro.{name}")
  else:
    raise AttributeError(f"module 'fedjax_dro' has no attribute {name!r}")
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))


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
