"""Speed of the simulator on real models, side by side in one process.

Measures, on the device JAX runs on (CPU or one accelerator):

* ``dense``: the device's own dense-matmul rate (square matmuls, each precision): the yardstick
  every workload's achieved FLOP/s is divided by;
* ``workloads``: FedAvg client updates per second for softmax / logistic regression
  (d = 64, 10 classes), the MLP 784-200-200-62 and the built-in CNN (28x28x1, 62 classes) with
  both convolution forms (``conv="lax"`` and ``"patches"``), ``local_steps`` SGD steps of
  ``batch_size`` (4 x 32) from 64 examples per client, full participation, n = 10 ... 10,000
  (100,000 for the tabular models); for every (workload, n): the FedJAX-style per-client jitted
  loop, every backend (``vmap``, ``map``, ``chunked``, ``auto`` with the plan it chose), compile
  time, XLA's memory plan of the compiled rounds, and the achieved FLOP/s as a fraction of the
  dense rate;
* ``ceiling``: what XLA's own matmul kernels allow: the matrix products of one local step of
  ``c`` clients side by side, each timed alone in its fastest layout, summed (everything else
  in a round taken as free), best over ``c``, against the loop and ``auto`` measured beside it
  (softmax regression and the MLP at n = 1000: the CPU targets of issue 10);
* ``precision``: every precision policy (float32, tf32, bf16) per workload at one n;
* ``algorithms``: the round time of every registered algorithm relative to FedAvg at equal
  settings (Karula's pairwise projection timed on its own line);
* ``folding``: where clients share one model, the client axis folded into the batch against the
  per-client computation it replaces: FedSGD's weighted gradient
  (:func:`fedjax_dro.core.local.federated_gradient` against one local step per client,
  ``local_round``) and the evaluation of a global model (the ``auto`` backend against one ``vmap``
  over all clients);
* ``run``: :func:`fedjax_dro.run` (the CLI's path) against the compiled chunk it executes, and
  what its first chunk costs once (compilation of the rounds and of the evaluation, the first
  call, the evaluation).

FLOPs per client update are XLA's count for one local step's forward and backward pass (a
program without loops, where the count is exact) times ``local_steps``. Times are the best of
several calls after a warm-up call (compilation excluded and reported separately), through the
public API only (``fedjax_dro.compile_rounds(...).time()``, ``fedjax_dro.run``). The best, not
the median: on the shared 2-core CPU this was measured on, the same compiled program alternates
for seconds at a time between two throughput regimes about 2x apart (MLP rounds at ~950 or
~1,700 client updates/s, call after call), so a median of three calls picks a regime at random
and a ratio of two medians can be off by 2x either way; the best call is the machine's
repeatable rate, and every ratio divides like by like.

    python benchmarks/speed.py                      # everything (GPU: all n; CPU: capped)
    python benchmarks/speed.py --quick              # tiny grid (smoke test, seconds)
    python benchmarks/speed.py --sections workloads --models mlp --max-clients 1000
    python benchmarks/speed.py --sections algorithms --merge   # add a section to the results
    python benchmarks/speed.py --render                # rewrite the markdown from the JSON

``--max-gflop-per-round`` skips (and lists) configurations whose round needs more work than that
(default: 600 GFLOP on CPU, unlimited on accelerators), so a CPU run stays within minutes.
``--merge`` keeps the sections of an earlier results file that this invocation does not measure
(each section records the dense rate and device of its own process).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import platform
import sys
import time

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.algorithms import fedavg, list_algorithms
from fedjax_dro.core import clients as client_backends
from fedjax_dro.core.precision import PRECISIONS, default_precision, with_precision
from fedjax_dro.data import from_client_arrays
from fedjax_dro.models import client_loss_and_grad, num_parameters
from fedjax_dro.sharding import local_cpu_cores, make_mesh, request_cpu_devices

HERE = os.path.dirname(os.path.abspath(__file__))
SECTIONS = (
  "workloads",
  "ceiling",
  "precision",
  "algorithms",
  "run",
  "folding",
  "devices",
  "sweep_cache",
)
MODELS = ("softmax", "logreg", "mlp", "cnn-lax", "cnn-patches")
TABULAR = ("softmax", "logreg")
BACKENDS = ("vmap", "map", "chunked", "auto")
CLIENTS = {"tabular": (10, 100, 1000, 10_000, 100_000), "deep": (10, 100, 1000, 10_000)}
LOCAL_STEPS, BATCH, EXAMPLES = 4, 32, 64
CHUNK = 64  # clients per chunk of the explicit "chunked" backend
LOOP_CLIENTS = 200  # the per-client loop is timed on at most this many clients (a rate)
# Matmul ceiling: clients side by side it is evaluated at, and the most operand bytes it times.
CEILING_CHUNKS = (1, 4, 10, 20, 40, 100, 250, 500, 1000, 2000)
CEILING_MAX_BYTES = 512 * 2**20
CEILING_LOOP_SECONDS = 2e-3  # a product is repeated in one program for about this long a call
# jax.default_matmul_precision of each precision policy (as in the dense yardstick).
MATMUL_PRECISION = {"float32": "highest", "tf32": "tensorfloat32", "bf16": "default"}


# ----------------------------------------------------------------------------------------------
# Workloads
# ----------------------------------------------------------------------------------------------
def make_model(kind):
  if kind == "softmax":
    return models.softmax_regression(64, 10)
  if kind == "logreg":
    return models.logistic_regression(64)
  if kind == "mlp":
    return models.mlp((784,), 62, (200, 200))
  return models.cnn((28, 28), 62, conv=kind.split("-")[1])


def make_data(kind, n, seed=0):
  """``n`` clients of ``EXAMPLES`` rows each (random features and labels: speed only)."""
  rng = np.random.default_rng(seed)
  shape = {"softmax": (64,), "logreg": (64,), "mlp": (784,)}.get(kind, (28, 28))
  classes = {"softmax": 10, "logreg": 2}.get(kind, 62)
  x = rng.standard_normal((n, EXAMPLES) + shape, dtype=np.float32)
  y = rng.integers(0, classes, (n, EXAMPLES)).astype(np.int32)
  return from_client_arrays(list(x), list(y))


def float32_params(model):
  return jax.tree.map(lambda a: a.astype(jnp.float32), model.init(jax.random.PRNGKey(0)))


def make_workload(kind, n):
  """``(model, float32 parameters, data of n clients)`` of a workload."""
  model = make_model(kind)
  return model, float32_params(model), make_data(kind, n)


def step_flops(model, params, x, y):
  """XLA's FLOP count of one local step (forward + backward on one minibatch, no loops)."""
  nex = jnp.int32(x.shape[0])

  def step(w, key):
    return client_loss_and_grad(model, w, x, y, nex, key, BATCH)

  cost = jax.jit(step).lower(params, jax.random.PRNGKey(0)).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float((cost or {}).get("flops", float("nan")))


def time_calls(fn, repeats):
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return float(np.min(times))


def loop_rate(model, data, params, lr, repeats):
  """FedJAX's pattern: one jitted client update called from a Python loop over clients (deltas
  summed on device, then the server step); ``(client updates / s, first call s)`` on at most
  ``LOOP_CLIENTS`` clients."""

  @jax.jit
  def client_update(w0, x, y, nex, key):
    def step(w, k):
      _, g = client_loss_and_grad(model, w, x, y, nex, k, BATCH)
      return jax.tree.map(lambda a, b: a - lr * b, w, g), None

    w, _ = jax.lax.scan(step, w0, jax.random.split(key, LOCAL_STEPS))
    return jax.tree.map(jnp.subtract, w, w0)

  @jax.jit
  def accumulate(total, delta, weight):
    return jax.tree.map(lambda t, d: t + weight * d, total, delta)

  m = min(LOOP_CLIENTS, data.num_clients)
  xs = [data.x[i] for i in range(m)]
  ys = [data.y[i] for i in range(m)]
  nex = [data.num_examples[i] for i in range(m)]
  weights = np.asarray(data.num_examples[:m], np.float32) / float(np.sum(data.num_examples[:m]))

  def one_round():
    keys = jax.random.split(jax.random.PRNGKey(1), m)
    total = jax.tree.map(jnp.zeros_like, params)
    for i in range(m):
      total = accumulate(total, client_update(params, xs[i], ys[i], nex[i], keys[i]), weights[i])
    return jax.tree.map(jnp.add, params, total)

  t0 = time.perf_counter()
  jax.block_until_ready(one_round())
  first = time.perf_counter() - t0
  return m / time_calls(one_round, repeats), first


def best_per_round(timing):
  """Seconds per round of the fastest timed call (see the module docstring)."""
  return min(timing.call_seconds) / timing.rounds_per_call


def rounds_for(seconds_per_round_guess):
  return max(1, min(10, int(1.0 / max(seconds_per_round_guess, 1e-6))))


def backend_row(model, data, params, backend, precision, lr, repeats, rounds=1, mesh=None):
  kw = {"chunk_size": CHUNK} if backend == "chunked" else {}
  alg = fedavg(
    model, local_steps=LOCAL_STEPS, batch_size=BATCH, backend=backend, precision=precision, **kw
  )
  client_backends.recent_plans.clear()
  prog = fd.compile_rounds(
    alg, data, rounds=rounds, hparams={"client_lr": lr}, init_params=params, mesh=mesh
  )
  plans = [p._asdict() for p in client_backends.recent_plans]
  timing = prog.time(repeats=repeats)
  row = {
    "s_per_round": best_per_round(timing),
    "updates_per_s": data.num_clients / best_per_round(timing),
    "compile_s": prog.compile_time,
    "memory": prog.memory_analysis(),
    "rounds_per_call": rounds,
  }
  if backend == "auto":
    row["plans"] = plans
  return row


def plan_label(row):
  plans = row.get("plans") or []
  if not plans:
    return ""
  p = plans[0]
  return "vmap" if p["backend"] == "vmap" else f"chunks of {p['chunk_size']}"


# ----------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------
def dense_rates(quick):
  """The device's dense-matmul rate per precision: best over a few square sizes (FLOP/s)."""
  cpu = jax.default_backend() == "cpu"
  sizes = (256, 512) if quick else ((1024, 2048) if cpu else (4096, 8192))
  out = {}
  for precision in PRECISIONS:
    dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32
    mm = MATMUL_PRECISION[precision]
    best = {"flops_per_s": 0.0}
    for n in sizes:
      a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
      b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
      with jax.default_matmul_precision(mm):
        f = jax.jit(lambda a, b: a @ b)
        jax.block_until_ready(f(a, b))
      t = time_calls(lambda: f(a, b), 3 if quick else 7)  # noqa: B023
      rate = 2 * n**3 / t
      if rate > best["flops_per_s"]:
        best = {"flops_per_s": rate, "size": n, "s": t}
    out[precision] = best
    print(f"dense {precision}: {best['flops_per_s'] / 1e9:.1f} GFLOP/s (n={best['size']})")
  return out


def workloads(args, dense):
  rows, skipped = [], []
  precision = args.precision or default_precision()
  rate = dense.get(precision, {}).get("flops_per_s")
  for kind in args.models:
    model = make_model(kind)
    params = float32_params(model)
    grid = CLIENTS["tabular" if kind in TABULAR else "deep"]
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


def _dot_equations(jaxpr):
  """Every ``dot_general`` equation of ``jaxpr``, those of its sub-jaxprs included."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      yield eqn
    for sub in jex.core.jaxprs_in_params(eqn.params):
      yield from _dot_equations(sub)


def _precision_name(precision):
  """The name of a ``dot_general``'s explicit precision (``None`` when it has none)."""
  if precision is None:
    return None
  first = precision[0] if isinstance(precision, tuple) else precision
  return None if first is None else getattr(first, "name", str(first))


def step_products(model, params, x, y, clients):
  """The matrix products of one local step of ``clients`` clients side by side (``vmap``): one
  record per ``dot_general`` of the traced forward, backward and SGD update (the step of
  :func:`loop_rate` and of every backend), with its batch size, its ``m x k`` by ``k x n`` shape
  (several contracting or free dimensions multiplied out), operand and result dtypes, and
  explicit precision."""
  nex = jnp.int32(x.shape[0])

  def step(w, key):
    _, g = client_loss_and_grad(model, w, x, y, nex, key, BATCH)
    return jax.tree.map(lambda a, b: a - 0.05 * b, w, g)

  def size(shape, dims):
    return int(np.prod([shape[d] for d in dims], dtype=np.int64))

  def free(shape, *taken):
    return [d for d in range(len(shape)) if all(d not in t for t in taken)]

  stacked = jax.tree.map(lambda a: jnp.broadcast_to(a, (clients,) + a.shape), params)
  keys = jax.random.split(jax.random.PRNGKey(0), clients)
  products = []
  for eqn in _dot_equations(jax.make_jaxpr(jax.vmap(step))(stacked, keys).jaxpr):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = (v.aval.shape for v in eqn.invars)
    products.append(
      {
        "batch": size(lhs, lb),
        "m": size(lhs, free(lhs, lc, lb)),
        "k": size(lhs, lc),
        "n": size(rhs, free(rhs, rc, rb)),
        "dtype": str(eqn.invars[0].aval.dtype),
        "out_dtype": str(eqn.outvars[0].aval.dtype),
        "precision": _precision_name(eqn.params.get("precision")),
      }
    )
  return products


def time_in_loop(fn, lhs, rhs, repeats):
  """Seconds of one ``fn(lhs, rhs)`` without the cost of a call: ``fn`` repeated in a
  ``fori_loop`` inside one program (an optimization barrier on the loop's carry keeps XLA from
  hoisting the loop-invariant product out of it), enough times for ~``CEILING_LOOP_SECONDS`` a
  call, best of ``repeats`` calls after a warm-up, divided by the repetitions. A call's own cost
  (dispatch, ~5-20 us on CPU) would otherwise be counted once per product and understate the
  ceiling where products are small."""
  single = jax.jit(fn)
  jax.block_until_ready(single(lhs, rhs))
  reps = max(1, min(1000, int(CEILING_LOOP_SECONDS / time_calls(lambda: single(lhs, rhs), 2))))
  f = jax.jit(repeated(fn, reps))
  jax.block_until_ready(f(lhs, rhs))
  return time_calls(lambda: f(lhs, rhs), repeats) / reps


def repeated(fn, reps):
  """``(lhs, rhs) -> fn(lhs, rhs)`` computed ``reps`` times in a ``fori_loop``, each time on the
  operands passed through an optimization barrier, so that XLA cannot tell they are the same
  every iteration and compute the product once before the loop."""

  def looped(lhs, rhs):
    def body(_, carry):
      a, b, _ = jax.lax.optimization_barrier(carry)
      return a, b, fn(a, b)

    out = jax.eval_shape(fn, lhs, rhs)
    return jax.lax.fori_loop(0, reps, body, (lhs, rhs, jnp.zeros(out.shape, out.dtype)))[2]

  return looped


def time_product(product, matmul_precision, repeats, cache):
  """``(best seconds, layout)`` of one product over the eight layouts XLA can be handed: the
  left operand stored ``m x k`` or ``k x m``, the right ``k x n`` or ``n x k``, the result
  ``m x n`` or ``n x m`` (each compiled alone under ``jax.default_matmul_precision(
  matmul_precision)``, operands on the device, timed by :func:`time_in_loop`). Cached in
  ``cache`` by shape: ``m x k @ k x n`` and its transpose are one problem, since the eight
  layouts of one are those of the other."""
  b, m, k, n = product["batch"], product["m"], product["k"], product["n"]
  key = (b, k, min(m, n), max(m, n), product["dtype"], product["out_dtype"])
  key += (product["precision"], matmul_precision)
  if key in cache:
    return cache[key]
  dims = {"m": m, "k": k, "n": n}
  dtype = jnp.dtype(product["dtype"])
  explicit = product["precision"]
  batch = "z" if b > 1 else ""
  best = (math.inf, "")
  for left, right, out in itertools.product(("mk", "km"), ("kn", "nk"), ("mn", "nm")):

    def make(spec, seed):
      shape = ((b,) if b > 1 else ()) + tuple(dims[c] for c in spec)
      return jax.random.normal(jax.random.PRNGKey(seed), shape, dtype)

    fn = functools.partial(
      jnp.einsum,
      f"{batch}{left},{batch}{right}->{batch}{out}",
      precision=None if explicit is None else jax.lax.Precision[explicit],
      preferred_element_type=jnp.dtype(product["out_dtype"]),
    )
    with jax.default_matmul_precision(matmul_precision):
      t = time_in_loop(fn, make(left, 0), make(right, 1), repeats)
    if t < best[0]:
      best = (t, f"{left},{right}->{out}")
  cache[key] = best
  return best


def _ceiling_chunks(n, quick):
  """Clients side by side at which the ceiling is evaluated (``vmap`` chunk sizes up to ``n``)."""
  grid = (1, n) if quick else CEILING_CHUNKS
  return sorted({c for c in grid if c <= n} | ({n} if n <= max(grid) else set()))


def _loop_and_auto(kind, model, data, params, precision, quick):
  """``(loop updates/s, auto's backend_row)`` of a workload (``model`` with its precision)."""
  repeats = 2 if quick else 5
  loop, _ = loop_rate(model, data, params, 0.05, repeats)
  rounds = 1 if quick else rounds_for(data.num_clients / max(loop, 1.0) / 20)
  auto = backend_row(make_model(kind), data, params, "auto", precision, 0.05, repeats, rounds)
  return loop, auto


def matmul_ceiling(args, dense):
  """The most client updates per second that XLA's own matmul kernels allow on this device.

  For each workload, the matrix products of one local step of ``c`` clients side by side
  (:func:`step_products`: exactly the ``dot_general`` operations the simulator's step traces
  to) are timed alone, each in the fastest of its eight operand and result layouts
  (:func:`time_product`); ``local_steps`` times their sum is the least time ``c`` client
  updates can take if everything else in a round (minibatch sampling, softmax, the SGD update,
  aggregation, loop overhead) were free and every product ran at its best layout at once. The
  best over chunk sizes ``c`` is the ceiling; the section measures, side by side in the same
  process, the per-client loop and the ``auto`` backend of ``fd.compile_rounds`` on the same
  data, so a target can be compared with what the hardware and compiler can give at all. The
  loop and ``auto`` are timed before and after the products and the dense rate before and after
  the section, the best of each kept: like every best-of-several figure here, this takes each
  in the machine's fast regime (see the module docstring), so no ratio divides a fast figure by
  a slow one.

  It is generous to the ceiling: each product runs alone with its operands hot in cache, and
  no step can store every operand in its own best layout at once. It bounds rounds whose
  products are those of the traced step; a round that folds clients sharing one model into one
  larger product (FedSGD's gradient, the evaluation of a global model: the ``folding`` section)
  is outside it.
  """
  precision = args.precision or default_precision()
  rate = dense.get(precision, {}).get("flops_per_s")
  repeats = 2 if args.quick else 7
  cache, rows = {}, []
  for kind, n in args.ceiling_workloads:
    n = min(n, args.max_clients)
    model, params, data = make_workload(kind, n)
    model = with_precision(model, precision)
    x0, y0 = data.x[0], data.y[0]
    flops = LOCAL_STEPS * step_flops(model, params, x0, y0)
    # before and after the products, the best of both: a CPU that switches between throughput
    # regimes while the products are timed would otherwise skew the ratios
    before = _loop_and_auto(kind, model, data, params, precision, args.quick)
    by_chunk, best = [], None
    for c in _ceiling_chunks(n, args.quick):
      products = step_products(model, params, x0, y0, c)
      operand_bytes = sum(
        p["batch"]
        * (p["m"] * p["k"] + p["k"] * p["n"] + p["m"] * p["n"])
        * jnp.dtype(p["dtype"]).itemsize
        for p in products
      )
      if by_chunk and operand_bytes > CEILING_MAX_BYTES:
        break  # larger chunks only hold more (one client is always timed)
      timed = [(p, *time_product(p, MATMUL_PRECISION[precision], repeats, cache)) for p in products]
      seconds = LOCAL_STEPS * sum(t for _, t, _ in timed) / c
      by_chunk.append({"chunk": c, "updates_per_s": 1.0 / seconds})
      if best is None or 1.0 / seconds > best["updates_per_s"]:
        step_s = sum(t for _, t, _ in timed)
        best = {
          "chunk": c,
          "updates_per_s": 1.0 / seconds,
          "products": [
            {
              **p,
              "layout": layout,
              "s": t,
              "gflop_per_s": 2 * p["batch"] * p["m"] * p["k"] * p["n"] / t / 1e9,
              "share": t / step_s,
            }
            for p, t, layout in timed
          ],
        }
    after = _loop_and_auto(kind, model, data, params, precision, args.quick)
    loop = max(before[0], after[0])
    auto = max(before[1], after[1], key=lambda r: r["updates_per_s"])
    product_flops = sum(2 * p["batch"] * p["m"] * p["k"] * p["n"] for p in best["products"])
    row = {
      "model": kind,
      "num_clients": n,
      "flops_per_update": flops,
      "product_flops_per_update": LOCAL_STEPS * product_flops / best["chunk"],
      "loop_updates_per_s": loop,
      "auto": {
        "updates_per_s": auto["updates_per_s"],
        "speedup_vs_loop": auto["updates_per_s"] / loop,
        "plan": plan_label(auto),
      },
      "ceiling": {**best, "speedup_vs_loop": best["updates_per_s"] / loop},
      "by_chunk": by_chunk,
      "auto_of_ceiling": auto["updates_per_s"] / best["updates_per_s"],
    }
    rows.append(row)
  # the yardstick again, after the products: the best of the two
  again = dense_rates(args.quick).get(precision, {}).get("flops_per_s")
  rate = max((r for r in (rate, again) if r), default=None)
  for row in rows:
    if rate:
      for part in (row["auto"], row["ceiling"]):
        part["fraction_of_dense"] = part["updates_per_s"] * row["flops_per_update"] / rate
    print(
      json.dumps({k: v for k, v in row.items() if k not in ("by_chunk",)}, default=str), flush=True
    )
  return {"precision": precision, "dense_flops_per_s": rate, "rows": rows}


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------
def _short(row):
  keep = {k: v for k, v in row.items() if not isinstance(v, dict)}
  for b in ("loop",) + BACKENDS:
    if b in row:
      keep[b] = round(row[b]["updates_per_s"], 1)
  if "auto" in row:
    keep["auto_plan"] = plan_label(row["auto"])
  return keep


def _fmt_rate(x):
  return f"{x / 1e6:.2f} M" if x >= 1e6 else (f"{x / 1e3:.1f} k" if x >= 1e4 else f"{x:.0f}")


def _rate_cell(part):
  """``updates/s (x the loop, % of dense)`` of a measured rate."""
  pct = f", {100 * part['fraction_of_dense']:.0f}%" if "fraction_of_dense" in part else ""
  return f"{_fmt_rate(part['updates_per_s'])} ({part['speedup_vs_loop']:.1f}x{pct})"


def markdown(result) -> str:
  meta = result["meta"]
  lines = [
    "# Simulator speed (`benchmarks/speed.py`)",
    "",
    f"Device: **{meta['device_kind']}** ({meta['platform']}, {meta['cpu_count']} CPU cores, "
    f"{meta.get('num_devices', 1)} JAX device(s)), "
    f"jax {meta['jax']}; default precision on this platform: `{meta['default_precision']}`. "
    f"FedAvg, {LOCAL_STEPS} local steps of batch {BATCH}, {EXAMPLES} examples per client, full "
    "participation. Command: `" + meta["command"] + "`.",
    "",
  ]
  dense = result.get("dense")
  if dense:
    lines += ["## Dense matmul rate (the yardstick)", "", "| precision | GFLOP/s | size |"]
    lines += ["|---|---|---|"]
    for p, d in dense.items():
      lines.append(f"| {p} | {d['flops_per_s'] / 1e9:.1f} | {d.get('size')} |")
    lines.append("")
  wl = result.get("workloads")
  if wl:
    lines += [
      f"## Client updates per second ({wl['precision']})",
      "",
      "x = speed-up over the per-client jitted loop (timed on up to "
      f"{LOOP_CLIENTS} clients); % = achieved FLOP/s as a share of the dense {wl['precision']} "
      "rate; auto's plan in brackets; 'auto, mesh': `fd.run(..., mesh=make_mesh())` with the "
      "clients split over all devices of the process (on CPU one device per core, "
      "`--cpu-devices`, as `fedjax-dro run --devices auto`; one device: '-').",
      "",
      "| model | n | params | MFLOP/update | loop | vmap | map | chunked | auto | auto, mesh | "
      "compile s (auto) | memory MB (auto) |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in wl["rows"]:

      def cell(b, r=r):
        return _rate_cell(r[b]) if b in r else "-"

      auto = r.get("auto", {})
      mem = auto.get("memory", {}).get("total")
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {r['num_params']} | "
        f"{r['flops_per_update'] / 1e6:.1f} | {_fmt_rate(r['loop']['updates_per_s'])} | "
        f"{cell('vmap')} | {cell('map')} | {cell('chunked')} | {cell('auto')} "
        f"[{plan_label(auto)}] | {cell('auto_mesh')} | {auto.get('compile_s', float('nan')):.1f} | "
        f"{'-' if mem is None else f'{mem / 2**20:.0f}'} |"
      )
    if wl.get("skipped"):
      s = ", ".join(f"{x['model']} n={x['num_clients']}" for x in wl["skipped"])
      lines += ["", f"Skipped (over --max-gflop-per-round): {s}."]
    lines.append("")
  ceiling = result.get("ceiling")
  if ceiling and ceiling.get("rows"):
    lines += [
      f"## Matmul ceiling: what XLA's own kernels allow ({ceiling['precision']})",
      "",
      "The matrix products of one local step of c clients side by side (the `dot_general`s the",
      "step traces to), each timed alone in the fastest of its 8 operand and result layouts;",
      f"{LOCAL_STEPS} x their sum is the least time c updates can take with everything else",
      "(sampling, softmax, SGD update, aggregation, loop overhead) free. Best over c; the loop",
      "and `auto` measured in the same section. x = speed-up over the per-client loop, % = share",
      "of the dense rate.",
      "",
      "| model | n | loop | auto | ceiling | c at the ceiling | auto / ceiling |",
      "|---|---|---|---|---|---|---|",
    ]
    for r in ceiling["rows"]:
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {_fmt_rate(r['loop_updates_per_s'])} | "
        f"{_rate_cell(r['auto'])} [{r['auto']['plan']}] | {_rate_cell(r['ceiling'])} | "
        f"{r['ceiling']['chunk']} | {100 * r['auto_of_ceiling']:.0f}% |"
      )
    lines += [
      "",
      "The products at the ceiling (batch x m x k x n, the fastest layout, GFLOP/s, share of",
      "the step's product time); the ceiling at every c:",
      "",
      "| model | products | ceiling updates/s by c |",
      "|---|---|---|",
    ]
    for r in ceiling["rows"]:
      prods = "; ".join(
        f"{p['batch']}x{p['m']}x{p['k']}x{p['n']} `{p['layout']}` {p['gflop_per_s']:.0f} "
        f"({100 * p['share']:.0f}%)"
        for p in r["ceiling"]["products"]
      )
      chunks = ", ".join(f"{c['chunk']}: {_fmt_rate(c['updates_per_s'])}" for c in r["by_chunk"])
      lines.append(f"| {r['model']} | {prods} | {chunks} |")
    lines.append("")
  pr = result.get("precision")
  if pr and pr.get("rows"):
    lines += [
      "## Precision policies (auto backend)",
      "",
      "| model | n | precision | updates/s | % of dense (same precision) | compile s |",
      "|---|---|---|---|---|---|",
    ]
    for r in pr["rows"]:
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {r['precision']} | "
        f"{_fmt_rate(r['updates_per_s'])} | {100 * r['fraction_of_dense']:.0f}% | "
        f"{r['compile_s']:.1f} |"
      )
    lines.append("")
  for block in result.get("algorithms") or []:
    lines += [
      f"## Round time relative to FedAvg ({block['model']}, n = {block['num_clients']})",
      "",
      "| algorithm | ms / round | x FedAvg | compile s |",
      "|---|---|---|---|",
    ]
    for r in sorted(block["rows"], key=lambda r: r.get("vs_fedavg", math.inf)):
      if "error" in r:
        lines.append(f"| {r['algorithm']} | error: {r['error']} | | |")
        continue
      lines.append(
        f"| {r['algorithm']} | {1e3 * r['s_per_round']:.2f} | {r['vs_fedavg']:.2f} | "
        f"{r['compile_s']:.1f} |"
      )
    proj = block.get("karula_projection")
    if proj:
      lines += [
        "",
        f"Karula's pairwise projection alone (dual, n = {block['num_clients']}, D = ones): "
        f"{1e3 * proj['s']:.1f} ms per call ({proj['iterations']} iterations).",
      ]
    lines.append("")
  run = result.get("run")
  if run:
    r = run["run"]
    lines += [
      f"## `fd.run` against its compiled chunk ({run['model']}, n = {run['num_clients']})",
      "",
      "| | s |",
      "|---|---|",
      f"| compiled chunk, per round (steady) | {run['compiled_chunk_s_per_round']:.4f} |",
      f"| fd.run, {run['rounds']} rounds: compile (rounds + evaluation) | {r['compile_s']:.2f} |",
      f"| fd.run, {run['rounds']} rounds: run (incl. one evaluation) | {r['wall_s']:.3f} |",
      f"| fd.run, per round incl. evaluation | {r['s_per_round_incl_eval']:.4f} |",
      f"| fd.run, outside compile and run (validation, init, setup) | {r['other_s']:.3f} |",
      f"| evaluation of all clients, per chunk (estimate) | {run['eval_s_per_chunk_estimate']:.3f} |",
      f"| data build + transfer (not in fd.run) | {run['data_build_and_transfer_s']:.2f} |",
    ]
    if "model_init_first_call_s" in run:
      lines.append(
        f"| model.init, first call (in fd.run without init_params; compiles) | "
        f"{run['model_init_first_call_s']:.2f} |"
      )
    again = run.get("run_again_other_seed")
    if again:
      lines += [
        f"| fd.run again, another seed: total (compile {again['compile_s']:.2f}: programs "
        f"reused) | {again['total_s']:.3f} |",
        f"| fd.run the first time: total | {r['total_s']:.3f} |",
      ]
    lines.append("")
  fold = result.get("folding")
  if fold:
    lines += [
      "## Shared model: client axis folded into the batch",
      "",
      "ms per call (best of 5); FedSGD's gradient: one local step per client (`local_round`) vs one",
      "backward pass over all clients' minibatches (`federated_gradient`); evaluation of a global",
      "model: one `vmap` over all clients vs the `auto` backend (chunks when memory is short).",
      "",
      "| model | n | gradient per client | gradient folded | x | eval vmap | eval auto | x |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for r in fold["rows"]:
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {1e3 * r['grad_per_client_s']:.1f} | "
        f"{1e3 * r['grad_folded_s']:.1f} | {r['grad_per_client_s'] / r['grad_folded_s']:.2f} | "
        f"{1e3 * r['eval_vmap_s']:.1f} | {1e3 * r['eval_auto_s']:.1f} | "
        f"{r['eval_vmap_s'] / r['eval_auto_s']:.2f} |"
      )
    lines.append("")
  dev = result.get("devices")
  if dev and dev.get("rows"):
    lines += [
      f"## A sweep on {dev['devices']} devices",
      "",
      "`fd.sweep` of 4 learning rates, seconds per call (best of 3, after a warm-up call): one",
      "device, then a mesh over all devices with the configurations split (`sweep` axis) or the",
      "clients split (`clients` axis); in brackets the speed-up over one device.",
      "",
      "| model | n | rounds | one device | configurations split | clients split |",
      "|---|---|---|---|---|---|",
    ]

    def split(r, name):
      if f"{name}_s" not in r:
        return "-"
      return f"{r[f'{name}_s']:.2f} ({r[f'{name}_speedup']:.2f}x)"

    for r in dev["rows"]:
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {r['rounds']} | {r['one_device_s']:.2f} | "
        f"{split(r, 'configs_split')} | {split(r, 'clients_split')} |"
      )
    lines.append("")
  cache = result.get("sweep_cache")
  if cache and cache.get("rows"):
    lines += [
      "## A sweep's rows share the CPU cache target",
      "",
      "`fd.sweep` of 4 learning rates on one device, seconds per call (best of 3, after a warm-up",
      "call): each row's client chunks planned into its share of `AUTO_CPU_CHUNK_BYTES` (the",
      "default) vs into the whole target, as one run (clients per chunk in brackets).",
      "",
      "| model | n | rounds | rows share the target | whole target per row | speed-up |",
      "|---|---|---|---|---|---|",
    ]
    for r in cache["rows"]:
      chunks = {k: ",".join(map(str, r[f"{k}_chunks"])) for k in ("row_shared", "whole_per_row")}
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {r['rounds']} | {r['row_shared_s']:.3f} "
        f"({chunks['row_shared']}) | {r['whole_per_row_s']:.3f} ({chunks['whole_per_row']}) | "
        f"{r['speedup']:.2f}x |"
      )
    lines.append("")
  acc = result.get("acceptance")
  if acc:
    lines += ["## Acceptance checks (this run)", ""]
    lines += [f"- {a}" for a in acc]
    lines.append("")
  return "\n".join(lines)


def loop_ceiling(row, target):
  """What a speed-up of ``target`` over the per-client loop asks of the hardware.

  A backend's speed-up over the loop divided by its share of the dense matmul rate is the same
  for every backend of the row (both are its updates/s over a constant: the loop's rate, and the
  dense rate over the FLOP per update), so it is the speed-up at 100% of the dense rate; the
  target needs ``target / ceiling`` of that rate.
  """
  auto = row.get("auto") or {}
  x, f = auto.get("speedup_vs_loop"), auto.get("fraction_of_dense")
  if not x or not f:
    return ""
  ceiling = x / f
  return (
    f"; the loop runs {row['loop']['updates_per_s'] / 1e3:.1f} k updates/s, so 100% of the "
    f"dense rate would be {ceiling:.0f}x and {target}x needs {100 * target / ceiling:.0f}% of "
    f"it, where auto reaches {100 * f:.0f}%"
  )


# The CPU acceptance targets of issue 10 the ceiling section is compared with: (model, n) ->
# (the row's measure, the target, how it is written).
CEILING_TARGETS = {
  ("softmax", 1000): ("speedup_vs_loop", 60.0, "60x the loop"),
  ("mlp", 1000): ("fraction_of_dense", 0.6, "60% of the dense rate"),
}


def ceiling_lines(result):
  """One acceptance line per row of the ``ceiling`` section: ``auto`` against the ceiling, and
  where a target is set for the row (:data:`CEILING_TARGETS`), whether it lies above it."""
  out = []
  for r in (result.get("ceiling") or {}).get("rows", []):
    auto, c = r["auto"], r["ceiling"]

    def shown(part):
      pct = f", {100 * part['fraction_of_dense']:.0f}%" if "fraction_of_dense" in part else ""
      return f"{part['speedup_vs_loop']:.1f}x the loop{pct}"

    line = (
      f"ceiling, {r['model']} n={r['num_clients']}: auto {shown(auto)}; XLA's matmul ceiling "
      f"{shown(c)} ({c['chunk']} clients side by side, every other operation free): auto "
      f"reaches {100 * r['auto_of_ceiling']:.0f}% of it"
    )
    target = CEILING_TARGETS.get((r["model"], r["num_clients"]))
    if target and target[0] in c:
      measure, value, text = target
      where = "above the ceiling" if c[measure] < value else "within the ceiling"
      line += f" (target {text}: {where})"
    out.append(line)
  return out


def acceptance(result):
  out = []
  wl = result.get("workloads") or {}
  for r in wl.get("rows", []):
    best = max((r[b] for b in BACKENDS if b in r), key=lambda c: c["updates_per_s"], default=None)
    mesh = r.get("auto_mesh")
    on_mesh = f" ({mesh['devices']} devices)" if mesh else ""
    if r["model"] == "mlp" and r["num_clients"] == 1000 and "auto" in r:
      f = r["auto"].get("fraction_of_dense", float("nan"))
      fb = best.get("fraction_of_dense", float("nan"))
      fm = mesh.get("fraction_of_dense", float("nan")) if mesh else float("nan")
      out.append(
        f"MLP n=1000: auto {100 * f:.0f}% of the dense {wl['precision']} rate on one device"
        + (f", {100 * fm:.0f}% on the mesh{on_mesh}" if mesh else "")
        + f" (best single-device backend {100 * fb:.0f}%; "
        f"target 60% on CPU, 30% of bf16 on GPU): "
        f"{'PASS' if max(f, fm) >= 0.6 else 'FAIL'}"
      )
    if r["model"] == "softmax" and r["num_clients"] == 1000 and "auto" in r:
      x = r["auto"]["speedup_vs_loop"]
      xm = mesh["speedup_vs_loop"] if mesh else float("nan")
      out.append(
        f"softmax regression n=1000: auto {x:.0f}x the per-client loop on one device"
        + (f", {xm:.0f}x on the mesh{on_mesh}" if mesh else "")
        + f" (target 60x{loop_ceiling(r, 60)}): "
        f"{'PASS' if max(x, xm) >= 60 else 'FAIL'}"
      )
    if r["model"].startswith("cnn") and r["num_clients"] == 1000 and "auto" in r:
      x = r["auto"]["speedup_vs_loop"]
      out.append(f"{r['model']} n=1000: auto {x:.1f}x the per-client loop (GPU target 25x)")
  out += ceiling_lines(result)
  for block in result.get("algorithms") or []:
    worst = [r for r in block["rows"] if r.get("vs_fedavg", 0) > 2]
    names = ", ".join(f"{r['algorithm']} {r['vs_fedavg']:.1f}x" for r in worst) or "none"
    out.append(f"algorithms over 2x FedAvg ({block['model']}, n={block['num_clients']}): {names}")
  return out


def render(out, markdown_out=None):
  """Rewrite the markdown of the results file ``out`` (and its acceptance checks) unmeasured."""
  with open(out) as f:
    result = json.load(f)
  if not isinstance(result, dict) or "meta" not in result:
    raise ValueError(f"--render: {out} is not a results file of benchmarks/speed.py (no 'meta')")
  md_path = _write(result, out, markdown_out)
  print(f"rewrote {md_path} from {out}")
  return result


def _write(result, out, markdown_out=None):
  """Derive the acceptance checks, save the JSON to ``out`` and its markdown; returns its path."""
  result["acceptance"] = acceptance(result)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump(result, f, indent=2, default=float)
  md_path = markdown_out or os.path.splitext(out)[0] + ".md"
  with open(md_path, "w") as f:
    f.write(markdown(result))
  return md_path


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny grid for a smoke test")
  parser.add_argument("--sections", default=",".join(SECTIONS))
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--backends", default=",".join(BACKENDS))
  parser.add_argument("--max-clients", type=int, default=None)
  parser.add_argument("--max-map-clients", type=int, default=1000, help="map backend up to this n")
  parser.add_argument("--max-gflop-per-round", type=float, default=None)
  parser.add_argument("--precision", default=None, choices=PRECISIONS)
  parser.add_argument("--precision-clients", type=int, default=1000)
  parser.add_argument("--out", default=os.path.join(HERE, "results", "speed.json"))
  parser.add_argument("--markdown-out", default=None)
  parser.add_argument("--merge", action="store_true", help="keep other sections of --out")
  parser.add_argument(
    "--cpu-devices",
    default="auto",
    help="on CPU, split the cores into this many JAX devices before JAX starts ('auto': one per "
    "core, as `fedjax-dro run --devices auto`), for the 'auto, mesh' column; every other column "
    "runs on one of them. XLA_FLAGS with a device count takes precedence",
  )
  parser.add_argument(
    "--render",
    action="store_true",
    help="measure nothing: re-derive the acceptance checks of --out and rewrite its markdown",
  )
  args = parser.parse_args(argv)
  if args.render:
    return render(args.out, args.markdown_out)
  cpu_devices = local_cpu_cores() if args.cpu_devices == "auto" else int(args.cpu_devices)
  if cpu_devices > 1:
    request_cpu_devices(cpu_devices)
  cpu = jax.default_backend() == "cpu"
  args.sections = [s for s in args.sections.split(",") if s]
  args.models = [m for m in args.models.split(",") if m]
  args.backends = [b for b in args.backends.split(",") if b]
  for s in args.sections:
    if s not in SECTIONS:
      parser.error(f"unknown section {s!r}; choose from {SECTIONS}")
  for m in args.models:
    if m not in MODELS:
      parser.error(f"unknown model {m!r}; choose from {MODELS}")
  if args.quick:
    args.max_clients = min(args.max_clients or 20, 20)
    args.max_map_clients = min(args.max_map_clients, 20)
    args.precision_clients = min(args.precision_clients, 10)
    args.max_gflop_per_round = args.max_gflop_per_round or 50.0
  elif args.max_clients is None:
    args.max_clients = 10**9
  if args.max_gflop_per_round is None and cpu:
    args.max_gflop_per_round = 600.0
  args.algorithm_workloads = [("softmax", 1000), ("mlp", 100)]
  if args.quick:
    args.algorithm_workloads = [("softmax", 10)]
  args.run_workload = ("mlp", 10 if args.quick else 1000)
  args.devices_workloads = (
    [("softmax", 10), ("mlp", 10)]
    if args.quick
    else [
      ("softmax", 10),
      ("softmax", 100),
      ("mlp", 100),
    ]
  )
  args.sweep_cache_workloads = (
    [("softmax", 10), ("mlp", 10)]
    if args.quick
    else [("softmax", 1000), ("mlp", 100), ("mlp", 400)]
  )
  args.ceiling_workloads = (
    [("softmax", 10), ("mlp", 10)] if args.quick else [("softmax", 1000), ("mlp", 1000)]
  )
  args.folding_workloads = [("softmax", 1000), ("mlp", 1000), ("cnn-patches", 100)]
  if args.quick:
    args.folding_workloads = [("softmax", 10), ("mlp", 10)]

  device = jax.devices()[0]
  result = {}
  if args.merge and os.path.exists(args.out):
    with open(args.out) as f:
      result = json.load(f)
  result["meta"] = {
    "platform": jax.default_backend(),
    "device": str(device),
    "device_kind": getattr(device, "device_kind", str(device)),
    "cpu_count": os.cpu_count(),
    "python": sys.version.split()[0],
    "jax": jax.__version__,
    "machine": platform.machine(),
    "default_precision": default_precision(),
    "command": (
      (f"XLA_FLAGS={os.environ['XLA_FLAGS']} " if os.environ.get("XLA_FLAGS") else "")
      + "python benchmarks/speed.py "
      + " ".join(argv if argv is not None else sys.argv[1:])
    ),
    "num_devices": len(jax.devices()),
    "local_steps": LOCAL_STEPS,
    "batch_size": BATCH,
    "examples_per_client": EXAMPLES,
  }
  # measured in every invocation: each section divides by its own process's rate
  dense = result["dense"] = dense_rates(args.quick)
  if "workloads" in args.sections:
    result["workloads"] = workloads(args, dense)
  if "ceiling" in args.sections:
    result["ceiling"] = matmul_ceiling(args, dense)
  if "precision" in args.sections:
    result["precision"] = precisions(args, dense)
  if "algorithms" in args.sections:
    result["algorithms"] = algorithms(args)
  if "run" in args.sections:
    result["run"] = run_path(args)
  if "folding" in args.sections:
    result["folding"] = folding(args)
  if "devices" in args.sections:
    result["devices"] = devices_section(args)
  if "sweep_cache" in args.sections:
    result["sweep_cache"] = sweep_cache_section(args)
  md_path = _write(result, args.out, args.markdown_out)
  print(markdown(result))
  print(f"wrote {args.out} and {md_path}")
  return result


if __name__ == "__main__":
  main()
