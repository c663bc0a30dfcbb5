"""Algorithms, one per file, registered by name (``fedjax-dro list``)."""
from fedjax_dro.algorithms.base import (Algorithm, HParam, default_hparams, get_algorithm,
                                        list_algorithms, make_hparams, register)
from fedjax_dro.algorithms.fedavg import fedavg
from fedjax_dro.algorithms.fedsgd import fedsgd
from fedjax_dro.algorithms.fedprox import fedprox
from fedjax_dro.algorithms.scaffold import scaffold
from fedjax_dro.algorithms.fedadam import fedadam
from fedjax_dro.algorithms.local import local
from fedjax_dro.algorithms.scaff_pd import scaff_pd
from fedjax_dro.algorithms.afl import afl
from fedjax_dro.algorithms.drfa import drfa
from fedjax_dro.algorithms.qffl import qffl
from fedjax_dro.algorithms.agnostic_fedavg import agnostic_fedavg
from fedjax_dro.algorithms.karula import karula

__all__ = ["Algorithm", "HParam", "default_hparams", "get_algorithm", "list_algorithms",
           "make_hparams", "register", "fedavg", "fedsgd", "fedprox", "scaffold", "fedadam", "local", "karula"]
__all__ += ["scaff_pd", "afl", "drfa", "qffl", "agnostic_fedavg"]
