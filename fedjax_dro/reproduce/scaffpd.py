"""``fedjax-dro reproduce scaffpd-synthetic``: SCAFF-PD (Yu, Wei, Karimireddy, Ma, Jordan,
"Scaff-PD: Communication Efficient Fair and Robust Federated Learning", arXiv:2307.13381), Fig. 2
(Sec. 6.1) as controlled comparisons on :mod:`fedjax_dro.compare`: robust ridge regression with
concept shift (``data.synthetic.synthetic_shift``: N = 5 clients, d = 10, m = 100 examples each),
chi^2 DRO with rho in {0.01, 0.05, 0.1}, 100 local steps of full-batch (deterministic) gradients;
the squared distance ``||x^r - x*||^2`` to the saddle point against the rounds for SCAFF-PD, DRFA
and AFL (and FedAvg, SCAFFOLD for context), one comparison per rho.

Loss scaling. The paper's client objective is f_i^P(x) = (1/m) sum_j (<a_j, x> - y_j)^2 + mu_x/2
||x||^2. Our model (``models.linear_regression(d, l2=L2, fit_intercept=False)``) has f_i(x) = (1/m)
sum_j 0.5 (<a_j, x> - y_j)^2 + L2/2 ||x||^2 = f_i^P(x) / 2 with mu_x = 2 L2. Since sum_i lambda_i
f_i^P - psi_rho = 2 (sum_i lambda_i f_i - psi_{rho/2}) (psi is linear in rho), the paper's problem
with (rho, mu_x) has *exactly* the saddle point of ours with (rho / 2, L2 = mu_x / 2). We report
rho on the paper's scale and run every algorithm and the centralized solver with
``rho_ours = rho / 2`` on our losses. L2 = 0.01 (mu_x = 0.02 on the paper's scale; the paper does
not give its value): a small ridge term that makes every f_i strongly convex whatever the data.

The oracle. Per seed and rho, x* comes from ``solvers.saddle.solve_saddle`` applied to the very
function the simulator optimizes: the vector of ``common.model.client_loss`` over the training
clients (float64, KKT residual ~1e-14); everything runs in float64. The harness reports a metric
of the trained model on the dataset's test split, and this task has no held-out rows (the problem
*is* the training objective), so the test and validation splits of ``data(seed)``
(:func:`fig2_data`) are the same *probe* of x*: every client holds the d rows ``sqrt(d) e_j``
with responses ``sqrt(d) x*_j``, on which a global model x has mean squared error
``(1/d) sum_j d (x_j - x*_j)^2 = ||x - x*||^2`` exactly. So ``Metric("mse", "mean")`` on the test
split *is* the Fig. 2 distance (the dataset's ``true_params`` hold x* as well, so every run also
reports it as ``estimation_error``; a test checks the two agree), the curves of the final runs are
Fig. 2's lines, and the extra column ``log10 distance`` (:data:`LOG10`, floored at
:data:`FLOOR`) carries the paired statistics on the scale the figure is read on (orders of
magnitude).

Protocol (:func:`fig2_experiment`): per seed (:data:`NUM_SEEDS` seeds; a seed draws the data,
hence x*, and every run), each algorithm's configuration is chosen by the reported metric
itself, ``||x^R - x*||^2`` after the budget's R rounds (``selection="validation"`` on the
probe: Fig. 2 tunes every method for its fastest approach to x*, and an optimization benchmark
has no held-out rows to select on); every algorithm gets :data:`CONFIGURATIONS` configurations
(3 x 3 for the two-knob methods, 9 step sizes for FedAvg and SCAFFOLD), every geometric axis
widened while the choice sits on its edge (up to :data:`MAX_WIDENINGS` values per axis and
seed); every algorithm runs R = :data:`ROUNDS` rounds (the budget of Fig. 2's x-axis; by then the
recorded SCAFF-PD runs end 1e-8 to 1e-24 from x*, above the float64 floor, so the ranking is not
a tie of round-off). Paired differences are against SCAFF-PD.

Algorithms: SCAFF-PD (parameter rule ``"user"``, theta = 1, its primal step tied to its local
step, tau = J eta_l: a server step of 1, as in ``scaffpd-table1``; eta_l and the dual step sigma
searched), DRFA-Prox (Deng et al.'s proximal variant, the one that handles the chi^2 psi; clients
sampled with probabilities lambda as in the paper; eta_l and the dual step gamma searched), AFL
(one full-batch gradient step per round, dual prox step; lr_w and lr_lambda searched), all three
on the same chi^2 problem, and FedAvg and SCAFFOLD with uniform weights (they solve the ERM
problem, so they level off at ``||x_ERM - x*||^2``; eta_l searched).
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro import compare as C
from fedjax_dro.core.precision import float64
from fedjax_dro.reproduce.common import edges_line, run_tables

PAPER_RHOS = (0.01, 0.05, 0.1)
L2 = 0.01
NUM_CLIENTS, DIM, NUM_EXAMPLES, LOCAL_STEPS = 5, 10, 100, 100
FLOOR = 1e-30  # distances are floored here for the log10 column and the plot (float64 round-off)
NUM_SEEDS, ROUNDS, EVERY = 10, 50, 2
CONFIGURATIONS = 9
MAX_WIDENINGS = 3  # values added per widened axis, algorithm and seed
QUICK = {"num_seeds": 2, "rounds": 20}
QUICK_ROWS = ("SCAFF-PD", "DRFA-Prox", "FedAvg")
LOG10 = "log10 distance"


def shift_problem(seed: int = 0, l2: float = L2):
  """(dataset, model, client_losses_fn) of the Fig. 2 task; client_losses_fn(params) -> [n]."""
  from fedjax_dro import models
  from fedjax_dro.common.model import client_loss
  from fedjax_dro.data.synthetic import synthetic_shift

  ds = synthetic_shift(seed, num_clients=NUM_CLIENTS, dim=DIM, num_examples=NUM_EXAMPLES)
  model = models.linear_regression(DIM, l2=l2, fit_intercept=False)
  train = ds.train

  def client_losses(params):
    return jax.vmap(lambda x, y, m: client_loss(model, params, x, y, m))(
      train.x, train.y, train.mask
    )

  return ds, model, client_losses


def saddle_point(seed: int, rho: float) -> Dict[str, Any]:
  """The oracle of seed ``seed`` at ``rho`` (the paper's scale): ``{"x_star", "lambda_star",
  "residual", "gap"}`` of ``solve_saddle`` on the simulator's client objectives with
  ``rho / 2`` (float64; a ``RuntimeError`` when it does not converge)."""
  from fedjax_dro.solvers.saddle import solve_saddle

  ds, model, client_losses = shift_problem(seed)
  with float64():
    x0 = model.init(jax.random.PRNGKey(0))
    sol = solve_saddle(client_losses, x0, psi="chi2", psi_params={"rho": rho / 2.0})
  if not sol.converged:
    raise RuntimeError(f"solve_saddle did not converge for rho={rho} (residual {sol.residual})")
  return {
    "x_star": np.asarray(sol.x_star["w"], np.float64),
    "lambda_star": np.asarray(sol.lambda_star, np.float64),
    "residual": float(sol.residual),
    "gap": float(sol.gap),
  }


def probe(x_star, num_clients: int = NUM_CLIENTS):
  """The probe split of ``x_star`` (``[d]``): every client holds the rows ``sqrt(d) e_j`` with
  responses ``sqrt(d) x*_j``, so a global linear model's mean squared error there is
  ``||x - x*||^2``."""
  from fedjax_dro.data.federated import FederatedData

  x_star = np.asarray(x_star, np.float64)
  d = x_star.size
  rows = math.sqrt(d) * np.eye(d)
  return FederatedData(
    x=jnp.asarray(np.broadcast_to(rows, (num_clients, d, d))),
    y=jnp.asarray(np.broadcast_to(math.sqrt(d) * x_star, (num_clients, d))),
    mask=jnp.ones((num_clients, d), bool),
    num_examples=jnp.full((num_clients,), d, jnp.int32),
  )


def fig2_data(seed: int, oracle: Dict[str, Any]):
  """``data(seed)`` of a Fig. 2 comparison: the seed's training clients, the probe of the
  oracle's x* as validation and test split (:func:`probe`), x* as ``true_params``."""
  import dataclasses

  ds, _, _ = shift_problem(seed)
  split = probe(oracle["x_star"], ds.train.num_clients)
  return dataclasses.replace(
    ds,
    test=split,
    validation=split,
    true_params=np.broadcast_to(oracle["x_star"], (ds.train.num_clients, DIM)).copy(),
    description=f"{ds.description}; test = validation = the probe of x* (mse = ||x - x*||^2)",
  )


def log10_distance(models, ds) -> float:
  """The :data:`LOG10` column: ``log10 max(||x - x*||^2, FLOOR)`` of the global model (the mean
  over the clients' broadcast copies) against the dataset's ``true_params``."""
  w = np.asarray(models["w"], np.float64)
  dist = float(np.mean(np.sum((w - np.asarray(ds.true_params, np.float64)) ** 2, axis=-1)))
  return math.log10(max(dist, FLOOR))


def strategies(rho: float, *, quick: bool = False) -> List[C.Strategy]:
  """The rows at ``rho`` (the paper's scale; ``rho / 2`` on our losses), :data:`CONFIGURATIONS`
  configurations each (with ``quick``: SCAFF-PD, DRFA-Prox and FedAvg, 1 configuration each)."""
  from fedjax_dro import algorithms as A
  from fedjax_dro.algorithms.wrappers import with_tied_hparams

  local = dict(local_steps=LOCAL_STEPS, backend="vmap")
  dro = {"rho": rho / 2.0}

  def grid(**axes):
    return {k: [v[len(v) // 2]] if quick else list(v) for k, v in axes.items()}

  one_knob = [float(v) for v in np.geomspace(1e-3, 1e-1, CONFIGURATIONS)]

  def scaff_pd(m):  # the primal step tied to the local step: a server step of 1
    return with_tied_hparams(
      A.scaff_pd(m, parameter_rule="user", **local), tau=("client_lr", float(LOCAL_STEPS), 1)
    )

  rows = [
    C.Strategy(
      "SCAFF-PD",
      scaff_pd,
      grid=grid(client_lr=(0.003, 0.01, 0.03), sigma=(0.1, 0.3, 1.0)),
      fixed={**dro, "theta": 1.0},
    ),
    C.Strategy(
      "DRFA-Prox",
      lambda m: A.drfa(m, prox=True, sampling="lambda", **local),
      grid=grid(client_lr=(3e-4, 1e-3, 3e-3), gamma=(0.01, 0.1, 1.0)),
      fixed=dro,
    ),
    C.Strategy(
      "AFL",
      lambda m: A.afl(m, backend="vmap"),
      grid=grid(lr_w=(0.3, 1.0, 3.0), lr_lambda=(0.03, 0.1, 0.3)),
      fixed=dro,
    ),
    C.Strategy(
      "FedAvg",
      lambda m: A.fedavg(m, weighting="uniform", **local),
      grid=grid(client_lr=one_knob),
    ),
    C.Strategy(
      "SCAFFOLD",
      lambda m: A.scaffold(m, weighting="uniform", **local),
      grid=grid(client_lr=one_knob),
    ),
  ]
  return [s for s in rows if s.label in QUICK_ROWS] if quick else rows


def fig2_experiment(rho: float, oracles, *, seeds, rounds: int, quick: bool) -> C.Experiment:
  """Fig. 2's panel ``rho`` as an :class:`~fedjax_dro.compare.Experiment`; ``oracles(seed,
  rho)`` gives the seed's :func:`saddle_point`."""
  from fedjax_dro import models

  stem = f"rho{rho:g}".replace(".", "p")
  return C.Experiment(
    name=f"scaffpd_fig2_{stem}",
    data=lambda seed: fig2_data(seed, oracles(seed, rho)),
    model=models.linear_regression(DIM, l2=L2, fit_intercept=False),
    strategies=strategies(rho, quick=quick),
    protocol=C.Protocol(
      seeds=tuple(seeds),
      metric=C.Metric("mse", "mean"),
      budget=C.Budget("rounds", rounds=rounds),
      selection="validation",
      max_widenings=MAX_WIDENINGS,
      reference="SCAFF-PD",
      curve_every=min(EVERY, rounds),
    ),
    extra_metrics=[C.ExtraMetric(LOG10, log10_distance, higher_is_better=False)],
    description=(
      f"SCAFF-PD Fig. 2 at rho = {rho:g} (paper's scale): the test mse is ||x^R - x*||^2 (the "
      "probe of x*)"
    ),
  )


def scaffpd_synthetic(
  out_dir: Optional[str] = None,
  *,
  rounds: Optional[int] = None,
  quick: bool = False,
  seed: int = 0,
  num_seeds: Optional[int] = None,
  rhos: Sequence[float] = PAPER_RHOS,
  plot: bool = True,
  verbose: bool = True,
) -> Dict[str, Any]:
  """Runs the Fig. 2 comparisons; writes ``scaffpd_synthetic.{json,md,png}`` (the combined table
  and figure) and every rho's record (``scaffpd_fig2_rho0p01.{json,md,png}``, ...) to
  ``out_dir``.

  Args:
    out_dir: output directory (None: nothing written).
    rounds: the rounds every algorithm runs (default :data:`ROUNDS`, 20 with ``quick``).
    quick: three algorithms, one configuration each, 2 seeds, 20 rounds (a smoke run).
    seed: the first seed; the seeds are ``seed, ..., seed + num_seeds - 1``.
    num_seeds: seeds (default :data:`NUM_SEEDS`; 2 with ``quick``).
    rhos: chi^2 strengths on the paper's scale (each run uses rho / 2 on our 0.5-scaled loss).
    plot: write the combined figure.
    verbose: print progress and tables.
  Returns:
    the JSON-able result dict.
  """
  from fedjax_dro.common.checks import integer

  q = QUICK if quick else {"num_seeds": NUM_SEEDS, "rounds": ROUNDS}
  rounds = integer(q["rounds"] if rounds is None else rounds, "rounds")
  seed = integer(seed, "seed", minimum=0)
  num_seeds = integer(q["num_seeds"] if num_seeds is None else num_seeds, "num_seeds")
  seeds = list(range(seed, seed + num_seeds))
  rhos = [float(r) for r in rhos]
  if not rhos or any(not (r > 0 and math.isfinite(r)) for r in rhos):
    raise ValueError(f"rhos must be a non-empty list of positive numbers, got {rhos!r}")
  solved: Dict[tuple, Dict[str, Any]] = {}

  def oracles(s, rho):
    if (s, rho) not in solved:
      solved[(s, rho)] = saddle_point(s, rho)
    return solved[(s, rho)]

  with float64():  # the distances to the saddle point are measured down to ~1e-16
    experiments = {
      f"{rho:g}": fig2_experiment(rho, oracles, seeds=seeds, rounds=rounds, quick=quick)
      for rho in rhos
    }
    panels = {
      f"{rho:g}": [
        {
          "seed": s,
          "x_star": oracles(s, rho)["x_star"].tolist(),
          "lambda_star": oracles(s, rho)["lambda_star"].tolist(),
          "saddle_residual": oracles(s, rho)["residual"],
          "saddle_gap": oracles(s, rho)["gap"],
          "initial_distance": float(np.sum(oracles(s, rho)["x_star"] ** 2)),  # runs start at 0
        }
        for s in seeds
      ]
      for rho in rhos
    }
    setting = {
      "num_clients": NUM_CLIENTS,
      "dim": DIM,
      "num_examples": NUM_EXAMPLES,
      "local_steps": LOCAL_STEPS,
      "batch_size": None,
      "rounds": rounds,
      "seeds": seeds,
      "rhos": rhos,
      "l2": L2,
      "mu_x_paper_scale": 2 * L2,
      "rho_scaling": "rho_ours = rho / 2 (our loss is 0.5 (<a,x> - y)^2)",
      "configurations": 1 if quick else CONFIGURATIONS,
      "max_widenings": MAX_WIDENINGS,
      "floor": FLOOR,
      "quick": quick,
      "metric": "||x^R - x*||^2 (the test mse on the probe of x*); log10 distance floored at "
      f"{FLOOR:g}",
      "selection": "per seed, ||x^R - x*||^2 after the budget's rounds, among the grid (+ "
      "widenings)",
      "tied": {"SCAFF-PD": f"tau = {LOCAL_STEPS} client_lr"},
    }
    return run_tables(
      "scaffpd-synthetic",
      experiments,
      scaffpd_markdown,
      out_dir,
      verbose,
      quick=quick,
      plot=plot_scaffpd_synthetic if plot else None,
      paper="SCAFF-PD (Yu, Wei, Karimireddy, Ma, Jordan, arXiv:2307.13381), Fig. 2",
      setting=setting,
      oracles=panels,
      device=f"{jax.devices()[0].platform}, {os.cpu_count()} CPU cores visible",
    )


def _cell(entry, digits=2) -> str:
  m, s = entry["mean"], entry["two_se"]
  if not math.isfinite(m):
    return "-"
  return f"{m:.{digits}f}" + (f" +- {s:.{digits}f}" if math.isfinite(s) else "")


def _chosen(rows) -> str:
  return "; ".join(
    "failed" if r["failed"] else ", ".join(f"{k}={v:.3g}" for k, v in r["chosen"].items()) or "-"
    for r in rows
  )


def scaffpd_markdown(result: Dict[str, Any]) -> str:
  """The Fig. 2 table, one block per rho: per algorithm ``log10 ||x^R - x*||^2`` (mean +- 2 SE
  over seeds), its paired difference to SCAFF-PD with the paired t-test's p-value (Holm-adjusted
  over the block's comparisons when the record has it), the verdict and win count, the
  configurations run and the choices per seed; the grid edges left after widening."""
  from fedjax_dro.compare.stats import verdict

  st = result["setting"]
  lines = [
    f"SCAFF-PD Fig. 2 on the comparison harness: N = {st['num_clients']}, d = {st['dim']}, m = "
    f"{st['num_examples']}, {st['local_steps']} full-batch local steps, R = {st['rounds']} "
    f"rounds, seeds {st['seeds']}; wall time {result['wall_time_s']:.0f} s. Per seed every "
    f"algorithm is chosen among {st['configurations']} configurations (+ up to "
    f"{st['max_widenings']} widenings per axis at an edge) by `||x^R - x*||^2`; the column is "
    f"`log10 ||x^R - x*||^2` (floored at {st['floor']:g}), mean +- 2 SE over seeds; the paired "
    "differences are against SCAFF-PD (paired t-test over seeds, Holm-adjusted over a block's "
    "comparisons; 'within noise': p >= 0.05).",
    "",
  ]
  for rho, rec in result["results"].items():
    ref = rec["reference"]
    paired = rec["paired"][LOG10]
    lines += [
      f"rho = {rho}:",
      "",
      f"| algorithm | log10 distance | minus {ref} (paired) | p | against {ref} | better in "
      "| configs | chosen per seed |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for s in rec["strategies"]:
      label, t = s["label"], rec["table"][s["label"]]
      d = paired.get(label)
      if d is None:
        diff, p, said, wins = "(reference)", "-", "-", "-"
      else:
        diff = _cell({"mean": d["difference"], "two_se": d["difference_2se"]})
        pv = d.get("holm_p", d["p_value"])
        p = f"{pv:.2g}" if math.isfinite(pv) else "-"
        said = verdict(d, higher_is_better=False).split(" (")[0]
        wins = f"{d['wins']} of {d['seeds']}"
      configs = f"{t['configurations']:.3g}" if math.isfinite(t["configurations"]) else "-"
      cells = [label, _cell(t[LOG10]), diff, p, said, wins, configs]
      lines.append("| " + " | ".join(cells + [_chosen(rec["per_seed"][label])]) + " |")
    lines += ["", edges_line(rec), ""]
  return "\n".join(lines)


def plot_scaffpd_synthetic(result: Dict[str, Any], path: str) -> str:
  """Fig. 2: one panel per rho, ``log10 ||x^r - x*||^2`` against the rounds of the final runs,
  per algorithm the mean over seeds with the band from their minimum to their maximum
  (:func:`fedjax_dro.common.styles.draw_mean_band`)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from fedjax_dro.common import styles

  records = result["results"]
  labels = [s["label"] for rec in records.values() for s in rec["strategies"]]
  row_style = styles.row_styles(labels)
  fig, axes = plt.subplots(1, len(records), figsize=(4.6 * len(records) + 1.8, 3.8), squeeze=False)
  for ax, (rho, rec) in zip(axes[0], records.items()):
    start = [o["initial_distance"] for o in result["oracles"][rho]]
    for s in rec["strategies"]:
      curves = []
      for r, d0 in zip(rec["per_seed"][s["label"]], start):
        if r["failed"]:
          continue
        points = [(0, d0)] + [(p["round"], p["value"]) for p in r["curve"]]
        curves.append(([x for x, _ in points], [math.log10(max(v, FLOOR)) for _, v in points]))
      styles.draw_mean_band(ax, curves, s["label"], row_style[s["label"]])
    ax.set_title(f"$\\rho$ = {rho}")
    ax.set_xlabel("communication rounds")
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel(r"$\log_{10} \|x^r - x^*\|^2$ (distance to the saddle point)")
  styles.legend_outside(fig, axes)
  st = result["setting"]
  fig.suptitle(
    f"SCAFF-PD Fig. 2 on the harness: N={st['num_clients']}, d={st['dim']}, "
    f"m={st['num_examples']}, {st['local_steps']} local steps, full-batch; line: mean over "
    f"{len(st['seeds'])} seeds, band: minimum to maximum",
    fontsize=9,
  )
  if styles.is_stand_in(result):
    styles.mark_stand_in(fig)
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return path
