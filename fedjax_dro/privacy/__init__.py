"""Client-level differential privacy: :func:`private` (DP-FedAvg for the algorithms that can
have it) and its accounting (:func:`privacy_budget`, :func:`epsilon`, from ``dp-accounting``).

* :mod:`fedjax_dro.privacy.wrapper`: :func:`private`, :data:`RELEASES` (what each algorithm
  releases and how it is privatized), :data:`REFUSED`, :data:`NOT_YET`;
* :mod:`fedjax_dro.privacy.accounting`: the sampled Gaussian mechanism's events and epsilon;
* the round mechanics (Poisson participation, clipping, noise): :mod:`fedjax_dro.core.privacy`.
"""

from fedjax_dro.privacy.accounting import epsilon, privacy_budget
from fedjax_dro.privacy.wrapper import NOT_YET, REFUSED, RELEASES, AdaptiveClipState, private

__all__ = [
  "private",
  "privacy_budget",
  "epsilon",
  "RELEASES",
  "REFUSED",
  "NOT_YET",
  "AdaptiveClipState",
]
