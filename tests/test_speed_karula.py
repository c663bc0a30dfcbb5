"""Smoke tests of ``benchmarks/speed_karula.py`` (Karula's round against FedAvg's on a CNN) and
``benchmarks/projection_large_d.py`` (the projection at neural-network sizes) on their
``--quick`` settings: the records' logic and consistency, not their timings."""

import json

import numpy as np
import pytest

from tests.helpers import load_benchmark


def test_speed_karula_quick(tmp_path):
  bench = load_benchmark("speed_karula")
  out = tmp_path / "k.json"
  res = bench.main(["--quick", "--out", str(out)])
  saved = json.loads(out.read_text())
  assert saved["ratio_best"] == pytest.approx(res["ratio_best"])
  fed, kar = saved["fedavg"], saved["karula"]
  assert saved["ratio_best"] == pytest.approx(kar["best_s_per_round"] / fed["best_s_per_round"])
  assert kar["best_s_per_round"] == min(kar["calls_s_per_round"]) > 0
  assert saved["acceptance_met"] == (saved["ratio_best"] <= 3.0)
  warm = saved["projection"]["warm"]
  assert warm["iterations"] >= 0 and warm["violation_before_restoration_rel"] >= 0
  if warm["converged"]:
    assert warm["certified_relative_gap"] <= saved["workload"]["karula"]["tol"] * 1.0001
  metrics = saved["karula_round_metrics"]
  assert metrics["constraint_violation_max"] <= 1e-6 and metrics["projection_iterations_mean"] > 0
  assert 0 < saved["active_fraction"] <= 1  # t puts constraints at their bound
  assert saved["device"]["cpu_count"] >= 1 and saved["device"]["platform"]
  md = (tmp_path / "k.md").read_text()
  assert "Karula/FedAvg" in md and "projection alone" in md


def test_workload_is_the_reproduction_stand_in_with_ot_dissimilarities():
  bench = load_benchmark("speed_karula")
  data, D = bench.writers_data(6, side=8)
  assert data.train.num_clients == 6 and data.train.feature_shape == (8, 8)
  np.testing.assert_allclose(D, D.T, atol=1e-6)
  assert np.all(np.diag(D) == 0) and np.all(D[~np.eye(6, dtype=bool)] > 0)


def test_projection_large_d_quick(tmp_path):
  bench = load_benchmark("projection_large_d")
  out = tmp_path / "p.json"
  records = bench.main(["--quick", "--out", str(out), "--repeats", "1"])
  saved = json.loads(out.read_text())
  assert len(saved["records"]) == len(records) == 2  # float32 and float64
  for rec in saved["records"]:
    assert rec["status"] == "ok"
    # no [n, d] temporary beside the input and the output (the row-space path)
    assert rec["memory_copies"]["temporaries"] < 1.0
    for start in ("cold", "warm"):
      run = rec[start]
      assert run["converged"] and 0 <= run["certified_relative_gap"] <= rec["tol"]
      assert run["violation_before_restoration_rel"] >= 0 and run["iterations"] > 0
  md = (tmp_path / "p.md").read_text()
  assert md.count("| 20 |") == 2


def test_projection_large_d_skips_points_beyond_the_memory_limit(tmp_path):
  bench = load_benchmark("projection_large_d")
  records = bench.main(["--points", "1000:1e6", "--memory-gb", "1", "--out", str(tmp_path / "x")])
  assert [r["status"].split(":")[0] for r in records] == ["skipped", "skipped"]


def test_projection_large_d_cold_only_and_merge(tmp_path):
  bench = load_benchmark("projection_large_d")
  first = tmp_path / "a.json"
  bench.main(["--points", "12:3000", "--dtypes", "float64", "--out", str(first), "--repeats", "1"])
  out = tmp_path / "b.json"
  args = ["--points", "12:3000", "--dtypes", "float32", "--cold-only", "--repeats", "1"]
  records = bench.main(args + ["--merge", str(first), "--out", str(out)])
  assert [(r["dtype"], "warm" in r) for r in records] == [("float32", False), ("float64", True)]
  saved = json.loads(out.read_text())
  assert saved["meta"]["merged_from"]["file"] == "a.json" and len(saved["records"]) == 2
  assert "not run" in (tmp_path / "b.md").read_text()
  assert not (tmp_path / "b.json.partial").exists()
