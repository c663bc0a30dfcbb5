"""Deprecated: moved to :mod:`fedjax_dro.solvers.validation` (this alias goes away in 0.3)."""

from fedjax_dro.core._deprecated import alias_module

alias_module(__name__, "fedjax_dro.solvers.validation")
