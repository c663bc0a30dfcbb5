"""Karula (Erickson and Johansson, "Personalized Federated Learning under Model Dissimilarity
Constraints", arXiv:2505.07575), Sec. 5.3 and Figure 1: personalized CNNs on handwritten digits,
one writer per client (``fedjax-dro reproduce karula-femnist``), as controlled comparisons on
:mod:`fedjax_dro.compare`.

The paper trains on LEAF's federated handwritten digits (the digit classes 0-9 of FEMNIST, one
writer per client) and shows the per-writer test accuracies of Local, FedSGD, FedAvg, pFedMe,
IFCA and Karula. It gives no network, round count or grid for this experiment; the choices below
are ours, made to fit a 2-core CPU.

Data. With ``leaf_dir``: LEAF FEMNIST files, reduced to the digits
(:func:`fedjax_dro.data.load_femnist_digits`, at most ``max_writers`` writers, 16x16 images; the
same data for every seed). Without: the stand-in :func:`fedjax_dro.data.digits_by_writer` (40
writers of 40 digits by default, not FEMNIST) whose writer styles vary by group *and* continuously between
the groups (``style_mixing=0.5``), a new set of writers per seed. Pixels are standardized with the
pooled mean and standard deviation of the training rows (:func:`standardize_pixels`).

Model: :func:`image_model`, two 3x3 conv + ReLU + 2x2 max-pool blocks of (8, 16) channels and a
linear head (about 3,800 parameters).

Strategies: every one weights its clients' losses by their sample counts and, as in the paper's
Sec. 5.1, a third of the writers take part in each round (Karula: its SAGA variant with ``s = n /
3``). FedAvg, IFCA, Ditto and Local run ``LOCAL_STEPS`` full-batch local steps; pFedMe is its
paper's Algorithm 1 (every writer updates its personalized model) with one local step of
``PFEDME_PERSONAL_STEPS`` inner steps; FedSGD and Karula take one full gradient per participant.
Every strategy tunes its step on its own geometric grid (Karula: ``eta`` in units of ``n``, a
block step of the same size as FedSGD's); the personalized ones tune their parameter on top
(pFedMe's and Ditto's ``lam``, IFCA's number of clusters 1..10 as in Table 1a, Karula's ``t`` in
multiples of ``1 / median D``). Ditto is off by default (``strategies=``).

Protocol: per seed, every strategy's configuration is selected on a hold-out of a fifth of each
writer's *training* rows, by the held-out accuracy (the table's metric), after
``SELECTION_ROUNDS`` rounds, every geometric axis widened while its choice sits on an edge (up to
``MAX_WIDENINGS`` values per axis; the choices still on an edge are listed). The chosen configuration is then
trained on all training rows under three budgets, one table each (the selection is shared):

1. to a validation plateau (held-out accuracy every 5 rounds, stopped after 3 evaluations
   without a relative gain of 0.1%, at most ``PLATEAU_CAP`` rounds), the plateau round found on
   the selection's split and the final model retrained for that many rounds;
2. at equal uploads: what FedAvg uploads in ``MATCH_ROUNDS`` rounds;
3. at equal client gradient evaluations: what FedAvg evaluates in ``MATCH_ROUNDS`` rounds.

The equal-cost budgets are capped at ``5 * MATCH_ROUNDS`` rounds; Local uploads nothing, so its
rounds at equal uploads are that cap. Karula's
dissimilarities on images: :data:`IMAGE_OT_OPTIONS` (the paper's settings, pixels and label as one
point, a pooled reference set of 64 real training rows).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from fedjax_dro import compare as C
from fedjax_dro.common.checks import integer
from fedjax_dro.compare.report import capped_runs
from fedjax_dro.reproduce.common import edges_line, paired_difference, run_tables

STRATEGIES = ("Local", "FedSGD", "FedAvg", "pFedMe", "IFCA", "Karula")
ALL_STRATEGIES = ("Local", "FedSGD", "FedAvg", "pFedMe", "IFCA", "Ditto", "Karula")
LOCAL_STEPS = 5
PFEDME_PERSONAL_STEPS = 2
PARTICIPATION = 1.0 / 3.0  # the share of writers per round (the paper's Sec. 5.1)
STEPS = (0.1, 0.3, 1.0)  # every step grid (Karula: eta / n)
T_MULTIPLES = (0.1, 1.0, 10.0)
LAMS = (0.3, 3.0)
IFCA_CLUSTERS = tuple(range(1, 11))
SELECTION_ROUNDS = 15
MAX_WIDENINGS = 3  # values added beyond an axis's edge, per axis, strategy and seed
PLATEAU_CAP = 60
MATCH_ROUNDS = 30
STYLE_MIXING = 0.5
IMAGE_OT_OPTIONS = {"preset": "paper", "reference_method": "pooled", "num_reference": 64}
DEFAULTS = dict(num_seeds=3, num_writers=40, examples_per_writer=40, image_size=16)
QUICK = dict(num_seeds=2, num_writers=8, examples_per_writer=10, image_size=8)
BUDGETS = ("plateau", "uploads", "gradients")


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


def strategy_rows(n: int, d_median: float, ot_options, labels=STRATEGIES, quick=False):
  """The rows on the harness (see the module docstring).

  Args:
    n: writers.
    d_median: the median off-diagonal dissimilarity (the unit of Karula's ``t``).
    ot_options: Karula's dissimilarity options.
    labels: which rows, in order, out of :data:`ALL_STRATEGIES`.
    quick: one value per axis (a smoke run).
  """
  from fedjax_dro import algorithms as A

  few = (lambda v: list(v)[:1]) if quick else list
  s = max(2, int(round(PARTICIPATION * n)))
  w = dict(weighting="num_examples")
  k = LOCAL_STEPS
  no_param = "no personalization parameter: its step grid only"
  rows = {
    "Local": C.Strategy(
      "Local",
      lambda m: A.local(m, clients_per_round=s, local_steps=k),
      {"client_lr": few(STEPS)},
      note=no_param,
    ),
    "FedSGD": C.Strategy(
      "FedSGD", lambda m: A.fedsgd(m, clients_per_round=s, **w), {"lr": few(STEPS)}, note=no_param
    ),
    "FedAvg": C.Strategy(
      "FedAvg",
      lambda m: A.fedavg(m, clients_per_round=s, local_steps=k, **w),
      {"client_lr": few(STEPS)},
      fixed={"server_lr": 1.0},
      note=no_param,
    ),
    "pFedMe": C.Strategy(
      "pFedMe",
      lambda m: A.pfedme(
        m,
        clients_per_round=s,
        local_steps=1,
        personal_steps=PFEDME_PERSONAL_STEPS,
        batch_size=None,
        personal_updates="all",
        **w,
      ),
      {"lam": few(LAMS), "client_lr": few(STEPS)},
      fixed={"personal_lr": 0.05, "beta": 1.0},
      note="lam times the step grid",
    ),
    "IFCA": C.Strategy(
      "IFCA",
      lambda m, num_clusters=2: A.ifca(
        m, num_clusters=num_clusters, clients_per_round=s, local_steps=k, **w
      ),
      {"num_clusters": few(IFCA_CLUSTERS), "client_lr": few(STEPS)},
      note="number of clusters 1..10 (as Table 1a) times the step grid",
    ),
    "Ditto": C.Strategy(
      "Ditto",
      lambda m: A.ditto(m, clients_per_round=s, local_steps=k, **w),
      {"lam": few(LAMS), "client_lr": few(STEPS)},
      fixed={"personal_lr": 0.1},
      note="lam times the step grid",
      paper=False,
    ),
    "Karula": C.Strategy(
      "Karula",
      lambda m: A.karula(m, clients_per_round=s, ot_options=ot_options, **w),
      {"t": few([c / d_median for c in T_MULTIPLES]), "eta": few([n * v for v in STEPS])},
      note="t times the step grid",
    ),
  }
  return [rows[k] for k in labels]


def budgets(quick: bool = False) -> Dict[str, C.Budget]:
  """The three budgets of the tables (module docstring); quick: a few rounds."""
  cap, match, every = (12, 6, 2) if quick else (PLATEAU_CAP, MATCH_ROUNDS, 5)
  return {
    "plateau": C.Budget("plateau", cap=cap, every=every, patience=3, min_delta=1e-3),
    "uploads": C.Budget("uploads", match="FedAvg", rounds=match, cap=5 * match),
    "gradients": C.Budget("gradients", match="FedAvg", rounds=match, cap=5 * match),
  }


def karula_femnist(
  out_dir: Optional[str] = None,
  *,
  rounds: Optional[int] = None,
  quick: bool = False,
  seed: int = 0,
  num_seeds: Optional[int] = None,
  leaf_dir: Optional[str] = None,
  max_writers: int = 100,
  num_writers: Optional[int] = None,
  features: Sequence[int] = (8, 16),
  strategies: Sequence[str] = STRATEGIES,
  verbose: bool = True,
) -> Dict[str, Any]:
  """Karula Sec. 5.3 on the harness; writes ``karula_femnist_<budget>.{json,md,png}`` (one
  harness record per budget) and ``karula_femnist.{json,md}`` (the three tables) to ``out_dir``.

  Args:
    out_dir: output folder (``None``: nothing written).
    rounds: FedAvg's rounds that set the equal-upload and equal-gradient budgets (default 30).
    quick: a smoke run (8 writers of 10 digits at 8x8, 2 seeds, one value per grid axis, a few
      rounds).
    seed: the first seed; the seeds are ``seed, ..., seed + num_seeds - 1`` (the stand-in: a new
      set of writers per seed; LEAF: the same data, new initializations and samples).
    num_seeds: seeds (default 3; quick: 2).
    leaf_dir: LEAF FEMNIST folder (:func:`fedjax_dro.data.load_femnist_digits`); ``None``: the
      stand-in.
    max_writers: the most LEAF writers kept (the first ones in file order).
    num_writers: writers of the stand-in (default 40; quick: 8).
    features: the CNN's conv channels.
    strategies: labels out of :data:`ALL_STRATEGIES`, in table order.
    verbose: print progress and tables.
  """
  from fedjax_dro.data import load_femnist_digits
  from fedjax_dro.data.femnist_digits import digits_by_writer
  from fedjax_dro.ot import dissimilarity_matrix

  labels = tuple(strategies) if not isinstance(strategies, str) else strategies
  q = QUICK if quick else DEFAULTS
  num_seeds = q["num_seeds"] if num_seeds is None else num_seeds
  num_writers = q["num_writers"] if num_writers is None else num_writers
  for name, value, low in (
    ("num_seeds", num_seeds, 1),
    ("num_writers", num_writers, 2),
    ("max_writers", max_writers, 2),
    ("seed", seed, 0),
  ):
    integer(value, name, minimum=low)
  if rounds is not None:
    integer(rounds, "rounds")
  if (
    isinstance(labels, str)
    or not labels
    or len(set(labels)) != len(labels)
    or any(s not in ALL_STRATEGIES for s in labels)
  ):
    raise ValueError(f"strategies must be distinct labels out of {ALL_STRATEGIES}, got {labels}")
  if "FedAvg" not in labels:
    raise ValueError("strategies must include FedAvg (it sets the equal-cost budgets)")
  if leaf_dir is not None and not os.path.isdir(os.fspath(leaf_dir)):
    raise ValueError(f"leaf_dir {os.fspath(leaf_dir)!r} is not an existing directory")
  size = q["image_size"]

  def data(data_seed):
    if leaf_dir is not None:
      ds = load_femnist_digits(leaf_dir, max_writers=max_writers, image_size=size, seed=seed)
    else:
      ds = digits_by_writer(
        num_writers,
        examples_per_writer=q["examples_per_writer"],
        image_size=size,
        seed=data_seed,
        style_mixing=STYLE_MIXING,
      )
    return standardize_pixels(ds)

  seeds = tuple(range(int(seed), int(seed) + int(num_seeds)))
  first = data(seeds[0])
  n = first.num_clients
  if n < 2:
    raise ValueError(f"the data have {n} writer(s); at least 2 are needed")
  total = int(np.asarray(first.train.num_examples).sum())
  # N0 = 64 pooled reference rows, fewer when a selection split has fewer rows (quick runs)
  ot_options = {**IMAGE_OT_OPTIONS, "num_reference": min(64, total // 2)}
  d_median = 1.0  # the unit of Karula's t: the median dissimilarity (needed with Karula only)
  if "Karula" in labels:
    D = np.asarray(
      dissimilarity_matrix(first.train.x, first.train.y, first.train.mask, **ot_options)
    )
    d_median = float(np.median(D[~np.eye(n, dtype=bool)]))
  model = image_model(size, features if not quick else (4, 8))
  rows = strategy_rows(n, d_median, ot_options, labels, quick)
  plan = budgets(quick)
  if rounds is not None:
    plan = {k: dataclasses.replace(b, rounds=rounds) if b.match else b for k, b in plan.items()}
  data_name = "LEAF FEMNIST digits" if leaf_dir else "stand-in: digits_by_writer (not FEMNIST)"
  experiments = {
    key: C.Experiment(
      name=f"karula_femnist_{key}",
      data=data,
      model=model,
      strategies=rows,
      protocol=C.Protocol(
        seeds=seeds,
        metric=C.Metric("accuracy", "mean"),
        budget=budget,
        selection="holdout",
        holdout=0.2,
        selection_rounds=2 if quick else SELECTION_ROUNDS,
        max_widenings=0 if quick else MAX_WIDENINGS,
        reference="FedAvg",
      ),
      extra_metrics=[
        C.ExtraMetric("worst 10% of writers", _worst_writers(model), higher_is_better=True)
      ],
      description=f"Karula Sec. 5.3, {first.description if leaf_dir is None else data_name}",
    )
    for key, budget in plan.items()
  }
  return run_tables(
    "karula-femnist",
    experiments,
    femnist_markdown,
    out_dir,
    verbose,
    selections={},  # one selection per strategy and seed, shared by the three budgets
    quick=quick,
    data=data_name,
    writers=n,
    train_rows_per_writer=int(np.asarray(first.train.num_examples).max()),
    karula_ot_options=ot_options,
    median_dissimilarity_first_seed=d_median,
  )


def _worst_writers(model):
  """The mean test accuracy of the worst tenth of the writers."""
  from fedjax_dro.core.metrics import evaluate_clients

  def worst(models, ds):
    acc = np.sort(
      np.asarray(evaluate_clients(model, models, ds.test, personalized=True)["accuracy"])
    )
    return float(acc[: max(1, acc.size // 10)].mean())

  return worst


def femnist_markdown(result: Dict[str, Any]) -> str:
  """The three tables side by side: mean writer test accuracy (+-2SE) per budget, the rounds
  each strategy got (with the seeds whose run the budget's cap stopped), and the difference to
  FedAvg paired over seeds; under it the choices left on a grid edge (one selection for the
  three budgets) and the capped runs per budget.

  Args:
    result: what :func:`karula_femnist` returns.
  """
  keys = list(result["results"])
  first = result["results"][keys[0]]
  head = ["strategy"]
  for k in keys:
    head += [f"{k}: accuracy", f"{k}: rounds", f"{k}: minus FedAvg (wins)"]
  lines = [
    f"{result['data']}; {result['writers']} writers.",
    "",
    "| " + " | ".join(head) + " |",
    "|" + "---|" * len(head),
  ]
  for s in first["strategies"]:
    cells = [s["label"] + ("" if s["paper"] else " (not in the paper)")]
    for k in keys:
      r = result["results"][k]
      t = r["table"][s["label"]]
      d = r["paired"]["accuracy"].get(s["label"])
      capped = sum(bool(row.get("at_cap")) for row in r["per_seed"][s["label"]])
      cells += [
        f"{t['accuracy']['mean']:.3f} +- {t['accuracy']['two_se']:.3f}",
        f"{t['rounds']:.0f}" + (f" ({capped} of {t['seeds']} at the cap)" if capped else ""),
        paired_difference(d),
      ]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", edges_line(first)[:-1] + " (one selection for the three budgets)."]
  for k in keys:
    r = result["results"][k]
    capped = capped_runs(r) or []
    lines.append(
      f"{k} ({r['protocol']['budget']}): runs stopped by the cap: "
      + ("; ".join(capped) or "none")
      + "."
    )
  return "\n".join(lines) + "\n"


__all__: Sequence[str] = [
  "karula_femnist",
  "femnist_markdown",
  "strategy_rows",
  "budgets",
  "image_model",
  "standardize_pixels",
  "STRATEGIES",
  "ALL_STRATEGIES",
]
