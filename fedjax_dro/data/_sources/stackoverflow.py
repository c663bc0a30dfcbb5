"""StackOverflow next-word prediction, read from TensorFlow Federated's HDF5 files.

Layout (``tff.simulation.datasets.stackoverflow.load_data`` before TFF moved to SQLite in 2021,
archive ``stackoverflow.tar.bz2``; the vocabulary file from ``stackoverflow.word_count.tar.bz2``)::

  <dir>/stackoverflow_train.h5      examples/<client_id>/{creation_date, score, tags, title,
  <dir>/stackoverflow_held_out.h5                         tokens, type}
  <dir>/stackoverflow_test.h5
  <dir>/stackoverflow.word_count    (optional) "word count" a line, most frequent first

Each feature is ``[k]``: ``tokens`` the sentence (lower-cased, punctuation split off, words joined
by single spaces) as bytes, ``score`` int64, the others bytes. Only ``tokens`` is read (and
checked); the other features are metadata this task does not use. The word counts are, per TFF,
the number of train users with at least one sentence holding the word.

Clients: the Stack Overflow users (TFF's 8-digit ids), in TFF's order (sorted strings). Splits,
TFF's own: ``train`` (posts before 2018-01-01 of the users not held out; 342,477 users,
135,818,730 sentences), ``held_out`` (every post of the users with ``user_id % 10 == 0``;
38,758 users, 16,491,230 sentences), ``test`` (posts from 2018-01-01 on of the users not held out;
204,088 users, 16,586,035 sentences). Train and test share users (a temporal split); held-out users
appear nowhere else.

Rows: one sentence each, tokenized as FedJAX's ``StackoverflowTokenizer`` does
(``fedjax/datasets/stackoverflow.py``): ids ``0`` PAD, ``1`` BOS, ``2`` EOS, ``3 .. V+2`` the
vocabulary's words in its order, ``V+3`` the single out-of-vocabulary id; the sentence's words
(split on single spaces) become ``[BOS, w_1 .. w_n, EOS]``; ``x`` is that without its last id and
``y`` without its first, each cut to ``seq_len`` and padded with PAD (so a sentence of
``seq_len`` words or more has no EOS target). ``x`` and ``y`` int32 ``[seq_len]``, ``group`` 0 of
``("all",)``. Classes: ``V + 4``.

Options: ``vocab_size`` (10,000, the standard vocabulary), ``vocab_file`` (a word-count file;
default: ``stackoverflow.word_count`` next to the HDF5 files when present, else the vocabulary is
counted from the train file, TFF's way: users per word, ties by word; the info's ``protocol``
records which), ``seq_len`` (20, FedJAX's and TFF's training length), ``max_sentences_per_client``
(64: each user's first 64 sentences in file order, in every split; ``None`` keeps all).
"""

from __future__ import annotations

import os
from collections import Counter
from types import MappingProxyType
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from fedjax_dro.data._sources import hdf5_clients as h5c
from fedjax_dro.data._sources.base import Chunk, Source, SourceError, SplitSource

NAME = "stackoverflow"
FILES = MappingProxyType(
  {
    "train": "stackoverflow_train.h5",
    "held_out": "stackoverflow_held_out.h5",
    "test": "stackoverflow_test.h5",
  }
)
WORD_COUNT_FILE = "stackoverflow.word_count"
CHUNK = 256
PAD, BOS, EOS = 0, 1, 2
NUM_SPECIAL = 3  # ids before the vocabulary's words

SPECS = MappingProxyType({"tokens": (((),), h5c.is_string, "strings (bytes)")})

CITATION = (
  "@misc{stackoverflow2019, title={TensorFlow Federated Stack Overflow dataset}, "
  "author={The TensorFlow Federated Authors}, year={2019}}; @inproceedings{reddi2021adaptive, "
  "title={Adaptive Federated Optimization}, author={Reddi, Sashank J. and Charles, Zachary and "
  "Zaheer, Manzil and Garrett, Zachary and Rush, Keith and Kone{\\v{c}}n{\\'y}, Jakub and Kumar, "
  "Sanjiv and McMahan, H. Brendan}, booktitle={ICLR}, year={2021}}"
)


def read_word_counts(path: str, vocab_size: int) -> List[str]:
  """The first ``vocab_size`` words of a word-count file (``word count`` a line, most frequent
  first, as TFF's ``load_word_counts`` reads it)."""
  if not os.path.isfile(path):
    raise SourceError(f"{path}: file not found (expected a word-count file, 'word count' a line)")
  words: List[str] = []
  seen = set()
  try:
    with open(path, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        if len(words) >= vocab_size:
          break
        fields = line.split()
        if not fields:
          continue
        if len(fields) != 2 or not fields[1].isdigit():
          raise SourceError(f"{path}: line {n} is {line.strip()!r}, expected 'word count'")
        if fields[0] in seen:
          raise SourceError(f"{path}: line {n} repeats the word {fields[0]!r}")
        seen.add(fields[0])
        words.append(fields[0])
  except (OSError, UnicodeDecodeError) as e:
    raise SourceError(f"{path}: cannot be read as UTF-8 text ({e})") from None
  if not words:
    raise SourceError(f"{path}: holds no words")
  return words


def _decode(path: str, cid: str, value) -> str:
  if isinstance(value, str):
    return value
  try:
    return bytes(value).decode("utf-8")
  except UnicodeDecodeError as e:
    raise SourceError(f"{path}: client {cid!r}: 'tokens' is not UTF-8 ({e})") from None


def _sentences(path: str, cid: str, limit: Optional[int]) -> List[str]:
  tokens = h5c.read_client(path, cid, ("tokens",))["tokens"]
  tokens = tokens if limit is None else tokens[:limit]
  return [_decode(path, cid, t) for t in tokens]


def count_vocab(path: str, ids: Sequence[str], vocab_size: int) -> List[str]:
  """The ``vocab_size`` words of the train file used by the most users (TFF's word-count rule:
  users with at least one sentence holding the word), ties broken by the word."""
  users: Counter = Counter()
  for cid in ids:
    words = set()
    for sentence in _sentences(path, cid, None):
      words.update(sentence.split(" "))
    users.update(words)
  ranked = sorted(users.items(), key=lambda item: (-item[1], item[0]))
  return [w for w, _ in ranked[:vocab_size]]


def tokenize(
  sentences: Sequence[str], word_ids: Dict[str, int], seq_len: int
) -> Tuple[np.ndarray, np.ndarray]:
  """FedJAX's tokenization of ``sentences`` (see the module docstring): ``(x, y)`` int32
  ``[n, seq_len]``; ``word_ids`` maps a word to its id (``3 ..``), any other word gets the OOV id
  ``len(word_ids) + 3``."""
  oov = len(word_ids) + NUM_SPECIAL
  x = np.full((len(sentences), seq_len), PAD, np.int32)
  y = np.full((len(sentences), seq_len), PAD, np.int32)
  for r, sentence in enumerate(sentences):
    ids = [BOS] + [word_ids.get(w, oov) for w in sentence.split(" ")] + [EOS]
    xs, ys = ids[:-1][:seq_len], ids[1:][:seq_len]
    x[r, : len(xs)] = xs
    y[r, : len(ys)] = ys
  return x, y


def _split(name, path, ids, lengths, word_ids, seq_len, cap) -> SplitSource:
  num_rows = tuple(k if cap is None else min(k, cap) for k in lengths)

  def rows(i: int) -> Iterator[Chunk]:
    sentences = _sentences(path, ids[i], cap)
    if len(sentences) != num_rows[i]:
      raise SourceError(f"{path}: client {ids[i]!r} changed length since it was checked")
    for s in range(0, len(sentences), CHUNK):
      x, y = tokenize(sentences[s : s + CHUNK], word_ids, seq_len)
      yield x, y, np.zeros(len(x), np.int32)

  return SplitSource(name, ids, rows, num_rows)


def _directory(path: str) -> str:
  if os.path.isfile(path) and os.path.basename(path) in FILES.values():
    return os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(path):
    raise SourceError(f"{path}: not a directory (expected the one holding {FILES['train']})")
  return path


def source(
  path: str,
  vocab_file: Optional[str] = None,
  vocab_size: int = 10000,
  seq_len: int = 20,
  max_sentences_per_client: Optional[int] = 64,
) -> Source:
  """StackOverflow next-word prediction from the directory holding TFF's three
  ``stackoverflow_*.h5`` files (or one of those files: its directory is read), validated before
  it returns; see the module docstring for the layout and the options."""
  path = _directory(path)
  if int(vocab_size) < 1 or int(seq_len) < 1:
    raise ValueError(f"vocab_size and seq_len must be positive, got {vocab_size}, {seq_len}")
  cap = max_sentences_per_client
  if cap is not None and int(cap) < 1:
    raise ValueError(f"max_sentences_per_client must be positive or None, got {cap}")
  checked = {}
  for name, filename in FILES.items():
    full = h5c.find_file(path, filename)
    with h5c.open_file(full) as f:
      ids = h5c.client_ids(f, full)
      checked[name] = (full, ids, h5c.check_clients(f, full, ids, SPECS))

  default_counts = os.path.join(path, WORD_COUNT_FILE)
  if vocab_file is not None:
    vocab = read_word_counts(vocab_file, int(vocab_size))
    vocab_how = f"the option vocab_file ({os.path.basename(vocab_file)})"
  elif os.path.isfile(default_counts):
    vocab = read_word_counts(default_counts, int(vocab_size))
    vocab_how = f"TFF's {WORD_COUNT_FILE} found next to the HDF5 files"
  else:
    train_path, train_ids, _ = checked["train"]
    vocab = count_vocab(train_path, train_ids, int(vocab_size))
    vocab_how = (
      f"counted from {FILES['train']} (no {WORD_COUNT_FILE} given or found): users per word, "
      "TFF's rule, ties broken by the word"
    )
  word_ids = {w: j + NUM_SPECIAL for j, w in enumerate(vocab)}
  num_classes = len(vocab) + NUM_SPECIAL + 1
  splits = tuple(
    _split(name, full, ids, lengths, word_ids, int(seq_len), None if cap is None else int(cap))
    for name, (full, ids, lengths) in checked.items()
  )
  protocol = [
    "clients: the Stack Overflow users (TFF's client ids) in TFF's order (sorted strings)",
    "splits: TFF's train / held_out / test files as they are (test is a temporal split of the "
    "train users; held-out users appear in no other split)",
    f"vocabulary: the {len(vocab)} most frequent words (vocab_size={vocab_size}) from {vocab_how}",
    "ids as FedJAX's StackoverflowTokenizer: 0 PAD, 1 BOS, 2 EOS, 3..V+2 the words, V+3 one "
    "out-of-vocabulary id (FedJAX's default num_oov_buckets=1; TFF's own baseline orders them "
    "PAD, words, OOV, BOS, EOS instead)",
    f"x = [BOS, words] and y = [words, EOS], cut to seq_len={seq_len} and padded with PAD (0); "
    "PAD targets are to be masked out of the loss and accuracy",
    "metrics as FedJAX's StackOverflow model: token accuracy without PAD and EOS targets "
    "(accuracy_no_eos; accuracy_in_vocab also keeps PAD, BOS and OOV from being predicted) and "
    "the token cross-entropy without PAD targets (token_loss)",
    f"max_sentences_per_client={cap}: each user's first sentences in file order (TFF's "
    "take(n)), in every split, so no user's weight is unbounded (64 follows pfl-research's "
    "StackOverflow setup as reported to us, not re-checked against its code); None keeps all",
    "groups: the single group 'all' (the users are the DRO domains; FedJAX's question / answer "
    "domain_id is not used)",
  ]
  return Source(
    dataset=NAME,
    x_shape=(int(seq_len),),
    x_dtype="int32",
    y_shape=(int(seq_len),),
    y_dtype="int32",
    groups=("all",),
    splits=splits,
    info={
      "task": "language_model",
      "num_classes": num_classes,
      "metrics": ["accuracy_in_vocab", "accuracy_no_eos", "token_loss"],
      "label_names": ["<pad>", "<bos>", "<eos>", *vocab, "<oov>"],
      "protocol": protocol,
      "citation": CITATION,
      "special_ids": {"pad": PAD, "bos": BOS, "eos": EOS, "oov": num_classes - 1},
    },
  )


_WORDS = tuple(
  "the i to a is it and of you in that this for with on be can but have if not are my ? . , "
  "code use function file error using java python php android value string array class".split()
)


def write_standin(path: str, seed: int = 0) -> str:
  """A tiny StackOverflow in TFF's exact HDF5 layout (``examples/<8-digit id>/{creation_date,
  score, tags, title, tokens, type}``, strings as variable-length bytes, ``score`` int64) plus a
  ``stackoverflow.word_count`` counted from its train file (users per word, most first, ties by
  word): 4 train users, 2 held-out users, 3 test users (two of them train users), 1 to 6
  sentences each of 1 to 30 words, held-out and test sentences holding words absent from train;
  deterministic in ``seed``; returns ``path``."""
  h5py = h5c.require_h5py()
  os.makedirs(path, exist_ok=True)
  rng = np.random.default_rng(seed)
  vlen = h5py.special_dtype(vlen=bytes)
  weights = 1.0 / np.arange(1, len(_WORDS) + 1)
  weights /= weights.sum()
  users = {
    "train": ["00000001", "00000003", "00000012", "00000007"],
    "held_out": ["00000010", "00000020"],
    "test": ["00000003", "00000007", "00000042"],
  }
  train_users: Counter = Counter()
  for split, ids in users.items():
    with h5py.File(os.path.join(path, FILES[split]), "w") as f:
      examples = f.create_group(h5c.EXAMPLES_GROUP)
      for cid in ids:
        k = int(rng.integers(1, 7))
        sentences = []
        for _ in range(k):
          n = int(rng.integers(1, 31))
          words = list(rng.choice(_WORDS, size=n, p=weights))
          if split != "train" and rng.random() < 0.5:
            words[int(rng.integers(0, n))] = f"unseen{int(rng.integers(0, 5))}"
          sentences.append(" ".join(words))
        if split == "train":
          train_users.update({w for s in sentences for w in s.split(" ")})
        kinds = rng.choice(["question", "answer"], size=k)
        dates = [f"201{c % 8}-0{1 + c % 9}-1{c % 10} 12:0{c % 10}:00.0 UTC" for c in range(k)]
        features = {
          "creation_date": dates,
          "tags": ["python|numpy" if q == "question" else "" for q in kinds],
          "title": [f"title {c}" for c in range(k)],
          "tokens": sentences,
          "type": [str(q) for q in kinds],
        }
        group = examples.create_group(cid)
        for feature, values in features.items():
          data = np.array([v.encode("utf-8") for v in values], dtype=object)
          group.create_dataset(feature, data=data, dtype=vlen)
        group.create_dataset("score", data=rng.integers(-2, 20, size=k).astype(np.int64))
  ranked = sorted(train_users.items(), key=lambda item: (-item[1], item[0]))
  with open(os.path.join(path, WORD_COUNT_FILE), "w", encoding="utf-8") as f:
    f.writelines(f"{w} {c}\n" for w, c in ranked)
  return path
