"""fedjax_dro.compare.stats against scipy: the Student t tail and quantile, the paired t-test's
p-value and 95% interval, the sign test, and Holm's adjustment (against a hand computation)."""

import math
import re

import numpy as np
import pytest

from fedjax_dro import compare as C
from fedjax_dro.compare.stats import holm, sign_test, t_cdf, t_quantile, t_sf2, verdict

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 9, 19, 50, 300])
def test_student_t_tail_cdf_and_quantile_match_scipy(df):
  for t in [0.0, 0.01, 0.3, 1.0, 2.0, 3.5, 8.0, 40.0, -1.7]:
    np.testing.assert_allclose(t_sf2(t, df), 2 * scipy_stats.t.sf(abs(t), df), rtol=1e-10)
    np.testing.assert_allclose(t_cdf(t, df), scipy_stats.t.cdf(t, df), rtol=1e-10, atol=1e-15)
  for q in [0.975, 0.995, 0.5, 0.9, 0.025, 0.6]:
    np.testing.assert_allclose(t_quantile(q, df), scipy_stats.t.ppf(q, df), rtol=1e-10, atol=1e-14)


def test_paired_t_test_p_value_and_interval_match_scipy():
  rng = np.random.default_rng(1)
  for n, shift in [(2, 0.5), (3, 0.3), (5, 1.0), (9, 0.1), (30, 0.4)]:
    a, b = rng.normal(size=n), rng.normal(size=n) + shift
    d = C.paired_difference(a, b, higher_is_better=True)
    ref = scipy_stats.ttest_rel(a, b)
    np.testing.assert_allclose(d["p_value"], ref.pvalue, rtol=1e-9)
    low, high = ref.confidence_interval(0.95)
    np.testing.assert_allclose([d["ci95_low"], d["ci95_high"]], [low, high], rtol=1e-9)
    assert d["ci95_low"] < d["difference"] < d["ci95_high"]
  one = C.paired_difference([1.0], [0.0], higher_is_better=True)
  assert math.isnan(one["p_value"]) and math.isnan(one["ci95_low"]) and one["sign_p"] == 0.5


@pytest.mark.parametrize("wins, losses", [(3, 0), (5, 0), (4, 1), (2, 2), (0, 3), (7, 3), (1, 0)])
def test_sign_test_matches_scipy_binomtest(wins, losses):
  ref = scipy_stats.binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue
  np.testing.assert_allclose(sign_test(wins, losses), ref, rtol=1e-12)


def test_sign_p_of_a_paired_difference_counts_wins_among_untied_seeds():
  a, b = [1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 3.0, 5.0]  # two wins, one tie, one loss (higher)
  d = C.paired_difference(a, b, higher_is_better=True)
  assert (d["wins"], d["losses"], d["ties"]) == (2, 1, 1)
  ref = scipy_stats.binomtest(2, 3, 0.5, alternative="greater").pvalue
  np.testing.assert_allclose(d["sign_p"], ref, rtol=1e-12)
  lower = C.paired_difference(a, b, higher_is_better=False)
  np.testing.assert_allclose(
    lower["sign_p"], scipy_stats.binomtest(1, 3, 0.5, alternative="greater").pvalue
  )
  assert sign_test(0, 0) == 1.0


def test_holm_against_a_hand_computation():
  """p = (0.01, 0.04, 0.03, 0.005), m = 4. Sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03),
  0.03 (x2 = 0.06), 0.04 (x1 = 0.04, raised to the running maximum 0.06)."""
  got = holm([0.01, 0.04, 0.03, 0.005])
  np.testing.assert_allclose(got, [0.03, 0.06, 0.06, 0.02], rtol=1e-12)
  got = holm([0.5, float("nan"), 0.3])  # NaN stays NaN and is not counted: m = 2
  assert math.isnan(got[1])
  np.testing.assert_allclose([got[0], got[2]], [0.6, 0.6], rtol=1e-12)
  assert holm([0.9, 0.8]) == [1.0, 1.0]


def test_verdicts_in_words():
  d = {"difference": -0.2, "p_value": 0.01, "wins": 0, "losses": 5}
  assert verdict(d, higher_is_better=False) == "ahead (p = 0.01)"
  assert verdict(d, higher_is_better=True) == "behind (p = 0.01)"
  assert verdict({**d, "holm_p": 0.2}, higher_is_better=False) == (
    "within noise (p = 0.2, Holm-adjusted)"
  )
  old = {"difference": 1.0, "difference_2se": 0.1, "t": 3.0, "wins": 3, "losses": 0}
  assert verdict(old, higher_is_better=True) == "within noise"


# ----------------------------------------------------------------------------------------------
# the record and its markdown
# ----------------------------------------------------------------------------------------------


def _rows(values, seeds):
  from fedjax_dro.core.costs import COST_FIELDS

  return [
    {
      "seed": s,
      "failed": False,
      "value": float(v),
      "extra": {},
      "chosen": {"lr": 0.1},
      "selection_score": float(v),
      "rounds": 5,
      "configurations": 3,
      "spent": {f: 1.0 for f in COST_FIELDS},
      "edges": [],
    }
    for s, v in zip(seeds, values)
  ]


def _summary(num_strategies, rng):
  from fedjax_dro.compare.report import summarize_rows

  seeds = (0, 1, 2, 3, 4)
  labels = [f"S{i}" for i in range(num_strategies)]
  exp = C.Experiment(
    "stats",
    lambda seed: None,
    None,
    [C.Strategy(k, lambda m: None, grid={"lr": [0.1, 0.2]}) for k in labels],
    C.Protocol(seeds=seeds, metric=C.Metric("mse")),
  )
  base = rng.normal(size=len(seeds))
  rows = {
    k: _rows(base + 0.8 * i + 0.3 * rng.normal(size=len(seeds)), seeds)
    for i, k in enumerate(labels)
  }
  return summarize_rows(exp, rows, wall_time=0.0), rows


def test_holm_is_applied_above_three_comparisons_and_the_markdown_shows_the_tests():
  rng = np.random.default_rng(3)
  res, rows = _summary(5, rng)  # four comparisons against S0
  paired = res.paired["mse"]
  raw = [paired[k]["p_value"] for k in ("S1", "S2", "S3", "S4")]
  np.testing.assert_allclose([paired[k]["holm_p"] for k in ("S1", "S2", "S3", "S4")], holm(raw))
  for k in ("S1", "S2", "S3", "S4"):
    a = [r["value"] for r in rows[k]]
    b = [r["value"] for r in rows["S0"]]
    np.testing.assert_allclose(paired[k]["p_value"], scipy_stats.ttest_rel(a, b).pvalue)
  md = res.to_markdown()
  assert "| p | 95% CI | Holm p |" in md
  for k in ("S1", "S2", "S3", "S4"):  # mse: larger is worse, each row is shifted up
    assert f"{k} {verdict(paired[k], higher_is_better=False)}" in md
  assert "behind (p = " in md or "within noise (p = " in md
  small, _ = _summary(3, np.random.default_rng(4))  # two comparisons: no Holm
  assert all("holm_p" not in d for d in small.paired["mse"].values())
  assert "Holm p" not in small.to_markdown() and "| p | 95% CI |" in small.to_markdown()


def test_an_old_record_without_the_tests_still_renders():
  res, _ = _summary(2, np.random.default_rng(5))
  old = res.to_json()
  for d in old["paired"]["mse"].values():
    for key in ("p_value", "ci95_low", "ci95_high", "sign_p"):
      d.pop(key)
  md = C.comparison_markdown(old)
  assert "S1 within noise." in md and re.search(r"\| \d of 5 \|", md)
  new_md = C.comparison_markdown(res.to_json())
  assert "of 5 (" in new_md and "of 5 (" not in md
