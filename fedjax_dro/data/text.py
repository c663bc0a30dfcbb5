"""Text to integer token arrays, through a tokenizer the user gives as a local ``tokenizer.json``
(Hugging Face ``tokenizers``: ``pip install "fedjax_dro[text]"``; nothing downloads).

Two conventions, one per kind of model:

* **Language models** (GPT-2, the LSTMs): :func:`chunk_documents` encodes each document, appends
  the end-of-text token after it (GPT-2's ``<|endoftext|>``), concatenates them and cuts the
  stream into sequences of ``seq_len + 1`` tokens: the inputs are a sequence's first ``seq_len``
  tokens, the targets its last ``seq_len`` (the next token at every position). The last,
  incomplete sequence is dropped (GPT-2 has no padding token), or padded with ``pad_id`` where
  one is given (the language-model loss skips those targets).
* **Classifiers** (DistilBERT): :func:`encode_batch` encodes each text with the tokenizer's own
  special tokens (``[CLS] ... [SEP]``), truncates it to ``max_len`` and pads it with ``pad_id``.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple

import numpy as np


def load_tokenizer(path):
  """The tokenizer saved in the local file ``path`` (a ``tokenizer.json``).

  Raises:
    ImportError: the optional ``tokenizers`` package is not installed (the message says how).
    ValueError: ``path`` is not a readable tokenizer file.
  """
  try:
    from tokenizers import Tokenizer
  except ImportError:
    raise ImportError(
      "reading a tokenizer.json needs the optional 'tokenizers' package: "
      'pip install "fedjax_dro[text]"'
    ) from None
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise ValueError(f"tokenizer {path!r} is not an existing file (a tokenizer.json)")
  try:
    return Tokenizer.from_file(path)
  except Exception as e:  # noqa: BLE001  tokenizers raises its own exception type
    raise ValueError(f"tokenizer {path!r} cannot be read as a tokenizer.json: {e}") from None


def _token_id(tokenizer, token: str, what: str) -> int:
  found = tokenizer.token_to_id(token)
  if found is None:
    raise ValueError(f"{what} {token!r} is not in the tokenizer's vocabulary")
  return int(found)


def _texts(texts, name: str) -> list:
  if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
    raise TypeError(f"{name} must be a list of strings, got {type(texts).__name__}")
  bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
  if bad:
    raise TypeError(f"{name}[{bad[0]}] must be a string, got {type(texts[bad[0]]).__name__}")
  return list(texts)


def chunk_documents(
  texts: Sequence[str],
  tokenizer,
  seq_len: int,
  *,
  eos_token: Optional[str] = "<|endoftext|>",
  pad_id: Optional[int] = None,
  max_sequences: Optional[int] = None,
) -> Tuple[np.ndarray, np.ndarray]:
  """A language model's ``(inputs, targets)``, each ``[N, seq_len]`` int32, from documents.

  Args:
    texts: the documents (strings).
    tokenizer: a ``tokenizers.Tokenizer`` (:func:`load_tokenizer`).
    seq_len: tokens per sequence.
    eos_token: appended after every document (``None``: nothing appended).
    pad_id: pads the last, incomplete sequence (``None``: it is dropped).
    max_sequences: keep at most this many sequences (the first ones).
  """
  texts = _texts(texts, "texts")
  if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
    raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
  eos = None if eos_token is None else _token_id(tokenizer, eos_token, "eos_token")
  stream = []
  for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
    stream.extend(encoding.ids)
    if eos is not None:
      stream.append(eos)
  span = seq_len + 1
  full, rest = divmod(len(stream), span)
  if rest and pad_id is not None:
    stream.extend([int(pad_id)] * (span - rest))
    full += 1
  tokens = np.asarray(stream[: full * span], np.int64).reshape(full, span)
  if max_sequences is not None:
    tokens = tokens[:max_sequences]
  if tokens.size and tokens.max() > np.iinfo(np.int32).max:
    raise ValueError("token ids beyond the int32 range")
  return tokens[:, :-1].astype(np.int32), tokens[:, 1:].astype(np.int32)


def encode_batch(texts: Sequence[str], tokenizer, max_len: int, *, pad_id: int) -> np.ndarray:
  """``[N, max_len]`` int32 token ids of ``texts`` with the tokenizer's special tokens (a
  classifier's ``[CLS] ... [SEP]``), truncated to ``max_len`` and padded with ``pad_id``."""
  texts = _texts(texts, "texts")
  if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
    raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
  from tokenizers import Tokenizer

  truncating = Tokenizer.from_str(tokenizer.to_str())  # a copy: the caller's is left as it is
  truncating.enable_truncation(max_length=max_len)  # the special tokens kept within max_len
  truncating.no_padding()
  out = np.full((len(texts), max_len), int(pad_id), np.int32)
  for i, encoding in enumerate(truncating.encode_batch(texts)):
    out[i, : len(encoding.ids)] = encoding.ids
  return out
