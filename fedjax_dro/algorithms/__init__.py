"""Algorithms, one per file, registered by name (``fedjax-dro list``): the 23 factories, the
algorithm interface and registry, and what a user needs to write an algorithm of their own
(:func:`build_algorithm`, :func:`register`, :func:`with_settings`; the round mechanics it calls
are :mod:`fedjax_dro.core`'s)."""

from fedjax_dro.algorithms.afl import afl
from fedjax_dro.algorithms.agnostic_fedavg import agnostic_fedavg
from fedjax_dro.algorithms.base import (
  Algorithm,
  HParam,
  algorithm_cost,
  build_algorithm,
  default_hparams,
  describe,
  get_algorithm,
  list_algorithms,
  make_hparams,
  register,
  with_settings,
)
from fedjax_dro.algorithms.ditto import ditto
from fedjax_dro.algorithms.dr_dsgd import dr_dsgd
from fedjax_dro.algorithms.drfa import drfa
from fedjax_dro.algorithms.fedadagrad import fedadagrad
from fedjax_dro.algorithms.fedadam import fedadam
from fedjax_dro.algorithms.fedavg import fedavg
from fedjax_dro.algorithms.fedavg_momentum import fedavg_momentum
from fedjax_dro.algorithms.fedbn import fedbn
from fedjax_dro.algorithms.fedper import fedper
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
from fedjax_dro.algorithms.wrappers import (
  with_class_weighted_accuracy,
  with_round_metrics,
  with_tied_hparams,
)

__all__ = [
  "Algorithm",
  "HParam",
  "build_algorithm",
  "register",
  "with_settings",
  "get_algorithm",
  "list_algorithms",
  "describe",
  "make_hparams",
  "default_hparams",
  "algorithm_cost",
  "with_tied_hparams",
  "with_class_weighted_accuracy",
  "with_round_metrics",
  "afl",
  "agnostic_fedavg",
  "ditto",
  "dr_dsgd",
  "drfa",
  "fedadagrad",
  "fedadam",
  "fedavg",
  "fedavg_momentum",
  "fedbn",
  "fedper",
  "fedprox",
  "fedsgd",
  "fedyogi",
  "fgdro_cvar",
  "fgdro_kl",
  "fgdro_kl_adam",
  "ifca",
  "karula",
  "local",
  "local_adam",
  "pfedme",
  "qffl",
  "scaff_pd",
  "scaffold",
]
