"""The specification of one hyper-parameter (:class:`HParam`): its default, valid range and a
one-line description.

It lives in :mod:`fedjax_dro.core` so that the algorithms (:mod:`fedjax_dro.algorithms`) and the
problems whose parameter is a hyper-parameter (the DRO problems of :mod:`fedjax_dro.solvers.dro`)
share one type; :mod:`fedjax_dro.algorithms` re-exports it.
"""

from __future__ import annotations

from typing import NamedTuple, Optional


class HParam(NamedTuple):
  """Specification of one hyper-parameter: default, valid range and a one-line doc."""

  default: float
  doc: str = ""
  minimum: Optional[float] = 0.0
  strict: bool = True  # value > minimum (True) or value >= minimum (False)
  maximum: Optional[float] = None
