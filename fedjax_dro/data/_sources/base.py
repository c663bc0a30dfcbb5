"""What a reader of a natural-split dataset hands to ``prepare``: a :class:`Source`.

A reader (one module per dataset in this package) turns the user's directory, in the publisher's
own layout, into a :class:`Source`: the splits, each a list of clients (the dataset's domains:
hospitals, camera locations, countries, Pile subsets, speaking roles, TFF client ids) whose rows
come as chunks of NumPy arrays. :func:`fedjax_dro.data.prepare` writes a source once into the
prepared format (client-sorted, unpadded, memory-mapped ``.npy`` with a checksummed manifest);
streamed rounds read that format. A reader validates the layout before it yields a row and names
the file and what is wrong in one line (:class:`SourceError`), so ``prepare`` never leaves a
half-written result behind a bad input.

Rows of a chunk: ``(x, y, group)`` with ``x`` ``[k, *x_shape]`` of ``x_dtype`` (or, for a source
whose inputs are stored encoded, a list of ``k`` ``bytes`` objects: the image files' own bytes,
decoded at read time by ``decode``), ``y`` ``[k, *y_shape]`` of ``y_dtype`` and ``group``
``[k]`` int32 indices into ``Source.groups`` (the evaluation groups: CivilComments' identity x
label groups, PovertyMap's urban / rural; ``("all",)`` and zeros where a dataset has none).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional, Sequence, Tuple

import numpy as np

Chunk = Tuple[Any, np.ndarray, np.ndarray]  # (x, y, group)


class SourceError(ValueError):
  """A file of the user's dataset directory is missing or malformed (one line: the file and what
  is wrong)."""


class SplitSource(NamedTuple):
  """One split of a :class:`Source`.

  Attributes:
    name: the split's name (``"train"``, ``"id_val"``, ``"val"``, ``"test"``, ...).
    clients: the clients' names, in the order the prepared split stores them.
    rows: ``rows(i)`` iterates over client ``i``'s rows as :data:`Chunk` s, deterministic (a
      resumed ``prepare`` skips the chunks it has already written by counting them).
    num_rows: rows per client when the reader knows them before reading (from the metadata: the
      progress bar and a check), else None.
  """

  name: str
  clients: Tuple[str, ...]
  rows: Callable[[int], Iterator[Chunk]]
  num_rows: Optional[Tuple[int, ...]] = None


class Source(NamedTuple):
  """A dataset as its reader sees it (see the module docstring).

  Attributes:
    dataset: the reader's name (``"camelyon17"``).
    x_shape: one row's input shape (after decoding, for an encoded source).
    x_dtype: its dtype name (``"uint8"``, ``"float32"``, ``"int32"``).
    y_shape: one row's label shape (``()`` for a class, ``(seq_len,)`` for next tokens).
    y_dtype: its dtype name.
    groups: the evaluation groups' names (``group`` ids index it).
    splits: the splits, in order.
    info: JSON-able facts written into the manifest: ``task`` (``"classification"``,
      ``"regression"``, ``"language_model"``), ``num_classes``, ``metrics`` (what the papers
      report on it), ``label_names``, ``protocol`` (the choices the reader made and why),
      ``citation``.
    encoding: None (inputs stored as arrays) or ``"image"`` (each row's input stored as its
      image file's bytes; decoded with Pillow to ``x_shape`` at read time).
  """

  dataset: str
  x_shape: Tuple[int, ...]
  x_dtype: str
  y_shape: Tuple[int, ...]
  y_dtype: str
  groups: Tuple[str, ...]
  splits: Tuple[SplitSource, ...]
  info: Dict[str, Any]
  encoding: Optional[str] = None


def read_csv(path: str, required: Sequence[str]) -> Dict[str, list]:
  """The columns of a CSV file as lists of strings, checked to hold ``required`` (a
  :class:`SourceError` naming the file and the missing column otherwise)."""
  import csv
  import os

  if not os.path.isfile(path):
    raise SourceError(f"{path}: file not found")
  try:
    with open(path, newline="", encoding="utf-8") as f:
      reader = csv.reader(f)
      try:
        header = next(reader)
      except StopIteration:
        raise SourceError(f"{path}: empty file, expected a header row") from None
      rows = list(reader)
  except (OSError, UnicodeDecodeError, csv.Error) as e:
    raise SourceError(f"{path}: cannot be read as CSV ({e})") from None
  missing = [c for c in required if c not in header]
  if missing:
    raise SourceError(f"{path}: missing required column {missing[0]!r} (columns: {header})")
  columns: Dict[str, list] = {name: [] for name in header}
  for i, row in enumerate(rows):
    if len(row) != len(header):
      raise SourceError(f"{path}: line {i + 2} has {len(row)} fields, the header {len(header)}")
    for name, value in zip(header, row):
      columns[name].append(value)
  return columns
