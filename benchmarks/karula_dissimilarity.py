"""How well Karula's OT dissimilarities see the parameter groups, and what Karula makes of them.

On the Karula synthetic ridge task (paper Sec. 5.1; ``synthetic-ridge``: three parameter groups
whose features are drawn from ``N(0 / 0.2 / 0.4, 1)``) and on its equal-mean reading
(``synthetic-ridge-equal-means``: zero-mean features with standard deviations 1 / 1.5 / 0.75), for
each way of building ``D``, reports

* ``spearman``: the rank correlation between ``D_ij`` and the true ``||theta_i* - theta_j*||``
  over the pairs ``i < j`` (1 = the same ordering, 0 = none, < 0 = reversed);
* ``auc``: the probability that a same-group pair has a smaller ``D`` than an other-group pair
  (1 = the groups are separated, 0.5 = chance);
* ``within/between``: mean ``D`` over same-group pairs divided by the mean over other-group pairs:
  Karula can pool a group's clients without tying the groups together only when this is small,
  since one ``t`` scales every constraint ``||theta_i - theta_j||^2 <= t D_ij``;
* the t-sweep: Karula's mean estimation error for ``t = c / median(D)``,
  ``c in T_MULTIPLES`` (the constraint at the median pair is ``||theta_i - theta_j||^2 <= c``),
  ``D`` computed once from the training rows, and its best value (a diagnostic that uses the
  truth: how good the best constraint level of this ``D`` can be);
* FedAvg's error on the same task, the bar Karula has to clear.

Variants of ``D``: ``paper (default)`` (:func:`fedjax_dro.ot.dissimilarity_matrix` defaults: exact
OT, Euclidean ground cost on features and response, raw data, entrywise l1), ``entropic``
(``preset="entropic"``: Sinkhorn, squared-Euclidean cost, pooled standardization, ``w1``),
``features only`` and ``response only`` (the paper preset on one side of the (x, y) pairs), and
``oracle D`` (the true squared parameter distances: an upper bound on what any ``D`` can do).

    python benchmarks/karula_dissimilarity.py                 # seeds 0, 1 (about 15 min, 2 cores)
    python benchmarks/karula_dissimilarity.py --quick         # smoke run

Writes ``benchmarks/results/karula_dissimilarity.{json,md}`` after every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

import fedjax_dro as fd  # noqa: E402
from fedjax_dro import algorithms as A  # noqa: E402
from fedjax_dro.algorithms.karula import smoothness_constant  # noqa: E402
from fedjax_dro.data import get_dataset  # noqa: E402
from fedjax_dro.ot import dissimilarity_matrix  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
T_MULTIPLES = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)
TASKS = {"group means": "synthetic-ridge", "equal means": "synthetic-ridge-equal-means"}


def variants(ds, truth):
  x, y, mask = ds.train.x, ds.train.y, ds.train.mask
  return {
    "paper (default)": lambda: dissimilarity_matrix(x, y, mask),
    "entropic": lambda: dissimilarity_matrix(x, y, mask, preset="entropic"),
    "features only": lambda: dissimilarity_matrix(x, None, mask, include_response=False),
    "response only": lambda: dissimilarity_matrix(
      np.asarray(y)[..., None], None, mask, include_response=False
    ),
    "oracle D": lambda: truth,
  }


def separation(dmat, theta, groups):
  """Spearman with the true parameter distances, same-group AUC, within/between mean ratio."""
  n = theta.shape[0]
  iu = np.triu_indices(n, 1)
  dist = np.linalg.norm(theta[:, None] - theta[None], axis=-1)[iu]
  d = np.asarray(dmat)[iu]
  same = (groups[:, None] == groups[None])[iu]
  a, b = d[same], d[~same]
  auc = np.mean((a[:, None] < b[None]) + 0.5 * (a[:, None] == b[None]))
  return {
    "spearman": float(spearmanr(d, dist).correlation),
    "auc": float(auc),
    "within_between": float(a.mean() / b.mean()),
  }


def _lipschitz_max(train):
  x, nex = np.asarray(train.x), np.asarray(train.num_examples)
  return max(
    float(np.linalg.eigvalsh(x[i, : nex[i]].T @ x[i, : nex[i]] / nex[i]).max())
    for i in range(len(nex))
  )


def fedavg_error(model, ds, *, rounds, seed, s):
  """FedAvg as in the reproduction (10 full-batch local steps of ``1 / max_i L_i``)."""
  alg = A.fedavg(model, clients_per_round=s, local_steps=10)
  hist = fd.run(
    alg, ds, rounds=rounds, seed=seed, hparams={"client_lr": 1 / _lipschitz_max(ds.train)}
  )
  return float(hist.final["estimation_error"]["mean"])


def karula_sweep(model, ds, dmat, *, rounds, seed, s):
  """Karula's mean estimation error for each ``t = c / median(D)``, ``c`` in ``T_MULTIPLES``."""
  dmat = np.asarray(dmat, np.float64)
  median = float(np.median(dmat[~np.eye(len(dmat), dtype=bool)]))
  alg = A.karula(model, dissimilarity=dmat, clients_per_round=s, projection_tol=1e-6)
  eta = s / (2.0 * smoothness_constant(model, model.init(jax.random.PRNGKey(0)), ds.train))
  grid = {"t": [c / median for c in T_MULTIPLES]}
  res = fd.sweep(alg, ds, rounds=rounds, grid=grid, seeds=[seed], hparams={"eta": eta})
  return [float(row["estimation_error"]["mean"]) for row in res.final_summary]


def write(rows, args, t0, final=False):
  """The table so far, printed and (unless --quick) saved: a failure later loses nothing."""
  mean = lambda rs, k: float(np.mean([r[k] for r in rs]))  # noqa: E731
  table = {}
  for name, rs in rows.items():
    sweep = np.mean([r["karula_errors"] for r in rs], axis=0)
    table[name] = {k: mean(rs, k) for k in ("spearman", "auc", "within_between", "fedavg_error")}
    table[name].update(
      karula_errors=[float(e) for e in sweep],
      karula_best=float(sweep.min()),
      best_multiple=T_MULTIPLES[int(sweep.argmin())],
    )
  head = " | ".join(f"c={c:g}" for c in T_MULTIPLES)
  lines = [
    "| task: D | Spearman | AUC | within/between | Karula error, t = c / median(D): "
    + head
    + " | FedAvg |",
    "|---|---|---|---|" + "---|" * len(T_MULTIPLES) + "---|",
  ]
  for name, r in table.items():
    errs = " | ".join(
      f"**{e:.2f}**" if j == int(np.argmin(r["karula_errors"])) else f"{e:.2f}"
      for j, e in enumerate(r["karula_errors"])
    )
    lines.append(
      f"| {name} | {r['spearman']:+.2f} | {r['auc']:.2f} | {r['within_between']:.2f} | {errs} | "
      f"{r['fedavg_error']:.2f} |"
    )
  seeds = sorted({r["seed"] for rs in rows.values() for r in rs})
  md = (
    f"Karula synthetic ridge, seeds {seeds}, {args.rounds} rounds, a third of the clients per "
    f"round; mean over seeds (best t in bold); device {jax.devices()[0].platform} "
    f"({platform.processor() or platform.machine()}).\n\n" + "\n".join(lines) + "\n"
  )
  if final:
    print(md)
    print(f"total {time.perf_counter() - t0:.0f}s", flush=True)
  if not args.quick:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "karula_dissimilarity.json"), "w") as f:
      json.dump({"rows": rows, "table": table, "t_multiples": T_MULTIPLES}, f, indent=1)
    with open(os.path.join(args.out, "karula_dissimilarity.md"), "w") as f:
      f.write(md)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--seeds", default="0,1")
  ap.add_argument("--rounds", type=int, default=600)
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--out", default=os.path.join(HERE, "results"))
  args = ap.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  if args.quick:
    seeds, args.rounds = seeds[:1], 5
  t0 = time.perf_counter()
  rows = {}
  for task, dataset in TASKS.items():
    entry = get_dataset(dataset)
    for seed in seeds:
      ds = entry.load(seed)
      ds = dataclasses.replace(ds, train=ds.train.pad_to(100))  # one shape for every seed
      model = entry.default_model(ds)
      n = ds.num_clients
      s = max(2, round(n / 3))
      theta = np.asarray(ds.true_params, np.float64)
      truth = ((theta[:, None] - theta[None]) ** 2).sum(-1)
      groups = np.arange(n) * 3 // n
      bar = fedavg_error(model, ds, rounds=args.rounds, seed=seed, s=s)
      for name, build in variants(ds, truth).items():
        if task == "equal means" and name not in ("paper (default)", "entropic", "oracle D"):
          continue
        t1 = time.perf_counter()
        dmat = np.asarray(build())
        row = separation(dmat, theta, groups)
        row.update(
          seed=seed,
          fedavg_error=bar,
          karula_errors=karula_sweep(model, ds, dmat, rounds=args.rounds, seed=seed, s=s),
        )
        rows.setdefault(f"{task}: {name}", []).append(row)
        print(
          f"[seed {seed}] {task}: {name:<16} spearman {row['spearman']:+.2f} auc "
          f"{row['auc']:.2f} within/between {row['within_between']:.2f}  Karula errors "
          f"{np.round(row['karula_errors'], 2).tolist()}  FedAvg {bar:.2f}  "
          f"{time.perf_counter() - t1:.0f}s",
          flush=True,
        )
        write(rows, args, t0)
  write(rows, args, t0, final=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
