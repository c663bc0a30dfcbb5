"""``fedjax-dro reproduce karula-synthetic`` / ``karula-heart``: quick runs write the Table 1
layout (JSON, markdown, PNG) with every strategy, selected by CV on training rows; bad inputs."""

import json
import os

import numpy as np
import pytest

from fedjax_dro import reproduce
from fedjax_dro.reproduce import karula as K

STRATEGIES = ["Local", "FedSGD", "FedAvg", "pFedMe", "IFCA", "Ditto", "Karula"]


@pytest.mark.slow
def test_quick_synthetic_reproduction(tmp_path):
  res = reproduce.karula_synthetic(str(tmp_path), quick=True, rounds=10, verbose=False)
  saved = json.load(open(os.path.join(tmp_path, "karula_synthetic.json")))
  assert list(saved["table"]) == STRATEGIES
  for rows in saved["per_seed"].values():
    assert [r["seed"] for r in rows] == [0, 1]
    assert all(np.isfinite(r["estimation_error"]) and r["test_r2"] <= 1.0 for r in rows)
  assert "| Karula |" in open(os.path.join(tmp_path, "karula_synthetic.md")).read()
  assert res["png_path"].endswith(".png")


@pytest.mark.slow
def test_quick_heart_reproduction_counts_and_layout(tmp_path):
  res = reproduce.karula_heart(str(tmp_path), quick=True, rounds=5, cv_rounds=3, verbose=False)
  saved = json.load(open(os.path.join(tmp_path, "karula_heart.json")))
  assert saved["setting"]["rows_per_hospital"] == [303, 261, 46, 130]
  assert list(saved["table"]) == STRATEGIES
  for label, row in saved["table"].items():
    per = [r["accuracy_mean"] for r in saved["per_seed"][label]]
    assert row["accuracy_mean"] == pytest.approx(np.mean(per))
    assert len(row["per_hospital"]) == 4
    assert all(0.0 <= m <= 1.0 for m, _ in row["per_hospital"])
  for label, rows in saved["per_seed"].items():  # the chosen point lies in the (quick) CV grid
    if label == "IFCA":
      assert all(r["chosen"]["num_clusters"] in (1, 4) for r in rows)
    if label == "Karula":  # t on multiples of the median dissimilarity
      quick_grid = K.T_MULTIPLES_HEART[::3]
      assert all(min(abs(r["t_times_median_D"] / c - 1) for c in quick_grid) < 1e-9 for r in rows)
  table = open(os.path.join(tmp_path, "karula_heart.md")).read()
  assert "| Karula |" in table and "0.705" in table  # the paper's Karula accuracy beside ours
  with open(res["png_path"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_every_strategy_weights_clients_by_samples_and_pfedme_runs_its_paper_form():
  from fedjax_dro import models

  model = models.linear_regression(3, l2=1e-6, fit_intercept=False)
  makes = K._factories(model, 4)
  for label, make in makes.items():
    alg = make()
    if label != "Local":  # local training has nothing to weight
      assert alg.config["weighting"] == "num_examples", label
  assert makes["pFedMe"]().config["personal_updates"] == "all"
  assert makes["Karula"]().config["ot_options"] == {"preset": "paper"}


def test_karula_t_grid_is_relative_to_the_median_dissimilarity():
  from fedjax_dro import models

  makes = K._factories(models.linear_regression(3, fit_intercept=False), 4)
  for d_median in (0.5, 800.0):
    specs = {s["label"]: s for s in K._strategies(makes, 0.1, 0.2, False, d_median)}
    np.testing.assert_allclose(
      np.asarray(specs["Karula"]["grid"]["t"]) * d_median, K.T_MULTIPLES, rtol=1e-12
    )
  assert K.karula_synthetic.__kwdefaults__["folds"] == 5  # the paper's 5-fold CV


def test_bad_inputs():
  with pytest.raises(ValueError, match="rounds"):
    reproduce.karula_heart(None, rounds=0)
  with pytest.raises(ValueError, match="folds"):
    reproduce.karula_synthetic(None, folds=1)
  with pytest.raises(ValueError, match="seeds"):
    reproduce.karula_heart(None, num_seeds=0)
  assert {"karula-synthetic", "karula-heart"} <= set(reproduce.EXPERIMENTS)
