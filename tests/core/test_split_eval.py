"""A model evaluated on a streamed split batch by batch equals the plain computation over all
rows: per-client losses and accuracies against the resident per-client evaluation, macro-F1
against ``sklearn.metrics.f1_score`` over the labels present, Pearson r per group against
``scipy.stats.pearsonr``, worst-group accuracy (one group a row, and CivilComments' overlapping
groups) against loops written out here."""

import jax
import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro.core.metrics import evaluate_clients
from fedjax_dro.data import prepared
from fedjax_dro.data.streamed import load_prepared

sklearn_metrics = pytest.importorskip("sklearn.metrics")
stats = pytest.importorskip("scipy.stats")


def _source(task, counts=(7, 0, 12), d=3, classes=4, seed=0):
  rng = np.random.default_rng(seed)
  xs = [rng.normal(size=(c, d)).astype(np.float32) for c in counts]
  if task == "classification":
    ys = [rng.integers(0, classes - 1, c).astype(np.int32) for c in counts]  # class 3 absent
  else:
    ys = [(x @ np.arange(1.0, d + 1) + rng.normal(size=len(x))).astype(np.float32) for x in xs]
  gs = [rng.integers(0, 2, c).astype(np.int32) for c in counts]

  def rows(i):
    for start in range(0, counts[i], 5):
      sl = slice(start, start + 5)
      yield xs[i][sl], ys[i][sl], gs[i][sl]

  split = prepared.SplitSource("test", ("a", "b", "c"), rows, counts)
  info = {"task": task, "metrics": ["macro_f1"] if task == "classification" else ["pearson_r"]}
  if task == "classification":
    info["num_classes"] = classes
  y_dtype = "int32" if task == "classification" else "float32"
  src = prepared.Source("toy", (d,), "float32", (), y_dtype, ("rural", "urban"), (split,), info)
  return src, xs, ys, gs


@pytest.mark.parametrize("batch_size", [4, 64])
def test_classification_split_metrics_equal_the_plain_computation(tmp_path, batch_size):
  src, xs, ys, gs = _source("classification")
  data = load_prepared(prepared.prepare(src, out=str(tmp_path / "p"), progress=False), "test")
  model = fd.models.softmax_regression(3, 4)
  params = jax.tree.map(
    lambda a: jax.random.normal(jax.random.PRNGKey(1), a.shape), model.init(jax.random.PRNGKey(1))
  )
  got = data.evaluate(model, params, batch_size=batch_size)
  resident = evaluate_clients(model, params, data.to_device(), False)
  present = np.asarray(data.store.counts) > 0
  for k in ("loss", "accuracy"):
    np.testing.assert_allclose(
      got["per_client"][k][present], np.asarray(resident[k])[present], rtol=1e-5
    )
  x, y, g = np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)
  pred = np.asarray(model.apply(params, x)).argmax(-1)
  want_f1 = sklearn_metrics.f1_score(y, pred, average="macro", labels=np.unique(y))
  assert got["summary"]["macro_f1"] == pytest.approx(want_f1, abs=1e-12)
  accs = [np.mean(pred[g == k] == y[g == k]) for k in (0, 1)]
  assert got["summary"]["worst_group_accuracy"] == pytest.approx(min(accs), abs=1e-12)
  np.testing.assert_allclose(got["per_group"]["accuracy"], accs, rtol=1e-6)
  assert got["summary"]["accuracy"] == pytest.approx(np.mean(pred == y), abs=1e-6)


def test_regression_pearson_per_group_equals_scipy(tmp_path):
  src, xs, ys, gs = _source("regression")
  data = load_prepared(prepared.prepare(src, out=str(tmp_path / "p"), progress=False), "test")
  model = fd.models.linear_regression(3)
  params = jax.tree.map(
    lambda a: jax.random.normal(jax.random.PRNGKey(2), a.shape), model.init(jax.random.PRNGKey(2))
  )
  got = data.evaluate(model, params, batch_size=4)
  x, y, g = np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)
  pred = np.asarray(model.apply(params, x)).reshape(-1)
  want = [stats.pearsonr(y[g == k], pred[g == k])[0] for k in (0, 1)]
  assert got["summary"]["worst_group_pearson_r"] == pytest.approx(min(want), abs=1e-9)
  assert got["summary"]["pearson_r"] == pytest.approx(stats.pearsonr(y, pred)[0], abs=1e-9)


def test_civilcomments_worst_group_accuracy_over_overlapping_groups(tmp_path):
  from fedjax_dro.data._sources import civilcomments

  root = prepared.write_standin("civilcomments", tmp_path / "cc")
  out = prepared.prepare("civilcomments", root, str(tmp_path / "p"), progress=False, max_len=8)
  data = load_prepared(out, "test")
  store = data.store
  model = fd.models.softmax_regression(8, 2)  # token ids as features: a deterministic classifier
  params = jax.tree.map(
    lambda a: 0.1 * jax.random.normal(jax.random.PRNGKey(3), a.shape),
    model.init(jax.random.PRNGKey(3)),
  )
  got = data.evaluate(model, params, batch_size=3)
  x = np.asarray(store.x, np.float32)
  y, g = np.asarray(store.y), np.asarray(store.group)
  pred = np.asarray(model.apply(params, x)).argmax(-1)
  accs = []
  for k in range(8):
    for t in (0, 1):
      rows = [r for r in range(len(y)) if (g[r] >> 1) >> k & 1 and y[r] == t]
      if rows:
        accs.append(np.mean([pred[r] == y[r] for r in rows]))
  assert got["summary"]["worst_group_accuracy"] == pytest.approx(min(accs), abs=1e-12)
  assert civilcomments.eval_membership().shape == (512, 16)
