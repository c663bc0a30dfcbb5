"""K-fold cross-validation: the split, agreement with a brute-force loop of separate runs, factory
options in the grid, the CLI, and bad input."""

import json

import numpy as np
import pytest

from fedjax_dro import models, run
from fedjax_dro.algorithms import fedavg, karula
from fedjax_dro.data import from_client_arrays
from fedjax_dro.model_selection import cross_validate, kfold_split
from tests.helpers import dataset

D = 3


def _clients(n=5, seed=0, sizes=None):
  rng = np.random.default_rng(seed)
  sizes = sizes or [int(m) for m in rng.integers(6, 14, n)]
  xs, ys = [], []
  for i, m in enumerate(sizes):
    x = rng.normal(size=(m, D))
    xs.append(x)
    ys.append(x @ (1.0 + 0.5 * (i % 2) + 0.2 * rng.normal(size=D)) + 0.5 * rng.normal(size=m))
  return from_client_arrays(xs, ys, dtype=np.float64)


def _model():
  return models.linear_regression(D, l2=0.01, fit_intercept=False)


def test_kfold_split_partitions_every_clients_rows():
  data = _clients(sizes=[5, 9, 7, 12, 6]).pad_to(15)
  folds = kfold_split(data, 4, seed=3)
  x, nex = np.asarray(data.x), np.asarray(data.num_examples)
  assert len(folds) == 4
  assert len({(tr.x.shape, ho.x.shape) for tr, ho in folds}) == 1  # same shapes in every fold
  for i in range(data.num_clients):
    rows = {tuple(r) for r in x[i, : nex[i]]}
    held = []
    for tr, ho in folds:
      tr_rows = {tuple(r) for r in np.asarray(tr.x)[i, : int(tr.num_examples[i])]}
      ho_rows = [tuple(r) for r in np.asarray(ho.x)[i, : int(ho.num_examples[i])]]
      assert tr_rows | set(ho_rows) == rows and not tr_rows & set(ho_rows)
      held += ho_rows
      assert abs(len(ho_rows) - nex[i] / 4) < 1
    assert sorted(held) == sorted(rows)  # every row is held out exactly once
  # deterministic in the seed
  again = kfold_split(data, 4, seed=3)
  np.testing.assert_array_equal(np.asarray(again[1][1].x), np.asarray(folds[1][1].x))


def test_cv_pick_equals_a_brute_force_loop_of_separate_runs():
  """FedAvg with partial participation and minibatches (so seeds matter), three step sizes."""
  data = _clients()
  alg = fedavg(_model(), clients_per_round=3, local_steps=2, batch_size=4)
  grid = {"client_lr": [0.01, 0.05, 0.2]}
  hp = {"server_lr": 0.9}
  cv = cross_validate(
    alg, dataset(data), grid, folds=2, rounds=15, seed=1, metric="loss", hparams=hp
  )
  brute = np.zeros((3, 2))
  for k, (train_k, held_k) in enumerate(kfold_split(data, 2, seed=1)):
    for p, lr in enumerate(grid["client_lr"]):
      hist = run(alg, train_k, rounds=15, seed=1, hparams={**hp, "client_lr": lr}, eval_data=held_k)
      brute[p, k] = hist.final["loss"]["weighted_mean"]
  np.testing.assert_allclose(cv.scores, brute, rtol=1e-10, atol=0)
  np.testing.assert_allclose(cv.mean, brute.mean(1), rtol=1e-12)
  np.testing.assert_allclose(cv.se, brute.std(1, ddof=1) / np.sqrt(2), rtol=1e-10)
  best = int(np.argmin(brute.mean(1)))
  assert cv.best == {"client_lr": grid["client_lr"][best]} and cv.best_index == best
  assert len(set(np.round(brute.mean(1), 8))) == 3  # the pick is not a tie
  table = cv.table()
  assert [r["best"] for r in table] == [p == best for p in range(3)]
  assert "best" in cv.to_markdown() and json.dumps(cv.to_json())


def test_grid_over_factory_options_with_a_callable():
  data = _clients(seed=2)
  make = lambda local_steps=1: fedavg(_model(), local_steps=local_steps)
  cv = cross_validate(
    make,
    data,
    {"local_steps": [1, 4], "client_lr": [0.05, 0.2]},
    folds=2,
    rounds=5,
    metric="mse",
    stat="mean",
  )
  assert [tuple(p.items()) for p in cv.points] == [
    (("local_steps", 1), ("client_lr", 0.05)),
    (("local_steps", 1), ("client_lr", 0.2)),
    (("local_steps", 4), ("client_lr", 0.05)),
    (("local_steps", 4), ("client_lr", 0.2)),
  ]
  assert np.all(np.isfinite(cv.scores))
  # more local work at the larger step fits better in 5 rounds from zero
  assert cv.best == {"local_steps": 4, "client_lr": 0.2}


def _cli_cv(capsys, tmp_path, argv, name, values):
  from fedjax_dro.cli import main

  rc = main(
    [
      "run",
      "--no-progress",
      "--cv-folds",
      "2",
      "--cv-grid",
      f"{name}=" + ",".join(map(str, values)),
      "--out",
      str(tmp_path),
    ]
    + argv
  )
  out = capsys.readouterr().out
  assert rc == 0, out
  assert "2-fold cross-validation" in out and f"chosen by CV: {name}=" in out
  cv = json.loads((tmp_path / "cv.json").read_text())
  assert cv["folds"] == 2 and [r[name] for r in cv["table"]] == values
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["config"]["hparams"][name] == cv["best"][name]  # the final run used the pick
  return out


def test_cli_cross_validates_then_runs(capsys, tmp_path):
  from fedjax_dro.cli import main

  _cli_cv(
    capsys,
    tmp_path,
    ["--algorithm", "fedavg", "--dataset", "synthetic-shift", "--rounds", "5"],
    "client_lr",
    [0.001, 0.01],
  )
  # the two CV flags go together
  assert main(["run", "--algorithm", "karula", "--cv-folds", "2", "--no-progress"]) == 2
  assert "--cv-folds and --cv-grid" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_cross_validates_karula_t_with_ot_dissimilarities(capsys, tmp_path):
  """The acceptance command (fewer rounds / folds): D from OT on every fold's training rows."""
  out = _cli_cv(
    capsys,
    tmp_path,
    ["--algorithm", "karula", "--dataset", "synthetic-ridge", "--rounds", "20"],
    "t",
    [0.01, 0.1, 1.0],
  )
  assert "estimation_error" in out


def test_bad_input_raises_clear_errors():
  data = _clients(sizes=[4, 6, 8, 5, 7])
  alg = karula(_model(), dissimilarity="ones")
  with pytest.raises(ValueError, match="folds must be >= 2"):
    cross_validate(alg, data, {"t": [1.0]}, folds=1, rounds=2)
  with pytest.raises(ValueError, match="folds=5 exceeds the smallest client.*client 0 has 4"):
    cross_validate(alg, data, {"t": [1.0]}, folds=5, rounds=2)
  with pytest.raises(TypeError, match="folds"):
    cross_validate(alg, data, {"t": [1.0]}, folds=2.0, rounds=2)
  with pytest.raises(ValueError, match="unknown hyper-parameter 'lr'.*'eta', 't'"):
    cross_validate(alg, data, {"lr": [1.0]}, folds=2, rounds=2)
  with pytest.raises(ValueError, match="unknown hyper-parameter 'local_steps'.*callable"):
    cross_validate(fedavg(_model()), data, {"local_steps": [1, 2]}, folds=2, rounds=2)
  with pytest.raises(ValueError, match=r"grid\['t'\] is empty"):
    cross_validate(alg, data, {"t": []}, folds=2, rounds=2)
  with pytest.raises(ValueError, match="duplicate"):
    cross_validate(alg, data, {"t": [1, 1.0]}, folds=2, rounds=2)
  with pytest.raises(ValueError, match="stat must be one of"):
    cross_validate(alg, data, {"t": [1.0]}, folds=2, rounds=2, stat="median")
  with pytest.raises(ValueError, match="hparams has unknown"):
    cross_validate(alg, data, {"t": [1.0]}, folds=2, rounds=2, hparams={"mu": 1.0})
  with pytest.raises(TypeError, match="make_alg"):
    cross_validate("karula", data, {"t": [1.0]}, folds=2, rounds=2)
  with pytest.raises(TypeError, match="grid"):
    cross_validate(alg, data, [("t", [1.0])], folds=2, rounds=2)


def test_cv_compiles_the_round_once_for_all_folds():
  """The folds share one shape, so the vmapped chunk program is compiled once and reused."""
  import chex

  data = _clients(seed=4)
  alg = fedavg(_model(), clients_per_round=2, local_steps=1, batch_size=4)
  counted = alg._replace(round=chex.assert_max_traces(alg.round, n=1))
  cv = cross_validate(counted, dataset(data), {"client_lr": [0.01, 0.1]}, folds=3, rounds=4)
  assert np.all(np.isfinite(cv.scores))
