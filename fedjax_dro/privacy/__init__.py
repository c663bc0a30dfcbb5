"""Client-level differential privacy: :func:`private` (DP-FedAvg for the algorithms that declare
what their participants release) and its accounting (:func:`privacy_budget`, :func:`epsilon`,
from ``dp-accounting``).

* :mod:`fedjax_dro.privacy.wrapper`: :func:`private`, :func:`releases_table` (what each
  registered algorithm releases and how it is privatized, or why it cannot be);
* what an algorithm declares: :class:`Releases` or :class:`Refused`
  (:mod:`fedjax_dro.core.release`, with the release mechanisms a round is given);
* :mod:`fedjax_dro.privacy.accounting`: the sampled Gaussian mechanism's events and epsilon.
"""

from fedjax_dro.core.release import Refused, Releases
from fedjax_dro.privacy.accounting import epsilon, privacy_budget
from fedjax_dro.privacy.wrapper import (
  AdaptiveClipState,
  private as private,  # documented as fedjax_dro.private
  releases_table,
)

__all__ = [
  "privacy_budget",
  "epsilon",
  "Releases",
  "Refused",
  "releases_table",
  "AdaptiveClipState",
]
