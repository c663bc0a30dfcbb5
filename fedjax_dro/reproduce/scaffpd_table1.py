"""``fedjax-dro reproduce scaffpd-table1``: SCAFF-PD (Yu, Karimireddy, Ma, Jordan, "Scaff-PD:
Communication Efficient Fair and Robust Federated Learning", arXiv:2307.13381), Table 1 and
Fig. 3 (Sec. 6.2) as controlled comparisons on :mod:`fedjax_dro.compare`: linear classifiers on
precomputed image features, N = 20 clients, worst-20% and average client accuracy of FedAvg,
SCAFFOLD, q-FFL, AFL, DRFA, AgnosticFedAvg and SCAFF-PD at three Dirichlet label skews, and
SCAFF-PD's worst-20% accuracy during training for rho in {0.1, 0.2, 0.5} (Fig. 3).

Data. ``features``: one features file (:func:`fedjax_dro.data.load_features`; the paper's are the
ImageNet-1k ResNet-18 embeddings of CIFAR-100 or TinyImageNet, one file per data set). Without a
file the run uses an offline **stand-in**,
:func:`fedjax_dro.data.standins.gaussian_mixture_features` with :data:`STAND_IN`: 100 classes in
128 dimensions (a quarter of ResNet-18's 512, so that the five-seed run fits in an hour on two CPU
cores) with CIFAR-100's 500 training and 100 test rows per class, and classes of different
difficulty (``hardness = 0.4``: class ``c`` of rank ``r = c / 99`` has its mean scaled
by ``1 - 0.4 r`` and its spread by ``1 + 0.4 r``, so that a centralized linear classifier's
per-class accuracy runs from about 0.2 on the hardest tenth of the classes to 0.8 on the easiest
tenth; tested). Under a label skew some clients hold mostly hard classes, so a robust objective
has clients to help. The stand-in is labelled as such in every table, JSON and figure.

Objective. The paper's problem is its eq. (1.1), ``min_x max_{lambda in Lambda} sum_i lambda_i
f_i(x) - psi(lambda)`` with the chi^2 penalty ``psi(lambda) = (rho / (2N)) sum_i (N lambda_i -
1)^2`` of eq. (3.3), centred at the *uniform* weights ``lambda_i = 1/N``: as ``rho`` grows the
problem becomes the uniform ERM ``(1/N) sum_i f_i``. Every ERM row optimizes that objective:
FedAvg and SCAFFOLD average their clients uniformly (``weighting="uniform"``), not by sample
counts; q-FFL is q-FedAvg (``q`` tuned; ``q = 0`` is uniform FedAvg); AFL is rho = 0 (the paper:
"rho = 0 recovers AFL"); DRFA (DRFA-Prox, lambda sampling) and SCAFF-PD use rho = 0.1 (Table 1
does not state its rho; 0.1 is the smallest of Fig. 3's values); AgnosticFedAvg is its own
exponentiated-gradient DRO over the clients. The table names every row's weighting.

Partition (the paper's, after Li et al. 2022, "Federated learning on non-iid data silos"): per
seed, the training rows are split over 20 clients by a per-class Dirichlet(alpha) label skew
(:func:`fedjax_dro.data.dirichlet_partition`, redrawn until every client has >= 10 rows), then
30% of the clients (6 of 20, drawn uniformly) lose 70% of their training rows
(:func:`table1_partition`).

Accuracy. The paper's footnote: "First sort the clients by test accuracy, then select the lower
20% of clients and compute the mean from this subset" (``ceil(0.2 N)`` = 4 of 20 clients,
:func:`worst_fraction_accuracy`); "average" is the unweighted mean over the clients. A client's
test set is :data:`EVAL_ROWS` rows drawn from the pooled test half of the held-out rows with the
client's own training label mix (:func:`fedjax_dro.data.rows_with_label_mix`: every class's
rows used as evenly as possible, so the set's accuracy is the client's expected accuracy
``sum_c p_ic acc_c`` without the noise of a few images per class); its validation set is drawn
the same way from the validation half. The held-out rows are the file's ``split`` (or a
stratified sixth of every class, CIFAR's 50k / 10k, when the file has none), halved per class and
seed.

Protocol (:func:`table1_experiment`): per seed (5 seeds; a seed draws the partition, the
validation / test halves, the model initialization and the minibatches), every algorithm's
configuration is selected on the clients' validation sets by the reported metric, the worst-20%
accuracy (``selection="validation"``); the average accuracy is reported for the same selected
model (as the paper reports both for one model). Every algorithm has the same tuning budget, 9
configurations: one-knob algorithms (FedAvg, SCAFFOLD) 9 step sizes, the others 3 step sizes x 3
values of their robustness knob (AFL's dual step, DRFA's gamma, AgnosticFedAvg's domain step,
q-FFL's q, SCAFF-PD's dual step sigma); an axis is widened while the choice sits on its edge
(at most :data:`MAX_WIDENINGS` values per algorithm and seed; the configurations actually run are
in the table, the choices left on an edge listed under it). Step sizes are in units of the
smoothness of the client objective (:func:`fedjax_dro.core.smoothness.smoothness`, power
iteration on the features' second moment): from ``1 / L_minibatch`` (batch 16, the safe local
SGD step) to ``1 / L_full`` (the safe full-batch step), both recorded. SCAFF-PD's primal step is
tied to its local step, ``tau = J client_lr`` (a server step of 1, SCAFFOLD's; with it and rho
-> infinity SCAFF-PD is SCAFFOLD), and q-FFL's ``L = 1 / client_lr`` (its reference code).
Training: softmax regression with ``l2 = 1e-4``, J = 10 local steps of minibatch 16 a round (AFL:
one step of batch 160, the same examples), full participation. The paper's round budget is in its
appendix, which the text we follow does not have: every chosen configuration trains to a
validation plateau (worst-20% validation accuracy every :data:`EVERY` rounds, stopped after
:data:`PATIENCE` evaluations without a relative gain of 1e-3, at most :data:`CAP` rounds; the
rounds are in the table). The paper's title claim is about equal communication, so every alpha
has a second table at **equal uploads**: each row trained, on the same selection, for the most
rounds whose uploaded floats (:mod:`fedjax_dro.core.costs`) stay within FedAvg's in :data:`CAP`
rounds (SCAFFOLD and SCAFF-PD, which upload a control variate beside the model, get half of
them). Paired differences against SCAFF-PD (+- 2 SE over seeds, paired t-test p, Holm-adjusted
over a block) and win counts are reported; a failed (diverged) run scores accuracy 0 in every
row and is counted.

Fig. 3 is drawn at alpha = 0.01 (the paper does not say which alpha): SCAFFOLD and SCAFF-PD at
rho in {0.1, 0.2, 0.5}, each selected as above (the rho = 0.1 and SCAFFOLD selections are the
table's), their test worst-20% accuracy during the final runs.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import numpy as np

from fedjax_dro import compare as C
from fedjax_dro.reproduce.common import run_seconds, write_result
from fedjax_dro.reproduce.scaffpd_table1_data import (  # noqa: F401  (re-exported)
  EVAL_ROWS,
  HOLDOUT_FRACTION,
  MIN_EXAMPLES,
  NUM_CLIENTS,
  QUICK_STAND_IN,
  REDUCED_FRACTION,
  REMOVED_FRACTION,
  STAND_IN,
  STAND_IN_SEED,
  WEIGHTING,
  TableData,
  centralized_class_accuracy,
  table1_partition,
)
from fedjax_dro.reproduce.scaffpd_table1_report import markdown_table, plot_scaffpd_fig3

# The paper's Table 1 (average, worst-20%) in percent per alpha. The CIFAR-100 block of the text
# we follow has no FedAvg row.
PAPER_TABLE1 = {
  "CIFAR-100": {
    "SCAFFOLD": {0.01: (37.38, 14.65), 0.05: (35.28, 24.77), 0.1: (35.63, 25.61)},
    "q-FFL": {0.01: (32.27, 13.88), 0.05: (36.92, 24.66), 0.1: (38.83, 30.36)},
    "AFL": {0.01: (47.38, 18.04), 0.05: (44.73, 22.06), 0.1: (44.89, 27.27)},
    "DRFA": {0.01: (46.47, 26.77), 0.05: (41.61, 27.66), 0.1: (43.20, 32.04)},
    "AgnosticFedAvg": {0.01: (46.02, 21.52), 0.05: (37.06, 27.97), 0.1: (38.81, 29.31)},
    "SCAFF-PD": {0.01: (49.03, 29.30), 0.05: (42.06, 28.37), 0.1: (43.69, 32.77)},
  },
  "TinyImageNet": {
    "FedAvg": {0.01: (33.66, 18.18), 0.05: (31.53, 23.46), 0.1: (35.08, 27.61)},
    "SCAFFOLD": {0.01: (31.79, 15.85), 0.05: (30.43, 22.57), 0.1: (34.58, 27.33)},
    "q-FFL": {0.01: (30.47, 12.38), 0.05: (32.82, 23.16), 0.1: (37.20, 27.61)},
    "AFL": {0.01: (45.32, 18.65), 0.05: (45.54, 28.02), 0.1: (46.11, 29.50)},
    "DRFA": {0.01: (36.80, 22.32), 0.05: (37.39, 28.38), 0.1: (37.39, 28.38)},
    "AgnosticFedAvg": {0.01: (35.42, 21.80), 0.05: (37.86, 28.52), 0.1: (38.03, 28.60)},
    "SCAFF-PD": {0.01: (41.26, 25.32), 0.05: (39.32, 30.27), 0.1: (41.23, 29.78)},
  },
}

ALPHAS = (0.01, 0.05, 0.1)
RHO = 0.1  # Table 1's chi^2 strength
FIG3_RHOS = (0.1, 0.2, 0.5)
FIG3_ALPHA = 0.01
WORST_FRACTION = 0.2
L2 = 1e-4
LOCAL_STEPS, BATCH_SIZE = 10, 16
NUM_SEEDS = 5
STEPS_ONE_KNOB, STEPS_TWO_KNOBS = 9, 3  # step sizes per grid: 9 configurations each
# the robustness knob of every two-knob algorithm: 3 values a factor 10 apart
KNOBS = {
  "AFL": ("lr_lambda", (0.01, 0.1, 1.0)),
  "DRFA": ("gamma", (0.001, 0.01, 0.1)),
  "AgnosticFedAvg": ("domain_lr", (0.01, 0.1, 1.0)),
  "q-FFL": ("q", (0.2, 1.0, 5.0)),
  "SCAFF-PD": ("sigma", (0.001, 0.01, 0.1)),
}
MAX_WIDENINGS = 2  # values added beyond a grid's edges per axis, algorithm and seed
CAP, EVERY, PATIENCE, MIN_DELTA = 100, 10, 3, 1e-3  # the validation-plateau budget
UPLOADS_CAP_FACTOR = 2  # the equal-upload table's most rounds: 2 CAP
QUICK = {"num_seeds": 2, "cap": 6, "every": 2, "patience": 1}


def worst_fraction_accuracy(client_accuracy, fraction: float = WORST_FRACTION) -> float:
  """The paper's worst-20% accuracy: sort the clients by accuracy and average the lowest
  ``ceil(fraction * n)`` (:func:`fedjax_dro.core.metrics.summarize`)."""
  from fedjax_dro.core.metrics import summarize

  return summarize(client_accuracy, fraction=fraction)["worst20"]


def step_sizes(units: Dict[str, float], count: int) -> List[float]:
  """``count`` step sizes spaced geometrically from ``1 / L_minibatch`` to ``1 / L_full``
  (``units``: :func:`smoothness_units`); one value (their geometric mean) when ``count`` is 1."""
  lo, hi = units["inverse_minibatch"], units["inverse_full_batch"]
  if count == 1:
    return [float(math.sqrt(lo * hi))]
  return [float(v) for v in np.geomspace(lo, hi, count)]


def smoothness_units(x) -> Dict[str, float]:
  """The step units of the training rows ``x``: the smoothness of the softmax cross-entropy of a
  linear model with a bias (:func:`fedjax_dro.core.smoothness.smoothness`), full batch and
  averaged over batches of :data:`BATCH_SIZE` rows, plus ``l2``."""
  from fedjax_dro.core.smoothness import smoothness

  s = smoothness(x, loss="softmax", batch_size=min(BATCH_SIZE, len(x)), num_batches=32)
  full, mini = s.full_batch + L2, s.minibatch + L2
  return {
    "L_full_batch": full,
    "L_minibatch": mini,
    "minibatch_size": BATCH_SIZE,
    "trace_bound": s.trace_bound + L2,
    "inverse_full_batch": 1.0 / full,
    "inverse_minibatch": 1.0 / mini,
  }


def strategies(units: Dict[str, float], *, quick: bool = False, rhos=(RHO,)) -> List[C.Strategy]:
  """The seven rows (and, with several ``rhos``, one SCAFF-PD row per rho, labelled
  ``SCAFF-PD rho=R`` beyond the first), each with 9 configurations (1 with ``quick``)."""
  from fedjax_dro import algorithms as A
  from fedjax_dro.algorithms.wrappers import with_tied_hparams

  one = step_sizes(units, 1 if quick else STEPS_ONE_KNOB)
  two = step_sizes(units, 1 if quick else STEPS_TWO_KNOBS)
  local = dict(local_steps=LOCAL_STEPS, batch_size=BATCH_SIZE, backend="vmap")

  def knob(label):
    name, values = KNOBS[label]
    return {name: [values[1]] if quick else list(values)}

  def scaff_pd(m):  # the primal step tied to the local step: a server step of 1
    return with_tied_hparams(
      A.scaff_pd(m, parameter_rule="user", **local), tau=("client_lr", float(LOCAL_STEPS), 1)
    )

  rows = [
    C.Strategy(
      "FedAvg",
      lambda m: A.fedavg(m, weighting="uniform", **local),
      grid={"client_lr": one},
    ),
    C.Strategy(
      "SCAFFOLD",
      lambda m: A.scaffold(m, weighting="uniform", **local),
      grid={"client_lr": one},
    ),
    C.Strategy(
      "q-FFL",
      lambda m: with_tied_hparams(A.qffl(m, **local), L=("client_lr", 1.0, -1)),
      grid={"client_lr": two, **knob("q-FFL")},
    ),
    C.Strategy(
      "AFL",
      lambda m: A.afl(m, batch_size=BATCH_SIZE * LOCAL_STEPS, backend="vmap"),
      grid={"lr_w": two, **knob("AFL")},
      fixed={"rho": 0.0},
    ),
    C.Strategy(
      "DRFA",
      lambda m: A.drfa(m, prox=True, sampling="lambda", **local),
      grid={"client_lr": two, **knob("DRFA")},
      fixed={"rho": RHO},
    ),
    C.Strategy(
      "AgnosticFedAvg",
      lambda m: A.agnostic_fedavg(m, **local),
      grid={"client_lr": two, **knob("AgnosticFedAvg")},
    ),
  ]
  for k, rho in enumerate(rhos):
    rows.append(
      C.Strategy(
        "SCAFF-PD" if k == 0 else f"SCAFF-PD rho={rho:g}",
        scaff_pd,
        grid={"client_lr": two, **knob("SCAFF-PD")},
        fixed={"rho": float(rho), "theta": 1.0},
      )
    )
  return rows


def protocol(*, seeds, cap: int, every: int, patience: int, uploads: bool = False) -> C.Protocol:
  """Table 1's protocol: per seed, selection on the clients' validation sets by worst-20%
  accuracy, training to a validation plateau, SCAFF-PD the reference, a failed run scored 0.

  ``uploads``: the equal-upload table instead: every row trained for the most rounds whose
  uploaded floats stay within what FedAvg uploads in ``cap`` rounds (at most ``UPLOADS_CAP_FACTOR
  * cap`` rounds), on the plateau table's selection (made at ``cap`` rounds, shared)."""
  budget = (
    C.Budget("uploads", match="FedAvg", rounds=cap, cap=UPLOADS_CAP_FACTOR * cap)
    if uploads
    else C.Budget("plateau", cap=cap, every=every, patience=patience, min_delta=MIN_DELTA)
  )
  return C.Protocol(
    seeds=tuple(seeds),
    metric=C.Metric("accuracy", "worst20"),
    budget=budget,
    selection_rounds=cap if uploads else None,
    selection="validation",
    max_widenings=MAX_WIDENINGS,
    on_failure="score",
    failure_score=0.0,
    reference="SCAFF-PD",
    curve_every=every,
  )


def table1_experiment(
  data: TableData,
  alpha: float,
  units,
  *,
  seeds,
  quick: bool,
  budget: Dict[str, int],
  fig3=False,
  uploads: bool = False,
) -> C.Experiment:
  """Table 1's column ``alpha`` (``fig3``: Fig. 3's rows, SCAFFOLD and SCAFF-PD per rho;
  ``uploads``: at equal uploads, :func:`protocol`) as an :class:`~fedjax_dro.compare.Experiment`."""
  from fedjax_dro import models

  rows = strategies(units, quick=quick, rhos=tuple(fig3) if fig3 else (RHO,))
  if fig3:
    rows = [s for s in rows if s.label == "SCAFFOLD" or s.label.startswith("SCAFF-PD")]

  def average(models_, ds):
    from fedjax_dro.core.metrics import evaluate_clients

    acc = evaluate_clients(model, models_, ds.test, True)["accuracy"]
    return float(np.mean(np.asarray(acc)))

  model = models.softmax_regression(data.dim, data.num_classes, l2=L2)
  stem = f"alpha{alpha:g}".replace(".", "p")
  name = f"scaffpd_fig3_{stem}" if fig3 else f"scaffpd_table1_{stem}"
  what = "Fig. 3" if fig3 else "Table 1" + (" at equal uploads" if uploads else "")
  return C.Experiment(
    name=name + ("_uploads" if uploads else ""),
    data=lambda seed: data(alpha, seed),
    model=model,
    strategies=rows,
    protocol=protocol(seeds=seeds, uploads=uploads, **budget),
    extra_metrics=[] if fig3 else [C.ExtraMetric("average accuracy", average, True)],
    description=f"SCAFF-PD {what} at Dir({alpha:g}), {data.description['name']}",
  )


def scaffpd_table1(
  out_dir: Optional[str] = None,
  *,
  features: Optional[str] = None,
  rounds: Optional[int] = None,
  quick: bool = False,
  seed: int = 0,
  num_seeds: Optional[int] = None,
  alphas: Sequence[float] = ALPHAS,
  fig3_rhos: Sequence[float] = FIG3_RHOS,
  plot: bool = True,
  verbose: bool = True,
  part=None,
) -> Optional[Dict[str, Any]]:
  """Runs the Table 1 / Fig. 3 comparisons; writes ``scaffpd_table1.{json,md}``, the Fig. 3
  figure ``scaffpd_table1.png`` and every comparison's own record
  (``scaffpd_table1_alpha0p01.{json,md,png}``, ..., ``scaffpd_table1_alpha0p01_uploads.*``,
  ``scaffpd_fig3_alpha0p01.*``).

  Args:
    out_dir: output directory (None: nothing written).
    features: a features ``.npz`` (:func:`fedjax_dro.data.load_features`); None: the stand-in.
    rounds: the most rounds of a run (the plateau budget's cap; default :data:`CAP`, 6 with
      ``quick``).
    quick: one configuration per algorithm, 2 seeds, a few rounds, a small stand-in (a smoke run).
    seed: the first seed; the seeds are ``seed, ..., seed + num_seeds - 1``.
    num_seeds: seeds (default :data:`NUM_SEEDS`; 2 with ``quick``).
    alphas: the Dirichlet concentrations of the table's columns.
    fig3_rhos: SCAFF-PD's chi^2 strengths for Fig. 3 (at alpha = 0.01, when it is run; empty:
      no Fig. 3).
    plot: write the Fig. 3 PNG.
    verbose: print progress and tables.
    part: ``(i, N)`` or ``"i/N"``: only part ``i`` of ``N`` of every comparison's runs
      (:func:`fedjax_dro.compare.compare`; needs ``out_dir``); ``fedjax-dro merge`` joins the
      parts and writes the tables.

  Returns:
    the JSON-able result dict (``None`` for a part: the tables wait for the merge).
  """
  from fedjax_dro.common.checks import integer
  from fedjax_dro.compare import compare

  q = QUICK if quick else {"num_seeds": NUM_SEEDS, "cap": CAP, "every": EVERY, "patience": PATIENCE}
  cap = integer(q["cap"] if rounds is None else rounds, "rounds")
  seed = integer(seed, "seed", minimum=0)
  num_seeds = integer(q["num_seeds"] if num_seeds is None else num_seeds, "num_seeds")
  seeds = list(range(seed, seed + num_seeds))
  alphas = [float(a) for a in alphas]
  if not alphas or any(not (a > 0 and math.isfinite(a)) for a in alphas):
    raise ValueError(f"alphas must be a non-empty list of positive numbers, got {alphas!r}")
  fig3_rhos = [float(r) for r in fig3_rhos]
  if any(not (r >= 0 and math.isfinite(r)) for r in fig3_rhos):
    raise ValueError(f"fig3_rhos must be non-negative numbers, got {fig3_rhos!r}")
  if fig3_rhos and fig3_rhos[0] != RHO:
    fig3_rhos = [RHO] + [r for r in fig3_rhos if r != RHO]  # the table's SCAFF-PD comes first
  budget = {"cap": cap, "every": min(q["every"], cap), "patience": q["patience"]}
  log = print if verbose else (lambda *a, **k: None)
  t_start, cpu_start = time.perf_counter(), time.process_time()

  data = TableData(features, quick, alphas, seeds, log=log)
  units = smoothness_units(data.fs.features[data.train])
  log(
    f"[scaffpd-table1] {data.description['name']}: L_full = {units['L_full_batch']:.4g}, "
    f"L_minibatch({BATCH_SIZE}) = {units['L_minibatch']:.4g}; steps from "
    f"{units['inverse_minibatch']:.3g} to {units['inverse_full_batch']:.3g}"
  )
  results, uploads, fig3, complete = {}, {}, None, True
  run = dict(verbose=verbose, part=part)
  for alpha in alphas:
    selections: Dict[Any, Dict[str, Any]] = {}  # shared by the alpha's tables and Fig. 3
    kw = dict(seeds=seeds, quick=quick, budget=budget)
    found = [
      compare(table1_experiment(data, alpha, units, **kw), out_dir, **run, selections=selections)
    ]
    if alpha == FIG3_ALPHA and fig3_rhos:
      exp3 = table1_experiment(data, alpha, units, fig3=fig3_rhos, **kw)
      found.append(compare(exp3, out_dir, **run, selections=selections))
    exp_up = table1_experiment(data, alpha, units, uploads=True, **kw)
    found.append(compare(exp_up, out_dir, **run, selections=selections))
    if any(r is None for r in found):
      complete = False  # a part: its runs are recorded, the tables wait for the merge
      continue
    results[f"{alpha:g}"], uploads[f"{alpha:g}"] = found[0].to_json(), found[-1].to_json()
    if len(found) == 3:
      fig3 = found[1].to_json()
  if not complete:
    return None
  result = {
    "experiment": "scaffpd-table1",
    "paper": "SCAFF-PD (Yu, Karimireddy, Ma, Jordan, arXiv:2307.13381), Table 1 and Fig. 3",
    "dataset": dict(
      data.description,
      num_classes=data.num_classes,
      dim=data.dim,
      train_rows=int(data.train.size),
      held_out_rows=int(data.held.size),
      eval_rows_per_client=EVAL_ROWS,
      centralized_class_accuracy=[float(v) for v in data.class_accuracy],
    ),
    "setting": {
      "num_clients": NUM_CLIENTS,
      "reduced_clients": f"{REDUCED_FRACTION:.0%} of the clients lose {REMOVED_FRACTION:.0%} "
      "of their training rows",
      "model": f"softmax regression, l2 = {L2:g}",
      "local_steps": LOCAL_STEPS,
      "batch_size": BATCH_SIZE,
      "afl": f"one step of batch {BATCH_SIZE * LOCAL_STEPS} per round",
      "rho_table1": RHO,
      "fig3_alpha": FIG3_ALPHA,
      "fig3_rhos": fig3_rhos,
      "seeds": seeds,
      "quick": quick,
      "budget": dict(budget, min_delta=MIN_DELTA),
      "weighting": WEIGHTING,
      "grids": {
        s.label: {k: [float(v) for v in vals] for k, vals in s.grids[0].items()}
        for s in strategies(units, quick=quick)
      },
      "tied": {"SCAFF-PD": f"tau = {LOCAL_STEPS} client_lr", "q-FFL": "L = 1 / client_lr"},
      "client_accuracy": f"{EVAL_ROWS} test rows drawn with the client's training label mix",
      "worst20": "mean of the lowest ceil(0.2 N) client accuracies (the paper's footnote)",
      "selection": "per seed, worst-20% accuracy on the clients' validation sets",
    },
    "smoothness": units,
    "partitions": {f"{a:g}": [data.partition_summary(a, s) for s in seeds] for a in alphas},
    "results": results,
    "results_uploads": uploads,
    "fig3": fig3,
    "paper_table1": {
      d: {k: {f"{a:g}": v for a, v in per.items()} for k, per in t.items()}
      for d, t in PAPER_TABLE1.items()
    },
    "device": f"{jax.devices()[0].platform}, {os.cpu_count()} CPU cores visible",
    "wall_time_s": time.perf_counter() - t_start,
    "cpu_time_s": time.process_time() - cpu_start,
    "run_seconds": run_seconds(results, uploads, fig3),
  }
  md = markdown_table(result)
  log(md)
  write_result(
    out_dir,
    "scaffpd_table1",
    result,
    md,
    plot_scaffpd_fig3 if plot and fig3 is not None else None,
    log,
  )
  return result
