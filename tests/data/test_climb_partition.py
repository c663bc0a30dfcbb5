"""The class imbalance and Dirichlet split of the code released with Shen et al. (ICLR 2021),
which FGDRO's Appendix G uses: against a line-by-line transcription of that code (its
``create_imbalance`` and ``split_dataset``'s ``"dir"`` branch, with the unseeded global
generators replaced by one seeded ``RandomState``) on fixed label vectors, and its properties."""

import numpy as np
import pytest

from fedjax_dro.data.partition import (
  CLIMB_MINORITY_CLASSES,
  climb_dirichlet_partition,
  climb_imbalance,
)


def _released_split(label, n_workers, dir_level, n_cls, rs):
  """utils/data_utils.py, split_dataset, heterogeneity == 'dir' (np.random -> rs)."""
  n_data = label.shape[0]
  cls_priors = rs.dirichlet(alpha=[dir_level] * n_cls, size=n_workers)
  prior_cumsum = np.cumsum(cls_priors, axis=1)
  idx_list = [np.where(label == i)[0] for i in range(n_cls)]
  cls_amount = [len(idx_list[i]) for i in range(n_cls)]
  idx_worker = [[] for _ in range(n_workers)]
  for curr_worker in range(n_workers):
    for _ in range(n_data // n_workers):
      curr_prior = prior_cumsum[curr_worker]
      cls_label = np.argmax(rs.uniform() <= curr_prior)
      while cls_amount[cls_label] <= 0:
        correction = [[1 - cls_priors[i, cls_label]] * n_cls for i in range(n_workers)]
        cls_priors = cls_priors / correction
        cls_priors[:, cls_label] = [0] * n_workers
        curr_prior = np.cumsum(cls_priors, axis=1)
        cls_label = np.argmax(rs.uniform() <= curr_prior)
      cls_amount[cls_label] -= 1
      idx_worker[curr_worker] = idx_worker[curr_worker] + [idx_list[cls_label][0]]
      idx_list[cls_label] = idx_list[cls_label][1::]
  return idx_worker


def _released_imbalance(label, reduce_classes, reduce_to_ratio, rs):
  """utils/data_utils.py, create_imbalance (torch.randperm -> rs.permutation); the indices."""
  index = np.arange(label.shape[0])
  reduce_mask = np.isin(label, reduce_classes)
  index_reduce = index[reduce_mask]
  index_reduce = index_reduce[: max(1, int(index_reduce.shape[0] * reduce_to_ratio))]
  order = np.concatenate([index_reduce, index[~reduce_mask]], axis=0)
  return order[rs.permutation(order.shape[0])]


def _labels(seed=0, per_class=(30, 12, 30, 12, 30, 12, 30, 12, 30, 13)):
  rng = np.random.default_rng(seed)
  return rng.permutation(np.repeat(np.arange(10), per_class))  # 211 rows, classes interleaved


@pytest.mark.parametrize("alpha", [0.3, 10.0])
@pytest.mark.parametrize("seed", [0, 7])
def test_split_equals_the_released_code(alpha, seed):
  labels = _labels(seed)
  ours = climb_dirichlet_partition(labels, 10, alpha, num_classes=10, seed=seed)
  theirs = _released_split(labels, 10, alpha, 10, np.random.RandomState(seed))
  assert [list(p) for p in ours] == [[int(i) for i in p] for p in theirs]


def test_imbalance_equals_the_released_code():
  labels = _labels(3)
  classes = CLIMB_MINORITY_CLASSES[5]
  ours = climb_imbalance(labels, classes, 0.2, seed=4)
  theirs = _released_imbalance(labels, list(classes), 0.2, np.random.RandomState(4))
  np.testing.assert_array_equal(ours, theirs)
  kept = labels[ours]
  assert np.sum(np.isin(kept, classes)) == int(0.2 * 150)  # one cut of the pooled 150 rows
  assert np.all(np.bincount(kept, minlength=10)[1::2] == np.bincount(labels)[1::2])


def test_split_properties():
  """Every client gets N // K rows, each row at most once; with N a multiple of K every row is
  assigned; even at alpha = 10 the last clients hold few classes (sequential depletion)."""
  labels = np.repeat(np.arange(4), [50, 50, 10, 10])  # 120 rows, 12 clients of 10
  parts = climb_dirichlet_partition(labels, 12, 10.0, num_classes=4, seed=1)
  assert [len(p) for p in parts] == [10] * 12
  flat = np.concatenate(parts)
  assert np.array_equal(np.sort(flat), np.arange(120))
  first, last = len(set(labels[parts[0]])), len(set(labels[parts[-1]]))
  assert first >= 3 and last <= 2, (first, last)
  uneven = climb_dirichlet_partition(labels[:-3], 12, 0.3, num_classes=4, seed=1)  # 117 rows
  assert [len(p) for p in uneven] == [9] * 12  # 117 - 108 = 9 rows never assigned


def test_bad_inputs():
  labels = _labels()
  with pytest.raises(ValueError, match="alpha must be a finite number > 0"):
    climb_dirichlet_partition(labels, 10, 0.0, num_classes=10, seed=0)
  with pytest.raises(ValueError, match="num_clients must be"):
    climb_dirichlet_partition(labels, 0, 1.0, num_classes=10, seed=0)
  with pytest.raises(ValueError, match="num_classes must exceed"):
    climb_dirichlet_partition(labels, 10, 1.0, num_classes=5, seed=0)
  with pytest.raises(ValueError, match="keep_fraction must be"):
    climb_imbalance(labels, (0,), 1.5, seed=0)
  with pytest.raises(ValueError, match="no row has a label"):
    climb_imbalance(labels, (11,), 0.5, seed=0)
