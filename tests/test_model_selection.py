"""K-fold cross-validation: the split, agreement with a brute-force loop of separate runs, factory
options in the grid, the CLI, and bad input."""

import itertools
import json

import numpy as np
import pytest

from fedjax_dro import models, run
from fedjax_dro.algorithms import fedavg, karula
from fedjax_dro.data import from_client_arrays
from fedjax_dro.model_selection import cross_validate, grid_edge, kfold_split, widen_at_edges
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


def _product(subgrid):
  names = sorted(subgrid)
  return [dict(zip(names, vals)) for vals in itertools.product(*(subgrid[k] for k in names))]


def _recording(score):
  """An ``evaluate`` scoring each point with ``score(point)`` and recording every subgrid."""
  calls = []

  def evaluate(subgrid):
    calls.append({k: list(v) for k, v in subgrid.items()})
    return [{"hparams": p, "score": score(p)} for p in _product(subgrid)]

  return evaluate, calls


def test_widen_at_edges_walks_to_an_interior_optimum_evaluating_only_new_points():
  """The optimum (lr = 1e-3, b = 2) lies below the initial lr grid: the lr axis gains 1e-3 and
  1e-4 (the ratio of its outermost values), each with every b, and stops once 1e-3 is interior;
  the b axis, whose best value 2 is interior from the start, is never widened."""
  evaluate, calls = _recording(lambda p: -((np.log10(p["lr"]) + 3) ** 2) - (p["b"] - 2) ** 2)
  results, grid, widened = widen_at_edges(
    evaluate, {"lr": [0.1, 0.01], "b": [1, 2, 3]}, axes=["lr", "b"], key=lambda r: r["score"]
  )
  assert [(k, pytest.approx(v)) for k, v in widened] == [("lr", 1e-3), ("lr", 1e-4)]
  assert grid["lr"] == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1]) and grid["b"] == [1.0, 2.0, 3.0]
  assert [sorted(c["lr"]) for c in calls] == [[0.01, 0.1], [pytest.approx(1e-3)], [1e-4]]
  assert all(c["b"] == [1.0, 2.0, 3.0] for c in calls)
  assert (
    len(results) == 12 and len({(r["hparams"]["lr"], r["hparams"]["b"]) for r in results}) == 12
  )
  best = max(results, key=lambda r: r["score"])["hparams"]
  assert best["lr"] == pytest.approx(1e-3) and best["b"] == 2.0


def test_widen_at_edges_high_edge_cap_and_unwidened_axes():
  """A score increasing in lr widens upward until the cap; an axis not in ``axes`` keeps its
  edge; ``max_widenings=0`` is one plain evaluation of the grid."""
  evaluate, calls = _recording(lambda p: p["lr"] + p["c"])
  _, grid, widened = widen_at_edges(
    evaluate,
    {"lr": [1.0, 3.0], "c": [0, 1]},
    axes=["lr"],
    key=lambda r: r["score"],
    max_widenings=2,
  )
  assert [v for _, v in widened] == [pytest.approx(9.0), pytest.approx(27.0)]
  assert grid["c"] == [0.0, 1.0] and len(calls) == 3
  evaluate, calls = _recording(lambda p: p["lr"])
  results, grid, widened = widen_at_edges(
    evaluate, {"lr": [1.0, 3.0]}, axes=["lr"], key=lambda r: r["score"], max_widenings=0
  )
  assert widened == [] and len(calls) == 1 and len(results) == 2


@pytest.mark.parametrize(
  "grid, axes, kwargs, error, match",
  [
    ({"lr": [1.0, 2.0]}, ["mu"], {}, ValueError, "axes names 'mu'"),
    ({"lr": [1.0]}, ["lr"], {}, ValueError, "at least two distinct positive"),
    ({"lr": [-1.0, 2.0]}, ["lr"], {}, ValueError, "at least two distinct positive"),
    ({"lr": [1.0, 2.0]}, ["lr"], {"max_widenings": -1}, ValueError, "max_widenings must be"),
    ({"lr": [1.0, 2.0]}, ["lr"], {"max_widenings": True}, ValueError, "max_widenings must be"),
    ([1.0, 2.0], ["lr"], {}, TypeError, "grid must be a non-empty dict"),
  ],
)
def test_widen_at_edges_bad_inputs(grid, axes, kwargs, error, match):
  evaluate, calls = _recording(lambda p: 0.0)
  with pytest.raises(error, match=match):
    widen_at_edges(evaluate, grid, axes=axes, key=lambda r: r["score"], **kwargs)
  assert calls == []


def test_widen_at_edges_widens_every_axis_on_an_edge_up_to_its_own_limit():
  """The optimum (lr = 1e-3, mu = 100) lies beyond both initial axes: with the best point on an
  edge of both, both gain values in the same step (the new corner evaluated once); each axis
  stops at ``max_widenings`` of its own, so ``mu``, three decades away, ends on its edge after
  two values while ``lr`` reaches its interior optimum after two as well; with four, ``mu``
  walks on to its interior optimum while ``lr`` gains nothing more."""
  score = lambda p: -((np.log10(p["lr"]) + 3) ** 2) - (np.log10(p["mu"]) - 4) ** 2
  evaluate, calls = _recording(score)
  results, grid, widened = widen_at_edges(
    evaluate,
    {"lr": [0.1, 0.01], "mu": [1.0, 10.0]},
    axes=["lr", "mu"],
    key=lambda r: r["score"],
    max_widenings=2,
  )
  axes = [a for a, _ in widened]
  assert axes.count("lr") == 2 and axes.count("mu") == 2
  assert axes[:2] == ["lr", "mu"]  # one step widens both axes
  assert grid["lr"] == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1])
  assert grid["mu"] == pytest.approx([1.0, 10.0, 100.0, 1000.0])
  points = [(r["hparams"]["lr"], r["hparams"]["mu"]) for r in results]
  assert len(points) == len(set(points)) == 16  # the full product, every point once
  best = max(results, key=lambda r: r["score"])["hparams"]
  assert grid_edge(grid["mu"], best["mu"]) == "high" and grid_edge(grid["lr"], best["lr"]) is None
  assert {k: len(v) for k, v in calls[1].items()} == {"lr": 1, "mu": 2}
  assert {k: len(v) for k, v in calls[2].items()} == {"lr": 3, "mu": 1}
  # the limit holds per axis: with more room mu walks on to its optimum 1e4, lr stays put
  evaluate, calls = _recording(score)
  _, grid, widened = widen_at_edges(
    evaluate,
    {"lr": [0.1, 0.01], "mu": [1.0, 10.0]},
    axes=["lr", "mu"],
    key=lambda r: r["score"],
    max_widenings=4,
  )
  assert [a for a, _ in widened].count("mu") == 4 and [a for a, _ in widened].count("lr") == 2
  assert grid["mu"] == pytest.approx([1.0, 10.0, 100.0, 1e3, 1e4, 1e5])
  best = max(_product(grid), key=score)
  assert best["mu"] == pytest.approx(1e4) and grid_edge(grid["mu"], best["mu"]) is None


def test_widen_at_edges_limit_one_each_and_a_single_axis_total_unchanged():
  """``max_widenings=1`` on two edge axes adds exactly one value to each (the old behaviour
  added one value in all)."""
  evaluate, calls = _recording(lambda p: p["a"] + p["b"])
  _, grid, widened = widen_at_edges(
    evaluate,
    {"a": [1.0, 2.0], "b": [1.0, 3.0]},
    axes=["a", "b"],
    key=lambda r: r["score"],
    max_widenings=1,
  )
  assert [a for a, _ in widened] == ["a", "b"] and len(calls) == 3
  assert grid["a"] == pytest.approx([1.0, 2.0, 4.0]) and grid["b"] == pytest.approx([1.0, 3.0, 9.0])


def test_grid_edge_on_log_and_linear_scales():
  """Positive grids match on a log scale (a float32 round trip still matches); a grid holding 0
  or negatives matches on a linear scale instead of failing; duplicates count once."""
  assert grid_edge([0.1, 0.3, 1.0], np.float32(1.0)) == "high"
  assert grid_edge([0.1, 0.3, 1.0], 0.3) is None and grid_edge([0.1, 0.3], 0.1) == "low"
  assert grid_edge([0.0, 0.1, 1.0], 0.0) == "low" and grid_edge([-1.0, 0.0, 1.0], 0.0) is None
  assert grid_edge([2.0, 2.0], 2.0) is None
