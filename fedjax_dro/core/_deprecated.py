"""Old import paths of the solvers, kept working for one release (0.2) with a warning."""

from __future__ import annotations

import importlib
import warnings


def alias_module(old: str, new: str) -> None:
  """Makes ``old`` an alias of ``new``: the same module object, with a ``DeprecationWarning``.

  Called from the old module's body; ``sys.modules[old]`` is replaced by the new module, so
  every name (public and private) resolves exactly as before and monkey-patching either path
  patches both.
  """
  import sys

  warnings.warn(
    f"{old} moved to {new}; the old path will be removed in fedjax_dro 0.3",
    DeprecationWarning,
    stacklevel=3,
  )
  sys.modules[old] = importlib.import_module(new)
