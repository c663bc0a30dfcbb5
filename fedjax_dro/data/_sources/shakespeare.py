"""LEAF Shakespeare: next-character prediction, one client per speaking role.

Layout read (LEAF's ``data/shakespeare/`` after ``preprocess.sh``)::

  data/
    train/*.json     # e.g. all_data_niid_0_keep_0_train_8.json (``-t sample``: every user's
    test/*.json      #   samples split between train and test)
    all_data/*.json  # read only when train/ and test/ are absent: then one split, "train"

``path`` is ``data/`` itself or the folder that contains it (``data/shakespeare/``). Each JSON file
(LEAF's ``split_data.py``): ``{"users": [...], "hierarchies": [...] (optional), "num_samples":
[...], "user_data": {user: {"x": [80-character strings], "y": [the next character]}}}``.

Rows: ``x`` ``[80]`` int32, the 80 characters as indices into LEAF's ``ALL_LETTERS``
(``models/utils/language_utils.py``, 80 characters); ``y`` int32, the next character's index.
A character outside ``ALL_LETTERS`` (where LEAF's ``str.find`` gives -1) becomes id 80, so
``num_classes`` is 81. ``group`` is 0 (``groups == ("all",)``).

Clients: the users (speaking roles, e.g. ``THE_TRAGEDY_OF_KING_LEAR_KENT``) in the order the
files (by name) and their ``users`` lists give; a user in several files of a split has its rows
joined in that order; a user with no rows in a split is not a client of it. ``min_samples``
(default 0: LEAF's own ``-k`` has already filtered) drops users with fewer rows than that over
all splits together (as ``-k`` counts them before the train/test split), from every split.

Every file is parsed and converted when :func:`source` runs (characters held as uint8; the full
LEAF Shakespeare, 4.2M samples, takes about 340 MB), so a malformed file fails before any row.
Sizes (LEAF): 1,129 users, 4,226,158 samples (before LEAF's sampling and ``-k``).
"""

from __future__ import annotations

import json
import os
from typing import Dict, List

import numpy as np

from fedjax_dro.data._sources._textio import chunked
from fedjax_dro.data._sources.base import Source, SourceError, SplitSource

ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
OTHER_ID = len(ALL_LETTERS)  # 80: any character outside ALL_LETTERS
SEQ_LEN = 80

CITATION = (
  "Caldas et al. LEAF: A benchmark for federated settings. arXiv:1812.01097, 2018; McMahan et al."
  " Communication-efficient learning of deep networks from decentralized data. AISTATS 2017."
)


def _table() -> np.ndarray:
  table = np.full(129, OTHER_ID, np.uint8)  # code points >= 128 share the last entry
  for i, c in enumerate(ALL_LETTERS):
    table[ord(c)] = i
  return table


def _ids(text: str, table: np.ndarray) -> np.ndarray:
  codes = np.frombuffer(text.encode("utf-32-le"), "<u4")
  return table[np.minimum(codes, 128)]


def _read(file: str, table: np.ndarray) -> Dict[str, tuple]:
  """``{user: (x uint8 [n, 80], y uint8 [n])}`` of one LEAF JSON file, in its ``users`` order."""
  try:
    with open(file, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, UnicodeDecodeError) as e:
    raise SourceError(f"{file}: cannot be read ({e})") from None
  except ValueError as e:
    raise SourceError(f"{file}: not JSON ({e})") from None
  if not isinstance(data, dict) or not all(k in data for k in ("users", "user_data")):
    raise SourceError(f"{file}: not a LEAF file (an object with 'users' and 'user_data')")
  users, user_data = data["users"], data["user_data"]
  counts = data.get("num_samples")
  if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
    raise SourceError(f"{file}: 'users' is not a list of strings")
  if not isinstance(user_data, dict):
    raise SourceError(f"{file}: 'user_data' is not an object")
  if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
    raise SourceError(f"{file}: 'num_samples' is not a list as long as 'users'")
  out = {}
  for k, user in enumerate(users):
    entry = user_data.get(user)
    if not isinstance(entry, dict) or not isinstance(entry.get("x"), list):
      raise SourceError(f"{file}: user {user!r} has no 'x' list in 'user_data'")
    xs, ys = entry["x"], entry.get("y")
    if not isinstance(ys, list) or len(ys) != len(xs):
      raise SourceError(f"{file}: user {user!r} has {len(xs)} 'x' but 'y' is not as long")
    if counts is not None and counts[k] != len(xs):
      raise SourceError(f"{file}: user {user!r} has num_samples {counts[k]} but {len(xs)} rows")
    for j, x in enumerate(xs):
      if not isinstance(x, str) or len(x) != SEQ_LEN:
        raise SourceError(f"{file}: user {user!r} x[{j}] is not a string of {SEQ_LEN} characters")
    for j, y in enumerate(ys):
      if not isinstance(y, str) or len(y) != 1:
        raise SourceError(f"{file}: user {user!r} y[{j}] is not one character")
    x = _ids("".join(xs), table).reshape(len(xs), SEQ_LEN)
    out[user] = (x, _ids("".join(ys), table))
  return out


def _split(folder: str, table: np.ndarray) -> Dict[str, tuple]:
  files = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
  if not files:
    raise SourceError(f"{folder}: no .json file in it")
  users: Dict[str, List[tuple]] = {}
  for name in files:
    for user, arrays in _read(os.path.join(folder, name), table).items():
      users.setdefault(user, []).append(arrays)
  return {
    u: (np.concatenate([a[0] for a in parts]), np.concatenate([a[1] for a in parts]))
    for u, parts in users.items()
  }


def _data_dir(path: str) -> str:
  if not os.path.isdir(path):
    raise SourceError(f"{path}: not a directory")
  for candidate in (path, os.path.join(path, "data")):
    if any(os.path.isdir(os.path.join(candidate, s)) for s in ("train", "all_data")):
      return candidate
  raise SourceError(f"{path}: no train/ and test/ (nor all_data/) in it nor in data/ inside it")


def source(path, min_samples: int = 0) -> Source:
  """LEAF Shakespeare under ``path`` (see the module docstring).

  Args:
    path: LEAF's ``data/`` folder or the folder that contains it.
    min_samples: drop users with fewer rows than this (train and test together).
  """
  if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 0:
    raise ValueError(f"min_samples must be a non-negative integer, got {min_samples!r}")
  path = os.fspath(path)
  root = _data_dir(path)
  table = _table()
  train, test = os.path.join(root, "train"), os.path.join(root, "test")
  if os.path.isdir(train) or os.path.isdir(test):
    for folder in (train, test):
      if not os.path.isdir(folder):
        raise SourceError(f"{folder}: folder not found (LEAF writes train/ and test/ together)")
    read = {"train": _split(train, table), "test": _split(test, table)}
    layout = "splits: LEAF's train/ and test/ (its -t sample / -t user split, as preprocessed)"
  else:
    read = {"train": _split(os.path.join(root, "all_data"), table)}
    layout = "splits: one, 'train', from all_data/ (no train/ and test/ in the directory)"
  total: Dict[str, int] = {}
  for users in read.values():
    for user, (x, _) in users.items():
      total[user] = total.get(user, 0) + len(x)
  dropped = sorted(u for u, n in total.items() if n < min_samples)

  def make_split(name: str, users: Dict[str, tuple]) -> SplitSource:
    kept = [u for u, (x, _) in users.items() if len(x) and total[u] >= min_samples]
    arrays = [users[u] for u in kept]

    def rows(i: int):
      x, y = arrays[i]
      for s in chunked(len(x)):
        yield (
          x[s].astype(np.int32),
          y[s].astype(np.int32),
          np.zeros(s.stop - s.start, np.int32),
        )

    return SplitSource(name, tuple(kept), rows, tuple(len(a[0]) for a in arrays))

  info = {
    "task": "classification",
    "num_classes": OTHER_ID + 1,
    "label_names": list(ALL_LETTERS) + ["<other>"],
    "metrics": ["accuracy"],
    "vocabulary": ALL_LETTERS,
    "min_samples": min_samples,
    "dropped_users": len(dropped),
    "protocol": [
      "next-character prediction: x the 80 characters of LEAF's x, y its next character",
      "ids: the index in LEAF's ALL_LETTERS (80 characters); any other character id 80"
      " (LEAF's str.find gives -1 there), so 81 classes",
      layout,
      "clients: LEAF's users (speaking roles), in file-name then 'users' order; a user with no"
      " rows in a split is not a client of it",
      f"min_samples {min_samples}: users with fewer rows over all splits dropped"
      f" ({len(dropped)} dropped; default 0, LEAF's -k has filtered already)",
      "groups: ('all',), Shakespeare has no evaluation groups",
    ],
    "citation": CITATION,
  }
  return Source(
    dataset="shakespeare",
    x_shape=(SEQ_LEN,),
    x_dtype="int32",
    y_shape=(),
    y_dtype="int32",
    groups=("all",),
    splits=tuple(make_split(name, users) for name, users in read.items()),
    info=info,
  )


# --- the stand-in ---------------------------------------------------------------------------

STANDIN_USERS = (
  ("THE_TRAGEDY_OF_KING_LEAR_KENT", 9),
  ("THE_TEMPEST_ARIEL", 6),
  ("AS_YOU_LIKE_IT_ROSALIND", 4),
)


def write_standin(path, seed: int = 0) -> str:
  """A tiny LEAF Shakespeare (``data/train/`` and ``data/test/``, one JSON file each as LEAF's
  ``-t sample --tf 0.8`` writes them, 3 users with 'hierarchies', lines sliding by one character
  over each role's text, one character outside ALL_LETTERS); returns ``path``. No tokenizer:
  Shakespeare's ids are LEAF's characters."""
  rng = np.random.default_rng(seed)
  path = os.fspath(path)
  letters = ALL_LETTERS[1:]  # no newline in the generated text, a few below
  splits = {"train": {}, "test": {}}
  for u, (user, n) in enumerate(STANDIN_USERS):
    chars = [letters[int(k)] for k in rng.integers(0, len(letters), SEQ_LEN + n)]
    chars[int(rng.integers(0, len(chars)))] = "\n"
    if u == 0:
      chars[3] = "é"  # outside ALL_LETTERS
    text = "".join(chars)
    xs = [text[j : j + SEQ_LEN] for j in range(n)]
    ys = [text[j + SEQ_LEN] for j in range(n)]
    train = sorted(int(k) for k in rng.permutation(n)[: max(1, int(0.8 * n))])
    for name, idx in (("train", train), ("test", [j for j in range(n) if j not in train])):
      splits[name][user] = {"x": [xs[j] for j in idx], "y": [ys[j] for j in idx]}
  for name, user_data in splits.items():
    folder = os.path.join(path, "data", name)
    os.makedirs(folder, exist_ok=True)
    users = list(user_data)
    content = {
      "users": users,
      "hierarchies": [u.rsplit("_", 1)[0] for u in users],
      "num_samples": [len(user_data[u]["x"]) for u in users],
      "user_data": user_data,
    }
    with open(os.path.join(folder, f"all_data_niid_0_keep_0_{name}_8.json"), "w") as f:
      json.dump(content, f)
  return path
