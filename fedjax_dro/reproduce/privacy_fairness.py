"""What client-level differential privacy does to fairness: ``fedjax-dro reproduce
privacy-fairness``.

The question: distributionally robust federated algorithms reweight clients by their reported
losses, so that the worst clients improve; under client-level DP (DP-FedAvg: McMahan, Ramage,
Talwar, Zhang, arXiv:1710.06963; :func:`fedjax_dro.privacy.private`) those loss reports must be
clipped and noised too, and the robust algorithms' updates are sums with unequal weights, whose
noise is set by the largest weight. At the *same* epsilon, do AFL (Mohri, Sivek, Suresh,
"Agnostic Federated Learning", arXiv:1902.00146) and AgnosticFedAvg (Ro, Chen, Mathews, Mohri,
Suresh, "Communication-Efficient Agnostic Federated Averaging", arXiv:2104.02748) still lift
the worst-20% accuracy above FedAvg's, and at what cost in average accuracy? DR-DSGD (Ben
Issaid, Elgabli, Bennis, arXiv:2208.13810, federated form) is robust without loss reports: its
clients weight their own gradients by ``exp(loss / lambda)``, and only model updates leave them.

The task: the built-in synthetic softmax classification
(:func:`fedjax_dro.data.synthetic_classification`) over 200 clients with Dirichlet(0.5) label
skew and classes 1 apart, a softmax-regression model.

The protocol (:mod:`fedjax_dro.compare`, one comparison per privacy level):

* participation by Poisson sampling at rate ``q = 0.1`` (20 clients a round in expectation),
  every update clipped to ``C = 1`` and every reported loss to ``[0, B]`` with ``B = 2`` (above
  the initial model's loss ``ln 5``), for every strategy (not tuned);
* **matched epsilon**: FedAvg's and DR-DSGD's noise multiplier ``z``; AFL and AgnosticFedAvg
  release their
  losses besides their updates, so both their releases get ``sqrt(2) z``, whose composition is
  a Gaussian mechanism of multiplier ``z`` again: the same ``dp-accounting`` event, the same
  epsilon (checked before anything runs). A level with ``z = 0`` clips but adds no noise
  (epsilon infinite): the clipping's own effect;
* equal rounds (each round is one release, so equal rounds are equal privacy spent);
* the robustness parameters at their defaults (AFL's ``lr_lambda`` 0.1, AgnosticFedAvg's
  ``domain_lr`` 0.1, DR-DSGD's ``lam`` 2), not tuned;
* per seed, each strategy's step size chosen from three values by 2-fold cross-validation on
  the clients' training rows (the grid widened geometrically, up to twice, where the choice
  sits on an edge: the same rule for every strategy), scored on the reported metric (worst-20%
  accuracy); the mean
  accuracy is a further column. The selection runs are private runs too, but the choice among
  three step sizes is not accounted: the epsilon reported is the final run's (as in most
  federated DP studies);
* mean +- 2 standard errors over the seeds, paired differences against FedAvg.
"""

from __future__ import annotations

import math
import time
from typing import Any, Dict, Optional

import numpy as np

CLIP = 1.0
LOSS_BOUND = 2.0  # above the initial model's loss, ln 5 = 1.61: only outliers are clipped
DELTA = 1e-5
DEFAULTS = dict(num_clients=200, rate=0.1, rounds=100, num_seeds=3, levels=(0.0, 1.0, 2.0, 4.0))
QUICK = dict(num_clients=40, rate=0.25, rounds=6, num_seeds=2, levels=(0.0, 2.0))
STEPS = {
  "FedAvg": (0.03, 0.1, 0.3),
  "AFL": (0.1, 0.3, 1.0),
  "DR-DSGD": (0.03, 0.1, 0.3),
  "AgnosticFedAvg": (0.03, 0.1, 0.3),
}


def task(seed: int, num_clients: int):
  """The skewed federation of ``seed``: ``num_clients`` clients (Dirichlet(0.5) labels), 50 rows
  each on average, 5 classes whose means are 1 apart (class_sep 1: with clipping only, FedAvg
  reaches about 0.90 mean and 0.77 worst-20% accuracy in 100 rounds: room for both)."""
  from fedjax_dro.data.synthetic import synthetic_classification

  return synthetic_classification(
    seed, num_clients=num_clients, alpha=0.5, class_sep=1.0, examples_per_class=10 * num_clients
  )


def strategies(z: float, rate: float):
  """The four private strategies at FedAvg noise multiplier ``z`` (matched epsilon)."""
  from fedjax_dro import compare as C
  from fedjax_dro.algorithms import afl, agnostic_fedavg, dr_dsgd, fedavg
  from fedjax_dro.privacy import private

  zr = math.sqrt(2.0) * z  # both releases of the loss-reporting algorithms
  common = dict(local_steps=5, batch_size=10)
  dro = dict(rate=rate, delta=DELTA, loss_bound=LOSS_BOUND, loss_noise_multiplier=zr)
  return [
    C.Strategy(
      "FedAvg",
      lambda m: private(fedavg(m, weighting="uniform", **common), CLIP, z, rate=rate, delta=DELTA),
      {"client_lr": list(STEPS["FedAvg"])},
    ),
    C.Strategy(
      "AFL",
      lambda m: private(afl(m, batch_size=10), CLIP, zr, **dro),
      {"lr_w": list(STEPS["AFL"])},
      fixed={"lr_lambda": 0.1},
    ),
    C.Strategy(
      "DR-DSGD",
      lambda m: private(dr_dsgd(m, **common), CLIP, z, rate=rate, delta=DELTA),
      {"client_lr": list(STEPS["DR-DSGD"])},
      fixed={"lam": 2.0},
    ),
    C.Strategy(
      "AgnosticFedAvg",
      lambda m: private(agnostic_fedavg(m, **common), CLIP, zr, **dro),
      {"client_lr": list(STEPS["AgnosticFedAvg"])},
      fixed={"domain_lr": 0.1},
    ),
  ]


def matched_epsilon(z: float, rate: float, rounds: int, num_clients: int, model) -> float:
  """Every strategy's epsilon after ``rounds`` rounds; raises unless they are equal."""
  from fedjax_dro.algorithms.base import default_hparams
  from fedjax_dro.privacy.accounting import run_epsilon

  eps = {}
  for st in strategies(z, rate):
    alg = st.make(model)
    eps[st.label] = run_epsilon(alg.config, rounds, default_hparams(alg), num_clients)["epsilon"]
  values = list(eps.values())
  if any(not math.isclose(v, values[0], rel_tol=1e-9) for v in values):
    raise AssertionError(f"the strategies' epsilons differ: {eps}")
  return values[0]


def _accuracy_mean(model):
  from fedjax_dro.core.metrics import evaluate_clients

  def fn(models, ds):
    acc = evaluate_clients(model, models, ds.test, personalized=True)["accuracy"]
    return float(np.mean(np.asarray(acc)))

  return fn


def privacy_fairness(
  out_dir: Optional[str] = None,
  *,
  rounds: Optional[int] = None,
  quick: bool = False,
  seed: int = 0,
  verbose: bool = True,
) -> Dict[str, Any]:
  """Average and worst-20% accuracy against epsilon for FedAvg, AFL, DR-DSGD and AgnosticFedAvg
  at matched epsilon (module docstring). Writes ``privacy_fairness.{json,md,png}`` and each
  level's comparison record to ``out_dir``.

  Args:
    out_dir: output folder (None: nothing written).
    rounds: rounds of every run (default 100; quick: 6).
    quick: a smoke run (40 clients, two levels, two seeds).
    seed: the first seed (seeds ``seed, seed + 1, ...``).
    verbose: print progress and the tables.
  """
  from fedjax_dro import compare as C
  from fedjax_dro.reproduce.common import write_result

  t0 = time.perf_counter()
  cfg = dict(QUICK if quick else DEFAULTS)
  if rounds is not None:
    cfg["rounds"] = rounds
  for name in ("rounds",):
    if not isinstance(cfg[name], int) or isinstance(cfg[name], bool) or cfg[name] < 1:
      raise ValueError(f"{name} must be a positive integer, got {cfg[name]!r}")
  if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
    raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
  n, rate, r = cfg["num_clients"], cfg["rate"], cfg["rounds"]
  seeds = tuple(range(seed, seed + cfg["num_seeds"]))
  first = task(seeds[0], n)
  from fedjax_dro.models import builtin

  model = builtin.softmax_regression(first.train.x.shape[-1], first.num_classes)
  levels = []
  for z in cfg["levels"]:
    eps = matched_epsilon(z, rate, r, n, model)
    exp = C.Experiment(
      name=f"privacy_fairness_z{z:g}",
      data=lambda s: task(s, n),
      model=model,
      strategies=strategies(z, rate),
      protocol=C.Protocol(
        seeds=seeds,
        metric=C.Metric("accuracy", "worst20"),
        budget=C.Budget("rounds", rounds=r),
        selection="kfold",
        folds=2,
        max_widenings=2,
        reference="FedAvg",
      ),
      extra_metrics=[C.ExtraMetric("accuracy_mean", _accuracy_mean(model), higher_is_better=True)],
      description=f"privacy level z = {z:g} (FedAvg's; epsilon {eps:.3g} at delta {DELTA:g})",
    )
    record = C.compare(exp, out_dir, verbose=verbose).to_json()
    levels.append({"z": z, "epsilon": eps, "record": record})
  result = {
    "experiment": "privacy-fairness",
    "task": f"synthetic softmax classification, {n} clients, Dirichlet(0.5) labels, classes 1 apart",
    "rate": rate,
    "rounds": r,
    "clip": CLIP,
    "loss_bound": LOSS_BOUND,
    "delta": DELTA,
    "seeds": list(seeds),
    "levels": levels,
    "wall_time_s": time.perf_counter() - t0,
  }
  md = privacy_markdown(result)
  if verbose:
    print(md)
  write_result(out_dir, "privacy_fairness", result, md, plot=plot_privacy_fairness, quick=quick)
  return result


def _cell(entry: Dict[str, Any], key: Optional[str] = None) -> str:
  stats = entry if key is None else entry.get(key, {})
  mean, two_se = stats.get("mean"), stats.get("two_se")
  if mean is None:
    return "-"
  return f"{mean:.3f} +- {two_se:.3f}" if two_se is not None else f"{mean:.3f}"


def _epsilon(level) -> float:
  """A level's epsilon (inf when the JSON holds it as null: no noise)."""
  eps = level["epsilon"]
  return math.inf if eps is None else float(eps)


def rows(result: Dict[str, Any]):
  """``[(z, epsilon, label, worst20 {mean, two_se}, mean {mean, two_se})]`` of a result."""
  out = []
  for level in result["levels"]:
    for label, row in level["record"]["table"].items():
      out.append((level["z"], _epsilon(level), label, row["accuracy"], row["accuracy_mean"]))
  return out


def privacy_markdown(result: Dict[str, Any]) -> str:
  lines = [
    "# Privacy and fairness: FedAvg, AFL, DR-DSGD and AgnosticFedAvg at matched epsilon",
    "",
    f"{result['task']}; Poisson participation q = {result['rate']}, {result['rounds']} rounds, "
    f"clip C = {result['clip']}, losses clipped to [0, {result['loss_bound']}], delta = "
    f"{result['delta']:g}; seeds {result['seeds']}; mean +- 2 SE over the seeds. Each "
    "strategy's step chosen per seed by 2-fold cross-validation on worst-20% accuracy.",
    "",
    "| FedAvg z | epsilon | strategy | worst-20% accuracy | mean accuracy |",
    "|---|---|---|---|---|",
  ]
  for z, eps, label, worst, mean in rows(result):
    e = "inf (clip only)" if not math.isfinite(eps) else f"{eps:.3g}"
    lines.append(f"| {z:g} | {e} | {label} | {_cell(worst)} | {_cell(mean)} |")
  lines += [
    "",
    "Paired differences from FedAvg, worst-20% accuracy (mean +- 2 SE over the seeds; wins / "
    "losses):",
    "",
    "| FedAvg z | " + " | ".join(_others(result)) + " |",
    "|---|" + "---|" * len(_others(result)),
  ]
  for level in result["levels"]:
    paired = level["record"].get("paired", {}).get("accuracy", {})
    cells = []
    for label in _others(result):
      d = paired.get(label)
      cells.append(
        "-"
        if d is None
        else f"{d['difference']:+.3f} +- {d['difference_2se']:.3f} ({d['wins']} / {d['losses']})"
      )
    lines.append(f"| {level['z']:g} | " + " | ".join(cells) + " |")
  edges = [(lv["z"], e) for lv in result["levels"] for e in lv["record"].get("edges", [])]
  if edges:
    lines += [
      "",
      f"Choices left on a grid edge after widening ({len(edges)}; each level's own record lists "
      "them): "
      + "; ".join(
        f"z = {z:g} {e['strategy']} seed {e['seed']} {e['axis']} = {e['value']:.3g}"
        for z, e in edges
      )
      + ".",
    ]
  if result.get("wall_time_s") is not None:
    lines += ["", f"Wall time: {result['wall_time_s'] / 60:.0f} min."]
  return "\n".join(lines) + "\n"


def _others(result):
  """The strategies other than FedAvg, in the table's order."""
  labels = list(result["levels"][0]["record"]["table"]) if result["levels"] else []
  return [label for label in labels if label != "FedAvg"]


def plot_privacy_fairness(result: Dict[str, Any], path: str) -> str:
  """Worst-20% and mean accuracy against epsilon, one line per strategy (the clip-only level at
  the right edge, marked inf)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  data = rows(result)
  finite = [d[1] for d in data if math.isfinite(d[1])]
  right = 3 * max(finite) if finite else 1.0
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for ax, which, title in ((axes[0], 3, "worst-20% accuracy"), (axes[1], 4, "mean accuracy")):
    for label in dict.fromkeys(d[2] for d in data):
      pts = sorted(
        (d[1] if math.isfinite(d[1]) else right, d[which]) for d in data if d[2] == label
      )
      ax.errorbar(
        [p[0] for p in pts],
        [p[1]["mean"] for p in pts],
        yerr=[p[1]["two_se"] or 0.0 for p in pts],
        marker="o",
        capsize=3,
        label=label,
      )
    ax.set_xscale("log")
    ticks = sorted(set(finite)) + [right]
    ax.set_xticks(ticks, [f"{t:.3g}" for t in ticks[:-1]] + ["inf\n(no noise)"])
    ax.minorticks_off()
    ax.set_xlabel(f"epsilon (delta {result['delta']:g})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
