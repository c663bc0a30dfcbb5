"""The README's and the reproduction pages' claims about the Karula Table 1a records (equal rounds
and equal client gradients) are computed
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


def _per_seed(reading, label, key, table="karula_synthetic"):
  record = json.loads((RECORDS / f"{table}_{reading}.json").read_text())
  rows = record["per_seed"][label]
  return np.array([row["value"] if key == "r2" else row["extra"][key] for row in rows])


def _compare(reading, other, key, table="karula_synthetic"):
  """(seeds where ``other`` is better than Karula, paired two-sided p) in ``table``."""
  mine = _per_seed(reading, "Karula", key, table)
  theirs = _per_seed(reading, other, key, table)
  better = theirs > mine if key == "r2" else theirs < mine
  return int(better.sum()), float(stats.ttest_rel(theirs, mine).pvalue)


def test_karula_against_fedavg_as_the_prose_says():
  readme, page = _flat(README), _flat(KARULA_PAGE)
  wins, p = _compare("feature_means", "FedAvg", "estimation_error")
  assert wins == 0 and f"{p:.3f}" == "0.039"  # Karula's error below FedAvg's on every seed
  wins, p = _compare("equal_means", "FedAvg", "estimation_error")
  assert wins == 0 and p < 0.001
  assert "paired p = 0.039" in readme and "p = 0.039 and p < 0.001" in page
  for reading, p_text in (("feature_means", "p = 0.002"), ("equal_means", "p < 0.001")):
    fedavg_ahead, p = _compare(reading, "FedAvg", "r2")
    assert fedavg_ahead == 0 and (f"p = {p:.3f}" == p_text or (p < 0.001 and "<" in p_text))
  assert "ahead on 5 of 5 seeds under both readings (p = 0.002 and p < 0.001)" in readme
  cells = []
  for key, digits in (("estimation_error", 2), ("r2", 3)):
    d = _per_seed("equal_means", "Karula", key) - _per_seed("equal_means", "FedAvg", key)
    two_se = 2 * d.std(ddof=1) / np.sqrt(d.size)
    cells.append(f"{d.mean():+.{digits}f} +- {two_se:.{digits}f}")
  error = cells[0].lstrip("+")
  assert f"({error}, and on R^2, the selection metric, {cells[1]}, ahead on 5 of 5" in page
  record = json.loads((RECORDS / "karula_synthetic_equal_means.json").read_text())
  chosen = [row["chosen"] for row in record["per_seed"]["Karula"]]
  assert {f"{c['t']:.2g}" for c in chosen} == {"0.0041"}
  assert {f"{c['eta']:.3g}" for c in chosen} == {"1.37"}
  assert "`t = 0.0041` and the widened step `eta = 1.37` on every seed" in page
  edges = {
    r: sorted(
      e["seed"]
      for e in json.loads((RECORDS / f"karula_synthetic_{r}.json").read_text())["edges"]
      if e["strategy"] == "Karula" and e["axis"] == "eta" and e["edge"] == "high"
    )
    for r in ("feature_means", "equal_means")
  }
  assert edges == {"feature_means": [0], "equal_means": [0, 1, 2, 3, 4]}
  assert "on 1 of 5 seeds (feature means) and 5 of 5 (equal means, 1.37" in page


def test_the_personalized_baselines_against_karula_as_the_prose_says():
  readme, page = _flat(README), _flat(KARULA_PAGE)
  for reading in ("feature_means", "equal_means"):
    for other in ("pFedMe", "Ditto"):
      wins, p = _compare(reading, other, "estimation_error")
      assert wins == 5 and p < 0.01, (reading, other, wins, p)
  wins, p = _compare("feature_means", "IFCA", "estimation_error")
  assert wins == 5 and f"{p:.3f}" == "0.001"
  wins, p = _compare("equal_means", "IFCA", "estimation_error")
  assert (wins, f"{p:.2f}") == (2, "0.93")
  assert "2 of 5 seeds, p = 0.93" in readme and "IFCA lower on 2 of 5 seeds, p = 0.93" in page
  assert "(p < 0.01)" in readme and "(p < 0.01)" in page


def test_the_page_says_both_tables_rest_on_the_same_selections():
  """The records' side: tests/reproduce/test_karula.py (the choices equal on every seed)."""
  page = _flat(KARULA_PAGE)
  assert "Every seed's choices are the same in both tables' records, under both readings" in page


def test_the_equal_gradients_table_as_the_prose_says():
  """Table 1a at equal client gradients (feature-means reading): the rounds each row got, Karula
  against FedAvg, Karula's own equal-rounds row, and the personalized baselines."""
  readme, page = _flat(README), _flat(KARULA_PAGE)
  g, r = "karula_synthetic_gradients", "feature_means"
  record = json.loads((RECORDS / f"{g}_{r}.json").read_text())
  rounds = {k: {row["rounds"] for row in rows} for k, rows in record["per_seed"].items()}
  assert rounds == {
    "Local": {6000},
    "FedSGD": {6000},
    "FedAvg": {600},
    "pFedMe": {40},
    "IFCA": {600},
    "IFCA (identical start)": {600},
    "Ditto": {300},
    "Karula": {5997},
  }
  assert "FedSGD and Local get 6,000 rounds, Karula 5,997" in page
  assert "IFCA 600, Ditto 300 and pFedMe 40" in page and "Karula 5,997 rounds, pFedMe 40" in readme
  fedavg_ahead, p = _compare(r, "FedAvg", "r2", g)
  assert (5 - fedavg_ahead, f"{p:.3f}") == (5, "0.001")
  assert "ahead on 5 of 5 seeds (p = 0.001)" in page and "(5 of 5 seeds, p = 0.001)" in readme
  fedavg_lower, p = _compare(r, "FedAvg", "estimation_error", g)
  assert (5 - fedavg_lower, f"{p:.2f}") == (3, "0.24")
  assert "lower on 3 of 5 seeds: within noise (p = 0.24)" in page
  assert "within noise (3 of 5, p = 0.24)" in readme
  at_gradients, at_rounds = (
    _per_seed(r, "Karula", "estimation_error", g),
    _per_seed(r, "Karula", "estimation_error"),
  )
  p = stats.ttest_rel(at_gradients, at_rounds).pvalue
  assert (at_gradients > at_rounds).sum() == 5 and f"{p:.3f}" == "0.052"
  assert f"{at_gradients.mean():.2f} against {at_rounds.mean():.2f}" == "10.38 against 8.96"
  assert "10.38 against 8.96, higher on 5 of 5 seeds (p = 0.052, within noise" in page
  local = _per_seed(r, "Local", "estimation_error", g), _per_seed(r, "Local", "estimation_error")
  assert f"{local[0].mean():.2f} against {local[1].mean():.2f}" == "33.47 against 21.38"
  assert "33.47 against 21.38 at 600 rounds" in page
  wins, p = _compare(r, "pFedMe", "estimation_error", g)
  assert (wins, f"{p:.3f}") == (5, "0.082")
  pfedme = _per_seed(r, "pFedMe", "estimation_error", g).mean()
  assert (
    f"{pfedme:.2f}" == "7.37"
    and f"{_per_seed(r, 'pFedMe', 'estimation_error').mean():.2f}" == "5.54"
  )
  assert "lower on 5 of 5 seeds but within noise (p = 0.082; its error 7.37, 5.54" in page
  for other in ("IFCA", "Ditto"):
    wins, p = _compare(r, other, "estimation_error", g)
    assert wins == 5 and p < 0.001, (other, wins, p)
  assert "have a lower error than Karula on every seed (p < 0.001)" in page
  edges = [(e["seed"], e["edge"]) for e in record["edges"] if e["strategy"] == "Karula"]
  assert edges == [(0, "high")] and "on one seed of five here" in page


def test_the_equal_gradients_equal_means_bullet_as_the_prose_says():
  """The equal-means reading's Karula - FedAvg sentence at equal client gradients, recomputed."""
  g, r = "karula_synthetic_gradients", "equal_means"
  parts = []
  for key in ("estimation_error", "r2"):
    mine, fedavg = _per_seed(r, "Karula", key, g), _per_seed(r, "FedAvg", key, g)
    d = mine - fedavg
    wins = int((mine > fedavg).sum() if key == "r2" else (mine < fedavg).sum())
    p = stats.ttest_rel(fedavg, mine).pvalue
    parts.append((d.mean(), 2 * d.std(ddof=1) / np.sqrt(len(d)), wins, p))
  (e, es, ew, ep), (q, qs, qw, qp) = parts

  def verdict(p):
    return (
      "p < 0.001" if p < 0.001 else (f"p = {p:.3f}" if p < 0.05 else f"within noise, p = {p:.2f}")
    )

  text = (
    f"Karula's error is {-e:.2f} +- {es:.2f} below FedAvg's, lower on {ew} of 5 seeds "
    f"({verdict(ep)}), and its R^2 {q:+.3f} +- {qs:.3f}, ahead on {qw} of 5 seeds ({verdict(qp)})."
  )
  assert text in _flat(KARULA_PAGE), text


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


HEART = ROOT / "benchmarks" / "results" / "karula_heart"


def test_the_heart_disease_paragraph_as_the_records_say():
  """Karula Table 1b: the means, the paired comparison against FedAvg (t-test, Holm, sign
  test), the order of the others and the edge counts of the paragraph under the table."""
  page = _flat(KARULA_PAGE)
  rec = json.loads((HEART / "karula_heart_hospitals.json").read_text())
  value = {k: np.array([r["value"] for r in rows]) for k, rows in rec["per_seed"].items()}
  means = {k: float(v.mean()) for k, v in value.items()}
  best = max(means, key=means.get)
  assert best == "Karula" and f"{means[best]:.3f}" == "0.830"
  diff = value["Karula"] - value["FedAvg"]
  p = float(stats.ttest_rel(value["Karula"], value["FedAvg"]).pvalue)
  wins = int((diff > 0).sum())
  sign = float(stats.binomtest(wins, int((diff != 0).sum()), alternative="greater").pvalue)
  others = [k for k in value if k not in ("Karula", "FedAvg")]
  pvals = [float(stats.ttest_rel(value[k], value["FedAvg"]).pvalue) for k in others]
  pvals = [v for v in pvals if np.isfinite(v)] + [p]
  holm = max(min(1.0, (len(pvals) - j) * q) for j, q in enumerate(sorted(pvals)) if q <= p)
  assert (wins, len(diff)) == (4, 5)
  assert f"{p:.2g}" == "0.096" and f"{holm:.2g}" == "0.49" and f"{sign:.2g}" == "0.19"
  assert "above FedAvg on 4 of 5 splits (+0.023 +- 0.021 paired)" in page
  assert (
    "within noise (p = 0.096; Holm-adjusted over the table's comparisons 0.49; sign-test p = 0.19)"
    in page
  )
  assert all(q >= 0.05 for q in pvals)  # "every paired difference to FedAvg is within noise"
  low, high = min(means.values()), max(means.values())
  assert f"{low:.3f} to {high:.3f}" == "0.806 to 0.830" and high - low <= 0.025
  order = sorted(
    (k for k in ("IFCA", "pFedMe", "Local", "FedSGD", "Ditto")), key=means.get, reverse=True
  )
  assert order == ["IFCA", "pFedMe", "Local", "FedSGD", "Ditto"]
  assert min(means[k] for k in order) > means["FedAvg"]
  assert "IFCA, pFedMe, Local, FedSGD and Ditto are next, FedAvg last" in page
  ones = [r["chosen"]["num_clusters"] for r in rec["per_seed"]["IFCA (identical start)"]]
  assert ones == [1] * 5

  def edge_seeds(label, axes):
    return len({e["seed"] for e in rec["edges"] if e["strategy"] == label and e["axis"] in axes})

  assert edge_seeds("Ditto", {"lam"}) == 5 and edge_seeds("pFedMe", {"lam"}) == 4
  assert edge_seeds("Karula", {"t", "eta"}) == 4 and edge_seeds("FedAvg", {"client_lr"}) == 3
  assert "on 5 of 5 splits, pFedMe's on 4 of 5, Karula's `t` or `eta` on 4 of 5" in page
  assert "FedAvg's step at its low edge on 3 of 5" in page
  wall = json.loads((HEART / "karula_heart.json").read_text())["wall_time_s"]
  assert f"Wall time {wall / 60:.1f} minutes" in page


def test_the_writers_paragraph_as_the_records_say():
  """karula-femnist: Karula against FedAvg under each budget (paired difference, Holm p from the
  record checked against scipy's t-test), its choices after widening and the capped run."""
  page = _flat(KARULA_PAGE)
  folder = ROOT / "benchmarks" / "results" / "karula_femnist"
  recs = {b: json.loads((folder / f"karula_femnist_{b}.json").read_text()) for b in BUDGETS}
  said = {
    "plateau": ("0.162 +- 0.079 below FedAvg's (below on every seed, but within noise: p = 0.17)"),
    "uploads": "0.296 +- 0.024 below (behind, p = 0.0084;",
    "gradients": "0.040 +- 0.028 (below on every seed, within noise: p = 0.30)",
  }
  for budget, rec in recs.items():
    mine = np.array([r["value"] for r in rec["per_seed"]["Karula"]])
    ref = np.array([r["value"] for r in rec["per_seed"]["FedAvg"]])
    d = rec["paired"]["accuracy"]["Karula"]
    assert d["p_value"] == pytest.approx(float(stats.ttest_rel(mine, ref).pvalue), rel=1e-6)
    assert f"{-d['difference']:.3f} +- {d['difference_2se']:.3f}" in said[budget]
    assert (mine < ref).all() and f"p = {d['holm_p']:.2g}" in said[budget]
    assert (d["holm_p"] < 0.05) == ("behind" in said[budget])
    assert said[budget] in page
  plateau = recs["plateau"]
  chosen = [r["chosen"] for r in plateau["per_seed"]["Karula"]]
  assert [c["eta"] for c in chosen] == [4.0] * 3
  edges = [(e["seed"], e["axis"]) for e in plateau["edges"] if e["strategy"] == "Karula"]
  assert edges == [(1, "t")]
  assert f"{min(c['t'] for c in chosen):.1e}" == "6.7e-08"
  assert f"{max(c['t'] for c in chosen):.1e}" == "6.7e-06"
  assert "`t` from `6.7e-8` to `6.7e-6`" in page and "(seed 1: the limit reached)" in page
  capped = [r["seed"] for r in plateau["per_seed"]["Karula"] if r["at_cap"]]
  assert capped == [2] and "its plateau run on seed 2 stopped at the 60-round cap" in page
  rounds = {b: rec["table"]["Karula"]["rounds"] for b, rec in recs.items()}
  assert (rounds["uploads"], rounds["gradients"]) == (26, 146)
  wall = json.loads((folder / "karula_femnist.json").read_text())["wall_time_s"]
  assert f"Wall time {wall / 60:.0f} minutes" in page


BUDGETS = ("plateau", "uploads", "gradients")
