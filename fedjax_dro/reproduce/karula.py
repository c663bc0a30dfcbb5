"""Karula (Erickson and Johansson, "Personalized Federated Learning under Model Dissimilarity
Constraints", arXiv:2505.07575), Table 1 as controlled comparisons on :mod:`fedjax_dro.compare`:
the synthetic ridge task (1a) under two readings of its generator, and the four-hospital heart
disease task (1b).

Protocol (the same for every strategy, :func:`protocol`): per seed, every strategy's grid is
scored by K-fold cross-validation (3 folds; the paper's CV has 5, fewer here for a 2-core CPU's
budget) over each client's *training* rows, on
the metric the table reports (the mean over clients of the test R^2 for 1a, of the test accuracy
for 1b), with geometric axes widened while a choice sits on an edge; the chosen configuration is
trained on all training rows under the table's budget (:data:`BUDGETS`): the same number of
rounds as every other strategy, or, for Table 1a's second table, the same client gradient
evaluations as FedAvg spends in those rounds (the table also lists what each one spent: rounds,
uploaded floats, client gradient evaluations, sequential local steps); a failed run is dropped
with its seed from every row; paired differences are taken against FedAvg. Every strategy weights its clients' losses by their sample counts, as the paper
states for all methods; pFedMe is its paper's Algorithm 1 (every client updates its personalized
model every round); Karula's dissimilarities are the paper's (exact OT, Euclidean cost on
features and response, raw data, entrywise l1; :data:`KARULA_OT_OPTIONS`).

Grids (:func:`strategies`): every strategy tunes its step on a geometric grid in units of the
full-gradient step ``lr = 1 / max_i L_i`` (Karula: ``eta`` in units of ``s / (2L)``), and the
personalized ones their personalization parameter on top (pFedMe's and Ditto's ``lam``, IFCA's
number of clusters, Karula's ``t`` in multiples of ``1 / median_{i != j} D_ij``); the units come
from the first seed's training rows. The strategies without a personalization parameter have
fewer configurations, and say so.

Table 1a, two readings of the generator (``synthetic-ridge``: group feature means 0 / 0.2 / 0.4,
noise 3; ``synthetic-ridge-equal-means``: zero means with standard deviations 1 / 1.5 / 0.75,
noise 1). The paper's error column cannot be compared number by number: its FedAvg error
(7.47 +- 0.49) is below the floor of *any* single global model under the paper's own generator.
The true parameters of the three equal groups have means 1, 1.5 and 2 in every one of ``d = 50``
coordinates, so the mean over clients of ``||theta - theta_i^*||^2`` is at least
``d * Var(group means) = 50 * 1/6 = 8.33`` for every common ``theta`` (plus the within-group
spread ``d * 0.1^2 = 0.5``); the paper's errors are on another scale. The table therefore compares
orderings and the Karula - FedAvg gap, not absolute errors. Two rows the paper does not have:
"IFCA (identical start)", IFCA whose cluster models all start from the same model (the paper's
likely setup, as its IFCA row ties FedAvg's: in the first round every client picks cluster 0, so
IFCA starts as FedAvg; a cluster model nobody trained can still attract the clients it fits
better later), next to our IFCA started apart; and Ditto, a baseline the paper did not run.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Dict, List, Optional, Sequence

import jax
import numpy as np

from fedjax_dro import compare as C
from fedjax_dro.core.precision import float64
from fedjax_dro.reproduce.common import paired_difference, run_tables

PAPER_SYNTHETIC = {  # Table 1a: estimation error, +-2SE, test R^2, +-2SE
  "Local": (35.33, 2.729, 0.692, 0.108),
  "FedSGD": (7.60, 0.513, 0.839, 0.024),
  "FedAvg": (7.47, 0.493, 0.846, 0.026),
  "pFedMe": (31.65, 0.986, 0.768, 0.044),
  "IFCA": (7.69, 0.509, 0.821, 0.024),
  "Karula": (5.86, 0.204, 0.938, 0.009),
}
PAPER_HEART = {  # Table 1b: test accuracy (IFCA not reported)
  "Local": 0.658,
  "FedSGD": 0.685,
  "FedAvg": 0.669,
  "pFedMe": 0.658,
  "Karula": 0.705,
}
HOSPITALS = ("cleveland", "hungarian", "switzerland", "va")
READINGS = {
  "feature_means": "synthetic-ridge",
  "equal_means": "synthetic-ridge-equal-means",
}
# the smallest mean squared distance of one global model to the clients' true parameters under
# the paper's generator: d Var(group means 1, 1.5, 2) + d param_std^2 (module docstring)
GLOBAL_ERROR_FLOOR = 50 * (1.0 / 6.0) + 50 * 0.1**2
# Karula's dissimilarities in the reproductions: the paper's (Euclidean ground cost on features
# and response, exact OT, entry-wise l1 norm of the embedding difference, no standardization)
KARULA_OT_OPTIONS = {"preset": "paper"}
# Karula's t as multiples c of 1 / median(D): t D_ij at the median pair is c (squared parameter
# distances: 1 within a synthetic group to 50 between the outer groups; less on heart disease)
T_MULTIPLES = (0.3, 3.0, 30.0)
T_MULTIPLES_HEART = (0.01, 0.1, 1.0)
STEP_MULTIPLES = (0.3, 1.0)  # every step grid, in units of the strategy's step unit
IFCA_CLUSTERS = (1, 2, 3, 4, 6, 8, 10)
LAMS = (0.01, 1.0, 100.0)
# the budgets of Table 1a's tables: equal rounds, and equal client gradient evaluations: what FedAvg
# (10 local steps) spends in the table's rounds, capped at GRADIENTS_CAP times those rounds (FedAvg's
# spend pays for 10 x its rounds of one gradient per participant: FedSGD, Local, Karula; none is
# stopped by the cap)
BUDGETS = ("rounds", "gradients")
GRADIENTS_CAP = 10
DEFAULTS = dict(rounds=600, selection_rounds=100, folds=3, num_seeds=5)
# quick: 20 rounds, so that FedAvg's gradients at equal gradients pay for a round of pFedMe
QUICK = dict(rounds=20, selection_rounds=5, folds=2, num_seeds=2)


def _one_step_unit(data, loss_scale: float, l2: float) -> float:
  """``1 / max_i L_i``: ``L_i = loss_scale * lambda_max(X_i^T X_i / N_i) + l2`` (``loss_scale``
  1 for the squared loss, 1/4 for the logistic loss)."""
  x, nex = np.asarray(data.x), np.asarray(data.num_examples)
  top = max(
    float(np.linalg.eigvalsh(x[i, : nex[i]].T @ x[i, : nex[i]] / nex[i]).max())
    for i in range(len(nex))
  )
  return 1.0 / (loss_scale * top + l2)


def _median_dissimilarity(train) -> float:
  from fedjax_dro.ot import dissimilarity_matrix

  D = np.asarray(dissimilarity_matrix(train.x, train.y, train.mask, **KARULA_OT_OPTIONS))
  return float(np.median(D[~np.eye(len(D), dtype=bool)]))


def strategies(
  *, n: int, s: Optional[int], lr: float, eta: float, d_median: float, t_multiples, quick=False
) -> List[C.Strategy]:
  """Table 1's rows on the harness (see the module docstring).

  Args:
    n: clients.
    s: clients per round (``None``: all).
    lr: the full-gradient step unit ``1 / max_i L_i``.
    eta: Karula's step unit ``s / (2L)``.
    d_median: the median off-diagonal dissimilarity (the unit of ``t``).
    t_multiples: Karula's ``t`` grid in multiples of ``1 / d_median``.
    quick: one value per axis (a smoke run).
  """
  from fedjax_dro import algorithms as A

  few = (lambda v: list(v)[:1]) if quick else list
  steps = lambda unit: few([m * unit for m in STEP_MULTIPLES])  # noqa: E731
  w = dict(weighting="num_examples")
  no_param = "no personalization parameter: its step grid only"
  clusters = few([k for k in IFCA_CLUSTERS if k <= n])

  def ifca(init_scale):
    return lambda m, num_clusters=2: A.ifca(
      m, num_clusters=num_clusters, clients_per_round=s, local_steps=10, init_scale=init_scale, **w
    )

  ifca_note = f"number of clusters {clusters} as in the paper, times the step grid"
  return [
    C.Strategy(
      "Local", lambda m: A.local(m, clients_per_round=s), {"client_lr": steps(lr)}, note=no_param
    ),
    C.Strategy(
      "FedSGD", lambda m: A.fedsgd(m, clients_per_round=s, **w), {"lr": steps(lr)}, note=no_param
    ),
    C.Strategy(
      "FedAvg",
      lambda m: A.fedavg(m, clients_per_round=s, local_steps=10, **w),
      {"client_lr": steps(0.3 * lr)},
      fixed={"server_lr": 1.0},
      note=no_param,
    ),
    C.Strategy(
      "pFedMe",
      lambda m: A.pfedme(
        m, clients_per_round=s, local_steps=10, batch_size=None, personal_updates="all", **w
      ),
      # the inner problem is L + lam smooth: the inner step scales with 1 / (L + lam)
      [
        {"lam": [lam], "personal_lr": [lr / (1 + lam * lr)], "client_lr": steps(0.3 * lr)}
        for lam in few(LAMS)
      ],
      fixed={"beta": 1.0},
      note="lam times the step grid (the inner step 1 / (L + lam) follows lam)",
    ),
    C.Strategy(
      "IFCA", ifca(0.1), {"num_clusters": clusters, "client_lr": steps(0.3 * lr)}, note=ifca_note
    ),
    C.Strategy(
      "IFCA (identical start)",
      ifca(0.0),
      {"num_clusters": clusters, "client_lr": steps(0.3 * lr)},
      note=ifca_note + "; every cluster model starts from the same model (diagnostic)",
      paper=False,
    ),
    C.Strategy(
      "Ditto",
      lambda m: A.ditto(m, clients_per_round=s, local_steps=10, **w),
      [
        {"lam": [lam], "client_lr": steps(0.3 * lr), "personal_lr": [0.3 * lr / (1 + lam * lr)]}
        for lam in few(LAMS)
      ],
      note="lam times the step grid (the personal step follows lam)",
      paper=False,
    ),
    C.Strategy(
      "Karula",
      lambda m: A.karula(
        m, clients_per_round=s, projection_tol=1e-6, ot_options=KARULA_OT_OPTIONS, **w
      ),
      {"t": few([c / d_median for c in t_multiples]), "eta": steps(eta)},
      note="t times the step grid",
    ),
  ]


def protocol(*, seeds, rounds, selection_rounds, folds, metric, budget="rounds") -> C.Protocol:
  """Table 1's protocol: per-seed K-fold selection on ``metric``, FedAvg the reference, a failed
  run dropped with its seed from every row; ``budget`` (:data:`BUDGETS`): ``rounds`` each, or
  the client gradient evaluations FedAvg spends in ``rounds`` rounds (at most
  :data:`GRADIENTS_CAP` ``* rounds`` rounds)."""
  if budget not in BUDGETS:
    raise ValueError(f"budget must be one of {BUDGETS}, got {budget!r}")
  return C.Protocol(
    seeds=tuple(seeds),
    metric=metric,
    budget=C.Budget("rounds", rounds=rounds)
    if budget == "rounds"
    else C.Budget("gradients", match="FedAvg", rounds=rounds, cap=GRADIENTS_CAP * rounds),
    selection="kfold",
    folds=folds,
    selection_rounds=selection_rounds,
    max_widenings=1,
    reference="FedAvg",
  )


def _settings(quick, rounds, selection_rounds, folds, num_seeds, seed):
  q = QUICK if quick else DEFAULTS
  values = {
    "rounds": q["rounds"] if rounds is None else rounds,
    "selection_rounds": q["selection_rounds"] if selection_rounds is None else selection_rounds,
    "folds": q["folds"] if folds is None else folds,
    "num_seeds": q["num_seeds"] if num_seeds is None else num_seeds,
  }
  for name, value in {**values, "seed": seed}.items():
    low = {"folds": 2, "seed": 0}.get(name, 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
      raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
  values["seeds"] = list(range(seed, seed + values.pop("num_seeds")))
  return values


def ridge_experiment(reading: str, **settings) -> C.Experiment:
  """Table 1a under one reading of the generator (:data:`READINGS`) as an
  :class:`~fedjax_dro.compare.Experiment` named ``karula_synthetic_<reading>`` (equal rounds) or
  ``karula_synthetic_gradients_<reading>``. ``settings``: ``seeds``, ``rounds``,
  ``selection_rounds``, ``folds``, ``quick``, ``budget`` (:func:`protocol`)."""
  from fedjax_dro.core.metrics import estimation_error
  from fedjax_dro.data import get_dataset

  entry = get_dataset(READINGS[reading])

  def data(seed):
    ds = entry.load(seed)  # N_i <= 100: every seed padded to 100 rows (one program per shape)
    return dataclasses.replace(ds, train=ds.train.pad_to(max(100, ds.train.max_examples)))

  first = data(settings["seeds"][0])

  def error(models, ds):
    return float(np.mean(np.asarray(estimation_error(models, ds.true_params, personalized=True))))

  gradients = "gradients_" if settings.get("budget", "rounds") == "gradients" else ""
  return _table1(
    f"karula_synthetic_{gradients}{reading}",
    data,
    entry.default_model(first),
    first.train,
    s=max(2, round(first.num_clients / 3)),
    loss_scale=1.0,
    t_multiples=T_MULTIPLES,
    metric=C.Metric("r2", "mean"),
    extra_metrics=[C.ExtraMetric("estimation_error", error, higher_is_better=False)],
    description=f"Karula Table 1a, {entry.description}",
    **settings,
  )


def _table1(
  name,
  data,
  model,
  train,
  *,
  s,
  loss_scale,
  t_multiples,
  metric,
  extra_metrics,
  description,
  quick=False,
  **settings,
) -> C.Experiment:
  """The :class:`~fedjax_dro.compare.Experiment` of a Table 1 task: :func:`strategies` with the
  step units of the task's first training rows ``train`` (``lr``: :func:`_one_step_unit` at
  ``loss_scale``; ``eta``: Karula's ``s / (2L)``, ``s`` all clients when ``None``) and
  :func:`protocol` with its metric and ``settings`` (``seeds``, ``rounds``,
  ``selection_rounds``, ``folds``, ``budget``)."""
  from fedjax_dro.algorithms.karula import smoothness_constant

  n = train.num_clients
  lr = _one_step_unit(train, loss_scale, model.l2)
  eta = (s or n) / (2.0 * smoothness_constant(model, model.init(jax.random.PRNGKey(0)), train))
  return C.Experiment(
    name=name,
    data=data,
    model=model,
    strategies=strategies(
      n=n,
      s=s,
      lr=lr,
      eta=eta,
      d_median=_median_dissimilarity(train),
      t_multiples=t_multiples,
      quick=quick,
    ),
    protocol=protocol(metric=metric, **settings),
    extra_metrics=extra_metrics,
    description=description,
  )


def karula_synthetic(
  out_dir: Optional[str] = None,
  *,
  rounds: Optional[int] = None,
  quick: bool = False,
  seed: int = 0,
  num_seeds: Optional[int] = None,
  selection_rounds: Optional[int] = None,
  folds: Optional[int] = None,
  readings: Sequence[str] = tuple(READINGS),
  budgets: Sequence[str] = ("rounds",),
  verbose: bool = True,
  part=None,
) -> Optional[Dict[str, Any]]:
  """Table 1a under both readings, one table per budget: at equal rounds
  ``karula_synthetic.{json,md}`` and each reading's harness record
  ``karula_synthetic_<reading>.{json,md,png}``; at equal client gradients the same files named
  ``karula_synthetic_gradients...``; written to ``out_dir``. The tables of several budgets rest
  on one selection per strategy and seed. Returns the table's result (several budgets:
  ``{budget: result}``).

  Args:
    out_dir: output folder (``None``: nothing written).
    rounds: rounds of every final run (default 600; quick: 20); at equal gradients, FedAvg's
      rounds, whose client gradient evaluations every strategy gets.
    quick: a smoke run (2 seeds, 2 folds, one value per grid axis).
    seed: the first data set's seed; the seeds are ``seed, ..., seed + num_seeds - 1``.
    num_seeds: data sets (default 5; quick: 2).
    selection_rounds: rounds of every selection run (default 100; quick: 5).
    folds: selection folds (default 3; the paper's CV has 5; quick: 2).
    readings: which readings of :data:`READINGS` to run.
    budgets: which tables, out of :data:`BUDGETS` (``reproduce karula-synthetic-gradients``:
      ``("gradients",)``).
    verbose: print progress and tables.
    part: ``(i, N)`` or ``"i/N"``: only part ``i`` of ``N`` of every table's runs (needs
      ``out_dir``; returns ``None``); ``fedjax-dro merge`` joins the parts and writes the tables.
  """
  settings = _settings(quick, rounds, selection_rounds, folds, num_seeds, seed)
  for name, values, allowed in (("readings", readings, READINGS), ("budgets", budgets, BUDGETS)):
    if isinstance(values, str) or not values or any(v not in allowed for v in values):
      raise ValueError(f"{name} must be a non-empty list out of {list(allowed)}, got {values!r}")
  # one selection per reading, strategy and seed, shared by the budgets (never by the readings)
  selections: Dict[str, Dict[Any, Any]] = {r: {} for r in readings}
  results = {}
  with float64():  # the projection and the ridge closed forms are compared in float64
    for b in budgets:
      experiments = {r: ridge_experiment(r, quick=quick, budget=b, **settings) for r in readings}
      results[b] = run_tables(
        "karula-synthetic" + ("-gradients" if b == "gradients" else ""),
        experiments,
        synthetic_markdown,
        out_dir,
        verbose,
        selections_by_key=selections,
        quick=quick,
        part=part,
      )
  if any(r is None for r in results.values()):
    return None  # a part: the tables wait for the merge
  return results[budgets[0]] if len(budgets) == 1 else results


def heart_experiment(**settings) -> C.Experiment:
  """Table 1b as an :class:`~fedjax_dro.compare.Experiment` (a seed is a stratified
  train/test split per hospital); ``settings`` as :func:`ridge_experiment`'s."""
  from fedjax_dro.core.metrics import evaluate_clients
  from fedjax_dro.data import get_dataset

  entry = get_dataset("heart-disease")
  first = entry.load(settings["seeds"][0])
  model = entry.default_model(first)

  def hospital(j):
    def accuracy(models, ds):
      per = evaluate_clients(model, models, ds.test, personalized=True)
      return float(np.asarray(per["accuracy"])[j])

    return C.ExtraMetric(HOSPITALS[j], accuracy, higher_is_better=True)

  return _table1(
    "karula_heart_hospitals",
    entry.load,
    model,
    first.train,
    s=None,
    loss_scale=0.25,
    t_multiples=T_MULTIPLES_HEART,
    metric=C.Metric("accuracy", "mean"),
    extra_metrics=[hospital(j) for j in range(len(HOSPITALS))],
    description="Karula Table 1b, UCI heart disease, 4 hospitals, logistic regression",
    **settings,
  )


def karula_heart(
  out_dir: Optional[str] = None,
  *,
  rounds: Optional[int] = None,
  quick: bool = False,
  seed: int = 0,
  num_seeds: Optional[int] = None,
  selection_rounds: Optional[int] = None,
  folds: Optional[int] = None,
  verbose: bool = True,
) -> Dict[str, Any]:
  """Table 1b; writes ``karula_heart.{json,md}`` and the harness record
  ``karula_heart_hospitals.{json,md,png}`` to ``out_dir``.

  Args: as :func:`karula_synthetic` (default: 500 rounds).
  """
  settings = _settings(
    quick,
    rounds if rounds is not None else (None if quick else 500),
    selection_rounds,
    folds,
    num_seeds,
    seed,
  )
  with float64():  # Karula's projection runs in float64, as in Table 1a
    experiments = {"heart": heart_experiment(quick=quick, **settings)}
    return run_tables("karula-heart", experiments, heart_markdown, out_dir, verbose, quick=quick)


def _cell(entry, digits=3):
  m, s = entry["mean"], entry["two_se"]
  if not math.isfinite(m):
    return "-"
  return f"{m:.{digits}f}" + (f" +- {s:.{digits}f}" if math.isfinite(s) else "")


def _order(values: Dict[str, float], higher: bool) -> Dict[str, int]:
  """Rank 1 = best of ``values``."""
  ranked = sorted(values, key=lambda k: -values[k] if higher else values[k])
  return {k: i + 1 for i, k in enumerate(ranked)}


def synthetic_markdown(result: Dict[str, Any]) -> str:
  """Table 1a: both readings side by side with the paper's columns, ranks within each column,
  and the Karula - FedAvg gap (paired over seeds; the paper's: the difference of its means); a
  table whose budget is not equal rounds adds each reading's rounds and client gradient
  evaluations per strategy under a caption naming its budget, seeds and folds.

  Args:
    result: what :func:`karula_synthetic` returns (one budget).
  """
  readings = list(result["results"])
  first = result["results"][readings[0]]
  labels = [s["label"] for s in first["strategies"]]
  paper_err = {k: v[0] for k, v in PAPER_SYNTHETIC.items()}
  spend = not first["protocol"]["budget"].endswith("rounds each")  # equal gradients: spend cols
  head = ["strategy"]
  for r in readings:
    head += [f"{r}: error (rank)", f"{r}: R^2 (rank)"] + [f"{r}: rounds, gradients"] * spend
  head += ["paper error (rank)", "paper R^2 (rank)"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  if spend:
    lines = _caption(first["protocol"]) + lines
  ranks = {}
  for r in readings:
    t = result["results"][r]["table"]
    ranks[r] = (
      _order({k: t[k]["estimation_error"]["mean"] for k in labels}, higher=False),
      _order({k: t[k]["r2"]["mean"] for k in labels}, higher=True),
    )
  paper_rank = (
    _order(paper_err, False),
    _order({k: v[2] for k, v in PAPER_SYNTHETIC.items()}, True),
  )
  for label in labels:
    cells = [label]
    for r in readings:
      t = result["results"][r]["table"][label]
      cells += [
        f"{_cell(t['estimation_error'], 2)} ({ranks[r][0][label]})",
        f"{_cell(t['r2'])} ({ranks[r][1][label]})",
      ] + [f"{t['rounds']:.0f}, {t['spent']['gradient_evaluations']:,.0f}"] * spend
    p = PAPER_SYNTHETIC.get(label)
    cells += (
      [
        f"{p[0]:.2f} +- {p[1]:.2f} ({paper_rank[0][label]})",
        f"{p[2]:.3f} +- {p[3]:.3f} ({paper_rank[1][label]})",
      ]
      if p
      else ["-", "-"]
    )
    lines.append("| " + " | ".join(cells) + " |")
  gap = [
    "",
    "Karula minus FedAvg (paired over seeds, +-2SE; wins = seeds where Karula is better):",
    "",
  ]
  for r in readings:
    pr = result["results"][r]["paired"]
    e, q = pr["estimation_error"]["Karula"], pr["r2"]["Karula"]
    gap.append(f"- {r}: error {paired_difference(e, 2)}, R^2 {paired_difference(q)}")
  pk, pf = PAPER_SYNTHETIC["Karula"], PAPER_SYNTHETIC["FedAvg"]
  gap.append(f"- paper: error {pk[0] - pf[0]:+.2f}, R^2 {pk[2] - pf[2]:+.3f}")
  note = [
    "",
    "The paper's error column is on another scale than ours: under its generator no single "
    f"global model has a mean squared distance to the clients' true parameters below "
    f"{GLOBAL_ERROR_FLOOR:.2f} (d Var(group means) + d param_std^2 = 8.33 + 0.50), yet its "
    "FedAvg error is 7.47. Compare orderings (ranks) and the Karula - FedAvg gap, not absolute "
    "errors. IFCA (identical start) and Ditto are not rows of the paper.",
  ]
  return "\n".join(lines + gap + note) + "\n"


def _caption(protocol: Dict[str, Any]) -> List[str]:
  """The lines above an equal-cost table: its budget, seeds and selection folds."""
  seeds = len(protocol["seeds"])
  folds = int(re.search(r"(\d+)-fold", protocol["selection"]).group(1))
  fewer = (
    " (the paper's: 10 seeds, 5-fold CV; fewer here for a shared 2-core CPU's budget, as in the "
    "equal-rounds table)"
    if seeds < 10 or folds < 5
    else ""
  )
  return [
    f"Budget: {protocol['budget']}; {seeds} seeds, {folds}-fold selection{fewer}. Each cell under "
    "rounds, gradients: the mean rounds and client gradient evaluations over seeds.",
    "",
  ]


def heart_markdown(result: Dict[str, Any]) -> str:
  """Table 1b: mean test accuracy and per hospital (+-2SE over split seeds), the paper's
  accuracy, and the difference to FedAvg paired over seeds.

  Args:
    result: what :func:`karula_heart` returns.
  """
  r = result["results"]["heart"]
  head = ["strategy", "mean accuracy", *HOSPITALS, "paper", "minus FedAvg (paired)"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for s in r["strategies"]:
    t = r["table"][s["label"]]
    paper = PAPER_HEART.get(s["label"])
    d = r["paired"]["accuracy"].get(s["label"])
    lines.append(
      "| "
      + " | ".join(
        [s["label"], _cell(t["accuracy"])]
        + [_cell(t[h]) for h in HOSPITALS]
        + [
          "-" if paper is None else f"{paper:.3f}",
          paired_difference(d),
        ]
      )
      + " |"
    )
  return "\n".join(lines) + "\n"


__all__: Sequence[str] = [
  "karula_synthetic",
  "karula_heart",
  "ridge_experiment",
  "heart_experiment",
  "strategies",
  "protocol",
  "synthetic_markdown",
  "heart_markdown",
  "PAPER_SYNTHETIC",
  "PAPER_HEART",
  "READINGS",
  "GLOBAL_ERROR_FLOOR",
]
