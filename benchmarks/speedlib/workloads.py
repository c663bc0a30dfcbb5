"""The workloads of ``benchmarks/speed.py`` and the timing every section shares: the models and
their random federations, XLA's FLOP count of a local step, the per-client jitted loop (FedJAX's
pattern), one backend's compiled rounds timed through ``fd.compile_rounds(...).time()``, and the
device's dense-matmul rate (the yardstick). Times are the best of several calls after a warm-up
call; why the best and not the median is said in ``speed.py``'s docstring."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.algorithms import fedavg
from fedjax_dro.common.model import client_loss_and_grad
from fedjax_dro.core import clients as client_backends
from fedjax_dro.core.precision import PRECISIONS
from fedjax_dro.data import from_client_arrays

MODELS = ("softmax", "logreg", "mlp", "cnn-lax", "cnn-patches", "cnn-auto")
TABULAR = ("softmax", "logreg")
BACKENDS = ("vmap", "map", "chunked", "auto")
CLIENTS = {"tabular": (10, 100, 1000, 10_000, 100_000), "deep": (10, 100, 1000, 10_000)}
LOCAL_STEPS, BATCH, EXAMPLES = 4, 32, 64
CHUNK = 64  # clients per chunk of the explicit "chunked" backend
LOOP_CLIENTS = 200  # the per-client loop is timed on at most this many clients (a rate)
# jax.default_matmul_precision of each precision policy (as in the dense yardstick).
MATMUL_PRECISION = {"float32": "highest", "tf32": "tensorfloat32", "bf16": "default"}


# The deep workloads' sizes (the MLP 784-200-200-62, the CNN 28x28 -> 62 with convolutions 32/64
# and a 128 dense layer); tiny_sizes() swaps in small ones for the tests of the GPU preset.
SIZES = {"image": (28, 28), "classes": 62, "mlp": (784, (200, 200)), "cnn": ((32, 64), 128)}
# the tiny MLP's first layer (256 x 128) is wide enough to be factored over 4 steps of 32 rows
TINY_SIZES = {"image": (8, 8), "classes": 10, "mlp": (256, (128, 16)), "cnn": ((4, 8), 16)}


@contextlib.contextmanager
def tiny_sizes():
  """Within the block, the MLP and the CNN are built in :data:`TINY_SIZES`."""
  saved = dict(SIZES)
  SIZES.update(TINY_SIZES)
  try:
    yield
  finally:
    SIZES.update(saved)


def make_model(kind):
  if kind == "softmax":
    return models.softmax_regression(64, 10)
  if kind == "logreg":
    return models.logistic_regression(64)
  if kind == "mlp":
    return models.mlp((SIZES["mlp"][0],), SIZES["classes"], SIZES["mlp"][1])
  features, dense = SIZES["cnn"]
  # cnn-auto, cnn-lax, cnn-patches
  return models.cnn(
    SIZES["image"], SIZES["classes"], features=features, dense=dense, conv=kind.split("-")[1]
  )


def make_data(kind, n, seed=0):
  """``n`` clients of ``EXAMPLES`` rows each (random features and labels: speed only)."""
  rng = np.random.default_rng(seed)
  shape = {"softmax": (64,), "logreg": (64,), "mlp": (SIZES["mlp"][0],)}.get(kind, SIZES["image"])
  classes = {"softmax": 10, "logreg": 2}.get(kind, SIZES["classes"])
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
  # Counted by the CPU compiler whatever the device: on a GPU the cost analysis reports no FLOPs
  # (the products are cuBLAS / cuDNN custom calls), also for a lowering to the CPU platform.
  cpu = jax.devices("cpu")[0]
  params, x, y = jax.device_put((params, x, y), cpu)
  with jax.default_device(cpu):
    nex = jnp.int32(x.shape[0])

    def step(w, key):
      return client_loss_and_grad(model, w, x, y, nex, key, BATCH)

    cost = jax.jit(step).lower(params, jax.random.PRNGKey(0)).compile().cost_analysis()
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
  """Seconds per round of the fastest timed call (see speed.py's docstring)."""
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
  if p["backend"] in ("vmap", "map"):
    return p["backend"]
  return f"chunks of {p['chunk_size']}"


def dense_product(precision):
  """The jitted ``a @ b`` the yardstick times for ``precision``, the precision set on the product
  itself (a ``default_matmul_precision`` context around the first call alone would leave the
  timed calls at JAX's default, which is TF32 for float32 operands on NVIDIA GPUs)."""
  mm = MATMUL_PRECISION[precision]
  return jax.jit(functools.partial(jnp.matmul, precision=None if mm == "default" else mm))


def dense_rates(quick):
  """The device's dense-matmul rate per precision: best over a few square sizes (FLOP/s)."""
  cpu = jax.default_backend() == "cpu"
  sizes = (256, 512) if quick else ((1024, 2048) if cpu else (4096, 8192))
  out = {}
  for precision in PRECISIONS:
    dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32
    best = {"flops_per_s": 0.0}
    for n in sizes:
      a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
      b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
      f = dense_product(precision)
      jax.block_until_ready(f(a, b))
      t = time_calls(lambda: f(a, b), 3 if quick else 7)  # noqa: B023
      rate = 2 * n**3 / t
      if rate > best["flops_per_s"]:
        best = {"flops_per_s": rate, "size": n, "s": t}
    out[precision] = best
    print(f"dense {precision}: {best['flops_per_s'] / 1e9:.1f} GFLOP/s (n={best['size']})")
  return out


def run_meta(script, argv, load_before, **extra):
  """The ``meta`` block of a side-by-side benchmark's JSON: device, versions, command, load."""
  device = jax.devices()[0]
  return {
    "platform": jax.default_backend(),
    "device_kind": getattr(device, "device_kind", str(device)),
    "cpu_count": os.cpu_count(),
    "machine": platform.machine(),
    "jax": jax.__version__,
    "python": platform.python_version(),
    "command": f"python benchmarks/{script} " + " ".join(argv),
    **extra,
    "load_before": round(load_before, 2),
    "load_after": round(os.getloadavg()[0], 2),
    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
  }


def meta_line(meta):
  """The markdown line naming the device, JAX version, load and command of :func:`run_meta`."""
  return (
    f"Device: **{meta['device_kind']}** ({meta['platform']}, {meta['cpu_count']} CPU cores), jax "
    f"{meta['jax']}; load average before / after: {meta['load_before']} / {meta['load_after']}. "
    f"Command: `{meta['command']}`."
  )


def best_interleaved(progs, passes, repeats, best=None, skip=()):
  """Seconds per round of each compiled program of ``progs`` (name -> ``fd.compile_rounds``),
  timed in ``passes`` interleaved passes (a, b, a, b, ...), the best call of all kept (starting
  from ``best``; the names in ``skip`` keep their given time): a slow stretch of a shared
  machine hits every form alike."""
  best = dict(best or {name: float("inf") for name in progs})
  for _ in range(passes):
    for name, prog in progs.items():
      if name not in skip:
        best[name] = min(best[name], best_per_round(prog.time(repeats=repeats, warmup=0)))
  return best
