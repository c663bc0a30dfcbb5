"""FGDRO Table 2 on the harness, on the readers' stand-ins: the Pile (GPT-2, worst / average
log-perplexity over domains, the FGDRO rows' domain-weight phase) and CivilComments (DistilBERT,
worst-group accuracy over WILDS' 16 overlapping identity x label groups) run end to end with
validation-split selection; the reported metrics equal independent computations on the test
split's rows with the final model (numpy log-softmax per domain; group accuracies by hand from
the group ids)."""

import json
import os

import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro.reproduce.fgdro_language import (
  ESTIMATORS,
  METRICS,
  fgdro_table2,
  fixed_weight_rows,
  language_model,
  weight_rounds,
)
from fedjax_dro.reproduce.fgdro_wilds import stand_in_dirs, table_strategies


@pytest.mark.parametrize(
  "name,rows",
  [
    pytest.param("pile", ("FGDRO-CVaR",), marks=pytest.mark.slow),
    pytest.param("civilcomments", ("FedAvg",), marks=pytest.mark.slow),
  ],
)
def test_each_dataset_runs_on_the_harness(tmp_path, name, rows):
  result = fgdro_table2(str(tmp_path), quick=True, datasets=(name,), algorithms=rows, verbose=False)
  record = result["results"][name]
  assert record["metric"]["name"] == METRICS[name] and record["metric"]["stat"] == "split"
  assert set(record["table"]) == {rows[0], "FGDRO-KL"}
  for per_seed in record["per_seed"].values():
    (row,) = per_seed
    assert not row["failed"], row
    assert row["rounds"] == 2 and row["configurations"] == 4
    assert np.isfinite(row["value"])
  saved = json.load(open(os.path.join(tmp_path, "fgdro_table2.json")))
  assert saved["stand_in"] is True and saved["pretrained"] is False
  phase = saved["budgets"][name]["weight_rounds"]
  assert phase == (1 if name == "pile" else None)
  text = open(os.path.join(tmp_path, "fgdro_table2.md")).read()
  assert "STAND-IN" in text and f"## {name}" in text


def test_the_pile_phase_is_a_tenth_and_wraps_only_the_fgdro_rows(tmp_path):
  assert weight_rounds(625) == 62 and weight_rounds(6250) == 625 and weight_rounds(2) == 1
  path = stand_in_dirs(str(tmp_path), ("pile",))["pile"]
  train = fd.data.load_prepared(path, "train")
  model = language_model("pile", train.store, quick=True)
  rows = table_strategies(True, 2, 2, train.num_clients, wrap=fixed_weight_rows(7))
  assert len(rows) == 9
  for strategy in rows:
    alg = strategy.make(model)
    fixed = alg.config.get("fixed_domain_weights")
    if strategy.label in ESTIMATORS:
      assert fixed == {"weight_rounds": 7, "estimators": list(ESTIMATORS[strategy.label])}
    else:
      assert fixed is None, strategy.label


def _all_rows(store):
  rows = np.arange(int(store.counts.sum()))
  clients = np.searchsorted(store.offsets, rows, side="right") - 1
  return clients, (rows - store.offsets[clients])[:, None]


def test_the_reported_metrics_are_the_test_splits_metrics_of_the_final_model(tmp_path):
  from fedjax_dro import algorithms as A
  from fedjax_dro.compare.domains import split_summary

  dirs = stand_in_dirs(str(tmp_path), ("pile", "civilcomments"))
  # the Pile: per-domain mean next-token cross-entropy (numpy log-softmax), worst and average
  train, test = (fd.data.load_prepared(dirs["pile"], s) for s in ("train", "test"))
  model = language_model("pile", train.store, quick=True)
  alg = A.fedavg(model, local_steps=2, batch_size=2, clients_per_round=train.num_clients)
  h = fd.run(alg, train, rounds=2, seed=0)
  got = split_summary(alg, h.final_state, test)
  clients, index = _all_rows(test.store)
  xs, ys = test.store.gather(clients, index)
  logits = np.asarray(model.apply(h.final_state.params, xs[:, 0]), np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  y = ys[:, 0]
  nll = -np.take_along_axis(log_softmax, y[..., None], -1)[..., 0].mean(-1)  # per sequence
  per_domain = [nll[clients == c].mean() for c in np.unique(clients)]
  assert got["worst_log_perplexity"] == pytest.approx(max(per_domain), rel=1e-5)
  assert got["average_log_perplexity"] == pytest.approx(np.mean(per_domain), rel=1e-5)
  # CivilComments: accuracy over every row, and the worst of the 16 groups (identity k) x label
  train, test = (fd.data.load_prepared(dirs["civilcomments"], s) for s in ("train", "test"))
  model = language_model("civilcomments", train.store, quick=True)
  alg = A.fedavg(model, local_steps=2, batch_size=2, clients_per_round=train.num_clients)
  final = fd.run(alg, train, rounds=2, seed=0).final_state
  params = {**final.params, "classifier": {**final.params["classifier"]}}
  rng = np.random.default_rng(0)  # a head that predicts both labels, so groups differ
  kernel = params["classifier"]["kernel"]
  params["classifier"]["kernel"] = np.asarray(kernel) + rng.normal(size=kernel.shape)
  state = final._replace(params=params)
  got = split_summary(alg, state, test)
  clients, index = _all_rows(test.store)
  xs, ys = test.store.gather(clients, index)
  groups = np.asarray(test.store.group)[test.store.offsets[clients] + index[:, 0]]
  pred = np.asarray(model.apply(params, xs[:, 0])).argmax(-1)
  correct = pred == ys[:, 0]
  accuracies = []
  for k in range(8):  # the identity bits, in the reader's order
    for label in (0, 1):
      member = ((groups >> (k + 1)) & 1 == 1) & (groups % 2 == label)
      if member.any():
        accuracies.append(correct[member].mean())
  assert len(set(accuracies)) > 1 and min(accuracies) < correct.mean()
  assert got["worst_group_accuracy"] == pytest.approx(min(accuracies), abs=1e-12)
  assert got["accuracy"] == pytest.approx(correct.mean(), abs=1e-12)
