"""The README's and the FGDRO page's claims about the Table 7 stand-in are computed here from the
JSON record they come from (``benchmarks/results/fgdro_table7/fgdro_table7.json``: every
comparison's per-seed values and paired differences against FGDRO-KL) and must appear in the
prose as written: every "ahead", "behind", "within noise" and "on every seed" verdict, every
mean and every paired difference quoted. A rerun that changes a record, or an edit that
strengthens a sentence, fails this test."""

import json
import pathlib

import numpy as np
import pytest

stats = pytest.importorskip("scipy.stats")

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "fgdro_table7" / "fgdro_table7.json"
README = (ROOT / "README.md").read_text()
PAGE = (ROOT / "docs" / "reproductions" / "fgdro.md").read_text()
COLUMNS = {
  "worst class": "worst_class_accuracy",
  "worst client": "worst_client_accuracy",
  "average": "mean_client_accuracy",
}
ALPHAS = ("0.3", "10")


def _flat(text):
  return " ".join(text.split())


def _results():
  return json.loads(RECORD.read_text())["results"]


def _values(record, label):
  """Per-seed reported values of ``label`` in a comparison, in seed order."""
  return np.array([row["value"] for row in record["per_seed"][label]])


def _paired(record, label):
  """(difference, wins, seeds, Holm-adjusted p) of ``label`` minus FGDRO-KL, recomputed from the
  per-seed values (the record's own entry must agree)."""
  mine, ref = _values(record, label), _values(record, "FGDRO-KL")
  diff = mine - ref
  entry = record["paired"][record["metric"]["name"]][label]
  assert entry["difference"] == pytest.approx(diff.mean())
  assert entry["wins"] == int((diff > 0).sum())
  if np.all(diff == diff[0]):
    p = float("nan")
  else:
    p = float(stats.ttest_rel(mine, ref).pvalue)
    assert entry["p_value"] == pytest.approx(p)
  return float(diff.mean()), int((diff > 0).sum()), len(diff), entry.get("holm_p", p)


def _verdicts(record):
  """{"ahead": [...], "behind": [...], "noise": [...], "every": [...]} against FGDRO-KL, at a
  Holm-adjusted paired p below 0.05; "every": ahead on every seed."""
  out = {"ahead": [], "behind": [], "noise": [], "every": []}
  for label in record["table"]:
    if label == "FGDRO-KL":
      continue
    diff, wins, seeds, p = _paired(record, label)
    kind = "noise" if not p < 0.05 else ("ahead" if diff > 0 else "behind")
    out[kind].append(label)
    if wins == seeds:
      out["every"].append(label)
  return out


def _names(labels):
  return ", ".join(labels) if labels else "none"


def outcome_lines(results):
  """The page's outcome lines, one per partition and column, as the records give them."""
  lines = []
  for alpha in ALPHAS:
    for column, metric in COLUMNS.items():
      record = results[f"dir{alpha}_{metric}"]
      v = _verdicts(record)
      ref = _values(record, "FGDRO-KL")
      two_se = 2 * ref.std(ddof=1) / np.sqrt(ref.size)
      lines.append(
        f"Dirichlet({alpha}), {column}: FGDRO-KL {ref.mean():.3f} +- {two_se:.3f}; ahead of it "
        f"(Holm p < 0.05): {_names(v['ahead'])}; behind it: {_names(v['behind'])}; within noise: "
        f"{len(v['noise'])} of 10 rows; ahead on every seed: {_names(v['every'])}."
      )
  return lines


def test_every_table7_verdict_on_the_page_is_the_records():
  page = _flat(PAGE)
  for line in outcome_lines(_results()):
    assert line in page, line


def test_the_readme_sentence_on_table7_is_the_records():
  results = _results()
  ahead = sorted(
    {
      label
      for alpha in ALPHAS
      for metric in COLUMNS.values()
      for label in _verdicts(results[f"dir{alpha}_{metric}"])["ahead"]
    }
  )
  behind = sorted(
    {
      label
      for alpha in ALPHAS
      for metric in COLUMNS.values()
      for label in _verdicts(results[f"dir{alpha}_{metric}"])["behind"]
    }
  )
  sentence = (
    f"rows ahead of FGDRO-KL at a Holm-adjusted paired p below 0.05 in some column: "
    f"{_names(ahead)}; behind it in some column: {_names(behind)}"
  )
  readme, page = _flat(README), _flat(PAGE)
  assert sentence in readme and sentence in page


def test_the_rows_ahead_on_every_seed_are_the_records():
  results = _results()
  counts = {}
  for alpha in ALPHAS:
    for metric in COLUMNS.values():
      for label in _verdicts(results[f"dir{alpha}_{metric}"])["every"]:
        counts[label] = counts.get(label, 0) + 1
  page = _flat(PAGE)
  assert counts["DRFA"] == counts["FGDRO-KL-Adam"] == 6 and counts["LocalAdam"] == 5
  assert (
    "DRFA and FGDRO-KL-Adam are ahead of FGDRO-KL on every seed in 6 of 6 columns and LocalAdam "
    "in 5 of 6" in page
  )
  assert 0.5**3 == 0.125 and "one-sided p = 0.125" in page


def _column_means(results, metric, alpha):
  record = results[f"dir{alpha}_{metric}"]
  return {label: float(_values(record, label).mean()) for label in record["table"]}


def test_the_partition_shift_of_each_accuracy_is_the_records():
  """The "Worst Acc" argument's stand-in numbers: how each accuracy moves from Dirichlet(0.3)
  to Dirichlet(10), row by row."""
  results = _results()
  page = _flat(PAGE)
  for column in ("worst client", "worst class"):
    metric = COLUMNS[column]
    low, high = _column_means(results, metric, "0.3"), _column_means(results, metric, "10")
    shift = np.array([high[k] - low[k] for k in low])
    text = (
      f"the {column} moves from Dirichlet(0.3) to (10) by a median of {np.median(shift):+.3f} "
      f"({shift.min():+.3f} to {shift.max():+.3f}; {int((shift < 0).sum())} of {shift.size} rows "
      "falling)"
    )
    assert text in page, text


def test_the_quoted_means_are_the_records():
  """Every "ROW X.XXX +- Y.YYY" the page quotes for a column is that column's mean +- 2 SE."""
  results = _results()
  page = _flat(PAGE)
  for alpha in ALPHAS:
    for metric in COLUMNS.values():
      record = results[f"dir{alpha}_{metric}"]
      for label, row in record["table"].items():
        values = _values(record, label)
        assert row[metric]["mean"] == pytest.approx(values.mean())
        assert row[metric]["two_se"] == pytest.approx(2 * values.std(ddof=1) / np.sqrt(values.size))
  assert "ddof 1" in page and "mean +- 2 SE" in page
