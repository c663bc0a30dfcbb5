"""split_metrics: sufficient statistics against sklearn / scipy / plain loops, and streaming."""

import math

import numpy as np
import pytest
from scipy.stats import pearsonr
from sklearn.metrics import f1_score

from fedjax_dro.core import split_metrics as sm


def _batches(n, sizes):
  edges = np.cumsum([0, *sizes])
  assert edges[-1] == n
  return [slice(a, b) for a, b in zip(edges[:-1], edges[1:])]


def test_confusion_counts_by_hand_and_padding():
  labels = [0, 2, 1, 2, 9]
  preds = [0, 1, 1, 2, -3]
  c = sm.confusion_counts(labels, preds, 3, weights=[1, 1, 1, 1, 0])
  expected = np.zeros((3, 3), np.int64)
  for t, p in zip(labels[:4], preds[:4]):
    expected[t, p] += 1
  np.testing.assert_array_equal(c, expected)
  assert c.dtype == np.float64  # weighted sums
  c2 = sm.confusion_counts(labels[:4], preds[:4], 3)
  assert c2.dtype == np.int64
  np.testing.assert_array_equal(c2, expected)
  with pytest.raises(ValueError, match="labels"):
    sm.confusion_counts([0, 3], [0, 0], 3)
  assert sm.accuracy_from_confusion(c2) == 3 / 4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_macro_f1_matches_sklearn_over_present_labels(seed):
  rng = np.random.default_rng(seed)
  num_classes = 12
  # labels 3, 7 and 11 absent from the split, but predicted now and then
  y = rng.choice([0, 1, 2, 4, 5, 6, 8, 9, 10], size=200)
  p = np.where(rng.random(200) < 0.6, y, rng.integers(0, num_classes, 200))
  present = np.unique(y)
  expected = f1_score(y, p, average="macro", labels=present)
  got = sm.macro_f1(sm.confusion_counts(y, p, num_classes))
  assert got == pytest.approx(expected, abs=1e-12)
  # streaming: batches summed equal one batch, exactly
  total = sum(sm.confusion_counts(y[s], p[s], num_classes) for s in _batches(200, [7, 93, 1, 99]))
  np.testing.assert_array_equal(total, sm.confusion_counts(y, p, num_classes))
  assert sm.macro_f1(total) == got


def test_macro_f1_edge_cases():
  assert math.isnan(sm.macro_f1(np.zeros((3, 3))))
  # a present label never predicted right: F1 0 for it
  c = sm.confusion_counts([0, 1], [0, 0], 2)
  assert sm.macro_f1(c) == pytest.approx(f1_score([0, 1], [0, 0], average="macro", labels=[0, 1]))


@pytest.mark.parametrize("seed", [0, 1])
def test_pearson_per_group_matches_scipy(seed):
  rng = np.random.default_rng(seed)
  n, num_groups = 300, 4
  g = rng.integers(0, 3, n)  # group 3 empty
  t = rng.normal(size=n) + g
  p = 0.7 * t + rng.normal(scale=0.5 + g, size=n)
  m = sm.moments(t, p, g, num_groups)
  assert m.shape == (num_groups, 6)
  r = sm.pearson_r(m)
  for k in range(3):
    assert r[k] == pytest.approx(pearsonr(t[g == k], p[g == k])[0], abs=1e-10)
  assert math.isnan(r[3])
  assert sm.overall_pearson_r(m) == pytest.approx(pearsonr(t, p)[0], abs=1e-10)
  worst = min(pearsonr(t[g == k], p[g == k])[0] for k in range(3))
  assert sm.worst_group_pearson_r(m) == pytest.approx(worst, abs=1e-10)
  # streaming, with a padded batch whose padding rows carry garbage
  stats = np.zeros((num_groups, 6))
  for s in _batches(n, [50, 1, 249]):
    k = s.stop - s.start
    pad_t = np.concatenate([t[s], [1e6, -1e6]])
    pad_p = np.concatenate([p[s], [3.0, 4.0]])
    pad_g = np.concatenate([g[s], [99, -1]])
    stats += sm.moments(pad_t, pad_p, pad_g, num_groups, weights=[1] * k + [0, 0])
  np.testing.assert_allclose(stats, m, rtol=1e-12, atol=1e-9)
  np.testing.assert_array_equal(stats[:, 0], m[:, 0])  # counts exact


def test_pearson_undefined():
  m = sm.moments([1.0, 2.0, 3.0, 5.0], [2.0, 2.0, 1.0, 7.0], [0, 0, 1, 2], 3)
  r = sm.pearson_r(m)
  assert math.isnan(r[0])  # constant prediction
  assert math.isnan(r[1]) and math.isnan(r[2])  # one row
  assert math.isnan(sm.worst_group_pearson_r(m))
  m2 = sm.moments([5.0] * 4, [1.0, 2.0, 3.0, 4.0], [0] * 4, 1)  # constant target
  assert math.isnan(sm.pearson_r(m2)[0])


def _loop_group_accuracy(correct, groups, num_groups):
  hits, counts = [0] * num_groups, [0] * num_groups
  for c, g in zip(correct, groups):
    counts[g] += 1
    hits[g] += int(c)
  return hits, counts


def test_group_accuracy_and_worst_by_hand():
  rng = np.random.default_rng(3)
  correct = rng.random(97) < 0.7
  groups = rng.integers(0, 4, 97)  # group 4 empty of 5
  hits, counts = sm.group_accuracy(correct, groups, 5)
  e_hits, e_counts = _loop_group_accuracy(correct.tolist(), groups.tolist(), 5)
  assert hits.tolist() == e_hits and counts.tolist() == e_counts
  worst = min(h / c for h, c in zip(e_hits, e_counts) if c > 0)
  assert sm.worst_group_accuracy(hits, counts) == worst
  acc = sm.group_accuracies(hits, counts)
  assert math.isnan(acc[4])
  # streaming with padding rows (weight 0, group out of range)
  tot_h, tot_c = np.zeros(5, np.int64), np.zeros(5, np.int64)
  for s in _batches(97, [10, 40, 47]):
    h, c = sm.group_accuracy(correct[s], groups[s], 5)
    tot_h += h
    tot_c += c
  np.testing.assert_array_equal(tot_h, hits)
  np.testing.assert_array_equal(tot_c, counts)
  h, c = sm.group_accuracy([1, 0, 1], [1, 1, 7], 5, weights=[1, 1, 0])
  assert h.tolist() == [0, 1, 0, 0, 0] and c.tolist() == [0, 2, 0, 0, 0]
  assert math.isnan(sm.worst_group_accuracy([0, 0], [0, 0]))


def test_group_accuracy_multi_membership_by_hand():
  rng = np.random.default_rng(4)
  k, num_groups = 60, 5
  member = rng.random((k, num_groups)) < 0.35
  member[0] = False  # a row in no group
  correct = rng.random(k) < 0.6
  e_hits, e_counts = [0] * num_groups, [0] * num_groups
  for i in range(k):
    for j in range(num_groups):
      if member[i, j]:
        e_counts[j] += 1
        e_hits[j] += int(correct[i])
  hits, counts = sm.group_accuracy_multi(correct, member)
  assert hits.tolist() == e_hits and counts.tolist() == e_counts
  worst = min(h / c for h, c in zip(e_hits, e_counts) if c > 0)
  assert sm.worst_group_accuracy(hits, counts) == worst
  a = sm.group_accuracy_multi(correct[:20], member[:20])
  b = sm.group_accuracy_multi(correct[20:], member[20:])
  assert (a[0] + b[0]).tolist() == e_hits and (a[1] + b[1]).tolist() == e_counts
  hw, cw = sm.group_accuracy_multi(correct, member, weights=np.r_[np.ones(k - 1), 0.0])
  assert cw.tolist() == (counts - member[-1]).tolist()
  assert hw.tolist() == (hits - member[-1] * correct[-1]).tolist()


def test_log_perplexity_per_domain():
  rng = np.random.default_rng(5)
  nll = rng.random((8, 6)) * 3
  mask = (rng.random((8, 6)) < 0.8).astype(np.int32)
  mask[7] = 0  # an all-padding row whose domain is out of range
  domains = np.array([0, 1, 0, 2, 1, 0, 2, 9])
  s, n = sm.token_nll_stats(nll, domains, 4, mask)
  e_s, e_n = [0.0] * 4, [0] * 4
  for i in range(7):
    for j in range(6):
      if mask[i, j]:
        e_s[domains[i]] += nll[i, j]
        e_n[domains[i]] += 1
  np.testing.assert_allclose(s, e_s, rtol=1e-12)
  assert n.tolist() == e_n
  lp = sm.log_perplexity(s, n)
  assert math.isnan(lp[3])
  assert sm.worst_log_perplexity(s, n) == pytest.approx(max(e_s[d] / e_n[d] for d in range(3)))
  assert sm.average_log_perplexity(s, n) == pytest.approx(
    sum(e_s[d] / e_n[d] for d in range(3)) / 3
  )
  assert sm.average_log_perplexity(s, n, pooled=True) == pytest.approx(sum(e_s) / sum(e_n))
  s1, n1 = sm.token_nll_stats(nll[:3], domains[:3], 4, mask[:3])
  s2, n2 = sm.token_nll_stats(nll[3:], domains[3:], 4, mask[3:])
  np.testing.assert_allclose(s1 + s2, s, rtol=1e-12)
  np.testing.assert_array_equal(n1 + n2, n)
  assert math.isnan(sm.worst_log_perplexity([0.0], [0]))


def test_accepts_jax_arrays():
  import jax.numpy as jnp

  c = sm.confusion_counts(jnp.array([0, 1, 1]), jnp.array([0, 1, 0]), 2)
  assert c.tolist() == [[1, 0], [1, 1]]
  h, n = sm.group_accuracy(jnp.array([True, False]), jnp.array([0, 1]), 2)
  assert h.tolist() == [1, 0] and n.tolist() == [1, 1]
