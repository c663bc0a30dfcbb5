"""The roofline of a round: the least time the device's peak rates allow for its work.

A program that performs ``F`` floating-point operations and moves ``Q`` bytes between the
processor and its main memory takes at least ``max(F / P, Q / W)`` on a device of peak FLOP rate
``P`` and memory bandwidth ``W`` (the roofline model, Williams, Waterman and Patterson, 2009).
Small per-client products (a batch of 20 rows against a client's own 3136 x 2048 weights) do
few operations per byte of weights they read and write, so their limit is the memory term, not
the dense-matmul rate; "% of the dense rate" understates how close such a round is to what the
device allows. This module measures the two peaks, counts a program's work and states the bound:

* :func:`copy_bandwidth`: ``W``, measured as a jitted ``1.0001 * x`` over a float32 array (each
  byte read once and written once: ``2 x size`` bytes moved, the way STREAM counts a copy), of
  the accelerator's main memory, or on a CPU the best of the cache and memory sizes;
* ``P``: the measured dense-matmul rate of the round's precision
  (``speed_workloads.dense_rates``);
* :func:`program_cost`: ``F`` and ``Q`` from XLA's cost analysis of a compiled program. ``Q`` is
  read from the program compiled for the device the round runs on (its fusion decides what
  reaches memory); ``F`` is counted by the CPU compiler from the same function (on a GPU the
  products are cuBLAS / cuDNN library calls, which the GPU cost analysis may count as zero
  FLOPs; both counts are kept: ``flops_device`` beside ``flops``);
* :func:`bound`: the roofline arithmetic, and :func:`share`: the bound's time over a measured
  time (1 = at the roofline).

Cost analysis counts a loop's body once, whatever its trip count, so a round's cost is built
from a program without loops: one local step of the round's clients side by side (gather of the
minibatch, forward, backward, update), times the steps the round executes. What a round adds to
its steps (sampling, aggregation, the server step) is left out: the bound is a lower bound.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np


def program_cost(compiled) -> dict:
  """``{"flops", "bytes"}`` of XLA's cost analysis of a compiled program (NaN where absent)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  cost = cost or {}
  return {
    "flops": float(cost.get("flops", float("nan"))),
    "bytes": float(cost.get("bytes accessed", float("nan"))),
  }


def function_cost(fn, *args) -> dict:
  """The work of ``jax.jit(fn)(*args)``: ``bytes`` from its compilation for the default device,
  ``flops`` from its compilation for the CPU (``flops_device`` / ``bytes_cpu``: the other two
  counts, for the record)."""
  device = program_cost(jax.jit(fn).lower(*args).compile())
  cpu_dev = jax.devices("cpu")[0]
  cpu_args = jax.device_put(args, cpu_dev)
  with jax.default_device(cpu_dev):
    cpu = program_cost(jax.jit(fn).lower(*cpu_args).compile())
  return {
    "flops": cpu["flops"],
    "bytes": device["bytes"] if np.isfinite(device["bytes"]) else cpu["bytes"],
    "flops_device": device["flops"],
    "bytes_cpu": cpu["bytes"],
  }


def copy_bandwidth(quick: bool = False, repeats: int = 7) -> dict:
  """The device's measured memory bandwidth: bytes moved per second by ``x <- 1.0001 x`` over a
  float32 array (each byte read once and written once), repeated ``r`` times inside one jitted
  loop (``r`` large for small arrays, so the call's dispatch does not count), best of
  ``repeats`` calls after a warm-up. Sizes: on an accelerator 1 and 4 GiB (its main memory: the
  rounds measured here read and write gigabytes of per-client weights); on a CPU from 1 MiB to
  256 MiB, the best kept (the CPU backend plans a round's chunks to fit its caches, so the
  bandwidth its rounds can reach is the cache's: a lower bound must use it); quick: 1 and 4 MiB.
  Returns the best ``bytes_per_s`` and, by size, every rate measured (``by_size``)."""
  cpu = jax.default_backend() == "cpu"
  sizes = (2**20, 2**22) if quick else ((2**20, 2**22, 2**26, 2**28) if cpu else (2**30, 2**32))
  best = {"bytes_per_s": 0.0, "by_size": {}}
  for nbytes in sizes:
    reps = max(1, min(256, 2**28 // nbytes))
    scale = jax.jit(lambda x, r=reps: jax.lax.fori_loop(0, r, lambda i, y: 1.0001 * y, x))
    x = jnp.ones((nbytes // 4,), jnp.float32)
    jax.block_until_ready(scale(x))
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(scale(x))
      times.append(time.perf_counter() - t0)
    rate = 2 * nbytes * reps / min(times)
    best["by_size"][str(nbytes)] = rate
    if rate > best["bytes_per_s"]:
      best.update(bytes_per_s=rate, size_bytes=nbytes, s=min(times), repeats_in_loop=reps)
    del x
  print(f"copy bandwidth: {best['bytes_per_s'] / 1e9:.1f} GB/s ({best['size_bytes']} bytes)")
  return best


def bound(flops: float, nbytes: float, peak_flops: float, bandwidth: float) -> dict:
  """The roofline of ``flops`` operations moving ``nbytes`` bytes on a device of ``peak_flops``
  FLOP/s and ``bandwidth`` bytes/s.

  Returns ``compute_s = flops / peak_flops``, ``memory_s = nbytes / bandwidth``, ``bound_s``
  (their maximum), ``limited_by`` (``"compute"`` or ``"memory"``), the arithmetic ``intensity``
  (FLOP per byte) and the device's ``ridge`` intensity (``peak_flops / bandwidth``: above it a
  program is compute-bound).
  """
  for name, v in (("peak_flops", peak_flops), ("bandwidth", bandwidth)):
    if not v > 0:
      raise ValueError(f"{name} must be a positive rate, got {v!r}")
  for name, v in (("flops", flops), ("nbytes", nbytes)):
    if not v >= 0:
      raise ValueError(f"{name} must be a non-negative count, got {v!r}")
  compute_s, memory_s = flops / peak_flops, nbytes / bandwidth
  return {
    "compute_s": compute_s,
    "memory_s": memory_s,
    "bound_s": max(compute_s, memory_s),
    "limited_by": "compute" if compute_s >= memory_s else "memory",
    "intensity": flops / nbytes if nbytes else float("inf"),
    "ridge": peak_flops / bandwidth,
  }


def share(bound_s: float, measured_s: float) -> float:
  """The achieved share of the roofline: ``bound_s / measured_s`` (1 = at the bound)."""
  if not measured_s > 0:
    raise ValueError(f"measured_s must be a positive time, got {measured_s!r}")
  return bound_s / measured_s


def cohort_step(model, batch_size: int, lr: float = 0.05):
  """``step(params[c, ...], x[c, m, ...], y[c, m], rows[c, B]) -> params``: one local SGD step
  of ``c`` clients side by side (their minibatch gathered by ``rows``), the loop-free program
  whose cost, times the steps a round executes, is the round's local work."""
  from fedjax_dro.models import client_loss

  def one(w, x, y, rows):
    bx, by = x[rows], y[rows]
    g = jax.grad(lambda p: client_loss(model, p, bx, by, jnp.ones(rows.shape, bool)))(w)
    return jax.tree.map(lambda a, b: (a - lr * b).astype(a.dtype), w, g)

  del batch_size  # the rows' shape carries it
  return jax.vmap(one)


def cohort_step_cost(model, params, x, y, batch_size: int) -> dict:
  """The cost of one local step of the ``c = x.shape[0]`` clients of ``x`` side by side, each
  from its own copy of ``params`` (the first ``batch_size`` rows as its minibatch)."""
  c = x.shape[0]
  stacked = jax.tree.map(lambda a: jnp.broadcast_to(a, (c,) + a.shape), params)
  rows = jnp.broadcast_to(jnp.arange(batch_size, dtype=jnp.int32), (c, batch_size))
  out = function_cost(cohort_step(model, batch_size), stacked, x, y, rows)
  out["clients"] = int(c)
  return out


def roofline_row(cost: dict, units: float, peak_flops: float, bandwidth: float, measured_s: float):
  """The roofline of ``units`` times the work of ``cost`` (``{"flops", "bytes"}``) against a
  measured time: the bound, its terms and the achieved share."""
  b = bound(cost["flops"] * units, cost["bytes"] * units, peak_flops, bandwidth)
  return {**b, "measured_s": measured_s, "share": share(b["bound_s"], measured_s)}
