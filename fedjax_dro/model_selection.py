"""K-fold cross-validation over the clients' training rows.

Every client's valid training rows are split into ``folds`` parts (a per-client random permutation,
then ``numpy.array_split``: part sizes differ by at most one). For fold ``k`` every client trains on
its other ``folds - 1`` parts and is evaluated on part ``k``; the test split of a
:class:`~fedjax_dro.data.FederatedDataset` is never touched. Within a fold the whole hyper-parameter
grid is one vmapped program (:func:`fedjax_dro.sweep`); grid entries that are factory
*options* (``make_alg`` a callable) are looped over, rebuilding the algorithm.

The score of a grid point on a fold is ``summary[metric][stat]`` of the held-out per-client metrics
(default: the example-weighted mean held-out ``loss``, i.e. the pooled held-out loss); the table
reports its mean and standard error (``std(ddof=1) / sqrt(folds)``) over folds, and the best point
maximizes (``accuracy``, ``r2``) or minimizes (``loss``, ``mse``, ...) the mean
(:data:`fedjax_dro.core.metrics.HIGHER_IS_BETTER`); ties go to the first point in grid order, and a
point that diverged on any fold scores NaN and is never picked.

    from fedjax_dro.model_selection import cross_validate
    cv = cross_validate(alg, dataset, grid={"t": [0.01, 0.1, 1.0]}, folds=5, rounds=200)
    print(cv.to_markdown()); best = cv.best        # {"t": ...}
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from fedjax_dro.algorithms.base import Algorithm
from fedjax_dro.common.checks import is_int, is_real
from fedjax_dro.core.metrics import HIGHER_IS_BETTER
from fedjax_dro.data.federated import (
  FederatedData,
  FederatedDataset,
  from_client_arrays,
  validate_data,
)

STATS = ("weighted_mean", "mean", "worst20", "best20", "worst", "q10", "q25", "q50", "q75", "q90")


def kfold_split(
  data: FederatedData, folds: int, *, seed: int = 0
) -> List[Tuple[FederatedData, FederatedData]]:
  """``[(train_k, heldout_k)]`` for ``k < folds``: a per-client K-fold split of the valid rows.

  Client ``i``'s rows are permuted with ``numpy.random.default_rng(seed)`` and cut into ``folds``
  nearly equal parts (``numpy.array_split``); rows keep their original order inside each split.
  Every ``train_k`` is padded to ``data.max_examples`` and every ``heldout_k`` to the largest part,
  so all folds have the same shapes. Needs ``2 <= folds <= min_i N_i``.
  """
  if not isinstance(data, FederatedData):
    raise TypeError(f"data must be a FederatedData, got {type(data).__name__}")
  validate_data(data)
  nex = np.asarray(data.num_examples)
  _check_folds(folds, nex)
  rng = np.random.default_rng(seed)
  x, y = np.asarray(data.x), np.asarray(data.y)
  parts = [np.array_split(rng.permutation(int(m)), folds) for m in nex]
  held_max = max(len(p) for client in parts for p in client)
  out = []
  for k in range(folds):
    tr_x, tr_y, ho_x, ho_y = [], [], [], []
    for i, client in enumerate(parts):
      held = np.sort(client[k])
      train = np.sort(np.concatenate([client[j] for j in range(folds) if j != k]))
      tr_x.append(x[i, train])
      tr_y.append(y[i, train])
      ho_x.append(x[i, held])
      ho_y.append(y[i, held])
    train_k = from_client_arrays(tr_x, tr_y, dtype=x.dtype).pad_to(data.max_examples)
    held_k = from_client_arrays(ho_x, ho_y, dtype=x.dtype).pad_to(held_max)
    out.append((train_k, held_k))
  return out


def holdout_split(
  data: FederatedData, fraction: float = 0.2, *, seed: int = 0
) -> List[Tuple[FederatedData, FederatedData]]:
  """``[(train, heldout)]``: one per-client split of the valid rows, ``heldout`` holding
  ``max(1, round(fraction * N_i))`` of client ``i``'s rows (a ``numpy.random.default_rng(seed)``
  permutation; rows keep their order), ``train`` the rest. Shapes as :func:`kfold_split`. Needs
  every client to keep at least one training row.
  """
  if not isinstance(data, FederatedData):
    raise TypeError(f"data must be a FederatedData, got {type(data).__name__}")
  if not is_real(fraction) or not 0 < fraction < 1:
    raise ValueError(f"fraction must be a number in (0, 1), got {fraction!r}")
  validate_data(data)
  nex = np.asarray(data.num_examples)
  if int(nex.min()) < 2:
    i = int(np.argmin(nex))
    raise ValueError(
      f"a hold-out split needs >= 2 training rows per client; client {i} has {int(nex[i])}"
    )
  rng = np.random.default_rng(seed)
  x, y = np.asarray(data.x), np.asarray(data.y)
  tr_x, tr_y, ho_x, ho_y = [], [], [], []
  for i, m in enumerate(nex):
    perm = rng.permutation(int(m))
    k = min(int(m) - 1, max(1, int(round(fraction * int(m)))))
    held, train = np.sort(perm[:k]), np.sort(perm[k:])
    tr_x.append(x[i, train])
    tr_y.append(y[i, train])
    ho_x.append(x[i, held])
    ho_y.append(y[i, held])
  train_k = from_client_arrays(tr_x, tr_y, dtype=x.dtype).pad_to(data.max_examples)
  held_k = from_client_arrays(ho_x, ho_y, dtype=x.dtype)
  return [(train_k, held_k)]


def _check_folds(folds, nex) -> None:
  if not isinstance(folds, (int, np.integer)) or isinstance(folds, bool):
    raise TypeError(f"folds must be an int >= 2, got {folds!r}")
  if folds < 2:
    raise ValueError(f"folds must be >= 2, got {folds}")
  smallest = int(np.min(nex))
  if folds > smallest:
    i = int(np.argmin(nex))
    raise ValueError(
      f"folds={folds} exceeds the smallest client's number of training examples "
      f"(client {i} has {smallest}); every client needs >= 1 row per fold"
    )


@dataclasses.dataclass
class CVResult:
  """Cross-validation results.

  Attributes:
    points: the grid points (dicts name -> value), in grid order.
    scores: ``[num_points, folds]`` score of every point on every fold (NaN: diverged).
    mean, se: ``[num_points]`` mean and standard error over folds.
    best: the best point; ``best_index`` its row; ``best_score`` its mean score.
    metric, stat: what was scored; ``higher_is_better`` its direction.
  """

  points: List[Dict[str, Any]]
  scores: np.ndarray
  mean: np.ndarray
  se: np.ndarray
  best: Dict[str, Any]
  best_index: int
  best_score: float
  metric: str
  stat: str
  higher_is_better: bool
  folds: int
  rounds: int

  def table(self) -> List[Dict[str, Any]]:
    """One row per grid point: its values, ``mean``, ``se``, per-fold ``scores``, ``best``."""
    return [
      {
        **p,
        "mean": float(m),
        "se": float(s),
        "scores": [float(v) for v in sc],
        "best": i == self.best_index,
      }
      for i, (p, m, s, sc) in enumerate(zip(self.points, self.mean, self.se, self.scores))
    ]

  def to_markdown(self) -> str:
    names = list(self.points[0]) if self.points and self.points[0] else []
    header = names + [f"{self.metric} ({self.stat}) mean", "se", ""]
    rows = [
      [_fmt(p[k]) for k in names] + [f"{m:.6g}", f"{s:.3g}", "best" if i == self.best_index else ""]
      for i, (p, m, s) in enumerate(zip(self.points, self.mean, self.se))
    ]
    widths = [max(len(str(r[c])) for r in [header] + rows) for c in range(len(header))]
    line = lambda r: "| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |"
    return "\n".join(
      [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows]
    )

  def to_json(self) -> Dict[str, Any]:
    return {
      "metric": self.metric,
      "stat": self.stat,
      "folds": self.folds,
      "rounds": self.rounds,
      "higher_is_better": self.higher_is_better,
      "best": self.best,
      "best_score": self.best_score,
      "table": self.table(),
    }


def _fmt(v):
  return f"{v:g}" if isinstance(v, float) else str(v)


def _resolve(make_alg, grid):
  """(base algorithm, option names, hparam names, factory) with validation of the grid keys."""
  if isinstance(make_alg, Algorithm):
    factory, base, accepted = None, make_alg, set()
  elif callable(make_alg):
    factory = make_alg
    base = make_alg()
    if not isinstance(base, Algorithm):
      raise TypeError(f"make_alg() must return an Algorithm, got {type(base).__name__}")
    try:
      params = inspect.signature(make_alg).parameters
      accepted = {
        k for k, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
      }
    except (TypeError, ValueError):
      accepted = set()
  else:
    raise TypeError(
      f"make_alg must be an Algorithm or a callable returning one, got {type(make_alg).__name__}"
    )
  if not isinstance(grid, dict):
    raise TypeError(f"grid must be a dict name -> list of values, got {type(grid).__name__}")
  hp_names, opt_names = [], []
  for name, values in grid.items():
    values = list(values) if isinstance(values, (list, tuple, np.ndarray)) else None
    if values is None:
      raise TypeError(f"grid[{name!r}] must be a list of values")
    if len(values) == 0:
      raise ValueError(f"grid[{name!r}] is empty")
    if len({normalized_value(v) for v in values}) != len(values):
      raise ValueError(f"grid[{name!r}] has duplicate values: {values}")
    if name in base.hparams:
      hp_names.append(name)
    elif name in accepted:
      opt_names.append(name)
    else:
      opts = (
        f" or factory options {sorted(accepted)}"
        if accepted
        else " (pass a callable make_alg(**options) to search over factory options)"
      )
      raise ValueError(
        f"grid has unknown hyper-parameter {name!r} for algorithm {base.name!r}; "
        f"expected one of its hyper-parameters {sorted(base.hparams)}{opts}"
      )
  return base, factory, hp_names, opt_names


def cross_validate(
  make_alg: Union[Algorithm, Callable[..., Algorithm]],
  data: Union[FederatedDataset, FederatedData],
  grid: Dict[str, Sequence[Any]],
  *,
  folds: int = 5,
  rounds: int,
  seed: int = 0,
  metric: str = "loss",
  stat: str = "weighted_mean",
  hparams: Optional[Dict[str, Any]] = None,
  eval_every: Optional[int] = None,
  splits: Optional[Sequence[Tuple[FederatedData, FederatedData]]] = None,
) -> CVResult:
  """K-fold cross-validation of ``grid`` on the clients' training rows (see the module docstring).

  Args:
    make_alg: an :class:`Algorithm`, or a callable ``make_alg(**options) -> Algorithm`` (then grid
      keys that are not hyper-parameters may be keyword arguments of ``make_alg``).
    data: a :class:`FederatedDataset` (only ``train`` is used) or training :class:`FederatedData`.
    grid: ``{name: [values]}``; the Cartesian product is searched. Hyper-parameters are vmapped in
      one program per fold; options are looped over.
    folds: ``K`` in ``[2, min_i N_i]``.
    rounds: rounds of every training run.
    seed: seed of the fold split and of every run (model init, sampling).
    metric: per-client held-out metric (``loss``, ``mse``, ``r2``, ``accuracy``, ...).
    stat: summary over clients (``weighted_mean`` by held-out rows, ``mean``, ``worst20``, ...).
    hparams: fixed hyper-parameter overrides for every run.
    eval_every: rounds per compiled chunk (passed to ``sweep``).
    splits: precomputed ``(train, held-out)`` pairs of ``data``'s training rows (e.g.
      :func:`holdout_split`) used instead of the ``folds``-fold split (``folds`` is then their
      number; one split gives a standard error of NaN).
  """
  train = data.train if isinstance(data, FederatedDataset) else data
  if not isinstance(train, FederatedData):
    raise TypeError(f"data must be a FederatedDataset or FederatedData, got {type(data).__name__}")
  base, factory, hp_names, opt_names = _resolve(make_alg, grid)
  if stat not in STATS:
    raise ValueError(f"stat must be one of {STATS}, got {stat!r}")
  if not isinstance(metric, str):
    raise TypeError(f"metric must be a metric name (str), got {metric!r}")
  unknown = sorted(set(hparams or {}) - set(base.hparams))
  if unknown:
    raise ValueError(
      f"hparams has unknown hyper-parameter(s) {unknown} for {base.name!r}; "
      f"expected a subset of {sorted(base.hparams)}"
    )
  if splits is None:
    splits = kfold_split(train, folds, seed=seed)  # validates folds
  else:
    splits = list(splits)
    if not splits or not all(isinstance(p, tuple) and len(p) == 2 for p in splits):
      raise TypeError("splits must be a non-empty list of (train, held-out) FederatedData pairs")
    folds = len(splits)
  higher = HIGHER_IS_BETTER.get(metric, True)
  hp_names_sorted = sorted(hp_names)
  opt_combos = list(itertools.product(*[list(grid[k]) for k in opt_names])) or [()]
  # grid order: the product over the grid keys in the order they were given
  names = list(grid)
  points = [
    dict(zip(names, combo)) for combo in itertools.product(*[list(grid[k]) for k in names])
  ] or [{}]
  index = {_key(p, names): i for i, p in enumerate(points)}
  scores = np.full((len(points), folds), np.nan)
  from fedjax_dro.engine.sweeps import sweep

  for opt_combo in opt_combos:
    options = dict(zip(opt_names, opt_combo))
    alg = factory(**options) if (factory is not None and options) else base
    hp_grid = {k: [float(v) for v in grid[k]] for k in hp_names_sorted}
    for k, (train_k, held_k) in enumerate(splits):
      res = sweep(
        alg,
        train_k,
        rounds=rounds,
        grid=hp_grid,
        seeds=[seed],
        hparams=hparams,
        eval_data=held_k,
        eval_every=eval_every,
      )
      for config, summary, diverged in zip(res.configs, res.final_summary, res.diverged):
        if metric not in summary:
          raise ValueError(
            f"metric {metric!r} is not reported for {alg.name} on this task; "
            f"available: {sorted(summary)}"
          )
        if stat not in summary[metric]:
          raise ValueError(
            f"stat {stat!r} is not available for metric {metric!r}; available: "
            f"{sorted(summary[metric])}"
          )
        point = {**options, **{h: config["hparams"][h] for h in hp_names_sorted}}
        row = index[_key(point, names)]
        scores[row, k] = np.nan if diverged else summary[metric][stat]
  finite = np.all(np.isfinite(scores), axis=1)
  mean = np.where(finite, scores.mean(axis=1), np.nan)
  se = (
    np.where(finite, scores.std(axis=1, ddof=1) / math.sqrt(folds), np.nan)
    if folds > 1
    else np.full(len(points), np.nan)
  )
  if not finite.any():
    raise FloatingPointError(
      "every grid point diverged (non-finite values) on some fold; lower the step sizes"
    )
  signed = np.where(finite, mean if higher else -mean, -np.inf)
  best_index = int(np.argmax(signed))
  return CVResult(
    points,
    scores,
    mean,
    se,
    dict(points[best_index]),
    best_index,
    float(mean[best_index]),
    metric,
    stat,
    higher,
    int(folds),
    int(rounds),
  )


def _key(point, names):
  return tuple(normalized_value(point[k]) for k in names)


def normalized_value(v):
  """A grid value as compared: numbers as floats (so 1 and 1.0 are one value), others as they are."""
  return (
    float(v)
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    else v
  )


def select_hparams(
  alg: Algorithm,
  data,
  grid,
  *,
  folds: int,
  out_dir: Optional[str] = None,
  file=None,
  **options,
) -> Dict[str, Any]:
  """CLI helper: cross-validates ``grid`` (:func:`cross_validate` with ``folds`` and its other
  keyword ``options``: ``rounds``, ``seed``, ``metric``, ``stat``, ``hparams``, ``eval_every``),
  prints the table and the choice, returns the merged hyper-parameters ``{**hparams, **best}``
  (and writes ``cv.json`` to ``out_dir``)."""
  file = file or sys.stdout
  cv = cross_validate(alg, data, grid, folds=folds, **options)
  print(
    f"{cv.folds}-fold cross-validation on the clients' training rows ({cv.rounds} rounds per "
    f"run), {cv.metric} ({cv.stat}):",
    file=file,
  )
  print(cv.to_markdown(), file=file)
  chosen = ", ".join(f"{k}={_fmt(v)}" for k, v in cv.best.items())
  print(
    f"chosen by CV: {chosen} ({cv.metric} {cv.best_score:.6g} +- {cv.se[cv.best_index]:.3g})",
    file=file,
  )
  if out_dir is not None:
    import os

    from fedjax_dro.records.files import atomic_write
    from fedjax_dro.records.history import json_text

    os.makedirs(out_dir, exist_ok=True)
    atomic_write(os.path.join(out_dir, "cv.json"), json_text(cv.to_json(), indent=2))
  return {**(options.get("hparams") or {}), **cv.best}


def grid_edge(values: Sequence[float], value: float) -> Optional[str]:
  """``"low"`` or ``"high"`` when ``value`` is the smallest or largest of the grid ``values``
  (matched to the nearest value on a log scale when every value is positive, so float32 round
  trips still match; on a linear scale otherwise), ``None`` when it is an interior value or the
  grid has fewer than two distinct values."""
  values = sorted({float(v) for v in values})
  if len(values) < 2:
    return None
  at = float(value)
  if values[0] > 0 and at > 0:
    dist = lambda i: abs(math.log(values[i] / at))
  else:
    dist = lambda i: abs(values[i] - at)
  nearest = min(range(len(values)), key=dist)
  return "low" if nearest == 0 else ("high" if nearest == len(values) - 1 else None)


def widen_at_edges(
  evaluate: Callable[[Dict[str, List[float]]], List[Dict[str, Any]]],
  grid: Dict[str, Sequence[float]],
  *,
  axes: Sequence[str],
  key: Callable[[Dict[str, Any]], Any],
  max_widenings: int = 4,
) -> Tuple[List[Dict[str, Any]], Dict[str, List[float]], List[Tuple[str, float]]]:
  """Grid search that widens geometric axes while the best point sits on one of their edges.

  ``evaluate(subgrid)`` runs the product grid ``subgrid`` (a dict of value lists, every axis of
  ``grid``) and returns one result per point, each a dict with ``"hparams"`` (the point's values).
  After the first evaluation of ``grid``, and after every widening step, the best result (the
  largest ``key(result)``) is found; EVERY axis named in ``axes`` on which it takes the smallest
  or largest value, and which has gained fewer than ``max_widenings`` values so far, gains one
  more value beyond that edge, in the ratio of its two outermost values (``[0.1, 0.3, 1.0]`` at
  its high edge gains ``3.33``). The axes of one step are widened one after another (in
  ``axes`` order), each evaluating only its new points: the new value with every current value
  of the other axes (so two axes widened in one step also evaluate their new corner). It stops
  when the best point is interior on every axis of ``axes`` that has not reached its limit: a
  grid chosen too narrow for a problem (a step size grid in units of a loose smoothness bound)
  is corrected by evidence, and a choice still on an edge at the end is visible in the returned
  grid.

  Args:
    evaluate: ``subgrid -> [result]`` as above.
    grid: the initial grid; every axis of ``axes`` has at least two distinct positive values.
    axes: the axes that may be widened (geometric: step sizes, penalty strengths).
    key: the score of a result, larger is better (ties go to the earlier result).
    max_widenings: the most values added to each axis of ``axes`` (0: a plain grid search).

  Returns:
    ``(results, grid, widened)``: every result in evaluation order, the final grid (each axis
    sorted), and the ``(axis, value)`` pairs added, in order.
  """
  if not isinstance(grid, dict) or not grid:
    raise TypeError(f"grid must be a non-empty dict of value lists, got {grid!r}")
  if not is_int(max_widenings) or max_widenings < 0:
    raise ValueError(f"max_widenings must be a non-negative integer, got {max_widenings!r}")
  grid = {k: sorted(float(v) for v in values) for k, values in grid.items()}
  axes = list(dict.fromkeys(axes))
  for name in axes:
    if name not in grid:
      raise ValueError(f"axes names {name!r}, which is not an axis of grid {sorted(grid)}")
    values = grid[name]
    if len(set(values)) < 2 or values[0] <= 0 or not all(map(math.isfinite, values)):
      raise ValueError(
        f"grid[{name!r}] must hold at least two distinct positive finite values to be widened "
        f"geometrically, got {values!r}"
      )
  results = list(evaluate({k: list(v) for k, v in grid.items()}))
  widened: List[Tuple[str, float]] = []
  used = {name: 0 for name in axes}
  while results:
    best = max(results, key=key)  # the first of equal scores
    steps = []
    for name in axes:
      values = grid[name]
      edge = grid_edge(values, best["hparams"][name]) if used[name] < max_widenings else None
      if edge == "high":
        steps.append((name, values[-1] * (values[-1] / values[-2])))
      elif edge == "low":
        steps.append((name, values[0] * (values[0] / values[1])))
    if not steps:
      break
    for name, value in steps:
      subgrid = {k: ([value] if k == name else list(v)) for k, v in grid.items()}
      results += list(evaluate(subgrid))
      grid[name] = sorted(grid[name] + [value])
      used[name] += 1
      widened.append((name, value))
  return results, grid, widened


__all__ = ["cross_validate", "select_hparams", "kfold_split", "holdout_split", "widen_at_edges"]
