"""Helpers the text readers share (CivilComments, the Pile): the user's ``tokenizer.json`` loaded
as a :class:`~fedjax_dro.data._sources.base.SourceError` on failure, a tiny word-level tokenizer
for the stand-ins, a dataset root found from either of two directories, and rows cut into
chunks."""

from __future__ import annotations

import os
from typing import Iterator, Optional, Sequence

import numpy as np

from fedjax_dro.data._sources.base import SourceError

CHUNK_ROWS = 256  # rows per chunk a reader yields

# The stand-ins' special tokens: a classifier's (DistilBERT-style) and GPT-2's end-of-text.
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "<|endoftext|>")


def find_root(path, marker: str) -> str:
  """``path`` itself when it holds ``marker`` (a file or folder name), else ``path/<sub>`` for the
  one subfolder that does (the folder that contains the dataset's folder), else a SourceError."""
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise SourceError(f"{path}: not a directory")
  if os.path.exists(os.path.join(path, marker)):
    return path
  for name in sorted(os.listdir(path)):
    sub = os.path.join(path, name)
    if os.path.isdir(sub) and os.path.exists(os.path.join(sub, marker)):
      return sub
  raise SourceError(f"{path}: no {marker!r} in it nor in a folder inside it")


def resolve_tokenizer(dirs: Sequence[str], tokenizer, need: Sequence[str] = ()):
  """The tokenizer at ``tokenizer`` (a tokenizer.json), or when None the first
  ``<dir>/tokenizer.json`` of ``dirs`` that exists, holding the tokens ``need``; a one-line
  SourceError otherwise. Returns ``(tokenizer, file)``."""
  from fedjax_dro.data.text import load_tokenizer

  if tokenizer is None:
    found = [os.path.join(d, "tokenizer.json") for d in dirs]
    found = [f for f in found if os.path.isfile(f)]
    if not found:
      raise SourceError(
        f"{os.path.join(dirs[0], 'tokenizer.json')}: file not found; pass tokenizer=PATH to the"
        " model's tokenizer.json (DistilBERT's for CivilComments, GPT-2's for the Pile)"
      )
    tokenizer = found[0]
  tokenizer = os.fspath(tokenizer)
  try:
    tok = load_tokenizer(tokenizer)
  except ValueError as e:
    raise SourceError(f"{tokenizer}: {e}") from None
  for token in need:
    if tok.token_to_id(token) is None:
      raise SourceError(f"{tokenizer}: the token {token!r} is not in the tokenizer's vocabulary")
  return tok, tokenizer


def write_word_tokenizer(file: str, words: Sequence[str], classifier: bool) -> None:
  """A word-level tokenizer.json over :data:`SPECIALS` then ``words`` (ids in that order), split
  on whitespace and punctuation; ``classifier``: encodings wrapped in ``[CLS] ... [SEP]``."""
  from tokenizers import Tokenizer, models, pre_tokenizers, processors

  vocab = {token: i for i, token in enumerate(list(SPECIALS) + list(words))}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  if classifier:
    tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]",
      special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
  tok.save(file)


def chunked(n: int, size: Optional[int] = None) -> Iterator[slice]:
  """Slices covering ``range(n)`` in order, ``size`` (default :data:`CHUNK_ROWS`) at a time."""
  size = size or CHUNK_ROWS
  for start in range(0, n, size):
    yield slice(start, min(start + size, n))


def positive_int(name: str, value, allow_none: bool = False) -> None:
  """A ValueError unless ``value`` is a positive int (or None where allowed)."""
  if value is None and allow_none:
    return
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")
