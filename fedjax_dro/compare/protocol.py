"""The declarations of a comparison: strategies, the reported metric, the budget and the protocol.

Every class validates itself at construction, so a bad declaration fails with one
``ValueError`` / ``TypeError`` naming the field before anything is computed.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from fedjax_dro.core.metrics import HIGHER_IS_BETTER
from fedjax_dro.model_selection import STATS

BUDGET_KINDS = ("rounds", "uploads", "gradients", "plateau")
# the RoundCost field an equal-cost budget spends
BUDGET_FIELD = {"uploads": "upload_floats", "gradients": "gradient_evaluations"}
SELECTIONS = ("kfold", "holdout", "validation", "domains")
FAILURE_POLICIES = ("drop_seed", "score")


# The dataset metrics of split evaluation and their direction (besides core.metrics' own).
SPLIT_HIGHER_IS_BETTER = {
  "macro_f1": True,
  "pearson_r": True,
  "worst_group_pearson_r": True,
  "worst_group_accuracy": True,
  "worst_log_perplexity": False,
  "average_log_perplexity": False,
  "worst_client_accuracy": True,
  "mean_client_accuracy": True,
  "worst_class_accuracy": True,
  "class_average_accuracy": True,
  "worst_client_loss": False,
  "mean_client_loss": False,
}


def higher_is_better(name: str) -> bool:
  """Whether a larger value of the metric ``name`` is better (per client, or of a split)."""
  return HIGHER_IS_BETTER.get(name, SPLIT_HIGHER_IS_BETTER.get(name, True))


def integral(v):
  """A float grid value that is a whole number as an int (a factory option such as a count)."""
  if isinstance(v, float) and v.is_integer():
    return int(v)
  return v


def _positive_int(name: str, value, low: int = 1) -> int:
  if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
    raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
  return int(value)


def _number(name: str, value, *, positive: bool = False) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
    raise ValueError(f"{name} must be a finite number, got {value!r}")
  if positive and value <= 0:
    raise ValueError(f"{name} must be > 0, got {value!r}")
  return float(value)


def _name(what: str, value) -> str:
  """A declaration's name: a non-empty string (a ``TypeError`` naming ``what`` otherwise)."""
  if not isinstance(value, str) or not value:
    raise TypeError(f"{what} must be a non-empty string, got {value!r}")
  return value


def _callable(what: str, value, form: str) -> None:
  """A declaration's function ``what``, called as ``form`` (a ``TypeError`` otherwise)."""
  if not callable(value):
    raise TypeError(f"{what} must be a callable {form}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Metric:
  """The per-client test metric the table reports, and that selection scores on held-out rows.

  Attributes:
    name: a metric the model reports per client (``accuracy``, ``loss``, ``mse``, ``r2``, ...);
      with ``stat="split"``, a metric of a whole held-out split (``selection="domains"``:
      ``accuracy``, ``macro_f1``, ``worst_group_accuracy``, ``worst_group_pearson_r``,
      ``worst_log_perplexity``, ..., :func:`fedjax_dro.core.split_eval.evaluate_split`).
    stat: its summary over clients (``mean``, ``weighted_mean``, ``worst20``, ...), or
      ``"split"``.
  """

  name: str = "loss"
  stat: str = "weighted_mean"

  def __post_init__(self):
    _name("metric name", self.name)
    if self.stat not in STATS + ("split",):
      raise ValueError(f"metric stat must be one of {STATS + ('split',)}, got {self.stat!r}")

  @property
  def higher_is_better(self) -> bool:
    return higher_is_better(self.name)

  @property
  def label(self) -> str:
    return f"{self.name} ({self.stat})"


@dataclasses.dataclass(frozen=True)
class ExtraMetric:
  """A further column computed from the trained models (not used for selection): an oracle
  such as the estimation error against true parameters.

  Attributes:
    name: the column name.
    fn: ``fn(models, dataset) -> float`` with ``models`` the stacked per-client models
      (``[n, ...]``, global models broadcast).
    higher_is_better: the direction of paired wins.
  """

  name: str
  fn: Callable[[Any, Any], float]
  higher_is_better: bool = False

  def __post_init__(self):
    _name("extra metric name", self.name)
    _callable(f"extra metric {self.name!r}: fn", self.fn, "fn(models, dataset) -> float")


@dataclasses.dataclass(frozen=True)
class Budget:
  """What every strategy is given.

  * ``Budget("rounds", rounds=R)``: ``R`` rounds each.
  * ``Budget("uploads", amount=B)`` / ``Budget("gradients", amount=B)``: each strategy gets the
    most rounds whose uploaded floats / client gradient evaluations (setup included; see
    :mod:`fedjax_dro.core.costs`) stay within ``B``; so every strategy spends ``B`` to within one
    of its rounds. ``match="FedAvg", rounds=R`` instead of ``amount``: ``B`` is what strategy
    ``FedAvg`` spends in ``R`` rounds. ``cap``: at most that many rounds (needed for a strategy
    whose rounds cost nothing of the kind, like Local's uploads).
  * ``Budget("plateau", cap=C, patience=p, every=e, min_delta=d)``: trained to a validation
    plateau: the chosen configuration is run on the selection's (first) training split with its
    held-out rows evaluated every ``e`` rounds; the run stops at the first evaluation after which
    the held-out metric has not improved by more than ``d`` (relative) for ``p`` evaluations, or
    at ``C``; the final model is then trained on all training rows for that many rounds.
  """

  kind: str = "rounds"
  rounds: Optional[int] = None
  amount: Optional[float] = None
  match: Optional[str] = None
  cap: Optional[int] = None
  patience: int = 3
  every: int = 10
  min_delta: float = 1e-3

  def __post_init__(self):
    if self.kind not in BUDGET_KINDS:
      raise ValueError(f"budget kind must be one of {BUDGET_KINDS}, got {self.kind!r}")
    if self.rounds is not None:
      _positive_int("budget rounds", self.rounds)
    if self.cap is not None:
      _positive_int("budget cap", self.cap)
    _positive_int("budget patience", self.patience)
    _positive_int("budget every", self.every)
    if _number("budget min_delta", self.min_delta) < 0:
      raise ValueError(f"budget min_delta must be >= 0, got {self.min_delta!r}")
    if self.kind == "rounds":
      if self.rounds is None:
        raise ValueError("a 'rounds' budget needs rounds=R")
      if self.amount is not None or self.match is not None:
        raise ValueError("a 'rounds' budget takes rounds only (no amount or match)")
    elif self.kind == "plateau":
      if self.cap is None:
        raise ValueError("a 'plateau' budget needs cap=C (the most rounds)")
      if self.amount is not None or self.match is not None:
        raise ValueError("a 'plateau' budget takes cap, patience, every, min_delta")
    else:
      if (self.amount is None) == (self.match is None):
        raise ValueError(
          f"a {self.kind!r} budget needs exactly one of amount=B and match='STRATEGY' "
          f"(with rounds=R), got amount={self.amount!r}, match={self.match!r}"
        )
      if self.amount is not None:
        _number("budget amount", self.amount, positive=True)
      if self.match is not None and self.rounds is None:
        raise ValueError(f"budget match={self.match!r} needs rounds=R (what it spends in R rounds)")

  @property
  def field(self) -> Optional[str]:
    """The :class:`~fedjax_dro.core.costs.RoundCost` field an equal-cost budget spends."""
    return BUDGET_FIELD.get(self.kind)

  def describe(self) -> str:
    if self.kind == "rounds":
      return f"{self.rounds} rounds each"
    if self.kind == "plateau":
      return (
        f"to a validation plateau (held-out metric evaluated every {self.every} rounds, stop "
        f"after {self.patience} evaluations without a relative gain > {self.min_delta:g}; "
        f"at most {self.cap} rounds)"
      )
    what = "uploaded floats" if self.kind == "uploads" else "client gradient evaluations"
    amount = (
      f"{self.amount:.6g}"
      if self.amount is not None
      else f"what {self.match} spends in {self.rounds} rounds"
    )
    cap = f", at most {self.cap} rounds" if self.cap else ""
    return f"equal {what} ({amount}{cap})"


GridSpec = Union[Dict[str, Sequence[Any]], List[Dict[str, Sequence[Any]]]]


@dataclasses.dataclass
class Strategy:
  """One row of the table.

  Attributes:
    label: the row's name.
    make: ``make(model, **options) -> Algorithm`` (options: the grid keys that are factory
      settings, like IFCA's ``num_clusters``; everything else the strategy fixes is closed over).
    grid: ``{name: [values]}`` searched as a product (hyper-parameters vmapped in one program
      per fold, options looped); or a list of such grids, searched one after another with the
      best over all kept (a parameter whose admissible partner values change, like pFedMe's
      inner step with ``lam``). ``{}``: nothing to choose.
    fixed: hyper-parameters every run of this strategy uses.
    widen: grid axes widened geometrically while the choice sits on their edge; default: every
      hyper-parameter axis with at least two positive values (factory options are never widened;
      an axis split across sub-grids, one value in each, is not widened, but its edge over the
      union of its values is reported).
    note: why this strategy's grid has a different number of configurations than the others
      (required when it does and the protocol asks for equal grids).
    paper: ``False`` for a baseline the paper did not run (marked in the table).
  """

  label: str
  make: Callable[..., Any]
  grid: GridSpec = dataclasses.field(default_factory=dict)
  fixed: Dict[str, float] = dataclasses.field(default_factory=dict)
  widen: Optional[Sequence[str]] = None
  note: str = ""
  paper: bool = True

  def __post_init__(self):
    _name("strategy label", self.label)
    _callable(f"strategy {self.label!r}: make", self.make, "make(model, **options)")
    grids = self.grid if isinstance(self.grid, list) else [self.grid]
    for g in grids:
      if not isinstance(g, dict):
        raise TypeError(
          f"strategy {self.label!r}: grid must be a dict name -> values or a list of them, "
          f"got {type(g).__name__}"
        )
      for name, values in g.items():
        if not isinstance(values, (list, tuple)) or not values:
          raise ValueError(
            f"strategy {self.label!r}: grid[{name!r}] must be a non-empty list, got {values!r}"
          )
    if not isinstance(self.fixed, dict):
      raise TypeError(f"strategy {self.label!r}: fixed must be a dict of hyper-parameters")
    if self.widen is not None:
      names = {k for g in grids for k in g}
      unknown = sorted(set(self.widen) - names)
      if unknown:
        raise ValueError(
          f"strategy {self.label!r}: widen names {unknown}, which are not grid axes {sorted(names)}"
        )

  @property
  def grids(self) -> List[Dict[str, List[Any]]]:
    grids = self.grid if isinstance(self.grid, list) else [self.grid]
    return [{k: list(v) for k, v in g.items()} for g in grids]

  @property
  def num_configurations(self) -> int:
    return sum(math.prod(len(v) for v in g.values()) for g in self.grids)


@dataclasses.dataclass(frozen=True)
class Protocol:
  """How the strategies are compared.

  Attributes:
    seeds: the seeds; seed ``s`` draws the data (``data(s)``), the selection split and every run.
    metric: the reported :class:`Metric` (on the test rows), also the selection score (on
      held-out training rows).
    budget: the :class:`Budget`.
    selection: ``"kfold"`` (``folds``-fold split of every client's training rows),
      ``"holdout"`` (``holdout`` of every client's training rows held out), within each seed, or
      ``"validation"`` (trained on all training rows, scored on the data's own validation split,
      :attr:`FederatedDataset.validation <fedjax_dro.data.FederatedDataset>`), or ``"domains"``
      (trained on all training clients, the global model scored on a validation split of other
      clients and reported on a test split of others: WILDS' out-of-distribution protocol,
      :mod:`fedjax_dro.compare.domains`; the metric's ``stat`` is ``"split"``).
    folds: K of ``"kfold"``.
    holdout: the held-out share of ``"holdout"``.
    selection_rounds: rounds of every selection run (default: the budget's rounds of the
      strategy; the cap for ``"plateau"``).
    max_widenings: the most values added to each widened axis of each of a strategy's
      (sub-)grids per seed (:func:`fedjax_dro.model_selection.widen_at_edges`: every axis on
      an edge is widened, each up to this limit); 0: plain grids.
    equal_grids: every strategy's grid has as many configurations as the others, unless its
      ``note`` says why not.
    on_failure: ``"drop_seed"`` (a seed where any strategy failed is left out of every row's
      mean and of every paired difference; failures are counted per row) or ``"score"`` (a
      failed run scores ``failure_score`` in every row).
    failure_score: the score of a failed run under ``"score"``.
    reference: the strategy every paired difference is taken against (default: the first).
    curve_every: rounds between the test evaluations of the final runs (the curves of the
      plots); default: a tenth of the run.
  """

  seeds: Tuple[int, ...] = (0, 1, 2)
  metric: Metric = Metric()
  budget: Budget = Budget("rounds", rounds=100)
  selection: str = "kfold"
  folds: int = 3
  holdout: float = 0.2
  selection_rounds: Optional[int] = None
  max_widenings: int = 3
  equal_grids: bool = True
  on_failure: str = "drop_seed"
  failure_score: Optional[float] = None
  reference: Optional[str] = None
  curve_every: Optional[int] = None

  def __post_init__(self):
    seeds = self.seeds
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, (list, tuple, range)) or not seeds:
      raise ValueError(f"seeds must be a non-empty list of non-negative integers, got {seeds!r}")
    for s in seeds:
      _positive_int("each seed", s, low=0)
    if len(set(seeds)) != len(seeds):
      raise ValueError(f"seeds must be distinct, got {list(seeds)}")
    object.__setattr__(self, "seeds", tuple(int(s) for s in seeds))
    if not isinstance(self.metric, Metric):
      raise TypeError(f"metric must be a Metric, got {type(self.metric).__name__}")
    if not isinstance(self.budget, Budget):
      raise TypeError(f"budget must be a Budget, got {type(self.budget).__name__}")
    if self.selection not in SELECTIONS:
      raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
    _positive_int("folds", self.folds, low=2)
    if not 0 < _number("holdout", self.holdout) < 1:
      raise ValueError(f"holdout must be in (0, 1), got {self.holdout!r}")
    if self.selection_rounds is not None:
      _positive_int("selection_rounds", self.selection_rounds)
    _positive_int("max_widenings", self.max_widenings, low=0)
    if self.on_failure not in FAILURE_POLICIES:
      raise ValueError(f"on_failure must be one of {FAILURE_POLICIES}, got {self.on_failure!r}")
    if self.on_failure == "score":
      if self.failure_score is None:
        raise ValueError("on_failure='score' needs failure_score (the score of a failed run)")
      _number("failure_score", self.failure_score)
    if self.curve_every is not None:
      _positive_int("curve_every", self.curve_every)
    if (self.selection == "domains") != (self.metric.stat == "split"):
      raise ValueError(
        "selection='domains' and Metric(stat='split') go together (a held-out split's metric), "
        f"got selection={self.selection!r} with stat={self.metric.stat!r}"
      )
    if self.selection == "domains" and self.budget.kind == "plateau":
      raise ValueError("selection='domains' takes a fixed budget, not 'plateau'")

  def describe(self) -> Dict[str, Any]:
    sel = {
      "kfold": f"{self.folds}-fold CV over each client's training rows",
      "holdout": f"a hold-out of {self.holdout:g} of each client's training rows",
      "validation": "each client's validation rows (the data's validation split)",
      "domains": "the global model on the held-out domains of the validation split",
    }[self.selection]
    return {
      "seeds": list(self.seeds),
      "metric": self.metric.label,
      "budget": self.budget.describe(),
      "selection": f"per seed, {sel}, on the held-out {self.metric.label}",
      "selection_rounds": self.selection_rounds,
      "max_widenings": self.max_widenings,
      "on_failure": self.on_failure
      + (f" (a failed run scores {self.failure_score:g})" if self.on_failure == "score" else ""),
      "spread": "mean +- 2 SE over seeds (ddof=1); paired differences against the reference "
      "(paired t-test p and 95% t-interval, one-sided sign test of the wins; p Holm-adjusted "
      "when a table has more than three comparisons)",
    }


@dataclasses.dataclass
class Experiment:
  """A comparison: ``strategies`` on ``data(seed)`` under ``protocol``.

  Attributes:
    name: file stem of the outputs.
    data: ``data(seed) -> FederatedDataset`` (the test split is only ever used for the table).
    model: a :class:`~fedjax_dro.models.Model`, or ``model(dataset) -> Model`` (called once, on
      the first seed's data: every seed's runs reuse the same compiled programs).
    strategies: the rows, in table order.
    protocol: the :class:`Protocol`.
    extra_metrics: further columns (:class:`ExtraMetric`).
    description: one paragraph printed above the table.
  """

  name: str
  data: Callable[[int], Any]
  model: Any
  strategies: Sequence[Strategy]
  protocol: Protocol = Protocol()
  extra_metrics: Sequence[ExtraMetric] = ()
  description: str = ""

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name or "/" in self.name:
      raise ValueError(f"name must be a non-empty file stem, got {self.name!r}")
    _callable("data", self.data, "data(seed) -> FederatedDataset")
    if not isinstance(self.protocol, Protocol):
      raise TypeError(f"protocol must be a Protocol, got {type(self.protocol).__name__}")
    strategies = list(self.strategies)
    if not strategies or not all(isinstance(s, Strategy) for s in strategies):
      raise TypeError("strategies must be a non-empty list of Strategy")
    labels = [s.label for s in strategies]
    if len(set(labels)) != len(labels):
      raise ValueError(f"strategy labels must be distinct, got {labels}")
    ref = self.protocol.reference
    if ref is not None and ref not in labels:
      raise ValueError(f"protocol reference {ref!r} is not a strategy; strategies: {labels}")
    match = self.protocol.budget.match
    if match is not None and match not in labels:
      raise ValueError(f"budget match {match!r} is not a strategy; strategies: {labels}")
    for e in self.extra_metrics:
      if not isinstance(e, ExtraMetric):
        raise TypeError(f"extra_metrics must hold ExtraMetric, got {type(e).__name__}")
    if self.protocol.equal_grids:
      counts = {s.label: s.num_configurations for s in strategies}
      most = max(counts.values())
      unequal = [k for k, s in zip(counts, strategies) if counts[k] != most and not s.note]
      if unequal:
        raise ValueError(
          f"equal_grids: the grids have {counts} configurations; strategies {unequal} have "
          f"fewer than {most} and no note saying why (Strategy(note=...), or "
          "Protocol(equal_grids=False))"
        )
    self.strategies = strategies

  @property
  def reference(self) -> str:
    return self.protocol.reference or self.strategies[0].label
