"""Scaling of the three solvers of the Karula projection onto {||theta_i - theta_j||^2 <= r_ij}.

For n in {10, 30, 100, 300, 1000} clients and d in {50, 10^4} parameters this measures, side by
side in one process, the ``dual`` (Gram-space projected L-BFGS on the edge multipliers),
``admm`` and ``dykstra`` methods of :func:`fedjax_dro.core.pairwise.project_pairwise`:

* compile time (ahead-of-time ``lower().compile()``) and run time of the compiled program
  (after a warm-up, ``block_until_ready``, median of repeats for short runs);
* accuracy of the returned (restored, hence feasible) point: relative objective gap
  ``(f - f_best) / f_best`` against the best objective found by any method on that instance,
  the maximum relative violation of the solver's iterate *before* restoration and ``1 - a``
  (the restoration shrink);
* the ratios ``ADMM time / dual time`` and ``Dykstra time / dual time`` at the same ``tol``.

Instances are Karula-like: three groups of clients, client models = group mean + a low-rank
client effect + noise, dissimilarities ``D_ij = ||p_i - p_j||_1`` of latent group descriptors
with jitter (a surrogate of the OT embeddings), ``r = t D`` with ``t`` set so that roughly a
third of the typical squared distance is allowed (many active constraints, many inactive).

ADMM and Dykstra keep ``O(n^2 d)`` edge arrays; a (method, n, d) whose estimated footprint
exceeds ``--memory-gb`` is skipped and reported as such. Their iteration cap is chosen from a
short calibration run so that one run stays within ``--time-budget`` seconds; a run that hits
the cap is reported as not converged together with the accuracy it reached.

The JAX CPU Cholesky / triangular solves call OpenBLAS (through SciPy); on a small, shared
machine OpenBLAS worker threads fight XLA's threads and slow factorisations down by up to 100x,
so this script pins OpenBLAS to ``--blas-threads`` (default 1) *before* importing NumPy / JAX.

    python benchmarks/projection_scaling.py                  # full grid (~15-30 min, 2 cores)
    python benchmarks/projection_scaling.py --quick          # tiny grid (CI smoke, < 1 min)
    python benchmarks/projection_scaling.py --out results.json
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

from fedjax_dro.core import pairwise  # noqa: E402

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
    z = (means[g] + 0.3 * rng.normal(size=(n, 4)) @ rng.normal(size=(4, d))
         + noise * rng.normal(size=(n, d)))
    d2 = _sq_dists(z)
    iu = np.triu_indices(n, 1)
    t = t_frac * np.median(d2[iu]) / np.median(dis[iu])
    r = t * dis
    np.fill_diagonal(r, 0.0)
    return z, r


def _sq_dists(x):
    xc = x - x.mean(0)
    sq = np.einsum("ij,ij->i", xc, xc)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (xc @ xc.T), 0.0)
    np.fill_diagonal(d2, 0.0)
    return d2


def max_rel_violation(theta, r):
    d2 = _sq_dists(np.asarray(theta, np.float64))
    pos = np.isfinite(r) & (r > 0)
    np.fill_diagonal(pos, False)
    if not pos.any():
        return 0.0
    return float(max(np.max((d2[pos] - r[pos]) / r[pos]), 0.0))


# ----------------------------------------------------------------------------------------------
# Running one method
# ----------------------------------------------------------------------------------------------
def edge_memory_gb(n, d, itemsize=8, arrays=6):
    """Peak footprint estimate of ADMM / Dykstra: ~6 live [n(n-1)/2, d] edge arrays."""
    return arrays * n * (n - 1) / 2 * d * itemsize / 2**30


def compile_method(z, r, tol, method, max_iterations):
    lowered = pairwise._project_2d.lower(z, r, tol, None, method=method,
                                         max_iterations=max_iterations, restore=True)
    t0 = time.perf_counter()
    compiled = lowered.compile()
    return compiled, time.perf_counter() - t0


def timed_run(compiled, z, r, tol, repeats):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(z, r, tol, None))
        times.append(time.perf_counter() - t0)
        if times[-1] > 5.0:       # long runs: one timing is enough
            break
    return out, float(np.median(times))


def run_method(method, z_np, r_np, tol, args):
    n, d = z_np.shape
    z, r = jnp.asarray(z_np), jnp.asarray(r_np)
    tol_arr = jnp.asarray(tol, z.dtype)
    rec = {"n": n, "d": d, "method": method, "tol": tol}
    max_it = pairwise.DEFAULT_MAX_ITERATIONS[method]
    if method in ("admm", "dykstra"):
        mem = edge_memory_gb(n, d)
        rec["memory_gb_estimate"] = round(mem, 3)
        if mem > args.memory_gb:
            rec["status"] = f"skipped: O(n^2 d) edge arrays need ~{mem:.1f} GB > {args.memory_gb} GB"
            return rec, None
        if not args.quick:
            # calibrate the per-iteration cost, then cap the iterations to the time budget
            cal_it = 20
            compiled, _ = compile_method(z, r, tol_arr, method, cal_it)
            _, t_cal = timed_run(compiled, z, r, tol_arr, 1)
            per_it = t_cal / cal_it
            cap = int(args.time_budget / max(per_it, 1e-9))
            if cap < max_it:
                max_it = max(cap, 50)
                rec["iteration_cap_from_time_budget"] = max_it
    compiled, t_compile = compile_method(z, r, tol_arr, method, max_it)
    jax.block_until_ready(compiled(z, r, tol_arr, None))           # warm-up
    out, t_run = timed_run(compiled, z, r, tol_arr, args.repeats)
    theta = np.asarray(out.theta)
    pre = float(out.primal_residual)
    rec.update({
        "status": "ok",
        "compile_s": t_compile,
        "run_s": t_run,
        "iterations": int(out.iterations),
        "max_iterations": max_it,
        "converged": bool(out.converged),
        "objective": 0.5 * float(np.sum((theta - z_np) ** 2)),
        "violation_returned_rel": max_rel_violation(theta, r_np),
        "primal_residual_abs": pre,
        "restoration_shrink": 1.0 - float(out.restoration_scale),
        "method_residual": float(out.dual_residual),
    })
    return rec, theta


# ----------------------------------------------------------------------------------------------
# Table
# ----------------------------------------------------------------------------------------------
def fmt(x, spec=".2e"):
    return "-" if x is None else format(x, spec)


def markdown(records):
    head = ("| n | d | method | tol | compile [s] | run [s] | iters | conv | rel. obj. gap "
            "| viol. before restore (rel) | 1 - a | ADMM / dual | Dykstra / dual |")
    sep = "|" + "---|" * 13
    lines = [head, sep]
    for rec in records:
        if rec.get("status") != "ok":
            lines.append(f"| {rec['n']} | {rec['d']} | {rec['method']} | {rec['tol']:.0e} | "
                         f"{rec['status']} | - | - | - | - | - | - | - | - |")
            continue
        viol_pre = rec.get("violation_before_rel")
        lines.append(
            f"| {rec['n']} | {rec['d']} | {rec['method']} | {rec['tol']:.0e} | "
            f"{rec['compile_s']:.1f} | {rec['run_s']:.3g} | {rec['iterations']} | "
            f"{'yes' if rec['converged'] else 'NO'} | {fmt(rec.get('gap_vs_best'))} | "
            f"{fmt(viol_pre)} | {fmt(rec['restoration_shrink'])} | "
            f"{fmt(rec.get('admm_over_dual'), '.3g')} | {fmt(rec.get('dykstra_over_dual'), '.3g')} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny grid (CI smoke)")
    p.add_argument("--out", default=None, help="write the JSON results here")
    p.add_argument("--markdown-out", default=None, help="also write the markdown table here")
    p.add_argument("--n", type=int, nargs="*", default=None, help="override the n grid")
    p.add_argument("--d", type=int, nargs="*", default=None, help="override the d grid")
    p.add_argument("--methods", nargs="*", default=["dual", "admm", "dykstra"])
    p.add_argument("--tol", type=float, default=1e-6,
                   help="tol of the dual method (its certified relative duality gap)")
    p.add_argument("--baseline-tol", type=float, default=1e-7,
                   help="tol of ADMM / Dykstra; their residuals are not objective gaps, and at "
                        "tol / 10 they reach about the dual's objective accuracy (the table "
                        "reports the achieved gap of every run)")
    p.add_argument("--reference-tol", type=float, default=1e-9,
                   help="extra dual run at this tol (a reference point for the objective gap)")
    p.add_argument("--time-budget", type=float, default=120.0,
                   help="seconds per ADMM / Dykstra run (iteration cap from a calibration)")
    p.add_argument("--memory-gb", type=float, default=8.0,
                   help="skip ADMM / Dykstra when their edge arrays exceed this")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--blas-threads", default="1", help="OpenBLAS threads (set before import)")
    args = p.parse_args(argv)
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
            runs = [(m, args.tol if m == "dual" else args.baseline_tol) for m in args.methods]
            if "dual" in args.methods and args.reference_tol:
                runs.append(("dual", args.reference_tol))
            group = []
            for method, tol in runs:
                rec, _ = run_method(method, z, r, tol, args)
                group.append(rec)
                if rec.get("status") == "ok":
                    # a = min sqrt(r / d2) (minus 4 ulp), so the worst relative violation of the
                    # iterate before restoration is 1 / a^2 - 1
                    a = 1.0 - rec["restoration_shrink"]
                    rec["violation_before_rel"] = max(1.0 / a ** 2 - 1.0, 0.0)
                    msg = (f"n={n:5d} d={d:6d} {method:8s} tol={tol:.0e} compile "
                           f"{rec['compile_s']:6.1f}s run {rec['run_s']:9.4f}s it "
                           f"{rec['iterations']:6d} conv {rec['converged']}")
                else:
                    msg = f"n={n:5d} d={d:6d} {method:8s} tol={tol:.0e} {rec['status']}"
                print(msg, flush=True)
            ok = [g for g in group if g.get("status") == "ok"]
            best = min(g["objective"] for g in ok) if ok else None
            dual = next((g for g in ok if g["method"] == "dual" and g["tol"] == args.tol), None)
            for g in ok:
                g["gap_vs_best"] = (g["objective"] - best) / best if best else 0.0
                if dual is not None and g["tol"] == args.baseline_tol:
                    if g["method"] == "admm":
                        g["admm_over_dual"] = g["run_s"] / dual["run_s"]
                    if g["method"] == "dykstra":
                        g["dykstra_over_dual"] = g["run_s"] / dual["run_s"]
            records.extend(group)

    table = markdown(records)
    print()
    print(table)
    meta = {
        "benchmark": "projection_scaling",
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "dtype": "float64",
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
            f.write(table + "\n")
    return records


if __name__ == "__main__":
    main()
