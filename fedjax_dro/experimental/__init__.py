"""Experimental forms: correct (tested against the reference loops) but faster on no platform
measured yet, so off by default; a measurement that turns one on somewhere moves it out.

* :mod:`fedjax_dro.experimental.factored`: local SGD with a model's wide dense layers kept as
  ``W_0 + A^T G`` over the local steps (``fd.Tuning(factored_dense=True)``).
"""

from fedjax_dro.experimental.factored import local_factored_dense

__all__ = [
  "local_factored_dense",
]
