"""FedAvg round throughput: client updates per second, backends side by side with a per-client loop.

For n in {10, 100, 1000} clients (full participation) and two models — tabular logistic regression
and an EMNIST-sized MLP 784-200-200-62 — this measures, in one process:

* ``loop``: the FedJAX execution pattern — one jitted client update (``local_steps`` minibatch SGD
  steps) called from a Python loop over clients, deltas accumulated on device, then the server step;
* the simulator's compiled chunk of rounds (``lax.scan`` over rounds) with the ``vmap``, ``map``,
  ``chunked`` and ``auto`` backends.

Times are taken after a warm-up call (compilation excluded, reported separately), with
``block_until_ready``; the reported figure is the median over repeats. Ratios are to the loop.

    python benchmarks/round_throughput.py            # full grid (a few minutes on 2 CPU cores)
    python benchmarks/round_throughput.py --quick    # tiny grid (CI smoke)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.algorithms import fedavg
from fedjax_dro.core.clients import resolve_backend
from fedjax_dro.data import from_client_arrays
from fedjax_dro.models.base import client_loss_and_grad, num_parameters


def make_data(kind, n, examples, seed=0):
  rng = np.random.default_rng(seed)
  if kind == "logreg":
    d = 50
    w = rng.normal(size=d)
    xs = [rng.normal(size=(examples, d)).astype(np.float32) for _ in range(n)]
    ys = [(x @ w + rng.normal(size=examples) > 0).astype(np.int32) for x in xs]
    return from_client_arrays(xs, ys), models.logistic_regression(d)
  xs = [rng.normal(size=(examples, 784)).astype(np.float32) for _ in range(n)]
  ys = [rng.integers(0, 62, examples).astype(np.int32) for _ in range(n)]
  return from_client_arrays(xs, ys), models.mlp((784,), 62, (200, 200))


def time_fn(fn, repeats):
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def bench_loop(model, data, params, local_steps, batch_size, lr, rounds, repeats):
  """Per-client jitted update in a Python loop over clients (the FedJAX pattern)."""

  @jax.jit
  def client_update(w0, x, y, nex, key):
    def step(w, k):
      _, g = client_loss_and_grad(model, w, x, y, nex, k, batch_size)
      return jax.tree.map(lambda a, b: a - lr * b, w, g), None

    w, _ = jax.lax.scan(step, w0, jax.random.split(key, local_steps))
    return jax.tree.map(jnp.subtract, w, w0)

  @jax.jit
  def server_update(w, total, weight_sum):
    return jax.tree.map(lambda a, t: a + t / weight_sum, w, total)

  xs = [data.x[i] for i in range(data.num_clients)]
  ys = [data.y[i] for i in range(data.num_clients)]
  nex = [data.num_examples[i] for i in range(data.num_clients)]
  weights = np.asarray(data.num_examples, np.float32)

  def one_round(w, key):
    keys = jax.random.split(key, data.num_clients)
    total = None
    for i in range(data.num_clients):
      delta = client_update(w, xs[i], ys[i], nex[i], keys[i])
      delta = jax.tree.map(lambda a: weights[i] * a, delta)  # noqa: B023 (called within the iteration)
      total = delta if total is None else jax.tree.map(jnp.add, total, delta)
    return server_update(w, total, weights.sum())

  def many_rounds():
    w = params
    for r in range(rounds):
      w = one_round(w, jax.random.PRNGKey(r))
    return w

  t0 = time.perf_counter()
  jax.block_until_ready(one_round(params, jax.random.PRNGKey(0)))
  warm = time.perf_counter() - t0
  return time_fn(many_rounds, repeats) / rounds, warm


def bench_backend(model, data, params, backend, local_steps, batch_size, lr, rounds, repeats):
  """The simulator's compiled chunk of ``rounds`` rounds (``fd.compile_rounds``, the program
  ``fd.run`` executes), timed after a warm-up call; ``(seconds per round, compile seconds)``."""
  alg = fedavg(model, local_steps=local_steps, batch_size=batch_size, backend=backend)
  program = fd.compile_rounds(
    alg, data, rounds=rounds, hparams={"client_lr": lr}, init_params=params, seed=1
  )
  timing = program.time(repeats=repeats)
  return timing.seconds_per_round, program.compile_time


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny grid for a smoke test")
  parser.add_argument(
    "--out", default=os.path.join(os.path.dirname(__file__), "results", "round_throughput.json")
  )
  parser.add_argument("--clients", default=None, help="comma-separated client counts")
  parser.add_argument("--models", default="logreg,mlp")
  args = parser.parse_args(argv)
  clients = (
    [int(c) for c in args.clients.split(",")]
    if args.clients
    else ([10, 50] if args.quick else [10, 100, 1000])
  )
  local_steps, batch_size, lr = 5, 16, 0.05
  examples = {"logreg": 64, "mlp": 32}
  results = []
  for kind in args.models.split(","):
    for n in clients:
      data, model = make_data(kind, n, examples[kind])
      params = model.init(jax.random.PRNGKey(0))
      rounds = max(1, min(20, 2000 // n)) if kind == "logreg" else max(1, min(5, 200 // n))
      repeats = 3
      row = {
        "model": kind,
        "num_clients": n,
        "num_params": num_parameters(params),
        "local_steps": local_steps,
        "batch_size": batch_size,
        "rounds_timed": rounds,
      }
      t_loop, warm = bench_loop(model, data, params, local_steps, batch_size, lr, rounds, repeats)
      row["loop"] = {
        "s_per_round": t_loop,
        "client_updates_per_s": n / t_loop,
        "first_round_s": warm,
      }
      for backend in ("vmap", "map", "chunked", "auto"):
        t, comp = bench_backend(
          model, data, params, backend, local_steps, batch_size, lr, rounds, repeats
        )
        row[backend] = {
          "s_per_round": t,
          "client_updates_per_s": n / t,
          "compile_s": comp,
          "speedup_vs_loop": t_loop / t,
        }
      row["auto_resolves_to"] = resolve_backend("auto", row["num_params"])
      results.append(row)
      print(
        json.dumps(
          {
            k: (v if not isinstance(v, dict) else round(v["client_updates_per_s"], 1))
            for k, v in row.items()
          }
        ),
        flush=True,
      )
  meta = {
    "platform": jax.default_backend(),
    "devices": [str(d) for d in jax.devices()],
    "cpu_count": os.cpu_count(),
    "python": sys.version.split()[0],
    "jax": jax.__version__,
    "machine": platform.machine(),
    "local_steps": local_steps,
    "batch_size": batch_size,
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump({"meta": meta, "results": results}, f, indent=2)
  print()
  print(
    f"FedAvg client updates / s ({meta['platform']}, {meta['cpu_count']} cores, J={local_steps}, B={batch_size}); "
    f"x = speed-up over the per-client jitted loop"
  )
  print("| model | n | params | loop | vmap | map | chunked | auto (->) |")
  print("|---|---|---|---|---|---|---|---|")
  for r in results:
    cell = lambda b: f"{r[b]['client_updates_per_s']:.0f} ({r[b]['speedup_vs_loop']:.1f}x)"  # noqa: B023 (called within the iteration)
    print(
      f"| {r['model']} | {r['num_clients']} | {r['num_params']} | {r['loop']['client_updates_per_s']:.0f} | "
      f"{cell('vmap')} | {cell('map')} | {cell('chunked')} | {cell('auto')} ({r['auto_resolves_to']}) |"
    )
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
