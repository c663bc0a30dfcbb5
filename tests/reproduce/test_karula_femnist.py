"""``fedjax-dro reproduce karula-femnist``: quick runs on the by-writer stand-in and on generated
LEAF files write the Figure 1 layout (JSON, markdown, PNG) with per-writer accuracies; CV picks
points of the grids; bad inputs are named."""

import importlib
import json
import os

import numpy as np
import pytest

from fedjax_dro import cli, reproduce

# the module, not the function of the same name that fedjax_dro.reproduce exports
KF = importlib.import_module("fedjax_dro.reproduce.karula_femnist")


def _check_layout(res, out, strategies, writers):
  """The three budget tables and their harness records: every row has every seed, the table
  mean is the mean of the seeds, the equal-cost budgets are kept within one round."""
  saved = json.load(open(os.path.join(out, "karula_femnist.json")))
  assert saved["writers"] == writers
  assert list(saved["results"]) == list(KF.BUDGETS)
  for key, r in saved["results"].items():
    assert [s["label"] for s in r["strategies"]] == list(strategies)
    for label, rows in r["per_seed"].items():
      assert [row["seed"] for row in rows] == r["kept_seeds"]
      values = [row["value"] for row in rows]
      assert all(0.0 <= v <= 1.0 for v in values)
      assert r["table"][label]["accuracy"]["mean"] == pytest.approx(np.mean(values))
      if key in ("uploads", "gradients"):
        field = {"uploads": "upload_floats", "gradients": "gradient_evaluations"}[key]
        for row in rows:
          budget, per = row["budget_amount"], row["per_round"][field]
          assert row["spent"][field] <= budget + 1e-9
          assert per == 0 or budget - row["spent"][field] < per or row["rounds"] == 30  # the cap
    for ext in ("json", "md", "png"):
      assert os.path.isfile(os.path.join(out, f"karula_femnist_{key}.{ext}"))
  # one selection per (strategy, seed), shared by the three tables
  chosen = {
    k: [[row["chosen"] for row in rows] for rows in r["per_seed"].values()]
    for k, r in saved["results"].items()
  }
  assert chosen["plateau"] == chosen["uploads"] == chosen["gradients"]
  table = open(os.path.join(out, "karula_femnist.md")).read()
  assert all(f"| {label} " in table for label in strategies)
  assert "(one selection for the three budgets)." in table
  for k, r in saved["results"].items():  # the runs a budget's cap stopped, named per budget
    capped = [
      f"{label} seed {row['seed']} ({row['rounds']} rounds)"
      for label, rows in r["per_seed"].items()
      for row in rows
      if row["at_cap"]
    ]
    line = next(x for x in table.splitlines() if x.startswith(f"{k} ("))
    assert line.endswith("runs stopped by the cap: none.") == (not capped), line
    assert all(c in line for c in capped), (capped, line)
  return saved


def test_quick_stand_in_end_to_end(tmp_path):
  strategies = ("FedAvg", "Karula")
  res = reproduce.karula_femnist(str(tmp_path), quick=True, strategies=strategies, verbose=False)
  saved = _check_layout(res, str(tmp_path), strategies, writers=8)
  assert saved["data"].startswith("stand-in")
  assert saved["karula_ot_options"]["reference_method"] == "pooled"


def _leaf_dir(root, writers=6, rows=14, seed=0):
  """LEAF FEMNIST-like train/test folders: 28x28 rows, dark ink on a light background, digits
  and letters mixed."""
  rng = np.random.default_rng(seed)
  for part, count in (("train", rows), ("test", 4)):
    os.makedirs(root / part)
    doc = {"users": [], "num_samples": [], "user_data": {}}
    for w in range(writers):
      labels = [int(v) for v in rng.integers(0, 10, count)] + [12, 40]  # two letters dropped
      x = 1.0 - rng.random((len(labels), 784)) * 0.5
      name = f"f{w:04d}_00"
      doc["users"].append(name)
      doc["num_samples"].append(len(labels))
      doc["user_data"][name] = {"x": x.round(2).tolist(), "y": labels}
    with open(root / part / "all_0.json", "w") as f:
      json.dump(doc, f)
  return root


@pytest.mark.slow
def test_quick_leaf_path_on_generated_files(tmp_path):
  leaf = _leaf_dir(tmp_path / "leaf")
  out = str(tmp_path / "out")
  strategies = ("FedAvg",)
  res = reproduce.karula_femnist(
    out,
    quick=True,
    leaf_dir=str(leaf),
    max_writers=5,
    strategies=strategies,
    num_seeds=1,
    verbose=False,
  )
  saved = _check_layout(res, out, strategies, writers=5)  # capped at 5 of the 6 writers
  assert saved["data"] == "LEAF FEMNIST digits"
  assert saved["train_rows_per_writer"] == 14  # the letters were dropped


@pytest.mark.slow
def test_quick_every_strategy(tmp_path):
  res = reproduce.karula_femnist(str(tmp_path), quick=True, verbose=False)
  _check_layout(res, str(tmp_path), KF.STRATEGIES, writers=8)


def test_rows_tune_their_own_steps_and_ifca_searches_one_to_ten_clusters():
  rows = {s.label: s for s in KF.strategy_rows(30, 2.0, KF.IMAGE_OT_OPTIONS, KF.ALL_STRATEGIES)}
  assert rows["IFCA"].grid["num_clusters"] == list(range(1, 11))
  assert rows["Karula"].grid["eta"] == [30 * v for v in KF.STEPS]  # not tied to FedSGD's
  np.testing.assert_allclose(np.asarray(rows["Karula"].grid["t"]) * 2.0, KF.T_MULTIPLES)
  for s in rows.values():
    assert any(len(v) >= 2 for k, v in s.grid.items() if k in ("client_lr", "lr", "eta")), s.label
  from fedjax_dro import models

  model = models.linear_regression(3)
  for label in ("FedSGD", "FedAvg", "Karula"):  # a third of the writers per round
    assert rows[label].make(model).config["clients_per_round"] == 10


def test_bad_inputs(tmp_path):
  with pytest.raises(ValueError, match="leaf_dir"):
    reproduce.karula_femnist(None, leaf_dir=str(tmp_path / "missing"), verbose=False)
  letters = tmp_path / "letters"
  os.makedirs(letters)
  doc = {
    "users": ["u"],
    "num_samples": [3],
    "user_data": {"u": {"x": [[0.5] * 784] * 3, "y": [10, 11, 61]}},
  }
  json.dump(doc, open(letters / "a.json", "w"))
  with pytest.raises(ValueError, match="digit rows"):
    reproduce.karula_femnist(None, quick=True, leaf_dir=str(letters), verbose=False)
  with pytest.raises(ValueError, match="strategies"):
    reproduce.karula_femnist(None, strategies=("FedAvg", "Nope"), verbose=False)
  with pytest.raises(ValueError, match="rounds"):
    reproduce.karula_femnist(None, rounds=0, verbose=False)
  with pytest.raises(ValueError, match="FedAvg"):
    reproduce.karula_femnist(None, strategies=("Karula",), verbose=False)


def test_cli_passes_leaf_dir_only_to_the_experiments_that_read_it(tmp_path, capsys):
  assert cli.main(["reproduce", "karula-heart", "--leaf-dir", str(tmp_path)]) == 2
  assert "--leaf-dir: reproduce karula-heart reads no such input" in capsys.readouterr().err
  missing = str(tmp_path / "missing")
  assert cli.main(["reproduce", "karula-femnist", "--quick", "--leaf-dir", missing]) == 2
  assert "leaf_dir" in capsys.readouterr().err
