"""The argument validators of the package: one message form per mistake.

Each validator names the argument and the value it got, and returns the value in the form the
code uses (a Python ``int``/``float``/``bool``), so a call site reads
``steps = integer(steps, "personal_steps")``::

    integer(v, name, minimum=1, maximum=None, optional=False, none="")  # ValueError
    number(v, name, minimum=None, maximum=None, strict=False, ...)      # ValueError
    choice(v, name, choices)                                           # ValueError
    flag(v, name)                                                      # TypeError

Integers accept any integer type (``int``, ``np.int64``...) and numbers any real type, never a
bool; numbers must be finite. ``optional=True`` lets ``None`` through (``none`` says what it
means, for the message).
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence

import numpy as np


def _is_bool(value) -> bool:
  return isinstance(value, (bool, np.bool_))


def _or_none(optional: bool, none: str) -> str:
  if not optional:
    return ""
  return f" or None ({none})" if none else " or None"


def integer(
  value,
  name: str,
  *,
  minimum: int = 1,
  maximum: Optional[int] = None,
  optional: bool = False,
  none: str = "",
) -> Optional[int]:
  """``value`` as a Python int in ``[minimum, maximum]``; ``ValueError`` otherwise."""
  if value is None and optional:
    return None
  if (
    not isinstance(value, numbers.Integral)
    or _is_bool(value)
    or value < minimum
    or (maximum is not None and value > maximum)
  ):
    bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    raise ValueError(f"{name} must be an integer {bound}{_or_none(optional, none)}, got {value!r}")
  return int(value)


def number(
  value,
  name: str,
  *,
  minimum: Optional[float] = None,
  maximum: Optional[float] = None,
  strict: bool = False,
  optional: bool = False,
  none: str = "",
) -> Optional[float]:
  """``value`` as a finite Python float, ``> minimum`` (``strict``) or ``>= minimum``, and
  ``<= maximum``; ``ValueError`` otherwise."""
  if value is None and optional:
    return None
  ok = isinstance(value, numbers.Real) and not _is_bool(value) and math.isfinite(float(value))
  if ok and minimum is not None:
    ok = value > minimum if strict else value >= minimum
  if ok and maximum is not None:
    ok = value <= maximum
  if not ok:
    bounds = []
    if minimum is not None:
      bounds.append(f"{'>' if strict else '>='} {minimum}")
    if maximum is not None:
      bounds.append(f"<= {maximum}")
    bound = (" " + " and ".join(bounds)) if bounds else ""
    raise ValueError(
      f"{name} must be a finite number{bound}{_or_none(optional, none)}, got {value!r}"
    )
  return float(value)


def choice(value, name: str, choices: Sequence):
  """``value`` if it is one of ``choices``; ``ValueError`` otherwise."""
  if isinstance(value, (str, numbers.Number, type(None))) and value in tuple(choices):
    return value
  raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def flag(value, name: str) -> bool:
  """``value`` as a Python bool (``bool`` or ``np.bool_``); ``TypeError`` otherwise."""
  if not _is_bool(value):
    raise TypeError(f"{name} must be a bool (True or False), got {value!r}")
  return bool(value)
