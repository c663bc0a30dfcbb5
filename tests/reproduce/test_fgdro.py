"""``fedjax-dro reproduce fgdro-table7``: a quick run on a subset of rows writes JSON, markdown and
PNG in the Table 7 layout; the class-weighted worst-client accuracy metric against numpy; bad
inputs."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, models, reproduce, run
from fedjax_dro.data.images import digits_dirichlet_with_extras


@pytest.mark.slow  # ~90 s; the fgdro_fairness notebook runs the same algorithms by default
def test_quick_reproduction_writes_the_table_json_and_png(tmp_path):
  out = str(tmp_path / "fgdro")
  labels = ["FedAvg", "FGDRO-CVaR", "FGDRO-KL-Adam"]
  res = reproduce.fgdro_table7(out, quick=True, rounds=2, algorithms=labels, verbose=False)
  with open(os.path.join(out, "fgdro_table7.json")) as f:
    saved = json.load(f)
  with open(os.path.join(out, "fgdro_table7.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  with open(os.path.join(out, "fgdro_table7.md")) as f:
    table = f.read()
  assert [p["alpha"] for p in saved["partitions"]] == [0.3, 10.0]
  for part in saved["partitions"]:
    assert list(part["algorithms"]) == labels
    for label, row in part["algorithms"].items():
      assert 0.0 <= row["worst_acc"] <= row["avg_acc"] <= 1.0
      assert len(row["per_seed_worst_acc"]) == 2 and len(row["curve_test_worst_acc"]) == 2
      assert row["worst_acc"] == pytest.approx(np.mean(row["per_seed_worst_acc"]))
      assert row["worst_acc_std"] == pytest.approx(np.std(row["per_seed_worst_acc"]))
      assert row["hparams"] in [g["hparams"] for g in row["grid"]]
      assert f"| {label} |" in table
  assert "0.528 / 0.706" in table  # the paper's FGDRO-KL-Adam CIFAR-10 Dir(0.3) numbers beside
  assert res["md_path"].endswith("fgdro_table7.md")


def test_class_weighted_accuracy_metric_matches_numpy():
  ds, extras = digits_dirichlet_with_extras(1, num_clients=12, alpha=0.5)
  model = models.cnn((8, 8), 10, features=(4, 8), dense=None, conv="patches")
  alg = A.fedavg(model, local_steps=2, batch_size=4, backend="vmap")
  x, y = extras.test_x[:200], extras.test_y[:200]
  wrapped = reproduce.with_class_weighted_accuracy(alg, {"hold": (x, y)}, extras.proportions, 10)
  hist = run(wrapped, ds.train, rounds=3, eval_every=3, hparams={"client_lr": 0.1})
  params = hist.final_state.params
  pred = np.asarray(jnp.argmax(model.apply(params, jnp.asarray(x)), -1))
  acc = np.array([np.mean(pred[y == c] == c) if np.any(y == c) else 0.0 for c in range(10)])
  client = extras.proportions @ acc
  final = {k: v[-1] for k, v in hist.train_metrics.items()}
  np.testing.assert_allclose(final["hold_worst_acc"], client.min(), atol=1e-12)
  np.testing.assert_allclose(final["hold_avg_acc"], client.mean(), atol=1e-12)


def test_bad_inputs():
  with pytest.raises(ValueError, match="rounds"):
    reproduce.fgdro_table7(None, rounds=0)
  with pytest.raises(ValueError, match="seeds"):
    reproduce.fgdro_table7(None, seeds=[])
  with pytest.raises(ValueError, match="algorithms"):
    reproduce.fgdro_table7(None, algorithms=["FedAvg", "FedNope"])
  assert "fgdro-table7" in reproduce.EXPERIMENTS
  assert jax.config.jax_enable_x64  # the metric test above compares in float64
