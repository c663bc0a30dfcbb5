"""The measuring sections of ``benchmarks/speed.py`` other than the matmul ceiling
(``speedlib/ceiling.py``): client updates per second per workload and backend, precision policies,
every algorithm against FedAvg, ``fd.run`` against its compiled chunk, a sweep on several
devices, a sweep's shared CPU cache target, and the client axis folded into the batch. Each takes
the parsed command line and returns its section of the results file."""

from __future__ import annotations

import functools
import json
import time

import jax
import jax.numpy as jnp

import fedjax_dro as fd
from fedjax_dro.algorithms import fedavg, list_algorithms
from fedjax_dro.core import clients as client_backends
from fedjax_dro.core.precision import PRECISIONS, default_precision, with_precision
from fedjax_dro.engine import make_mesh
from fedjax_dro.experimental.factored import chosen_layers, local_factored_dense
from fedjax_dro.models import num_parameters
from speedlib.workloads import (
  BACKENDS,
  BATCH,
  CLIENTS,
  LOCAL_STEPS,
  TABULAR,
  backend_row,
  best_per_round,
  float32_params,
  loop_rate,
  make_data,
  make_model,
  make_workload,
  plan_label,
  rounds_for,
  step_flops,
  time_calls,
)


def _short(row):
  keep = {k: v for k, v in row.items() if not isinstance(v, dict)}
  for b in ("loop",) + BACKENDS:
    if b in row:
      keep[b] = round(row[b]["updates_per_s"], 1)
  if "auto" in row:
    keep["auto_plan"] = plan_label(row["auto"])
  return keep


def workloads(args, dense):
  rows, skipped = [], []
  precision = args.precision or default_precision()
  rate = dense.get(precision, {}).get("flops_per_s")
  for kind in args.models:
    model = make_model(kind)
    params = float32_params(model)
    grid = getattr(args, "client_grid", None) or CLIENTS["tabular" if kind in TABULAR else "deep"]
    grid = [n for n in grid if n <= args.max_clients]
    flops = None
    for n in grid:
      data = make_data(kind, n)
      if flops is None:
        flops = LOCAL_STEPS * step_flops(
          with_precision(model, precision), params, data.x[0], data.y[0]
        )
      gflop = n * flops / 1e9
      if args.max_gflop_per_round is not None and gflop > args.max_gflop_per_round:
        skipped.append({"model": kind, "num_clients": n, "gflop_per_round": gflop})
        print(f"skip {kind} n={n}: {gflop:.0f} GFLOP per round > --max-gflop-per-round")
        continue
      row = {
        "model": kind,
        "num_clients": n,
        "num_params": num_parameters(params),
        "flops_per_update": flops,
        "precision": precision,
      }
      repeats = 2 if args.quick else 5
      ups, first = loop_rate(with_precision(model, precision), data, params, 0.05, repeats)
      row["loop"] = {"updates_per_s": ups, "first_round_s": first, "clients_timed": min(n, 200)}
      for backend in args.backends:
        if backend == "map" and n > args.max_map_clients:
          continue
        guess = n / max(ups, 1.0)
        rounds = 1 if args.quick else rounds_for(guess / 20)
        r = backend_row(model, data, params, backend, precision, 0.05, repeats, rounds)
        r["speedup_vs_loop"] = r["updates_per_s"] / ups
        if rate:
          r["fraction_of_dense"] = r["updates_per_s"] * flops / rate
        row[backend] = r
      if "auto" in args.backends and len(jax.devices()) > 1 and n % len(jax.devices()) == 0:
        # the user's multi-device path: fd.run(..., mesh=make_mesh()), clients split over devices
        r = backend_row(
          model, data, params, "auto", precision, 0.05, repeats, rounds, mesh=make_mesh()
        )
        r["speedup_vs_loop"] = r["updates_per_s"] / ups
        r["devices"] = len(jax.devices())
        if rate:
          r["fraction_of_dense"] = r["updates_per_s"] * flops / rate
        row["auto_mesh"] = r
      rows.append(row)
      print(json.dumps(_short(row)), flush=True)
  return {"precision": precision, "rows": rows, "skipped": skipped}


def precisions(args, dense):
  rows = []
  for kind in args.models:
    n = min(args.precision_clients, args.max_clients)
    model, params, data = make_workload(kind, n)
    for precision in PRECISIONS:
      flops = LOCAL_STEPS * step_flops(
        with_precision(model, precision), params, data.x[0], data.y[0]
      )
      if args.max_gflop_per_round is not None and n * flops / 1e9 > args.max_gflop_per_round:
        continue
      r = backend_row(model, data, params, "auto", precision, 0.05, 2 if args.quick else 3)
      r.update(model=kind, num_clients=n, precision=precision, flops_per_update=flops)
      r["fraction_of_dense"] = r["updates_per_s"] * flops / dense[precision]["flops_per_s"]
      rows.append(r)
      print(
        f"{kind} n={n} {precision}: {r['updates_per_s']:.0f} updates/s, "
        f"{r['fraction_of_dense']:.2f} of dense {precision}",
        flush=True,
      )
  return {"rows": rows}


def _factory_settings(entry, n, backend):
  """Equal settings for every factory: the ones it accepts of local_steps / batch_size /
  backend (full participation); Karula with D = ones (no OT preprocessing)."""
  import inspect

  accepted = inspect.signature(entry.factory).parameters
  kw = {"local_steps": LOCAL_STEPS, "batch_size": BATCH, "backend": backend}
  kw = {k: v for k, v in kw.items() if k in accepted}
  if "dissimilarity" in accepted:
    kw["dissimilarity"] = "ones"
  return kw


def algorithms(args):
  """Every registered algorithm's round time relative to FedAvg's (same model, data, settings)."""
  out = []
  for kind, n in args.algorithm_workloads:
    if n > args.max_clients:
      continue
    model, params, data = make_workload(kind, n)
    rows, progs = [], {}
    for name, entry in list_algorithms().items():
      kw = _factory_settings(entry, n, "auto")
      try:
        alg = entry.factory(model, **kw)
        progs[name] = fd.compile_rounds(
          alg, data, rounds=1 if args.quick else 3, init_params=params
        )
        rows.append(
          {
            "algorithm": name,
            "s_per_round": float("inf"),
            "compile_s": progs[name].compile_time,
            "settings": {k: v for k, v in kw.items()},
          }
        )
      except Exception as e:  # reported, not hidden
        rows.append({"algorithm": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    # timed in interleaved passes (every algorithm once per pass), best call over all passes:
    # a slow stretch of the machine then hits every algorithm alike instead of a few of them
    for _ in range(1 if args.quick else 3):
      for r in rows:
        if r["algorithm"] in progs:
          timing = progs[r["algorithm"]].time(repeats=2 if args.quick else 3)
          r["s_per_round"] = min(r["s_per_round"], best_per_round(timing))
    for r in rows:
      print(json.dumps(r), flush=True)
    base = next(r["s_per_round"] for r in rows if r["algorithm"] == "fedavg")
    for r in rows:
      if "s_per_round" in r:
        r["vs_fedavg"] = r["s_per_round"] / base
    projection = karula_projection(n, params, args.quick) if "karula" in list_algorithms() else None
    out.append({"model": kind, "num_clients": n, "rows": rows, "karula_projection": projection})
  return out


def karula_projection(n, params, quick):
  """Karula's per-round pairwise projection alone (dual method, D = ones, t = 1, Karula's
  default tolerance for float32) on ``n`` copies of the model perturbed apart."""
  from fedjax_dro.solvers.pairwise import project_pairwise

  key = jax.random.PRNGKey(3)
  z = jax.tree.map(
    lambda a: a[None] + 0.1 * jax.random.normal(key, (n,) + a.shape, a.dtype), params
  )
  r = 1.0 - jnp.eye(n, dtype=jnp.float32)
  tol = max(1e-8, 100 * float(jnp.finfo(jnp.float32).eps))
  proj = jax.jit(lambda z, r: project_pairwise(z, r, method="dual", tol=tol))
  t0 = time.perf_counter()
  out = jax.block_until_ready(proj(z, r))
  first = time.perf_counter() - t0
  s = time_calls(lambda: proj(z, r), 2 if quick else 3)
  return {"s": s, "first_call_s": first, "iterations": int(out.iterations)}


def run_path(args):
  """``fd.run`` against its compiled chunk, and its first chunk's one-time costs."""
  kind, n = args.run_workload
  n = min(n, args.max_clients)
  model = make_model(kind)
  # what fd.run without init_params pays once per model: its init program's compilation
  t0 = time.perf_counter()
  jax.block_until_ready(model.init(jax.random.PRNGKey(0)))
  init_first_s = time.perf_counter() - t0
  params = float32_params(model)
  t0 = time.perf_counter()
  data = make_data(kind, n)
  jax.block_until_ready(data.x)
  build_s = time.perf_counter() - t0
  rounds = 2 if args.quick else 10
  alg = fedavg(model, local_steps=LOCAL_STEPS, batch_size=BATCH)
  hp = {"client_lr": 0.05}
  prog = fd.compile_rounds(alg, data, rounds=rounds, hparams=hp, init_params=params)
  chunk = prog.time(repeats=2 if args.quick else 5)
  # one chunk of `rounds` rounds, one evaluation at the end (what the benchmark's chunk runs)
  t0 = time.perf_counter()
  hist = fd.run(alg, data, rounds=rounds, eval_every=rounds, hparams=hp, init_params=params)
  total = time.perf_counter() - t0
  # the same run again with another seed: fd.run reuses its compiled programs (ProgramCache)
  t0 = time.perf_counter()
  again = fd.run(
    alg, data, rounds=rounds, eval_every=rounds, hparams=hp, init_params=params, seed=1
  )
  again_total = time.perf_counter() - t0
  # a longer run: the steady state of fd.run (chunks of `rounds`, an evaluation after each)
  t0 = time.perf_counter()
  long = fd.run(alg, data, rounds=3 * rounds, eval_every=rounds, hparams=hp, init_params=params)
  long_total = time.perf_counter() - t0
  out = {
    "model": kind,
    "num_clients": n,
    "rounds": rounds,
    "data_build_and_transfer_s": build_s,
    "model_init_first_call_s": init_first_s,
    "compiled_chunk_s_per_round": chunk.seconds_per_round,
    "compiled_chunk_compile_s": prog.compile_time,
    "run": {
      "total_s": total,
      "compile_s": hist.compile_time,
      "wall_s": hist.wall_time,
      "s_per_round_incl_eval": hist.wall_time / rounds,
      "other_s": total - hist.compile_time - hist.wall_time,
    },
    "run_again_other_seed": {
      "total_s": again_total,
      "compile_s": again.compile_time,
      "wall_s": again.wall_time,
    },
    "run_3_chunks": {
      "total_s": long_total,
      "compile_s": long.compile_time,
      "wall_s": long.wall_time,
      "s_per_round_incl_eval": long.wall_time / (3 * rounds),
    },
  }
  out["eval_s_per_chunk_estimate"] = max(
    0.0, (long.wall_time - 3 * rounds * chunk.seconds_per_round) / 3
  )
  print(json.dumps(out), flush=True)
  return out


def best_interleaved(calls, repeats):
  """``{name: best seconds}`` of ``calls`` (name -> fn returning a sweep result), each called once
  to warm up (compile) before its first timed call, the timed calls interleaved."""
  times = {name: [] for name in calls}
  for _ in range(repeats):
    for name, call in calls.items():
      if not times[name]:
        call()  # warm-up: compiles
      t0 = time.perf_counter()
      jax.block_until_ready(call().final_state)
      times[name].append(time.perf_counter() - t0)
  return {name: min(t) for name, t in times.items()}


def devices_section(args):
  """``fd.sweep`` of 4 learning rates on one device against the same sweep on a mesh over all
  devices of the process, with the configurations split (``sweep`` axis) or the clients split
  (``clients`` axis): seconds per call after a warm-up call (compiled programs are cached), best
  of several, calls interleaved. The ``run`` counterpart is the workloads' 'auto, mesh' column."""
  count = len(jax.devices())
  if count < 2:
    print("devices: one device in this process, section skipped")
    return {"skipped": "one device"}
  grid = {"client_lr": [0.01, 0.02, 0.05, 0.1]}
  meshes = {
    "one_device": None,
    "configs_split": make_mesh(sweep=count, clients=1)
    if len(grid["client_lr"]) % count == 0
    else None,
    "clients_split": make_mesh(clients=count),
  }
  rows = []
  for kind, n in args.devices_workloads:
    model, params, data = make_workload(kind, n)
    alg = fedavg(model, local_steps=LOCAL_STEPS, batch_size=BATCH)
    rounds = 2 if args.quick else (100 if kind in TABULAR else 4)
    sweep = functools.partial(fd.sweep, alg, data, rounds=rounds, grid=grid, eval_every=rounds)
    calls = {
      name: functools.partial(sweep, mesh=mesh)
      for name, mesh in meshes.items()
      if name == "one_device" or mesh is not None
    }
    best = best_interleaved(calls, 1 if args.quick else 3)
    row = {"model": kind, "num_clients": n, "configs": len(grid["client_lr"]), "rounds": rounds}
    row.update({f"{name}_s": t for name, t in best.items()})
    row.update(
      {
        f"{name}_speedup": best["one_device"] / t
        for name, t in best.items()
        if name != "one_device"
      }
    )
    rows.append(row)
    print(json.dumps(row), flush=True)
  return {"devices": count, "rows": rows}


def _sweep_with_cache_target(alg, data, rounds, grid, cache_bytes):
  """``fd.sweep`` with ``AUTO_CPU_CHUNK_BYTES`` set to ``cache_bytes`` (read when the sweep's
  program is traced, i.e. on the first call with ``alg``), restored afterwards."""
  whole = client_backends.AUTO_CPU_CHUNK_BYTES
  client_backends.AUTO_CPU_CHUNK_BYTES = cache_bytes
  try:
    return fd.sweep(alg, data, rounds=rounds, grid=grid, eval_every=rounds)
  finally:
    client_backends.AUTO_CPU_CHUNK_BYTES = whole


def _planned_sweep(alg, n, plans, name, *sweep_args):
  """:func:`_sweep_with_cache_target`; the first call (the one that plans) records into
  ``plans[name]`` the clients per chunk of every ``auto`` plan over the ``n`` clients."""
  if name in plans:
    return _sweep_with_cache_target(alg, *sweep_args)
  client_backends.recent_plans.clear()
  result = _sweep_with_cache_target(alg, *sweep_args)
  plans[name] = sorted(
    {
      p.chunk_size or (1 if p.backend == "map" else n)
      for p in client_backends.recent_plans
      if p.num_clients == n
    }
  )
  return result


def sweep_cache_section(args):
  """CPU: ``fd.sweep`` of 4 learning rates on one device with the ``auto`` backend's cache target
  shared by the rows that run side by side (the default: each row's chunk is planned into
  ``AUTO_CPU_CHUNK_BYTES / rows``) against the same sweep planned with one run's whole target
  per row (as before the rows shared it): seconds per call after a warm-up call, best of
  several, calls interleaved, with the chunk size each planned."""
  if jax.default_backend() != "cpu":
    print("sweep_cache: the cache target is CPU-only, section skipped")
    return {"skipped": "not CPU"}
  grid = {"client_lr": [0.01, 0.02, 0.05, 0.1]}
  configs = len(grid["client_lr"])
  whole = client_backends.AUTO_CPU_CHUNK_BYTES
  rows = []
  for kind, n in args.sweep_cache_workloads:
    model, params, data = make_workload(kind, n)
    rounds = 2 if args.quick else (20 if kind in TABULAR else 4)
    variants = {"row_shared": whole, "whole_per_row": whole * configs}
    algs = {name: fedavg(model, local_steps=LOCAL_STEPS, batch_size=BATCH) for name in variants}
    plans = {}
    best = best_interleaved(
      {
        name: functools.partial(
          _planned_sweep, algs[name], n, plans, name, data, rounds, grid, variants[name]
        )
        for name in variants
      },
      1 if args.quick else 3,
    )
    row = {"model": kind, "num_clients": n, "configs": configs, "rounds": rounds}
    row.update({f"{name}_s": t for name, t in best.items()})
    row.update({f"{name}_chunks": plans[name] for name in variants})
    row["speedup"] = best["whole_per_row"] / best["row_shared"]
    rows.append(row)
    print(json.dumps(row), flush=True)
  return {"rows": rows}


def _folding_calls(model, settings, data, key):
  from fedjax_dro.core.local import federated_gradient, local_round
  from fedjax_dro.core.metrics import evaluate_clients

  return {
    "grad_per_client_s": lambda p: (
      local_round(model, settings, p, data, key, 1.0, mean_only=True).deltas
    ),
    "grad_folded_s": lambda p: federated_gradient(model, settings, p, data, key).deltas,
    "eval_vmap_s": lambda p: evaluate_clients(model, p, data, False, backend="vmap"),
    "eval_auto_s": lambda p: evaluate_clients(model, p, data, False, backend="auto"),
  }


def folding(args):
  """Shared-model computations with the client axis folded into the batch, against the
  per-client form (same participants, keys, minibatches; jitted, best of 5 calls)."""
  from fedjax_dro.core.settings import common_settings

  rows = []
  for kind, n in args.folding_workloads:
    if n > args.max_clients:
      continue
    model, params, data = make_workload(kind, n)
    settings = common_settings(
      clients_per_round=None,
      local_steps=1,
      batch_size=BATCH,
      backend="auto",
      chunk_size=None,
      weighting="num_examples",
    )
    calls = _folding_calls(model, settings, data, jax.random.PRNGKey(0))
    row = {"model": kind, "num_clients": n}
    for name, fn in calls.items():
      f = jax.jit(fn)
      jax.block_until_ready(f(params))
      row[name] = time_calls(lambda: f(params), 2 if args.quick else 5)  # noqa: B023
    rows.append(row)
    print(json.dumps(row), flush=True)
  return {"rows": rows}


def rooflines(args, dense, bandwidth):
  """Each of ``args.roofline_workloads`` (model, n) against its roofline: the ``auto`` backend's
  round timed here, beside the bound of its work on this device's measured peaks (the dense rate
  of the round's precision and ``bandwidth``, the copy bandwidth in bytes/s). A client update's
  work is ``LOCAL_STEPS`` times the cost of one local step of ``c = min(n, 64)`` clients side by
  side (``roofline.cohort_step_cost``) divided by ``c``; the round's is ``n`` updates."""
  from speedlib import roofline

  precision = args.precision or default_precision()
  peak = dense.get(precision, dense.get("float32", {})).get("flops_per_s")
  rows = []
  for kind, n in args.roofline_workloads:
    n = min(n, args.max_clients)
    model, params, data = make_workload(kind, n)
    model = with_precision(model, precision)
    c = min(n, 64)
    cost = roofline.cohort_step_cost(model, params, data.x[:c, :BATCH], data.y[:c, :BATCH], BATCH)
    per_update = {k: cost[k] * LOCAL_STEPS / c for k in ("flops", "bytes")}
    timed = backend_row(model, data, params, "auto", precision, 0.05, 2 if args.quick else 3)
    # the same rounds with the wide dense layers factored over the local steps (experimental.factored)
    layers = chosen_layers(model, LOCAL_STEPS * BATCH)
    factored = None
    if layers:
      with local_factored_dense(True):
        f = backend_row(model, data, params, "auto", precision, 0.05, 2 if args.quick else 3)
      factored = {
        "layers": ["/".join(layer.path[:-1]) for layer in layers],
        "updates_per_s": f["updates_per_s"],
        "speedup": f["updates_per_s"] / timed["updates_per_s"],
      }
    row = {
      "model": kind,
      "num_clients": n,
      "precision": precision,
      "step_cost": cost,
      "per_update": per_update,
      "updates_per_s": timed["updates_per_s"],
      "plan": plan_label(timed),
      **roofline.roofline_row(per_update, n, peak, bandwidth, timed["s_per_round"]),
    }
    if factored:
      row["factored"] = factored
    rows.append(row)
    print(json.dumps({k: v for k, v in row.items() if k != "step_cost"}), flush=True)
  return {"precision": precision, "peak_flops_per_s": peak, "bytes_per_s": bandwidth, "rows": rows}
