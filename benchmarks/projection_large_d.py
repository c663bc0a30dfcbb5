"""The Karula projection (dual method) at neural-network sizes: n in {100, 1000} clients,
d in {1e5, 1e6} parameters per client.

For every point (and dtype: float32 always, float64 where ``--memory-gb`` allows) this measures
the AOT-compiled :func:`fedjax_dro.solvers.pairwise.project_pairwise` (``method="dual"``):

* compile time and run time (one call after compilation; ``--repeats`` calls for short runs,
  the best), from zero multipliers (cold) and warm-started from them on a perturbed input (the
  next Karula round's problem: every client moved by a small random step);
* iterations and whether the certificate reached ``tol``;
* the certified accuracy: the relative objective gap ``(f(theta) - g(mu)) / f(theta)`` that
  the dual certifies for the returned (restored, feasible) point, an upper bound on
  ``(f - f*) / f``; and the largest relative violation ``d_ij^2 / r_ij - 1`` of the solver's
  iterate before the restoration (``1 / a^2 - 1`` for the reported shrink factor ``a``);
* peak memory: XLA's plan of the compiled program (arguments, output, temporaries) in units of
  one ``[n, d]`` copy (the row-space path keeps none beside the input and the output).

Instances are Karula-like (``projection_scaling.py``'s geometry without its low-rank term, so
that the input can be drawn row block by row block without a second ``[n, d]`` array): three
groups of clients, ``z_i = m_{g_i} + noise``, ``D_ij = ||p_i - p_j||_1`` of jittered latent group
descriptors, ``r = t D`` with ``t`` from the *expected* squared distances (a third of the
median allowed). ``n = 1000, d = 1e6`` in float32 is 4 GB per copy: it runs last, alone, and
is skipped when less than ``3 x 4 GB`` is available (``/proc/meminfo``); float64 points that
need more than ``--memory-gb`` are listed as skipped.

    python benchmarks/projection_large_d.py --out benchmarks/results/projection_large_d.json
    python benchmarks/projection_large_d.py --quick      # n = 20, d = 2e4 (smoke, seconds)
    python benchmarks/projection_large_d.py --points 1000:1e6 --merge R.json --out R.json
    python benchmarks/projection_large_d.py --points "" --plan-only 1000:1e6 --merge R.json ...
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see projection_scaling.py

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_dro.solvers import pairwise  # noqa: E402

FULL_GRID = [(100, 100_000), (100, 1_000_000), (1000, 100_000), (1000, 1_000_000)]
QUICK_GRID = [(20, 20_000)]
GROUPS, SEP, NOISE, T_FRAC = 3, 1.0, 1.0, 0.3


def available_gb():
  """``MemAvailable`` of ``/proc/meminfo`` in GB (inf where unreadable)."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) / 2**20
  except OSError:
    pass
  return float("inf")


def instance(n, d, dtype, seed=0):
  """``(z [n, d] on the device, r [n, n] numpy)``; z drawn in row blocks of ``dtype``."""
  rng = np.random.default_rng(seed)
  g = rng.integers(0, GROUPS, n)
  latent = rng.normal(size=(GROUPS, 4))[g] + 0.2 * rng.normal(size=(n, 4))
  dis = np.abs(latent[:, None, :] - latent[None, :, :]).sum(-1)
  means = (SEP * rng.normal(size=(GROUPS, d))).astype(dtype)
  z = np.empty((n, d), dtype)
  for start in range(0, n, 50):
    rows = slice(start, min(start + 50, n))
    z[rows] = means[g[rows]] + NOISE * rng.standard_normal((rows.stop - start, d), dtype=dtype)
  # expected squared distances: 2 d noise^2 within a group, + 2 d sep^2 across groups
  d2 = 2 * d * NOISE**2 + 2 * d * SEP**2 * (g[:, None] != g[None, :])
  iu = np.triu_indices(n, 1)
  r = T_FRAC * np.median(d2[iu]) / np.median(dis[iu]) * dis
  np.fill_diagonal(r, 0.0)
  z_dev = jnp.asarray(z)
  del z
  gc.collect()
  return z_dev, r


def _perturb_impl(z, key):
  """The next round's input: every client moved by a small random step (1% of the noise)."""
  return z + (0.01 * NOISE) * jax.random.normal(key, z.shape, z.dtype)


_perturb = jax.jit(_perturb_impl, donate_argnums=0)  # in place: no second [n, d] copy


def _record(out, seconds):
  a = float(out.restoration_scale)
  return {
    "run_s": seconds,
    "iterations": int(out.iterations),
    "converged": bool(out.converged),
    "certified_relative_gap": float(out.dual_residual),
    "violation_before_restoration_rel": max(1.0 / a**2 - 1.0, 0.0),
  }


def _timed(compiled, z, r, repeats):
  t0 = time.perf_counter()
  out = jax.block_until_ready(compiled(z, r))
  best = time.perf_counter() - t0
  for _ in range(repeats - 1 if best < 5.0 else 0):
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(z, r))
    best = min(best, time.perf_counter() - t0)
  return out, best


def measure(n, d, dtype, tol, repeats, warm_start=True):
  """One grid point: cold and (``warm_start``) warm-started projections of one instance (see
  the docstring)."""
  z, r_np = instance(n, d, dtype)
  r = jnp.asarray(r_np, dtype)
  compiled = pairwise.compile_projection(z, r, tol=tol)
  mem = compiled.program.memory_analysis()
  copy = n * d * jnp.dtype(dtype).itemsize
  out, seconds = _timed(compiled, z, r, repeats)
  rec = {
    "n": n,
    "d": d,
    "dtype": jnp.dtype(dtype).name,
    "tol": tol,
    "status": "ok",
    "compile_s": compiled.compile_time,
    "memory_copies": {
      "arguments": mem.argument_size_in_bytes / copy,
      "output": mem.output_size_in_bytes / copy,
      "temporaries": mem.temp_size_in_bytes / copy,
    },
    "cold": _record(out, seconds),
  }
  mu = out.multipliers
  del out
  if not warm_start:
    return rec
  z = _perturb(z, jax.random.PRNGKey(1))
  warm = jax.jit(lambda z, r, mu: pairwise.project_pairwise(z, r, tol=tol, initial_multipliers=mu))
  warm = warm.lower(z, r, mu).compile()  # compiled outside the timing
  t0 = time.perf_counter()
  out = jax.block_until_ready(warm(z, r, mu))
  rec["warm"] = _record(out, time.perf_counter() - t0)
  del out, z, mu
  gc.collect()
  return rec


def plan(n, d, dtype, tol):
  """The compiled program's memory plan and compile time, from abstract shapes (nothing of size
  ``n d`` is allocated): for points too long to run here."""
  z = jax.ShapeDtypeStruct((n, d), dtype)
  r = jax.ShapeDtypeStruct((n, n), dtype)
  t0 = time.perf_counter()
  program = jax.jit(lambda z, r: pairwise.project_pairwise(z, r, tol=tol)).lower(z, r).compile()
  compile_s = time.perf_counter() - t0
  mem = program.memory_analysis()
  copy = n * d * jnp.dtype(dtype).itemsize
  return {
    "n": n,
    "d": d,
    "dtype": jnp.dtype(dtype).name,
    "tol": tol,
    "status": "planned, not run",
    "compile_s": compile_s,
    "memory_copies": {
      "arguments": mem.argument_size_in_bytes / copy,
      "output": mem.output_size_in_bytes / copy,
      "temporaries": mem.temp_size_in_bytes / copy,
    },
    "memory_gb": (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes)
    / 2**30,
  }


def markdown(records, meta):
  lines = [
    f"Device: {meta['backend']} ({meta['processor']}, {meta['cpu_count']} cores), load "
    f"average {meta['load_average_start'][0]:.1f} at the start, {meta['load_average_end'][0]:.1f}"
    f" at the end; OpenBLAS threads {meta['blas_threads']}; JAX {meta['jax']}."
    + (
      f" The points were measured in two processes ({meta['merged_from']['file']} merged)."
      if "merged_from" in meta
      else ""
    ),
    "",
    "| n | d | dtype | compile [s] | cold: run [s] / iters / certified gap / viol. before "
    "restore | warm (next round): run [s] / iters / certified gap | memory [n x d copies] "
    "| load after |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for rec in records:
    if rec["status"].startswith("planned"):
      m = rec["memory_copies"]
      lines.append(
        f"| {rec['n']} | {rec['d']:.0e} | {rec['dtype']} | {rec['compile_s']:.1f} | "
        f"{rec['status']} (total {rec['memory_gb']:.1f} GB) | - | in {m['arguments']:.2f}, out "
        f"{m['output']:.2f}, temp {m['temporaries']:.2f} | - |"
      )
      continue
    if rec["status"] != "ok":
      lines.append(f"| {rec['n']} | {rec['d']:.0e} | {rec['dtype']} | {rec['status']} | | | | |")
      continue
    c, m = rec["cold"], rec["memory_copies"]
    w = rec.get("warm")
    conv = lambda x: "" if x["converged"] else " (not converged)"  # noqa: E731
    lines.append(
      f"| {rec['n']} | {rec['d']:.0e} | {rec['dtype']} | {rec['compile_s']:.1f} | "
      f"{c['run_s']:.3g} / {c['iterations']} / {c['certified_relative_gap']:.1e}{conv(c)} / "
      f"{c['violation_before_restoration_rel']:.1e} | "
      + (
        f"{w['run_s']:.3g} / {w['iterations']} / {w['certified_relative_gap']:.1e}{conv(w)}"
        if w
        else "not run"
      )
      + f" | in {m['arguments']:.2f}, out "
      f"{m['output']:.2f}, temp {m['temporaries']:.2f} | "
      + (f"{rec['load_average_after'][0]:.1f} |" if "load_average_after" in rec else "- |")
    )
  return "\n".join(lines) + "\n"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true", help="one small point (smoke test)")
  p.add_argument("--out", default=None, help="write the JSON here (and the .md beside it)")
  p.add_argument("--points", default=None, help="n:d,n:d,... instead of the grid")
  p.add_argument("--float32-tol", type=float, default=1e-5)
  p.add_argument("--float64-tol", type=float, default=1e-7)
  p.add_argument(
    "--memory-gb", type=float, default=10.0, help="largest footprint (3 copies) to attempt"
  )
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--cold-only", action="store_true", help="no warm-started second projection")
  p.add_argument("--dtypes", default="float32,float64", help="which of float32, float64 to run")
  p.add_argument(
    "--merge",
    default=None,
    metavar="JSON",
    help="keep the records of this earlier results file for the points not measured now "
    "(to run the largest point alone, in its own process)",
  )
  p.add_argument(
    "--plan-only",
    default=None,
    metavar="POINTS",
    help="n:d,... compiled from abstract shapes for XLA's memory plan, not run (float32 and "
    "float64)",
  )
  args = p.parse_args(argv)
  if args.points is not None:  # "" measures nothing (with --plan-only)
    grid = [tuple(int(float(v)) for v in pt.split(":")) for pt in args.points.split(",") if pt]
  else:
    grid = QUICK_GRID if args.quick else FULL_GRID
  meta = {
    "benchmark": "projection_large_d",
    "platform": platform.platform(),
    "processor": platform.processor() or platform.machine(),
    "cpu_count": os.cpu_count(),
    "load_average_start": os.getloadavg(),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
    "instance": f"{GROUPS} groups, z = m_g + N(0, {NOISE}^2), m_g ~ N(0, {SEP}^2), r = t D_L1",
  }
  records = []
  for n, d in sorted(grid, key=lambda nd: nd[0] * nd[1]):
    for dtype, tol in ((jnp.float32, args.float32_tol), (jnp.float64, args.float64_tol)):
      if jnp.dtype(dtype).name not in args.dtypes.split(","):
        continue
      need = 3 * n * d * jnp.dtype(dtype).itemsize / 2**30
      name = jnp.dtype(dtype).name
      if need > min(args.memory_gb, available_gb()):
        status = f"skipped: needs ~{need:.0f} GB (3 copies), limit {args.memory_gb:.0f} GB"
        records.append({"n": n, "d": d, "dtype": name, "tol": tol, "status": status})
        print(f"n={n} d={d} {name}: {status}", flush=True)
        continue
      rec = measure(n, d, dtype, tol, args.repeats, warm_start=not args.cold_only)
      rec["load_average_after"] = os.getloadavg()
      records.append(rec)
      if args.out:  # what is done so far survives an interrupted run (status "partial")
        partial = {**meta, "status": "partial", "load_average_end": os.getloadavg()}
        with open(args.out + ".partial", "w") as f:
          json.dump({"meta": partial, "records": records}, f, indent=1, allow_nan=False)
      print(
        f"n={n} d={d} {name}: compile {rec['compile_s']:.1f}s cold {rec['cold']['run_s']:.2f}s "
        f"{rec['cold']['iterations']} it gap {rec['cold']['certified_relative_gap']:.1e}"
        + (
          f"; warm {rec['warm']['run_s']:.2f}s {rec['warm']['iterations']} it"
          if "warm" in rec
          else ""
        ),
        flush=True,
      )
  for pt in args.plan_only.split(",") if args.plan_only else []:
    n, d = (int(float(v)) for v in pt.split(":"))
    for dtype, tol in ((jnp.float32, args.float32_tol), (jnp.float64, args.float64_tol)):
      records.append(plan(n, d, dtype, tol))
      print(f"n={n} d={d} {jnp.dtype(dtype).name}: planned", records[-1]["memory_gb"], flush=True)
  meta["load_average_end"] = os.getloadavg()
  if args.merge:
    with open(args.merge) as f:
      earlier = json.load(f)
    done = {(r["n"], r["d"], r["dtype"]) for r in records}
    kept = [r for r in earlier["records"] if (r["n"], r["d"], r["dtype"]) not in done]
    records = sorted(kept + records, key=lambda r: (r["n"], r["d"], r["dtype"]))
    meta["merged_from"] = {"file": os.path.basename(args.merge), "meta": earlier["meta"]}
    meta["load_average_start"] = earlier["meta"]["load_average_start"]
  text = markdown(records, meta)
  print(text)
  if args.out and os.path.exists(args.out + ".partial"):
    os.remove(args.out + ".partial")
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
    with open(args.out, "w") as f:
      json.dump({"meta": meta, "records": records}, f, indent=1, allow_nan=False)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
      f.write(text)
  return records


if __name__ == "__main__":
  main()
