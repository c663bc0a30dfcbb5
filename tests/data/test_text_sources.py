"""The text readers (CivilComments, the uncopyrighted Pile, LEAF Shakespeare) against their
stand-ins: every split, client, token, label and group checked against values built here by hand
(the files parsed with csv / json / zstandard, the tokenizer called directly), and each hostile
file (a missing column, an unknown split, a line that is not JSON, a truncated .zst, a malformed
LEAF file) named in a one-line SourceError."""

import csv
import json
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("tokenizers")
zstandard = pytest.importorskip("zstandard")

from tokenizers import Tokenizer  # noqa: E402

from fedjax_dro.data._sources import civilcomments, pile, shakespeare  # noqa: E402
from fedjax_dro.data._sources.base import SourceError  # noqa: E402

IDENTITIES = ["male", "female", "LGBTQ", "christian", "muslim", "other_religions", "black", "white"]
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def _all_rows(split, i):
  chunks = list(split.rows(i))
  assert all(len(c[1]) <= 256 for c in chunks)
  if not chunks:
    return None
  return tuple(np.concatenate([c[k] for c in chunks]) for k in range(3))


# --- CivilComments ----------------------------------------------------------------------------


def _frac(v):
  return 0.0 if v == "" else float(v)


def test_civilcomments_matches_its_standin_exactly(tmp_path):
  root = civilcomments.write_standin(tmp_path / "cc", seed=3)
  max_len = 8
  src = civilcomments.source(root, max_len=max_len)
  tok = Tokenizer.from_file(os.path.join(root, "tokenizer.json"))
  pad, cls, sep = (tok.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]"))
  with open(os.path.join(root, "civilcomments_v1.0", "all_data_with_identities.csv")) as f:
    records = list(csv.DictReader(f))
  assert any(r["black"] == "" for r in records) and any(r["male"] == "0.5" for r in records)
  assert any("\n" in r["comment_text"] for r in records)
  names = ("black=0,toxic=0", "black=0,toxic=1", "black=1,toxic=0", "black=1,toxic=1")
  assert src.y_shape == () and src.x_shape == (max_len,) and len(src.groups) == 512
  assert src.groups[0] == "toxic=0" and src.groups[2 * 2**6 + 1] == "toxic=1,black"
  assert [s.name for s in src.splits] == ["train", "val", "test"]
  assert src.info["identity_columns"] == IDENTITIES
  json.dumps(src.info)
  for split in src.splits:
    assert split.clients == names
    for c, name in enumerate(names):
      black, toxic = int(name[6]), int(name[-1])
      want = [
        r
        for r in records
        if r["split"] == split.name
        and (_frac(r["black"]) >= 0.5) == black
        and (float(r["toxicity"]) >= 0.5) == toxic
      ]
      assert split.num_rows[c] == len(want) > 0
      x, y, g = _all_rows(split, c)
      for row, r in enumerate(want):
        ids = tok.encode(r["comment_text"], add_special_tokens=False).ids
        ids = [cls] + ids[: max_len - 2] + [sep]
        assert x[row].tolist() == ids + [pad] * (max_len - len(ids))
        bits = [int(_frac(r[k]) >= 0.5) for k in IDENTITIES]
        assert y[row] == toxic
        assert g[row] == toxic + 2 * sum(b << k for k, b in enumerate(bits))
        members = civilcomments.eval_membership()[g[row]]
        want_members = [bool(bits[k]) and toxic == t for k in range(8) for t in (0, 1)]
        assert members.tolist() == want_members
      assert x.dtype == np.int32 and y.dtype == np.int32
  # the folder itself works as well, and the default max_len is WILDS' 300
  inner = civilcomments.source(
    os.path.join(root, "civilcomments_v1.0"), tokenizer=os.path.join(root, "tokenizer.json")
  )
  assert inner.x_shape == (300,) and inner.splits[0].num_rows == src.splits[0].num_rows


def _rewrite_csv(root, change):
  file = os.path.join(root, "civilcomments_v1.0", "all_data_with_identities.csv")
  with open(file, newline="") as f:
    rows = list(csv.reader(f))
  rows = change(rows)
  with open(file, "w", newline="") as f:
    csv.writer(f).writerows(rows)


def test_civilcomments_hostile_files_are_named(tmp_path):
  root = civilcomments.write_standin(tmp_path / "a")

  def drop_black(rows):
    k = rows[0].index("black")
    return [r[:k] + r[k + 1 :] for r in rows]

  _rewrite_csv(root, drop_black)
  with pytest.raises(SourceError, match=r"identities\.csv: missing required column 'black' \("):
    civilcomments.source(root)
  root = civilcomments.write_standin(tmp_path / "b")
  _rewrite_csv(root, lambda rows: rows[:2] + [rows[2][:3] + ["validation"] + rows[2][4:]])
  with pytest.raises(SourceError, match=r"\.csv: row 2 has split='validation'"):
    civilcomments.source(root)
  root = civilcomments.write_standin(tmp_path / "c")
  os.remove(os.path.join(root, "tokenizer.json"))
  with pytest.raises(SourceError, match=r"tokenizer\.json: file not found; pass tokenizer="):
    civilcomments.source(root)


# --- the Pile ---------------------------------------------------------------------------------


def _pile_lines(file):
  with open(file, "rb") as f:
    data = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()
  return [json.loads(line) for line in data.decode().split("\n") if line]


def _expected_pile(root, tok, seq_len, cap=None, max_lines=None):
  eos = tok.token_to_id("<|endoftext|>")
  files = {
    "train": [
      os.path.join(root, "train", "00.jsonl.zst"),
      os.path.join(root, "train", "01.jsonl.zst"),
    ],
    "val": [os.path.join(root, "val.jsonl.zst")],
    "test": [os.path.join(root, "test.jsonl.zst")],
  }
  out = {}
  for split, names in files.items():
    records = [r for name in names for r in _pile_lines(name)][:max_lines]
    for domain in pile.DOMAINS:
      stream = []
      for r in records:
        if r["meta"]["pile_set_name"] == domain:
          stream += tok.encode(r["text"], add_special_tokens=False).ids + [eos]
      n = len(stream) // (seq_len + 1)
      seqs = [stream[k * (seq_len + 1) : (k + 1) * (seq_len + 1)] for k in range(n)][:cap]
      out[split, domain] = seqs
  return out


def test_pile_matches_its_standin_exactly(tmp_path, monkeypatch):
  root = pile.write_standin(tmp_path / "p", seed=1)
  tok = Tokenizer.from_file(os.path.join(root, "tokenizer.json"))
  names = [r["meta"]["pile_set_name"] for r in _pile_lines(os.path.join(root, "val.jsonl.zst"))]
  assert "Books3" in names and set(pile.DOMAINS) <= set(names)
  assert len(pile.DOMAINS) == 17 and list(pile.DOMAINS) == sorted(pile.DOMAINS)
  monkeypatch.setattr(pile, "DOCS_PER_BATCH", 3)  # documents join across encoding batches
  for seq_len, cap, max_lines in [(7, None, None), (2, 300, None), (5, 4, 40)]:
    src = pile.source(
      root,
      seq_len=seq_len,
      max_sequences_per_domain=cap or 10**6,
      max_eval_sequences_per_domain=cap or 10**6,
      max_lines=max_lines,
    )
    json.dumps(src.info)
    assert src.groups == pile.DOMAINS and src.x_shape == src.y_shape == (seq_len,)
    want = _expected_pile(root, tok, seq_len, cap, max_lines)
    for split in src.splits:
      assert split.clients == pile.DOMAINS
      for i, domain in enumerate(pile.DOMAINS):
        got = _all_rows(split, i)
        seqs = want[split.name, domain]
        if not seqs:
          assert got is None
          continue
        x, y, g = got
        assert x.tolist() == [s[:-1] for s in seqs] and y.tolist() == [s[1:] for s in seqs]
        assert x.dtype == np.int32 and g.tolist() == [i] * len(seqs)
  # the defaults (seq_len 1024) give every domain at least one sequence in every split
  src = pile.source(os.path.dirname(root))
  assert src.info["seq_len"] == 1024
  for split in src.splits:
    assert all(_all_rows(split, i)[0].shape[1] == 1024 for i in range(17))


def test_pile_hostile_files_are_named(tmp_path):
  root = pile.write_standin(tmp_path / "p")
  val = os.path.join(root, "val.jsonl.zst")
  good = json.dumps({"text": "alpha", "meta": {"pile_set_name": "ArXiv"}})
  with open(val, "wb") as f:
    f.write(zstandard.ZstdCompressor().compress((good + "\n{not json\n").encode()))
  src = pile.source(root)
  with pytest.raises(SourceError, match=r"val\.jsonl\.zst: line 2 is not JSON"):
    list(src.splits[1].rows(0))
  with open(val, "wb") as f:
    line = json.dumps({"text": "x", "meta": {"pile_set_name": "Reddit"}})
    f.write(zstandard.ZstdCompressor().compress((good + "\n" + line + "\n").encode()))
  with pytest.raises(SourceError, match=r"val\.jsonl\.zst: line 2 has an unknown pile_set_name"):
    list(pile.source(root).splits[1].rows(0))
  test = os.path.join(root, "test.jsonl.zst")
  with open(test, "rb") as f:
    data = f.read()
  with open(test, "wb") as f:
    f.write(data[: len(data) // 2])
  with pytest.raises(SourceError, match=r"test\.jsonl\.zst: truncated zstandard data"):
    list(pile.source(root).splits[2].rows(0))
  with open(test, "wb") as f:
    f.write(b"plain text, not zstd")
  with pytest.raises(SourceError, match=r"test\.jsonl\.zst: not zstandard data"):
    pile.source(root)
  os.remove(test)
  with pytest.raises(SourceError, match=r"test\.jsonl\.zst: file not found"):
    pile.source(root)
  shutil.rmtree(os.path.join(root, "train"))
  with pytest.raises(SourceError, match=r"train: folder not found"):
    pile.source(root)


# --- Shakespeare ------------------------------------------------------------------------------


def test_shakespeare_matches_its_standin_exactly(tmp_path):
  root = shakespeare.write_standin(tmp_path / "s", seed=2)
  src = shakespeare.source(root)
  assert [s.name for s in src.splits] == ["train", "test"] and src.groups == ("all",)
  assert src.info["num_classes"] == 81 and len(LEAF_LETTERS) == 80
  json.dumps(src.info)

  def ids(s):
    return [LEAF_LETTERS.index(c) if c in LEAF_LETTERS else 80 for c in s]

  seen_other = False
  for split in src.splits:
    with open(
      os.path.join(root, "data", split.name, f"all_data_niid_0_keep_0_{split.name}_8.json")
    ) as f:
      data = json.load(f)
    assert split.clients == tuple(data["users"]) and len(data["users"]) == 3
    assert split.num_rows == tuple(data["num_samples"])
    for i, user in enumerate(data["users"]):
      x, y, g = _all_rows(split, i)
      want = data["user_data"][user]
      assert x.tolist() == [ids(s) for s in want["x"]]
      assert y.tolist() == [ids(c)[0] for c in want["y"]]
      assert x.dtype == np.int32 and y.dtype == np.int32 and g.tolist() == [0] * len(y)
      seen_other |= bool((x == 80).any())
  assert seen_other  # the stand-in's character outside ALL_LETTERS
  # min_samples counts train and test together and drops the user everywhere
  totals = {}
  for split in src.splits:
    for user, n in zip(split.clients, split.num_rows):
      totals[user] = totals.get(user, 0) + n
  cut = sorted(totals.values())[1]
  kept = shakespeare.source(os.path.join(root, "data"), min_samples=cut)
  for split in kept.splits:
    assert set(split.clients) == {u for u, n in totals.items() if n >= cut}


def test_shakespeare_hostile_files_are_named(tmp_path):
  root = shakespeare.write_standin(tmp_path / "s")
  file = os.path.join(root, "data", "test", "all_data_niid_0_keep_0_test_8.json")
  with open(file) as f:
    text = f.read()
  with open(file, "w") as f:
    f.write(text[:-10])
  with pytest.raises(SourceError, match=r"all_data_niid_0_keep_0_test_8\.json: not JSON"):
    shakespeare.source(root)
  data = json.loads(text)
  user = data["users"][0]
  data["user_data"][user]["x"][0] = "too short"
  with open(file, "w") as f:
    json.dump(data, f)
  with pytest.raises(SourceError, match=r"test_8\.json: user .* x\[0\] is not a string of 80"):
    shakespeare.source(root)
  data["user_data"][user]["x"][0] = "a" * 80
  data["num_samples"][0] += 1
  with open(file, "w") as f:
    json.dump(data, f)
  with pytest.raises(SourceError, match=r"test_8\.json: user .* has num_samples"):
    shakespeare.source(root)
  shutil.rmtree(os.path.join(root, "data", "test"))
  with pytest.raises(SourceError, match=r"test: folder not found"):
    shakespeare.source(root)
