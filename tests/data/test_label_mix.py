"""``rows_with_label_mix``: a client's evaluation set drawn from a pool with its label mix; the
counts are the largest-remainder rounding of ``size * p``, every row is of its class, and a class
smaller than its count is used as evenly as possible."""

import numpy as np
import pytest

from fedjax_dro.data.partition import rows_with_label_mix


def test_counts_classes_and_even_reuse():
  labels = np.array([0] * 5 + [1] * 3 + [2] * 7 + [3] * 4)
  p = np.array([0.5, 0.25, 0.0, 0.25])
  rows = rows_with_label_mix(labels, p, 30, seed=1)
  assert rows.shape == (30,) and rows.dtype == np.int64
  # 30 p = (15, 7.5, 0, 7.5): floors (15, 7, 0, 7), the one left over to the first largest
  # remainder, class 1
  np.testing.assert_array_equal(np.bincount(labels[rows], minlength=4), [15, 8, 0, 7])
  for c, pool in ((0, 5), (1, 3), (3, 4)):
    used = np.bincount(rows[labels[rows] == c], minlength=labels.size)[labels == c]
    k = int(np.sum(labels[rows] == c))
    assert used.sum() == k and used.max() - used.min() <= 1 and used.min() == k // pool
  # unnormalized weights give the same counts; another seed reorders within classes only
  again = rows_with_label_mix(labels, 4 * p, 30, seed=1)
  np.testing.assert_array_equal(again, rows)
  other = rows_with_label_mix(labels, p, 30, seed=2)
  np.testing.assert_array_equal(np.sort(labels[other]), np.sort(labels[rows]))
  # the set's accuracy under a per-class accuracy is sum_c p_c acc_c when the counts divide
  acc = np.array([0.9, 0.4, 0.1, 0.6])
  rows = rows_with_label_mix(labels, p, 400, seed=0)
  assert np.mean(acc[labels[rows]]) == pytest.approx(p @ acc)


def test_bad_inputs():
  labels = np.array([0, 0, 1, 1])
  with pytest.raises(ValueError, match="no rows"):
    rows_with_label_mix(labels, [0.5, 0.0, 0.5], 4)
  with pytest.raises(ValueError, match="proportions"):
    rows_with_label_mix(labels, [0.0, 0.0], 4)
  with pytest.raises(ValueError, match="proportions"):
    rows_with_label_mix(labels, [-0.5, 1.5], 4)
  with pytest.raises(ValueError, match="size"):
    rows_with_label_mix(labels, [0.5, 0.5], 0)
  with pytest.raises(ValueError, match="labels"):
    rows_with_label_mix([0.5, 1.0], [0.5, 0.5], 2)


def test_printing_data_shows_shapes_not_arrays():
  from fedjax_dro.data import get_dataset

  ds = get_dataset("synthetic-ridge").load(0)
  text = repr(ds)
  assert len(text) < 400 and "array(" not in text and "30 clients" in text
  assert repr(ds.train) == (
    f"FederatedData(x={ds.train.x.dtype}{list(ds.train.x.shape)}, "
    f"y={ds.train.y.dtype}{list(ds.train.y.shape)}, "
    f"{int(np.sum(ds.train.num_examples))} valid rows)"
  )
