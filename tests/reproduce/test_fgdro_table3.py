"""FGDRO Table 3 on the harness, on the readers' stand-ins: each dataset's path (Camelyon17
accuracy, iWildCam macro-F1 with encoded JPEGs, PovertyMap's regression and worst-group Pearson
r) runs end to end with held-out-domain selection; the reported test metric of every run equals
an independent computation on the test split's rows with the final model (sklearn, scipy, by
hand), and the records hold budgets, per-seed choices and edges."""

import json
import os

import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro.reproduce.fgdro_wilds import METRICS, fgdro_table3


@pytest.mark.parametrize(
  "name",
  ["camelyon17"] + [pytest.param(n, marks=pytest.mark.slow) for n in ("poverty", "iwildcam")],
)
def test_each_dataset_runs_on_the_harness_with_domain_selection(tmp_path, name):
  result = fgdro_table3(
    str(tmp_path), quick=True, datasets=(name,), algorithms=("FedAvg",), verbose=False
  )
  record = result["results"][name]
  assert record["metric"]["name"] == METRICS[name] and record["metric"]["stat"] == "split"
  assert record["reference"] == "FGDRO-KL"
  assert set(record["table"]) == {"FedAvg", "FGDRO-KL"}
  for rows in record["per_seed"].values():
    (row,) = rows
    assert not row["failed"], row
    assert row["rounds"] == 2 and row["configurations"] == 4
    assert set(row["chosen"]) >= {"client_lr"}
    assert np.isfinite(row["value"])
  text = open(os.path.join(tmp_path, "fgdro_table3.md")).read()
  assert "STAND-IN" in text and f"## {name}" in text
  saved = json.load(open(os.path.join(tmp_path, "fgdro_table3.json")))
  assert saved["stand_in"] is True and saved["pretrained"] is False


def test_the_reported_metric_is_the_test_splits_metric_of_the_final_model(tmp_path):
  sklearn_metrics = pytest.importorskip("sklearn.metrics")
  from fedjax_dro import algorithms as A
  from fedjax_dro.compare.domains import split_summary
  from fedjax_dro.reproduce.fgdro_wilds import stand_in_dirs, wilds_model

  path = stand_in_dirs(str(tmp_path))["iwildcam"]
  train, test = fd.data.load_prepared(path, "train"), fd.data.load_prepared(path, "test")
  model = wilds_model("iwildcam", train.store, quick=True)
  alg = A.fedavg(model, local_steps=2, batch_size=2, clients_per_round=train.num_clients)
  h = fd.run(alg, train, rounds=2, seed=0)
  got = split_summary(alg, h.final_state, test)
  x, _ = test.store.gather(np.zeros(1, int), np.zeros((1, 1), int))  # decoding works
  rows = np.arange(test.store.counts.sum())
  clients = np.searchsorted(test.store.offsets, rows, side="right") - 1
  xs, ys = test.store.gather(clients, (rows - test.store.offsets[clients])[:, None])
  pred = np.asarray(model.apply(h.final_state.params, xs[:, 0])).argmax(-1)
  y = ys[:, 0]
  want = sklearn_metrics.f1_score(y, pred, average="macro", labels=np.unique(y))
  assert got["macro_f1"] == pytest.approx(want, abs=1e-12)
  assert x.shape[-3:] == (32, 32, 3)


def test_weights_dir_names_the_missing_file_and_is_refused_where_unread(tmp_path, capsys):
  from fedjax_dro import cli
  from fedjax_dro.reproduce.fgdro_wilds import weight_file

  with pytest.raises(ValueError, match="densenet121.safetensors not found"):
    weight_file(str(tmp_path), "camelyon17")
  assert weight_file(None, "camelyon17") is None and weight_file(str(tmp_path), "poverty") is None
  (tmp_path / "resnet50.safetensors").write_bytes(b"")
  assert weight_file(str(tmp_path), "iwildcam") == str(tmp_path / "resnet50.safetensors")
  out = str(tmp_path / "out")
  assert cli.main(["reproduce", "karula-heart", "--weights-dir", str(tmp_path), "--out", out]) != 0
  assert "--weights-dir: reproduce karula-heart reads no such input" in capsys.readouterr().err
