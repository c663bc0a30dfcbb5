"""What client-level differential privacy does to fairness: ``fedjax-dro reproduce
privacy-fairness``.

The question: distributionally robust federated algorithms reweight clients by their reported
losses, so that the worst clients improve; under client-level DP (DP-FedAvg: McMahan, Ramage,
Talwar, Zhang, arXiv:1710.06963; :func:`fedjax_dro.privacy.private`) those loss reports must be
clipped and noised too, and the robust algorithms' updates are sums with unequal weights, whose
noise is set by the largest weight. At the *same* epsilon, do the DRO algorithms still lift the
worst-20% accuracy above FedAvg's, and at what cost in average accuracy? The strategies:

* loss reporters, whose server reweights clients by released losses: AFL (Mohri, Sivek, Suresh,
  "Agnostic Federated Learning", arXiv:1902.00146), AgnosticFedAvg (Ro, Chen, Mathews, Mohri,
  Suresh, "Communication-Efficient Agnostic Federated Averaging", arXiv:2104.02748), DRFA (Deng,
  Kamani, Mahdavi, "Distributionally Robust Federated Averaging", arXiv:2102.12660), q-FFL (Li,
  Sanjabi, Beirami, Smith, "Fair Resource Allocation in Federated Learning", arXiv:1905.10497)
  and SCAFF-PD (Yu, Wei, Karimireddy, Ma, Jordan, arXiv:2307.13381);
* robust without loss reports, their reweighting on the clients and only model-type deltas
  released: DR-DSGD (Ben Issaid, Elgabli, Bennis, arXiv:2208.13810, federated form), FGDRO-CVaR
  and FGDRO-KL (Guo, Yang, "Communication-Efficient Federated Group Distributionally Robust
  Optimization", arXiv:2410.06369).

The task: the built-in synthetic softmax classification
(:func:`fedjax_dro.data.synthetic_classification`) over 200 clients with Dirichlet(0.5) label
skew and classes 1 apart, a softmax-regression model.

The protocol (:mod:`fedjax_dro.compare`, one comparison per privacy level):

* participation by Poisson sampling at rate ``q = 0.1`` (20 clients a round in expectation),
  every update clipped to ``C = 1`` and every reported loss to ``[0, B]`` with ``B = 2`` (above
  the initial model's loss ``ln 5``), for every strategy (not tuned);
* **matched epsilon**: FedAvg's noise multiplier ``z`` for FedAvg, DR-DSGD and the FGDRO
  algorithms (each participant's deltas clipped together to ``C``: one release); AFL,
  AgnosticFedAvg, q-FFL and SCAFF-PD release their reports besides their updates on the same
  participants, so both their releases get ``sqrt(2) z``, whose composition is a Gaussian
  mechanism of multiplier ``z`` again; DRFA's losses come from a second, independent Poisson
  draw, so its one multiplier for both is set by bisection (:func:`drfa_multiplier`) so that the
  composition of its two sampled mechanisms has FedAvg's epsilon after the protocol's rounds.
  Every strategy's epsilon is checked equal before anything runs. A level with ``z = 0`` clips
  but adds no noise (epsilon infinite): the clipping's own effect;
* q-FFL's releases are on its own scale, ``F_k L (w - w_k)`` and ``h_k = ||L (w - w_k)||^2 +
  L F_k`` (q = 1, L = 20): clip ``B L C`` and report bound ``(L C)^2 + L B``
  (:func:`qffl_bounds`), the images of ``C`` and ``B``;
* equal rounds (each round is one release, so equal rounds are equal privacy spent);
* the robustness parameters at their defaults (AFL's ``lr_lambda`` 0.1, AgnosticFedAvg's
  ``domain_lr`` 0.1, DR-DSGD's ``lam`` 2, FGDRO-CVaR's ``alpha`` 0.2, FGDRO-KL's ``lam`` 1,
  DRFA's ``gamma`` 0.01, q-FFL's ``q`` 1, SCAFF-PD's ``rho`` 0.1), not tuned; local steps 5 of
  batches of 10 for every strategy with local steps;
* per seed, each strategy's step size chosen from three values by 2-fold cross-validation on
  the clients' training rows (the grid widened geometrically, up to four times, where the choice
  sits on an edge: the same rule for every strategy), scored on the reported metric (worst-20%
  accuracy); the mean
  accuracy is a further column. The selection runs are private runs too, but the choice among
  three step sizes is not accounted: the epsilon reported is the final run's (as in most
  federated DP studies);
* mean +- 2 standard errors over the seeds, paired differences against FedAvg.
"""

from __future__ import annotations

import functools
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
  "FGDRO-CVaR": (0.03, 0.1, 0.3),
  "FGDRO-KL": (0.03, 0.1, 0.3),
  "DRFA": (0.03, 0.1, 0.3),
  "q-FFL": (0.03, 0.1, 0.3),
  "SCAFF-PD": (0.03, 0.1, 0.3),
}
QFFL_L = 20.0  # q-FFL's Lipschitz estimate L (its default), q = 1


def qffl_bounds():
  """q-FFL releases ``F_k^q Delta_k = F_k L (w - w_k)`` and ``h_k = ||L (w - w_k)||^2 + L F_k``
  (q = 1): on the scale of a model delta clipped to ``C`` and a loss within ``[0, B]``, their
  bounds are ``B L C`` and ``(L C)^2 + L B`` (the algorithm's own scaling, not tuned)."""
  return LOSS_BOUND * QFFL_L * CLIP, (QFFL_L * CLIP) ** 2 + QFFL_L * LOSS_BOUND


@functools.lru_cache(maxsize=64)
def drfa_multiplier(z: float, rate: float, rounds: int, num_clients: int) -> float:
  """DRFA's noise multiplier at FedAvg's epsilon: its update and its losses come from two
  independent Poisson draws a round (two sampled Gaussian mechanisms, composed), so the one
  multiplier ``z_d`` of both is found by bisection such that their composition after ``rounds``
  rounds has FedAvg's epsilon (``z``'s); 0 for ``z = 0``."""
  from fedjax_dro.privacy.accounting import composed_epsilon, epsilon

  if z <= 0:
    return 0.0
  kw = dict(sampling="poisson", num_clients=num_clients, rate=rate)
  target = epsilon(rounds, z, DELTA, **kw)
  lo, hi = z, 4.0 * z  # two releases need more noise than one, less than 4 z
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if composed_epsilon(rounds, [mid, mid], DELTA, **kw) > target:
      lo = mid
    else:
      hi = mid
    if hi - lo <= 1e-13 * hi:
      break
  return hi


def task(seed: int, num_clients: int):
  """The skewed federation of ``seed``: ``num_clients`` clients (Dirichlet(0.5) labels), 50 rows
  each on average, 5 classes whose means are 1 apart (class_sep 1: with clipping only, FedAvg
  reaches about 0.90 mean and 0.77 worst-20% accuracy in 100 rounds: room for both)."""
  from fedjax_dro.data.synthetic import synthetic_classification

  return synthetic_classification(
    seed, num_clients=num_clients, alpha=0.5, class_sep=1.0, examples_per_class=10 * num_clients
  )


def strategies(z: float, rate: float, rounds: int = DEFAULTS["rounds"], num_clients: int = 200):
  """The private strategies at FedAvg noise multiplier ``z`` (matched epsilon after ``rounds``
  rounds of ``num_clients`` clients: DRFA's multiplier depends on them)."""
  from fedjax_dro import compare as C
  from fedjax_dro.algorithms import (
    afl,
    agnostic_fedavg,
    dr_dsgd,
    drfa,
    fedavg,
    fgdro_cvar,
    fgdro_kl,
    qffl,
    scaff_pd,
  )
  from fedjax_dro.privacy.wrapper import private

  zr = math.sqrt(2.0) * z  # both releases of the loss-reporting algorithms
  zd = drfa_multiplier(z, rate, rounds, num_clients)  # two independently sampled releases
  q_clip, h_bound = qffl_bounds()
  common = dict(local_steps=5, batch_size=10)

  def released(algorithm, noise, *, clip=CLIP, loss_bound=None, **kw):
    """``algorithm(m, **kw)`` made private: its updates clipped to ``clip`` with noise
    multiplier ``noise`` and, with ``loss_bound``, its reported losses clipped to ``[0,
    loss_bound]`` with the same multiplier."""
    losses = {} if loss_bound is None else dict(loss_bound=loss_bound, loss_noise_multiplier=noise)
    return lambda m: private(algorithm(m, **kw), clip, noise, rate=rate, delta=DELTA, **losses)

  def strategy(label, make, step="client_lr", **fixed):
    return C.Strategy(label, make, {step: list(STEPS[label])}, fixed=fixed)

  reports = dict(loss_bound=LOSS_BOUND)  # the loss reporters: losses clipped to [0, B] too
  return [
    strategy("FedAvg", released(fedavg, z, weighting="uniform", **common)),
    strategy("AFL", released(afl, zr, batch_size=10, **reports), "lr_w", lr_lambda=0.1),
    strategy("DR-DSGD", released(dr_dsgd, z, **common), lam=2.0),
    strategy("AgnosticFedAvg", released(agnostic_fedavg, zr, **reports, **common), domain_lr=0.1),
    strategy("FGDRO-CVaR", released(fgdro_cvar, z, **common), alpha=0.2),
    strategy("FGDRO-KL", released(fgdro_kl, z, **common), lam=1.0),
    strategy("DRFA", released(drfa, zd, **reports, **common), gamma=0.01),
    strategy(
      "q-FFL", released(qffl, zr, clip=q_clip, loss_bound=h_bound, **common), q=1.0, L=QFFL_L
    ),
    strategy("SCAFF-PD", released(scaff_pd, zr, **reports, **common), rho=0.1),
  ]


def matched_epsilon(z: float, rate: float, rounds: int, num_clients: int, model) -> float:
  """Every strategy's epsilon after ``rounds`` rounds; raises unless they are equal."""
  from fedjax_dro.algorithms.base import default_hparams
  from fedjax_dro.privacy.accounting import run_epsilon

  eps = {}
  for st in strategies(z, rate, rounds, num_clients):
    alg = st.make(model)
    eps[st.label] = run_epsilon(alg.privacy, rounds, default_hparams(alg), num_clients)["epsilon"]
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
  """Average and worst-20% accuracy against epsilon for FedAvg and eight DRO algorithms at
  matched epsilon (module docstring). Writes ``privacy_fairness.{json,md,png}`` and each
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
      strategies=strategies(z, rate, r, n),
      protocol=C.Protocol(
        seeds=seeds,
        metric=C.Metric("accuracy", "worst20"),
        budget=C.Budget("rounds", rounds=r),
        selection="kfold",
        folds=2,
        max_widenings=4,
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
    "# Privacy and fairness: FedAvg and the DRO algorithms at matched epsilon",
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

  from fedjax_dro.common import styles

  data = rows(result)
  finite = [d[1] for d in data if math.isfinite(d[1])]
  right = 3 * max(finite) if finite else 1.0
  labels = list(dict.fromkeys(d[2] for d in data))
  row_style = styles.row_styles(labels)
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  for ax, which, title in (
    (axes[0], 3, "test accuracy, worst 20% of clients"),
    (axes[1], 4, "test accuracy, mean over clients"),
  ):
    for label in labels:
      pts = sorted(
        (d[1] if math.isfinite(d[1]) else right, d[which]) for d in data if d[2] == label
      )
      ax.errorbar(
        [p[0] for p in pts],
        [p[1]["mean"] for p in pts],
        yerr=[p[1]["two_se"] or 0.0 for p in pts],
        capsize=3,
        label=label,
        ms=4,
        **row_style[label],
      )
    ax.set_xscale("log")
    ticks = sorted(set(finite)) + [right]
    ax.set_xticks(ticks, [f"{t:.3g}" for t in ticks[:-1]] + ["inf\n(no noise)"])
    ax.minorticks_off()
    ax.set_xlabel(f"epsilon (delta {result['delta']:g})")
    ax.set_ylabel(title)
    ax.grid(alpha=0.3)
  styles.legend_outside(fig, axes)
  fig.suptitle(
    f"Privacy and fairness at matched epsilon: {result['task']}\n(mean +- 2 SE over "
    f"{len(result['seeds'])} seeds)",
    fontsize=10,
  )
  if styles.is_stand_in(result):
    styles.mark_stand_in(fig)
  fig.tight_layout(rect=(0, 0, 1, 0.92))
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path
