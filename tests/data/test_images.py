"""Shipped digits, the FGDRO imbalance / Dirichlet setting, and the npz / LEAF JSON loaders."""

import json
import os
import zipfile
from collections import Counter

import numpy as np
import pytest

from fedjax_dro.core.metrics import class_weighted_accuracy
from fedjax_dro.data.digits import (
  DIGITS_PATH,
  DigitsExtras,
  digits_dirichlet,
  digits_dirichlet_with_extras,
  label_proportions,
  load_digits,
  reduce_classes,
)
from fedjax_dro.data.federated import FederatedData, FederatedDataset
from fedjax_dro.data.user_arrays import load_leaf_json, load_npz

# --- shipped digits ------------------------------------------------------------------------------


def test_load_digits_shape_dtype_range_and_class_counts():
  x, y = load_digits()
  assert x.shape == (1797, 8, 8) and x.dtype == np.float32
  assert y.shape == (1797,) and y.dtype == np.int32
  assert x.min() == 0.0 and x.max() == 1.0
  # Pixels are counts 0..16 scaled by 1/16.
  np.testing.assert_array_equal(x * 16, np.round(x * 16))
  counts = np.bincount(y)
  assert counts.tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
  assert counts.sum() == 1797 and np.all(np.abs(counts - 180) <= 6)


def test_shipped_files_and_license_present():
  assert os.path.isfile(DIGITS_PATH)
  with np.load(DIGITS_PATH, allow_pickle=False) as npz:
    assert sorted(npz.files) == ["x", "y"]
    assert npz["x"].dtype == np.uint8 and npz["y"].dtype == np.uint8
  license_path = os.path.join(os.path.dirname(DIGITS_PATH), "DIGITS_LICENSE.md")
  text = open(license_path).read()
  for needle in ("10.24432/C50P49", "CC BY 4.0", "Alpaydin", "Kaynak", "scikit-learn"):
    assert needle in text


def test_load_digits_rejects_corrupted_files(tmp_path):
  bad_zip = tmp_path / "notzip.npz"
  bad_zip.write_bytes(b"garbage")
  with pytest.raises(ValueError, match="corrupted"):
    load_digits(bad_zip)
  short = tmp_path / "short.npz"
  np.savez(short, x=np.zeros((10, 8, 8), np.uint8), y=np.zeros(10, np.uint8))
  with pytest.raises(ValueError, match="corrupted.*shape"):
    load_digits(short)
  bright = tmp_path / "bright.npz"
  x, y = load_digits()
  raw = (x * 16).astype(np.uint8)
  raw[0, 0, 0] = 200
  np.savez(bright, x=raw, y=y.astype(np.uint8))
  with pytest.raises(ValueError, match="pixel values"):
    load_digits(bright)
  with pytest.raises(ValueError, match="missing"):
    load_digits(tmp_path / "absent.npz")


# --- reduce_classes ------------------------------------------------------------------------------


def test_reduce_classes_keeps_round_half_up_of_reduced_classes_and_all_others():
  # Class sizes chosen so that floor and round-half-up differ: 0.2 * 13 = 2.6 -> 3, 0.2 * 12.5..
  sizes = {0: 10, 1: 13, 2: 7, 3: 178, 4: 174}
  labels = np.concatenate([np.full(n, c) for c, n in sizes.items()])
  labels = np.random.default_rng(0).permutation(labels)
  kept = reduce_classes(labels, [1, 2, 4], 0.2, seed=3)
  assert kept.dtype == np.int64 and np.all(np.diff(kept) > 0)
  counts = np.bincount(labels[kept], minlength=5)
  # round half up: 13 * 0.2 = 2.6 -> 3 (floor would give 2); 7 * 0.2 = 1.4 -> 1; 174 -> 34.8 -> 35.
  assert counts.tolist() == [10, 3, 1, 178, 35]
  # Exact halves round up (0.5 * 7 = 3.5 -> 4) and float error does not flip them.
  assert np.bincount(labels[reduce_classes(labels, [2], 0.5, seed=0)])[2] == 4
  assert 0.58 * 25 < 14.5  # float error: the exact product is 14.5, which rounds up to 15
  twenty_five = np.repeat([0, 1], [25, 5])
  assert np.bincount(twenty_five[reduce_classes(twenty_five, [0], 0.58, seed=0)])[0] == 15
  # Every unreduced row is kept.
  assert set(np.flatnonzero(np.isin(labels, [0, 3]))) <= set(kept.tolist())


def test_reduce_classes_is_deterministic_per_seed():
  labels = np.repeat(np.arange(10), 50)
  a = reduce_classes(labels, (5, 6, 7, 8, 9), 0.2, seed=1)
  b = reduce_classes(labels, (5, 6, 7, 8, 9), 0.2, seed=1)
  c = reduce_classes(labels, (5, 6, 7, 8, 9), 0.2, seed=2)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c) and a.size == c.size == 250 + 5 * 10
  np.testing.assert_array_equal(reduce_classes(labels, [3], 1.0, seed=0), np.arange(500))


@pytest.mark.parametrize(
  "labels, classes, fraction, error, match",
  [
    (np.zeros((2, 2), int), [0], 0.2, ValueError, "labels"),
    (np.zeros(4), [0], 0.2, TypeError, "labels"),
    (np.zeros(4, int), [], 0.2, ValueError, "classes"),
    (np.zeros(4, int), 0, 0.2, TypeError, "classes"),
    (np.zeros(4, int), [0.5], 0.2, TypeError, "classes"),
    (np.zeros(4, int), [7], 0.2, ValueError, "classes"),
    (np.zeros(4, int), [0, 0], 0.2, ValueError, "classes"),
    (np.zeros(4, int), [0], 0.0, ValueError, "fraction"),
    (np.zeros(4, int), [0], 1.5, ValueError, "fraction"),
    (np.zeros(4, int), [0], float("nan"), ValueError, "fraction"),
    (np.zeros(4, int), [0], "0.2", TypeError, "fraction"),
  ],
)
def test_reduce_classes_rejects_bad_arguments(labels, classes, fraction, error, match):
  with pytest.raises(error, match=match):
    reduce_classes(labels, classes, fraction, seed=0)


# --- proportions and class-weighted accuracy -----------------------------------------------------


def test_label_proportions_rows_sum_to_one():
  p = label_proportions([np.array([0, 0, 1, 2]), np.array([2]), np.array([1, 1])], 4)
  assert p.dtype == np.float64 and p.shape == (3, 4)
  np.testing.assert_allclose(p.sum(1), 1.0)
  np.testing.assert_allclose(p[0], [0.5, 0.25, 0.25, 0.0])
  np.testing.assert_allclose(p[1], [0, 0, 1, 0])
  with pytest.raises(ValueError, match=r"labels_per_client\[1\]"):
    label_proportions([np.array([0]), np.array([4])], 4)
  with pytest.raises(ValueError, match=r"labels_per_client\[0\] is empty"):
    label_proportions([np.array([], int)], 4)


def test_class_weighted_accuracy_matches_hand_computation():
  acc = np.array([1.0, 0.5, 0.0])
  props = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.4, 0.4]])
  # 1.0; 0.5*1 + 0.5*0.5 = 0.75; 0.2*1 + 0.4*0.5 + 0.4*0 = 0.4.
  np.testing.assert_allclose(class_weighted_accuracy(acc, props), [1.0, 0.75, 0.4])
  with pytest.raises(ValueError, match="sum to 1"):
    class_weighted_accuracy(acc, [[0.5, 0.0, 0.0]])
  with pytest.raises(ValueError, match="proportions must be"):
    class_weighted_accuracy(acc, [[0.5, 0.5]])
  with pytest.raises(ValueError, match="per_class_accuracy"):
    class_weighted_accuracy([1.5, 0.0, 0.0], props)


# --- digits_dirichlet ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_03():
  return digits_dirichlet_with_extras(0)


def test_digits_dirichlet_layout_and_every_train_row_once(digits_03):
  ds, extras = digits_03
  assert isinstance(ds, FederatedDataset) and isinstance(extras, DigitsExtras)
  assert ds.name == "digits-dirichlet" and ds.task == "classification" and ds.num_classes == 10
  assert ds.train.num_clients == ds.test.num_clients == 100
  assert ds.train.feature_shape == (8, 8) and ds.train.x.dtype == np.float32
  mask = np.asarray(ds.train.mask)
  train_x, train_y = np.asarray(ds.train.x)[mask], np.asarray(ds.train.y)[mask]
  x, y = load_digits()
  # Each pooled image is identified by its bytes (digits has a few exact duplicates: use counts).
  key = lambda imgs, labels: sorted(
    zip(map(bytes, (imgs * 16).astype(np.uint8).reshape(len(imgs), -1)), labels.tolist())
  )
  pooled = key(x, y)
  used = key(np.concatenate([train_x, extras.test_x]), np.concatenate([train_y, extras.test_y]))
  # train + test rows are a sub-multiset of the pooled images: no image is used twice (across
  # clients or across the splits); with the per-class counts below, every kept row is used once.
  assert not Counter(used) - Counter(pooled)
  # Stratified balanced test: round(0.3 * n_c) per class.
  assert np.bincount(extras.test_y).tolist() == [
    int(round(0.3 * n)) for n in np.bincount(y).tolist()
  ]
  # The train rows are exactly the non-test rows after reduction: the unreduced classes lose
  # nothing, so their train counts are n_c - test_c.
  train_counts = np.bincount(train_y, minlength=10)
  test_counts = np.bincount(extras.test_y, minlength=10)
  full = np.bincount(y) - test_counts
  np.testing.assert_array_equal(train_counts[:5], full[:5])
  # Reduced classes keep round-half-up(20%) of their train rows.
  np.testing.assert_array_equal(train_counts[5:], np.floor(0.2 * full[5:] + 0.5).astype(int))
  assert np.all(np.abs(train_counts[5:] / train_counts[:5].mean() - 0.2) < 0.03)
  # Proportions are the clients' exact train label frequencies.
  labels = [np.asarray(ds.train.y)[i, : int(ds.train.num_examples[i])] for i in range(100)]
  np.testing.assert_allclose(extras.proportions, label_proportions(labels, 10))


def test_digits_dirichlet_test_sets_follow_client_classes(digits_03):
  ds, extras = digits_03
  nex = np.asarray(ds.test.num_examples)
  assert nex.max() <= 64 and nex.min() >= 1
  for i in range(ds.num_clients):
    held = set(np.flatnonzero(extras.proportions[i] > 0).tolist())
    test_labels = set(np.asarray(ds.test.y)[i, : nex[i]].tolist())
    assert test_labels <= held
  # Every client test row is an (image, label) pair of the pooled test set (x and y stay paired).
  pooled = {
    (bytes((img * 16).astype(np.uint8)), int(label))
    for img, label in zip(extras.test_x, extras.test_y)
  }
  for i in range(ds.num_clients):
    rows = [
      (bytes((np.asarray(ds.test.x[i, k]) * 16).astype(np.uint8)), int(ds.test.y[i, k]))
      for k in range(nex[i])
    ]
    assert set(rows) <= pooled


def test_digits_dirichlet_is_seeded_and_alpha_controls_skew(digits_03):
  ds, extras = digits_03
  again = digits_dirichlet(0)
  np.testing.assert_array_equal(np.asarray(again.train.y), np.asarray(ds.train.y))
  np.testing.assert_array_equal(np.asarray(again.test.x), np.asarray(ds.test.x))
  other = digits_dirichlet(1)
  assert not np.array_equal(np.asarray(other.train.num_examples), np.asarray(ds.train.num_examples))
  _, mild = digits_dirichlet_with_extras(0, alpha=10.0)
  concentrated = extras.proportions.max(1).mean()
  spread = mild.proportions.max(1).mean()
  assert concentrated > spread + 0.15, (concentrated, spread)


@pytest.mark.parametrize(
  "kwargs, error, match",
  [
    (dict(num_clients=0), ValueError, "num_clients"),
    (dict(alpha=0.0), ValueError, "alpha"),
    (dict(fraction=0.0), ValueError, "fraction"),
    (dict(test_fraction=1.0), ValueError, "test_fraction"),
    (dict(reduced_classes=(10,)), ValueError, "reduced_classes"),
    (dict(reduced_classes=5), TypeError, "reduced_classes"),
  ],
)
def test_digits_dirichlet_rejects_bad_arguments(kwargs, error, match):
  with pytest.raises(error, match=match):
    digits_dirichlet(0, **kwargs)


# --- load_npz ------------------------------------------------------------------------------------


def _write_npz(path, **arrays):
  np.savez(path, **arrays)
  return path


def test_load_npz_round_trip(tmp_path):
  x = np.arange(24, dtype=np.float32).reshape(6, 2, 2)
  y = np.array([0, 1, 2, 1, 0, 2], np.int64)
  cid = np.array([1, 0, 1, 0, 2, 1])
  path = _write_npz(tmp_path / "fed.npz", x=x, y=y, client_id=cid)
  data = load_npz(path)
  assert isinstance(data, FederatedData) and data.num_clients == 3
  assert data.num_examples.tolist() == [2, 3, 1] and data.y.dtype == np.int32
  np.testing.assert_array_equal(np.asarray(data.y[1, :3]), [0, 2, 2])
  np.testing.assert_array_equal(np.asarray(data.x[0, :2]), x[[1, 3]])
  # Custom keys and an explicit num_clients.
  path2 = _write_npz(tmp_path / "keys.npz", feats=x, labels=y, owner=np.array([0, 0, 1, 1, 2, 2]))
  data2 = load_npz(path2, x_key="feats", y_key="labels", client_key="owner", num_clients=3)
  assert data2.num_examples.tolist() == [2, 2, 2]


def _good():
  return dict(
    x=np.zeros((4, 3), np.float32), y=np.array([0, 1, 0, 1]), client_id=np.array([0, 0, 1, 1])
  )


def _malformed(name):
  """(writer(path), error, match) for each malformed npz case."""
  good = _good()

  def write(**overrides):
    def writer(path):
      arrays = {**good, **overrides}
      np.savez(path, **{k: v for k, v in arrays.items() if v is not None})

    return writer

  def not_zip(path):
    with open(path, "wb") as f:
      f.write(b"this is not an npz")

  def npy_file(path):
    with open(path, "wb") as f:
      np.save(f, np.zeros(3))

  def zip_of_text(path):
    with zipfile.ZipFile(path, "w") as z:
      for key in ("x", "y", "client_id"):
        z.writestr(f"{key}.npy", "not an array")

  obj = np.empty(4, object)
  obj[:] = [[1.0], [2.0, 3.0], [4.0], [5.0]]
  cases = {
    "missing_key": (write(y=None), ValueError, r"key 'y'"),
    "object_array": (write(x=obj), TypeError, r"key 'x'.*pickle"),
    "label_negative": (write(y=np.array([0, -1, 0, 1])), ValueError, r"key 'y'"),
    "label_float": (write(y=np.array([0.0, 1.0, 0.0, 1.0])), TypeError, r"key 'y'.*integers"),
    "length_mismatch": (write(y=np.array([0, 1, 0])), ValueError, r"key 'y'.*lengths must agree"),
    "client_length": (write(client_id=np.array([0, 1])), ValueError, r"key 'client_id'"),
    "not_zip": (not_zip, ValueError, r"not a valid \.npz"),
    "npy_not_npz": (npy_file, ValueError, r"not a valid \.npz"),
    "zip_not_npz": (zip_of_text, ValueError, r"key 'x'.*cannot read"),
    "negative_client": (write(client_id=np.array([0, -1, 1, 1])), ValueError, r"'client_id'.*>= 0"),
    "client_float": (write(client_id=np.array([0.0, 0, 1, 1])), TypeError, r"'client_id'"),
    "string_x": (write(x=np.array(["a", "b", "c", "d"])), TypeError, r"key 'x'"),
    "nan_x": (write(x=np.full((4, 3), np.nan)), ValueError, r"key 'x'.*NaN"),
    "empty": (
      write(x=np.zeros((0, 3)), y=np.zeros(0, int), client_id=np.zeros(0, int)),
      ValueError,
      r"key 'x'.*non-empty",
    ),
    "y_2d": (write(y=np.zeros((4, 1), int)), ValueError, r"key 'y'.*1-D"),
  }
  return cases[name]


MALFORMED_NPZ = [
  "missing_key",
  "object_array",
  "label_negative",
  "label_float",
  "length_mismatch",
  "client_length",
  "not_zip",
  "npy_not_npz",
  "zip_not_npz",
  "negative_client",
  "client_float",
  "string_x",
  "nan_x",
  "empty",
  "y_2d",
]


@pytest.mark.parametrize("case", MALFORMED_NPZ)
def test_load_npz_rejects_malformed_files(tmp_path, case):
  writer, error, match = _malformed(case)
  path = tmp_path / f"{case}.npz"
  writer(path)
  with pytest.raises(error, match=match) as info:
    load_npz(path)
  assert str(path) in str(info.value)


def test_load_npz_client_range_and_missing_file(tmp_path):
  path = _write_npz(tmp_path / "ok.npz", **_good())
  with pytest.raises(ValueError, match=r"'client_id'.*out of range"):
    load_npz(path, num_clients=1)
  with pytest.raises(ValueError, match=r"clients \[2\] own no rows"):
    load_npz(path, num_clients=3)
  with pytest.raises(FileNotFoundError, match="absent.npz"):
    load_npz(tmp_path / "absent.npz")
  with pytest.raises(ValueError, match=r"no key 'labels'"):
    load_npz(path, y_key="labels")


# --- load_leaf_json ------------------------------------------------------------------------------


def _leaf_doc():
  return {
    "users": ["f_0001", "f_0002"],
    "num_samples": [2, 3],
    "user_data": {
      "f_0001": {"x": [[0.0, 0.5, 1.0, 0.25], [1.0, 1.0, 0.0, 0.0]], "y": [3, 7]},
      "f_0002": {"x": [[0.1, 0.2, 0.3, 0.4]] * 3, "y": [0, 1, 61]},
    },
  }


def _write_json(path, doc):
  path.write_text(json.dumps(doc))
  return path


def test_load_leaf_json_round_trip_file_and_directory(tmp_path):
  path = _write_json(tmp_path / "a.json", _leaf_doc())
  data, users = load_leaf_json(path, num_classes=62, feature_shape=(2, 2))
  assert users == ["f_0001", "f_0002"]
  assert data.x.shape == (2, 3, 2, 2) and data.x.dtype == np.float32 and data.y.dtype == np.int32
  assert data.num_examples.tolist() == [2, 3]
  np.testing.assert_allclose(np.asarray(data.x[0, 0]), [[0.0, 0.5], [1.0, 0.25]])
  np.testing.assert_array_equal(np.asarray(data.y[1, :3]), [0, 1, 61])
  # A directory merges its *.json files in sorted name order.
  d = tmp_path / "dir"
  d.mkdir()
  _write_json(
    d / "b.json",
    {"users": ["u9"], "num_samples": [1], "user_data": {"u9": {"x": [[1, 2, 3, 4]], "y": [5]}}},
  )
  _write_json(d / "a.json", _leaf_doc())
  (d / "notes.txt").write_text("ignored")
  data, users = load_leaf_json(d)
  assert users == ["f_0001", "f_0002", "u9"] and data.feature_shape == (4,)
  assert int(data.y[2, 0]) == 5


def _leaf_variant(name):
  doc = _leaf_doc()
  if name == "missing_users":
    del doc["users"]
    return doc, ValueError, r"no key 'users'"
  if name == "num_samples_mismatch":
    doc["num_samples"] = [2, 4]
    return doc, ValueError, r"user 'f_0002'.*num_samples says 4"
  if name == "num_samples_length":
    doc["num_samples"] = [2]
    return doc, ValueError, r"'num_samples' has 1"
  if name == "ragged_x":
    doc["user_data"]["f_0001"]["x"][1] = [1.0, 1.0]
    return doc, ValueError, r"user 'f_0001'.*ragged"
  if name == "ragged_across_users":
    doc["user_data"]["f_0002"]["x"] = [[0.1, 0.2]] * 3
    return doc, ValueError, r"user 'f_0002'.*same length"
  if name == "bad_label":
    doc["user_data"]["f_0002"]["y"] = [0, 1, 62]
    return doc, ValueError, r"user 'f_0002'.*label 62.*out of range"
  if name == "float_label":
    doc["user_data"]["f_0001"]["y"] = [3, 7.5]
    return doc, TypeError, r"user 'f_0001'.*not an integer"
  if name == "duplicate_user":
    doc["users"] = ["f_0001", "f_0001"]
    del doc["user_data"]["f_0002"]
    return doc, ValueError, r"duplicate user 'f_0001'"
  if name == "string_x":
    doc["user_data"]["f_0001"] = {
      "x": ["to be or not to be", "that is the question"],
      "y": ["a", "b"],
    }
    return doc, TypeError, r"user 'f_0001'.*tokenizer"
  if name == "xy_length":
    doc["user_data"]["f_0001"]["y"] = [3]
    return doc, ValueError, r"user 'f_0001'.*'y' has 1"
  if name == "null_feature":
    doc["user_data"]["f_0001"]["x"][0][0] = None
    return doc, ValueError, r"user 'f_0001'.*null"
  raise AssertionError(name)


LEAF_VARIANTS = [
  "missing_users",
  "num_samples_mismatch",
  "num_samples_length",
  "ragged_x",
  "ragged_across_users",
  "bad_label",
  "float_label",
  "duplicate_user",
  "string_x",
  "xy_length",
  "null_feature",
]


@pytest.mark.parametrize("case", LEAF_VARIANTS)
def test_load_leaf_json_rejects_malformed_files(tmp_path, case):
  doc, error, match = _leaf_variant(case)
  path = _write_json(tmp_path / f"{case}.json", doc)
  with pytest.raises(error, match=match) as info:
    load_leaf_json(path, num_classes=62)
  assert str(path) in str(info.value)


def test_load_leaf_json_duplicate_user_across_files_invalid_json_and_shape(tmp_path):
  d = tmp_path / "dup"
  d.mkdir()
  _write_json(d / "a.json", _leaf_doc())
  _write_json(d / "b.json", _leaf_doc())
  with pytest.raises(ValueError, match=r"b\.json.*duplicate user 'f_0001'.*a\.json"):
    load_leaf_json(d)
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  with pytest.raises(ValueError, match=r"bad\.json.*not valid JSON"):
    load_leaf_json(bad)
  with pytest.raises(ValueError, match=r"feature_shape=\(3, 3\)"):
    load_leaf_json(_write_json(tmp_path / "ok.json", _leaf_doc()), feature_shape=(3, 3))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ValueError, match="no \\*.json files"):
    load_leaf_json(empty)
  with pytest.raises(FileNotFoundError):
    load_leaf_json(tmp_path / "absent.json")


def _hostile(fn, timeout_s=60, memory_gb=None):
  """Runs ``fn`` in a forked child under a CPU-time limit (and an address-space limit when
  ``memory_gb`` is given), so a regression fails the test instead of swapping or hanging;
  returns ``(exception type name, message)`` of what ``fn`` raised (None if nothing)."""
  import multiprocessing
  import resource

  def child(conn):
    resource.setrlimit(resource.RLIMIT_CPU, (timeout_s, timeout_s))
    if memory_gb is not None:
      used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
      limit = int(used + memory_gb * 2**30)
      resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
      fn()
      conn.send(None)
    except BaseException as e:  # the test asserts which
      conn.send((type(e).__name__, str(e)[:500]))

  ctx = multiprocessing.get_context("fork")
  parent, kid = ctx.Pipe()
  proc = ctx.Process(target=child, args=(kid,))
  proc.start()
  proc.join(timeout_s + 30)
  if proc.is_alive():
    proc.kill()
    raise AssertionError(f"still running after {timeout_s + 30} s")
  assert parent.poll(), f"the reader died (exit code {proc.exitcode}): over its limits?"
  return parent.recv()


def test_leaf_hostile_files_are_refused_in_bounded_time_and_memory(tmp_path):
  """LEAF files nested 200,000 and 50,000 levels deep, one of 90 MB of empty lists (parsed, 1.7
  GB of Python lists: over the 1 GiB the reader runs under here), and labels of 1e9 (in a LEAF
  file and a features file): each refused with one ValueError naming the file."""
  from fedjax_dro.data import load_leaf_json
  from fedjax_dro.data.user_files import load_features, write_features

  with pytest.raises(ValueError, match="implies 1000000001 classes"):  # nor written
    write_features(str(tmp_path / "w.npz"), np.zeros((3, 2)), np.array([0, 1, 10**9]))

  deep = tmp_path / "deep.json"  # more arrays than a LEAF file of its size can hold
  deep.write_text('{"users": ["u"], "num_samples": [1], "user_data": {"u": {"x": ' + "[" * 200_000)
  nested = tmp_path / "nested.json"  # few arrays, nested deeper than the JSON reader goes
  nested.write_text(
    '{"users": ["u"], "num_samples": [1], "user_data": {"u": {"x": ' + "[" * 50_000 + "]" * 50_000
  )
  empties = tmp_path / "empties.json"
  with open(empties, "w") as f:
    f.write('{"users": ["u"], "num_samples": [1], "user_data": {"u": {"x": [[')
    f.write("[]," * 30_000_000 + "[]]], " + '"y": [0]}}}')  # 90 MB: ~1.7 GB parsed
  big_label = tmp_path / "label.json"
  big_label.write_text(
    json.dumps(
      {
        "users": ["u"],
        "num_samples": [2],
        "user_data": {"u": {"x": [[0.0], [1.0]], "y": [0, 10**9]}},
      }
    )
  )
  for path, fragment in [
    (deep, "200005 JSON arrays and objects"),
    (nested, "nested too deeply"),
    (empties, "JSON arrays and objects"),
    (big_label, "label 1000000000 implies 1000000001 classes"),
  ]:
    got = _hostile(lambda p=path: load_leaf_json(str(p)), memory_gb=1)
    assert got is not None and got[0] == "ValueError", got
    assert str(path) in got[1] and fragment in got[1], got
  features = tmp_path / "features.npz"
  np.savez(features, features=np.zeros((3, 2)), labels=np.array([0, 1, 10**9]))
  got = _hostile(lambda: load_features(str(features)), memory_gb=2)
  assert got is not None and got[0] == "ValueError", got
  assert "'labels'" in got[1] and "implies 1000000001 classes" in got[1], got


def test_leaf_rows_of_lists_are_refused():
  """x rows must be flat lists of numbers: rows of lists (here of empty lists) are refused."""
  import tempfile

  from fedjax_dro.data import load_leaf_json

  doc = {"users": ["u"], "num_samples": [1], "user_data": {"u": {"x": [[[], []]], "y": [0]}}}
  with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump(doc, f)
  with pytest.raises(ValueError, match="x rows must be flat lists of numbers"):
    load_leaf_json(f.name)
