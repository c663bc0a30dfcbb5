"""Karula (Erickson and Johansson, "Personalized Federated Learning under Model Dissimilarity
Constraints", arXiv:2505.07575), Sec. 5.3 and Figure 1: personalized CNNs on handwritten digits,
one writer per client (``fedjax-dro reproduce karula-femnist``).

The paper trains on LEAF's federated handwritten digits (the digit classes 0-9 of FEMNIST, one
writer per client) and shows the per-writer test accuracies of Local, FedSGD, FedAvg, pFedMe,
IFCA and Karula (its Figure 1). The paper gives no network, round count or grid for this
experiment; the choices below are ours, made to fit a 2-core CPU.

Data. With ``leaf_dir``: LEAF FEMNIST files, reduced to the digits as described in
:func:`fedjax_dro.data.load_femnist_digits` (at most ``max_writers`` writers, 16x16 images); the
data are the same for every seed. Without: the stand-in
:func:`fedjax_dro.data.digits_by_writer` (100 writers of 40 digits, 4 style groups; not FEMNIST),
a new set of writers per seed. Pixels are standardized with the pooled mean and standard
deviation of the training rows (one scalar pair), which lets the full-gradient methods (FedSGD,
Karula) take stable steps.

Model: :func:`fedjax_dro.models.cnn` on ``16 x 16`` inputs, two 3x3 conv + ReLU + 2x2 max-pool
blocks of ``features`` channels (default (8, 16)) and a linear head (about 3,800 parameters).

Strategies (:data:`STRATEGIES`; every one weights its clients' losses by their sample counts, as
the paper states for all methods): Local, FedAvg and IFCA run ``LOCAL_STEPS`` full-batch local
steps on a quarter of the writers per round; pFedMe is its paper's Algorithm 1 (every writer
updates its personalized model every round) with one local step of ``PFEDME_PERSONAL_STEPS``
inner steps; FedSGD and Karula take one full gradient per writer and round, all writers
participating (Karula's deterministic variant: projected gradient descent). Karula at ``t = 0``
is FedSGD, so it takes FedSGD's cross-validated step ``lr`` (``eta = n lr``: a writer's block
moves by ``lr`` times its gradient); IFCA with one cluster is FedAvg, so it takes FedAvg's
cross-validated local step. Ditto (``strategies=`` with ``"Ditto"``) is off by default: it
doubles the local work.

Karula's dissimilarities on images (:data:`IMAGE_OT_OPTIONS`): the paper's settings (exact OT,
Euclidean cost on the raw point ``(pixels flattened, label)``, entrywise l1), with the label as
one numeric column next to the 256 pixels, and a *pooled* reference set of ``N0 = 64`` rows
drawn from all writers' training rows: reference points that are real digit images (a Gaussian
fitted to 257 dimensions gives noise images), and ``N0`` about twice a writer's row count, so
that every row is matched to about two reference points at a small LP cost. On the stand-in
the choice matters little: ranking the writer pairs by ``D``, same-style-group pairs come before
other pairs with AUC 0.983-0.985 for pooled ``N0`` = 32, 64, 128, a Gaussian ``N0 = 64`` and
pooled ``N0 = 64`` without the label column (data seeds 0 and 1); a matrix for 100 writers takes
3-9 s on a loaded 2-core CPU (``N0 = 128`` the slowest). Karula's ``t`` grid is relative, ``c / median_{i != j} D_ij``
for ``c`` in :data:`T_MULTIPLES` (``c`` is the squared parameter distance allowed to the median
pair).

Selection: each strategy's hyper-parameters (steps of Local, FedSGD and FedAvg out of two
values; pFedMe's ``lam``; IFCA's number of clusters, 2 or 4; Karula's ``t``, three values) by
``folds``-fold cross-validation (default 2 folds of 20 rounds) on the
*training* rows of the first seed's data set (:func:`fedjax_dro.model_selection.cross_validate`,
held-out example-weighted log-loss), reused for the other seeds (the budget does not allow a CV
per seed). Then every seed trains on all training rows and scores every writer's test rows. The
table reports the mean over writers of the test accuracy, mean +- 2 SE over seeds, and the
paired differences Karula minus each strategy; the plot shows every writer's test accuracy
(all seeds) per strategy, as Figure 1.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.reproduce.karula import mean_2se, memoized, paired

STRATEGIES = ("Local", "FedSGD", "FedAvg", "pFedMe", "IFCA", "Karula")
ALL_STRATEGIES = ("Local", "FedSGD", "FedAvg", "pFedMe", "IFCA", "Ditto", "Karula")
LOCAL_STEPS = 5
PFEDME_PERSONAL_STEPS = 2
PARTICIPATION = 0.25  # the share of writers per round of the local-step strategies
FULL_LR = 0.2  # the full-gradient step of FedSGD and Karula (Karula: eta = n * FULL_LR)
LOCAL_LRS = (0.1, 0.3)  # the local-step grid of Local and FedAvg
T_MULTIPLES = (0.1, 1.0, 10.0)
IMAGE_OT_OPTIONS = {"preset": "paper", "reference_method": "pooled", "num_reference": 64}
DEFAULTS = dict(rounds=60, cv_rounds=20, folds=2, num_seeds=5, num_writers=100)
QUICK = dict(rounds=3, cv_rounds=2, folds=2, num_seeds=2, num_writers=8, examples_per_writer=8)
# seconds per (writer, gradient step) of the (8, 16) CNN on 30 rows of 16x16, and per compiled
# program, on an idle 2-core CPU (for the estimate printed before the run)
SECONDS_PER_STEP, SECONDS_PER_COMPILE = 1.0e-3, 4.0


def image_model(image_size: int = 16, features: Sequence[int] = (8, 16)):
  """The reproduction's CNN: :func:`fedjax_dro.models.cnn` on ``image_size`` square images, 10
  classes, conv blocks of ``features`` channels, no dense layer (``conv="patches"``, fast under
  vmap on CPU).

  Args:
    image_size: side of the input images.
    features: output channels of the conv blocks.
  """
  from fedjax_dro import models

  return models.cnn(
    (image_size, image_size), 10, features=tuple(features), dense=None, conv="patches"
  )


def _factories(model, num_writers, ot_options):
  from fedjax_dro import algorithms as A

  s = max(2, int(round(PARTICIPATION * num_writers)))
  w = dict(weighting="num_examples")
  k = LOCAL_STEPS
  return {
    "Local": memoized(lambda: A.local(model, clients_per_round=s, local_steps=k)),
    "FedSGD": memoized(lambda: A.fedsgd(model, **w)),
    "FedAvg": memoized(lambda: A.fedavg(model, clients_per_round=s, local_steps=k, **w)),
    "pFedMe": memoized(
      lambda: A.pfedme(
        model,
        clients_per_round=s,
        local_steps=1,
        personal_steps=PFEDME_PERSONAL_STEPS,
        batch_size=None,
        personal_updates="all",
        **w,
      )
    ),
    "IFCA": memoized(
      lambda num_clusters=2: A.ifca(
        model, num_clusters=num_clusters, clients_per_round=s, local_steps=k, **w
      )
    ),
    "Ditto": memoized(lambda: A.ditto(model, clients_per_round=s, local_steps=k, **w)),
    "Karula": memoized(lambda: A.karula(model, ot_options=ot_options, **w)),
  }


def _specs(num_writers: int, d_median: float, quick: bool) -> Dict[str, Dict[str, Any]]:
  """``{label: {"grid": ..., "fixed": ...}}``: the CV grid and the fixed hyper-parameters."""
  few = (lambda v: list(v)[:1]) if quick else list
  lr = FULL_LR
  return {
    "Local": {"grid": {"client_lr": few(LOCAL_LRS)}, "fixed": {}},
    "FedSGD": {"grid": {"lr": few((lr, 2 * lr))}, "fixed": {}},
    "FedAvg": {"grid": {"client_lr": few(LOCAL_LRS)}, "fixed": {"server_lr": 1.0}},
    "pFedMe": {
      "grid": {"lam": few((0.3, 3.0))},
      "fixed": {"client_lr": 0.1, "personal_lr": 0.05, "beta": 1.0},
    },
    "IFCA": {"grid": {"num_clusters": few((4, 2))}, "fixed": {"client_lr": 0.1}},
    "Ditto": {"grid": {"lam": few((0.1, 1.0))}, "fixed": {"client_lr": 0.1, "personal_lr": 0.1}},
    "Karula": {
      "grid": {"t": few([c / d_median for c in T_MULTIPLES])},
      "fixed": {"eta": num_writers * lr},
    },
  }


def standardize_pixels(ds):
  """``ds`` with every pixel ``(x - mean) / std``, the pooled scalar mean and standard deviation
  of the valid training pixels (padded rows stay 0).

  Args:
    ds: a :class:`~fedjax_dro.data.FederatedDataset` of images.
  """
  x, m = np.asarray(ds.train.x), np.asarray(ds.train.mask)
  mu, sd = float(x[m].mean()), float(x[m].std()) or 1.0

  def f(d):
    mask = np.asarray(d.mask).reshape(d.mask.shape + (1,) * (d.x.ndim - 2))
    return dataclasses.replace(d, x=jnp.asarray((np.asarray(d.x) - mu) / sd * mask, jnp.float32))

  return dataclasses.replace(ds, train=f(ds.train), test=f(ds.test))


def _select(label, make, spec, ds, *, cv_rounds, folds, seed):
  """The CV-chosen grid point of ``label`` on ``ds``'s training rows (the first point when the
  grid has one point: nothing to choose)."""
  from fedjax_dro.model_selection import cross_validate

  grid = spec["grid"]
  if all(len(v) == 1 for v in grid.values()):
    return {k: v[0] for k, v in grid.items()}, None
  options = "num_clusters" in grid
  cv = cross_validate(
    make if options else make(),
    ds,
    grid,
    folds=folds,
    rounds=cv_rounds,
    seed=seed,
    metric="loss",
    stat="weighted_mean",
    hparams=spec["fixed"] or None,
    eval_every=cv_rounds,
  )
  return dict(cv.best), float(cv.best_score)


def _train(make, spec, chosen, ds, *, rounds, seed):
  """Per-writer test accuracies of the strategy trained with ``chosen`` on all training rows."""
  from fedjax_dro import run
  from fedjax_dro.core.metrics import evaluate_clients

  options = {k: int(v) for k, v in chosen.items() if k == "num_clusters"}
  alg = make(**options)
  hparams = {**spec["fixed"], **{k: float(v) for k, v in chosen.items() if k not in options}}
  hist = run(alg, ds, rounds=rounds, seed=seed, hparams=hparams or None, eval_every=rounds)
  models = alg.client_models(hist.final_state)
  if not alg.personalized:
    n = ds.num_clients
    models = jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), models)
  per = evaluate_clients(alg.model, models, ds.test, personalized=True)
  return [float(a) for a in np.asarray(per["accuracy"])]


def _median_dissimilarity(train, ot_options) -> float:
  from fedjax_dro.ot import dissimilarity_matrix

  D = np.asarray(dissimilarity_matrix(train.x, train.y, train.mask, **ot_options))
  return float(np.median(D[~np.eye(len(D), dtype=bool)]))


def estimate_seconds(
  strategies, *, num_writers, rows, rounds, cv_rounds, folds, num_seeds, features, image_size
) -> float:
  """A rough wall-time estimate (seconds, idle 2-core CPU) of :func:`karula_femnist` from the
  number of client gradient steps it takes and the programs it compiles.

  Args:
    strategies: the strategy labels.
    num_writers: writers (clients).
    rows: training rows per writer.
    rounds: rounds of every final run.
    cv_rounds: rounds of every CV run.
    folds: CV folds.
    num_seeds: seeds.
    features: the CNN's conv channels.
    image_size: image side.
  """
  s = max(2, round(PARTICIPATION * num_writers))
  per_round = {  # client gradient steps per round
    "Local": s * LOCAL_STEPS,
    "FedAvg": s * LOCAL_STEPS,
    "IFCA": s * (LOCAL_STEPS + 1),
    "Ditto": 2 * s * LOCAL_STEPS,
    "pFedMe": num_writers * (PFEDME_PERSONAL_STEPS + 1),
    "FedSGD": num_writers,
    "Karula": 1.5 * num_writers,  # plus the projection
  }
  width = sum(features) / 24.0 * (image_size / 16.0) ** 2 * rows / 30.0
  steps = sum(
    per_round[k] * (rounds * num_seeds + 2.0 * cv_rounds * (folds - 1)) for k in strategies
  )
  return steps * SECONDS_PER_STEP * width + SECONDS_PER_COMPILE * 3 * len(strategies)


def karula_femnist(
  out_dir: Optional[str] = None,
  *,
  rounds: Optional[int] = None,
  quick: bool = False,
  seed: int = 0,
  num_seeds: Optional[int] = None,
  cv_rounds: Optional[int] = None,
  folds: Optional[int] = None,
  leaf_dir: Optional[str] = None,
  max_writers: int = 100,
  num_writers: Optional[int] = None,
  features: Sequence[int] = (8, 16),
  strategies: Sequence[str] = STRATEGIES,
  verbose: bool = True,
) -> Dict[str, Any]:
  """Karula Sec. 5.3 / Figure 1; writes ``karula_femnist.{json,md,png}`` to ``out_dir``.

  Args:
    out_dir: output folder (``None``: nothing written).
    rounds: rounds of every final run (default 60; quick: 3).
    quick: a tiny smoke run (8 writers of 8 digits, 2 seeds, the grids' first points, no CV).
    seed: the first seed; the seeds are ``seed, ..., seed + num_seeds - 1`` (the stand-in: a new
      set of writers per seed; LEAF: the same data, new initializations and samples).
    num_seeds: seeds (default 5; quick: 2).
    cv_rounds: rounds of every CV run (default 20; quick: 2).
    folds: CV folds (default 2).
    leaf_dir: LEAF FEMNIST folder (:func:`fedjax_dro.data.load_femnist_digits`); ``None``: the
      stand-in :func:`fedjax_dro.data.digits_by_writer`.
    max_writers: the most LEAF writers kept (the first ones in file order).
    num_writers: writers of the stand-in (default 100; quick: 8).
    features: the CNN's conv channels.
    strategies: labels out of :data:`ALL_STRATEGIES`, in table order.
    verbose: print the estimate, progress and table.
  """
  from fedjax_dro.data import digits_by_writer, load_femnist_digits

  q = QUICK if quick else DEFAULTS
  rounds = q["rounds"] if rounds is None else rounds
  cv_rounds = q["cv_rounds"] if cv_rounds is None else cv_rounds
  folds = q["folds"] if folds is None else folds
  num_seeds = q["num_seeds"] if num_seeds is None else num_seeds
  num_writers = q["num_writers"] if num_writers is None else num_writers
  for name, value, low in (
    ("rounds", rounds, 1),
    ("cv_rounds", cv_rounds, 1),
    ("folds", folds, 2),
    ("num_seeds", num_seeds, 1),
    ("num_writers", num_writers, 2),
    ("max_writers", max_writers, 2),
    ("seed", seed, 0),
  ):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
      raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
  if isinstance(strategies, str) or not strategies:
    raise ValueError(f"strategies must be a non-empty list out of {ALL_STRATEGIES}")
  unknown = [s for s in strategies if s not in ALL_STRATEGIES]
  if unknown or len(set(strategies)) != len(strategies):
    raise ValueError(
      f"strategies must be distinct labels out of {ALL_STRATEGIES}, got {list(strategies)}"
    )
  if leaf_dir is not None and not os.path.isdir(os.fspath(leaf_dir)):
    raise ValueError(f"leaf_dir {os.fspath(leaf_dir)!r} is not an existing directory")
  log = print if verbose else (lambda *a, **k: None)
  t_start = time.perf_counter()
  seeds = list(range(int(seed), int(seed) + int(num_seeds)))
  size = 8 if quick else 16
  rows_per_writer = q.get("examples_per_writer", 40)

  def load(data_seed):
    if leaf_dir is not None:
      ds = load_femnist_digits(leaf_dir, max_writers=max_writers, image_size=size, seed=seed)
    else:
      ds = digits_by_writer(
        num_writers, examples_per_writer=rows_per_writer, image_size=size, seed=data_seed
      )
    return standardize_pixels(ds)

  ds = load(seeds[0])
  n = ds.num_clients
  if n < 2:
    raise ValueError(f"the data have {n} writer(s); at least 2 are needed")
  train_rows = int(np.asarray(ds.train.num_examples).max())
  if folds > int(np.asarray(ds.train.num_examples).min()):
    raise ValueError(
      f"folds={folds} is more than the fewest training rows of a writer "
      f"({int(np.asarray(ds.train.num_examples).min())})"
    )
  estimate = estimate_seconds(
    strategies,
    num_writers=n,
    rows=train_rows,
    rounds=rounds,
    cv_rounds=0 if quick else cv_rounds,
    folds=folds,
    num_seeds=num_seeds,
    features=features,
    image_size=size,
  )
  log(
    f"[karula-femnist] {n} writers ({'LEAF' if leaf_dir else 'stand-in'}), {len(strategies)} "
    f"strategies, {num_seeds} seeds, {rounds} rounds: about {estimate / 60:.1f} min on an idle "
    f"2-core CPU"
  )
  model = image_model(size, features if not quick else (4, 8))
  # N0 = 64 pooled reference rows, fewer when a CV fold has fewer training rows (quick runs)
  total = int(np.asarray(ds.train.num_examples).sum())
  ot_options = {**IMAGE_OT_OPTIONS, "num_reference": min(64, total * (folds - 1) // folds)}
  makes = _factories(model, n, ot_options)
  d_median = _median_dissimilarity(ds.train, ot_options)
  specs = _specs(n, d_median, quick)
  chosen, cv_scores = {}, {}
  for label in strategies:  # CV once, on the first seed's training rows
    t0 = time.perf_counter()
    chosen[label], cv_scores[label] = _select(
      label, makes[label], specs[label], ds, cv_rounds=cv_rounds, folds=folds, seed=seeds[0]
    )
    log(f"[karula-femnist] CV {label:<7} chose {chosen[label]}  ({time.perf_counter() - t0:.0f}s)")
    if label == "FedSGD":  # Karula at t = 0 is FedSGD: it takes FedSGD's step, eta = n lr
      specs["Karula"]["fixed"]["eta"] = n * float(chosen[label]["lr"])
    if label == "FedAvg":  # IFCA with one cluster is FedAvg: it takes FedAvg's local step
      specs["IFCA"]["fixed"]["client_lr"] = float(chosen[label]["client_lr"])
  per_seed: Dict[str, List[Dict[str, Any]]] = {}
  for k, data_seed in enumerate(seeds):
    if k > 0 and leaf_dir is None:
      ds = load(data_seed)
    for label in strategies:
      t0 = time.perf_counter()
      acc = _train(makes[label], specs[label], chosen[label], ds, rounds=rounds, seed=data_seed)
      row = {
        "seed": data_seed,
        "accuracy_mean": float(np.mean(acc)),
        "accuracy_per_writer": acc,
        "seconds": time.perf_counter() - t0,
      }
      per_seed.setdefault(label, []).append(row)
      log(
        f"[karula-femnist] seed {data_seed} {label:<7} mean writer accuracy "
        f"{row['accuracy_mean']:.3f}  ({row['seconds']:.0f}s)"
      )
  table = {}
  for label, rows in per_seed.items():
    m, m2 = mean_2se([r["accuracy_mean"] for r in rows])
    every = np.concatenate([r["accuracy_per_writer"] for r in rows])
    table[label] = {
      "accuracy_mean": m,
      "accuracy_2se": m2,
      "writer_quartiles": [float(v) for v in np.quantile(every, [0.25, 0.5, 0.75])],
      "writer_worst10": float(np.mean(np.sort(every)[: max(1, every.size // 10)])),
    }
  result = {
    "experiment": "karula-femnist",
    "paper": "Karula (Erickson and Johansson), Sec. 5.3, Figure 1",
    "setting": {
      "data": "LEAF FEMNIST digits" if leaf_dir else "stand-in: digits_by_writer (not FEMNIST)",
      "writers": n,
      "train_rows_per_writer": train_rows,
      "image_size": size,
      "model": model.name,
      "features": list(features if not quick else (4, 8)),
      "seeds": seeds,
      "rounds": rounds,
      "cv_rounds": cv_rounds,
      "folds": folds,
      "quick": quick,
      "strategies": list(strategies),
      "participation": PARTICIPATION,
      "local_steps": LOCAL_STEPS,
      "karula_ot_options": ot_options,
      "t_multiples": list(T_MULTIPLES),
      "median_dissimilarity_first_seed": d_median,
      "selection": "CV on the first seed's training rows (held-out weighted log-loss), reused",
      "spread": "+-2 SE over seeds of the mean over writers",
      "estimate_s": estimate,
      "fixed": {k: specs[k]["fixed"] for k in strategies},
    },
    "chosen": chosen,
    "cv_best_loss": cv_scores,
    "table": table,
    "paired_accuracy_mean": (
      paired(per_seed, "accuracy_mean", lower_is_better=False) if "Karula" in per_seed else {}
    ),
    "per_seed": per_seed,
    "wall_time_s": time.perf_counter() - t_start,
  }
  md = femnist_markdown(result)
  log(md + f"[karula-femnist] total {result['wall_time_s']:.0f}s")
  if out_dir is not None:
    from fedjax_dro.records import atomic_write, json_text

    os.makedirs(out_dir, exist_ok=True)
    result["json_path"] = os.path.join(out_dir, "karula_femnist.json")
    result["png_path"] = plot_femnist(result, os.path.join(out_dir, "karula_femnist.png"))
    atomic_write(result["json_path"], json_text(result, indent=1))
    atomic_write(os.path.join(out_dir, "karula_femnist.md"), md)
    log(f"[karula-femnist] wrote {result['json_path']}, karula_femnist.md and karula_femnist.png")
  return result


def femnist_markdown(result: Dict[str, Any]) -> str:
  """The table of :func:`karula_femnist`'s result as markdown.

  Args:
    result: the dict :func:`karula_femnist` returns.
  """
  pairs = result.get("paired_accuracy_mean", {})
  s = result["setting"]
  lines = [
    f"{s['data']}; {s['writers']} writers, {len(s['seeds'])} seeds, {s['rounds']} rounds.",
    "",
    "| strategy | mean writer test accuracy (+-2SE) | writer quartiles | worst 10% of writers | "
    "chosen | Karula minus it (paired +-2SE) | Karula higher in |",
    "|---|---|---|---|---|---|---|",
  ]
  for label, r in result["table"].items():
    p = pairs.get(label)
    pd = f"{p['difference']:+.3f} +- {p['difference_2se']:.3f}" if p else "-"
    pw = f"{p['wins']} of {p['seeds']}" if p else "-"
    chosen = ", ".join(f"{k}={v:.3g}" for k, v in result["chosen"].get(label, {}).items())
    q = " / ".join(f"{v:.2f}" for v in r["writer_quartiles"])
    lines.append(
      f"| {label} | {r['accuracy_mean']:.3f} +- {r['accuracy_2se']:.3f} | {q} | "
      f"{r['writer_worst10']:.3f} | {chosen} | {pd} | {pw} |"
    )
  return "\n".join(lines) + "\n"


def plot_femnist(result: Dict[str, Any], path: str) -> str:
  """Figure 1's layout: the per-writer test accuracies (all seeds) of every strategy, as box
  plots with the mean over seeds (+-2 SE) as a dot; returns ``path``.

  Args:
    result: the dict :func:`karula_femnist` returns.
    path: the PNG to write.
  """
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  labels = list(result["table"])
  data = [np.concatenate([r["accuracy_per_writer"] for r in result["per_seed"][k]]) for k in labels]
  fig, ax = plt.subplots(figsize=(1.1 * len(labels) + 2, 3.6))
  ax.boxplot(data, showfliers=True, widths=0.6, flierprops={"markersize": 2})
  means = [result["table"][k]["accuracy_mean"] for k in labels]
  errs = [np.nan_to_num(result["table"][k]["accuracy_2se"]) for k in labels]
  ax.errorbar(range(1, len(labels) + 1), means, yerr=errs, fmt="o", color="C3", label="mean")
  ax.set_xticks(range(1, len(labels) + 1), labels)
  ax.set_ylabel("per-writer test accuracy")
  ax.set_title(f"{result['setting']['data']}: {result['setting']['writers']} writers", fontsize=9)
  ax.legend(fontsize=8, loc="lower right")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


__all__: Sequence[str] = [
  "karula_femnist",
  "femnist_markdown",
  "plot_femnist",
  "image_model",
  "standardize_pixels",
  "estimate_seconds",
  "STRATEGIES",
]
