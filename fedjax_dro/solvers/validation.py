"""Shared helpers for argument validation that must also work under ``jit`` / ``vmap``."""

from __future__ import annotations

import jax
import numpy as np


def concrete_or_none(x):
  """``x`` as a NumPy array if it is concrete, ``None`` if it is traced.

  Value checks (signs, NaN, symmetry) run only on concrete inputs; under ``jit`` / ``vmap`` the
  caller skips them (shapes are static and are always checked).
  """
  if isinstance(x, jax.core.Tracer):
    return None
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None
