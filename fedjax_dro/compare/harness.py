"""The comparison loop: per seed, select every strategy's configuration on its training rows,
train it under the budget, score it on the test rows; then the table and the paired differences.

The selection (:func:`select`) widens every geometric axis of each sub-grid while the choice sits
on its edge, up to ``max_widenings`` values per axis, and judges an axis split across sub-grids
(one value in each) on the union of its values: its edge is reported, it is not widened.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp

from fedjax_dro.algorithms.base import Algorithm, algorithm_cost
from fedjax_dro.common.model import Model, model_identity
from fedjax_dro.common.version import __version__
from fedjax_dro.compare.domains import domain_digest, domain_evaluate, domain_final
from fedjax_dro.compare.protocol import Budget, Experiment, Strategy, integral as _integral
from fedjax_dro.compare.report import ComparisonResult, summarize_rows
from fedjax_dro.compare.resume import RunRecords, check_part, data_digest, round_trip, run_key
from fedjax_dro.core.costs import Costs, RoundCost
from fedjax_dro.data.federated import FederatedDataset
from fedjax_dro.model_selection import (
  cross_validate,
  grid_edge,
  holdout_split,
  kfold_split,
  normalized_value,
  widen_at_edges,
)


class SelectionFailed(FloatingPointError):
  """Every configuration of a strategy's grid diverged on some fold."""


def budget_rounds(budget: Budget, costs: Costs, amount: Optional[float], label: str) -> int:
  """The rounds a strategy with ``costs`` gets under ``budget`` (``amount``: the resolved total
  of an equal-cost budget): the most rounds whose spend (setup included) stays within it.

  Args:
    budget: the :class:`~fedjax_dro.compare.Budget`.
    costs: the strategy's :class:`~fedjax_dro.core.costs.Costs` on the training data.
    amount: the total of an ``uploads`` / ``gradients`` budget.
    label: the strategy's name (for the error message).
  """
  if budget.kind == "rounds":
    return int(budget.rounds)
  if budget.kind == "plateau":
    return int(budget.cap)
  field = budget.field
  per, setup = float(getattr(costs.round, field)), float(getattr(costs.setup, field))
  if per <= 0:
    if budget.cap is None:
      raise ValueError(
        f"strategy {label!r} spends no {field} per round, so a {budget.kind!r} budget gives it "
        "no number of rounds; give the budget a cap=C"
      )
    return int(budget.cap)
  rounds = int(math.floor((amount - setup) / per * (1 + 1e-12)))
  if rounds < 1:
    raise ValueError(
      f"the {budget.kind!r} budget {amount:.6g} does not pay for one round of strategy "
      f"{label!r} ({field}: setup {setup:.6g}, {per:.6g} per round)"
    )
  return min(rounds, int(budget.cap)) if budget.cap is not None else rounds


def reached_cap(budget: Budget, costs: Costs, amount: Optional[float], rounds: int) -> bool:
  """Whether a run of ``rounds`` rounds stopped at the budget's ``cap`` rather than at its own
  end: a plateau not found within the cap, or an equal spend that would pay for more rounds."""
  if budget.cap is None or rounds < budget.cap:
    return False
  if budget.kind == "plateau":
    return True
  field = budget.field
  per, setup = float(getattr(costs.round, field)), float(getattr(costs.setup, field))
  return per <= 0 or int(math.floor((amount - setup) / per * (1 + 1e-12))) > budget.cap


def plateau_round(
  rounds: List[int], values: List[float], *, higher: bool, patience: int, min_delta: float
) -> int:
  """The round of the validation plateau: the evaluation after which ``patience`` further
  evaluations brought no relative gain above ``min_delta`` over the best value so far (the last
  evaluated round when that never happens). A non-finite value ends the run at the last finite
  evaluation before it.

  Args:
    rounds: the evaluated rounds, increasing.
    values: the held-out metric at them.
    higher: whether larger is better.
    patience: evaluations without gain that make a plateau.
    min_delta: the relative gain that counts.
  """
  sign = 1.0 if higher else -1.0
  best_round, best, waited = rounds[0], None, 0
  for r, v in zip(rounds, values):
    if not math.isfinite(v):
      break
    if best is None or sign * (v - best) > min_delta * max(abs(best), 1e-12):
      best, best_round, waited = v, r, 0
    else:
      waited += 1
      if waited >= patience:
        return best_round
  return best_round if best is not None else rounds[0]


class _Builder:
  """Memoized ``make(model, **options)`` per strategy: the same Algorithm object for the same
  options, so every seed and fold reuses its compiled programs."""

  def __init__(self, strategy: Strategy, model: Model):
    self.strategy, self.model, self.cache = strategy, model, {}
    # make(model, **options)'s options, read by cross_validate to tell options from hparams
    try:
      params = list(inspect.signature(strategy.make).parameters.values())[1:]
      self.__signature__ = inspect.Signature(params)
    except (TypeError, ValueError):
      pass

  def __call__(self, **options) -> Algorithm:
    options = {k: _integral(v) for k, v in options.items()}
    key = tuple(sorted(options.items()))
    if key not in self.cache:
      alg = self.strategy.make(self.model, **options)
      if not isinstance(alg, Algorithm):
        raise TypeError(
          f"strategy {self.strategy.label!r}: make(model, **options) must return an Algorithm, "
          f"got {type(alg).__name__}"
        )
      self.cache[key] = alg
    return self.cache[key]

  def split(self, point: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, float]]:
    """``(options, hyper-parameters)`` of a grid point."""
    hp = self().hparams
    options = {k: _integral(v) for k, v in point.items() if k not in hp}
    return options, {k: float(v) for k, v in point.items() if k in hp}


def _signed(score: float, higher: bool) -> float:
  return (score if higher else -score) if math.isfinite(score) else -math.inf


def _selection_splits(protocol, ds: FederatedDataset, seed):
  if protocol.selection in ("validation", "domains"):
    if ds.validation is None:
      raise ValueError(
        f"selection='validation' needs data({seed}) to return a FederatedDataset with a "
        "validation split (FederatedDataset(..., validation=FederatedData)); it has none"
      )
    return [(ds.train, ds.validation)]
  if protocol.selection == "kfold":
    return kfold_split(ds.train, protocol.folds, seed=seed)
  return holdout_split(ds.train, protocol.holdout, seed=seed)


def select(
  strategy: Strategy,
  build: _Builder,
  train,
  splits,
  *,
  protocol,
  rounds: int,
  seed: int,
  trained: Optional[dict] = None,
) -> Dict[str, Any]:
  """Per-seed selection of ``strategy``'s configuration on ``splits`` of the seed's training
  rows (``train``; the test rows are never seen), widening geometric axes at edges.

  Every sub-grid of ``strategy.grids`` is searched with :func:`widen_at_edges` (each of its
  geometric axes widened up to ``protocol.max_widenings`` times); the best point over all
  sub-grids is chosen. Its edges are judged per axis: an axis with two or more values in the
  winning (widened) sub-grid on that sub-grid's values; an axis split across sub-grids (one
  value in the winning sub-grid, like pFedMe's ``lam``) on the union of its values over the
  sub-grids that hold it. A split axis is reported but not widened: its partner values (the
  inner step that follows ``lam``) are the strategy's, not the harness's, to set.

  Returns ``{"chosen", "score", "configurations", "widened", "edges", "points"}``; raises
  :class:`SelectionFailed` when every configuration diverged.
  """
  metric = protocol.metric
  higher = metric.higher_is_better
  if not strategy.grids or all(not g for g in strategy.grids):
    return {
      "chosen": {},
      "score": None,
      "configurations": 1,
      "widened": [],
      "edges": [],
      "points": [],
    }
  hp_names = set(build().hparams)
  points: List[Dict[str, Any]] = []
  widened_all, edges, finals = [], [], []
  best = None
  for grid in strategy.grids:
    if strategy.widen is not None:  # a split axis (one value in this sub-grid) is not widened
      axes = [
        a for a in strategy.widen if a in grid and len({normalized_value(x) for x in grid[a]}) >= 2
      ]
    else:
      axes = [
        k
        for k, v in grid.items()
        if k in hp_names and len({float(x) for x in v}) >= 2 and min(float(x) for x in v) > 0
      ]

    def evaluate(subgrid, _grid=grid):
      options = [k for k in subgrid if k not in hp_names]
      if protocol.selection == "domains":
        return domain_evaluate(
          build, strategy, train, splits, subgrid, options, rounds, seed, metric, trained
        )
      try:
        cv = cross_validate(
          build if options else build(),
          train,
          {
            k: [_integral(v) for v in vals] if k in options else vals for k, vals in subgrid.items()
          },
          rounds=rounds,
          seed=seed,
          metric=metric.name,
          stat=metric.stat,
          hparams=dict(strategy.fixed) or None,
          eval_every=rounds,
          splits=splits,
        )
      except FloatingPointError:  # every point diverged: scored NaN, like a diverged point
        names = list(subgrid)
        return [
          {"hparams": dict(zip(names, c)), "score": math.nan, "se": math.nan}
          for c in itertools.product(*subgrid.values())
        ]
      return [
        {
          "hparams": {k: _integral(v) if k in options else v for k, v in p.items()},
          "score": float(m),
          "se": float(s),
        }
        for p, m, s in zip(cv.points, cv.mean, cv.se)
      ]

    results, final_grid, widened = widen_at_edges(
      evaluate,
      grid,
      axes=axes,
      key=lambda r: _signed(r["score"], higher),
      max_widenings=protocol.max_widenings,
    )
    points += results
    widened_all += [{"axis": a, "value": v} for a, v in widened]
    finals.append(final_grid)
    top = max(results, key=lambda r: _signed(r["score"], higher))
    if best is None or _signed(top["score"], higher) > _signed(best[0]["score"], higher):
      best = (top, final_grid)
  top, final_grid = best
  if not math.isfinite(top["score"]):
    raise SelectionFailed(f"every configuration of {strategy.label!r} diverged on some fold")
  for axis, values in final_grid.items():
    split = len(set(values)) < 2
    if split:  # one value here: judged on the union of the axis over the sub-grids
      values = sorted({v for g in finals if axis in g for v in g[axis]})
    edge = grid_edge(values, top["hparams"][axis]) if len(set(values)) >= 2 else None
    if edge is not None:
      edges.append(
        {"axis": axis, "edge": edge, "value": top["hparams"][axis]}
        | ({"across": "sub-grids"} if split else {})
      )
  return {
    "chosen": dict(top["hparams"]),
    "score": float(top["score"]),
    "configurations": len(points),
    "widened": widened_all,
    "edges": edges,
    "points": points,
  }


def _stacked_models(alg: Algorithm, state, num_clients: int):
  models = alg.client_models(state)
  if not alg.personalized:
    models = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + a.shape), models)
  return models


def _train_and_score(experiment, alg, hparams, ds, *, rounds, seed, costs, trained=None):
  """The final run on all training rows: the test metric, extra metrics and curves."""
  from fedjax_dro.engine.runner import run

  metric = experiment.protocol.metric
  every = experiment.protocol.curve_every or max(1, rounds // 10)
  if experiment.protocol.selection == "domains":  # reported on the test split's domains
    summary = domain_final(alg, ds.train, ds.test, rounds, seed, hparams, trained)
    missing = [e.name for e in experiment.extra_metrics if e.name not in summary]
    if missing:
      raise ValueError(
        f"extra metrics {missing} are not metrics of the test split: {sorted(summary)}"
      )
    return summary[metric.name], {e.name: summary[e.name] for e in experiment.extra_metrics}, []
  hist = run(
    alg, ds, rounds=rounds, seed=seed, hparams=hparams or None, eval_every=min(every, rounds)
  )
  final = hist.final
  if metric.name not in final or metric.stat not in final[metric.name]:
    raise ValueError(
      f"metric {metric.label} is not reported for {alg.name} on this task; available: "
      f"{sorted(final)}"
    )
  value = float(final[metric.name][metric.stat])
  curve = [
    {
      "round": int(e["round"]),
      "uploads": costs.spent(int(e["round"])).upload_floats,
      "gradients": costs.spent(int(e["round"])).gradient_evaluations,
      "value": float(e["summary"][metric.name][metric.stat]),
    }
    for e in hist.evaluations
  ]
  extra = {}
  if experiment.extra_metrics:
    models = _stacked_models(alg, hist.final_state, ds.num_clients)
    for e in experiment.extra_metrics:
      extra[e.name] = float(e.fn(models, ds))
  return value, extra, curve


def _load(experiment: Experiment, seed: int) -> FederatedDataset:
  ds = experiment.data(seed)
  if not isinstance(ds, FederatedDataset) or ds.test is None:
    raise TypeError(
      f"data({seed}) must return a FederatedDataset with a test split, got {type(ds).__name__}"
    )
  return ds


def compare(
  experiment: Experiment,
  out_dir: Optional[str] = None,
  *,
  verbose: bool = True,
  log: Optional[Callable[[str], None]] = None,
  selections: Optional[Dict[Any, Dict[str, Any]]] = None,
  progress: bool = True,
  part: Optional[Tuple[int, int]] = None,
  trained: Optional[dict] = None,
) -> Optional[ComparisonResult]:
  """Runs ``experiment`` (see :mod:`fedjax_dro.compare`) and returns its
  :class:`ComparisonResult`; with ``out_dir``, writes ``NAME.json``, ``NAME.md`` and
  ``NAME.png`` there.

  With ``out_dir``, every finished run (one strategy on one seed) is also recorded there as it
  completes (:mod:`fedjax_dro.compare.resume`): a comparison killed part way and started again
  reads the finished runs back and computes only the others, and its table equals an
  uninterrupted one.

  Args:
    experiment: the :class:`~fedjax_dro.compare.Experiment`.
    out_dir: the output folder (``None``: nothing written, nothing resumed).
    verbose: print the job's size, a line per finished run and the table.
    log: where those lines go (default ``print`` when ``verbose``).
    selections: a dict shared by ``compare`` calls of one experiment under several budgets
      (the same strategies, data, seeds and ``selection_rounds``): a strategy's selection on a
      seed is stored there under ``(label, seed, selection rounds)`` and reused, so the tables
      at several budgets rest on one selection.
    progress: a progress bar over the runs on a terminal (with ``verbose``).
    part: ``(i, N)``: run only part ``i`` of ``N`` of the table's runs (the runs, seed by seed
      and strategy by strategy, numbered from 0, whose number is ``i - 1`` modulo ``N``), for
      independent machines (a Slurm array, N shells on N GPUs); each part records its runs in
      its ``out_dir``. A part returns ``None`` unless every run of the table is recorded there;
      :func:`fedjax_dro.compare.resume.merge_runs` (``fedjax-dro merge``) joins the parts'
      records, and the table is then written from them, equal to one run of the whole.
    trained: under ``selection="domains"``, a dict shared by ``compare`` calls that train the
      same strategies on the same data objects and report different metrics: every trained
      grid and final run is kept there and scored again, not trained again.
  """
  if not isinstance(experiment, Experiment):
    raise TypeError(f"experiment must be a compare.Experiment, got {type(experiment).__name__}")
  protocol, budget = experiment.protocol, experiment.protocol.budget
  part = check_part(part, out_dir)
  say = log or (print if verbose else (lambda *a, **k: None))
  t_start = time.perf_counter()
  first = _load(experiment, protocol.seeds[0])
  model = experiment.model if isinstance(experiment.model, Model) else experiment.model(first)
  if not isinstance(model, Model):
    raise TypeError(f"model must be a Model or model(dataset) -> Model, got {type(model).__name__}")
  builders = {s.label: _Builder(s, model) for s in experiment.strategies}
  rows: Dict[str, List[Dict[str, Any]]] = {s.label: [] for s in experiment.strategies}
  records = RunRecords(None if out_dir is None else os.path.join(out_dir, "runs", experiment.name))
  total = len(protocol.seeds) * len(experiment.strategies)
  say(
    f"[{experiment.name}] {total} runs: {len(protocol.seeds)} seeds x "
    f"{len(experiment.strategies)} strategies, each a selection over its grid "
    f"({sum(s.num_configurations for s in experiment.strategies)} configurations in all) and "
    "a final run" + (f"; finished runs are recorded in {records.directory}" if out_dir else "")
  )
  bar = _progress_bar(total, experiment.name, verbose and progress)
  number, missing = -1, 0
  for seed in protocol.seeds:
    ds = first if seed == protocol.seeds[0] else _load(experiment, seed)
    splits = _selection_splits(protocol, ds, seed)
    amount = budget.amount
    if budget.match is not None:
      ref_costs = algorithm_cost(builders[budget.match](), ds.train)
      amount = getattr(ref_costs.spent(budget.rounds), budget.field)
    digest_of = domain_digest if protocol.selection == "domains" else data_digest
    data = digest_of(ds) if out_dir is not None else None
    for strategy in experiment.strategies:
      build = builders[strategy.label]
      digest, key = run_key(
        experiment=experiment.name,
        strategy=_strategy_identity(strategy, build),
        model=model_identity(model),
        protocol=dataclasses.asdict(protocol),
        extra_metrics=[e.name for e in experiment.extra_metrics],
        seed=seed,
        data=data,
        budget_amount=amount,
        version=__version__,
      )
      number += 1
      found = records.get(digest, key)
      if found is None and part is not None and number % part[1] != part[0] - 1:
        missing += 1  # another part's run
        continue
      if found is not None:
        row = found["row"]
        if selections is not None and found["selection"] is not None:
          selections.setdefault(tuple(found["selection_key"]), found["selection"])
      else:
        row, sel, sel_key = _run(
          experiment, build, strategy, ds, splits, seed, amount, selections, trained
        )
        row = round_trip(row)
        records.put(digest, key, {"row": row, "selection": sel, "selection_key": sel_key})
      rows[strategy.label].append(row)
      shown = "FAILED " + row["failure"][:60] if row["failed"] else f"{row['value']:.4g}"
      say(
        f"[{experiment.name}] seed {seed} {strategy.label:<10} {protocol.metric.label} {shown}"
        + ("" if row["failed"] else f"  rounds {row['rounds']}  chosen {row['chosen']}")
        + f"  ({row['seconds']:.0f}s"
        + (", recorded earlier)" if found is not None else ")")
      )
      if bar is not None:
        bar.update(1)
  if bar is not None:
    bar.close()
  if missing:
    say(
      f"[{experiment.name}] part {part[0]}/{part[1]}: its runs are recorded in "
      f"{records.directory}; {missing} runs belong to the other parts (fedjax-dro merge joins "
      "the parts' directories and writes the table)"
    )
    return None
  result = summarize_rows(experiment, rows, wall_time=time.perf_counter() - t_start)
  say(result.to_markdown())
  if out_dir is not None:
    paths = result.save(out_dir)
    say(f"[{experiment.name}] wrote " + ", ".join(paths))
  return result


def _progress_bar(total: int, name: str, show: bool):
  """A tqdm bar over the runs on a terminal (``None`` elsewhere: the per-run lines suffice)."""
  if not show or not sys.stderr.isatty():
    return None
  from tqdm.auto import tqdm

  return tqdm(total=total, desc=name, unit="run", leave=False)


def _strategy_identity(strategy: Strategy, build: _Builder) -> Dict[str, Any]:
  """What determines a strategy's runs: its algorithm and settings as built, its default
  hyper-parameters, grid, fixed values and widened axes."""
  alg = build()
  return {
    "label": strategy.label,
    "algorithm": alg.name,
    "settings": alg.config,
    "hparams": {k: v.default for k, v in alg.hparams.items()},
    "grid": strategy.grids,
    "fixed": strategy.fixed,
    "widen": None if strategy.widen is None else list(strategy.widen),
  }


def _run(experiment, build, strategy, ds, splits, seed, amount, selections, trained=None):
  """One run of the table: ``strategy``'s selection on ``seed`` (or the shared one), its final
  run and its score. Returns ``(row, selection, selection key)``."""
  protocol, budget = experiment.protocol, experiment.protocol.budget
  t0 = time.perf_counter()
  row: Dict[str, Any] = {"seed": seed, "failed": False, "budget_amount": amount}
  sel = sel_key = None
  try:
    sel_rounds = protocol.selection_rounds or budget_rounds(
      budget, algorithm_cost(build(), ds.train), amount, strategy.label
    )
    sel_key = (strategy.label, seed, sel_rounds)
    if selections is not None and sel_key in selections:
      sel = selections[sel_key]
    else:
      pick = dict(protocol=protocol, rounds=sel_rounds, seed=seed, trained=trained)
      sel = round_trip(select(strategy, build, ds.train, splits, **pick))
      if selections is not None:
        selections[sel_key] = sel
    options, hparams = build.split(sel["chosen"])
    alg = build(**options)
    hparams = {**strategy.fixed, **hparams}
    costs = algorithm_cost(alg, ds.train)
    rounds = budget_rounds(budget, costs, amount, strategy.label)
    if budget.kind == "plateau":
      rounds = _plateau(alg, hparams, splits[0], protocol, seed)
    value, extra, curve = _train_and_score(
      experiment, alg, hparams, ds, rounds=rounds, seed=seed, costs=costs, trained=trained
    )
    if not math.isfinite(value):
      raise FloatingPointError(f"the test {protocol.metric.label} is {value}")
    tuning = _tuning_cost(build, sel, splits, sel_rounds)
    row.update(
      chosen=sel["chosen"],
      selection_score=sel["score"],
      configurations=sel["configurations"],
      widened=sel["widened"],
      edges=sel["edges"],
      rounds=rounds,
      at_cap=reached_cap(budget, costs, amount, rounds),
      selection_rounds=sel_rounds,
      spent=costs.spent(rounds).as_dict(),
      per_round=costs.round.as_dict(),
      setup=costs.setup.as_dict(),
      tuning=tuning,
      value=value,
      extra=extra,
      curve=curve,
    )
  except FloatingPointError as e:  # includes NonFiniteError and SelectionFailed
    row.update(failed=True, failure=f"{type(e).__name__}: {e}", value=math.nan, extra={})
  row["seconds"] = time.perf_counter() - t0
  return row, sel, sel_key


def _plateau(alg, hparams, split, protocol, seed) -> int:
  from fedjax_dro.engine.runner import run

  budget, metric = protocol.budget, protocol.metric
  train, held = split
  hist = run(
    alg,
    train,
    rounds=budget.cap,
    seed=seed,
    hparams=hparams or None,
    eval_data=held,
    eval_every=min(budget.every, budget.cap),
  )
  rounds = [int(e["round"]) for e in hist.evaluations]
  values = [float(e["summary"][metric.name][metric.stat]) for e in hist.evaluations]
  return plateau_round(
    rounds,
    values,
    higher=metric.higher_is_better,
    patience=budget.patience,
    min_delta=budget.min_delta,
  )


def _tuning_cost(build, sel, splits, rounds) -> Dict[str, float]:
  """What the selection spent: every evaluated configuration on every split."""
  total = RoundCost()
  for p in sel["points"]:
    options, _ = build.split(p["hparams"])
    alg = build(**options)
    for train_k, _ in splits:
      total = total + algorithm_cost(alg, train_k).spent(rounds)
  return {
    "configurations": sel["configurations"],
    "runs": sel["configurations"] * len(splits),
    **total.as_dict(),
  }
