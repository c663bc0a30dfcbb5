import numpy as np
import pytest

from fedjax_dro.data import (
  dirichlet_partition,
  from_arrays,
  from_client_arrays,
  synthetic_classification,
  synthetic_ridge,
  synthetic_shift,
  train_test_split,
)


def test_from_client_arrays_pads_with_prefix_masks():
  xs = [np.ones((2, 3)), 2 * np.ones((5, 3))]
  ys = [np.zeros(2), np.ones(5)]
  data = from_client_arrays(xs, ys)
  assert data.x.shape == (2, 5, 3) and data.mask.tolist() == [[1, 1, 0, 0, 0], [1] * 5]
  assert data.num_examples.tolist() == [2, 5]
  assert float(data.x[0, 2:].sum()) == 0.0


def test_from_arrays_groups_rows_by_client_in_order():
  x = np.arange(12.0).reshape(6, 2)
  y = np.arange(6)
  cid = np.array([1, 0, 1, 0, 2, 1])
  data = from_arrays(x, y, cid)
  assert data.num_examples.tolist() == [2, 3, 1]
  np.testing.assert_array_equal(np.asarray(data.y[1, :3]), [0, 2, 5])
  np.testing.assert_array_equal(np.asarray(data.x[0, :2]), x[[1, 3]])


def test_max_examples_cap_subsamples():
  data = from_client_arrays([np.arange(20.0).reshape(10, 2)], [np.arange(10)], max_examples=4)
  assert data.num_examples.tolist() == [4]
  assert len(set(np.asarray(data.y[0]).tolist())) == 4


def test_train_test_split_keeps_all_rows_once():
  data = from_client_arrays(
    [np.arange(20.0).reshape(10, 2), np.arange(8.0).reshape(4, 2)], [np.arange(10), np.arange(4)]
  )
  tr, te = train_test_split(data, 0.3, seed=1)
  for i, n in enumerate([10, 4]):
    rows = sorted(
      np.asarray(tr.y[i, : int(tr.num_examples[i])]).tolist()
      + np.asarray(te.y[i, : int(te.num_examples[i])]).tolist()
    )
    assert rows == list(range(n))
  assert te.num_examples.tolist() == [3, 1]


def test_dirichlet_partition_is_a_partition_with_skew():
  labels = np.repeat(np.arange(5), 200)
  parts = dirichlet_partition(labels, 10, alpha=0.1, seed=0)
  all_rows = np.sort(np.concatenate(parts))
  np.testing.assert_array_equal(all_rows, np.arange(1000))
  # Small alpha: most clients are dominated by one class.
  dominance = [np.max(np.bincount(labels[p], minlength=5)) / len(p) for p in parts]
  assert np.median(dominance) > 0.6
  iid = dirichlet_partition(labels, 10, alpha=1000.0, seed=0)
  assert max(np.max(np.bincount(labels[p], minlength=5)) / len(p) for p in iid) < 0.35


def test_synthetic_ridge_matches_the_paper_setting():
  ds = synthetic_ridge(3)
  assert ds.num_clients == 30 and ds.train.x.shape[-1] == 50
  nex = np.asarray(ds.train.num_examples)
  assert nex.min() >= 10 and nex.max() <= 100
  group_means = [ds.true_params[g * 10 : (g + 1) * 10].mean() for g in range(3)]
  np.testing.assert_allclose(group_means, [1.0, 1.5, 2.0], atol=0.02)
  again = synthetic_ridge(3)
  np.testing.assert_array_equal(np.asarray(ds.train.x), np.asarray(again.train.x))
  # group-wise feature distributions N(0 / 0.2 / 0.4, 1), train and test alike
  for split in (ds.train, ds.test):
    x, mask = np.asarray(split.x), np.asarray(split.mask).astype(bool)
    rows = [np.concatenate([x[i][mask[i]] for i in range(g * 10, (g + 1) * 10)]) for g in range(3)]
    np.testing.assert_allclose([r.mean() for r in rows], [0.0, 0.2, 0.4], atol=0.03)
    np.testing.assert_allclose([r.std() for r in rows], [1.0, 1.0, 1.0], atol=0.03)


def test_synthetic_ridge_equal_means_dataset_keeps_zero_mean_features():
  from fedjax_dro.data import get_dataset
  from fedjax_dro.data.synthetic import EQUAL_MEANS_SETTING

  ds = get_dataset("synthetic-ridge-equal-means").load(3)
  direct = synthetic_ridge(3, **EQUAL_MEANS_SETTING)
  np.testing.assert_array_equal(np.asarray(ds.train.y), np.asarray(direct.train.y))
  x, mask = np.asarray(ds.train.x), np.asarray(ds.train.mask).astype(bool)
  rows = [np.concatenate([x[i][mask[i]] for i in range(g * 10, (g + 1) * 10)]) for g in range(3)]
  np.testing.assert_allclose([r.mean() for r in rows], [0.0, 0.0, 0.0], atol=0.03)
  np.testing.assert_allclose([r.std() for r in rows], [1.0, 1.5, 0.75], atol=0.04)
  # keyword arguments still override the setting
  noisy = get_dataset("synthetic-ridge-equal-means").load(3, noise_std=0.0)
  np.testing.assert_allclose(
    np.asarray(noisy.train.y)[0, :5],
    np.asarray(noisy.train.x)[0, :5] @ noisy.true_params[0],
    rtol=1e-4,
    atol=1e-4,
  )


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"feature_means": (0.0, 1.0)}, "feature_means must be 3 finite numbers"),
    ({"group_means": "abc"}, "group_means must be 3 finite numbers"),
    ({"feature_stds": (1.0, float("nan"), 1.0)}, "feature_stds must be 3 finite numbers"),
    ({"feature_stds": (1.0, -1.0, 1.0)}, "feature_stds must be >= 0"),
  ],
)
def test_synthetic_ridge_refuses_bad_group_settings(kwargs, match):
  with pytest.raises(ValueError, match=match):
    synthetic_ridge(0, **kwargs)


def test_synthetic_shift_is_noise_free_linear_with_client_shifts():
  ds = synthetic_shift(0)
  assert ds.train.x.shape == (5, 100, 10)
  x, y = np.asarray(ds.train.x), np.asarray(ds.train.y)
  for i in range(5):
    np.testing.assert_allclose(x[i] @ ds.true_params[i], y[i], atol=1e-4)
  assert np.std(ds.true_params, axis=0).mean() > 0.1  # concept shift between clients


def test_synthetic_classification_labels_and_split():
  ds = synthetic_classification(0, num_clients=6, num_classes=3)
  assert ds.num_classes == 3 and ds.train.num_clients == ds.test.num_clients == 6
  assert set(np.unique(np.asarray(ds.train.y)[np.asarray(ds.train.mask)])) <= {0, 1, 2}


def test_heart_disease_matches_flamby_preprocessing():
  from fedjax_dro.data.heart_disease import heart_disease

  ds = heart_disease(0)
  tr, te = np.asarray(ds.train.num_examples), np.asarray(ds.test.num_examples)
  assert tr.sum() + te.sum() == 740  # FLamby: 740 rows
  np.testing.assert_array_equal(
    tr + te, [303, 261, 46, 130]
  )  # per-center sizes after dropping NaN rows
  assert ds.train.x.shape[-1] == 13
  np.testing.assert_allclose(te / (tr + te), 0.34, atol=0.02)
  pooled = np.asarray(ds.train.x)[np.asarray(ds.train.mask)]
  np.testing.assert_allclose(pooled.mean(0), 0.0, atol=1e-6)
