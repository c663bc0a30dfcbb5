"""Helpers shared by the WILDS readers (:mod:`.camelyon17`, :mod:`.iwildcam`, :mod:`.poverty`).

Finding the dataset folder (the user may point at the folder WILDS downloads into, e.g.
``data/``, or at ``data/camelyon17_v1.0/`` itself), parsing metadata columns with one-line errors
that name the file and the line, cutting a client's rows into chunks, and the WILDS citation.
"""

from __future__ import annotations

import io
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from fedjax_dro.data._sources.base import SourceError

CHUNK = 256  # rows per chunk a reader yields


def resolve_dir(path: str, folder: str, marker: str) -> str:
  """The dataset folder: ``path`` itself when it holds ``marker``, else ``path/folder``."""
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if not os.path.isdir(path):
    raise SourceError(f"{path}: directory not found")
  if os.path.isfile(os.path.join(path, marker)):
    return path
  inner = os.path.join(path, folder)
  if os.path.isdir(inner):
    if not os.path.isfile(os.path.join(inner, marker)):
      raise SourceError(f"{os.path.join(inner, marker)}: file not found")
    return inner
  raise SourceError(
    f"{path}: neither {marker} nor {folder}/{marker} found (point at the folder holding {folder}/)"
  )


def int_column(
  file: str, columns: Dict[str, list], name: str, allowed: Optional[Sequence[int]] = None
) -> List[int]:
  """Column ``name`` parsed as integers (pandas writes ``3`` or ``3.0``), checked against
  ``allowed`` when given; a one-line :class:`SourceError` naming the file and the line otherwise."""
  out = []
  allowed_set = None if allowed is None else set(allowed)
  for i, text in enumerate(columns[name]):
    try:
      value = float(text)
      if not value.is_integer():
        raise ValueError
      value = int(value)
    except ValueError:
      raise SourceError(
        f"{file}: line {i + 2}: column {name!r} holds {text!r}, expected an integer"
      ) from None
    if allowed_set is not None and value not in allowed_set:
      raise SourceError(
        f"{file}: line {i + 2}: column {name!r} holds {value}, "
        f"expected one of {sorted(allowed_set)}"
      )
    out.append(value)
  return out


def float_column(file: str, columns: Dict[str, list], name: str) -> List[float]:
  """Column ``name`` parsed as finite floats (a one-line :class:`SourceError` otherwise)."""
  out = []
  for i, text in enumerate(columns[name]):
    try:
      value = float(text)
    except ValueError:
      value = float("nan")
    if not np.isfinite(value):
      raise SourceError(
        f"{file}: line {i + 2}: column {name!r} holds {text!r}, expected a finite number"
      )
    out.append(value)
  return out


def choice_column(file: str, columns: Dict[str, list], name: str, allowed: Sequence[str]) -> list:
  """Column ``name`` checked to hold only ``allowed`` strings (e.g. split names)."""
  allowed_set = set(allowed)
  values = columns[name]
  for i, text in enumerate(values):
    if text not in allowed_set:
      what = "split" if name == "split" else f"{name} value"
      raise SourceError(
        f"{file}: line {i + 2}: unknown {what} {text!r} (expected one of {list(allowed)})"
      )
  return values


def check_files(files: Sequence[str], metadata: str) -> None:
  """Every referenced file exists (a one-line :class:`SourceError` naming the first missing one
  and the metadata line that refers to it)."""
  for i, file in enumerate(files):
    if not os.path.isfile(file):
      raise SourceError(f"{file}: file not found (referenced by {metadata} line {i + 2})")


def chunks(
  rows: Sequence[int], load: Callable[[Sequence[int]], Any], size: int = CHUNK
) -> Iterator[Any]:
  """``load(rows[k:k + size])`` for consecutive slices: a client's rows in chunks."""
  for k in range(0, len(rows), size):
    yield load(rows[k : k + size])


def decode_rgb(file: str, data: bytes, size: Optional[tuple] = None, draft=None) -> np.ndarray:
  """The image in ``data`` (the bytes of ``file``) decoded to RGB uint8 ``[h, w, 3]``; a one-line
  :class:`SourceError` naming ``file`` when it does not decode (truncated, not an image) or, with
  ``size`` ``(w, h)``, has another size. ``draft`` ``(w, h)`` lets a JPEG decode at a reduced scale
  (a full check of its data, cheaper than a full-size decode)."""
  from PIL import Image

  try:
    with Image.open(io.BytesIO(data)) as img:
      if size is not None and img.size != tuple(size):
        raise SourceError(
          f"{file}: image is {img.size[0]}x{img.size[1]}, expected {size[0]}x{size[1]}"
        )
      if draft is not None:
        img.draft("RGB", tuple(draft))
      img.load()
      return np.asarray(img.convert("RGB"), dtype=np.uint8)
  except SourceError:
    raise
  except (OSError, SyntaxError, ValueError) as e:  # Pillow: UnidentifiedImageError is an OSError
    raise SourceError(f"{file}: cannot be decoded as an image ({type(e).__name__}: {e})") from None


def read_bytes(file: str) -> bytes:
  try:
    with open(file, "rb") as f:
      return f.read()
  except OSError as e:
    raise SourceError(f"{file}: cannot be read ({e.strerror or e})") from None


def wilds_citation(dataset: Dict[str, Any]) -> Dict[str, Any]:
  """The WILDS benchmark's citation, with the original dataset's under ``"dataset"``."""
  return {
    "title": "WILDS: A Benchmark of in-the-Wild Distribution Shifts",
    "authors": "Koh, Sagawa, Marklund, Xie, Zhang, Balsubramani, Hu, Yasunaga, Phillips, Gao, "
    "Lee, David, Stavness, Guo, Earnshaw, Haque, Beery, Leskovec, Kundaje, Pierson, Levine, "
    "Finn, Liang",
    "year": 2021,
    "arxiv": "2012.07421",
    "venue": "ICML 2021",
    "dataset": dict(dataset),
  }
