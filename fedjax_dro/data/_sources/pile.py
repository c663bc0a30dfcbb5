"""The uncopyrighted Pile (``monology/pile-uncopyrighted``): language modelling, one client per
Pile subset.

Layout read (the release as downloaded)::

  pile-uncopyrighted/
    train/00.jsonl.zst, train/01.jsonl.zst, ...   # 30 shards in the full release
    val.jsonl.zst
    test.jsonl.zst

``path`` is that folder or the folder that contains it. Each ``.zst`` file is zstandard-compressed
JSON lines, one document a line: ``{"text": "...", "meta": {"pile_set_name": "ArXiv"}}``.

Domains: the Pile's 22 subsets less the five the uncopyrighted release removed (its README:
"everything from the Books3, BookCorpus2, OpenSubtitles, YTSubtitles, and OWT2 subsets"; their
``pile_set_name`` s are ``Books3``, ``BookCorpus2``, ``OpenSubtitles``, ``YoutubeSubtitles``,
``OpenWebText2``): the 17 of :data:`DOMAINS`. A line of a removed subset (the full Pile read by
mistake, or a stray line) is skipped (not counted: counting would cost a pass over the files
before ``prepare``); a ``pile_set_name`` outside the Pile's 22 is an error naming the file and
line.

Clients: the 17 domains in sorted order (the same in every split); ``group`` is the client's
index and ``groups`` the domain names (metrics: log-perplexity per domain, worst and average).

Rows: GPT-2 tokens in :func:`fedjax_dro.data.text.chunk_documents`' convention: each of a
domain's documents, in file order (shards in name order), is encoded and followed by
``<|endoftext|>``; the stream is cut into sequences of ``seq_len + 1`` (the incomplete last one
dropped); ``x`` the first ``seq_len`` tokens, ``y`` the last ``seq_len``, both int32.

Choices: ``seq_len`` 1024 (GPT-2's context; FGDRO does not state one); at most
``max_sequences_per_domain`` (20,000) sequences per domain in train and
``max_eval_sequences_per_domain`` (2,000) in val and test: the domains' sizes differ by more than
two orders of magnitude (Pile-CC 227 GiB, Enron Emails 0.9 GiB), and the cap bounds the largest.
Cost: ``rows(i)`` streams the split's files once and keeps domain ``i``'s documents, so preparing a
split reads it once per domain (17 passes; a large domain stops at its cap, a small one reads to
the end); ``max_lines`` stops every pass after that many lines of the split.

Sizes: the Pile is 825 GiB of raw text (Gao et al., table 1); the five removed subsets are
187 GiB of it, so the release holds about 638 GiB; the largest domain (Pile-CC, 227 GiB) is 258x
the smallest (Enron Emails, 0.88 GiB).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from fedjax_dro.data._sources._textio import (
  CHUNK_ROWS,
  find_root,
  positive_int,
  resolve_tokenizer,
  write_word_tokenizer,
)
from fedjax_dro.data._sources.base import Source, SourceError, SplitSource

DOMAINS = (
  "ArXiv",
  "DM Mathematics",
  "Enron Emails",
  "EuroParl",
  "FreeLaw",
  "Github",
  "Gutenberg (PG-19)",
  "HackerNews",
  "NIH ExPorter",
  "PhilPapers",
  "Pile-CC",
  "PubMed Abstracts",
  "PubMed Central",
  "StackExchange",
  "USPTO Backgrounds",
  "Ubuntu IRC",
  "Wikipedia (en)",
)
REMOVED = ("Books3", "BookCorpus2", "OpenSubtitles", "YoutubeSubtitles", "OpenWebText2")
EOS = "<|endoftext|>"
SHARD = re.compile(r"^\d\d\.jsonl\.zst$")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
DEFAULT_SEQ_LEN = 1024
DEFAULT_MAX_SEQUENCES = 20000
DEFAULT_MAX_EVAL_SEQUENCES = 2000
READ_BYTES = 1 << 20
DOCS_PER_BATCH = 64  # documents encoded together

CITATION = (
  "Gao et al. The Pile: An 800GB dataset of diverse text for language modeling. arXiv:2101.00027,"
  " 2020 (the uncopyrighted release: huggingface.co/datasets/monology/pile-uncopyrighted)."
)


def _zstandard():
  try:
    import zstandard
  except ImportError:
    raise ImportError(
      "reading the Pile's .jsonl.zst files needs the optional 'zstandard' package:"
      ' pip install "fedjax_dro[data]"'
    ) from None
  return zstandard


def _lines(file: str):
  """``(line_number, bytes)`` of a .jsonl.zst file, streamed (frames one after another); a
  corrupt or truncated file is a SourceError naming the file and the line reached."""
  zstandard = _zstandard()
  dctx = zstandard.ZstdDecompressor()
  number = 0
  rest = b""
  try:
    with open(file, "rb") as f:
      dobj, in_frame = dctx.decompressobj(), False
      while True:
        data = f.read(READ_BYTES)
        if not data:
          break
        while data:
          out = dobj.decompress(data)
          in_frame = True
          data = b""
          if dobj.eof:
            data, dobj, in_frame = dobj.unused_data, dctx.decompressobj(), False
          if out:
            parts = (rest + out).split(b"\n")
            rest = parts.pop()
            for line in parts:
              number += 1
              yield number, line
  except zstandard.ZstdError as e:
    raise SourceError(f"{file}: corrupt zstandard data near line {number + 1} ({e})") from None
  except OSError as e:
    raise SourceError(f"{file}: cannot be read ({e})") from None
  if in_frame:
    raise SourceError(f"{file}: truncated zstandard data after line {number}")
  if rest:
    yield number + 1, rest


def _document(file: str, number: int, line: bytes):
  """``(pile_set_name, text)`` of a line; a SourceError naming the file and line otherwise."""
  try:
    record = json.loads(line)
  except ValueError as e:
    raise SourceError(f"{file}: line {number} is not JSON ({e})") from None
  meta = record.get("meta") if isinstance(record, dict) else None
  name = meta.get("pile_set_name") if isinstance(meta, dict) else None
  if not isinstance(name, str) or not isinstance(record.get("text"), str):
    raise SourceError(
      f"{file}: line {number} lacks a string 'text' and meta.pile_set_name (a Pile line)"
    )
  if name not in DOMAINS and name not in REMOVED:
    raise SourceError(f"{file}: line {number} has an unknown pile_set_name {name!r}")
  return name, record["text"]


def _check_file(file: str) -> None:
  """The file exists, starts as zstandard data and its first line is a Pile line."""
  if not os.path.isfile(file):
    raise SourceError(f"{file}: file not found")
  with open(file, "rb") as f:
    if f.read(4) != ZSTD_MAGIC:
      raise SourceError(f"{file}: not zstandard data (no zstd frame header)")
  for number, line in _lines(file):
    _document(file, number, line)
    break


def _stream_pairs(texts, tok, seq_len: int, carry: list):
  """Sequences of ``seq_len + 1`` tokens from ``texts`` after the tokens ``carry`` left by the
  previous batch (updated in place), so documents concatenate across batches exactly as in one
  :func:`chunk_documents` call over all of them."""
  from fedjax_dro.data.text import chunk_documents

  # The helper's own encoding and end-of-text convention, as pairs (seq_len 1, the odd last token
  # padded with -1), re-joined into the flat stream.
  first, second = chunk_documents(texts, tok, 1, eos_token=EOS, pad_id=-1)
  stream = np.stack([first[:, 0], second[:, 0]], axis=1).reshape(-1)
  if stream.size and stream[-1] == -1:
    stream = stream[:-1]
  stream = np.concatenate([np.asarray(carry, np.int32), stream])
  span = seq_len + 1
  full = len(stream) // span
  carry[:] = stream[full * span :].tolist()
  return stream[: full * span].reshape(full, span)


def source(
  path,
  tokenizer=None,
  seq_len: int = DEFAULT_SEQ_LEN,
  max_sequences_per_domain: int = DEFAULT_MAX_SEQUENCES,
  max_eval_sequences_per_domain: int = DEFAULT_MAX_EVAL_SEQUENCES,
  max_lines=None,
) -> Source:
  """The uncopyrighted Pile under ``path`` (see the module docstring).

  Args:
    path: the release's folder (``train/``, ``val.jsonl.zst``, ``test.jsonl.zst``) or the folder
      that contains it.
    tokenizer: GPT-2's ``tokenizer.json`` (holding ``<|endoftext|>``); default: a
      ``tokenizer.json`` in ``path`` or in the release's folder.
    seq_len: tokens per sequence.
    max_sequences_per_domain: sequences kept per domain in train (the first ones).
    max_eval_sequences_per_domain: sequences kept per domain in val and test.
    max_lines: read at most this many lines of each split per pass (None: all).
  """
  for name, value in [
    ("seq_len", seq_len),
    ("max_sequences_per_domain", max_sequences_per_domain),
    ("max_eval_sequences_per_domain", max_eval_sequences_per_domain),
  ]:
    positive_int(name, value)
  positive_int("max_lines", max_lines, allow_none=True)
  _zstandard()
  path = os.fspath(path)
  root = find_root(path, "val.jsonl.zst")
  train_dir = os.path.join(root, "train")
  if not os.path.isdir(train_dir):
    raise SourceError(f"{train_dir}: folder not found (the train shards NN.jsonl.zst)")
  shards = sorted(n for n in os.listdir(train_dir) if SHARD.match(n))
  if not shards:
    raise SourceError(f"{train_dir}: no shard named NN.jsonl.zst (00.jsonl.zst, 01.jsonl.zst, ...)")
  files = {
    "train": [os.path.join(train_dir, n) for n in shards],
    "val": [os.path.join(root, "val.jsonl.zst")],
    "test": [os.path.join(root, "test.jsonl.zst")],
  }
  for split_files in files.values():
    for file in split_files:
      _check_file(file)
  tok, tokenizer_file = resolve_tokenizer([path, root], tokenizer, need=(EOS,))

  def make_split(name: str, cap: int) -> SplitSource:
    def rows(i: int):
      domain = DOMAINS[i]
      carry, texts, kept, read = [], [], 0, 0
      pending = np.zeros((0, seq_len + 1), np.int32)

      def documents():
        nonlocal read
        for file in files[name]:
          for number, line in _lines(file):
            if max_lines is not None and read >= max_lines:
              return
            read += 1
            set_name, text = _document(file, number, line)
            if set_name == domain:
              yield text

      for text in documents():
        texts.append(text)
        if len(texts) < DOCS_PER_BATCH:
          continue
        pending = np.concatenate([pending, _stream_pairs(texts, tok, seq_len, carry)])
        texts = []
        while len(pending) >= CHUNK_ROWS and kept < cap:
          out = pending[: min(CHUNK_ROWS, cap - kept)]
          pending, kept = pending[len(out) :], kept + len(out)
          yield out[:, :-1], out[:, 1:], np.full(len(out), i, np.int32)
        if kept >= cap:
          return
      if texts:
        pending = np.concatenate([pending, _stream_pairs(texts, tok, seq_len, carry)])
      while len(pending) and kept < cap:
        out = pending[: min(CHUNK_ROWS, cap - kept)]
        pending, kept = pending[len(out) :], kept + len(out)
        yield out[:, :-1], out[:, 1:], np.full(len(out), i, np.int32)

    return SplitSource(name, DOMAINS, rows, None)

  info = {
    "task": "language_model",
    "metrics": ["log_perplexity"],
    "group_metrics": ["per_group", "worst", "average"],
    "tokenizer": os.path.abspath(tokenizer_file),
    "seq_len": seq_len,
    "vocab_size": int(tok.get_vocab_size()),
    "eos_id": int(tok.token_to_id(EOS)),
    "domains": list(DOMAINS),
    "skipped_subsets": list(REMOVED),
    "train_shards": shards,
    "protocol": [
      "the uncopyrighted Pile: 17 of the Pile's 22 subsets (Books3, BookCorpus2, OpenSubtitles,"
      " YoutubeSubtitles, OpenWebText2 removed by the release); lines of those five are skipped"
      " (not counted); an unknown pile_set_name is an error",
      "clients: one per pile_set_name, the 17 in sorted order, the same in every split;"
      " group = the client's index",
      "splits: train (train/NN.jsonl.zst in name order), val.jsonl.zst, test.jsonl.zst",
      "tokens: each document encoded (no special tokens) and followed by <|endoftext|>, the"
      f" domain's stream cut into seq_len+1 = {seq_len + 1} tokens (x the first seq_len, y the"
      " last seq_len), the incomplete last sequence dropped",
      f"seq_len {seq_len} (default 1024, GPT-2's context; FGDRO states none)",
      f"cap: the first {max_sequences_per_domain} sequences per domain in train and"
      f" {max_eval_sequences_per_domain} in val and test (domain sizes differ by > 100x)",
      "cost: rows(i) streams the split once per domain"
      + ("" if max_lines is None else f"; each pass stops after {max_lines} lines"),
    ],
    "citation": CITATION,
  }
  return Source(
    dataset="pile",
    x_shape=(seq_len,),
    x_dtype="int32",
    y_shape=(seq_len,),
    y_dtype="int32",
    groups=DOMAINS,
    splits=(
      make_split("train", max_sequences_per_domain),
      make_split("val", max_eval_sequences_per_domain),
      make_split("test", max_eval_sequences_per_domain),
    ),
    info=info,
  )


# --- the stand-in ---------------------------------------------------------------------------

WORDS = tuple("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu , .".split())
STANDIN_DOCS = (("train/00", 10), ("train/01", 10), ("val", 8), ("test", 8))  # per domain


def write_standin(path, seed: int = 0) -> str:
  """A tiny uncopyrighted Pile in the release's layout (two train shards, val, test; every one of
  the 17 domains in each file, documents interleaved; one line of a removed subset, Books3, in
  the first shard and val; the last line of val without its newline) and a word-level
  ``tokenizer.json`` beside it; returns ``path``. Each domain has a little over 1,024 words per
  split, so the default ``seq_len`` gives at least one sequence; the last line of the second
  shard is in its own zstandard frame (a multi-frame file)."""
  zstandard = _zstandard()
  rng = np.random.default_rng(seed)
  path = os.fspath(path)
  os.makedirs(os.path.join(path, "train"), exist_ok=True)
  for name, per_domain in STANDIN_DOCS:
    records = []
    for domain in DOMAINS:
      for _ in range(per_domain):
        n = int(rng.integers(60 if name.startswith("train") else 120, 200))
        words = [WORDS[int(k)] for k in rng.integers(0, len(WORDS), n)]
        if rng.random() < 0.2:
          words[int(rng.integers(0, n))] = "omega"  # not in the vocabulary
        text = " ".join(words) + ("\n\nnew paragraph" if rng.random() < 0.3 else "")
        records.append({"text": text, "meta": {"pile_set_name": domain}})
    records = [records[int(k)] for k in rng.permutation(len(records))]
    if name in ("train/00", "val"):
      books = {"text": "a removed book", "meta": {"pile_set_name": "Books3"}}
      records.insert(int(rng.integers(0, len(records))), books)
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    body = "\n".join(lines) + ("" if name == "val" else "\n")
    compress = zstandard.ZstdCompressor(level=3).compress
    if name == "train/01":
      data = compress("\n".join(lines[:-1]).encode() + b"\n") + compress(lines[-1].encode() + b"\n")
    else:
      data = compress(body.encode())
    with open(os.path.join(path, name + ".jsonl.zst"), "wb") as f:
      f.write(data)
  words = list(WORDS) + ["new", "paragraph"]
  write_word_tokenizer(os.path.join(path, "tokenizer.json"), words, classifier=False)
  return path
