"""`python benchmarks/speed.py --preset gpu --tiny`: the GPU entry point's code path with tiny
sizes on any device: every part is measured and reported (its logic, not its timings)."""

import json
import math

import pytest

from tests.helpers import load_benchmark


def test_gpu_preset_tiny_runs_every_part(tmp_path):
  bench = load_benchmark("speed")
  gpu = load_benchmark("speedlib.gpu")
  out = tmp_path / "speed_gpu.json"
  sections = ",".join(gpu.GPU_SECTIONS)
  result = bench.main(
    ["--preset", "gpu", "--tiny", "--gpu-sections", sections, "--out", str(out)]
    + ["--trace-dir", str(tmp_path)]
  )
  saved = json.loads(out.read_text())
  assert saved["errors"] == {} and saved["meta"]["tiny"] and saved["meta"]["preset"] == "gpu"
  # the peaks of the rooflines
  peaks = saved["peaks"]
  assert (
    peaks["bytes_per_s"] > 0 and peaks["flops_per_s"] == saved["dense"]["float32"]["flops_per_s"]
  )
  # the anchors, each against its roofline; the FEMNIST one traced
  assert [r["workload"] for r in saved["anchors"]] == ["flute_femnist", "pfl_cifar10"]
  assert all("full_run_s" not in r for r in result["anchors"])  # CPU: projections only
  for r in saved["anchors"]:
    rf = r["roofline"]
    assert rf["share"] == rf["bound_s"] / r["s_per_round"]
    assert rf["bound_s"] == max(rf["compute_s"], rf["memory_s"])
    assert (
      rf["memory_s"]
      == rf["client_step"]["bytes"] * r["executed_steps_per_round"] / (peaks["bytes_per_s"])
    )
  assert "trace" in saved["anchors"][0]
  # the FEMNIST anchor again with the dense layer factored
  (factored,) = saved["factored"]
  assert factored["workload"] == "flute_femnist" and factored["factored_dense"]
  assert any("the dense layer factored" in line for line in saved["acceptance"])
  # the variants: every (exit-test block, chunk) of VARIANTS but the platform's own
  variants = {(r["step_block"], r["epoch_chunk"]) for r in saved["blocks"]}
  assert variants == set(gpu.VARIANTS) - {(1, None)}  # the CPU's defaults: k = 1, one group
  # the sweep against one run
  (sweep,) = saved["sweep"]
  assert sweep["configs"] == 4 and sweep["diverged"] == 0 and sweep["backend"] == "map"
  assert sweep["ratio_whole"] == sweep["sweep_whole_s"] / sweep["run_whole_s"]
  one = sweep["roofline_run"]
  assert sweep["roofline_sweep"]["memory_s"] == pytest.approx(
    sweep["configs"]
    * sweep["useful_client_steps_per_round"]
    * one["client_step"]["bytes"]
    / peaks["bytes_per_s"]
  )
  assert sweep["least_ratio_by_roofline"] == pytest.approx(
    sweep["roofline_sweep"]["bound_s"] / (sweep["run_compiled_s"] / sweep["rounds"])
  )
  # the CNN and the MLP against their rooflines
  rows = saved["roofline"]["rows"]
  assert [(r["model"], r["num_clients"]) for r in rows] == [("cnn-auto", 4), ("mlp", 4)]
  for r in rows:
    assert r["share"] == pytest.approx(r["bound_s"] * r["updates_per_s"] / r["num_clients"])
  # and again with their wide dense layers factored (4 steps of 32 rows: 128 stacked rows): the
  # tiny MLP's 256 x 128 layer, not its 128 x 16 one; the tiny CNN's layers are all too narrow
  # (at full size: the CNN's 3136 x 128, the MLP's 784 x 200 and 200 x 200)
  assert "factored" not in rows[0]
  f = rows[1]["factored"]
  assert f["layers"] == ["Dense_0"]
  assert f["speedup"] == pytest.approx(f["updates_per_s"] / rows[1]["updates_per_s"])
  md = (tmp_path / "speed_gpu.md").read_text()
  assert "against the dense rounds" in md
  assert "tiny sizes" in md and "## Anchors" in md and md.count("## Acceptance") == 1
  for title in ("## Rounds against the roofline", "## A sweep of the workload against one run"):
    assert title in md
  assert "What the device executed" in md and "no device streams in the trace (CPU)" in md


@pytest.mark.slow
def test_gpu_preset_tiny_extra_sections(tmp_path):
  """The sections not run by default: the CNN against the per-client loop, the convolution
  forms in bf16, the MLP per precision, 10,000 CNN clients (tiny sizes)."""
  bench = load_benchmark("speed")
  gpu = load_benchmark("speedlib.gpu")
  out = tmp_path / "speed_gpu.json"
  sections = ",".join(gpu.EXTRA_SECTIONS)
  bench.main(["--preset", "gpu", "--tiny", "--gpu-sections", sections, "--out", str(out)])
  saved = json.loads(out.read_text())
  assert saved["errors"] == {}
  # the extra sections
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
  md = (tmp_path / "speed_gpu.md").read_text()
  assert "bf16 dense rate" in md and "## The convolution forms in bf16" in md
  assert 'conv="auto" computes bf16 with' in md


@pytest.mark.slow
def test_gpu_preset_merges_an_earlier_results_file(tmp_path):
  """--merge-from keeps the sections not measured (and says which), replaces the others."""
  bench = load_benchmark("speed")
  earlier = tmp_path / "earlier.json"
  bench.main(["--preset", "gpu", "--tiny", "--gpu-sections", "cifar", "--out", str(earlier)])
  out = tmp_path / "now.json"
  bench.main(
    ["--preset", "gpu", "--tiny", "--gpu-sections", "roofline", "--merge-from", str(earlier)]
    + ["--out", str(out)]
  )
  saved = json.loads(out.read_text())
  assert [r["workload"] for r in saved["anchors"]] == ["pfl_cifar10"]  # kept whole
  assert saved["meta"]["kept_from"]["keys"] == ["anchors"]
  assert [r["model"] for r in saved["roofline"]["rows"]] == ["cnn-auto", "mlp"]  # measured
  again = tmp_path / "again.json"
  bench.main(
    ["--preset", "gpu", "--tiny", "--gpu-sections", "femnist", "--merge-from", str(out)]
    + ["--out", str(again)]
  )
  saved = json.loads(again.read_text())
  assert [r["workload"] for r in saved["anchors"]] == ["flute_femnist", "pfl_cifar10"]
  assert saved["meta"]["kept_from"]["keys"] == ["roofline", "anchors: pfl_cifar10"]
  with pytest.raises(ValueError, match="unknown section 'nope'"):
    bench.main(["--preset", "gpu", "--tiny", "--gpu-sections", "nope", "--out", str(out)])


def test_dense_yardstick_sets_the_precision_on_the_timed_product():
  # timed outside any matmul-precision context, as the yardstick times it: float32 must be
  # HIGHEST (true float32 on a GPU, where JAX's default for float32 products is TF32)
  import jax
  import jax.numpy as jnp

  workloads = load_benchmark("speedlib.workloads")
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
