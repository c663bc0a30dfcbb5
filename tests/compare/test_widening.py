"""Widening in the comparison harness: every geometric axis of a strategy's grid is widened at
its edge, up to ``max_widenings`` each, and an axis split across sub-grids is judged on the
union of its values (its edge is reported)."""

import pytest

from fedjax_dro import algorithms as A, compare as C
from tests.compare.test_compare import MODEL, _data


def _run(strategies, max_widenings):
  exp = C.Experiment(
    "widen",
    _data,
    MODEL,
    strategies,
    C.Protocol(
      seeds=(0,),
      metric=C.Metric("mse"),
      folds=2,
      max_widenings=max_widenings,
      equal_grids=False,
      budget=C.Budget("rounds", rounds=6),
    ),
  )
  return C.compare(exp, verbose=False)


def test_two_axes_on_edges_are_both_widened_and_a_split_axis_edge_is_reported():
  """FedAvg's client and server steps are both far too small: the best point sits on the high
  edge of both, and both axes gain a value (one each: the limit is per axis). FedSGD's ``lr``
  is split across two sub-grids of one value each: the larger (too small as well) wins, which
  is the high edge of the union, reported as such; it is not widened."""
  strategies = [
    C.Strategy(
      "FedAvg",
      lambda m: A.fedavg(m, local_steps=3),
      grid={"client_lr": [1e-4, 2e-4], "server_lr": [0.1, 0.2]},
    ),
    C.Strategy("FedSGD", lambda m: A.fedsgd(m), grid=[{"lr": [1e-3]}, {"lr": [2e-3]}]),
  ]
  res = _run(strategies, max_widenings=1)
  row = res.per_seed["FedAvg"][0]
  assert sorted(w["axis"] for w in row["widened"]) == ["client_lr", "server_lr"]
  assert row["configurations"] == 4 + 2 + 3  # the grid, client_lr's new column, server_lr's row
  assert row["chosen"] == {"client_lr": pytest.approx(4e-4), "server_lr": pytest.approx(0.4)}
  assert {e["axis"] for e in row["edges"]} == {"client_lr", "server_lr"}
  sgd = res.per_seed["FedSGD"][0]
  assert sgd["widened"] == [] and sgd["configurations"] == 2
  assert sgd["chosen"]["lr"] == pytest.approx(2e-3)
  assert sgd["edges"] == [
    {"axis": "lr", "edge": "high", "value": sgd["chosen"]["lr"], "across": "sub-grids"}
  ]
  assert "FedSGD seed 0 lr=0.002 (high, across sub-grids)" in res.to_markdown()
