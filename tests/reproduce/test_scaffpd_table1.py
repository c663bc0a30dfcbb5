"""``fedjax-dro reproduce scaffpd-table1``: the paper's partition (Dirichlet label skew, then 30% of
the clients keep 30% of their rows), the footnote's worst-20% accuracy against a hand
computation, quick end-to-end runs on a generated features file (through the CLI) and on the
stand-in (labelled as such), and the stand-in generator."""

import json
import math
import os

import numpy as np
import pytest

from fedjax_dro import cli, reproduce
from fedjax_dro.data import write_features
from fedjax_dro.data.standins import gaussian_mixture_features
from fedjax_dro.reproduce.scaffpd_table1 import table1_partition, worst_fraction_accuracy

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


def _check_result(saved, stand_in: bool):
  assert saved["experiment"] == "scaffpd-table1"
  assert saved["dataset"]["stand_in"] is stand_in
  assert [p["alpha"] for p in saved["partitions"]] == [0.01, 0.05, 0.1]
  labels = ["FedAvg", "SCAFFOLD", "q-FFL", "AFL", "DRFA", "AgnosticFedAvg", "SCAFF-PD"]
  for p in saved["partitions"]:
    assert list(p["algorithms"]) == labels
    assert len(p["reduced_clients"]) == 6
    for i, (n0, n) in enumerate(zip(p["client_rows_before_removal"], p["client_rows"])):
      assert n == (n0 - math.floor(0.7 * n0) if i in p["reduced_clients"] else n0)
    for row in p["algorithms"].values():
      acc = np.asarray(row["client_test_acc"])
      assert acc.shape == (20,) and np.all((acc >= 0) & (acc <= 1))
      # the footnote, by hand: sort, take the lowest 20% (4 of 20), average
      assert row["worst20_acc"] == pytest.approx(np.mean(np.sort(acc)[:4]))
      assert row["avg_acc"] == pytest.approx(np.mean(acc))
      assert row["worst20_acc"] <= row["avg_acc"]
  # Fig. 3 at alpha = 0.01: one SCAFF-PD curve per rho, SCAFFOLD beside them
  fig3 = saved["fig3"]
  assert fig3["alpha"] == 0.01 and list(fig3["rhos"]) == ["0.1", "0.2", "0.5"]
  rounds = saved["setting"]["rounds"]
  for row in [*fig3["rhos"].values(), fig3["SCAFFOLD"]]:
    assert len(row["curve_avg_acc"]) == len(row["curve_worst20_acc"]) == rounds
    assert row["curve_worst20_acc"][-1] == pytest.approx(row["worst20_acc"])
  # Table 1's SCAFF-PD row is the rho = 0.1 one
  assert saved["partitions"][0]["algorithms"]["SCAFF-PD"]["hparams"]["rho"] == 0.1
  assert saved["wall_time_s"] > 0


def _read_outputs(out):
  with open(os.path.join(out, "scaffpd_table1.json")) as f:
    saved = json.load(f)
  with open(os.path.join(out, "scaffpd_table1.md")) as f:
    table = f.read()
  with open(os.path.join(out, "scaffpd_table1.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  return saved, table


def test_cli_quick_run_on_a_features_file(tmp_path):
  path, train_labels = _features_file(tmp_path)
  out = str(tmp_path / "out")
  argv = ["reproduce", "scaffpd-table1", "--features", path, "--quick", "--out", out]
  assert cli.main(argv) == 0
  saved, table = _read_outputs(out)
  _check_result(saved, stand_in=False)
  ds = saved["dataset"]
  assert ds["source"] == "tiny_features.npz" and ds["dim"] == DIM
  assert ds["train_rows"] == train_labels.size
  assert ds["validation_rows"] + ds["test_rows"] == NUM_CLASSES * TEST_PER_CLASS
  assert "STAND-IN" not in table and "tiny_features.npz" in table
  # the markdown rows hold the JSON's numbers
  scaff = saved["partitions"][0]["algorithms"]["SCAFF-PD"]
  assert f"| SCAFF-PD | {100 * scaff['avg_acc']:.2f} | {100 * scaff['worst20_acc']:.2f} |" in table


@pytest.mark.slow  # ~35 s; the pipeline runs in the features-file test, the generator below
def test_quick_stand_in_run_is_labelled_stand_in(tmp_path):
  out = str(tmp_path / "standin")
  res = reproduce.scaffpd_table1(out, quick=True, verbose=False)
  saved, table = _read_outputs(out)
  _check_result(saved, stand_in=True)
  assert "STAND-IN" in table.splitlines()[0]
  assert "STAND-IN" in saved["dataset"]["note"]
  assert saved["dataset"]["parameters"]["num_classes"] == 100
  assert res["png_path"].endswith("scaffpd_table1.png")


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
  # a held-out set without a class the clients train on
  feats = np.random.default_rng(0).normal(size=(40, 4))
  labels = np.repeat(np.arange(4), 10)
  split = labels == 3
  path = write_features(str(tmp_path / "f.npz"), feats, labels, split)
  with pytest.raises(ValueError, match="held-out"):
    reproduce.scaffpd_table1(features=path, quick=True, verbose=False)
