"""Scaling of the three solvers of the Karula projection onto {||theta_i - theta_j||^2 <= r_ij}.

For n in {10, 30, 100, 300, 1000} clients and d in {50, 10^4} parameters this measures, side by
side in one process, the ``dual`` (Gram-space projected L-BFGS on the edge multipliers),
``admm`` and ``dykstra`` methods of :func:`fedjax_dro.solvers.pairwise.project_pairwise`:

* compile time (ahead-of-time ``lower().compile()``) and run time of the compiled program
  (after a warm-up, ``block_until_ready``, median of repeats for short runs);
* accuracy of the returned (restored, hence feasible) point: relative objective gap
  ``(f - f_best) / f_best`` against the best objective found by any run on that instance (a
  dual run at ``--reference-tol`` = 1e-9 is always included), and the maximum relative violation
  of the solver's iterate *before* restoration;
* the speed-up of the dual **at equal accuracy**: for every ADMM / Dykstra run that reached
  relative gap ``g``, the dual is run again on the same dtype with ``tol = g / (1 + g)`` (floored
  at 1e-9 and 64 ulp). Its ``tol`` certifies ``(f - f*) / f <= tol``, i.e. ``(f - f*) / f* <= g``,
  so its point is at least as accurate; the speed-up is ``baseline time / that dual time``. A baseline stopped by the
  time budget before converging makes the figure a lower bound (``>``).

Instances are Karula-like: three groups of clients, client models = group mean + a low-rank
client effect + noise, dissimilarities ``D_ij = ||p_i - p_j||_1`` of latent group descriptors
with jitter (a surrogate of the OT embeddings), ``r = t D`` with ``t`` set so that roughly a
third of the typical squared distance is allowed (many active constraints, many inactive).

ADMM and Dykstra keep ``O(n^2 min(n, d))`` edge arrays (for ``d > n`` they run on the exact
``n``-dimensional row-space coordinates). When the float64 footprint exceeds ``--memory-gb``
they run in float32 (the dtype column says so; n = 1000 needs ~10 GB even in float32) and the
equal-accuracy dual run then also uses float32. Their iteration cap is chosen from a short
calibration run so that one run stays within ``--time-budget`` seconds; a run that hits the cap
is reported as not converged together with the accuracy it reached.

The JAX CPU Cholesky / triangular solves call OpenBLAS (through SciPy); on a small, shared
machine OpenBLAS worker threads fight XLA's threads and slow factorisations down by up to 100x,
so this script pins OpenBLAS to ``--blas-threads`` (default 1) *before* importing NumPy / JAX.

    python benchmarks/projection_scaling.py                  # full grid (~30 min, 2 cores)
    python benchmarks/projection_scaling.py --quick          # tiny grid (smoke test, < 1 min)
    python benchmarks/projection_scaling.py --out results.json
    python benchmarks/projection_scaling.py --summarize benchmarks/results/projection_scaling.json
"""

from __future__ import annotations

import argparse
import os
import sys


def _early_blas_threads(argv):
  threads = "1"
  for k, a in enumerate(argv):
    if a == "--blas-threads" and k + 1 < len(argv):
      threads = argv[k + 1]
    elif a.startswith("--blas-threads="):
      threads = a.split("=", 1)[1]
  for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, threads)


_early_blas_threads(sys.argv[1:])

import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_dro.solvers import pairwise  # noqa: E402
from fedjax_dro.solvers.pairwise.instances import max_relative_violation, sq_distances  # noqa: E402

FULL_GRID = {"n": [10, 30, 100, 300, 1000], "d": [50, 10_000]}
QUICK_GRID = {"n": [10, 20], "d": [50]}


# ----------------------------------------------------------------------------------------------
# Instances
# ----------------------------------------------------------------------------------------------
def karula_instance(n, d, seed=0, groups=3, noise=1.0, t_frac=0.3):
  rng = np.random.default_rng(seed)
  g = rng.integers(0, groups, n)
  latent = rng.normal(size=(groups, 4))[g] + 0.2 * rng.normal(size=(n, 4))
  dis = np.abs(latent[:, None, :] - latent[None, :, :]).sum(-1)
  means = rng.normal(size=(groups, d))
  z = (
    means[g]
    + 0.3 * rng.normal(size=(n, 4)) @ rng.normal(size=(4, d))
    + noise * rng.normal(size=(n, d))
  )
  d2 = sq_distances(z)
  iu = np.triu_indices(n, 1)
  t = t_frac * np.median(d2[iu]) / np.median(dis[iu])
  r = t * dis
  np.fill_diagonal(r, 0.0)
  return z, r


# ----------------------------------------------------------------------------------------------
# Running one method
# ----------------------------------------------------------------------------------------------
def edge_memory_gb(n, d, itemsize=8, arrays=5):
  """Peak footprint estimate of ADMM / Dykstra: ~5 live ``[n(n-1)/2, min(n, d)]`` edge arrays
  (measured: n = 1000, d = 10^4, float32 ADMM peaks at 10.4 GB resident)."""
  return arrays * n * (n - 1) / 2 * min(n, d) * itemsize / 2**30


def compile_method(z, r, tol, method, max_iterations):
  """AOT-compiled projection (public ``pairwise.compile_projection``) and its compile time."""
  compiled = pairwise.compile_projection(
    z, r, method=method, tol=tol, max_iterations=max_iterations
  )
  return compiled, compiled.compile_time


def timed_run(compiled, z, r, tol, repeats):
  """Median run time of an AOT-compiled call. The first call doubles as the warm-up: it is
  discarded unless it took more than 5 s (then it is the only, and representative, timing)."""
  t0 = time.perf_counter()
  out = jax.block_until_ready(compiled(z, r, tol))
  first = time.perf_counter() - t0
  if first > 5.0:
    return out, first
  times = []
  for _ in range(max(repeats, 1)):
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(z, r, tol))
    times.append(time.perf_counter() - t0)
  return out, float(np.median(times))


def run_method(method, dtype, z_np, r_np, tol, args):
  """One timed, AOT-compiled run of ``method`` on ``dtype`` inputs; a record (dict)."""
  n, d = z_np.shape
  z, r = jnp.asarray(z_np, dtype), jnp.asarray(r_np, dtype)
  tol_arr = jnp.asarray(tol, z.dtype)
  rec = {"n": n, "d": d, "method": method, "tol": tol, "dtype": jnp.dtype(dtype).name}
  max_it = pairwise.DEFAULT_MAX_ITERATIONS[method]
  if method in ("admm", "dykstra"):
    rec["memory_gb_estimate"] = round(edge_memory_gb(n, d, jnp.dtype(dtype).itemsize), 3)
    if not args.quick:
      # calibrate the per-iteration cost, then cap the iterations to the time budget
      # (difference of a 4- and a 12-iteration run: the fixed costs, e.g. the row-space QR,
      # cancel)
      t_cal = []
      for cal_it in (4, 12):
        compiled, _ = compile_method(z, r, tol_arr, method, cal_it)
        t_cal.append(timed_run(compiled, z, r, tol_arr, 1)[1])
      per_it = max(t_cal[1] - t_cal[0], 0.25 * t_cal[1]) / 8
      cap = int(args.time_budget / max(per_it, 1e-9))
      if cap < max_it:
        max_it = max(cap, 10)
        rec["iteration_cap_from_time_budget"] = max_it
  compiled, t_compile = compile_method(z, r, tol_arr, method, max_it)
  out, t_run = timed_run(compiled, z, r, tol_arr, args.repeats)
  theta = np.asarray(out.theta, np.float64)
  pre = float(out.primal_residual)
  rec.update(
    {
      "status": "ok",
      "compile_s": t_compile,
      "run_s": t_run,
      "iterations": int(out.iterations),
      "max_iterations": max_it,
      "converged": bool(out.converged),
      "objective": 0.5 * float(np.sum((theta - z_np) ** 2)),
      "violation_returned_rel": max_relative_violation(theta, r_np),
      "primal_residual_abs": pre,
      "restoration_shrink": 1.0 - float(out.restoration_scale),
      "method_residual": float(out.dual_residual),
    }
  )
  return rec


# ----------------------------------------------------------------------------------------------
# Table
# ----------------------------------------------------------------------------------------------
def fmt(x, spec=".2e"):
  return "-" if x is None else format(x, spec)


def markdown(records):
  head = (
    "| n | d | method | dtype | tol | compile [s] | run [s] | iters | conv | rel. obj. gap "
    "| viol. before restore (rel) | dual at equal accuracy [s] | speed-up of dual |"
  )
  lines = [head, "|" + "---|" * 13]
  for rec in records:
    if rec.get("status") != "ok":
      lines.append(
        f"| {rec['n']} | {rec['d']} | {rec['method']} | {rec['dtype']} | "
        f"{rec['tol']:.0e} | {rec['status']} |" + " - |" * 7
      )
      continue
    method = rec["method"] + ("" if rec["role"] == "main" else f" ({rec['role']})")
    speed = "-"
    if rec.get("speedup_dual_vs_this") is not None:
      speed = (
        (">" if rec["speedup_is_lower_bound"] else "")
        + format(rec["speedup_dual_vs_this"], ".3g")
        + "x"
      )
    lines.append(
      f"| {rec['n']} | {rec['d']} | {method} | {rec['dtype']} | {rec['tol']:.0e} | "
      f"{rec['compile_s']:.1f} | {rec['run_s']:.3g} | {rec['iterations']} | "
      f"{'yes' if rec['converged'] else 'NO'} | {fmt(rec.get('gap_vs_best'))} | "
      f"{fmt(rec.get('violation_before_rel'))} | "
      f"{fmt(rec.get('dual_equal_accuracy_s'), '.3g')} | {speed} |"
    )
  return "\n".join(lines)


def summary_markdown(records):
  """One row per (n, d): the dual's time at 1e-6 (float64) and 1e-5 (float32), and for ADMM /
  Dykstra their time, iterations and reached gap with the dual's speed-up at that accuracy."""
  head = (
    "| n | d | dual f64, tol 1e-6 [s] | dual f32, tol 1e-5 [s] | ADMM: run [s] / iters / "
    "rel. gap | dual speed-up at ADMM's accuracy | Dykstra: run [s] / iters / rel. gap "
    "| dual speed-up at Dykstra's accuracy |"
  )
  lines = [head, "|" + "---|" * 8]
  keys = sorted({(r["n"], r["d"]) for r in records}, key=lambda k: (k[1], k[0]))
  for n, d in keys:
    group = [r for r in records if (r["n"], r["d"]) == (n, d)]

    def pick(method, dtype=None, role="main"):
      return next(
        (
          r
          for r in group  # noqa: B023 (called within the iteration)
          if r["method"] == method
          and r.get("role") == role
          and (dtype is None or r["dtype"] == dtype)
        ),
        None,
      )

    def base(method):
      rec = pick(method)
      if rec is None:
        return "-", "-"
      if rec.get("status") != "ok":
        return rec["status"], "-"
      conv = "" if rec["converged"] else " (budget)"
      dt = "" if rec["dtype"] == "float64" else f", {rec['dtype']}"
      speed = (
        (">" if rec["speedup_is_lower_bound"] else "")
        + format(rec["speedup_dual_vs_this"], ".3g")
        + "x"
      )
      return (
        f"{rec['run_s']:.3g} / {rec['iterations']}{conv} / {rec['gap_vs_best']:.1e}{dt}",
        speed,
      )

    d64, d32 = pick("dual", "float64"), pick("dual", "float32")
    a, a_speed = base("admm")
    k, k_speed = base("dykstra")
    lines.append(
      f"| {n} | {d} | {d64['run_s']:.3g} | {d32['run_s']:.3g} | {a} | {a_speed} | {k} | {k_speed} |"
    )
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true", help="tiny grid (CI smoke)")
  p.add_argument("--out", default=None, help="write the JSON results here")
  p.add_argument("--markdown-out", default=None, help="also write the markdown table here")
  p.add_argument("--n", type=int, nargs="*", default=None, help="override the n grid")
  p.add_argument("--d", type=int, nargs="*", default=None, help="override the d grid")
  p.add_argument("--methods", nargs="*", default=["dual", "admm", "dykstra"])
  p.add_argument(
    "--tol",
    type=float,
    default=1e-6,
    help="tol of the dual method (its certified relative duality gap)",
  )
  p.add_argument(
    "--baseline-tol",
    type=float,
    default=1e-7,
    help="tol of ADMM / Dykstra; their residuals are not objective gaps, and at "
    "tol / 10 they reach about the dual's objective accuracy (the table "
    "reports the achieved gap of every run)",
  )
  p.add_argument(
    "--reference-tol",
    type=float,
    default=1e-9,
    help="extra dual run at this tol (a reference point for the objective gap)",
  )
  p.add_argument(
    "--float32-tol",
    type=float,
    default=1e-5,
    help="extra run of the dual method on float32 inputs at this tol (0: none)",
  )
  p.add_argument(
    "--time-budget",
    type=float,
    default=150.0,
    help="seconds per ADMM / Dykstra run (iteration cap from a calibration)",
  )
  p.add_argument(
    "--memory-gb",
    type=float,
    default=14.0,
    help="ADMM / Dykstra run in float32 when their float64 edge arrays exceed "
    "this, and are skipped when the float32 ones do too",
  )
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--blas-threads", default="1", help="OpenBLAS threads (set before import)")
  p.add_argument(
    "--summarize",
    default=None,
    metavar="JSON",
    help="print the tables of an earlier run's JSON and exit",
  )
  args = p.parse_args(argv)
  if args.summarize:
    with open(args.summarize) as f:
      records = json.load(f)["records"]
    print(markdown(records))
    print()
    print(summary_markdown(records))
    return records
  grid = QUICK_GRID if args.quick else FULL_GRID
  ns = args.n or grid["n"]
  ds = args.d or grid["d"]
  if args.quick:
    args.time_budget = min(args.time_budget, 10.0)
    args.repeats = min(args.repeats, 2)

  records = []
  for d in ds:
    for n in ns:
      z, r = karula_instance(n, d)
      group = []

      def run(method, dtype, tol, role):
        rec = run_method(method, dtype, z, r, tol, args)  # noqa: B023 (called within the iteration)
        rec["role"] = role
        group.append(rec)  # noqa: B023 (called within the iteration)
        a = 1.0 - rec["restoration_shrink"]
        # a = min sqrt(r / d2) (minus 4 ulp), so the worst relative violation of the
        # iterate before restoration is 1 / a^2 - 1
        rec["violation_before_rel"] = max(1.0 / a**2 - 1.0, 0.0)
        print(
          f"n={n:5d} d={d:6d} {method:8s} {rec['dtype']:8s} tol={tol:.0e} "  # noqa: B023 (called within the iteration)
          f"compile {rec['compile_s']:6.1f}s run {rec['run_s']:9.4f}s it "
          f"{rec['iterations']:6d} conv {rec['converged']} ({role})",
          flush=True,
        )
        return rec

      if "dual" in args.methods:
        run("dual", jnp.float64, args.tol, "main")
        if args.reference_tol:
          run("dual", jnp.float64, args.reference_tol, "reference")
        if args.float32_tol:
          run("dual", jnp.float32, args.float32_tol, "main")
      baselines = []
      for method in [m for m in args.methods if m != "dual"]:
        dtype = jnp.float64
        if edge_memory_gb(n, d, 8) > args.memory_gb:
          dtype = jnp.float32  # the only way ADMM / Dykstra fit in memory here
        if edge_memory_gb(n, d, jnp.dtype(dtype).itemsize) > args.memory_gb:
          group.append(
            {
              "n": n,
              "d": d,
              "method": method,
              "tol": args.baseline_tol,
              "dtype": "float32",
              "role": "main",
              "status": (
                f"skipped: edge arrays need ~{edge_memory_gb(n, d, 4):.1f} GB > {args.memory_gb} GB"
              ),
            }
          )
          print(f"n={n:5d} d={d:6d} {method:8s} {group[-1]['status']}", flush=True)
          continue
        baselines.append(run(method, dtype, args.baseline_tol, "main"))

      best = min(g["objective"] for g in group if g.get("status") == "ok")
      for g in group:
        if g.get("status") == "ok":
          g["gap_vs_best"] = (g["objective"] - best) / best if best else 0.0
      # equal accuracy: the dual, on the same dtype, asked to certify the relative gap the
      # baseline reached (its certificate bounds the true gap, so its point is at least as
      # accurate); the speed-up is baseline time / that dual time
      if "dual" in args.methods:
        for b in baselines:
          floor = 64 * float(jnp.finfo(b["dtype"]).eps)
          # the dual certifies (f - f*) / f <= tol; (f - f*) / f* <= g  <=>
          # (f - f*) / f <= g / (1 + g)
          g = b["gap_vs_best"]
          target = max(g / (1.0 + g), args.reference_tol or 1e-9, floor)
          eq = run("dual", jnp.dtype(b["dtype"]).type, target, f"equal accuracy to {b['method']}")
          b["_equal_accuracy_run"] = eq
          b["dual_equal_accuracy_s"] = eq["run_s"]
          b["speedup_dual_vs_this"] = b["run_s"] / eq["run_s"]
          b["speedup_is_lower_bound"] = not b["converged"]
      best = min(g["objective"] for g in group if g.get("status") == "ok")
      for g in group:  # final gaps against the best point of the whole group
        if g.get("status") == "ok":
          g["gap_vs_best"] = (g["objective"] - best) / best if best else 0.0
          g["best_objective"] = best
      for b in baselines:
        eq = b.pop("_equal_accuracy_run", None)
        if eq is not None:
          b["dual_equal_accuracy_gap"] = eq["gap_vs_best"]
      records.extend(group)

  table = markdown(records)
  print()
  print(table)
  print()
  print(summary_markdown(records))
  meta = {
    "benchmark": "projection_scaling",
    "platform": platform.platform(),
    "processor": platform.processor(),
    "cpu_count": os.cpu_count(),
    "load_average_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "dtype": "per record (float32 where float64 edge arrays exceed --memory-gb)",
    "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
    "tol_dual": args.tol,
    "tol_admm_dykstra": args.baseline_tol,
    "reference_tol": args.reference_tol,
    "time_budget_s": args.time_budget,
    "memory_gb": args.memory_gb,
    "grid": {"n": ns, "d": ds},
    "instance": "karula_instance(n, d, seed=0): 3 groups, r = t * L1 latent dissimilarity",
  }
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump({"meta": meta, "records": records}, f, indent=1)
  if args.markdown_out:
    with open(args.markdown_out, "w") as f:
      f.write(summary_markdown(records) + "\n\n" + table + "\n")
  return records


if __name__ == "__main__":
  main()
