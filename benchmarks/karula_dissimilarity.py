"""Why Karula's OT dissimilarities lose to the oracle on the synthetic task: a table of variants.

For each way of building ``D`` (what is embedded, the norm, the reference set, the entropic
epsilon, standardization) on the Karula synthetic ridge task (paper Sec. 5.1, ``synthetic-ridge``),
reports

* ``spearman``: the rank correlation between ``D_ij`` and the true ``||theta_i* - theta_j*||^2``
  over the pairs ``i < j`` (1 = perfect ordering, 0 = none, < 0 = reversed);
* ``within/between``: mean ``D`` over same-group pairs divided by the mean over cross-group pairs
  (small = the three parameter groups are separated);
* ``karula error (CV t)``: Karula's mean estimation error with ``t`` chosen by K-fold CV on the
  training rows (never the test rows nor the truth; here ``D`` is computed once from all training
  rows and held fixed across the folds);
* ``karula error (best t)``: the smallest error over the ``t`` grid (a diagnostic that uses the
  truth: how good the best constraint level of this ``D`` could be).

Variants (each changes one thing from the default unless its name says otherwise):

* ``default``: features and response, pooled standardization, ``norm="w1"``, 128 Gaussian
  reference points, ``epsilon = 1e-2``;
* ``paper l1``: the paper's literal entrywise l1 norm of the embedding difference;
* ``features only`` / ``response only``: one side of the (x, y) pairs;
* ``response weighted``: the response column scaled by ``sqrt(d)`` after standardization, so the
  response counts as much as all ``d`` features together;
* ``residual (global fit)``: ``(x, y - x theta_glob)`` with ``theta_glob`` the pooled ridge fit of
  the training rows (what FedAvg converges to): the response given the features, with the part every
  client shares removed; standardized, the residual scaled by ``sqrt(d)``;
* ``N0 = 32`` / ``N0 = 512``, ``epsilon = 0.1`` / ``1e-3``, ``no standardization``;
* ``oracle D``: the true squared distances (diagnostic upper bound).

``aligned task`` rows: the same generator with the covariate standard deviations reordered to
follow the parameter groups (``ALIGNED_FEATURE_STDS``), the default ``D`` and the oracle: whether
the OT dissimilarities work when the feature distributions carry the groups' order. Every row also
gives FedAvg's error on its task (the bar Karula has to clear).

    python benchmarks/karula_dissimilarity.py --seeds 0 --folds 3 --cv-rounds 200 --rounds 400
    python benchmarks/karula_dissimilarity.py            # seeds 0, 1, 2, 5 folds (slower)
    python benchmarks/karula_dissimilarity.py --quick    # smoke run

Writes ``benchmarks/results/karula_dissimilarity.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

import fedjax_dro as fd  # noqa: E402
from fedjax_dro import algorithms as A  # noqa: E402
from fedjax_dro.algorithms.karula import smoothness_constant  # noqa: E402
from fedjax_dro.core.metrics import estimation_error  # noqa: E402
from fedjax_dro.data import get_dataset, synthetic_ridge  # noqa: E402
from fedjax_dro.model_selection import cross_validate  # noqa: E402
from fedjax_dro.ot import dissimilarity_matrix  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
T_GRID = [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]
# The generator's covariate standard deviations per parameter group are (1, 1.5, 0.75): the group
# whose parameters lie in the middle (mean 1.5) has the most spread features, so feature distances
# order the groups differently from parameter distances. The "aligned task" rows reorder them.
ALIGNED_FEATURE_STDS = (0.75, 1.0, 1.5)


def _standardized(cols, mask):
  valid = cols[mask]
  std = valid.std(0)
  return np.where(mask[..., None], (cols - valid.mean(0)) / np.where(std > 0, std, 1.0), 0.0)


def _weighted_cloud(x, extra, mask):
  """``(x, sqrt(d) * extra)`` after pooled standardization of every column."""
  d = x.shape[-1]
  pts = _standardized(np.concatenate([x, extra[..., None]], -1), mask)
  pts[..., -1] *= np.sqrt(d)
  return pts


def variants(ds):
  x, y, mask = np.asarray(ds.train.x), np.asarray(ds.train.y), np.asarray(ds.train.mask)
  xs, ys = x[mask], y[mask]
  theta_glob = np.linalg.solve(xs.T @ xs + 1e-6 * len(ys) * np.eye(x.shape[-1]), xs.T @ ys)
  resid = np.where(mask, y - x @ theta_glob, 0.0)
  key = jax.random.PRNGKey(0)
  ot = lambda px, py, **kw: dissimilarity_matrix(px, py, mask, key=key, **kw)  # noqa: E731
  return {
    "default": lambda: ot(x, y),
    "paper l1": lambda: ot(x, y, norm="l1"),
    "features only": lambda: ot(x, None, include_response=False),
    "response only": lambda: ot(y[..., None], None, include_response=False),
    "response weighted": lambda: ot(
      _weighted_cloud(x, y, mask), None, include_response=False, standardize=False
    ),
    "residual (global fit)": lambda: ot(
      _weighted_cloud(x, resid, mask), None, include_response=False, standardize=False
    ),
    "N0 = 32": lambda: ot(x, y, num_reference=32),
    "N0 = 512": lambda: ot(x, y, num_reference=512),
    "epsilon = 0.1": lambda: ot(x, y, epsilon=0.1),
    # eps = 1e-3 needs more Sinkhorn iterations than the default cap; non-convergence is warned
    "epsilon = 1e-3": lambda: ot(
      x, y, epsilon=1e-3, max_iterations=20000, on_nonconvergence="warn"
    ),
    "no standardization": lambda: ot(x, y, standardize=False),
  }


def _scores(dmat, truth, groups):
  n = truth.shape[0]
  iu = np.triu_indices(n, 1)
  same = (groups[:, None] == groups[None])[iu]
  d = np.asarray(dmat)[iu]
  return {
    "spearman": float(spearmanr(d, truth[iu]).correlation),
    "within_between": float(d[same].mean() / d[~same].mean()),
  }


def fedavg_reference(model, ds, *, rounds, seed):
  """FedAvg's mean estimation error on the same task (10 full-batch local steps of
  ``1 / max_i L_i``, a third of the clients per round), the bar Karula has to clear."""
  x, nex = np.asarray(ds.train.x), np.asarray(ds.train.num_examples)
  n = ds.num_clients
  l_max = max(
    np.linalg.eigvalsh(x[i, : nex[i]].T @ x[i, : nex[i]] / nex[i]).max() for i in range(n)
  )
  alg = A.fedavg(model, clients_per_round=max(2, round(n / 3)), local_steps=10)
  hist = fd.run(alg, ds, rounds=rounds, seed=seed, hparams={"client_lr": 1.0 / l_max})
  return float(hist.final["estimation_error"]["mean"])


def karula_errors(model, ds, dmat, *, rounds, cv_rounds, folds, seed):
  """(error at the CV-chosen t, chosen t, smallest error over T_GRID)."""
  n = ds.num_clients
  s = max(2, round(n / 3))
  alg = A.karula(model, dissimilarity=np.asarray(dmat), clients_per_round=s, projection_tol=1e-6)
  eta = s / (2.0 * smoothness_constant(model, model.init(jax.random.PRNGKey(0)), ds.train))
  cv = cross_validate(
    alg,
    ds,
    {"t": T_GRID},
    folds=folds,
    rounds=cv_rounds,
    seed=seed,
    metric="mse",
    stat="weighted_mean",
    hparams={"eta": eta},
  )
  res = fd.sweep(alg, ds, rounds=rounds, grid={"t": T_GRID}, seeds=[seed], hparams={"eta": eta})
  errs = np.array(
    [
      float(
        jnp.mean(
          estimation_error(
            alg.client_models(jax.tree.map(lambda a, k=k: a[k], res.final_state)),
            ds.true_params,
            personalized=True,
          )
        )
      )
      for k in range(len(T_GRID))
    ]
  )
  chosen = float(cv.best["t"])
  return float(errs[T_GRID.index(chosen)]), chosen, float(errs.min()), float(T_GRID[errs.argmin()])


def write(rows, seeds, args, t0, final=False):
  """The table so far, printed and (unless --quick) saved: a failure later loses nothing."""
  table = {
    name: {k: float(np.mean([r[k] for r in rs])) for k in ("spearman", "within_between")}
    | {
      "error_cv": float(np.mean([r["error_cv"] for r in rs])),
      "error_cv_2se": float(2 * np.std([r["error_cv"] for r in rs], ddof=1) / np.sqrt(len(rs)))
      if len(rs) > 1
      else float("nan"),
      "error_best": float(np.mean([r["error_best"] for r in rs])),
      "fedavg_error": float(np.mean([r["fedavg_error"] for r in rs])),
    }
    for name, rs in rows.items()
  }
  lines = [
    "| D variant | Spearman(D, true dist.) | within/between | Karula error, CV t (+-2SE) | "
    "Karula error, best t | FedAvg error, same task |",
    "|---|---|---|---|---|---|",
  ]
  for name, r in table.items():
    spread = "" if np.isnan(r["error_cv_2se"]) else f" +- {r['error_cv_2se']:.2f}"
    lines.append(
      f"| {name} | {r['spearman']:+.2f} | {r['within_between']:.2f} | {r['error_cv']:.2f}"
      f"{spread} | {r['error_best']:.2f} | {r['fedavg_error']:.2f} |"
    )
  md = (
    f"Karula synthetic ridge, seeds {seeds}, {args.rounds} rounds (CV: {args.folds} folds of "
    f"{args.cv_rounds} rounds, t in {T_GRID}); device {jax.devices()[0].platform} "
    f"({platform.processor() or platform.machine()}).\n\n" + "\n".join(lines) + "\n"
  )
  if final:
    print(md)
    print(f"total {time.perf_counter() - t0:.0f}s", flush=True)
  if not args.quick:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "karula_dissimilarity.json"), "w") as f:
      json.dump({"seeds": seeds, "rows": rows, "table": table, "t_grid": T_GRID}, f, indent=1)
    with open(os.path.join(args.out, "karula_dissimilarity.md"), "w") as f:
      f.write(md)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--rounds", type=int, default=600)
  ap.add_argument("--cv-rounds", type=int, default=300)
  ap.add_argument("--folds", type=int, default=5)
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--out", default=os.path.join(HERE, "results"))
  args = ap.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  if args.quick:
    seeds, args.rounds, args.cv_rounds, args.folds = seeds[:1], 20, 10, 2
  entry = get_dataset("synthetic-ridge")
  t0 = time.perf_counter()
  rows = {}
  model = None
  for seed in seeds:
    base = entry.load(seed)
    model = model or entry.default_model(base)
    aligned = synthetic_ridge(seed, feature_stds=ALIGNED_FEATURE_STDS)
    for task, ds in (("", base), ("aligned task: ", aligned)):
      theta = np.asarray(ds.true_params)
      truth = ((theta[:, None] - theta[None]) ** 2).sum(-1)
      groups = np.arange(ds.num_clients) * 3 // ds.num_clients
      builds = variants(ds)
      builds["oracle D"] = lambda truth=truth: truth
      fedavg_error = fedavg_reference(model, ds, rounds=args.rounds, seed=seed)
      for name, build in builds.items():
        keep = (
          () if task and args.quick else ("default", "oracle D") if task or args.quick else builds
        )
        if name not in keep:
          continue
        t1 = time.perf_counter()
        dmat = np.asarray(build())
        row = _scores(dmat, truth, groups)
        err, chosen, best, best_t = karula_errors(
          model, ds, dmat, rounds=args.rounds, cv_rounds=args.cv_rounds, folds=args.folds, seed=seed
        )
        row.update(
          error_cv=err, chosen_t=chosen, error_best=best, best_t=best_t, fedavg_error=fedavg_error
        )
        rows.setdefault(task + name, []).append(row)
        print(
          f"[seed {seed}] {task + name:<30} spearman {row['spearman']:+.2f}  within/between "
          f"{row['within_between']:.2f}  Karula error {err:6.2f} (CV t={chosen:g})  best "
          f"{best:6.2f} (t={best_t:g})  FedAvg {fedavg_error:6.2f}  "
          f"{time.perf_counter() - t1:.0f}s",
          flush=True,
        )
        write(rows, seeds, args, t0)
  write(rows, seeds, args, t0, final=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
