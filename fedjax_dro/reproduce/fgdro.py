"""``fedjax-dro reproduce fgdro-table7``: FGDRO's Appendix G Table 7 on the comparison harness.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization",
NeurIPS 2024, arXiv:2410.06369, Appendix G, Table 7: worst and average accuracy on imbalanced
CIFAR-10 (classes 0, 2, 4, 6, 8 cut to 20% of their training rows) split over 100 clients by
Dirichlet(0.3) and Dirichlet(10), a two-layer CNN, 20K local iterations of ``I = 32`` local
steps of batch 32 (625 rounds), step sizes tuned in ``{1e-4, 1e-3, 1e-2, 1e-1}``, the
moving-average weights of FGDRO-KL and FGDRO-KL-Adam in ``{0.01, 0.1, 0.2, 0.5}``, 3 seeds.
The data step is that of the code the paper cites for it (Shen et al., ICLR 2021;
:func:`~fedjax_dro.reproduce.fgdro_protocol.image_partition`).

The protocol (:mod:`fedjax_dro.compare`), every row alike. Per seed ``s``: the imbalance, the
Dirichlet partition and the split of the held-out set into validation and test halves are drawn
from ``s`` (:func:`table7_data`); every configuration is trained on all 100 clients and its
global model scored on the validation half; the chosen configuration is trained again with
seed ``s`` and reported on the test half; mean +- 2 SE over the seeds (ddof 1), paired
differences against FGDRO-KL. The held-out set is balanced (the CIFAR-10 test set; the digits'
held-out rows) and scores itself
(:class:`~fedjax_dro.reproduce.fgdro_protocol.ClassHeldOut`: ``Protocol(selection="domains")``
with a split that computes its own metrics): the metrics are the global model's accuracies per
class ``acc_c``, so selection on a validation half of the held-out set (never on the test half)
is the one that can see them. Each of the three reported accuracies is its own comparison,
selected on itself (:data:`METRICS`): worst class ``min_c acc_c``, worst client ``min_i sum_c
p_ic acc_c`` (client ``i``'s expected accuracy under its own training label mix) and the
clients' average ``mean_i sum_c p_ic acc_c``; the other two are recorded beside it from the
same chosen runs. The paper never defines "Worst Acc"; docs/reproductions/fgdro.md argues that
its numbers fit the worst class.

Rows: the paper's nine (FedAvg, SCAFFOLD, FedProx, FedAdam, DRFA, DR-DSGD, FGDRO-CVaR,
FGDRO-KL, FGDRO-KL-Adam) plus FedAvg-M (FGDRO-KL's momentum with uniform weights) and
LocalAdam. Every row has the same number of configurations by construction
(:func:`table7_strategies`): the paper's step sizes times four values of one second
hyper-parameter (:data:`AXES`: Tables 2 and 3's, :data:`fedjax_dro.reproduce.fgdro_wilds.SECOND_AXES`,
FedProx's ``mu`` and FedAdam's server step tuned beside the client step like every other row's;
FedAvg-M's and LocalAdam's moving-average weight on the paper's beta grid), 16 a row, widened at
edges by the harness' rule (up to 2 values an axis). FedAdam takes the paper's server update
(Reddi et al., no bias correction).

Two data paths:

* ``fgdro_table7(data_dir=DIR)``: the user's CIFAR-10 binary files
  (:func:`fedjax_dro.data.load_cifar10`), the paper's sizes and grids above.
* ``fgdro_table7()``: a *stand-in* on the 8x8 handwritten digits that ship with the package
  (:func:`fedjax_dro.data.digits.digits_dirichlet_with_extras`, the same data steps), 40 rounds of
  8 local steps of batch 8, 4 configurations a row (the paper's upper two step sizes
  ``{1e-2, 1e-1}`` times the middle two values of the row's second axis), not widened
  (:data:`STANDIN_WIDENINGS`: every choice then sits on an edge of its grid, and the table counts
  them). Its table is labelled
  a stand-in and the paper's CIFAR-10 numbers are printed in a separate table, never beside it.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence

import numpy as np

from fedjax_dro.reproduce.fgdro_protocol import (
  ALPHAS,
  FEDADAM_OPTIONS,
  KEPT_FRACTION,
  NUM_CLIENTS,
  PAPER_BETAS,
  PAPER_TABLE7,
  REDUCED_CLASSES,
  ClassHeldOut,
  image_partition,
  split_holdout,
)
from fedjax_dro.reproduce.fgdro_wilds import (
  ROWS,
  SECOND_AXES,
  cell,
  fgdro_experiment,
  table_strategies,
)

# The table's rows: the paper's nine (Tables 2 and 3's) with FedAvg-M after FedAdam and LocalAdam
# last.
TABLE7_ROWS = (
  ROWS[:4] + (("FedAvg-M", "fedavg_momentum"),) + ROWS[4:] + (("LocalAdam", "local_adam"),)
)
# Each row's second hyper-parameter (four values; 16 configurations a row with the step sizes).
AXES = {**SECOND_AXES, "FedAvg-M": ("beta3", PAPER_BETAS), "LocalAdam": ("beta3", PAPER_BETAS)}
# The reported accuracies, each its own comparison selected on itself: column -> split metric.
METRICS = {
  "worst class": "worst_class_accuracy",
  "worst client": "worst_client_accuracy",
  "average": "mean_client_accuracy",
}
# The stand-in's widening at edges: none (the paper's protocol: up to 2 values an axis). Its 2 x 2
# grids in about 20 minutes on 2 CPU cores; one widening would double that.
STANDIN_WIDENINGS = 0
# (rounds, local steps, batch, CNN widths) of the paper's protocol, the stand-in and --quick
SIZES = {
  "cifar10": (625, 32, 32, (32, 64)),
  "digits": (40, 8, 8, (8, 16)),
  "quick": (2, 2, 4, (8, 16)),
}


def table7_strategies(small: bool, local_steps: int, batch: int, only=None):
  """The eleven rows (:data:`TABLE7_ROWS`; ``only``: those labels and FGDRO-KL), each the
  paper's step sizes times its :data:`AXES` values: 16 configurations a row, 4 with ``small``
  (the upper two step sizes, the middle two values of the second axis)."""
  return table_strategies(
    small,
    local_steps,
    batch,
    NUM_CLIENTS,
    only,
    rows=TABLE7_ROWS,
    axes=AXES,
    options={"FedAdam": FEDADAM_OPTIONS},
  )


def table7_data(alpha: float, seed: int, images=None):
  """Seed ``seed``'s data of one partition: the imbalance and Dirichlet(``alpha``) split over 100
  clients, and the held-out set's stratified validation and test halves as
  :class:`~fedjax_dro.reproduce.fgdro_protocol.ClassHeldOut` (with the clients' label mixes), all
  drawn from ``seed``. ``images``: ``load_cifar10(DIR)``'s arrays; ``None``: the digits."""
  from fedjax_dro.data import FederatedDataset

  if images is None:
    from fedjax_dro.data.digits import digits_dirichlet_with_extras

    ds, extras = digits_dirichlet_with_extras(
      seed,
      num_clients=NUM_CLIENTS,
      alpha=alpha,
      reduced_classes=REDUCED_CLASSES,
      fraction=KEPT_FRACTION,
      split="climb",
    )
    train, proportions, held, classes = ds.train, extras.proportions, extras, ds.num_classes
    held_x, held_y = held.test_x, held.test_y
  else:
    classes = images.num_classes
    train, proportions = image_partition(images.x_train, images.y_train, classes, alpha, seed)
    held_x, held_y = images.x_test, images.y_test
  (vx, vy), (tx, ty) = split_holdout(held_x, held_y, seed)
  p = np.asarray(proportions, np.float32)
  return FederatedDataset(
    train=train,
    validation=ClassHeldOut(vx, vy, p),
    test=ClassHeldOut(tx, ty, p),
    task="classification",
    num_classes=classes,
    name=f"fgdro-table7-dir{alpha:g}",
  )


def fgdro_table7(
  out_dir: Optional[str] = None,
  *,
  rounds: Optional[int] = None,
  quick: bool = False,
  seed: int = 0,
  data_dir: Optional[str] = None,
  algorithms: Optional[Sequence[str]] = None,
  part=None,
  verbose: bool = True,
) -> Optional[Dict[str, Any]]:
  """Runs FGDRO's Table 7 on the harness (see the module docstring); writes
  ``fgdro_table7.{json,md}`` and each comparison (per partition and reported accuracy) to
  ``out_dir``.

  Args:
    out_dir: the output folder (``None``: nothing written).
    rounds: communication rounds (default 625 on CIFAR-10, 40 on the digits; 2 with ``quick``).
    quick: a smoke run: 2 rounds of 2 local steps of batch 4, two seeds, no widening.
    seed: the first seed (the seeds are ``seed, seed + 1, seed + 2``).
    data_dir: the CIFAR-10 binary files (``cifar-10-batches-bin`` or its parent): the paper's
      protocol. ``None``: the digits stand-in.
    algorithms: a subset of the rows by label (default: all eleven; FGDRO-KL, the reference, is
      always run).
    part: ``(i, N)`` or ``"i/N"``: only every N-th run of each comparison, for N machines;
      ``fedjax-dro merge`` joins the parts (returns ``None`` for a part).
    verbose: print progress and the tables.
  """
  from fedjax_dro import models
  from fedjax_dro.reproduce.common import run_tables

  stand_in = data_dir is None
  sizes = SIZES["quick" if quick else "digits" if stand_in else "cifar10"]
  rounds = sizes[0] if rounds is None else rounds
  if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
    raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
  if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
    raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
  labels = [label for label, _ in TABLE7_ROWS]
  if algorithms is not None and (not algorithms or set(algorithms) - set(labels)):
    raise ValueError(f"algorithms must be a non-empty subset of {labels}, got {algorithms!r}")
  images = None
  if not stand_in:
    from fedjax_dro.data import load_cifar10

    images = load_cifar10(data_dir)
  _, local_steps, batch, features = sizes
  seeds = (seed, seed + 1) if quick else (seed, seed + 1, seed + 2)
  strategies = table7_strategies(stand_in, local_steps, batch, algorithms)
  first = table7_data(ALPHAS[0], seed, images)
  shape = tuple(first.train.x.shape[2:])
  model = models.cnn(shape, first.num_classes, features=features, dense=None, conv="patches")
  drawn = {(ALPHAS[0], seed): first}  # one data object per partition and seed: trained once

  def seed_data(alpha, s):
    if (alpha, s) not in drawn:
      drawn[alpha, s] = table7_data(alpha, s, images)
    return drawn[alpha, s]

  experiments = {}
  for alpha in ALPHAS:
    for column, metric in METRICS.items():
      key = f"dir{alpha:g}_{metric}"
      experiments[key] = fgdro_experiment(
        f"fgdro_table7_{key}",
        f"FGDRO Table 7, Dirichlet({alpha:g}), {column} accuracy",
        lambda s, a=alpha: seed_data(a, s),
        model,
        strategies,
        metric,
        [m for m in METRICS.values() if m != metric],
        rounds=rounds,
        seeds=seeds,
        quick=quick,
        stand_in=stand_in,
        data_name="fgdro-table7",
        max_widenings=STANDIN_WIDENINGS if stand_in else None,
      )
  data = (
    "STAND-IN: handwritten digits 8x8 (UCI, shipped), not CIFAR-10"
    if stand_in
    else f"CIFAR-10 (binary files in {os.path.abspath(data_dir)})"
  )
  return run_tables(
    "fgdro-table7",
    experiments,
    markdown_table,
    out_dir,
    verbose,
    quick=quick,
    part=part,
    trained={},
    stand_in=stand_in,
    data=data,
    alphas=list(ALPHAS),
    metrics=METRICS,
    rounds=rounds,
    local_steps=local_steps,
    batch_size=batch,
    features=list(features),
    paper_table7_cifar10={k: {f"{a:g}": v for a, v in d.items()} for k, d in PAPER_TABLE7.items()},
  )


def _paired(entry) -> str:
  """A paired-difference cell: the mean difference, its 95% interval, the wins and Holm's p."""
  if entry is None:
    return "(reference)"
  low, high = entry["ci95_low"], entry["ci95_high"]
  p = entry.get("holm_p", entry["p_value"])
  p = "-" if p is None or p != p else f"{p:.2g}"  # no spread (identical seeds): no test
  return (
    f"{entry['difference']:+.3f} [{low:+.3f}, {high:+.3f}] ({entry['wins']} of "
    f"{entry['seeds']}, p = {p})"
  )


def markdown_table(result: Dict[str, Any]) -> str:
  """Table 7's layout per Dirichlet alpha: each accuracy (mean +- 2 SE over seeds, from the
  comparison selected on it) and its paired difference to FGDRO-KL, the configurations and edges
  per row; then the chosen configuration per seed and accuracy; the paper's CIFAR-10 numbers in
  their own table under a stand-in."""
  stand_in = result["stand_in"]
  title = "# FGDRO Table 7 on the comparison harness"
  lines = [title + (" (STAND-IN: 8x8 digits, not CIFAR-10)" if stand_in else ""), ""]
  results = result["results"]
  columns = result["metrics"]
  for alpha in result["alphas"]:
    records = {c: results[f"dir{alpha:g}_{m}"] for c, m in columns.items()}
    head = ["row"] + [f"{c}" for c in columns] + [f"{c} minus FGDRO-KL" for c in columns]
    head += ["configs", "edges", "failures"]
    lines += [f"## Dirichlet({alpha:g})", "", "| " + " | ".join(head) + " |"]
    lines.append("|" + "---|" * len(head))
    some = next(iter(records.values()))
    for label in some["table"]:
      cells = [label] + [cell(r["table"][label][columns[c]]) for c, r in records.items()]
      cells += [_paired(r["paired"][columns[c]].get(label)) for c, r in records.items()]
      cells.append(" / ".join(f"{r['table'][label]['configurations']:g}" for r in records.values()))
      cells.append(
        " / ".join(str(sum(e["strategy"] == label for e in r["edges"])) for r in records.values())
      )
      cells.append(" / ".join(str(r["table"][label]["failures"]) for r in records.values()))
      lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Chosen configuration per seed (selected on each accuracy):", ""]
    for c, r in records.items():
      for label, rows in r["per_seed"].items():
        chosen = "; ".join(
          f"seed {row['seed']}: "
          + (
            "failed"
            if row["failed"]
            else ", ".join(f"{k}={v:g}" for k, v in sorted(row["chosen"].items()))
          )
          for row in rows
        )
        lines.append(f"- {c}, {label}: {chosen}")
    lines.append("")
  lines += [
    "Each accuracy is its own comparison, selected per seed on that accuracy of the validation "
    "half of the balanced held-out set and reported on the test half (mean +- 2 SE over "
    "seeds, ddof 1); 'minus FGDRO-KL': the paired difference, its 95% t-interval, the seeds "
    "where the row is ahead and the paired t-test p (Holm-adjusted when a table has more "
    "than three comparisons); configs / edges / failures per accuracy (worst class / worst client / "
    f"average). {result['rounds']} rounds of {result['local_steps']} local steps of "
    f"{result['batch_size']} rows; seeds, budgets and every grid point in the comparisons' "
    "records.",
    "",
  ]
  lines.append("The paper's Table 7 (CIFAR-10, its 'Worst Acc' / 'Average Acc'), for reference:")
  lines.append("")
  alphas = result["alphas"]
  lines.append(
    "| algorithm | " + " | ".join(f"Dir({a:g}) worst | Dir({a:g}) average" for a in alphas) + " |"
  )
  lines.append("|---" * (1 + 2 * len(alphas)) + "|")
  for label, by_alpha in result["paper_table7_cifar10"].items():
    cells = [f"{by_alpha[f'{a:g}'][i]:.3f}" for a in alphas for i in (0, 2)]
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"
