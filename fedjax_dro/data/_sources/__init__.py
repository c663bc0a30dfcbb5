"""The readers of natural-split datasets (one module each) and their stand-in writers.

Each reader module defines ``source(path, **options) -> Source`` (the user's directory in the
publisher's layout, read as :class:`~fedjax_dro.data._sources.base.Source`) and
``write_standin(path, seed=0) -> str`` (a tiny directory in exactly that layout, with its quirks,
for tests and ``--quick``). :data:`READERS` maps the names ``fedjax-dro prepare`` accepts to
their modules (imported on use).
"""

from __future__ import annotations

import importlib

READERS = {
  "camelyon17": "fedjax_dro.data._sources.camelyon17",
  "iwildcam": "fedjax_dro.data._sources.iwildcam",
  "poverty": "fedjax_dro.data._sources.poverty",
  "civilcomments": "fedjax_dro.data._sources.civilcomments",
  "pile": "fedjax_dro.data._sources.pile",
  "shakespeare": "fedjax_dro.data._sources.shakespeare",
  "fedcifar100": "fedjax_dro.data._sources.fedcifar100",
  "stackoverflow": "fedjax_dro.data._sources.stackoverflow",
}


def reader(name: str):
  """The reader module of ``name`` (a ``ValueError`` listing the known names otherwise)."""
  if name not in READERS:
    raise ValueError(f"source must be one of {sorted(READERS)}, got {name!r}")
  return importlib.import_module(READERS[name])
