"""``fedjax-dro reproduce scaffpd-table1``: SCAFF-PD (Yu, Karimireddy, Ma, Jordan, "Scaff-PD:
Communication Efficient Fair and Robust Federated Learning", arXiv:2307.13381), Table 1 and
Fig. 3 (Sec. 6.2): linear classifiers on precomputed image features, N = 20 clients, average and
worst-20% accuracy of FedAvg, SCAFFOLD, q-FFL, AFL, DRFA, AgnosticFedAvg and SCAFF-PD at three
Dirichlet label skews, and SCAFF-PD's accuracy curves for rho in {0.1, 0.2, 0.5} (Fig. 3).

Data. ``features``: one features file (:func:`fedjax_dro.data.load_features`; the paper's are the
ImageNet-1k ResNet-18 embeddings of CIFAR-100 or TinyImageNet, resized to 224 x 224, one file per
data set). Without a file the run uses an offline **stand-in**,
:func:`fedjax_dro.data.standins.gaussian_mixture_features` (100 classes in 512 dimensions, class
means of scale 3 against unit noise, 100 training and 40 held-out rows per class), and says so in
the table title, the JSON (``dataset.stand_in``) and the plot. Its numbers are not CIFAR-100's.

Partition (the paper's, after Li et al. 2022, "Federated learning on non-iid data silos"): the
training rows are split over 20 clients by a per-class Dirichlet(alpha) label skew
(:func:`fedjax_dro.data.dirichlet_partition`, redrawn until every client has >= 10 rows), then 30%
of the clients (6 of 20, drawn uniformly) lose 70% of their training rows (``floor(0.7 n_i)``
rows removed uniformly at random; :func:`table1_partition`).

Accuracy. The paper's footnote: "First sort the clients by test accuracy, then select the lower
20% of clients and compute the mean from this subset" (here ``ceil(0.2 N)`` = 4 of 20 clients,
:func:`fedjax_dro.core.metrics.summarize`'s ``worst20``); "average" is the unweighted mean over
the clients. The paper does not say how a client's test accuracy is measured; ours is its
expected accuracy under its own training label distribution, ``sum_c p_ic acc_c``, with
``acc_c`` the global model's accuracy on class ``c`` of a held-out set
(:func:`fedjax_dro.data.class_weighted_accuracy`): a per-client test set drawn with the client's
label mix has this expectation, without the sampling noise of a few test images per class. The
held-out rows (the file's ``split``, or a stratified sixth of every class, CIFAR's 50k / 10k,
when the file has none) are split by class into a validation half, which selects the step
sizes, and a test half, which is reported.

Training. Softmax regression with ``l2 = 1e-4``, 10 local steps of minibatch 16 per round (AFL:
one step of batch 160, the same examples), full participation, one training seed. Step sizes are
tuned on grids relative to ``L_hat = 0.5 mean ||x||^2`` over the training rows (a per-example
smoothness scale of the cross-entropy, so that the grids fit any features file): local / primal
steps c / L_hat with c in {1, 3, 10, 30, 100} (SCAFF-PD: {10, 30, 100}, tau = c' J / L_hat with
c' in {1, 3, 10}, sigma in {0.005, 0.01, 0.02}), AFL's dual step in {0.01, 0.1, 1}, DRFA's gamma in {0.001,
0.01}, AgnosticFedAvg's domain step in {0.03, 0.1, 0.3}, q-FFL's L = 1 / step, each axis widened
while the best point sits on its edge (:func:`fedjax_dro.model_selection.widen_at_edges`, up to
``MAX_WIDENINGS`` = 4 values per algorithm and alpha; a choice left on an edge is listed). For every
algorithm the configuration with the best final-round validation worst-20% accuracy is reported
(the same rule for all seven). The DRO objective of SCAFF-PD and DRFA is eq. (1.1) with the
chi^2 penalty psi = (rho / (2N)) sum_i (N lambda_i - 1)^2 of eq. (3.3), rho = 0.1 in Table 1 (the
paper does not state its Table 1 rho; 0.1 is the smallest of its Fig. 3 values); AFL is rho = 0
(the paper: "rho = 0 recovers AFL"). Rows: FedAvg (sample-weighted averaging), SCAFFOLD,
q-FFL (q-FedAvg, q = 1, L tuned), AFL (Mohri et al.'s stochastic AFL), DRFA (DRFA-Prox, lambda
sampling, the variant for a chi^2 psi), AgnosticFedAvg and SCAFF-PD (user steps tau, sigma,
theta = 1). Fig. 3 is drawn at alpha = 0.01 (the paper does not say which alpha): SCAFF-PD's
step sizes tuned separately for each rho, and the selected SCAFFOLD run as the baseline.

What the paper does not give (its appendix is not part of the text we follow) and we chose: the
rounds (default 40; 4 with ``quick``), local steps, batch size, l2, the grids, the selection rule,
the Table 1 rho, the Fig. 3 alpha and the seed count. The whole stand-in run is sized to finish in
15 minutes on 2 CPU cores; its wall time is recorded in the JSON and the table.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import numpy as np

from fedjax_dro.algorithms.wrappers import with_per_class_accuracy
from fedjax_dro.reproduce.common import write_result

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
NUM_CLIENTS = 20
REDUCED_FRACTION, REMOVED_FRACTION = 0.3, 0.7  # 30% of the clients lose 70% of their rows
MIN_EXAMPLES = 10  # Dirichlet redraws until every client has this many rows (before the removal)
RHO = 0.1  # Table 1's chi^2 strength
FIG3_RHOS = (0.1, 0.2, 0.5)
FIG3_ALPHA = 0.01
WORST_FRACTION = 0.2
L2 = 1e-4
LOCAL_STEPS, BATCH_SIZE = 10, 16
HOLDOUT_FRACTION = 1 / 6  # held-out share of every class when the file has no split
LRS = (1.0, 3.0, 10.0, 30.0, 100.0)  # local / primal step sizes, in units of 1 / L_hat
MAX_WIDENINGS = 4  # values added beyond a grid's edges per algorithm and alpha (widen_at_edges)
STAND_IN = {"num_classes": 100, "dim": 512, "train_per_class": 100, "test_per_class": 40}
QUICK_STAND_IN = {"num_classes": 100, "dim": 32, "train_per_class": 12, "test_per_class": 4}


def _specs(quick: bool, l_hat: float, fig3_rhos: Sequence[float]) -> List[Dict[str, Any]]:
  """(label, registry name, factory options, grid, fixed hparams) of the seven rows."""
  lrs = [c / l_hat for c in ((3.0,) if quick else LRS)]
  pick = (lambda *values: [values[0]]) if quick else (lambda *values: list(values))
  pd_lrs = lrs if quick else lrs[2:]
  return [
    dict(label="FedAvg", name="fedavg", grid={"client_lr": lrs}, fixed={}),
    dict(label="SCAFFOLD", name="scaffold", grid={"client_lr": lrs}, fixed={}),
    # q-FedAvg's step is set by L (its reference code: L = 1 / client_lr); q = 1.
    dict(
      label="q-FFL",
      name="qffl",
      grid={"L": [1.0 / lr for lr in lrs]},
      fixed={"client_lr": 3.0 / l_hat, "q": 1.0},
    ),
    dict(
      label="AFL",
      name="afl",
      grid={"lr_w": lrs, "lr_lambda": pick(0.1, 0.01, 1.0)},
      fixed={"rho": 0.0},
    ),
    dict(
      label="DRFA",
      name="drfa",
      options={"prox": True, "sampling": "lambda"},
      grid={"client_lr": lrs, "gamma": pick(0.001, 0.01)},
      fixed={"rho": RHO},
    ),
    dict(
      label="AgnosticFedAvg",
      name="agnostic_fedavg",
      grid={"client_lr": lrs, "domain_lr": pick(0.1, 0.03, 0.3)},
      fixed={},
    ),
    dict(
      label="SCAFF-PD",
      name="scaff_pd",
      options={"parameter_rule": "user"},
      grid={
        "client_lr": pd_lrs,
        "tau": [c * LOCAL_STEPS / l_hat for c in pick(3.0, 1.0, 10.0)],
        "sigma": pick(0.01, 0.005, 0.02),
      },
      fixed={"theta": 1.0},
      fig3_rhos=[float(r) for r in fig3_rhos],
    ),
  ]


def table1_partition(
  labels,
  alpha: float,
  *,
  num_clients: int = NUM_CLIENTS,
  seed: int = 0,
  reduced_fraction: float = REDUCED_FRACTION,
  removed_fraction: float = REMOVED_FRACTION,
  min_examples: int = MIN_EXAMPLES,
) -> Dict[str, Any]:
  """The paper's partition of the training rows ``labels``: Dirichlet(alpha) label skew over
  ``num_clients`` clients, then ``round(reduced_fraction * num_clients)`` clients drawn uniformly
  lose ``floor(removed_fraction * n_i)`` of their ``n_i`` rows (drawn uniformly).

  Args:
    labels: ``[N]`` integer training labels.
    alpha: the Dirichlet concentration (> 0; smaller is more skewed).
    num_clients: number of clients.
    seed: seed of the Dirichlet draw, the reduced clients and the removed rows.
    reduced_fraction: share of the clients that lose rows, in ``[0, 1]``.
    removed_fraction: share of a reduced client's rows removed, in ``[0, 1)``.
    min_examples: rows every client has before the removal (the Dirichlet draw is redrawn).

  Returns:
    ``{"clients": [row indices per client, after the removal], "before": [row indices per client,
    before], "reduced": sorted ids of the reduced clients}``.
  """
  from fedjax_dro.data import dirichlet_partition

  for name, value in (
    ("reduced_fraction", reduced_fraction),
    ("removed_fraction", removed_fraction),
  ):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
      raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
  if removed_fraction == 1:
    raise ValueError("removed_fraction must be < 1: a reduced client needs at least one row")
  before = dirichlet_partition(
    labels, num_clients, alpha, seed=seed, min_examples=min_examples, max_tries=1000
  )
  rng = np.random.default_rng([seed, 7001])
  num_reduced = int(round(reduced_fraction * num_clients))
  reduced = np.sort(rng.choice(num_clients, num_reduced, replace=False))
  clients = [rows.copy() for rows in before]
  for i in reduced:
    n = before[i].size
    keep = n - int(math.floor(removed_fraction * n + 1e-9))
    clients[i] = np.sort(rng.choice(before[i], keep, replace=False))
  return {"clients": clients, "before": before, "reduced": [int(i) for i in reduced]}


def worst_fraction_accuracy(client_accuracy, fraction: float = WORST_FRACTION) -> float:
  """The paper's worst-20% accuracy: sort the clients by accuracy and average the lowest
  ``ceil(fraction * n)`` (:func:`fedjax_dro.core.metrics.summarize`)."""
  from fedjax_dro.core.metrics import summarize

  return summarize(client_accuracy, fraction=fraction)["worst20"]


def _load(features, quick: bool, seed: int):
  """(FeatureSet, dataset description) of the user's file or of the stand-in."""
  from fedjax_dro.data import load_features
  from fedjax_dro.data.standins import SEPARATION, gaussian_mixture_features

  if features is None:
    params = dict(QUICK_STAND_IN if quick else STAND_IN, separation=SEPARATION, seed=seed)
    fs = gaussian_mixture_features(**params)
    return fs, {
      "name": "stand-in (Gaussian mixture)",
      "stand_in": True,
      "source": "fedjax_dro.data.standins.gaussian_mixture_features",
      "parameters": params,
      "note": "STAND-IN: a class-conditional Gaussian mixture, not CIFAR-100 / TinyImageNet "
      "ResNet-18 features",
    }
  fs = load_features(features)
  name = os.path.splitext(os.path.basename(os.fspath(features)))[0]
  return fs, {"name": name, "stand_in": False, "source": os.path.basename(os.fspath(features))}


def _split(fs, seed: int, what: str):
  """Training rows, validation rows and test rows (stratified halves of the held-out rows)."""
  rng = np.random.default_rng([seed, 7919])
  if fs.split is None:
    held = np.zeros(fs.labels.size, bool)
    for c in np.unique(fs.labels):
      rows = rng.permutation(np.flatnonzero(fs.labels == c))
      held[rows[: int(round(HOLDOUT_FRACTION * rows.size))]] = True
  else:
    held = np.asarray(fs.split, bool)
  train = np.flatnonzero(~held)
  val, test = [], []
  for c in np.unique(fs.labels[train]):
    rows = rng.permutation(np.flatnonzero(held & (fs.labels == c)))
    if rows.size < 2:
      raise ValueError(
        f"{what}: class {c} has {rows.size} held-out row(s); every training class needs >= 2 "
        "(one for validation, one for test)"
      )
    val.extend(rows[: rows.size // 2].tolist())
    test.extend(rows[rows.size // 2 :].tolist())
  return train, np.sort(val), np.sort(test)


def scaffpd_table1(
  out_dir: Optional[str] = None,
  *,
  features: Optional[str] = None,
  rounds: Optional[int] = None,
  quick: bool = False,
  seed: int = 0,
  alphas: Sequence[float] = ALPHAS,
  fig3_rhos: Sequence[float] = FIG3_RHOS,
  plot: bool = True,
  verbose: bool = True,
) -> Dict[str, Any]:
  """Runs the Table 1 / Fig. 3 reproduction; writes ``scaffpd_table1.{json,md,png}``.

  Args:
    out_dir: output directory (None: nothing written).
    features: a features ``.npz`` (:func:`fedjax_dro.data.load_features`); None: the stand-in.
    rounds: communication rounds (default 40; 4 with ``quick``).
    quick: one value per grid axis, few rounds, a small stand-in (a smoke run).
    seed: data seed (stand-in draw, held-out split, partition, removal).
    alphas: the Dirichlet concentrations of the table's columns.
    fig3_rhos: SCAFF-PD's chi^2 strengths for Fig. 3 (drawn at alpha = 0.01 when it is run).
    plot: write the Fig. 3 PNG.
    verbose: print progress.

  Returns:
    the JSON-able result dict.
  """
  from fedjax_dro import models
  from fedjax_dro.algorithms import get_algorithm
  from fedjax_dro.data import class_weighted_accuracy, from_client_arrays, label_proportions
  from fedjax_dro.engine import sweep
  from fedjax_dro.model_selection import widen_at_edges

  if rounds is None:
    rounds = 4 if quick else 40
  if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
    raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
  alphas = [float(a) for a in alphas]
  if not alphas or any(not (a > 0 and math.isfinite(a)) for a in alphas):
    raise ValueError(f"alphas must be a non-empty list of positive numbers, got {alphas!r}")
  fig3_rhos = [float(r) for r in fig3_rhos]
  if any(not (r >= 0 and math.isfinite(r)) for r in fig3_rhos):
    raise ValueError(f"fig3_rhos must be non-negative numbers, got {fig3_rhos!r}")
  log = print if verbose else (lambda *a, **k: None)
  t_start, cpu_start = time.perf_counter(), time.process_time()
  load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

  fs, dataset = _load(features, quick, seed)
  train, val, test = _split(fs, seed, f"features {dataset['source']}")
  x, y = fs.features[train], fs.labels[train]
  num_classes, dim = int(fs.num_classes), int(fs.features.shape[1])
  l_hat = float(0.5 * np.mean(np.sum(x.astype(np.float64) ** 2, axis=1)))
  holdouts = {
    "val": (fs.features[val], fs.labels[val]),
    "test": (fs.features[test], fs.labels[test]),
  }
  model = models.softmax_regression(dim, num_classes, l2=L2)
  specs = _specs(quick, l_hat, fig3_rhos)

  partitions = []
  for alpha in alphas:
    part = table1_partition(y, alpha, seed=seed)
    clients = part["clients"]
    props = label_proportions([y[rows] for rows in clients], num_classes)
    partitions.append(dict(alpha=alpha, part=part, props=props))
  # one padded shape for every alpha: each algorithm compiles once
  max_rows = max(rows.size for p in partitions for rows in p["part"]["clients"])

  results = []
  fig3 = scaffold_curves = None
  timings: Dict[str, float] = {}
  algs = {}
  for p in partitions:
    alpha, clients, props = p["alpha"], p["part"]["clients"], p["props"]
    data = from_client_arrays([x[r] for r in clients], [y[r] for r in clients]).pad_to(max_rows)
    rows = {}
    for spec in specs:
      grid = {k: list(v) for k, v in spec["grid"].items()}
      fig3_here = bool(spec.get("fig3_rhos")) and alpha == FIG3_ALPHA
      grid["rho"] = sorted({RHO, *spec["fig3_rhos"]}) if fig3_here else [RHO]
      if "fig3_rhos" not in spec:
        grid.pop("rho")
      key = spec["label"]
      if key not in algs:
        factory = get_algorithm(spec["name"]).factory
        settings = dict(batch_size=BATCH_SIZE * LOCAL_STEPS, backend="vmap")
        if spec["name"] != "afl":
          settings = dict(local_steps=LOCAL_STEPS, batch_size=BATCH_SIZE, backend="vmap")
        alg = factory(model, **settings, **spec.get("options", {}))
        algs[key] = with_per_class_accuracy(alg, holdouts, num_classes)
      t0 = time.perf_counter()

      def evaluate(subgrid, alg=algs[key], data=data, props=props, fixed=spec["fixed"]):
        res = sweep(
          alg, data, rounds=rounds, grid=subgrid, hparams=fixed or None, eval_every=rounds
        )
        return _score(res, props, class_weighted_accuracy)

      axes = [k for k, v in grid.items() if k != "rho" and len(set(v)) > 1]
      kw = dict(axes=axes, key=_table_key, max_widenings=MAX_WIDENINGS)
      scored, grid, widened = widen_at_edges(evaluate, grid, **kw)
      tkey = f"alpha={alpha:g} {spec['label']}"
      timings[tkey] = time.perf_counter() - t0
      rows[spec["label"]] = _row(spec, max(scored, key=_table_key), grid=grid, widened=widened)
      r = rows[spec["label"]]
      log(
        f"[scaffpd-table1] alpha={alpha:g} {spec['label']:<15} avg {r['avg_acc']:.3f} "
        f"worst-20% {r['worst20_acc']:.3f}  {r['hparams']}  ({len(scored)} runs, "
        f"{len(widened)} widenings, {timings[tkey]:.0f}s)"
      )
      if fig3_here:
        fig3 = {"alpha": alpha, "rhos": {}}
        for rho in grid["rho"]:
          best = max((s for s in scored if s["hparams"]["rho"] == rho), key=lambda s: s["val_key"])
          fig3["rhos"][f"{rho:g}"] = _row(spec, best, curves=True, grid=grid)
      if spec["label"] == "SCAFFOLD" and alpha == FIG3_ALPHA:
        scaffold_curves = _row(spec, max(scored, key=_table_key), curves=True, grid=grid)
    sizes = np.array([r.size for r in clients])
    before = np.array([r.size for r in p["part"]["before"]])
    partitions_out = {
      "alpha": alpha,
      "client_rows_before_removal": before.tolist(),
      "client_rows": sizes.tolist(),
      "reduced_clients": p["part"]["reduced"],
      "classes_per_client": [int(np.count_nonzero(row)) for row in props],
      "algorithms": rows,
    }
    results.append(partitions_out)
  if fig3 is not None:
    fig3["SCAFFOLD"] = scaffold_curves
  result = {
    "experiment": "scaffpd-table1",
    "paper": "SCAFF-PD (Yu, Karimireddy, Ma, Jordan, arXiv:2307.13381), Table 1 and Fig. 3",
    "dataset": dict(
      dataset,
      num_classes=num_classes,
      dim=dim,
      train_rows=int(train.size),
      validation_rows=int(val.size),
      test_rows=int(test.size),
    ),
    "setting": {
      "num_clients": NUM_CLIENTS,
      "reduced_clients": f"{REDUCED_FRACTION:.0%} of the clients lose {REMOVED_FRACTION:.0%} "
      "of their training rows",
      "model": f"softmax regression, l2 = {L2:g}",
      "rounds": rounds,
      "local_steps": LOCAL_STEPS,
      "batch_size": BATCH_SIZE,
      "afl": f"one step of batch {BATCH_SIZE * LOCAL_STEPS} per round",
      "l_hat": l_hat,
      "step_grid_units": "1 / l_hat, l_hat = 0.5 mean ||x||^2 over the training rows",
      "rho_table1": RHO,
      "fig3_alpha": FIG3_ALPHA,
      "seed": seed,
      "quick": quick,
      "client_accuracy": "sum_c p_ic acc_c: p_i the client's training label mix, acc_c the "
      "per-class accuracy on the held-out half",
      "worst20": "mean of the lowest ceil(0.2 N) client accuracies (the paper's footnote)",
      "selection": "final-round validation worst-20% accuracy, the same rule for every row",
    },
    "partitions": results,
    "fig3": fig3,
    "paper_table1": {
      d: {k: {f"{a:g}": v for a, v in per.items()} for k, per in t.items()}
      for d, t in PAPER_TABLE1.items()
    },
    "timings_s": timings,
    "device": f"{jax.devices()[0].platform}, {os.cpu_count()} CPU cores visible",
    "wall_time_s": time.perf_counter() - t_start,
    # CPU seconds of this process (all its threads): the work, whatever else shares the cores
    "cpu_time_s": time.process_time() - cpu_start,
    "load_average_1min": [load_start, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
  }
  log(markdown_table(result))
  write_result(
    out_dir,
    "scaffpd_table1",
    result,
    markdown_table(result),
    plot_scaffpd_fig3 if plot and fig3 is not None else None,
    log,
  )
  return result


def _score(res, props, class_weighted_accuracy) -> List[Dict[str, Any]]:
  """Per sweep row: client accuracies on validation / test each round, and the selection key."""
  out = []
  for j, config in enumerate(res.configs):
    per = {}
    for name in ("val", "test"):
      acc = res.train_metrics[f"{name}_class_acc"][j]  # [rounds, num_classes]
      per[name] = (
        None
        if res.diverged[j] or not np.all(np.isfinite(acc))
        else np.stack([class_weighted_accuracy(np.clip(a, 0, 1), props) for a in acc])
      )
    if per["val"] is None:
      key = (-math.inf, -math.inf)
    else:
      key = (worst_fraction_accuracy(per["val"][-1]), float(np.mean(per["val"][-1])))
    out.append({"hparams": config["hparams"], "val_key": key, "client_acc": per})
  return out


def _table_key(s):
  """A scored row's selection key for Table 1 (Fig. 3's other rho values never compete)."""
  return s["val_key"] if s["hparams"].get("rho", RHO) == RHO else (-math.inf, -math.inf)


def _row(spec, s, curves: bool = False, grid=None, widened=()) -> Dict[str, Any]:
  """The reported numbers of one selected sweep row (``grid``: the grid searched, widened at its
  edges; default the spec's)."""
  from fedjax_dro.model_selection import grid_edge

  test = s["client_acc"]["test"]
  tuned = {k: v for k, v in (grid or spec["grid"]).items() if k in spec["grid"]}
  row = {
    "algorithm": spec["name"],
    "options": dict(spec.get("options", {})),
    "hparams": {**spec["fixed"], **s["hparams"]},
    "grid": {k: [float(v) for v in vals] for k, vals in tuned.items()},
    "widened": [[k, float(v)] for k, v in widened],
    # grid axes whose selected value is the smallest or largest tried (a wider grid might do better)
    "at_grid_edge": sorted(k for k, vals in tuned.items() if grid_edge(vals, s["hparams"][k])),
    "validation_worst20_acc": s["val_key"][0],
    "avg_acc": math.nan if test is None else float(np.mean(test[-1])),
    "worst20_acc": math.nan if test is None else worst_fraction_accuracy(test[-1]),
    "client_test_acc": None if test is None else [float(v) for v in test[-1]],
  }
  if curves and test is not None:
    row["curve_avg_acc"] = [float(np.mean(t)) for t in test]
    row["curve_worst20_acc"] = [worst_fraction_accuracy(t) for t in test]
  return row


def markdown_table(result: Dict[str, Any]) -> str:
  """Table 1's layout: average / worst-20% test accuracy (%) per alpha, ours beside the paper's
  CIFAR-100 numbers; the title says when the data is the stand-in."""
  ds, parts = result["dataset"], result["partitions"]
  title = (
    f"**STAND-IN data** ({ds['note']})" if ds["stand_in"] else f"features file `{ds['source']}`"
  )
  lines = [
    f"SCAFF-PD Table 1 reproduction on {title}: {ds['num_classes']} classes, d = {ds['dim']}, "
    f"N = {result['setting']['num_clients']}, {result['setting']['rounds']} rounds"
    + (" (quick smoke run)" if result["setting"]["quick"] else "")
    + f"; wall time {result['wall_time_s']:.0f} s"
    + (f" ({result['cpu_time_s']:.0f} CPU s)" if "cpu_time_s" in result else "")
    + ". Accuracy in %, average / worst-20%.",
    "",
    "| algorithm | "
    + " | ".join(f"alpha={p['alpha']:g} avg | alpha={p['alpha']:g} worst-20%" for p in parts)
    + " | paper CIFAR-100 (avg / worst-20%, per alpha) |",
    "|---" * (2 + 2 * len(parts)) + "|",
  ]
  paper = result["paper_table1"]["CIFAR-100"]
  for label in parts[0]["algorithms"]:
    cells = []
    for p in parts:
      r = p["algorithms"][label]
      cells += [f"{100 * r['avg_acc']:.2f}", f"{100 * r['worst20_acc']:.2f}"]
    ref = paper.get(label, {})
    cells.append(
      " ; ".join(f"{ref[a][0]:.2f} / {ref[a][1]:.2f}" for a in ("0.01", "0.05", "0.1") if a in ref)
      or "-"
    )
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  edges = [
    f"{label} at alpha={p['alpha']:g} ({', '.join(r['at_grid_edge'])})"
    for label in parts[0]["algorithms"]
    for p in parts
    for r in [p["algorithms"][label]]
    if r.get("at_grid_edge")
  ]
  if edges:
    lines += ["", "Selected at the edge of its grid: " + "; ".join(edges) + "."]
  return "\n".join(lines) + "\n"


def plot_scaffpd_fig3(result: Dict[str, Any], path: str) -> str:
  """Fig. 3: SCAFF-PD's average (a) and worst-20% (b) test accuracy per round for each rho,
  with SCAFFOLD (orange, dashed) as the baseline."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig3 = result["fig3"]
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for ax, key, name in zip(
    axes, ("curve_avg_acc", "curve_worst20_acc"), ("(a) average", "(b) worst-20%")
  ):
    for k, (rho, row) in enumerate(fig3["rhos"].items()):
      if key in row:
        c = row[key]
        ax.plot(
          np.arange(1, len(c) + 1),
          c,
          color=f"C{[0, 2, 3, 4, 5][k % 5]}",
          label=f"SCAFF-PD rho={rho}",
        )
    if key in fig3["SCAFFOLD"]:
      c = fig3["SCAFFOLD"][key]
      ax.plot(np.arange(1, len(c) + 1), c, "--", color="C1", label="SCAFFOLD")
    ax.set_xlabel("communication round")
    ax.set_ylabel(f"{name} test accuracy")
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=8)
  ds = result["dataset"]
  data = "STAND-IN Gaussian mixture (not CIFAR-100)" if ds["stand_in"] else ds["source"]
  fig.suptitle(f"SCAFF-PD Fig. 3 reproduction: {data}, Dir({fig3['alpha']:g}), N = 20", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
