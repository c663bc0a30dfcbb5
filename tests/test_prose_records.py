"""The README's and the reproduction pages' claims about the Karula Table 1a records are computed
here from the JSON records they come from (per-seed values, paired t-tests with
``scipy.stats.ttest_rel``, win counts) and must appear in the prose as written: a rerun that
changes a record, or an edit that strengthens a sentence, fails this test."""

import json
import pathlib

import numpy as np
import pytest

stats = pytest.importorskip("scipy.stats")

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "results" / "karula_table1"
README = (ROOT / "README.md").read_text()
KARULA_PAGE = (ROOT / "docs" / "reproductions" / "karula.md").read_text()


def _flat(text):
  return " ".join(text.split())


def _per_seed(reading, label, key):
  record = json.loads((RECORDS / f"karula_synthetic_{reading}.json").read_text())
  rows = record["per_seed"][label]
  return np.array([row["value"] if key == "r2" else row["extra"][key] for row in rows])


def _compare(reading, other, key):
  """(seeds where ``other`` is better than Karula, paired two-sided p)."""
  mine, theirs = _per_seed(reading, "Karula", key), _per_seed(reading, other, key)
  better = theirs > mine if key == "r2" else theirs < mine
  return int(better.sum()), float(stats.ttest_rel(theirs, mine).pvalue)


def test_karula_against_fedavg_as_the_prose_says():
  readme, page = _flat(README), _flat(KARULA_PAGE)
  for reading, p_text in (("feature_means", "0.039"), ("equal_means", "0.013")):
    wins, p = _compare(reading, "FedAvg", "estimation_error")
    assert wins == 0  # Karula's error below FedAvg's on every seed
    assert f"{p:.3f}" == p_text
  assert "paired p = 0.039" in readme and "p = 0.039 and 0.013" in page
  fedavg_ahead, p = _compare("equal_means", "FedAvg", "r2")
  assert 5 - fedavg_ahead == 4 and f"{p:.2f}" == "0.13"
  assert "(4 of 5, p = 0.13)" in readme and "ahead on 4 of 5 seeds, p = 0.13" in page
  fedavg_ahead, _ = _compare("feature_means", "FedAvg", "r2")
  assert fedavg_ahead == 0 and "ahead on 5 of 5 seeds under that reading" in readme


def test_the_personalized_baselines_against_karula_as_the_prose_says():
  readme, page = _flat(README), _flat(KARULA_PAGE)
  for reading in ("feature_means", "equal_means"):
    for other in ("pFedMe", "Ditto"):
      wins, p = _compare(reading, other, "estimation_error")
      assert wins == 5 and p < 0.01, (reading, other, wins, p)
  wins, p = _compare("feature_means", "IFCA", "estimation_error")
  assert wins == 5 and f"{p:.3f}" == "0.001"
  wins, p = _compare("equal_means", "IFCA", "estimation_error")
  assert (wins, f"{p:.2f}") == (2, "0.44")
  assert "2 of 5 seeds, p = 0.44" in readme and "IFCA lower on 2 of 5 seeds, p = 0.44" in page
  assert "(p < 0.01)" in readme and "(p < 0.01)" in page


def test_ifca_cluster_counts_on_the_writers_stand_in_as_the_prose_says():
  counts = []
  for budget in ("plateau", "uploads", "gradients"):
    record = json.loads(
      (
        ROOT / "benchmarks" / "results" / "karula_femnist" / f"karula_femnist_{budget}.json"
      ).read_text()
    )
    counts.append([row["chosen"]["num_clusters"] for row in record["per_seed"]["IFCA"]])
  assert counts[0] == counts[1] == counts[2] == [5, 2, 6]
  assert "cluster counts 5, 2 and 6 chosen on the three seeds" in _flat(KARULA_PAGE)
