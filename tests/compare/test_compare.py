"""fedjax_dro.compare: the paired statistics against scipy, equal budgets (a strategy that
overspends fails), the failure policy applied to every row, selection within a seed on that
seed's training rows only (leak tests), the plateau rule, and the record's files."""

import dataclasses
import json
import math
import os

import numpy as np
import pytest
import scipy.stats

from fedjax_dro import algorithms as A, compare as C
from fedjax_dro.algorithms import algorithm_cost
from fedjax_dro.compare.harness import budget_rounds, plateau_round, reached_cap
from fedjax_dro.compare.report import comparison_markdown
from fedjax_dro.compare.stats import mean_2se
from fedjax_dro.data import from_client_arrays
from fedjax_dro.model_selection import cross_validate, kfold_split
from tests.helpers import dataset, linreg

D = 3


def _clients(seed, scale=1.0, n=4, sizes=(12, 16, 12, 20), noise=0.1):
  rng = np.random.default_rng(seed)
  xs, ys = [], []
  w = rng.normal(size=D)
  for i, m in enumerate(sizes[:n]):
    x = scale * rng.normal(size=(m, D))
    xs.append(x)
    ys.append(x @ (w + 0.3 * i) + noise * rng.normal(size=m))
  return from_client_arrays(xs, ys, dtype=np.float64)


def _data(seed, scale=None):
  """Seed ``s``: new clients; features scaled by 10 on seed 1 (a large step diverges there)."""
  scale = (10.0 if seed == 1 else 1.0) if scale is None else scale
  return dataset(_clients(seed, scale), _clients(seed + 100, scale))


MODEL = linreg(D, l2=0.01)


def _strategies():
  return [
    C.Strategy(
      "FedAvg",
      lambda m: A.fedavg(m, local_steps=3, clients_per_round=2),
      grid={"client_lr": [0.01, 0.03, 0.1]},
    ),
    C.Strategy("FedSGD", lambda m: A.fedsgd(m), grid={"lr": [0.03, 0.1, 0.3]}),
  ]


def _experiment(**protocol):
  kw = dict(
    seeds=(0, 2),
    metric=C.Metric("mse", "weighted_mean"),
    folds=2,
    max_widenings=1,
    budget=C.Budget("rounds", rounds=8),
  )
  kw.update(protocol)
  return C.Experiment("tiny", _data, MODEL, _strategies(), C.Protocol(**kw))


# ----------------------------------------------------------------------------------------------
# statistics
# ----------------------------------------------------------------------------------------------


def test_paired_statistics_match_scipy():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=9), rng.normal(size=9) + 0.3
  d = C.paired_difference(a, b, higher_is_better=True)
  t = scipy.stats.ttest_rel(a, b)
  np.testing.assert_allclose(d["t"], t.statistic, rtol=1e-12)
  np.testing.assert_allclose(d["difference"], np.mean(a - b), rtol=1e-12)
  np.testing.assert_allclose(d["difference_2se"], 2 * scipy.stats.sem(a - b), rtol=1e-12)
  assert d["wins"] == int(np.sum(a > b)) and d["losses"] == int(np.sum(a < b))
  assert d["wins"] + d["losses"] + d["ties"] == 9
  lower = C.paired_difference(a, b, higher_is_better=False)
  assert lower["wins"] == d["losses"]
  m, two_se = mean_2se(a)
  np.testing.assert_allclose([m, two_se], [a.mean(), 2 * scipy.stats.sem(a)], rtol=1e-12)
  assert math.isnan(mean_2se([1.0])[1])


# ----------------------------------------------------------------------------------------------
# budgets
# ----------------------------------------------------------------------------------------------


def test_equal_uploads_give_every_strategy_the_budget_within_one_round():
  """Each strategy spends at most the budget and less than one of its rounds below it; the
  recorded spend is the algorithm's stated cost times the rounds the final run took. The budget
  is FedAvg's 7 rounds of 2 model uploads (14 P floats): FedSGD on 3 clients (3 P per round)
  gets 4 rounds, SCAFFOLD (2 clients, model and control variate: 4 P per round) 3."""
  strategies = [
    _strategies()[0],
    C.Strategy("FedSGD", lambda m: A.fedsgd(m, clients_per_round=3), grid={"lr": [0.03, 0.1]}),
    C.Strategy(
      "SCAFFOLD",
      lambda m: A.scaffold(m, local_steps=3, clients_per_round=2),
      grid={"client_lr": [0.01, 0.03, 0.1]},
    ),
  ]
  exp = C.Experiment(
    "uploads",
    _data,
    MODEL,
    strategies,
    C.Protocol(
      seeds=(0,),
      metric=C.Metric("mse"),
      folds=2,
      max_widenings=0,
      equal_grids=False,
      budget=C.Budget("uploads", match="FedAvg", rounds=7),
    ),
  )
  res = C.compare(exp, verbose=False)
  ds = _data(0)
  p = D + 1
  budget = 14 * p
  fedavg_cost = algorithm_cost(A.fedavg(MODEL, local_steps=3, clients_per_round=2), ds.train)
  assert fedavg_cost.spent(7).upload_floats == budget
  for s in strategies:
    row = res.per_seed[s.label][0]
    assert not row["failed"], row
    spent = row["spent"]["upload_floats"]
    per = row["per_round"]["upload_floats"]
    assert spent <= budget, (s.label, spent, budget)  # never overspends
    assert budget - spent < per, (s.label, spent, budget, per)  # within one round's worth
    assert row["curve"][-1]["round"] == row["rounds"]  # the run took the rounds it was given
    cost = algorithm_cost(s.make(MODEL), ds.train)
    assert spent == pytest.approx(cost.spent(row["rounds"]).upload_floats)
  rounds = {k: res.per_seed[k][0]["rounds"] for k in ("FedAvg", "FedSGD", "SCAFFOLD")}
  assert rounds == {"FedAvg": 7, "FedSGD": 4, "SCAFFOLD": 3}


def test_budget_rounds_spend_and_refusals():
  costs = A.fedavg(MODEL, local_steps=3, clients_per_round=2).cost(_data(0).train)
  per = costs.round.upload_floats
  b = C.Budget("uploads", amount=10 * per + 0.5 * per)
  assert budget_rounds(b, costs, b.amount, "x") == 10
  g = C.Budget("gradients", amount=4 * costs.round.gradient_evaluations)
  assert budget_rounds(g, costs, g.amount, "x") == 4
  with pytest.raises(ValueError, match="does not pay for one round of strategy 'x'"):
    budget_rounds(b, costs, 0.5 * per, "x")
  local = A.local(MODEL).cost(_data(0).train)  # uploads nothing
  with pytest.raises(ValueError, match="spends no upload_floats per round.*cap"):
    budget_rounds(b, local, b.amount, "Local")
  capped = C.Budget("uploads", amount=b.amount, cap=7)
  assert budget_rounds(capped, local, b.amount, "Local") == 7


def test_a_run_stopped_by_the_cap_is_said_so():
  costs = A.fedavg(MODEL, local_steps=3, clients_per_round=2).cost(_data(0).train)
  per = costs.round.upload_floats
  amount = 10 * per + 0.5 * per  # pays for 10 rounds
  assert reached_cap(C.Budget("uploads", amount=amount, cap=7), costs, amount, 7)
  assert not reached_cap(C.Budget("uploads", amount=amount, cap=10), costs, amount, 10)
  assert not reached_cap(C.Budget("uploads", amount=amount), costs, amount, 10)
  local = A.local(MODEL).cost(_data(0).train)  # uploads nothing: only the cap ends it
  assert reached_cap(C.Budget("uploads", amount=amount, cap=7), local, amount, 7)
  plateau = C.Budget("plateau", cap=60)
  assert reached_cap(plateau, costs, None, 60) and not reached_cap(plateau, costs, None, 55)
  assert not reached_cap(C.Budget("rounds", rounds=5), costs, None, 5)
  # the table says which runs the cap stopped, and nothing for records without the field
  res = C.compare(_experiment(budget=C.Budget("plateau", cap=4, every=2)), verbose=False).to_json()
  rows = [(s, r) for s, rs in res["per_seed"].items() for r in rs]
  assert all(r["at_cap"] == (r["rounds"] >= 4) for _, r in rows)
  text = comparison_markdown(res)
  line = next(x for x in text.splitlines() if x.startswith("Runs stopped by the budget's cap"))
  for label, r in rows:
    assert (f"{label} seed {r['seed']} ({r['rounds']} rounds)" in line) == r["at_cap"]
  for _, r in rows:
    del r["at_cap"]
  assert "Runs stopped by the budget's cap" not in comparison_markdown(res)


def test_plateau_round_rule():
  r = [10, 20, 30, 40, 50, 60]
  # loss improves until round 30, then flat: plateau at 30 after patience 2
  assert (
    plateau_round(r, [5, 4, 3, 3, 3.0001, 2.9999], higher=False, patience=2, min_delta=1e-3) == 30
  )
  # accuracy keeps improving: the last round
  assert (
    plateau_round(r, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], higher=True, patience=2, min_delta=1e-3) == 60
  )
  # a non-finite evaluation ends the run at the best finite one before it
  assert plateau_round(r, [5, 4, math.nan, 1, 1, 1], higher=False, patience=2, min_delta=0.0) == 20


# ----------------------------------------------------------------------------------------------
# failure policy
# ----------------------------------------------------------------------------------------------


def _failing_experiment(**protocol):
  """FedSGD's steps diverge on seed 1's scaled features (L ~ 160; overflow within 100 rounds):
  every grid point fails there and nowhere else."""
  strategies = [
    C.Strategy("FedAvg", lambda m: A.fedavg(m, local_steps=2), grid={"client_lr": [0.002, 0.005]}),
    C.Strategy("FedSGD", lambda m: A.fedsgd(m), grid={"lr": [0.5, 0.6]}),
    C.Strategy("Local", lambda m: A.local(m, local_steps=2), grid={"client_lr": [0.002, 0.005]}),
  ]
  kw = dict(
    seeds=(0, 1, 2),
    metric=C.Metric("mse"),
    folds=2,
    max_widenings=0,
    budget=C.Budget("rounds", rounds=100),
  )
  kw.update(protocol)
  return C.Experiment("fail", _data, MODEL, strategies, C.Protocol(**kw))


def test_failure_policy_is_applied_to_every_row():
  res = C.compare(_failing_experiment(), verbose=False)
  assert [(f["strategy"], f["seed"]) for f in res.failures] == [("FedSGD", 1)]
  assert res.kept_seeds == [0, 2]
  for label in ("FedAvg", "FedSGD", "Local"):
    kept = [r["value"] for r in res.per_seed[label] if r["seed"] in (0, 2)]
    assert res.table[label]["seeds"] == 2
    np.testing.assert_allclose(res.table[label]["mse"]["mean"], np.mean(kept), rtol=1e-12)
  assert res.table["FedSGD"]["failures"] == 1 and res.table["Local"]["failures"] == 0
  assert res.paired["mse"]["Local"]["seeds"] == 2  # the dropped seed is dropped in every pair
  scored = C.compare(_failing_experiment(on_failure="score", failure_score=1e6), verbose=False)
  assert scored.kept_seeds == [0, 1, 2]
  values = [1e6 if r["failed"] else r["value"] for r in scored.per_seed["FedSGD"]]
  np.testing.assert_allclose(scored.table["FedSGD"]["mse"]["mean"], np.mean(values), rtol=1e-12)
  assert scored.paired["mse"]["FedSGD"]["losses"] >= 1
  assert scored.table["FedAvg"]["seeds"] == scored.table["Local"]["seeds"] == 3


# ----------------------------------------------------------------------------------------------
# selection: within each seed, on its training rows only
# ----------------------------------------------------------------------------------------------


def test_selection_uses_only_that_seeds_training_rows():
  """(1) Replacing every seed's test rows with garbage changes no choice; (2) every seed's
  choice is the cross-validation optimum of that seed's own training rows (recomputed here); (3)
  changing another seed's data changes no choice of this seed."""
  base = C.compare(_experiment(max_widenings=0), verbose=False)

  def garbage_test(seed):
    ds = _data(seed)
    rng = np.random.default_rng(999)
    t = ds.test
    return dataclasses.replace(ds, test=dataclasses.replace(t, y=rng.normal(size=t.y.shape) * 50))

  poisoned = C.compare(
    dataclasses.replace(_experiment(max_widenings=0), data=garbage_test), verbose=False
  )
  for label in ("FedAvg", "FedSGD"):
    for a, b in zip(base.per_seed[label], poisoned.per_seed[label]):
      assert a["chosen"] == b["chosen"] and a["selection_score"] == b["selection_score"]
      assert a["value"] != b["value"]  # the test rows did change
  strategies = {s.label: s for s in _strategies()}
  for label in ("FedAvg", "FedSGD"):
    for row in base.per_seed[label]:
      seed = row["seed"]
      s = strategies[label]
      cv = cross_validate(
        s.make(MODEL),
        _data(seed).train,
        s.grid,
        folds=2,
        rounds=8,
        seed=seed,
        metric="mse",
        eval_every=8,
      )
      assert row["chosen"] == cv.best
      np.testing.assert_allclose(row["selection_score"], cv.best_score, rtol=1e-12)

  def other_seed_changed(seed):
    return _data(seed, scale=5.0) if seed == 2 else _data(seed)

  changed = C.compare(
    dataclasses.replace(_experiment(max_widenings=0), data=other_seed_changed), verbose=False
  )
  for label in ("FedAvg", "FedSGD"):
    assert changed.per_seed[label][0]["chosen"] == base.per_seed[label][0]["chosen"]
    assert (
      changed.per_seed[label][0]["selection_score"] == base.per_seed[label][0]["selection_score"]
    )


def test_kfold_folds_are_of_the_training_rows():
  train = _data(0).train
  for tr, held in kfold_split(train, 2, seed=0):
    np.testing.assert_array_equal(
      np.asarray(tr.num_examples) + np.asarray(held.num_examples), np.asarray(train.num_examples)
    )


def test_widening_and_edges_are_recorded(tmp_path):
  """A grid whose best point is on its edge is widened; what is still on an edge is listed."""
  strategies = [
    C.Strategy(
      "FedAvg", lambda m: A.fedavg(m, local_steps=3), grid={"client_lr": [1e-4, 2e-4]}
    ),  # far too small: the high edge wins
    C.Strategy("FedSGD", lambda m: A.fedsgd(m), grid={"lr": [0.03, 0.1]}),
  ]
  exp = C.Experiment(
    "edges",
    _data,
    MODEL,
    strategies,
    C.Protocol(
      seeds=(0,),
      metric=C.Metric("mse"),
      folds=2,
      max_widenings=2,
      budget=C.Budget("rounds", rounds=8),
    ),
  )
  res = C.compare(exp, out_dir=str(tmp_path), verbose=False)
  row = res.per_seed["FedAvg"][0]
  assert [w["axis"] for w in row["widened"]] == ["client_lr", "client_lr"]
  assert row["configurations"] == 4 and row["chosen"]["client_lr"] == pytest.approx(8e-4)
  assert {
    "strategy": "FedAvg",
    "seed": 0,
    "axis": "client_lr",
    "edge": "high",
    "value": row["chosen"]["client_lr"],
  } in res.edges
  for ext in ("json", "md", "png"):
    assert os.path.getsize(tmp_path / f"edges.{ext}") > 0
  saved = json.loads((tmp_path / "edges.json").read_text())
  assert saved["edges"] == res.edges and saved["table"]["FedSGD"]["seeds"] == 1
  md = (tmp_path / "edges.md").read_text()
  assert "FedAvg seed 0 client_lr=0.0008 (high)" in md and "uploaded floats" in md


# ----------------------------------------------------------------------------------------------
# declarations
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "build, match",
  [
    (lambda: C.Budget("uploads"), "exactly one of amount=B and match"),
    (lambda: C.Budget("plateau"), "needs cap"),
    (lambda: C.Budget("steps", rounds=3), "budget kind must be one of"),
    (lambda: C.Protocol(seeds=()), "seeds must be a non-empty list"),
    (lambda: C.Protocol(on_failure="score"), "needs failure_score"),
    (lambda: C.Metric("mse", "median"), "metric stat must be one of"),
    (
      lambda: C.Experiment(
        "x",
        _data,
        MODEL,
        _strategies()[:1] + [C.Strategy("S", lambda m: A.fedsgd(m), grid={"lr": [0.1]})],
      ),
      "equal_grids",
    ),
    (
      lambda: C.Experiment("x", _data, MODEL, _strategies(), C.Protocol(reference="Ditto")),
      "reference 'Ditto' is not a strategy",
    ),
  ],
)
def test_bad_declarations_name_the_field(build, match):
  with pytest.raises((ValueError, TypeError), match=match):
    build()


def _with_validation(seed):
  ds = _data(seed)
  return dataclasses.replace(ds, validation=_clients(seed + 200))


def test_validation_selection_scores_on_the_datas_validation_split():
  """selection='validation': every choice is the grid's best on the data's validation split,
  trained on all training rows (recomputed with a plain sweep); the test rows are not used (a
  garbage test split changes no choice); data without a validation split is refused."""
  from fedjax_dro.engine.sweeps import sweep

  exp = dataclasses.replace(
    _experiment(max_widenings=0, selection="validation"), data=_with_validation
  )
  assert "validation" in exp.protocol.describe()["selection"]
  res = C.compare(exp, verbose=False)
  for s in _strategies():
    for row in res.per_seed[s.label]:
      seed = row["seed"]
      ds = _with_validation(seed)
      out = sweep(
        s.make(MODEL),
        ds.train,
        rounds=8,
        grid=s.grid,
        seeds=[seed],
        eval_data=ds.validation,
        eval_every=8,
      )
      scores = [f["mse"]["weighted_mean"] for f in out.final_summary]
      best = int(np.argmin(scores))
      assert row["chosen"] == out.configs[best]["hparams"]
      np.testing.assert_allclose(row["selection_score"], scores[best], rtol=1e-12)

  def garbage_test(seed):
    ds = _with_validation(seed)
    t = ds.test
    y = np.random.default_rng(9).normal(size=t.y.shape) * 50
    return dataclasses.replace(ds, test=dataclasses.replace(t, y=y))

  poisoned = C.compare(dataclasses.replace(exp, data=garbage_test), verbose=False)
  for label in ("FedAvg", "FedSGD"):
    for a, b in zip(res.per_seed[label], poisoned.per_seed[label]):
      assert a["chosen"] == b["chosen"] and a["value"] != b["value"]
  with pytest.raises(ValueError, match="validation split"):
    C.compare(_experiment(selection="validation"), verbose=False)
