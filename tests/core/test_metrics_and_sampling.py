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


def _r2_by_hand(y, pred):
  return 1.0 - np.sum((pred - y) ** 2) / np.sum((y - y.mean()) ** 2)


def test_r2_of_constant_responses_is_undefined_and_left_out_of_summaries():
  from fedjax_dro import models
  from fedjax_dro.core.metrics import evaluate_clients, summarize_all
  from fedjax_dro.data import from_client_arrays

  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(m, 2)) for m in (5, 4, 1, 6)]
  ys = [rng.normal(size=5), np.full(4, 2.5), np.array([1.0]), rng.normal(size=6)]
  data = from_client_arrays(xs, ys)
  model = models.linear_regression(2, fit_intercept=True)
  params = {"w": jnp.array([0.3, -0.2]), "b": jnp.array(0.1)}
  per_client = evaluate_clients(model, params, data, personalized=False)
  r2 = np.asarray(per_client["r2"])
  pred = [x @ np.array([0.3, -0.2]) + 0.1 for x in xs]
  np.testing.assert_allclose(r2[[0, 3]], [_r2_by_hand(ys[i], pred[i]) for i in (0, 3)], rtol=1e-5)
  assert np.isnan(r2[1]) and np.isnan(r2[2])  # constant responses; a single row
  assert np.all(np.isfinite(np.asarray(per_client["loss"])))  # other metrics unaffected
  s = summarize_all({k: np.asarray(v) for k, v in per_client.items()}, data.num_examples)
  defined = r2[[0, 3]]
  assert s["r2"]["undefined"] == 2
  assert s["r2"]["mean"] == pytest.approx(defined.mean())
  assert s["r2"]["weighted_mean"] == pytest.approx((5 * defined[0] + 6 * defined[1]) / 11)
  assert s["r2"]["worst"] == pytest.approx(defined.min())
  assert s["r2"]["q50"] == pytest.approx(np.quantile(defined, 0.5))
  assert "undefined" not in s["loss"]


def test_summaries_without_undefined_clients_are_unchanged():
  v = np.array([0.2, -0.5, 0.9, 0.4])
  plain = summarize(v, weights=np.arange(1, 5))
  flagged = summarize(v, weights=np.arange(1, 5), nan_undefined=True)
  assert plain == flagged and "undefined" not in flagged
  # NaN of a metric that is not marked undefined still propagates (a diverged loss stays visible)
  assert np.isnan(summarize(np.array([1.0, np.nan]))["mean"])
  everything = summarize(np.array([np.nan, np.nan]), weights=[1, 2], nan_undefined=True)
  assert everything["undefined"] == 2 and np.isnan(everything["mean"])
