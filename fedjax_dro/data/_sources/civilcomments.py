"""CivilComments (WILDS v1.0): toxicity classification, federated by FGDRO's four groups.

Layout read (the WILDS release, unpacked)::

  civilcomments_v1.0/
    all_data_with_identities.csv   # pandas-written: an unnamed index column first, then id,
                                   # comment_text (quoted, may hold newlines), split, toxicity,
                                   # the identity and auxiliary columns (fractions in [0, 1],
                                   # empty where the comment was not rated for identities)
    RELEASE_v1.0.txt               # not read

``path`` is ``civilcomments_v1.0/`` itself or the folder that contains it.

Rows (as WILDS' ``CivilCommentsDataset``, ``wilds/datasets/civilcomments_dataset.py``):

* label: ``toxicity >= 0.5``;
* the 8 identities of WILDS' evaluation, ``male, female, LGBTQ, christian, muslim,
  other_religions, black, white``, each ``>= 0.5`` (an empty value, NaN to pandas, compares
  False: 0);
* ``split``: ``train`` / ``val`` / ``test`` (WILDS' official scheme); any other string is an
  error.

Arrays: ``x`` ``[max_len]`` int32, the comment's token ids with the tokenizer's own special tokens
(DistilBERT's ``[CLS] ... [SEP]``), truncated to ``max_len`` (default 300, WILDS'
``max_token_length`` for civilcomments) and padded with the tokenizer's ``[PAD]`` id. ``y`` the
label (int32). ``group`` = ``label + 2 * sum_k 2^k identity_k`` over the 8 identity bits in the
order above (:func:`group_id`; ``groups`` names the 512 combinations, e.g.
``"toxic=1,black,white"``): a comment may belong to several of WILDS' 16 evaluation groups
(identity = 1) x (label 0, 1), and worst-group accuracy over them is computed from these ids
(:func:`eval_membership`).

Clients: FGDRO's federation, ``black`` x label: ``black=0,toxic=0``, ``black=0,toxic=1``,
``black=1,toxic=0``, ``black=1,toxic=1`` (WILDS' training ``groupby_fields: ['black', 'y']``).
Every split has these four clients (val and test hold each group's held-out rows). Rows keep
the file's order within a client.

Sizes (WILDS v1.0): 448,000 comments; train 269,038, val 45,180, test 133,782.
"""

from __future__ import annotations

import os

import numpy as np

from fedjax_dro.data._sources._textio import (
  chunked,
  find_root,
  positive_int,
  resolve_tokenizer,
  write_word_tokenizer,
)
from fedjax_dro.data._sources.base import Source, SourceError, SplitSource, read_csv

FOLDER = "civilcomments_v1.0"
CSV = "all_data_with_identities.csv"
IDENTITIES = (
  "male",
  "female",
  "LGBTQ",
  "christian",
  "muslim",
  "other_religions",
  "black",
  "white",
)
SPLITS = ("train", "val", "test")
CLIENTS = ("black=0,toxic=0", "black=0,toxic=1", "black=1,toxic=0", "black=1,toxic=1")
DEFAULT_MAX_LEN = 300


def group_id(label, bits) -> np.ndarray:
  """``[k]`` int32 group ids: ``label + 2 * sum_j 2^j bits[:, j]`` (bits ``[k, 8]`` in the order
  of :data:`IDENTITIES`)."""
  weights = 2 ** np.arange(len(IDENTITIES), dtype=np.int64)
  return (np.asarray(label, np.int64) + 2 * (np.asarray(bits, np.int64) @ weights)).astype(np.int32)


GROUPS = tuple(
  f"toxic={g % 2}" + "".join(f",{name}" for k, name in enumerate(IDENTITIES) if (g >> 1) >> k & 1)
  for g in range(2 ** (len(IDENTITIES) + 1))
)


def eval_membership() -> np.ndarray:
  """``[512, 16]`` bool: group id ``g`` belongs to WILDS' evaluation group ``2 k + t`` (identity
  ``k`` = 1 and label ``t``), in the order of ``info["eval_groups"]``."""
  g = np.arange(len(GROUPS))
  label, bits = g % 2, g >> 1
  cols = [((bits >> k) & 1 == 1) & (label == t) for k in range(len(IDENTITIES)) for t in (0, 1)]
  return np.stack(cols, axis=1)


CITATION = (
  "Borkan, Dixon, Sorensen, Thain, Vasserman. Nuanced metrics for measuring unintended bias "
  "with real data for text classification. WWW Companion 2019; Koh et al. WILDS: A benchmark of "
  "in-the-wild distribution shifts. ICML 2021."
)


def _fractions(file: str, column: str, values: list, empty_is_zero: bool) -> np.ndarray:
  out = np.zeros(len(values), np.float64)
  for i, value in enumerate(values):
    value = value.strip()
    if not value:
      if empty_is_zero:
        continue
      raise SourceError(f"{file}: row {i + 1} has an empty {column!r}")
    try:
      out[i] = float(value)
    except ValueError:
      raise SourceError(f"{file}: row {i + 1} has {column}={value!r}, not a number") from None
  return out


def source(path, tokenizer=None, max_len: int = DEFAULT_MAX_LEN) -> Source:
  """CivilComments under ``path`` (see the module docstring).

  Args:
    path: ``civilcomments_v1.0/`` or the folder that contains it.
    tokenizer: the classifier's ``tokenizer.json`` (DistilBERT's); default: a ``tokenizer.json``
      in ``path`` or in ``civilcomments_v1.0/``.
    max_len: tokens per comment (truncated, then padded with ``[PAD]``).
  """
  positive_int("max_len", max_len)
  path = os.fspath(path)
  root = find_root(path, CSV)
  file = os.path.join(root, CSV)
  columns = read_csv(file, ("comment_text", "toxicity", "split") + IDENTITIES)
  texts = columns["comment_text"]
  label = _fractions(file, "toxicity", columns["toxicity"], empty_is_zero=False) >= 0.5
  bits = np.zeros((len(texts), len(IDENTITIES)), np.int32)
  for k, name in enumerate(IDENTITIES):
    bits[:, k] = _fractions(file, name, columns[name], empty_is_zero=True) >= 0.5
  y = label.astype(np.int32)
  group = group_id(y, bits)
  split_of = columns["split"]
  unknown = [i for i, s in enumerate(split_of) if s not in SPLITS]
  if unknown:
    i = unknown[0]
    raise SourceError(
      f"{file}: row {i + 1} has split={split_of[i]!r}, expected one of {list(SPLITS)}"
    )
  tok, tokenizer_file = resolve_tokenizer([path, root], tokenizer, need=("[PAD]",))
  pad_id = int(tok.token_to_id("[PAD]"))
  from fedjax_dro.data.text import encode_batch

  client_of = 2 * bits[:, IDENTITIES.index("black")] + y  # black x label
  split_arr = np.asarray(split_of)
  del columns

  def make_split(name: str) -> SplitSource:
    members = [np.flatnonzero((split_arr == name) & (client_of == c)) for c in range(len(CLIENTS))]

    def rows(i: int):
      idx = members[i]
      for s in chunked(len(idx)):
        part = idx[s]
        x = encode_batch([texts[j] for j in part], tok, max_len, pad_id=pad_id)
        yield x, y[part], group[part]

    return SplitSource(name, CLIENTS, rows, tuple(len(m) for m in members))

  info = {
    "task": "classification",
    "num_classes": 2,
    "label_names": ["non_toxic", "toxic"],
    "identity_columns": list(IDENTITIES),
    "group_encoding": "label + 2 * sum_k 2^k [identity_columns[k] >= 0.5]",
    "eval_groups": [f"{name}=1,toxic={t}" for name in IDENTITIES for t in (0, 1)],
    "metrics": ["accuracy", "worst_group_accuracy"],
    "tokenizer": os.path.abspath(tokenizer_file),
    "max_len": max_len,
    "protocol": [
      "label: toxicity >= 0.5 (WILDS)",
      "identities male, female, LGBTQ, christian, muslim, other_religions, black, white: value"
      " >= 0.5, an empty value (NaN) counted 0 (WILDS' comparison with NaN is False)",
      "y = the label; group = label + 2 * (the 8 identity bits as a number): WILDS' worst-group"
      " accuracy over (identity = 1) x label, 16 overlapping groups, is computed from it",
      "splits: WILDS' official train / val / test from the split column",
      "clients: FGDRO's four groups black x label (WILDS' groupby_fields ['black', 'y']), the"
      " same four in every split; file order within a client",
      f"x: the tokenizer's [CLS] ... [SEP] encoding truncated to max_len={max_len} tokens (WILDS'"
      " max_token_length 300) and padded with [PAD]",
    ],
    "citation": CITATION,
  }
  return Source(
    dataset="civilcomments",
    x_shape=(max_len,),
    x_dtype="int32",
    y_shape=(),
    y_dtype="int32",
    groups=GROUPS,
    splits=tuple(make_split(name) for name in SPLITS),
    info=info,
  )


# --- the stand-in ---------------------------------------------------------------------------

WORDS = (
  "the this comment is not very good bad people you they article , . ! ? agree wrong right"
).split()
# Columns of the real header, a subset, in its order (the unnamed pandas index first).
HEADER = (
  ["", "id", "comment_text", "split", "created_date", "toxicity", "severe_toxicity", "obscene"]
  + ["male", "female", "christian", "muslim", "black", "white", "identity_annotator_count"]
  + ["LGBTQ", "other_religions", "identity_any"]
)


def _text(rng) -> str:
  words = [WORDS[int(k)] for k in rng.integers(0, len(WORDS), int(rng.integers(3, 12)))]
  if rng.random() < 0.3:
    words.insert(int(rng.integers(0, len(words))), "zebra")  # not in the vocabulary: [UNK]
  text = " ".join(words)
  if rng.random() < 0.3:
    text = text + '\nsaid "they"'  # a quoted field holding a newline and quotes
  return text


def write_standin(path, seed: int = 0) -> str:
  """A tiny CivilComments in the WILDS layout (``civilcomments_v1.0/`` with the CSV, its
  fractional and empty identity values, quoted multi-line comments) and a word-level
  ``tokenizer.json`` beside it; returns ``path``."""
  import csv

  rng = np.random.default_rng(seed)
  path = os.fspath(path)
  folder = os.path.join(path, FOLDER)
  os.makedirs(folder, exist_ok=True)
  rows = []
  for split in SPLITS:
    for black in (0, 1):
      for toxic in (0, 1):
        for _ in range(3 if split == "train" else 2):
          rows.append((split, black, toxic))
  order = rng.permutation(len(rows))
  fractions = ["", "0.0", "0.3", "0.5", "0.7", "1.0"]
  lines = []
  for n, k in enumerate(order):
    split, black, toxic = rows[int(k)]
    tox = ["0.0", "0.1", "0.3"] if not toxic else ["0.5", "0.7", "0.9"]
    blk = ["", "0.0", "0.3"] if not black else ["0.5", "0.7", "1.0"]
    pick = lambda options: options[int(rng.integers(0, len(options)))]  # noqa: E731
    record = {
      "": str(n),
      "id": str(239000 + 7 * n),
      "comment_text": _text(rng),
      "split": split,
      "created_date": "2017-03-06 15:21:53.675241+00",
      "toxicity": pick(tox),
      "severe_toxicity": "0.0",
      "obscene": pick(["0.0", "0.2"]),
      "black": pick(blk),
      "identity_annotator_count": "4",
    }
    for name in ("male", "female", "christian", "muslim", "white", "LGBTQ", "other_religions"):
      record[name] = pick(fractions)
    record["identity_any"] = pick(fractions)
    lines.append([record[h] for h in HEADER])
  with open(os.path.join(folder, CSV), "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(HEADER)
    writer.writerows(lines)
  with open(os.path.join(folder, "RELEASE_v1.0.txt"), "w") as f:
    f.write("civilcomments v1.0 (stand-in)\n")
  write_word_tokenizer(os.path.join(path, "tokenizer.json"), WORDS + ["said", '"'], classifier=True)
  return path
