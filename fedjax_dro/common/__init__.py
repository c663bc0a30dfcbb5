"""What every layer of the package shares, below all of them: the tuning value
(:mod:`fedjax_dro.common.tuning`), the model declarations (:mod:`fedjax_dro.common.model`) and
argument checks. Imports nothing else of the package."""
