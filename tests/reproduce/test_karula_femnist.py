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
  saved = json.load(open(os.path.join(out, "karula_femnist.json")))
  assert list(saved["table"]) == list(strategies)
  for label, rows in saved["per_seed"].items():
    assert [r["seed"] for r in rows] == saved["setting"]["seeds"]
    for r in rows:
      acc = np.asarray(r["accuracy_per_writer"])
      assert acc.shape == (writers,) and acc.min() >= 0.0 and acc.max() <= 1.0
      assert r["accuracy_mean"] == pytest.approx(acc.mean())
    row = saved["table"][label]
    assert row["accuracy_mean"] == pytest.approx(np.mean([r["accuracy_mean"] for r in rows]))
  diff = saved["paired_accuracy_mean"]
  for label in strategies:
    if label != "Karula":  # Karula minus it, seed by seed
      karula = [r["accuracy_mean"] for r in saved["per_seed"]["Karula"]]
      other = [r["accuracy_mean"] for r in saved["per_seed"][label]]
      assert diff[label]["difference"] == pytest.approx(np.mean(np.subtract(karula, other)))
  table = open(os.path.join(out, "karula_femnist.md")).read()
  assert all(f"| {label} |" in table for label in strategies)
  with open(res["png_path"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  return saved


def test_quick_stand_in_end_to_end(tmp_path):
  strategies = ("FedAvg", "Karula")
  res = reproduce.karula_femnist(str(tmp_path), quick=True, strategies=strategies, verbose=False)
  saved = _check_layout(res, str(tmp_path), strategies, writers=8)
  assert saved["setting"]["data"].startswith("stand-in")
  assert saved["setting"]["estimate_s"] > 0
  assert saved["setting"]["karula_ot_options"]["reference_method"] == "pooled"


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


def test_quick_leaf_path_on_generated_files(tmp_path):
  leaf = _leaf_dir(tmp_path / "leaf")
  out = str(tmp_path / "out")
  strategies = ("FedSGD", "Karula")
  res = reproduce.karula_femnist(
    out, quick=True, leaf_dir=str(leaf), max_writers=5, strategies=strategies, verbose=False
  )
  saved = _check_layout(res, out, strategies, writers=5)  # capped at 5 of the 6 writers
  assert saved["setting"]["data"] == "LEAF FEMNIST digits"
  assert saved["setting"]["train_rows_per_writer"] == 14  # the letters were dropped


@pytest.mark.slow
def test_quick_every_strategy(tmp_path):
  res = reproduce.karula_femnist(str(tmp_path), quick=True, verbose=False)
  _check_layout(res, str(tmp_path), KF.STRATEGIES, writers=8)


@pytest.mark.slow
def test_cross_validation_picks_grid_points(tmp_path):
  res = reproduce.karula_femnist(
    None,
    num_writers=6,
    rounds=2,
    cv_rounds=1,
    num_seeds=2,
    features=(4, 8),
    strategies=("IFCA", "Karula"),
    verbose=False,
  )
  assert res["chosen"]["IFCA"]["num_clusters"] in (2, 4)
  d_median = res["setting"]["median_dissimilarity_first_seed"]
  c = res["chosen"]["Karula"]["t"] * d_median
  assert min(abs(c / m - 1) for m in KF.T_MULTIPLES) < 1e-9
  assert all(np.isfinite(v) for v in res["cv_best_loss"].values())


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
  with pytest.raises(ValueError, match="folds"):
    reproduce.karula_femnist(None, folds=1, verbose=False)


def test_cli_passes_leaf_dir_only_to_the_experiments_that_read_it(tmp_path, capsys):
  assert cli.main(["reproduce", "karula-heart", "--leaf-dir", str(tmp_path)]) == 2
  assert "--leaf-dir: reproduce karula-heart reads no such input" in capsys.readouterr().err
  missing = str(tmp_path / "missing")
  assert cli.main(["reproduce", "karula-femnist", "--quick", "--leaf-dir", missing]) == 2
  assert "leaf_dir" in capsys.readouterr().err
