"""The argument validators of the package: one message form per mistake.

Each validator names the argument and the value it got, and returns the value in the form the
code uses (a Python ``int``/``float``/``bool``), so a call site reads
``steps = integer(steps, "personal_steps")``::

    integer(v, name, minimum=1, maximum=None, optional=False, none="")  # ArgumentError
    number(v, name, minimum=None, maximum=None, strict=False, ...)      # ArgumentError
    choice(v, name, choices)                                           # ArgumentError
    flag(v, name)                                                      # TypeError
    known(name, table, what)                                           # ValueError

Integers accept any integer type (``int``, ``np.int64``...) and numbers any real type, never a
bool; numbers must be finite. ``optional=True`` lets ``None`` through (``none`` says what it
means, for the message).

The ``ValueError`` of a bad value is an :class:`ArgumentError`, which carries the argument's
name: a caller that knows the argument by another name (the command line's ``--batch-size`` for
``batch_size``) reads ``error.argument`` and says so with :meth:`ArgumentError.renamed`, never by
matching the message.
"""

from __future__ import annotations

import math
import numbers
from typing import Mapping, Optional, Sequence, Tuple, Union

import numpy as np


class ArgumentError(ValueError):
  """A bad value of a named argument: a ``ValueError`` whose message is the argument's name
  followed by ``detail`` (``"batch_size must be an integer >= 1, got 0"``).

  Attributes:
    arguments: the names the message begins with, ``" / "``-separated (usually one; two for
      ``"loss_bound / loss_noise_multiplier: ..."``).
    argument: the first of them.
    detail: the message after the names.
  """

  def __init__(self, arguments: Union[str, Tuple[str, ...]], detail: str):
    self.arguments = (arguments,) if isinstance(arguments, str) else tuple(arguments)
    self.detail = detail
    super().__init__(" / ".join(self.arguments) + detail)

  @property
  def argument(self) -> str:
    return self.arguments[0]

  def renamed(self, names: Mapping[str, str]) -> "ArgumentError":
    """The same error about the arguments as ``names`` calls them (those it does not name keep
    theirs): ``renamed({"batch_size": "--batch-size"})``."""
    return ArgumentError(tuple(names.get(a, a) for a in self.arguments), self.detail)

  def __reduce__(self):
    return type(self), (self.arguments, self.detail)


def _is_bool(value) -> bool:
  return isinstance(value, (bool, np.bool_))


def is_real(value) -> bool:
  """Whether ``value`` is a real number a user means as one: a Python or NumPy int or float
  (``np.float32(2.0)`` included), not a bool."""
  return isinstance(value, numbers.Real) and not _is_bool(value)


def is_int(value) -> bool:
  """Whether ``value`` is an integer a user means as one: a Python or NumPy int, not a bool."""
  return isinstance(value, numbers.Integral) and not _is_bool(value)


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
  """``value`` as a Python int in ``[minimum, maximum]``; :class:`ArgumentError` otherwise."""
  if value is None and optional:
    return None
  if (
    not isinstance(value, numbers.Integral)
    or _is_bool(value)
    or value < minimum
    or (maximum is not None and value > maximum)
  ):
    bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    raise ArgumentError(
      name, f" must be an integer {bound}{_or_none(optional, none)}, got {value!r}"
    )
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
  ``<= maximum``; :class:`ArgumentError` otherwise."""
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
    raise ArgumentError(
      name, f" must be a finite number{bound}{_or_none(optional, none)}, got {value!r}"
    )
  return float(value)


def choice(value, name: str, choices: Sequence):
  """``value`` if it is one of ``choices``; :class:`ArgumentError` otherwise."""
  if isinstance(value, (str, numbers.Number, type(None))) and value in tuple(choices):
    return value
  raise ArgumentError(name, f" must be one of {tuple(choices)}, got {value!r}")


def known(name, table: Mapping, what: str):
  """``table[name]`` of a table of named entries (registered datasets, ...); a ``ValueError``
  naming ``what`` and the available names otherwise."""
  if name not in table:
    raise ValueError(f"unknown {what} {name!r}; available: {sorted(table)}")
  return table[name]


def flag(value, name: str) -> bool:
  """``value`` as a Python bool (``bool`` or ``np.bool_``); ``TypeError`` otherwise."""
  if not _is_bool(value):
    raise TypeError(f"{name} must be a bool (True or False), got {value!r}")
  return bool(value)
