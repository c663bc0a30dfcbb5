"""Readers of the user's files: features ``.npz``, CIFAR-10/100 binary, TinyImageNet."""

import os

import numpy as np
import pytest

from fedjax_dro.data import FeatureSet, load_features, write_features

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------------------------
# Features files


def _features(n=7, d=3):
  return RNG.normal(size=(n, d)), RNG.integers(0, 4, size=n)


@pytest.mark.parametrize(
  "split, expected",
  [
    (None, None),
    (np.array([0, 1, 0, 0, 1, 1, 0]), [False, True, False, False, True, True, False]),
    (np.array([0, 1, 0, 0, 1, 1, 0], np.uint8), [False, True, False, False, True, True, False]),
    (np.array([1, 0, 0, 0, 0, 0, 1], bool), [True, False, False, False, False, False, True]),
    (
      np.array(["train", "test", "train", "train", "test", "train", "TEST"]),
      [False, True, False, False, True, False, True],
    ),
    (np.array([b"test", b"train", b"train", b"train", b"train", b"train", b"train"]), None),
  ],
  ids=["none", "int", "uint8", "bool", "str", "bytes"],
)
def test_load_features_reads_every_split_form(tmp_path, split, expected):
  x, y = _features()
  path = tmp_path / "f.npz"
  arrays = {"features": x, "labels": y}
  if split is not None:
    arrays["split"] = split
  np.savez(path, **arrays)
  fs = load_features(path)
  assert isinstance(fs, FeatureSet)
  assert fs.features.dtype == np.float32 and fs.labels.dtype == np.int32
  np.testing.assert_array_equal(fs.features, x.astype(np.float32))
  np.testing.assert_array_equal(fs.labels, y)
  assert fs.num_classes == int(y.max()) + 1
  if split is None:
    assert fs.split is None
  else:
    if expected is None:  # bytes: test only in row 0
      expected = [True] + [False] * 6
    assert fs.split.dtype == bool and fs.split.tolist() == expected


def test_write_features_round_trips(tmp_path):
  x, y = _features(n=5, d=2)
  split = np.array(["train", "test", "test", "train", "train"])
  path = write_features(tmp_path / "emb", x, y, split)
  assert path.endswith("emb.npz") and os.path.isfile(path)
  fs = load_features(path)
  np.testing.assert_array_equal(fs.features, x.astype(np.float32))
  np.testing.assert_array_equal(fs.labels, y)
  assert fs.split.tolist() == [False, True, True, False, False]
  fs = load_features(write_features(tmp_path / "plain.npz", x, y))
  assert fs.split is None
  with np.load(tmp_path / "plain.npz", allow_pickle=False) as npz:
    assert sorted(npz.files) == ["features", "labels"]


def _save(path, **arrays):
  np.savez(path, **arrays)
  return path


X7, Y7 = np.zeros((7, 3)), np.arange(7) % 3


@pytest.mark.parametrize(
  "arrays, exc, fragment",
  [
    (dict(feats=X7, labels=Y7), ValueError, "'features'"),
    (dict(features=X7), ValueError, "'labels'"),
    (dict(features=np.zeros(7), labels=Y7), ValueError, "2-D"),
    (dict(features=np.zeros((7, 2, 2)), labels=Y7), ValueError, "2-D"),
    (dict(features=np.zeros((0, 3)), labels=np.zeros(0, int)), ValueError, "empty"),
    (dict(features=X7, labels=Y7[:6]), ValueError, "6 labels but 7 rows"),
    (dict(features=X7, labels=Y7.reshape(7, 1)), ValueError, "1-D"),
    (dict(features=X7, labels=Y7 + 0.5), TypeError, "integers"),
    (dict(features=X7, labels=Y7 - 1), ValueError, "min -1"),
    (dict(features=X7, labels=np.array(["a"] * 7)), TypeError, "integers"),
    (dict(features=np.full((7, 3), "x"), labels=Y7), TypeError, "real numbers"),
    (dict(features=np.where(np.eye(7, 3) > 0, np.nan, 0.0), labels=Y7), ValueError, "finite"),
    (dict(features=np.full((7, 3), np.inf), labels=Y7), ValueError, "finite"),
    (dict(features=np.full((7, 3), 1e300), labels=Y7), ValueError, "finite"),
    (dict(features=X7, labels=Y7, split=np.zeros(6, bool)), ValueError, "7 entries"),
    (dict(features=X7, labels=Y7, split=np.full(7, 2)), ValueError, "0 (train) or 1"),
    (dict(features=X7, labels=Y7, split=np.array(["train"] * 6 + ["val"])), ValueError, "'val'"),
    (dict(features=X7, labels=Y7, split=np.full(7, 0.5)), TypeError, "dtype float64"),
  ],
)
def test_load_features_refuses_malformed_files(tmp_path, arrays, exc, fragment):
  path = _save(tmp_path / "bad.npz", **arrays)
  with pytest.raises(exc) as info:
    load_features(path)
  assert str(path) in str(info.value) and fragment in str(info.value), str(info.value)


def test_load_features_refuses_pickles_missing_files_and_non_npz(tmp_path):
  path = tmp_path / "obj.npz"
  np.savez(path, features=np.array([[1.0], [2.0]], dtype=object), labels=np.array([0, 1]))
  with pytest.raises(TypeError, match="object .pickled. array.*allow_pickle=False"):
    load_features(path)
  with pytest.raises(FileNotFoundError, match="missing.npz"):
    load_features(tmp_path / "missing.npz")
  with pytest.raises(ValueError, match="is not a regular file"):
    load_features(tmp_path)
  (tmp_path / "text.npz").write_text("features,labels\n1,0\n")
  with pytest.raises(ValueError, match="text.npz.*not a valid .npz"):
    load_features(tmp_path / "text.npz")
  with pytest.raises(TypeError, match="must be a path"):
    load_features(3)


def test_write_features_refuses_what_the_reader_would(tmp_path):
  with pytest.raises(ValueError, match="write_features, 'labels'.*min -2"):
    write_features(tmp_path / "x.npz", X7, Y7 - 2)
  with pytest.raises(ValueError, match="write_features, 'split'"):
    write_features(tmp_path / "x.npz", X7, Y7, split=["train"] * 7 + ["test"])
  assert not os.path.exists(tmp_path / "x.npz")
