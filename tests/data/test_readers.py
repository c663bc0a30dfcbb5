"""Readers of the user's files: features ``.npz``, CIFAR-10/100 binary, TinyImageNet."""

import os
import sys
import zipfile

import numpy as np
import pytest

from fedjax_dro.data import (
  load_cifar10,
  load_cifar100,
  load_features,
  load_tiny_imagenet,
  write_features,
)
from fedjax_dro.data.user_cifar import write_cifar10_bin, write_cifar100_bin
from fedjax_dro.data.user_files import FeatureSet, ImageSet

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


def test_write_features_round_trips(tmp_path, monkeypatch):
  x, y = _features(n=5, d=2)
  split = np.array(["train", "test", "test", "train", "train"])
  path = write_features(tmp_path / "emb", x, y, split)
  assert path.endswith("emb.npz") and os.path.isfile(path)
  fs = load_features(path)
  np.testing.assert_array_equal(fs.features, x.astype(np.float32))
  np.testing.assert_array_equal(fs.labels, y)
  assert fs.split.tolist() == [False, True, True, False, False]
  monkeypatch.setenv("HOME", str(tmp_path))
  fs = load_features(write_features("~/plain.npz", x, y))
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


# ---------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 binary


def _hand_records(labels, images):
  """The binary records built byte by byte (the oracle): label bytes, then R, G, B planes."""
  out = bytearray()
  for lab, img in zip(labels, images):
    rec = bytearray(lab)
    for c in range(3):
      for i in range(32):
        for j in range(32):
          rec.append(int(img[i][j][c]))
    out += rec
  return bytes(out)


def _images(n, seed):
  return np.random.default_rng(seed).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)


def _expected(images):
  """x[n, i, j, :] = (r, g, b) / 255, element by element."""
  x = np.zeros((len(images), 32, 32, 3), np.float32)
  for n, img in enumerate(images):
    for i in range(32):
      for j in range(32):
        x[n, i, j] = [np.float32(int(v)) / np.float32(255) for v in img[i][j]]
  return x


def _write_cifar10_by_hand(folder, per_batch=(2, 1, 3, 1, 2), n_test=3):
  os.makedirs(folder, exist_ok=True)
  xs, ys = [], []
  for b, n in enumerate(per_batch, 1):
    x, y = _images(n, seed=b), [(3 * b + k) % 10 for k in range(n)]
    (folder / f"data_batch_{b}.bin").write_bytes(_hand_records([[v] for v in y], x))
    xs.append(x)
    ys += y
  xt, yt = _images(n_test, seed=99), [9, 0, 5][:n_test]
  (folder / "test_batch.bin").write_bytes(_hand_records([[v] for v in yt], xt))
  return np.concatenate(xs), ys, xt, yt


@pytest.mark.parametrize("nested", [False, True], ids=["data_dir", "data_dir/cifar-10-batches-bin"])
def test_load_cifar10_decodes_the_binary_records_exactly(tmp_path, nested):
  folder = tmp_path / "cifar-10-batches-bin" if nested else tmp_path
  x, y, xt, yt = _write_cifar10_by_hand(folder)
  ds = load_cifar10(tmp_path)
  assert isinstance(ds, ImageSet) and ds.num_classes == 10 and ds.class_names == ()
  assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
  assert ds.x_train.shape == (9, 32, 32, 3) and ds.x_test.shape == (3, 32, 32, 3)
  np.testing.assert_array_equal(ds.x_train, _expected(x))
  np.testing.assert_array_equal(ds.x_test, _expected(xt))
  assert ds.y_train.tolist() == y and ds.y_test.tolist() == yt
  assert ds.x_train.min() >= 0 and ds.x_train.max() <= 1


def test_load_cifar10_reads_class_names_and_round_trips_the_writer(tmp_path):
  names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
  x, y, xt, yt = _images(6, 1), np.arange(6) % 10, _images(2, 2), np.array([4, 9])
  write_cifar10_bin(tmp_path / "out", x, y, xt, yt, class_names=names)
  ds = load_cifar10(tmp_path / "out")
  assert ds.class_names == tuple(names)
  np.testing.assert_array_equal(ds.x_train, _expected(x))
  assert ds.y_train.tolist() == y.tolist() and ds.y_test.tolist() == yt.tolist()
  # The writer's files are the hand-built bytes, and float input in [0, 1] round-trips exactly.
  assert (tmp_path / "out" / "test_batch.bin").read_bytes() == _hand_records([[4], [9]], xt)
  write_cifar10_bin(tmp_path / "again", ds.x_train, ds.y_train, ds.x_test, ds.y_test)
  for f in ["data_batch_1.bin", "data_batch_5.bin", "test_batch.bin"]:
    assert (tmp_path / "again" / f).read_bytes() == (tmp_path / "out" / f).read_bytes()
  (tmp_path / "out" / "batches.meta.txt").write_text("cat\ndog\n\n")
  with pytest.raises(ValueError, match="batches.meta.txt.*2 names; expected 10"):
    load_cifar10(tmp_path / "out")


@pytest.mark.parametrize("nested", [False, True], ids=["data_dir", "data_dir/cifar-100-binary"])
def test_load_cifar100_decodes_fine_and_coarse_labels(tmp_path, nested):
  folder = tmp_path / "cifar-100-binary" if nested else tmp_path
  folder.mkdir(exist_ok=True)
  x, xt = _images(4, 5), _images(2, 6)
  coarse, fine, coarse_t, fine_t = [19, 0, 7, 3], [99, 1, 42, 0], [2, 11], [50, 77]
  (folder / "train.bin").write_bytes(_hand_records(list(zip(coarse, fine)), x))
  (folder / "test.bin").write_bytes(_hand_records(list(zip(coarse_t, fine_t)), xt))
  ds = load_cifar100(tmp_path)
  assert ds.num_classes == 100 and ds.y_train.tolist() == fine and ds.y_test.tolist() == fine_t
  np.testing.assert_array_equal(ds.x_train, _expected(x))
  np.testing.assert_array_equal(ds.x_test, _expected(xt))
  ds = load_cifar100(tmp_path, label="coarse")
  assert ds.num_classes == 20 and ds.y_train.tolist() == coarse and ds.y_test.tolist() == coarse_t
  np.testing.assert_array_equal(ds.x_train, _expected(x))


def test_write_cifar100_bin_round_trips_with_names(tmp_path):
  fine_names, coarse_names = [f"f{i}" for i in range(100)], [f"c{i}" for i in range(20)]
  x, y, xt, yt = _images(3, 1), np.array([0, 55, 99]), _images(1, 2), np.array([7])
  write_cifar100_bin(
    tmp_path, x, y, xt, yt, coarse_train=[1, 2, 3], fine_names=fine_names, coarse_names=coarse_names
  )
  ds = load_cifar100(tmp_path)
  assert ds.class_names == tuple(fine_names) and ds.y_train.tolist() == [0, 55, 99]
  np.testing.assert_array_equal(ds.x_train, _expected(x))
  ds = load_cifar100(tmp_path, label="coarse")
  assert ds.class_names == tuple(coarse_names)
  assert ds.y_train.tolist() == [1, 2, 3] and ds.y_test.tolist() == [7 // 5]


def test_cifar_readers_refuse_malformed_files(tmp_path):
  _write_cifar10_by_hand(tmp_path)
  batch = tmp_path / "data_batch_3.bin"
  good = batch.read_bytes()
  batch.write_bytes(good[:-1])
  with pytest.raises(ValueError, match=r"data_batch_3.bin.*9218 bytes, not a multiple.*3073"):
    load_cifar10(tmp_path)
  batch.write_bytes(b"")
  with pytest.raises(ValueError, match="data_batch_3.bin.*is empty"):
    load_cifar10(tmp_path)
  batch.write_bytes(good[:3073] + bytes([10]) + good[3074:])
  with pytest.raises(ValueError, match=r"data_batch_3.bin., record 1: class label byte 10 .*0, 10"):
    load_cifar10(tmp_path)
  batch.unlink()
  with pytest.raises(FileNotFoundError, match=r"\['data_batch_3.bin'\] not found.*binary version"):
    load_cifar10(tmp_path)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_cifar10(tmp_path / "nope")
  with pytest.raises(ValueError, match="is not a folder"):
    load_cifar10(tmp_path / "test_batch.bin")
  with pytest.raises(TypeError, match="data_dir must be a path"):
    load_cifar10(None)
  # CIFAR-10 files are not CIFAR-100 files: 3073-byte records are not 3074-byte ones.
  (tmp_path / "train.bin").write_bytes(_hand_records([[1]] * 2, _images(2, 0)))
  (tmp_path / "test.bin").write_bytes(_hand_records([[1, 2]] * 2, _images(2, 0)))
  with pytest.raises(ValueError, match="train.bin.*6146 bytes.*3074.*coarse label byte"):
    load_cifar100(tmp_path)
  (tmp_path / "train.bin").write_bytes(_hand_records([[1, 100]], _images(1, 0)))
  with pytest.raises(ValueError, match="train.bin., record 0: fine label byte 100"):
    load_cifar100(tmp_path)
  (tmp_path / "train.bin").write_bytes(_hand_records([[20, 1]], _images(1, 0)))
  with pytest.raises(ValueError, match="train.bin., record 0: coarse label byte 20"):
    load_cifar100(tmp_path, label="fine")
  with pytest.raises(ValueError, match="label must be 'fine' or 'coarse'"):
    load_cifar100(tmp_path, label="super")
  (tmp_path / "test.bin").unlink()
  with pytest.raises(FileNotFoundError, match="test.bin"):
    load_cifar100(tmp_path)


def test_cifar_writers_refuse_bad_arrays(tmp_path):
  x, y = _images(5, 0), np.arange(5)
  with pytest.raises(ValueError, match="x_train: images must be .N, 32, 32, 3."):
    write_cifar10_bin(tmp_path, x[:, :16], y, x, y)
  with pytest.raises(ValueError, match="y_test: labels must be class indices in .0, 10."):
    write_cifar10_bin(tmp_path, x, y, x, y + 6)
  with pytest.raises(ValueError, match="x_train needs >= 5 rows"):
    write_cifar10_bin(tmp_path, x[:4], y[:4], x, y)
  with pytest.raises(ValueError, match="float images must be finite and in .0, 1."):
    write_cifar10_bin(tmp_path, x * 1.0, y, x, y)
  with pytest.raises(ValueError, match="coarse_train: labels must be class indices in .0, 20."):
    write_cifar100_bin(tmp_path, x, y, x, y, coarse_train=y + 16)
  with pytest.raises(ValueError, match="fine_names: expected 100"):
    write_cifar100_bin(tmp_path, x, y, x, y, fine_names=["a"])
  with pytest.raises(ValueError, match="class_names: expected 10"):
    write_cifar10_bin(tmp_path / "new", x, y, x, y, class_names=["a"] * 9 + [""])
  assert os.listdir(tmp_path) == []  # nothing written, no folder made


# ---------------------------------------------------------------------------------------------
# TinyImageNet


def _tiny_arrays(n_train=5, n_test=3, dtype=np.uint8):
  rng = np.random.default_rng(3)
  x = rng.integers(0, 256, size=(n_train, 64, 64, 3)).astype(np.uint8)
  xt = rng.integers(0, 256, size=(n_test, 64, 64, 3)).astype(np.uint8)
  if dtype != np.uint8:
    x, xt = (x / 255).astype(dtype), (xt / 255).astype(dtype)
  return dict(x_train=x, y_train=np.arange(n_train) % 4, x_test=xt, y_test=np.array([3, 0, 1]))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64])
def test_load_tiny_imagenet_npz(tmp_path, dtype):
  arrays = _tiny_arrays(dtype=dtype)
  np.savez(tmp_path / "tiny.npz", **arrays)
  ds = load_tiny_imagenet(tmp_path / "tiny.npz")
  assert ds.x_train.dtype == np.float32 and ds.x_train.shape == (5, 64, 64, 3)
  scale = 255 if dtype == np.uint8 else 1
  np.testing.assert_allclose(ds.x_train, arrays["x_train"] / scale, rtol=1e-6)
  np.testing.assert_allclose(ds.x_test, arrays["x_test"] / scale, rtol=1e-6)
  assert ds.y_train.tolist() == [0, 1, 2, 3, 0] and ds.y_test.tolist() == [3, 0, 1]
  assert ds.num_classes == 4 and ds.class_names == ()
  np.savez(tmp_path / "named.npz", class_names=np.array(["a", "b", "c", "d", "e"]), **arrays)
  ds = load_tiny_imagenet(tmp_path / "named.npz")
  assert ds.num_classes == 5 and ds.class_names == ("a", "b", "c", "d", "e")


@pytest.mark.parametrize(
  "change, exc, fragment",
  [
    (dict(x_test=None), ValueError, "['x_test']"),
    (dict(x_train=np.zeros((2, 32, 32, 3), np.uint8)), ValueError, "[N >= 1, 64, 64, 3]"),
    (dict(x_train=np.zeros((2, 64, 64), np.uint8)), ValueError, "[N >= 1, 64, 64, 3]"),
    (dict(x_train=np.zeros((5, 64, 64, 3), np.int64)), TypeError, "uint8 or floats"),
    (dict(x_train=np.full((5, 64, 64, 3), 255.0)), ValueError, "in [0, 1]"),
    (dict(x_train=np.full((5, 64, 64, 3), np.nan)), ValueError, "finite"),
    (dict(y_train=np.arange(4)), ValueError, "4 labels but 5 rows"),
    (dict(y_test=np.array([0.0, 1.0, 2.0])), TypeError, "integers"),
    (dict(y_test=np.array([0, -1, 2])), ValueError, "min -1"),
    (dict(class_names=np.array(["a", "b"])), ValueError, "[0, 2)"),
    (dict(class_names=np.arange(4)), ValueError, "1-D string array"),
  ],
)
def test_load_tiny_imagenet_refuses_malformed_npz(tmp_path, change, exc, fragment):
  arrays = {**_tiny_arrays(), **change}
  arrays = {k: v for k, v in arrays.items() if v is not None}
  np.savez(tmp_path / "bad.npz", **arrays)
  with pytest.raises(exc) as info:
    load_tiny_imagenet(tmp_path / "bad.npz")
  assert "bad.npz" in str(info.value) and fragment in str(info.value), str(info.value)


def test_load_tiny_imagenet_refuses_object_arrays_and_missing_paths(tmp_path):
  arrays = _tiny_arrays()
  arrays["y_train"] = np.array(list(arrays["y_train"]), dtype=object)
  np.savez(tmp_path / "obj.npz", **arrays)
  with pytest.raises(TypeError, match="'y_train'.*object .pickled. array"):
    load_tiny_imagenet(tmp_path / "obj.npz")
  with pytest.raises(FileNotFoundError, match="nope.npz"):
    load_tiny_imagenet(tmp_path / "nope.npz")
  # The distributed tiny-imagenet-200.zip is a zip too, but not an .npz.
  with zipfile.ZipFile(tmp_path / "tiny-imagenet-200.zip", "w") as z:
    z.writestr("tiny-imagenet-200/wnids.txt", "n1\n")
    for k in range(30):
      z.writestr(f"tiny-imagenet-200/train/n1/images/n1_{k}.JPEG", b"")
  with pytest.raises(ValueError, match="is the zipped TinyImageNet folder.*unzip it"):
    load_tiny_imagenet(tmp_path / "tiny-imagenet-200.zip")
  with pytest.raises(
    ValueError, match=r"no key\(s\) \['features', 'labels'\].*\.\.\. \(31 in all\)"
  ):
    load_features(tmp_path / "tiny-imagenet-200.zip")


WNIDS = ["n01443537", "n01629819", "n01641577"]


def _fmt(fmt):
  return dict(format=fmt, quality=95, subsampling=0) if fmt == "JPEG" else dict(format=fmt)


def _tiny_folder(root, per_class=2, fmt="JPEG", size=64):
  """A tiny TinyImageNet folder of smooth generated images; returns (train, test) uint8 + labels."""
  from PIL import Image

  root.mkdir(parents=True)
  (root / "wnids.txt").write_text("\n".join(WNIDS) + "\n")
  ii, jj = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")

  def image(seed):  # smooth, so that JPEG keeps it close
    r, g, b = (np.random.default_rng(seed).uniform(0.5, 3, size=3) * np.pi / size).tolist()
    planes = [
      128 + 100 * np.sin(r * ii),
      128 + 100 * np.cos(g * jj),
      128 + 60 * np.sin(b * (ii + jj)),
    ]
    return np.stack(planes, -1).round().astype(np.uint8)

  train = []
  for k, w in enumerate(WNIDS):
    (root / "train" / w / "images").mkdir(parents=True)
    for m in range(per_class):
      img = image(10 * k + m)
      Image.fromarray(img).save(root / "train" / w / "images" / f"{w}_{m}.{fmt}", **_fmt(fmt))
      train.append((img, k))
  (root / "val" / "images").mkdir(parents=True)
  test, lines = [], []
  for m, k in enumerate([2, 0, 2, 1]):
    img = image(100 + m)
    Image.fromarray(img).save(root / "val" / "images" / f"val_{m}.{fmt}", **_fmt(fmt))
    lines.append(f"val_{m}.{fmt}\t{WNIDS[k]}\t0\t0\t63\t63")
    test.append((img, k))
  (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
  return train, test


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("nested", [False, True], ids=["root", "holding-folder"])
def test_load_tiny_imagenet_folder(tmp_path, fmt, nested):
  pytest.importorskip("PIL")
  root = tmp_path / "tiny-imagenet-200"
  train, test = _tiny_folder(root, fmt=fmt)
  ds = load_tiny_imagenet(tmp_path if nested else root)
  assert ds.class_names == tuple(WNIDS) and ds.num_classes == 3
  assert ds.x_train.shape == (6, 64, 64, 3) and ds.x_test.shape == (4, 64, 64, 3)
  assert ds.y_train.tolist() == [k for _, k in train] and ds.y_test.tolist() == [2, 0, 2, 1]
  # Exactly what Pillow decodes, file by file, in the listed order.
  from PIL import Image

  files = sorted((root / "train").glob(f"*/images/*.{fmt}")) + [
    root / "val" / "images" / f"val_{m}.{fmt}" for m in range(4)
  ]
  decoded = np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files]) / 255
  np.testing.assert_allclose(np.concatenate([ds.x_train, ds.x_test]), decoded, atol=1e-7)
  # And close to the images written (PNG is lossless; JPEG at quality 95 on smooth images).
  atol = 1e-7 if fmt == "PNG" else 8 / 255
  np.testing.assert_allclose(ds.x_train, np.stack([i for i, _ in train]) / 255, atol=atol)
  np.testing.assert_allclose(ds.x_test, np.stack([i for i, _ in test]) / 255, atol=atol)
  if fmt == "JPEG":
    assert np.abs(ds.x_test - np.stack([i for i, _ in test]) / 255).mean() < 1 / 255


def test_load_tiny_imagenet_folder_refuses_malformed_layouts(tmp_path, monkeypatch):
  pytest.importorskip("PIL")
  from PIL import Image

  root = tmp_path / "t"
  _tiny_folder(root, per_class=1, fmt="PNG")
  ann = root / "val" / "val_annotations.txt"
  good = ann.read_text()
  ann.write_text(good + "val_9.PNG\tn99999999\t0\t0\t1\t1\n")
  with pytest.raises(ValueError, match="val_annotations.txt., line 5: wnid 'n99999999'"):
    load_tiny_imagenet(root)
  ann.write_text("val_0.PNG n01443537\n")
  with pytest.raises(ValueError, match="line 1: expected"):
    load_tiny_imagenet(root)
  ann.write_text(good + "val_9.PNG\tn01443537\n")
  with pytest.raises(FileNotFoundError, match="val_9.PNG"):
    load_tiny_imagenet(root)
  ann.write_text("\n")
  with pytest.raises(ValueError, match="lists no images"):
    load_tiny_imagenet(root)
  ann.write_text(good)
  big = root / "train" / WNIDS[1] / "images" / "big.png"
  Image.fromarray(np.zeros((32, 48, 3), np.uint8)).save(big)
  with pytest.raises(ValueError, match="big.png.*48x32; expected 64x64"):
    load_tiny_imagenet(root)
  big.write_bytes(b"not an image")
  with pytest.raises(ValueError, match="big.png.*not a readable image"):
    load_tiny_imagenet(root)
  big.unlink()
  monkeypatch.setitem(sys.modules, "PIL", None)
  with pytest.raises(ImportError, match="Pillow.*npz form"):
    load_tiny_imagenet(root)
  monkeypatch.undo()
  assert load_tiny_imagenet(root).x_train.shape == (3, 64, 64, 3)
  ann.unlink()
  with pytest.raises(FileNotFoundError, match="no val/val_annotations.txt"):
    load_tiny_imagenet(root)
  (root / "wnids.txt").write_text("n1\nn1\n")
  with pytest.raises(ValueError, match="wnids.txt.*distinct"):
    load_tiny_imagenet(root)
  (root / "wnids.txt").write_text("n1\n")
  with pytest.raises(FileNotFoundError, match="class 'n1' of wnids.txt"):
    load_tiny_imagenet(root)
  (root / "train" / "n1" / "images").mkdir(parents=True)
  with pytest.raises(ValueError, match="has no .JPEG"):
    load_tiny_imagenet(root)
  (root / "wnids.txt").unlink()
  with pytest.raises(FileNotFoundError, match="no wnids.txt"):
    load_tiny_imagenet(root)
