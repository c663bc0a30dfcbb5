"""Does the dual projection reach its tolerance on hard Karula-like instances?

For n in {100, 300, 1000} clients and d = 10^4 parameters, float64 at tol 1e-6 and float32 at
tol 1e-4, this runs the default ``dual`` method of
:func:`fedjax_dro.solvers.pairwise.project_pairwise` (ahead-of-time compiled through the public
``compile_projection``; compile time reported apart) on two instance families of
:mod:`fedjax_dro.solvers.pairwise.instances`:

* ``separated``: three well separated groups, radii ``r = t D`` from a latent geometry that
  follows the groups (most constraints violated by the input, a few percent active at the
  optimum). Before the dual's progress rule counted the dual value, n = 1000 stopped early at a
  certified gap of 2.6e-3 (float64) and 1.4e-3 (float32).
* ``all_active``: the same groups with ``r = 0.1 ||z_i - z_j||^2``: every constraint active,
  closed-form projection ``mean + sqrt(0.1) (z - mean)``.

Reported per run: iterations, run time, compile time, the certified relative gap (the solver's
``dual_residual``), ``converged``, and the *true* relative objective error of the returned
(feasible) point, computed in float64: against the closed form (``all_active``) or against the
float64 run at tol 1e-6 (``separated``, float32 rows; the float64 row reports its certificate).

    python benchmarks/projection_convergence.py            # the grid above (~6 min, 2 cores)
    python benchmarks/projection_convergence.py --quick    # n = 30, d = 500 (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see projection_scaling.py

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_dro.solvers import pairwise  # noqa: E402
from fedjax_dro.solvers.pairwise import instances  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOLS = {"float64": 1e-6, "float32": 1e-4}


def objective(theta, z):
  return 0.5 * float(np.sum((np.asarray(theta, np.float64) - z) ** 2))


def run_one(z, r, dtype):
  tol = TOLS[dtype]
  zj, rj = jnp.asarray(z, dtype), jnp.asarray(r, dtype)
  compiled = pairwise.compile_projection(zj, rj, tol=tol)
  t0 = time.perf_counter()
  out = jax.block_until_ready(compiled(zj, rj, jnp.asarray(tol, dtype)))
  seconds = time.perf_counter() - t0
  theta = np.asarray(out.theta, np.float64)
  return {
    "dtype": dtype,
    "tol": tol,
    "iterations": int(out.iterations),
    "run_s": round(seconds, 3),
    "compile_s": round(compiled.compile_time, 2),
    "certified_gap": float(out.dual_residual),
    "converged": bool(out.converged),
    "objective": objective(theta, z),
    "max_rel_violation": instances.max_relative_violation(theta, np.asarray(rj, np.float64)),
  }, theta


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true")
  p.add_argument("--n", type=int, nargs="*", default=None)
  p.add_argument("--d", type=int, default=None)
  p.add_argument("--out", default=os.path.join(HERE, "results", "projection_convergence.json"))
  args = p.parse_args(argv)
  ns = args.n or ([30] if args.quick else [100, 300, 1000])
  d = args.d or (500 if args.quick else 10_000)
  records = []
  for family in ("separated", "all_active"):
    for n in ns:
      if family == "separated":
        z, r = instances.separated_groups(n, d)
        exact = None
      else:
        z, r, solution = instances.all_active(n, d)
        exact = objective(solution, z)
      f64 = None
      for dtype in ("float64", "float32"):
        rec, _ = run_one(z, r, dtype)
        if dtype == "float64":
          f64 = rec["objective"]
        reference = exact if exact is not None else f64
        rec["true_rel_error"] = (rec["objective"] - reference) / reference
        rec["reference"] = "closed form" if exact is not None else "float64 run (tol 1e-6)"
        rec.update(family=family, n=n, d=d)
        records.append(rec)
        print(
          f"{family:10s} n={n:5d} {dtype}: {rec['iterations']:4d} it, {rec['run_s']:8.2f} s "
          f"(compile {rec['compile_s']} s), certified gap {rec['certified_gap']:.2e}, "
          f"converged {rec['converged']}, true error {rec['true_rel_error']:.2e} "
          f"({rec['reference']}), violation {rec['max_rel_violation']:.1e}",
          flush=True,
        )
  lines = [
    "| instance | n | d | dtype | tol | iterations | run [s] | compile [s] | certified gap "
    "| converged | true rel. error |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for rec in records:
    err = rec["true_rel_error"]
    err_text = (
      f"{err:.1e}" if rec["reference"] == "closed form" or rec["dtype"] != "float64" else "-"
    )
    lines.append(
      f"| {rec['family']} | {rec['n']} | {rec['d']} | {rec['dtype']} | {rec['tol']:g} | "
      f"{rec['iterations']} | {rec['run_s']:.2f} | {rec['compile_s']} | "
      f"{rec['certified_gap']:.1e} | {'yes' if rec['converged'] else 'NO'} | {err_text} |"
    )
  table = "\n".join(lines)
  print(table)
  meta = {
    "device": str(jax.devices()[0]),
    "platform": platform.platform(),
    "cpu_count": os.cpu_count(),
    "jax": jax.__version__,
  }
  if not args.quick:
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump({"meta": meta, "records": records}, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
      f.write(f"Device: {meta['device']} ({meta['cpu_count']} cores), jax {meta['jax']}\n\n")
      f.write(table + "\n")
  return 0 if all(rec["converged"] for rec in records) else 1


if __name__ == "__main__":
  sys.exit(main())
