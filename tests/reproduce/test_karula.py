"""``fedjax-dro reproduce karula-synthetic`` / ``karula-synthetic-gradients`` / ``karula-heart`` on
the comparison harness: the rows and grids of Table 1, the equal-gradients budget, the scale
argument of the paper's error column, quick runs' layout, and bad inputs."""

import json
import os
import pathlib

import numpy as np
import pytest

from fedjax_dro import compare as C, models, reproduce
from fedjax_dro.reproduce import karula as K

LABELS = [
  "Local",
  "FedSGD",
  "FedAvg",
  "pFedMe",
  "IFCA",
  "IFCA (identical start)",
  "Ditto",
  "Karula",
]


def _rows(**kw):
  args = dict(n=30, s=10, lr=0.1, eta=0.2, d_median=4.0, t_multiples=K.T_MULTIPLES)
  args.update(kw)
  return {s.label: s for s in K.strategies(**args)}


def test_rows_weights_and_paper_marks():
  rows = _rows()
  assert list(rows) == LABELS
  model = models.linear_regression(3, l2=1e-6, fit_intercept=False)
  for label, s in rows.items():
    alg = s.make(model) if label not in ("IFCA", "IFCA (identical start)") else s.make(model, 2)
    if label != "Local":  # local training has nothing to weight
      assert alg.config["weighting"] == "num_examples", label
  assert rows["pFedMe"].make(model).config["personal_updates"] == "all"
  assert rows["Karula"].make(model).config["ot_options"] == {"preset": "paper"}
  assert rows["IFCA (identical start)"].make(model, 3).config["init_scale"] == 0.0
  assert rows["IFCA"].make(model, 3).config["init_scale"] > 0.0
  assert [k for k, s in rows.items() if not s.paper] == ["IFCA (identical start)", "Ditto"]


def test_every_step_is_tuned_and_t_is_relative_to_the_median_dissimilarity():
  for d_median in (0.5, 800.0):
    karula = _rows(d_median=d_median)["Karula"]
    np.testing.assert_allclose(np.asarray(karula.grid["t"]) * d_median, K.T_MULTIPLES, rtol=1e-12)
    assert len(karula.grid["eta"]) >= 2  # Karula's step on its own grid
  for label, s in _rows().items():
    steps = [g.get("client_lr", g.get("lr", g.get("eta"))) for g in s.grids]
    assert all(v is not None and len(v) >= 2 for v in steps), label
  ifca = _rows()["IFCA"].grid["num_clusters"]
  assert ifca[0] == 1 and max(ifca) == 10


def test_equal_gradients_budget_gives_every_row_fedavgs_spend():
  """Under ``budget="gradients"`` every row gets the most rounds whose client gradient
  evaluations (setup included) stay within FedAvg's at the table's rounds: within one of its
  rounds of that spend, none stopped by the cap."""
  from fedjax_dro.compare.harness import algorithm_cost, budget_rounds, reached_cap
  from fedjax_dro.data import get_dataset

  entry = get_dataset("synthetic-ridge")
  ds = entry.load(0)
  model = entry.default_model(ds)
  budget = K.protocol(
    seeds=[0],
    rounds=600,
    selection_rounds=100,
    folds=3,
    metric=C.Metric("r2", "mean"),
    budget="gradients",
  ).budget
  assert (budget.kind, budget.match, budget.rounds, budget.cap) == (
    "gradients",
    "FedAvg",
    600,
    6000,
  )
  rows = _rows()
  costs = {
    k: algorithm_cost(s.make(model, **({"num_clusters": 2} if "IFCA" in k else {})), ds.train)
    for k, s in rows.items()
  }
  amount = costs["FedAvg"].spent(600).gradient_evaluations
  got = {}
  for label, c in costs.items():
    rounds = budget_rounds(budget, c, amount, label)
    spent, per = c.spent(rounds).gradient_evaluations, c.round.gradient_evaluations
    assert amount - per < spent <= amount, label
    assert not reached_cap(budget, c, amount, rounds), label
    got[label] = rounds
  assert got["FedAvg"] == 600 and got["pFedMe"] == 40 and got["Karula"] == 5997, got
  assert got["FedSGD"] == got["Local"] == 6000 and got["Ditto"] == 300, got


RECORDS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "karula_table1"


def test_published_equal_gradients_table_spends_fedavgs_gradients():
  """The published equal-gradients records (the readings of its combined table): on every seed
  every row spent FedAvg's client gradient evaluations at 600 rounds to within one of its rounds,
  none stopped by the cap, and the combined table states that budget, its seeds and folds."""
  combined = json.loads((RECORDS / "karula_synthetic_gradients.json").read_text())
  assert list(combined["results"]) and set(combined["results"]) <= set(K.READINGS)
  for reading in combined["results"]:
    _spends_fedavgs_gradients(reading)


def _spends_fedavgs_gradients(reading):
  record = json.loads((RECORDS / f"karula_synthetic_gradients_{reading}.json").read_text())
  assert record["protocol"]["budget"].startswith("equal client gradient evaluations")
  fedavg = {row["seed"]: row for row in record["per_seed"]["FedAvg"]}
  for label, rows in record["per_seed"].items():
    assert [row["seed"] for row in rows] == record["protocol"]["seeds"], label
    for row in rows:
      amount = fedavg[row["seed"]]["spent"]["gradient_evaluations"]
      assert row["budget_amount"] == amount and fedavg[row["seed"]]["rounds"] == 600
      per = row["per_round"]["gradient_evaluations"]
      assert amount - per < row["spent"]["gradient_evaluations"] <= amount, (label, row["seed"])
      assert not row["at_cap"], (label, row["seed"])
  table = (RECORDS / "karula_synthetic_gradients.md").read_text()
  assert table.startswith("Budget: equal client gradient evaluations (what FedAvg spends in 600")
  assert f"{len(record['protocol']['seeds'])} seeds, 3-fold selection" in table


def test_published_tables_at_both_budgets_rest_on_the_same_choices():
  """The equal-gradients table's choices are the equal-rounds table's on every seed, strategy and
  reading (steps to 1e-9): one selection per strategy and seed (the page says so)."""
  for reading in json.loads((RECORDS / "karula_synthetic_gradients.json").read_text())["results"]:
    grads, rounds = (
      json.loads((RECORDS / f"{stem}_{reading}.json").read_text())["per_seed"]
      for stem in ("karula_synthetic_gradients", "karula_synthetic")
    )
    assert set(grads) == set(rounds)
    differ = [
      (label, a["seed"])
      for label in grads
      for a, b in zip(grads[label], rounds[label], strict=True)
      if a["chosen"].keys() != b["chosen"].keys()
      or not all(np.isclose(a["chosen"][k], b["chosen"][k], rtol=1e-9) for k in a["chosen"])
    ]
    assert differ == [], (reading, differ)


def test_scale_argument_of_the_papers_error_column():
  """The floor of a single global model under the paper's generator, by Monte Carlo over true
  parameters drawn as the generator draws them: the best common model is the mean of the true
  parameters, and its mean squared distance is above the paper's FedAvg error."""
  from fedjax_dro.data import synthetic_ridge

  floors = []
  for seed in range(3):
    theta = np.asarray(synthetic_ridge(seed).true_params)
    floors.append(np.mean(np.sum((theta - theta.mean(0)) ** 2, axis=1)))
  assert np.mean(floors) == pytest.approx(K.GLOBAL_ERROR_FLOOR, rel=0.05)
  assert min(floors) > K.PAPER_SYNTHETIC["FedAvg"][0]


@pytest.mark.slow
def test_quick_synthetic_reproduction(tmp_path):
  res = reproduce.karula_synthetic(str(tmp_path), quick=True, verbose=False)
  saved = json.load(open(os.path.join(tmp_path, "karula_synthetic.json")))
  assert list(saved["results"]) == ["feature_means", "equal_means"]
  for reading, r in saved["results"].items():
    assert [s["label"] for s in r["strategies"]] == LABELS
    for rows in r["per_seed"].values():
      assert [row["seed"] for row in rows] == [0, 1]
      assert all(np.isfinite(row["extra"]["estimation_error"]) for row in rows)
    for ext in ("json", "md", "png"):
      assert os.path.isfile(os.path.join(tmp_path, f"karula_synthetic_{reading}.{ext}"))
  md = open(os.path.join(tmp_path, "karula_synthetic.md")).read()
  assert "| Karula |" in md and "another scale" in md and "Karula minus FedAvg" in md
  assert res["results"]["equal_means"]["reference"] == "FedAvg"


@pytest.mark.slow
def test_quick_synthetic_reproduction_at_both_budgets_shares_the_selections(tmp_path):
  res = reproduce.karula_synthetic(
    str(tmp_path), quick=True, readings=("equal_means",), budgets=K.BUDGETS, verbose=False
  )
  assert set(res) == set(K.BUDGETS)
  rounds, grads = (res[b]["results"]["equal_means"]["per_seed"] for b in K.BUDGETS)
  for label in LABELS:
    assert [r["chosen"] for r in rounds[label]] == [r["chosen"] for r in grads[label]], label
  assert {r["rounds"] for r in grads["FedSGD"]} == {200} and grads["FedAvg"][0]["rounds"] == 20
  for stem in ("karula_synthetic_gradients", "karula_synthetic_gradients_equal_means"):
    assert os.path.isfile(os.path.join(tmp_path, f"{stem}.md"))
  table = open(os.path.join(tmp_path, "karula_synthetic_gradients.md")).read()
  assert "Budget: equal client gradient evaluations" in table
  assert "2 seeds, 2-fold selection (the paper's: 10 seeds" in table


@pytest.mark.slow
def test_quick_heart_reproduction(tmp_path):
  reproduce.karula_heart(str(tmp_path), quick=True, verbose=False)
  saved = json.load(open(os.path.join(tmp_path, "karula_heart.json")))
  r = saved["results"]["heart"]
  for label, row in r["table"].items():
    per = [x["value"] for x in r["per_seed"][label]]
    assert row["accuracy"]["mean"] == pytest.approx(np.mean(per))
    assert all(0.0 <= row[h]["mean"] <= 1.0 for h in K.HOSPITALS)
  for ext in ("json", "md", "png"):  # the harness record beside the combined table
    assert os.path.isfile(os.path.join(tmp_path, f"karula_heart_hospitals.{ext}"))
  table = open(os.path.join(tmp_path, "karula_heart.md")).read()
  assert "| Karula |" in table and "0.705" in table  # the paper's Karula accuracy beside ours


def test_readings_never_share_selections_and_budgets_do(monkeypatch):
  """Each reading's selections are its own (a selection is keyed by strategy and seed, not by
  the data), and the same reading's tables at several budgets share them."""
  calls = []
  monkeypatch.setattr(K, "run_tables", lambda *a, **kw: calls.append(kw) or {})
  monkeypatch.setattr(K, "ridge_experiment", lambda r, **kw: (r, kw["budget"]))
  K.karula_synthetic(None, budgets=K.BUDGETS, verbose=False)
  by_budget = [c["selections_by_key"] for c in calls]
  assert len(by_budget) == 2 and list(by_budget[0]) == list(K.READINGS)
  assert by_budget[0]["feature_means"] is not by_budget[0]["equal_means"]
  assert all(by_budget[0][r] is by_budget[1][r] for r in K.READINGS)
  assert all(c.get("selections") is None for c in calls)
  # a part: every table's runs split the same way; nothing combined until the merge
  calls.clear()
  monkeypatch.setattr(K, "run_tables", lambda *a, **kw: calls.append(kw))
  assert K.karula_synthetic("out", budgets=K.BUDGETS, verbose=False, part="1/2") is None
  assert [c["part"] for c in calls] == ["1/2", "1/2"]


def test_bad_inputs():
  with pytest.raises(ValueError, match="rounds"):
    reproduce.karula_heart(None, rounds=0)
  with pytest.raises(ValueError, match="folds"):
    reproduce.karula_synthetic(None, folds=1)
  with pytest.raises(ValueError, match="num_seeds"):
    reproduce.karula_heart(None, num_seeds=0)
  with pytest.raises(ValueError, match="readings"):
    reproduce.karula_synthetic(None, readings=("uniform",))
  with pytest.raises(ValueError, match="budgets"):
    reproduce.karula_synthetic(None, budgets=("uploads",))
  with pytest.raises(ValueError, match="budgets"):
    reproduce.karula_synthetic(None, budgets="gradients")
  with pytest.raises(ValueError, match="budget"):
    K.protocol(
      seeds=[0],
      rounds=5,
      selection_rounds=5,
      folds=2,
      metric=C.Metric("r2", "mean"),
      budget="plateau",
    )
  assert {"karula-synthetic", "karula-synthetic-gradients", "karula-heart"} <= set(
    reproduce.EXPERIMENTS
  )
