"""The data of the SCAFF-PD Table 1 reproduction (:mod:`fedjax_dro.reproduce.scaffpd_table1`): the
paper's partition (a per-class Dirichlet label skew, then 30% of the clients lose 70% of their
rows), the stand-in's parameters, every client's validation and test sets drawn with its label
mix, and the closed-form centralized classifier that measures how hard the classes are."""

from __future__ import annotations

import math
import os
from typing import Any, Dict

import numpy as np

NUM_CLIENTS = 20
REDUCED_FRACTION, REMOVED_FRACTION = 0.3, 0.7  # 30% of the clients lose 70% of their rows
MIN_EXAMPLES = 10  # Dirichlet redraws until every client has this many rows (before the removal)
HOLDOUT_FRACTION = 1 / 6  # held-out share of every class when the file has no split
EVAL_ROWS = 500  # rows of every client's validation and test sets
# the stand-in: CIFAR-100's counts (500 / 100 rows per class), classes of different difficulty
STAND_IN = {
  "num_classes": 100,
  "dim": 128,
  "train_per_class": 500,
  "test_per_class": 100,
  "separation": 4.0,
  "hardness": 0.4,
}
QUICK_STAND_IN = dict(STAND_IN, dim=16, train_per_class=12, test_per_class=4)
STAND_IN_SEED = 0  # the stand-in is one fixed data set, as a features file is

# every Table 1 row's client weighting, as the table names it
WEIGHTING = {
  "FedAvg": "uniform (ERM of eq. (1.1)'s centre)",
  "SCAFFOLD": "uniform (ERM of eq. (1.1)'s centre)",
  "q-FFL": "F_i^q / sum_j F_j^q (q-FFL objective)",
  "AFL": "minimax over the simplex (rho = 0)",
  "DRFA": "chi^2 DRO, rho = 0.1, centre uniform",
  "AgnosticFedAvg": "exponentiated-gradient weights",
  "SCAFF-PD": "chi^2 DRO, rho = 0.1, centre uniform",
}


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


def centralized_class_accuracy(x_train, y_train, x_test, y_test, num_classes: int) -> np.ndarray:
  """``[num_classes]`` per-class test accuracy of a centralized linear classifier fitted in
  closed form: the nearest class mean, ``argmax_c mu_c . x - ||mu_c||^2 / 2`` with ``mu_c`` the
  training mean of class ``c`` (NaN for a class without test rows). It shows how much the
  classes differ in difficulty, without any federated training."""
  x_train, x_test = np.asarray(x_train, np.float64), np.asarray(x_test, np.float64)
  mu = np.zeros((num_classes, x_train.shape[1]))
  present = np.zeros(num_classes, bool)
  for c in np.unique(y_train):
    mu[c], present[c] = x_train[y_train == c].mean(0), True
  scores = x_test @ mu.T - 0.5 * np.sum(mu**2, 1)
  scores[:, ~present] = -np.inf
  correct = np.argmax(scores, 1) == y_test
  return np.array(
    [correct[y_test == c].mean() if np.any(y_test == c) else np.nan for c in range(num_classes)]
  )


class TableData:
  """The features, their training / held-out rows and every seed's partition, built once; a
  call ``(alpha, seed)`` gives that seed's :class:`~fedjax_dro.data.FederatedDataset`.
  ``log`` is told the size of the work before each long step (reading a large file, the
  centralized fit, the partitions)."""

  def __init__(self, features, quick: bool, alphas, seeds, log=lambda *a, **k: None):
    from fedjax_dro.data import load_features
    from fedjax_dro.data.standins import gaussian_mixture_features

    if features is None:
      params = dict(QUICK_STAND_IN if quick else STAND_IN, seed=STAND_IN_SEED)
      self.fs = gaussian_mixture_features(**params)
      self.description = {
        "name": "stand-in (Gaussian mixture, classes of different difficulty)",
        "stand_in": True,
        "source": "fedjax_dro.data.standins.gaussian_mixture_features",
        "parameters": params,
        "note": "STAND-IN: a class-conditional Gaussian mixture, not CIFAR-100 / TinyImageNet "
        "ResNet-18 features",
      }
    else:
      size = os.path.getsize(features) if os.path.isfile(features) else 0
      log(f"reading the features file {features} ({size / 1e6:.1f} MB)")
      self.fs = load_features(features)
      name = os.path.splitext(os.path.basename(os.fspath(features)))[0]
      self.description = {
        "name": name,
        "stand_in": False,
        "source": os.path.basename(os.fspath(features)),
      }
    fs = self.fs
    if fs.split is None:
      rng = np.random.default_rng(7919)
      held = np.zeros(fs.labels.size, bool)
      for c in np.unique(fs.labels):
        rows = rng.permutation(np.flatnonzero(fs.labels == c))
        held[rows[: int(round(HOLDOUT_FRACTION * rows.size))]] = True
    else:
      held = np.asarray(fs.split, bool)
    self.train, self.held = np.flatnonzero(~held), np.flatnonzero(held)
    y_train, y_held = fs.labels[self.train], fs.labels[self.held]
    short = [int(c) for c in np.unique(y_train) if np.count_nonzero(y_held == c) < 2]
    if short:
      raise ValueError(
        f"features {self.description['source']}: classes {short[:10]} have fewer than 2 "
        "held-out rows; every training class needs >= 2 (one for validation, one for test)"
      )
    self.num_classes, self.dim = int(fs.num_classes), int(fs.features.shape[1])
    log(
      f"{fs.labels.size:,} rows x {self.dim} features, {self.num_classes} classes "
      f"({fs.features.nbytes / 1e6:.1f} MB): the centralized per-class fit, then "
      f"{len(alphas) * len(seeds)} partitions ({len(alphas)} alphas x {len(seeds)} seeds)"
    )
    self.class_accuracy = centralized_class_accuracy(
      fs.features[self.train], y_train, fs.features[self.held], y_held, self.num_classes
    )
    self.parts = {(a, s): table1_partition(y_train, a, seed=s) for a in alphas for s in seeds}
    # one padded shape for every alpha and seed: each algorithm compiles once
    self.max_rows = max(r.size for p in self.parts.values() for r in p["clients"])

  def __call__(self, alpha: float, seed: int):
    from fedjax_dro.data import FederatedDataset, from_client_arrays
    from fedjax_dro.data.digits import label_proportions
    from fedjax_dro.data.partition import rows_with_label_mix

    x, y = self.fs.features, self.fs.labels
    clients = [self.train[r] for r in self.parts[(alpha, seed)]["clients"]]
    props = label_proportions([y[r] for r in clients], self.num_classes)
    rng = np.random.default_rng([seed, 7919])
    halves = ([], [])
    for c in np.unique(y[self.held]):
      rows = rng.permutation(self.held[y[self.held] == c])
      halves[0].extend(rows[: rows.size // 2])
      halves[1].extend(rows[rows.size // 2 :])
    sets = []
    for k, pool in enumerate(halves):
      pool = np.sort(np.asarray(pool, np.int64))
      rows = [
        pool[rows_with_label_mix(y[pool], p, EVAL_ROWS, seed=(seed * NUM_CLIENTS + i) * 2 + k)]
        for i, p in enumerate(props)
      ]
      sets.append(from_client_arrays([x[r] for r in rows], [y[r] for r in rows]))
    train = from_client_arrays([x[r] for r in clients], [y[r] for r in clients])
    return FederatedDataset(
      train=train.pad_to(self.max_rows),
      test=sets[1],
      validation=sets[0],
      task="classification",
      num_classes=self.num_classes,
      name=f"scaffpd-table1 alpha={alpha:g}",
      description=f"{self.description['name']}, Dir({alpha:g}) over {NUM_CLIENTS} clients",
    )

  def partition_summary(self, alpha: float, seed: int) -> Dict[str, Any]:
    from fedjax_dro.data.digits import label_proportions

    part, y = self.parts[(alpha, seed)], self.fs.labels[self.train]
    props = label_proportions([y[r] for r in part["clients"]], self.num_classes)
    return {
      "seed": seed,
      "client_rows_before_removal": [int(r.size) for r in part["before"]],
      "client_rows": [int(r.size) for r in part["clients"]],
      "reduced_clients": part["reduced"],
      "classes_per_client": [int(np.count_nonzero(p)) for p in props],
      # sum_c p_ic acc_c of the centralized nearest-class-mean classifier: how hard each
      # client's classes are
      "client_centralized_accuracy": [float(v) for v in props @ self.class_accuracy],
    }
