"""`python benchmarks/speed.py --preset gpu --tiny`: the GPU entry point's code path with tiny
sizes on any device: every part is measured and reported (its logic, not its timings)."""

import json
import math

from tests.helpers import load_benchmark


def test_gpu_preset_tiny_runs_every_part(tmp_path):
  bench = load_benchmark("speed")
  out = tmp_path / "speed_gpu.json"
  result = bench.main(["--preset", "gpu", "--tiny", "--out", str(out)])
  saved = json.loads(out.read_text())
  assert saved["errors"] == {} and saved["meta"]["tiny"] and saved["meta"]["preset"] == "gpu"
  rows = {(r["model"], r["num_clients"]) for r in saved["workloads"]["rows"]}
  assert rows == {("cnn-auto", 4), ("cnn-auto", 8)}  # n = 1000 and 10,000 on a GPU
  for r in saved["workloads"]["rows"]:
    assert r["auto"]["speedup_vs_loop"] == r["auto"]["updates_per_s"] / r["loop"]["updates_per_s"]
  assert all(math.isfinite(r["flops_per_update"]) for r in saved["workloads"]["rows"])
  forms = {(r["model"], r["num_clients"], r["precision"]) for r in saved["cnn_bf16"]["rows"]}
  assert forms == {("cnn-lax", 4, "bf16"), ("cnn-patches", 4, "bf16")}
  precisions = [r["precision"] for r in saved["precision"]["rows"]]
  assert precisions == ["float32", "tf32", "bf16"]
  for r in saved["precision"]["rows"]:
    rate = saved["dense"][r["precision"]]["flops_per_s"]
    assert abs(r["fraction_of_dense"] - r["updates_per_s"] * r["flops_per_update"] / rate) < 1e-9
  assert saved["cnn_10k"]["completed"] and saved["cnn_10k"]["num_clients"] == 8
  assert [r["workload"] for r in saved["anchors"]] == ["flute_femnist", "pfl_cifar10"]
  assert all("full_run_s" not in r for r in result["anchors"])  # CPU: projections only
  md = (tmp_path / "speed_gpu.md").read_text()
  assert "tiny sizes" in md and "## Anchors" in md and "bf16 dense rate" in md
  assert md.count("## Acceptance") == 1 and "## The convolution forms in bf16" in md
  assert 'conv="auto" computes bf16 with' in md


def test_dense_yardstick_sets_the_precision_on_the_timed_product():
  # timed outside any matmul-precision context, as the yardstick times it: float32 must be
  # HIGHEST (true float32 on a GPU, where JAX's default for float32 products is TF32)
  import jax
  import jax.numpy as jnp

  workloads = load_benchmark("speed_workloads")
  a = jnp.ones((4, 4), jnp.float32)
  text = str(jax.make_jaxpr(workloads.dense_product("float32"))(a, a))
  assert "Precision.HIGHEST" in text
  text = str(jax.make_jaxpr(workloads.dense_product("tf32"))(a, a))
  assert "Precision.HIGH" in text and "Precision.HIGHEST" not in text
  assert "Precision.HIGH" not in str(jax.make_jaxpr(workloads.dense_product("bf16"))(a, a))


def test_tiny_needs_the_gpu_preset(capsys):
  import pytest

  bench = load_benchmark("speed")
  with pytest.raises(SystemExit):
    bench.main(["--tiny"])
  assert "--tiny goes with --preset gpu" in capsys.readouterr().err
