"""Smoke tests of the benchmark scripts on tiny grids (their logic, not their timings)."""

import json
import pathlib

import numpy as np
import pytest

from tests.helpers import load_benchmark

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_projection_convergence_quick(capsys):
  bench = load_benchmark("projection_convergence")
  assert bench.main(["--quick"]) == 0  # every run converged
  out = capsys.readouterr().out
  assert out.count("| separated |") == 2 and out.count("| all_active |") == 2


@pytest.mark.slow
def test_projection_scaling_quick_grid(tmp_path):
  bench = load_benchmark("projection_scaling")
  out = tmp_path / "p.json"
  records = bench.main(
    [
      "--quick",
      "--n",
      "8",
      "--d",
      "12",
      "--out",
      str(out),
      "--markdown-out",
      str(tmp_path / "p.md"),
    ]
  )
  roles = [(r["method"], r["role"]) for r in records]
  assert ("dual", "reference") in roles and ("admm", "main") in roles
  best = min(r["objective"] for r in records)
  for r in records:
    assert r["status"] == "ok" and r["violation_returned_rel"] <= 1e-9
    np.testing.assert_allclose(r["gap_vs_best"], (r["objective"] - best) / best, rtol=1e-12)
  for b in (r for r in records if r["method"] in ("admm", "dykstra")):
    # the equal-accuracy dual run is at least as accurate as the baseline it is compared with
    assert b["dual_equal_accuracy_gap"] <= b["gap_vs_best"] + 1e-9
    assert b["speedup_dual_vs_this"] == pytest.approx(b["run_s"] / b["dual_equal_accuracy_s"])
  saved = json.loads(out.read_text())
  assert len(saved["records"]) == len(records)
  assert "speed-up of dual" in (tmp_path / "p.md").read_text()


@pytest.mark.slow
def test_scale_quick(tmp_path):
  bench = load_benchmark("scale")
  out = tmp_path / "scale.json"
  result = bench.main(["--quick", "--out", str(out)])
  assert json.loads(out.read_text())["sweep"]["configs"] == result["sweep"]["configs"] == 8
  assert result["sweep"]["max_abs_diff_vs_sequential"] < 1e-5
  assert [r["devices"] for r in result["devices"]] == [1, 2, 4]
  assert all(r["all_reduce_in_hlo"] for r in result["devices"][1:])
  checksums = [r["checksum"] for r in result["devices"]]
  np.testing.assert_allclose(checksums, checksums[0], rtol=1e-5)
  for row in result["host"]:
    assert row["max_abs_diff_host_vs_device"] == 0.0
  assert (tmp_path / "scale.md").exists()


def test_speed_quick_workloads_folding_and_sweep_cache(tmp_path):
  """benchmarks/speed.py on its quick grid: every requested section is measured and reported."""
  bench = load_benchmark("speed")
  out = tmp_path / "speed.json"
  result = bench.main(
    [
      "--quick",
      "--sections",
      "workloads,folding,sweep_cache",
      "--models",
      "softmax",
      "--backends",
      "vmap,auto",
      "--out",
      str(out),
    ]
  )
  saved = json.loads(out.read_text())
  rows = saved["workloads"]["rows"]
  assert [r["num_clients"] for r in rows] == [10]
  for backend in ("vmap", "auto"):
    r = rows[0][backend]
    assert r["updates_per_s"] > 0 and r["speedup_vs_loop"] > 0
    assert r["s_per_round"] == pytest.approx(10 / r["updates_per_s"])
  assert {r["model"] for r in saved["folding"]["rows"]} == {"softmax", "mlp"}
  assert all(r["grad_folded_s"] > 0 for r in result["folding"]["rows"])
  assert "client axis folded" in (tmp_path / "speed.md").read_text()
  cache = {r["model"]: r for r in saved["sweep_cache"]["rows"]}
  assert set(cache) == {"softmax", "mlp"}
  for r in cache.values():
    assert r["speedup"] == pytest.approx(r["whole_per_row_s"] / r["row_shared_s"])
  # the MLP's rows share the target: smaller chunks than one run's, and the constant restored
  assert max(cache["mlp"]["row_shared_chunks"]) <= max(cache["mlp"]["whole_per_row_chunks"])
  assert min(cache["mlp"]["row_shared_chunks"]) < max(cache["mlp"]["whole_per_row_chunks"])
  assert bench.speed_sections.client_backends.AUTO_CPU_CHUNK_BYTES == 24 * 2**20
  assert "rows share the CPU cache target" in (tmp_path / "speed.md").read_text()


@pytest.mark.slow  # ~30 s; --devices splitting the CPU is tested in tests/engine/test_scale.py
def test_speed_devices_section_splits_the_cpu(tmp_path):
  """speed.py's devices section in a fresh process: --cpu-devices 2 makes two CPU devices without
  XLA_FLAGS, and the sweep is timed on one device, configurations split and clients split."""
  import os
  import subprocess
  import sys

  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
  out = tmp_path / "speed.json"
  proc = subprocess.run(
    [sys.executable, str(ROOT / "benchmarks" / "speed.py"), "--quick", "--sections", "devices"]
    + ["--cpu-devices", "2", "--out", str(out)],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  saved = json.loads(out.read_text())
  assert saved["meta"]["num_devices"] == 2 and saved["devices"]["devices"] == 2
  rows = saved["devices"]["rows"]
  assert [(r["model"], r["num_clients"]) for r in rows] == [("softmax", 10), ("mlp", 10)]
  for r in rows:
    for name in ("configs_split", "clients_split"):
      assert r[f"{name}_speedup"] == pytest.approx(r["one_device_s"] / r[f"{name}_s"])
  assert "## A sweep on 2 devices" in (tmp_path / "speed.md").read_text()


def test_speed_render_derives_the_loop_ceiling(tmp_path):
  """--render rewrites the markdown from the JSON alone, and the softmax check states what 60x
  asks of the hardware: the speed-up at 100% of the dense rate is speed-up / share of it."""
  bench = load_benchmark("speed")
  saved = json.loads((ROOT / "benchmarks" / "results" / "speed.json").read_text())
  (row,) = [
    r for r in saved["workloads"]["rows"] if (r["model"], r["num_clients"]) == ("softmax", 1000)
  ]
  # 50,000 updates/s = 5x the loop, at 4% of the dense rate -> 125x at 100%; 60x needs 48%.
  loop = 10_000.0
  row["loop"] = {"updates_per_s": loop}
  row["auto"] = {"updates_per_s": 5 * loop, "speedup_vs_loop": 5.0, "fraction_of_dense": 0.04}
  row.pop("auto_mesh", None)
  out = tmp_path / "speed.json"
  out.write_text(json.dumps(saved))
  result = bench.main(["--render", "--out", str(out)])
  (line,) = [a for a in result["acceptance"] if a.startswith("softmax")]
  assert "100% of the dense rate would be 125x and 60x needs 48% of it" in line
  assert "where auto reaches 4%" in line and line.endswith("FAIL")
  assert "on one device (target 60x" in line  # no mesh measured: no mesh figure
  assert json.loads(out.read_text())["acceptance"] == result["acceptance"]
  assert line in (tmp_path / "speed.md").read_text()


# Multiply-adds per example of one local step of the MLP 784-200-200-62: the forward products of
# its three layers, the weight gradients of all three, and the input gradients of the top two
# (none for the data).
MLP_STEP_MACS = 2 * 784 * 200 + 3 * 200 * 200 + 3 * 200 * 62


def test_step_products_are_the_step_matmuls():
  """step_products finds every product of a vmapped local step, inside the nested calls JAX
  traces it to: softmax regression's forward and weight gradient, the MLP's eight, with the
  closed-form FLOP count of each model's step."""
  bench = load_benchmark("speed")
  for kind, clients, count, macs in (("softmax", 3, 2, 2 * 64 * 10), ("mlp", 2, 8, MLP_STEP_MACS)):
    model, params, data = bench.speed_workloads.make_workload(kind, 4)
    products = bench.speed_ceiling.step_products(model, params, data.x[0], data.y[0], clients)
    assert len(products) == count
    assert all(p["batch"] == clients and p["dtype"] == "float32" for p in products)
    flops = sum(2 * p["batch"] * p["m"] * p["k"] * p["n"] for p in products)
    assert flops == clients * 2 * bench.speed_workloads.BATCH * macs
  model, params, data = bench.speed_workloads.make_workload("softmax", 4)
  products = bench.speed_ceiling.step_products(model, params, data.x[0], data.y[0], 3)
  shapes = sorted((p["k"], tuple(sorted((p["m"], p["n"])))) for p in products)
  # logits = x [32 x 64] @ W [64 x 10]; dW = x^T [64 x 32] @ dlogits [32 x 10]
  assert shapes == [(32, (10, 64)), (64, (10, 32))]


def _dot_in_loop(compiled_text):
  """Whether a compiled HLO module computes a ``dot`` inside a while loop's body (in the body or
  in a computation it calls), rather than once before the loop."""
  import re

  computations = {}
  for block in compiled_text.split("\n\n"):
    head = re.match(r"\s*(?:ENTRY )?%([\w.\-]+) ", block)
    if head:
      computations[head.group(1)] = block

  def has_dot(name, seen=()):
    text = computations.get(name, "")
    called = re.findall(r"(?:calls|body|to_apply)=%([\w.\-]+)", text)
    return " dot(" in text or any(has_dot(c, seen + (name,)) for c in called if c not in seen)

  bodies = re.findall(r"while\(.*?body=%([\w.\-]+)", compiled_text)
  return any(has_dot(b) for b in bodies)


def test_repeated_product_stays_in_the_loop():
  """The ceiling's timing loop computes the product every iteration: with the optimization
  barrier the product stays in the loop's body; without it XLA computes the product of the
  unchanged operands once, before the loop or instead of it, which would time nothing."""
  import functools

  import jax
  import jax.numpy as jnp

  bench = load_benchmark("speed")
  fn = functools.partial(jnp.einsum, "zmk,zkn->zmn")
  lhs = jnp.arange(120.0).reshape(3, 8, 5)
  rhs = jnp.arange(60.0).reshape(3, 5, 4)

  def compiled(f):
    return jax.jit(f).lower(lhs, rhs).compile().as_text()

  assert _dot_in_loop(compiled(bench.speed_ceiling.repeated(fn, 5)))
  np.testing.assert_allclose(
    jax.jit(bench.speed_ceiling.repeated(fn, 5))(lhs, rhs), fn(lhs, rhs), rtol=1e-6
  )

  def no_barrier(a, b):
    body = lambda _, c: (c[0], c[1], fn(c[0], c[1]))  # noqa: E731
    return jax.lax.fori_loop(0, 5, body, (a, b, jnp.zeros((3, 8, 4), a.dtype)))[2]

  assert not _dot_in_loop(compiled(no_barrier))


def test_speed_ceiling_section_quick(tmp_path):
  """The ceiling section on its quick grid: the ceiling is the best chunk's rate, its FLOPs
  those of the step's products, shares of the dense rate and of the ceiling derived from the
  measured rates, and an acceptance line per workload."""
  bench = load_benchmark("speed")
  out = tmp_path / "speed.json"
  result = bench.main(["--quick", "--sections", "ceiling", "--out", str(out)])
  ceiling = json.loads(out.read_text())["ceiling"]
  rate = ceiling["dense_flops_per_s"]
  assert rate >= result["dense"]["float32"]["flops_per_s"]  # the best of before and after
  rows = {r["model"]: r for r in ceiling["rows"]}
  assert set(rows) == {"softmax", "mlp"}
  macs = {"softmax": 2 * 64 * 10, "mlp": MLP_STEP_MACS}
  for kind, r in rows.items():
    assert r["num_clients"] == 10 and [c["chunk"] for c in r["by_chunk"]] == [1, 10]
    c = r["ceiling"]
    assert c["updates_per_s"] == max(x["updates_per_s"] for x in r["by_chunk"])
    assert (
      r["product_flops_per_update"]
      == bench.speed_workloads.LOCAL_STEPS * 2 * bench.speed_workloads.BATCH * macs[kind]
    )
    step_s = sum(p["s"] for p in c["products"])
    assert c["updates_per_s"] == pytest.approx(
      c["chunk"] / (bench.speed_workloads.LOCAL_STEPS * step_s)
    )
    assert sum(p["share"] for p in c["products"]) == pytest.approx(1.0)
    for part in (r["auto"], c):
      assert part["fraction_of_dense"] == pytest.approx(
        part["updates_per_s"] * r["flops_per_update"] / rate
      )
      assert part["speedup_vs_loop"] == pytest.approx(
        part["updates_per_s"] / r["loop_updates_per_s"]
      )
    assert r["auto_of_ceiling"] == pytest.approx(r["auto"]["updates_per_s"] / c["updates_per_s"])
  chain = result["ceiling"]["rows"][0]["product_chain"]  # softmax only
  assert [c["chunk"] for c in chain["by_chunk"]] == [1, 10] and chain["best_s"] > 0
  assert "product_chain" not in result["ceiling"]["rows"][1]
  hand = result["ceiling"]["rows"][0]["hand_written"]
  rungs = [name for name, _ in bench.speed_ceiling.HAND_WRITTEN_RUNGS]
  assert list(hand) == rungs and "hand_written" not in result["ceiling"]["rows"][1]
  for h in hand.values():
    assert [c["chunk"] for c in h["by_chunk"]] == [1, 10]
    assert h["best_s"] == min(c["s"] for c in h["by_chunk"])
    assert h["updates_per_s"] == pytest.approx(10 / h["best_s"])
    assert h["of_ceiling"] == pytest.approx(
      h["updates_per_s"] / rows["softmax"]["ceiling"]["updates_per_s"]
    )
  md = (tmp_path / "speed.md").read_text()
  assert all(f"| {name} |" in md for name in rungs) and "| `auto` |" in md
  lines = [a for a in result["acceptance"] if a.startswith("ceiling, ")]
  assert [a.split(":")[0] for a in lines] == ["ceiling, softmax n=10", "ceiling, mlp n=10"]
  assert "## Matmul ceiling" in (tmp_path / "speed.md").read_text()


def test_ceiling_lines_compare_the_targets():
  """Each row's share of the ceiling is compared with its target (50% softmax, 66% MLP), and the
  softmax product chain is reported against the ceiling's time (synthetic rows)."""
  bench = load_benchmark("speed")

  def row(model, speedup, fraction, share):
    part = {"speedup_vs_loop": speedup, "fraction_of_dense": fraction, "chunk": 100}
    auto = {"speedup_vs_loop": speedup * share, "fraction_of_dense": fraction * share}
    return {
      "model": model,
      "num_clients": 1000,
      "auto": auto,
      "ceiling": part,
      "auto_of_ceiling": share,
    }

  chained = {**row("softmax", 54.0, 0.44, 0.25), "product_chain": {"of_ceiling_time": 1.6}}
  result = {"ceiling": {"rows": [chained, row("mlp", 2.5, 0.62, 0.7)]}}
  softmax, mlp = bench.speed_report.ceiling_lines(result)
  assert softmax.startswith("ceiling, softmax n=1000: auto 13.5x the loop, 11%")
  assert "ceiling 54.0x the loop, 44% (100 clients side by side" in softmax
  assert "auto reaches 25% of it (target 50% of the ceiling: not met)" in softmax
  assert softmax.endswith("in their fastest layout, take 1.6x the ceiling's time")
  hand = {"same computation": {"of_ceiling": 0.27, "auto_of_this": 0.93, "updates_per_s": 9.0}}
  hand["no softmax"] = {"of_ceiling": 0.31, "auto_of_this": 0.8, "updates_per_s": 10.0}
  (by_hand,) = bench.speed_report.ceiling_lines(
    {"ceiling": {"rows": [{**chained, "hand_written": hand}]}}
  )
  assert by_hand.endswith(
    "; the same round written by hand reaches 27% of it (auto runs at 0.93x its rate), "
    "the leanest hand-written round 31%"
  )
  assert mlp.endswith("auto reaches 70% of it (target 66% of the ceiling: met)")
  low = bench.speed_report.ceiling_lines({"ceiling": {"rows": [row("mlp", 2.5, 0.62, 0.65)]}})
  assert low[0].endswith("(target 66% of the ceiling: not met)")


@pytest.mark.slow
def test_karula_dissimilarity_quick(capsys):
  """benchmarks/karula_dissimilarity.py --quick: every task and variant row, separation scores in
  range, the oracle D separating the groups perfectly, one Karula error per t multiple."""
  bench = load_benchmark("karula_dissimilarity")
  assert bench.main(["--quick"]) == 0
  out = capsys.readouterr().out
  for row in (
    "group means: paper (default)",
    "group means: entropic",
    "group means: features only",
    "group means: response only",
    "group means: oracle D",
    "equal means: paper (default)",
    "equal means: oracle D",
  ):
    assert f"| {row} |" in out, row
  oracle = [line for line in out.splitlines() if line.startswith("| group means: oracle D |")][0]
  cells = [c.strip() for c in oracle.strip("|").split("|")]
  assert float(cells[2]) == 1.0  # AUC: every same-group pair below every other-group pair
  assert len(cells) == 4 + len(bench.T_MULTIPLES) + 1


def test_karula_dissimilarity_separation_scores():
  bench = load_benchmark("karula_dissimilarity")
  theta = np.repeat(np.array([[0.0], [1.0], [3.0]]), 2, axis=0)
  groups = np.array([0, 0, 1, 1, 2, 2])
  truth = np.abs(theta - theta.T)
  perfect = bench.separation(truth, theta, groups)
  assert perfect["spearman"] == pytest.approx(1.0) and perfect["auc"] == 1.0
  assert perfect["within_between"] == 0.0
  reversed_ = bench.separation(truth.max() - truth, theta, groups)
  assert reversed_["auc"] == 0.0 and reversed_["spearman"] < 0


def test_softmax_round_by_hand_is_the_simulators_round():
  """The hand-written softmax round at its first rung returns the simulator's FedAvg round (same
  keys, same data; float32 rounding) whatever its chunking, a different key gives another
  round, the transposed-weights rung equals the rung above it, and an unknown rung is refused."""
  import jax

  from fedjax_dro.algorithms import fedavg
  from fedjax_dro.algorithms.base import make_hparams

  bench = load_benchmark("speed")
  ceiling, workloads = bench.speed_ceiling, bench.speed_workloads
  n, lr, key = 12, 0.05, jax.random.PRNGKey(3)
  model, params, data = workloads.make_workload("softmax", n)
  alg = fedavg(model, local_steps=workloads.LOCAL_STEPS, batch_size=workloads.BATCH)
  state = alg.init(params, data, jax.random.PRNGKey(0))
  new, _ = jax.jit(alg.round)(state, data, key, make_hparams(alg, {"client_lr": lr}))
  args = (params, data.x, data.y, data.num_examples)
  for chunk in (1, 5, n):
    mine = ceiling.softmax_round_by_hand("same computation", n, chunk, lr)(*args, key)
    for name in ("w", "b"):
      np.testing.assert_allclose(mine[name], new.params[name], rtol=0, atol=1e-7)
  moved = float(np.max(np.abs(new.params["w"] - params["w"])))
  assert moved > 1e-3  # the round moves the model far more than the tolerance
  other = ceiling.softmax_round_by_hand("same computation", n, 5, lr)(*args, jax.random.PRNGKey(4))
  assert float(np.max(np.abs(other["w"] - new.params["w"]))) > 1e-4
  plain = ceiling.softmax_round_by_hand("no softmax", n, 5, lr)(*args, key)
  transposed = ceiling.softmax_round_by_hand("no softmax, weights [k, d]", n, 5, lr)(*args, key)
  np.testing.assert_allclose(transposed["w"], plain["w"], rtol=0, atol=1e-6)
  np.testing.assert_array_equal(plain["b"], params["b"])
  with pytest.raises(ValueError, match="rung must be one of"):
    ceiling.softmax_round_by_hand("no products", n, 5, lr)


def test_speed_head_quick(tmp_path):
  """benchmarks/speed_head.py --quick: both forms of each k measured, the ratio derived from the
  rates, the table in HEAD_MEASUREMENTS' layout, and the markdown's auto section."""
  bench = load_benchmark("speed_head")
  out = tmp_path / "head.json"
  result = bench.main(["--quick", "--out", str(out)])
  rows = json.loads(out.read_text())["rows"]
  assert [r["num_classes"] for r in rows] == [2, 62] and rows == result["rows"]
  for r in rows:
    assert r["plain"] > 0 and r["transposed"] > 0
    assert r["ratio_transposed_over_plain"] == pytest.approx(r["transposed"] / r["plain"])
  assert set(result["table"]["cpu"]) == {2, 62}
  md = (tmp_path / "head.md").read_text()
  assert "| 2 |" in md and "| 62 |" in md and '## What `head="auto"` picks' in md


def test_the_benchmarks_readme_lists_every_runnable_script():
  """Every script in benchmarks/ with a ``__main__`` entry is named in benchmarks/README.md."""
  import pathlib

  folder = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
  readme = (folder / "README.md").read_text(encoding="utf-8")
  runnable = sorted(
    p.name
    for p in folder.glob("*.py")
    if 'if __name__ == "__main__"' in p.read_text(encoding="utf-8")
  )
  assert len(runnable) >= 10, runnable
  assert [name for name in runnable if f"`{name}" not in readme] == []


@pytest.mark.slow  # ~50 s on 2 loaded cores: eight compilations (four models, two sides each)
def test_speed_zoo_quick(tmp_path):
  """benchmarks/speed_zoo.py --quick: every zoo architecture timed through the simulator and the
  per-client loop, the ratio derived from the two, the smoke run labelled as such."""
  bench = load_benchmark("speed_zoo")
  result = bench.main(["--quick", "--out", str(tmp_path)])
  assert [r["arch"] for r in result["rows"]] == list(bench.ARCHS)
  for r in result["rows"]:
    assert r["simulator_s_per_round"] > 0 and r["loop_s_per_round"] > 0
    assert r["loop_over_simulator"] == pytest.approx(
      r["loop_s_per_round"] / r["simulator_s_per_round"]
    )
  saved = json.loads((tmp_path / "speed_zoo.json").read_text())
  assert saved["meta"]["quick"] and len(saved["rows"]) == len(bench.ARCHS)
  md = (tmp_path / "speed_zoo.md").read_text()
  assert "Smoke run" in md and "| loop / simulator |" in md


def test_zoo_flops_quick(tmp_path):
  """benchmarks/zoo_flops.py --quick: parameter counts equal the modules', FLOPs per example from
  XLA's cost analysis, within 20% of the closed form for the CIFAR CNN's layers."""
  bench = load_benchmark("zoo_flops")
  bench.main(["--quick", "--out", str(tmp_path)])
  rows = {r["model"]: r for r in json.loads((tmp_path / "zoo_flops.json").read_text())["rows"]}
  cnn = rows["cifar_cnn, 32x32x3, 10 classes"]
  assert cnn["parameters"] == 1_626_442
  # 2 x multiply-adds: conv 3->32 on 30x30, conv 32->64 on 28x28, dense 12544->128, 128->10
  macs = 30 * 30 * 9 * 3 * 32 + 28 * 28 * 9 * 32 * 64 + 12544 * 128 + 128 * 10
  assert cnn["forward_flops_per_example"] == pytest.approx(2 * macs, rel=0.2)


@pytest.mark.slow  # ~45 s on two cores: XLA's own form is the slow one it measures
def test_conv_loops_quick(tmp_path):
  """benchmarks/conv_loops.py --quick: each workload timed in both forms and by the loop, the
  ratios derived from them, the smoke run labelled."""
  bench = load_benchmark("conv_loops")
  result = bench.main(["--quick", "--out", str(tmp_path), "--workloads", "resnet18_gn,user_nnx"])
  for r in result["rows"]:
    assert r["loop_over_simulator"] == pytest.approx(r["loop_s"] / r["simulator_canonical_s"])
    assert r["xla_over_canonical"] == pytest.approx(
      r["simulator_xla_s"] / r["simulator_canonical_s"]
    )
  assert "a smoke run" in (tmp_path / "conv_loops.md").read_text()


def test_overhead_quick(tmp_path):
  """benchmarks/overhead.py --quick: a round and the plain steps timed, their ratio derived."""
  bench = load_benchmark("overhead")
  result = bench.main(["--quick", "--out", str(tmp_path), "--models", "gpt2", "--repeats", "1"])
  (row,) = result["rows"]
  assert row["overhead"] == pytest.approx(row["round_s"] / row["plain_steps_s"])
  assert "a smoke run" in (tmp_path / "overhead.md").read_text()


def test_streaming_quick(tmp_path):
  """benchmarks/streaming.py --quick: both forms timed on a prepared directory, ratios derived."""
  bench = load_benchmark("streaming")
  result = bench.main(["--quick", "--out", str(tmp_path), "--workloads", "cnn"])
  (row,) = result["rows"]
  assert row["streamed_over_resident"] == pytest.approx(
    row["streamed_round_s"] / row["resident_round_s"]
  )
  assert row["reader_over_consumed"] == pytest.approx(
    row["reader_rows_per_s"] / row["consumed_rows_per_s"]
  )
  assert "a smoke run" in (tmp_path / "streaming.md").read_text()


def test_fgdro_real_size_quick(tmp_path):
  """benchmarks/fgdro_real_size.py --quick: a table's model timed per local iteration, the
  projection of the table's rounds derived from it, the device named."""
  bench = load_benchmark("fgdro_real_size")
  result = bench.main(["--quick", "--only", "camelyon17", "--out", str(tmp_path)])
  (row,) = result["rows"]
  assert row["dataset"] == "camelyon17" and row["clients"] == 3 and not result["errors"]
  assert row["s_per_local_iteration"] == pytest.approx(row["s_per_round"] / row["local_steps"])
  hours = row["compile_s"] / 3600 + 625 * row["s_per_round"] / 3600
  assert row["projected_hours"]["625"] == pytest.approx(hours)
  saved = json.loads((tmp_path / "fgdro_real_size.json").read_text())
  assert saved["meta"]["device_kind"] and saved["rows"][0]["dataset"] == "camelyon17"
  assert "Smoke run" in (tmp_path / "fgdro_real_size.md").read_text()


def test_fedjax_side_by_side_names_its_environment_without_fedjax(tmp_path, monkeypatch):
  """Without FedJAX (the package never depends on it) the benchmark stops with the line that
  installs it, before measuring anything."""
  import sys

  bench = load_benchmark("fedjax_side_by_side")
  monkeypatch.setitem(sys.modules, "fedjax", None)  # import fedjax raises ImportError
  with pytest.raises(SystemExit, match="pip install -e . fedjax"):
    bench.main(["--quick", "--out", str(tmp_path)])
  assert not list(tmp_path.iterdir())
  with pytest.raises(SystemExit):
    bench.main(["--workloads", "mnist", "--out", str(tmp_path)])


@pytest.mark.slow
def test_fedjax_side_by_side_quick(tmp_path):
  """In the benchmark's own environment (FedJAX installed): both frameworks run, and one round
  agrees with FedJAX's to the tolerance on both models."""
  pytest.importorskip("fedjax")
  bench = load_benchmark("fedjax_side_by_side")
  result = bench.main(["--quick", "--out", str(tmp_path)])
  assert [r["workload"] for r in result["speed"]] == ["emnist_conv", "shakespeare"]
  for r in result["agreement"]:
    assert r["agree"] and r["relative"] <= bench.AGREEMENT_TOL and r["max_update"] > 0
    assert r["dtypes"] == ["float64"]
  assert (tmp_path / "fedjax_side_by_side_quick.md").read_text().count("| yes |") == 2
