"""benchmarks/anchors.py: the published workloads' shapes and client sizes, the host / device
placement of the generated federation, and the --quick run through fd.run (its logic, not its
timings)."""

import json
import math

import numpy as np
import pytest

from tests.helpers import load_benchmark


def test_workloads_are_the_published_settings():
  a = load_benchmark("anchors")
  femnist, cifar = a.WORKLOADS["flute_femnist"], a.WORKLOADS["pfl_cifar10"]
  assert (femnist["num_clients"], femnist["clients_per_round"], femnist["batch_size"]) == (
    3400,
    10,
    20,
  )
  assert (femnist["rounds"], femnist["local_epochs"], femnist["image"]) == (1500, 1, (28, 28, 1))
  assert femnist["classes"] == 62
  assert [p["wall_s"] for p in femnist["published"]] == [8 * 60 + 22, (5 * 60 + 50) * 60]
  assert (cifar["clients_per_round"], cifar["batch_size"], cifar["rounds"]) == (50, 10, 1500)
  assert cifar["image"] == (32, 32, 3) and cifar["classes"] == 10
  assert cifar["num_clients"] * cifar["sizes"]["mean"] == 50_000  # CIFAR-10's training set


SETTINGS = {  # clients, per round, batch, rounds, one example's shape, published seconds
  "flute_lr_mnist": (1000, 10, 10, 100, (784,), [95, 189, 1814]),
  "flute_resnet_fedcifar100": (500, 10, 20, 4000, (32, 32, 3), [6121, 57336]),
  "flute_rnn_fedshakespeare": (715, 10, 4, 1200, (80,), [1310, 24381]),
  "pfl_stackoverflow": (4000, 400, 16, 2000, (20,), [None]),
  "fedjax_emnist_conv": (3400, 10, 10, 1500, (28, 28, 1), [None]),
  "fedjax_stackoverflow_word": (4000, 50, 16, 1500, (30,), [None]),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_six_other_anchors_are_the_published_settings(name):
  a = load_benchmark("anchors")
  spec = a.WORKLOADS[name]
  clients, cohort, batch, rounds, example, published = SETTINGS[name]
  assert (spec["num_clients"], spec["clients_per_round"], spec["batch_size"]) == (
    clients,
    cohort,
    batch,
  )
  assert (spec["rounds"], spec["local_epochs"], spec["example"]) == (rounds, 1, example)
  assert [p["wall_s"] for p in spec["published"]] == published
  assert all(p["source"] for p in spec["published"])


def test_the_full_size_models_have_the_sources_shapes():
  """Parameter counts of the full-size models, worked from their layers."""
  import jax

  a = load_benchmark("anchors")

  def count(name):
    spec = a.WORKLOADS[name]
    example = a.example_shape(spec, False)
    shapes = jax.eval_shape(a.build_model(spec, example, False).init, jax.random.PRNGKey(0))
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))

  assert count("flute_lr_mnist") == 784 * 10 + 10
  conv = (3 * 3 * 1 * 32 + 32) + (3 * 3 * 32 * 64 + 64)
  assert count("fedjax_emnist_conv") == conv + (12 * 12 * 64 * 128 + 128) + (128 * 62 + 62)
  lstm = lambda i, h: 4 * (i * h + h * h + h)  # input and recurrent kernels, one bias a gate
  assert count("flute_rnn_fedshakespeare") == 90 * 8 + lstm(8, 256) + lstm(256, 256) + 256 * 90 + 90
  words = 10004
  assert count("fedjax_stackoverflow_word") == (
    words * 96 + lstm(96, 670) + (670 * 96 + 96) + (96 * words + words)
  )
  d, ff, v = 96, 1536, 10000
  block = 2 * (2 * d) + 4 * (d * d + d) + (d * ff + ff) + (ff * d + d)
  assert count("pfl_stackoverflow") == v * d + 20 * d + 3 * block + 2 * d + (d * v + v)
  assert count("flute_resnet_fedcifar100") == 11_220_132  # ResNet-18 (CIFAR stem), 100 classes


def test_capped_sizes_stay_under_the_cap():
  a = load_benchmark("anchors")
  rng = np.random.default_rng(0)
  sizes = a.client_sizes(a.WORKLOADS["pfl_stackoverflow"], 4000, rng)
  assert sizes.max() == 64 and sizes.min() >= 1 and np.median(sizes) == 64
  sizes = a.client_sizes(a.WORKLOADS["fedjax_stackoverflow_word"], 4000, rng)
  assert sizes.max() <= 8000 and abs(np.median(sizes) - 397 * math.exp(-(1.5**2) / 2)) < 20


def test_token_federation_labels_are_the_next_tokens():
  a = load_benchmark("anchors")
  spec = dict(a.WORKLOADS["pfl_stackoverflow"], sizes={"kind": "fixed", "mean": 3.0})
  for device_bytes in (0, 2**30):
    train, eval_data, sizes, where = a.federation(spec, 5, (6,), device_bytes, tokens=11)
    if where == "host":
      x, y = train.store.x, train.store.y
    else:
      x, y = np.asarray(train.x), np.asarray(train.y)
    assert x.shape == y.shape == (5, 3, 6) and x.dtype == np.int32 and y.dtype == np.int32
    np.testing.assert_array_equal(x[:, :, 1:], y[:, :, :-1])
    assert x.min() >= 1 and y.max() < 11  # no padding token (0)
    assert eval_data.max_examples == 1 and np.asarray(eval_data.x).dtype == np.int32


def test_client_sizes_femnist_like_heavy_tail_and_cifar_fixed():
  a = load_benchmark("anchors")
  rng = np.random.default_rng(0)
  sizes = a.client_sizes(a.WORKLOADS["flute_femnist"], 3400, rng)
  assert sizes.dtype == np.int32 and sizes.min() >= 1
  # mean ~226 (its standard error is ~2: 5% is many of them), a right tail past 3x the median
  assert abs(sizes.mean() - 226) < 0.05 * 226
  assert np.median(sizes) < sizes.mean() and sizes.max() > 3 * np.median(sizes)
  fixed = a.client_sizes(a.WORKLOADS["pfl_cifar10"], 1000, rng)
  assert (fixed == 50).all()


@pytest.mark.parametrize("device_bytes", [0, 2**30])
def test_federation_on_host_or_device_holds_the_sizes(device_bytes):
  from fedjax_dro.data.host import HostFederatedData

  a = load_benchmark("anchors")
  spec = dict(a.WORKLOADS["flute_femnist"], sizes={"kind": "lognormal", "mean": 9.0, "sigma": 0.5})
  train, eval_data, sizes, where = a.federation(spec, 7, (8, 8, 1), device_bytes)
  assert where == ("host" if device_bytes == 0 else "device")
  assert isinstance(train, HostFederatedData) == (where == "host")
  np.testing.assert_array_equal(np.asarray(train.num_examples), sizes)
  assert train.max_examples == sizes.max() and train.num_clients == 7
  if where == "device":
    np.testing.assert_array_equal(np.asarray(train.mask).sum(1), sizes)
  assert eval_data.num_clients == 7 and eval_data.max_examples == 1


def test_local_work_epochs_or_ceil_mean_over_batch():
  a = load_benchmark("anchors")
  spec = a.WORKLOADS["flute_femnist"]
  kw, text = a.local_work(spec, 226.0, "steps")
  assert kw == {"local_steps": math.ceil(226 / 20), "batch_size": 20} and "ceil" in text
  kw, _ = a.local_work(a.WORKLOADS["pfl_cifar10"], 50.0, "steps")
  assert kw["local_steps"] == 5
  kw, text = a.local_work(spec, 226.0, "epochs")
  assert kw == {"local_epochs": 1, "batch_size": 20}
  with pytest.raises(ValueError, match="local work"):
    a.local_work(spec, 226.0, "sometimes")


def test_quick_run_through_fd_run_writes_every_workload(tmp_path):
  """All eight anchors at their quick sizes through fd.run, the federations on the host."""
  a = load_benchmark("anchors")
  out = tmp_path / "anchors.json"
  result = a.main(["--quick", "--local-work", "steps", "--device-bytes", "0", "--out", str(out)])
  saved = json.loads(out.read_text())
  assert [r["workload"] for r in saved["rows"]] == list(a.WORKLOADS)
  assert len(a.WORKLOADS) == 8
  for r in result["rows"]:
    spec = a.WORKLOADS[r["workload"]]
    assert r["quick"] and r["rounds_measured"] == 2 and r["data_on"] == "host"
    assert r["second_run_compile_s"] == 0.0  # the second run reuses the compiled programs
    assert r["rounds_full"] == spec["rounds"]
    assert r["projected_run_s"] == pytest.approx(r["compile_s"] + spec["rounds"] * r["s_per_round"])
    assert r["host_store_stats"]["rows_gathered"] > 0
    assert (r["vocab"] is not None) == ("vocab" in spec)
  assert "auto" in result["rows"][0]["model"] and "auto" in result["rows"][1]["model"]
  md = (tmp_path / "anchors.md").read_text()
  assert "(projection)" in md and "8 min 22 s on 4 GPUs" in md and "5 h 50 min" in md
  assert "one A100" in md and "roughly an hour" in md and "a few minutes" in md
  for r in result["rows"]:
    assert r["title"] in md
  # every ratio line is a projection on the CPU: one per published time, none without one
  ratios = [line for line in md.splitlines() if line.startswith("- ") and " = " in line]
  timed = [p for r in result["rows"] for p in r["published"] if p["wall_s"]]
  assert len(ratios) == len(timed) == 9 and all(": projection " in line for line in ratios)
  assert "Flower 1.0 30 min 14 s on CPU" in md and "FedML 15 h 55 min" in md


@pytest.mark.slow  # the GPU preset's tiny test runs the same functions
def test_quick_roofline_blocks_and_bad_flags(tmp_path):
  """--roofline, --profile and --blocks on the quick FEMNIST workload: every row has its
  roofline (the bound its executed client-steps allow), the block rows their exit-test block."""
  a = load_benchmark("anchors")
  out = tmp_path / "anchors.json"
  result = a.main(
    ["--quick", "--workloads", "flute_femnist", "--roofline", "--profile", "--blocks", "2"]
    + ["--out", str(out)]
  )
  peaks = result["peaks"]
  (row,) = result["rows"]
  (block,) = result["blocks"]
  assert row["step_block"] == 1 and block["step_block"] == 2
  for r in (row, block):
    rf = r["roofline"]
    assert rf["memory_s"] == pytest.approx(
      rf["client_step"]["bytes"] * r["executed_steps_per_round"] / peaks["bytes_per_s"]
    )
    assert r["executed_steps_per_round"] >= r["useful_client_steps_per_round"]
    assert "trace" in r
  # blocks of 2 steps execute at least as many client-steps as blocks of 1
  assert block["executed_steps_per_round"] >= row["executed_steps_per_round"]
  md = (tmp_path / "anchors.md").read_text()
  assert "## Rounds against the roofline" in md and "What the device executed" in md
  for bad in ("0", "x"):
    with pytest.raises(SystemExit):
      a.main(["--quick", "--blocks", bad, "--out", str(out)])


def test_sweep_executed_steps_worked_by_hand(monkeypatch):
  """Client-steps a sweep executes per configuration and round, on a case worked by hand: steps
  [1, 2, 3, 5] (sizes 20, 40, 60, 100, batch 20, one epoch); seed 0 samples clients (0, 3),
  seed 1 clients (1, 2). Step-sorted, the seeds' first participants hold 1 and 2 steps, their
  second 5 and 3: one at a time (map) the slots run 2 + 5 = 7 steps, in whole blocks of 2 steps
  2 + 6 = 8; in chunks of 2 the one chunk runs 5 steps for each of its 2 participants: 10."""
  anchors = load_benchmark("anchors")
  picks = {0: [[0, 3]], 1: [[1, 2]]}
  keys = {anchors.derive_keys(s)[2].tobytes(): s for s in picks}
  monkeypatch.setattr(
    anchors,
    "predicted_participants",
    lambda alg, n, key, rounds: np.asarray(picks[keys[np.asarray(key).tobytes()]]),
  )
  sizes, kw = [20, 40, 60, 100], {"local_epochs": 1, "batch_size": 20}
  steps = anchors.sweep_executed_steps
  assert steps(None, sizes, kw, [0, 1], 1, 1, cohort=2) == 7.0
  assert steps(None, sizes, kw, [0, 1], 1, 2, cohort=2) == 8.0
  assert steps(None, sizes, kw, [0, 1], 1, 1, cohort=2, chunk=2) == 10.0
  assert steps(None, sizes, kw, [1], 1, 1, cohort=2) == 5.0  # one configuration: its own steps
  assert steps(None, sizes, {"local_steps": 4}, [0, 1], 1, 1, cohort=2) == 8.0
  # the run's executed steps for its backend: each participant alone (chunk 1) or one group
  assert anchors.executed_steps(None, sizes, kw, 0, 1, 1, chunk=1) == (6.0, 6.0)
  assert anchors.executed_steps(None, sizes, kw, 0, 1, 1) == (10.0, 6.0)


def test_quick_factored_dense_run(tmp_path):
  """--factored-dense: the quick FEMNIST workload runs with the folded step and the dense layer
  factored, and the results say so."""
  a = load_benchmark("anchors")
  out = tmp_path / "anchors.json"
  argv = ["--quick", "--workloads", "flute_femnist", "--factored-dense", "--out", str(out)]
  result = a.main(argv + ["--device-bytes", "0"])
  assert result["meta"]["factored_dense"] is True
  assert result["rows"][0]["rounds_measured"] == 2
  assert "wide dense layer factored" in (tmp_path / "anchors.md").read_text()


def test_merge_keeps_the_earlier_rows_of_workloads_not_measured(tmp_path):
  """--merge: the rows of the --out file whose workloads this call did not measure stay, in the
  table's order, and the markdown says which run measured them."""
  import pathlib

  a = load_benchmark("anchors")
  saved = pathlib.Path(a.HERE) / "results" / "anchors.json"
  published = json.loads(saved.read_text())
  rows = {r["workload"]: r for r in published["rows"]}
  meta = {k: v for k, v in published["meta"].items() if k != "kept_from"}
  earlier = {"meta": meta, "rows": [rows["flute_femnist"], rows["pfl_cifar10"]]}
  path = tmp_path / "anchors.json"
  path.write_text(json.dumps(earlier))
  new_row = dict(earlier["rows"][1], workload="flute_lr_mnist", title="LR row", published=[])
  redone = dict(earlier["rows"][1], s_per_round=9.0)  # pfl_cifar10 measured again
  result = {"meta": dict(earlier["meta"], command="now"), "rows": [new_row, redone]}
  merged = a.merge_earlier(result, str(path))
  assert [r["workload"] for r in merged["rows"]] == [
    "flute_femnist",
    "pfl_cifar10",
    "flute_lr_mnist",
  ]
  assert merged["rows"][1]["s_per_round"] == 9.0  # this call's row, not the earlier one
  assert [k["workloads"] for k in merged["meta"]["kept_from"]] == [["flute_femnist"]]
  md = a.markdown(merged)
  assert "Rows kept from an earlier run (`--merge`): flute_femnist, measured by " in md
  assert earlier["meta"]["command"] in md
  # merged again after measuring pfl_cifar10 once more: flute_femnist stays under its own run,
  # flute_lr_mnist under the run "now"
  path.write_text(json.dumps(merged))
  again = {"meta": dict(earlier["meta"], command="later"), "rows": [redone]}
  kept = a.merge_earlier(again, str(path))["meta"]["kept_from"]
  assert [(k["workloads"], k["command"]) for k in kept] == [
    (["flute_femnist"], earlier["meta"]["command"]),
    (["flute_lr_mnist"], "now"),
  ]
  assert a.merge_earlier({"meta": {}, "rows": []}, str(tmp_path / "none.json"))["rows"] == []
