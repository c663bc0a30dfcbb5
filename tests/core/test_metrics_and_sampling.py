"""Metric summaries and client sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro.core.metrics import summarize
from fedjax_dro.core.sampling import sample_clients


def test_summaries_worst_and_best_20_percent():
  acc = np.array([0.9, 0.1, 0.5, 0.7, 0.3, 0.8, 0.2, 0.6, 0.4, 1.0])
  s = summarize(acc, weights=np.arange(1, 11), higher_is_better=True)
  assert s["worst20"] == pytest.approx(0.15) and s["best20"] == pytest.approx(0.95)
  assert s["worst"] == 0.1 and s["mean"] == pytest.approx(0.55)
  assert s["weighted_mean"] == pytest.approx(np.sum(acc * np.arange(1, 11)) / 55)
  loss = summarize(np.array([1.0, 5.0, 3.0]), higher_is_better=False)
  assert loss["worst20"] == 5.0 and loss["worst"] == 5.0 and loss["best20"] == 1.0


def test_client_sampling_without_replacement_and_weighted():
  for seed in range(10):
    idx = np.asarray(sample_clients(jax.random.PRNGKey(seed), 10, 4))
    assert len(set(idx.tolist())) == 4 and idx.max() < 10
  w = jnp.array([0.0, 0.0, 1.0, 1.0, 1.0])
  counts = np.zeros(5)
  for seed in range(200):
    counts[np.asarray(sample_clients(jax.random.PRNGKey(seed), 5, 2, w))] += 1
  assert counts[:2].sum() == 0 and np.all(counts[2:] > 100)
  # Uniform sampling without replacement: each client participates with probability s/n.
  hits = np.zeros(6)
  for seed in range(600):
    hits[np.asarray(sample_clients(jax.random.PRNGKey(seed), 6, 2))] += 1
  np.testing.assert_allclose(hits / 600, 2 / 6, atol=0.06)
