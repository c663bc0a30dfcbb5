"""The FedCIFAR-100 and StackOverflow readers against TFF's HDF5 layout, written here with h5py."""

import json
import os

import h5py
import numpy as np
import pytest

from fedjax_dro.data._sources import fedcifar100, stackoverflow
from fedjax_dro.data._sources.base import SourceError

VLEN = h5py.special_dtype(vlen=bytes)


def _all_rows(split, i):
  chunks = list(split.rows(i))
  for x, y, g in chunks:
    assert len(x) <= 256 and len(x) == len(y) == len(g)
  if not chunks:
    return None
  return tuple(np.concatenate([c[j] for c in chunks]) for j in range(3)), len(chunks)


# ---------------------------------------------------------------- FedCIFAR-100


def _write_cifar(path, clients):
  """``clients``: {id: (images, labels)} in TFF's layout."""
  with h5py.File(path, "w") as f:
    ex = f.create_group("examples")
    for cid, (images, labels) in clients.items():
      g = ex.create_group(cid)
      g.create_dataset("image", data=images)
      g.create_dataset("label", data=np.asarray(labels, np.int64))
      g.create_dataset("coarse_label", data=np.asarray(labels, np.int64) // 5)


def test_fedcifar100_hand_built_files(tmp_path):
  rng = np.random.default_rng(0)
  big = rng.integers(0, 256, (300, 32, 32, 3), dtype=np.uint8)
  big_labels = rng.integers(0, 100, 300)
  small = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
  train = {"10": (small, [99, 0]), "2": (big, big_labels), "0": (small[:1], [5])}
  _write_cifar(tmp_path / "fed_cifar100_train.h5", train)
  _write_cifar(tmp_path / "fed_cifar100_test.h5", {"0": (small, [1, 2])})
  src = fedcifar100.source(str(tmp_path))
  assert src.dataset == "fedcifar100" and src.groups == ("all",)
  assert (src.x_shape, src.x_dtype, src.y_shape, src.y_dtype) == ((32, 32, 3), "uint8", (), "int32")
  tr, te = src.splits
  assert (tr.name, te.name) == ("train", "test")
  assert tr.clients == ("0", "10", "2")  # TFF's string order
  assert tr.num_rows == (1, 2, 300) and te.num_rows == (2,)
  (x, y, g), n_chunks = _all_rows(tr, 2)
  assert n_chunks == 2  # 256 + 44
  np.testing.assert_array_equal(x, big)
  np.testing.assert_array_equal(y, big_labels)
  assert y.dtype == np.int32 and x.dtype == np.uint8 and g.dtype == np.int32
  assert not g.any()
  (x, y, _), _ = _all_rows(tr, 1)
  np.testing.assert_array_equal(x, small)
  assert y.tolist() == [99, 0]
  info = src.info
  json.dumps(info)
  assert info["task"] == "classification" and info["num_classes"] == 100
  assert len(info["label_names"]) == 100 and info["label_names"][:2] == ["apple", "aquarium_fish"]
  assert info["label_names"][-1] == "worm" and len(set(info["label_names"])) == 100
  assert info["protocol"] and info["citation"] and info["metrics"]
  # the path may name one of the files: its directory is read
  again = fedcifar100.source(str(tmp_path / "fed_cifar100_test.h5"))
  assert [s.clients for s in again.splits] == [tr.clients, te.clients]


def test_fedcifar100_standin_matches_plain_h5py(tmp_path):
  path = fedcifar100.write_standin(str(tmp_path / "a"), seed=3)
  src = fedcifar100.source(path)
  for split in src.splits:
    with h5py.File(os.path.join(path, f"fed_cifar100_{split.name}.h5"), "r") as f:
      ids = sorted(f["examples"].keys())
      assert split.clients == tuple(ids)
      for i, cid in enumerate(ids):
        image = f["examples"][cid]["image"][()]
        label = f["examples"][cid]["label"][()]
        assert set(f["examples"][cid].keys()) == {"coarse_label", "image", "label"}
        assert image.dtype == np.uint8 and label.dtype == np.int64
        (x, y, g), _ = _all_rows(split, i)
        np.testing.assert_array_equal(x, image)
        np.testing.assert_array_equal(y, label)
        assert split.num_rows[i] == len(label)
  assert len(src.splits[0].clients) == 12 and src.splits[0].clients[:3] == ("0", "1", "10")
  # deterministic in seed
  again = fedcifar100.write_standin(str(tmp_path / "b"), seed=3)
  other = fedcifar100.write_standin(str(tmp_path / "c"), seed=4)

  def images(p):
    with h5py.File(os.path.join(p, "fed_cifar100_train.h5"), "r") as f:
      return [f["examples"][c]["image"][()] for c in sorted(f["examples"])]

  a, b, c = images(path), images(again), images(other)
  assert all(np.array_equal(u, v) for u, v in zip(a, b)) and len(a) == len(b)
  assert not all(u.shape == v.shape and np.array_equal(u, v) for u, v in zip(a, c))


def test_fedcifar100_hostile_files(tmp_path):
  def standin(name):
    return fedcifar100.write_standin(str(tmp_path / name))

  with pytest.raises(SourceError, match="not a directory"):
    fedcifar100.source(str(tmp_path / "nowhere"))
  # missing file
  p = standin("missing")
  os.remove(os.path.join(p, "fed_cifar100_test.h5"))
  with pytest.raises(SourceError, match="fed_cifar100_test.h5: file not found"):
    fedcifar100.source(p)
  # truncated file
  p = standin("truncated")
  f = os.path.join(p, "fed_cifar100_train.h5")
  data = open(f, "rb").read()
  with open(f, "wb") as out:
    out.write(data[: len(data) // 3])
  with pytest.raises(SourceError, match="fed_cifar100_train.h5: not a readable HDF5 file") as e:
    fedcifar100.source(p)
  assert "\n" not in str(e.value)
  # not HDF5 at all
  p = standin("garbage")
  with open(os.path.join(p, "fed_cifar100_test.h5"), "wb") as out:
    out.write(b"image,label\n1,2\n")
  with pytest.raises(SourceError, match="fed_cifar100_test.h5: not a readable HDF5 file"):
    fedcifar100.source(p)
  # no examples group
  p = standin("noexamples")
  with h5py.File(os.path.join(p, "fed_cifar100_train.h5"), "w") as h:
    h.create_group("clients").create_group("0").create_dataset("label", data=[1])
  with pytest.raises(SourceError, match="fed_cifar100_train.h5: no 'examples' group"):
    fedcifar100.source(p)
  # a client without label
  p = standin("nolabel")
  with h5py.File(os.path.join(p, "fed_cifar100_test.h5"), "a") as h:
    del h["examples/1/label"]
  with pytest.raises(SourceError, match=r"fed_cifar100_test.h5: client '1' has no 'label' dataset"):
    fedcifar100.source(p)
  # a wrong image shape, a float label, lengths that differ (the stand-in's clients hold <= 5)
  bad = {
    "shape": ("image", np.zeros((2, 28, 28), np.uint8)),
    "dtype": ("label", np.zeros(2, np.float32)),
    "length": ("coarse_label", np.zeros(7, np.int64)),
  }
  messages = {
    "shape": r"client '0': 'image' has shape \[2, 28, 28\], expected \[k, 32, 32, 3\]",
    "dtype": r"client '0': 'label' has dtype float32, expected an integer type",
    "length": r"client '0': 'coarse_label' has 7 entries, the other features [2-5]",
  }
  for case, (name, value) in bad.items():
    p = standin(case)
    with h5py.File(os.path.join(p, "fed_cifar100_test.h5"), "a") as h:
      del h["examples/0"][name]
      h["examples/0"].create_dataset(name, data=value)
    with pytest.raises(SourceError, match=messages[case]):
      fedcifar100.source(p)
  p = standin("empty")
  with h5py.File(os.path.join(p, "fed_cifar100_train.h5"), "w") as h:
    h.create_group("examples")
  with pytest.raises(SourceError, match="holds no clients"):
    fedcifar100.source(p)
  # a label out of range is caught when the rows are read
  p = standin("range")
  with h5py.File(os.path.join(p, "fed_cifar100_test.h5"), "a") as h:
    h["examples/0/label"][0] = 100
  split = fedcifar100.source(p).splits[1]
  with pytest.raises(SourceError, match="expected fine labels 0..99"):
    list(split.rows(0))


# ---------------------------------------------------------------- StackOverflow


def _write_so(path, clients):
  """``clients``: {id: [sentence, ...]} in TFF's layout (all six features)."""
  with h5py.File(path, "w") as f:
    ex = f.create_group("examples")
    for cid, sentences in clients.items():
      g = ex.create_group(cid)
      k = len(sentences)
      enc = lambda vals: np.array([v.encode() for v in vals], dtype=object)  # noqa: E731
      g.create_dataset("creation_date", data=enc(["2017-01-01 00:00:00.0 UTC"] * k), dtype=VLEN)
      g.create_dataset("score", data=np.zeros(k, np.int64))
      g.create_dataset("tags", data=enc(["a|b"] * k), dtype=VLEN)
      g.create_dataset("title", data=enc(["t"] * k), dtype=VLEN)
      g.create_dataset("tokens", data=enc(sentences), dtype=VLEN)
      g.create_dataset("type", data=enc(["answer"] * k), dtype=VLEN)


def _so_dir(tmp_path, train, held_out, test):
  tmp_path.mkdir(parents=True, exist_ok=True)
  _write_so(tmp_path / "stackoverflow_train.h5", train)
  _write_so(tmp_path / "stackoverflow_held_out.h5", held_out)
  _write_so(tmp_path / "stackoverflow_test.h5", test)
  return str(tmp_path)


def test_stackoverflow_tokenization_by_hand(tmp_path):
  d = _so_dir(
    tmp_path / "so",
    {"00000002": ["a b z", "b"], "00000001": ["c c c c c a"]},
    {"00000010": ["z"]},
    {"00000002": ["b a"]},
  )
  vocab = tmp_path / "counts.txt"
  vocab.write_text("b 9\na 5\nc 1\n")
  src = stackoverflow.source(d, vocab_file=str(vocab), vocab_size=2, seq_len=4)
  # ids: pad 0, bos 1, eos 2, b 3, a 4, oov 5
  assert src.info["label_names"] == ["<pad>", "<bos>", "<eos>", "b", "a", "<oov>"]
  assert src.info["num_classes"] == 6 and src.info["task"] == "language_model"
  assert (src.x_shape, src.x_dtype, src.y_shape, src.y_dtype) == ((4,), "int32", (4,), "int32")
  tr, ho, te = src.splits
  assert [s.name for s in src.splits] == ["train", "held_out", "test"]
  assert tr.clients == ("00000001", "00000002") and tr.num_rows == (1, 2)
  (x, y, g), _ = _all_rows(tr, 1)
  assert x.tolist() == [[1, 4, 3, 5], [1, 3, 0, 0]]
  assert y.tolist() == [[4, 3, 5, 2], [3, 2, 0, 0]]
  assert x.dtype == y.dtype == g.dtype == np.int32 and not g.any()
  (x, y, _), _ = _all_rows(tr, 0)  # "c" is out of the 2-word vocabulary; 6 words > seq_len
  assert x.tolist() == [[1, 5, 5, 5]] and y.tolist() == [[5, 5, 5, 5]]
  (x, y, _), _ = _all_rows(ho, 0)
  assert x.tolist() == [[1, 5, 0, 0]] and y.tolist() == [[5, 2, 0, 0]]
  (x, y, _), _ = _all_rows(te, 0)
  assert x.tolist() == [[1, 3, 4, 0]] and y.tolist() == [[3, 4, 2, 0]]
  json.dumps(src.info)
  assert any("vocab_file" in line for line in src.info["protocol"])
  assert src.info["special_ids"] == {"pad": 0, "bos": 1, "eos": 2, "oov": 5}
  one_file = os.path.join(d, "stackoverflow_held_out.h5")
  again = stackoverflow.source(one_file, vocab_file=str(vocab), vocab_size=2, seq_len=4)
  assert [s.clients for s in again.splits] == [s.clients for s in src.splits]
  # cap and chunking: 300 sentences, first 260 kept, chunks of <= 256
  many = [f"w{i % 7} b" for i in range(300)]
  d2 = _so_dir(tmp_path / "so2", {"00000005": many}, {"00000010": ["a"]}, {"00000005": ["a"]})
  src = stackoverflow.source(d2, vocab_file=str(vocab), seq_len=3, max_sentences_per_client=260)
  assert src.splits[0].num_rows == (260,)
  (x, y, _), n_chunks = _all_rows(src.splits[0], 0)
  assert n_chunks == 2 and x.shape == (260, 3)
  assert x[0].tolist() == [1, 6, 3] and y[0].tolist() == [6, 3, 2]  # vocab b a c: c = 5, oov 6
  src = stackoverflow.source(d2, vocab_file=str(vocab), max_sentences_per_client=None)
  assert src.splits[0].num_rows == (300,)
  assert stackoverflow.source(d2, vocab_file=str(vocab)).splits[0].num_rows == (64,)


def _expected_tokens(sentence, vocab, seq_len):
  ids = [1]
  for w in sentence.split(" "):
    ids.append(vocab.index(w) + 3 if w in vocab else len(vocab) + 3)
  ids.append(2)
  x = (ids[:-1] + [0] * seq_len)[:seq_len]
  y = (ids[1:] + [0] * seq_len)[:seq_len]
  return x, y


def test_stackoverflow_standin_matches_plain_h5py(tmp_path):
  path = stackoverflow.write_standin(str(tmp_path / "s"), seed=1)
  names = ["stackoverflow_train.h5", "stackoverflow_held_out.h5", "stackoverflow_test.h5"]
  assert sorted(os.listdir(path)) == sorted(names + ["stackoverflow.word_count"])
  with open(os.path.join(path, "stackoverflow.word_count")) as f:
    vocab = [line.split()[0] for line in f][:12]
  src = stackoverflow.source(path, vocab_size=12, seq_len=7)
  assert src.info["label_names"][3:-1] == vocab
  for split, name in zip(src.splits, names):
    with h5py.File(os.path.join(path, name), "r") as f:
      ids = sorted(f["examples"].keys())
      assert split.clients == tuple(ids) and all(len(c) == 8 for c in ids)
      for i, cid in enumerate(ids):
        grp = f["examples"][cid]
        assert set(grp.keys()) == {"creation_date", "score", "tags", "title", "tokens", "type"}
        assert grp["score"].dtype == np.int64 and h5py.check_string_dtype(grp["tokens"].dtype)
        assert {t.decode() for t in grp["type"][()]} <= {"question", "answer"}
        sentences = [t.decode() for t in grp["tokens"][()]]
        expected = [_expected_tokens(s, vocab, 7) for s in sentences]
        (x, y, _), _ = _all_rows(split, i)
        assert x.tolist() == [e[0] for e in expected] and y.tolist() == [e[1] for e in expected]
  # held-out and test hold out-of-vocabulary words; train shares users with test only
  oov = len(vocab) + 3
  assert any((next(s.rows(i))[1] == oov).any() for s in src.splits[1:] for i in range(2))
  assert set(src.splits[0].clients) & set(src.splits[2].clients)
  assert not set(src.splits[1].clients) & (set(src.splits[0].clients) | set(src.splits[2].clients))


def test_stackoverflow_vocab_counted_from_train(tmp_path):
  path = stackoverflow.write_standin(str(tmp_path / "s"), seed=2)
  with_file = stackoverflow.source(path, vocab_size=6).info["label_names"]
  os.remove(os.path.join(path, "stackoverflow.word_count"))
  src = stackoverflow.source(path, vocab_size=6)
  users = {}
  with h5py.File(os.path.join(path, "stackoverflow_train.h5"), "r") as f:
    for cid in f["examples"]:
      words = set()
      for t in f["examples"][cid]["tokens"][()]:
        words.update(t.decode().split(" "))
      for w in words:
        users[w] = users.get(w, 0) + 1
  ranked = sorted(users, key=lambda w: (-users[w], w))[:6]
  assert src.info["label_names"][3:-1] == ranked
  assert with_file == src.info["label_names"]  # the stand-in's word_count is TFF's rule
  assert any("counted from stackoverflow_train.h5" in line for line in src.info["protocol"])


def test_stackoverflow_hostile_files(tmp_path):
  def standin(name):
    return stackoverflow.write_standin(str(tmp_path / name))

  p = standin("truncated")
  f = os.path.join(p, "stackoverflow_held_out.h5")
  data = open(f, "rb").read()
  with open(f, "wb") as out:
    out.write(data[: len(data) // 2])
  with pytest.raises(SourceError, match="stackoverflow_held_out.h5: not a readable HDF5 file"):
    stackoverflow.source(p)
  p = standin("noexamples")
  with h5py.File(os.path.join(p, "stackoverflow_test.h5"), "a") as h:
    h.move("examples", "Examples")
  with pytest.raises(SourceError, match="stackoverflow_test.h5: no 'examples' group"):
    stackoverflow.source(p)
  p = standin("notokens")
  with h5py.File(os.path.join(p, "stackoverflow_train.h5"), "a") as h:
    del h["examples/00000007/tokens"]
  with pytest.raises(SourceError, match="client '00000007' has no 'tokens' dataset"):
    stackoverflow.source(p)
  p = standin("numbers")
  with h5py.File(os.path.join(p, "stackoverflow_train.h5"), "a") as h:
    k = h["examples/00000001/tokens"].shape[0]
    del h["examples/00000001/tokens"]
    h["examples/00000001"].create_dataset("tokens", data=np.arange(k))
  with pytest.raises(SourceError, match="'tokens' has dtype int64, expected strings"):
    stackoverflow.source(p)
  p = standin("missing")
  os.remove(os.path.join(p, "stackoverflow_train.h5"))
  with pytest.raises(SourceError, match="stackoverflow_train.h5: file not found"):
    stackoverflow.source(p)
  p = standin("badcounts")
  bad = os.path.join(p, "stackoverflow.word_count")
  with open(bad, "w") as out:
    out.write("the 10\nof ten\n")
  with pytest.raises(SourceError, match=r"stackoverflow.word_count: line 2 is 'of ten'"):
    stackoverflow.source(p)
  with pytest.raises(SourceError, match="nope.txt: file not found"):
    stackoverflow.source(p, vocab_file=os.path.join(p, "nope.txt"))
  with pytest.raises(ValueError, match="max_sentences_per_client"):
    stackoverflow.source(standin("opts"), max_sentences_per_client=0)


def test_standin_is_deterministic(tmp_path):
  a = stackoverflow.write_standin(str(tmp_path / "a"), seed=5)
  b = stackoverflow.write_standin(str(tmp_path / "b"), seed=5)
  c = stackoverflow.write_standin(str(tmp_path / "c"), seed=6)

  def tokens(p):
    with h5py.File(os.path.join(p, "stackoverflow_train.h5"), "r") as f:
      return {cid: f["examples"][cid]["tokens"][()].tolist() for cid in f["examples"]}

  assert tokens(a) == tokens(b) and tokens(a) != tokens(c)
  assert (
    open(os.path.join(a, "stackoverflow.word_count")).read()
    == open(os.path.join(b, "stackoverflow.word_count")).read()
  )


def test_module_docstrings_state_layout_and_sizes():
  assert "examples/<client_id>" in fedcifar100.__doc__ and "50,000" in fedcifar100.__doc__
  assert "342,477" in stackoverflow.__doc__ and "held_out" in stackoverflow.__doc__
