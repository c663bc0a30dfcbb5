"""The features stand-in's class difficulty: with ``hardness`` the classes differ, checked by a
centralized linear model's per-class accuracy on the held-out rows."""

import numpy as np
import pytest

from fedjax_dro.data.standins import gaussian_mixture_features

SIZES = dict(num_classes=20, dim=64, train_per_class=200, test_per_class=100, separation=3.0)


def _per_class_accuracy(fs):
  """Per-class held-out accuracy of the nearest-class-mean rule, the linear classifier
  ``argmax_c (mu_c . x - ||mu_c||^2 / 2)`` with the training rows' class means."""
  x, y, test = np.asarray(fs.features, np.float64), np.asarray(fs.labels), np.asarray(fs.split)
  mu = np.stack([x[~test & (y == c)].mean(0) for c in range(fs.num_classes)])
  scores = x[test] @ mu.T - 0.5 * np.sum(mu**2, 1)
  hit = np.argmax(scores, 1) == y[test]
  return np.array([hit[y[test] == c].mean() for c in range(fs.num_classes)])


def test_hardness_zero_leaves_the_rows_unchanged():
  a = gaussian_mixture_features(**SIZES, seed=3)
  b = gaussian_mixture_features(**SIZES, hardness=0.0, seed=3)
  np.testing.assert_array_equal(a.features, b.features)
  np.testing.assert_array_equal(a.labels, b.labels)


@pytest.mark.parametrize("seed", [0, 1])
def test_classes_differ_in_difficulty_with_hardness(seed):
  """The mean held-out accuracy of the easiest fifth of the classes (by index) minus that of the
  hardest fifth: below 0.1 with equal classes, above 0.2 with hardness 0.3 and above 0.4 with
  hardness 0.6, where the per-class accuracies span more than 0.5."""

  def gap(hardness):
    acc = _per_class_accuracy(gaussian_mixture_features(**SIZES, hardness=hardness, seed=seed))
    return acc[:4].mean() - acc[-4:].mean(), acc.max() - acc.min()

  assert abs(gap(0.0)[0]) < 0.1
  assert gap(0.3)[0] > 0.2
  hard_gap, span = gap(0.6)
  assert hard_gap > 0.4 and span > 0.5, (hard_gap, span)


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan"), True, "0.5"])
def test_bad_hardness_is_named(bad):
  with pytest.raises(ValueError, match="hardness must be a finite number"):
    gaussian_mixture_features(**SIZES, hardness=bad)
