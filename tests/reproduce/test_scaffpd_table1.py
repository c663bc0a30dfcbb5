"""``fedjax-dro reproduce scaffpd-table1``: the paper's partition (Dirichlet label skew, then 30% of
the clients keep 30% of their rows), the footnote's worst-20% accuracy against a hand
computation, the stand-in's spread of class difficulty (a centralized linear classifier), the
protocol's equal grids in smoothness units with uniform ERM weighting, and quick end-to-end runs
on the stand-in and on a generated features file (through the CLI)."""

import importlib
import json
import math
import os

import numpy as np
import pytest

from fedjax_dro import cli, reproduce
from fedjax_dro.data import write_features
from fedjax_dro.data.standins import gaussian_mixture_features
from fedjax_dro.reproduce.scaffpd_table1 import table1_partition, worst_fraction_accuracy

T = importlib.import_module("fedjax_dro.reproduce.scaffpd_table1")

NUM_CLASSES, DIM, TRAIN_PER_CLASS, TEST_PER_CLASS = 100, 16, 12, 4


def _features_file(tmp_path):
  """A small features file with a train / test split: 100 classes, 16 dimensions."""
  rng = np.random.default_rng(3)
  means = rng.normal(size=(NUM_CLASSES, DIM)) * 2.0
  per = TRAIN_PER_CLASS + TEST_PER_CLASS
  labels = np.repeat(np.arange(NUM_CLASSES), per)
  feats = means[labels] + rng.normal(size=(labels.size, DIM))
  split = np.tile(np.arange(per) >= TRAIN_PER_CLASS, NUM_CLASSES)
  return write_features(str(tmp_path / "tiny_features.npz"), feats, labels, split), labels[~split]


def test_partition_dirichlet_skew_then_30_percent_of_clients_keep_30_percent():
  labels = np.repeat(np.arange(NUM_CLASSES), TRAIN_PER_CLASS)
  part = table1_partition(labels, 0.05, seed=1)
  before, clients, reduced = part["before"], part["clients"], part["reduced"]
  assert len(before) == len(clients) == 20
  # the Dirichlet split is a partition of the rows, every client with >= 10 rows
  assert np.array_equal(np.sort(np.concatenate(before)), np.arange(labels.size))
  assert min(b.size for b in before) >= 10
  # 30% of the 20 clients (6) lose floor(0.7 n_i) rows, drawn from their own rows
  assert len(reduced) == 6 and len(set(reduced)) == 6
  for i in range(20):
    if i in reduced:
      n = before[i].size
      assert clients[i].size == n - math.floor(0.7 * n)
      assert set(clients[i]) <= set(before[i])
      assert clients[i].size / n == pytest.approx(0.3, abs=1 / n)
    else:
      assert np.array_equal(clients[i], before[i])

  # label skew: a small alpha gives far fewer classes per client than a large one
  many = np.repeat(np.arange(NUM_CLASSES), 60)

  def classes_per_client(alpha):
    p = table1_partition(many, alpha, seed=1)
    return np.mean([np.unique(many[c]).size for c in p["before"]])

  assert classes_per_client(0.01) < 0.25 * classes_per_client(1000.0)
  assert classes_per_client(0.01) < 15
  with pytest.raises(ValueError, match="removed_fraction"):
    table1_partition(labels, 0.1, removed_fraction=1.0)
  with pytest.raises(ValueError, match="reduced_fraction"):
    table1_partition(labels, 0.1, reduced_fraction=1.5)


def test_worst20_is_the_mean_of_the_lowest_fifth_of_the_clients():
  acc = np.array([0.9, 0.2, 0.55, 0.1, 0.8, 0.7, 0.3, 0.95, 0.6, 0.65])
  assert worst_fraction_accuracy(acc) == pytest.approx((0.1 + 0.2) / 2)  # 2 of 10 clients
  acc20 = np.linspace(1.0, 0.05, 20)
  assert worst_fraction_accuracy(acc20) == pytest.approx(np.mean([0.05, 0.1, 0.15, 0.2]))
  # ceil(0.2 n) clients when 0.2 n is not whole: 7 clients -> the lowest 2
  assert worst_fraction_accuracy([0.5, 0.4, 0.3, 0.9, 0.8, 0.7, 0.6]) == pytest.approx(0.35)


def test_stand_in_classes_differ_in_difficulty():
  """The stand-in's classes: a centralized linear classifier (nearest class mean, closed form)
  is right on about 0.2 of the hardest tenth's test rows and 0.8 of the easiest tenth's; with
  hardness 0 the classes are about equally hard."""
  fs = gaussian_mixture_features(**T.STAND_IN, seed=T.STAND_IN_SEED)
  assert fs.features.shape == (60000, 128)
  assert np.all(np.bincount(fs.labels[~fs.split]) == 500)
  assert np.all(np.bincount(fs.labels[fs.split]) == 100)
  tr, te = ~fs.split, fs.split

  def deciles(fs):
    acc = T.centralized_class_accuracy(
      fs.features[tr], fs.labels[tr], fs.features[te], fs.labels[te], 100
    )
    return np.percentile(acc, [10, 50, 90])

  lo, mid, hi = deciles(fs)
  assert lo < 0.35 and hi > 0.7 and 0.35 < mid < 0.7, (lo, mid, hi)
  flat = gaussian_mixture_features(**dict(T.STAND_IN, hardness=0.0), seed=T.STAND_IN_SEED)
  flo, _, fhi = deciles(flat)
  assert fhi - flo < 0.5 * (hi - lo), (flo, fhi, lo, hi)
  # the hardest classes are the last ones (rank c / 99)
  acc = T.centralized_class_accuracy(
    fs.features[tr], fs.labels[tr], fs.features[te], fs.labels[te], 100
  )
  assert acc[:10].mean() > acc[-10:].mean() + 0.4


UNITS = {"inverse_minibatch": 0.05, "inverse_full_batch": 0.8}


def test_equal_grids_in_smoothness_units_and_uniform_erm_weighting():
  from fedjax_dro import models

  rows = T.strategies(UNITS)
  assert [s.label for s in rows] == list(T.WEIGHTING)
  model = models.softmax_regression(4, 3, l2=T.L2)
  for s in rows:
    assert s.num_configurations == 9, s.label
    steps = s.grid.get("client_lr", s.grid.get("lr_w"))
    assert min(steps) == pytest.approx(0.05) and max(steps) == pytest.approx(0.8)
    alg = s.make(model)
    assert set(s.grid) | set(s.fixed) <= set(alg.hparams), s.label
  algs = {s.label: s.make(model) for s in rows}
  for label in ("FedAvg", "SCAFFOLD"):
    assert algs[label].config["weighting"] == "uniform"
    assert "uniform" in T.WEIGHTING[label]
  assert "tau" not in algs["SCAFF-PD"].hparams and "L" not in algs["q-FFL"].hparams
  assert algs["SCAFF-PD"].config["tied_hparams"]["tau"] == ["client_lr", T.LOCAL_STEPS, 1.0]
  assert {s.label: s.fixed.get("rho") for s in rows if "rho" in s.fixed} == {
    "AFL": 0.0,
    "DRFA": T.RHO,
    "SCAFF-PD": T.RHO,
  }
  assert all(s.num_configurations == 1 for s in T.strategies(UNITS, quick=True))


def test_equal_upload_protocol_shares_the_plateau_selection_and_matches_fedavg_uploads():
  """The equal-upload table: FedAvg's uploads in CAP rounds for every row (at most
  UPLOADS_CAP_FACTOR CAP rounds), selected at CAP rounds as the plateau table is (so the harness
  keys both tables' selections alike); a row that uploads twice FedAvg's floats a round gets
  half its rounds (the harness's budget_rounds on the rows' real costs)."""
  from fedjax_dro import models
  from fedjax_dro.algorithms.base import algorithm_cost
  from fedjax_dro.compare.harness import budget_rounds
  from fedjax_dro.data import from_client_arrays

  plateau = T.protocol(seeds=[0], cap=T.CAP, every=T.EVERY, patience=T.PATIENCE)
  uploads = T.protocol(seeds=[0], cap=T.CAP, every=T.EVERY, patience=T.PATIENCE, uploads=True)
  assert plateau.budget.kind == "plateau" and plateau.selection_rounds is None
  b = uploads.budget
  assert (b.kind, b.match, b.rounds, b.cap) == ("uploads", "FedAvg", T.CAP, 2 * T.CAP)
  assert uploads.selection_rounds == T.CAP  # = the plateau table's selection rounds (its cap)
  same = ("seeds", "metric", "selection", "max_widenings", "on_failure", "reference")
  assert all(getattr(uploads, k) == getattr(plateau, k) for k in same)
  n, d, k = 20, 4, 3
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n, 8, d)).astype(np.float32)
  y = rng.integers(0, k, size=(n, 8)).astype(np.int32)
  train = from_client_arrays(list(x), list(y))
  model = models.softmax_regression(d, k, l2=T.L2)
  rows = {s.label: s for s in T.strategies(UNITS)}
  costs = {label: algorithm_cost(s.make(model), train) for label, s in rows.items()}
  amount = costs["FedAvg"].spent(T.CAP).upload_floats
  rounds = {label: budget_rounds(b, c, amount, label) for label, c in costs.items()}
  assert rounds["FedAvg"] == T.CAP
  for label, c in costs.items():
    spend = c.spent(rounds[label]).upload_floats
    assert spend <= amount * (1 + 1e-12), label
    assert rounds[label] == b.cap or c.spent(rounds[label] + 1).upload_floats > amount, label
  per = {
    label: c.round.upload_floats / costs["FedAvg"].round.upload_floats for label, c in costs.items()
  }
  assert per["SCAFFOLD"] == pytest.approx(2.0) and per["SCAFF-PD"] >= 2.0
  assert rounds["SCAFFOLD"] == T.CAP // 2 and rounds["SCAFF-PD"] <= T.CAP // 2


def _check_result(saved, stand_in: bool, alphas, seeds):
  assert saved["experiment"] == "scaffpd-table1"
  assert saved["dataset"]["stand_in"] is stand_in
  assert list(saved["results"]) == [f"{a:g}" for a in alphas]
  assert saved["setting"]["seeds"] == seeds
  u = saved["smoothness"]
  assert u["inverse_full_batch"] == pytest.approx(1 / u["L_full_batch"])
  assert u["L_minibatch"] > u["L_full_batch"]
  for alpha, rec in saved["results"].items():
    assert rec["reference"] == "SCAFF-PD"
    assert rec["metric"] == {"name": "accuracy", "stat": "worst20", "higher_is_better": True}
    assert "validation" in rec["protocol"]["selection"]
    ref = rec["per_seed"]["SCAFF-PD"]
    for label, rows in rec["per_seed"].items():
      assert [r["seed"] for r in rows] == seeds
      values = [0.0 if r["failed"] else r["value"] for r in rows]
      t = rec["table"][label]
      assert t["accuracy"]["mean"] == pytest.approx(np.mean(values))
      assert t["accuracy"]["two_se"] == pytest.approx(2 * np.std(values, ddof=1) / math.sqrt(2))
      for r in rows:
        assert r["failed"] or (0 <= r["value"] <= r["extra"]["average accuracy"] <= 1)
        assert r["failed"] or 1 <= r["rounds"] <= saved["setting"]["budget"]["cap"]
      if label != "SCAFF-PD":
        d = rec["paired"]["accuracy"][label]
        diffs = np.array(values) - np.array([r["value"] for r in ref])
        assert d["difference"] == pytest.approx(diffs.mean())
        assert d["wins"] == int(np.sum(diffs > 0))
    for part in saved["partitions"][alpha]:
      assert len(part["reduced_clients"]) == 6
      for i, (n0, n) in enumerate(zip(part["client_rows_before_removal"], part["client_rows"])):
        assert n == (n0 - math.floor(0.7 * n0) if i in part["reduced_clients"] else n0)


def _check_uploads(saved):
  """The equal-upload blocks: every row on its plateau selection, spending FedAvg's uploads to
  within one of its rounds (or stopped by the cap, flagged)."""
  for alpha, rec in saved["results_uploads"].items():
    plateau = saved["results"][alpha]["per_seed"]
    assert rec["protocol"]["budget"].startswith("equal uploaded floats (what FedAvg spends in")
    fedavg = [r["budget_amount"] for r in rec["per_seed"]["FedAvg"]]
    for label, rows in rec["per_seed"].items():
      for r, p, amount in zip(rows, plateau[label], fedavg):
        if r["failed"] or p["failed"]:
          continue
        assert r["chosen"] == p["chosen"] and r["selection_rounds"] == p["selection_rounds"]
        per, setup = r["per_round"]["upload_floats"], r["setup"]["upload_floats"]
        assert r["spent"]["upload_floats"] <= amount * (1 + 1e-12)
        assert r["at_cap"] or r["spent"]["upload_floats"] + per > amount, label
        assert r["spent"]["upload_floats"] == pytest.approx(setup + r["rounds"] * per)


def test_quick_stand_in_run(tmp_path):
  out = str(tmp_path / "standin")
  res = reproduce.scaffpd_table1(out, quick=True, alphas=(0.1,), fig3_rhos=(), verbose=False)
  with open(os.path.join(out, "scaffpd_table1.json")) as f:
    saved = json.load(f)
  with open(os.path.join(out, "scaffpd_table1.md")) as f:
    table = f.read()
  _check_result(saved, True, [0.1], [0, 1])
  _check_uploads(saved)
  assert res["fig3"] is None and not os.path.exists(os.path.join(out, "scaffpd_table1.png"))
  assert "Dir(0.1), to a validation plateau:" in table and "Dir(0.1), at equal uploads:" in table
  runs = [x for rec in (saved["results"], saved["results_uploads"]) for x in rec.values()]
  spent = sum(row["seconds"] for x in runs for rows in x["per_seed"].values() for row in rows)
  assert saved["run_seconds"] == pytest.approx(spent)
  # the same run in two parts (as on two machines), merged: the same tables
  parts = [str(tmp_path / f"part{i}") for i in (1, 2)]
  for i, d in enumerate(parts, 1):
    quick = dict(quick=True, alphas=(0.1,), fig3_rhos=(), verbose=False)
    assert reproduce.scaffpd_table1(d, part=f"{i}/2", **quick) is None
  from fedjax_dro.compare.resume import merge_runs

  merged = str(tmp_path / "merged")
  merge_runs(merged, parts)
  again = reproduce.scaffpd_table1(merged, **quick)
  for key in ("results", "results_uploads"):
    for alpha, rec in saved[key].items():
      for label, rows in rec["per_seed"].items():
        other = again[key][alpha]["per_seed"][label]
        assert [r["value"] for r in rows] == [r["value"] for r in other], (key, label)
        assert [r["chosen"] for r in rows] == [r["chosen"] for r in other], (key, label)
  assert "STAND-IN" in table.splitlines()[0] and "quick smoke run" in table.splitlines()[0]
  for label, weighting in T.WEIGHTING.items():
    assert f"| {label} | {weighting} |" in table
  scaff = saved["results"]["0.1"]["table"]["SCAFF-PD"]["accuracy"]
  assert f"{100 * scaff['mean']:.2f} +- {100 * scaff['two_se']:.2f}" in table
  assert os.path.exists(os.path.join(out, "scaffpd_table1_alpha0p1.json"))


def test_cli_quick_run_on_a_features_file_with_fig3(tmp_path):
  path, train_labels = _features_file(tmp_path)
  out = str(tmp_path / "out")
  argv = ["reproduce", "scaffpd-table1", "--features", path, "--quick", "--out", out]
  assert cli.main(argv) == 0
  with open(os.path.join(out, "scaffpd_table1.json")) as f:
    saved = json.load(f)
  with open(os.path.join(out, "scaffpd_table1.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  _check_result(saved, False, [0.01, 0.05, 0.1], [0, 1])
  ds = saved["dataset"]
  assert ds["source"] == "tiny_features.npz" and ds["dim"] == DIM
  assert ds["train_rows"] == train_labels.size
  assert ds["held_out_rows"] == NUM_CLASSES * TEST_PER_CLASS
  fig3 = saved["fig3"]
  assert [s["label"] for s in fig3["strategies"]] == [
    "SCAFFOLD",
    "SCAFF-PD",
    "SCAFF-PD rho=0.2",
    "SCAFF-PD rho=0.5",
  ]
  # Fig. 3's SCAFFOLD and rho = 0.1 rows rest on the table's selections
  table = saved["results"]["0.01"]["per_seed"]
  for label in ("SCAFFOLD", "SCAFF-PD"):
    for a, b in zip(table[label], fig3["per_seed"][label]):
      assert a["chosen"] == b["chosen"] and a["value"] == pytest.approx(b["value"])


def test_stand_in_generator_layout_and_difficulty():
  fs = gaussian_mixture_features(num_classes=100, dim=512, train_per_class=30, test_per_class=10)
  assert fs.features.shape == (4000, 512) and fs.features.dtype == np.float32
  assert fs.labels.dtype == np.int32 and fs.num_classes == 100
  assert fs.split.sum() == 1000 and np.all(np.bincount(fs.labels[fs.split]) == 10)
  again = gaussian_mixture_features(num_classes=100, dim=512, train_per_class=30, test_per_class=10)
  assert np.array_equal(fs.features, again.features)
  # neither trivial nor chance: nearest estimated class mean on the held-out rows
  tr, te = ~fs.split, fs.split
  means = np.stack([fs.features[tr][fs.labels[tr] == c].mean(0) for c in range(100)])
  x = fs.features[te]
  d = (x**2).sum(1)[:, None] - 2 * x @ means.T + (means**2).sum(1)[None]
  acc = np.mean(np.argmin(d, 1) == fs.labels[te])
  assert 0.1 < acc < 0.9, acc
  with pytest.raises(ValueError, match="num_classes"):
    gaussian_mixture_features(num_classes=1)
  with pytest.raises(ValueError, match="separation"):
    gaussian_mixture_features(separation=-1.0)
  with pytest.raises(TypeError, match="separation"):
    gaussian_mixture_features(separation="3")


def test_bad_inputs(tmp_path):
  with pytest.raises(ValueError, match="rounds"):
    reproduce.scaffpd_table1(rounds=0, quick=True, verbose=False)
  with pytest.raises(ValueError, match="alphas"):
    reproduce.scaffpd_table1(alphas=[], quick=True, verbose=False)
  with pytest.raises(FileNotFoundError):
    reproduce.scaffpd_table1(features=str(tmp_path / "missing.npz"), quick=True, verbose=False)
  with pytest.raises(ValueError, match="num_seeds"):
    reproduce.scaffpd_table1(num_seeds=0, quick=True, verbose=False)
  # a held-out set without a class the clients train on
  feats = np.random.default_rng(0).normal(size=(40, 4))
  labels = np.repeat(np.arange(4), 10)
  split = labels == 3
  path = write_features(str(tmp_path / "f.npz"), feats, labels, split)
  with pytest.raises(ValueError, match="held-out"):
    reproduce.scaffpd_table1(features=path, quick=True, verbose=False)


def test_the_features_table_says_the_size_of_its_work_before_each_long_step(tmp_path):
  from fedjax_dro.reproduce.scaffpd_table1_data import TableData

  path, _ = _features_file(tmp_path)
  lines = []
  data = TableData(path, True, [0.1, 1.0], [0, 1], log=lines.append)
  assert lines[0].startswith(f"reading the features file {path} (")
  rows = data.train.size + data.held.size
  assert f"{rows:,} rows x {data.dim} features, {data.num_classes} classes" in lines[1]
  assert "4 partitions (2 alphas x 2 seeds)" in lines[1]
