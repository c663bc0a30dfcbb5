"""Algorithms, one per file, registered by name (``fedjax-dro list``)."""

from fedjax_dro.algorithms.afl import afl
from fedjax_dro.algorithms.agnostic_fedavg import agnostic_fedavg
from fedjax_dro.algorithms.base import (
  Algorithm,
  HParam,
  algorithm_cost,
  default_hparams,
  describe,
  get_algorithm,
  list_algorithms,
  make_hparams,
  register,
)
from fedjax_dro.algorithms.ditto import ditto
from fedjax_dro.algorithms.dr_dsgd import dr_dsgd
from fedjax_dro.algorithms.drfa import drfa
from fedjax_dro.algorithms.fedadagrad import fedadagrad
from fedjax_dro.algorithms.fedadam import fedadam
from fedjax_dro.algorithms.fedavg import fedavg
from fedjax_dro.algorithms.fedavg_momentum import fedavg_momentum
from fedjax_dro.algorithms.fedprox import fedprox
from fedjax_dro.algorithms.fedsgd import fedsgd
from fedjax_dro.algorithms.fedyogi import fedyogi
from fedjax_dro.algorithms.fgdro_cvar import fgdro_cvar
from fedjax_dro.algorithms.fgdro_kl import fgdro_kl
from fedjax_dro.algorithms.fgdro_kl_adam import fgdro_kl_adam
from fedjax_dro.algorithms.ifca import ifca
from fedjax_dro.algorithms.karula import karula
from fedjax_dro.algorithms.local import local
from fedjax_dro.algorithms.local_adam import local_adam
from fedjax_dro.algorithms.pfedme import pfedme
from fedjax_dro.algorithms.qffl import qffl
from fedjax_dro.algorithms.scaff_pd import scaff_pd
from fedjax_dro.algorithms.scaffold import scaffold

__all__ = [
  "Algorithm",
  "HParam",
  "default_hparams",
  "describe",
  "get_algorithm",
  "list_algorithms",
  "make_hparams",
  "algorithm_cost",
  "register",
  "fedavg",
  "fedsgd",
  "fedprox",
  "scaffold",
  "fedadam",
  "local",
  "karula",
]
__all__ += ["scaff_pd", "afl", "drfa", "qffl", "agnostic_fedavg"]
__all__ += ["fgdro_cvar", "fgdro_kl", "fgdro_kl_adam", "local_adam", "dr_dsgd"]
__all__ += ["pfedme", "ifca", "ditto"]
__all__ += ["fedavg_momentum", "fedyogi", "fedadagrad"]
