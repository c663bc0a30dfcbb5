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
  (softmax regression and the MLP at n = 1000: the CPU targets);
* ``precision``: every precision policy (float32, tf32, bf16) per workload at one n;
* ``algorithms``: the round time of every registered algorithm relative to FedAvg at equal
  settings (Karula's pairwise projection timed on its own line);
* ``folding``: where clients share one model, the client axis folded into the batch against the
  per-client computation it replaces: FedSGD's weighted gradient
  (:func:`fedjax_dro.core.local.federated_gradient` against one local step per client,
  ``local_round``) and the evaluation of a global model (the ``auto`` backend against one ``vmap``
  over all clients);
* ``roofline``: softmax and the MLP at n = 1000, the CNN at n = 100, each ``auto`` round against
  its roofline (``speedlib/roofline.py``: max(FLOPs / the dense rate, bytes / the copy bandwidth), both
  peaks measured in the same process);
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
    python benchmarks/speed.py --sections karula --merge   # Karula's round vs FedAvg's on a CNN
    python benchmarks/speed.py --render                # rewrite the markdown from the JSON
    python benchmarks/speed.py --preset gpu            # the GPU points in one call (speedlib/gpu.py)
    python benchmarks/speed.py --preset gpu --tiny     # the same code path, tiny sizes (tests)

``--max-gflop-per-round`` skips (and lists) configurations whose round needs more work than that
(default: 600 GFLOP on CPU, unlimited on accelerators), so a CPU run stays within minutes.
``--merge`` keeps the sections of an earlier results file that this invocation does not measure
(each section records the dense rate and device of its own process).

This file is the command line; the measuring lives in the modules beside it:
``speedlib/workloads.py`` (models, data, the per-client loop, one backend timed, the dense rate),
``speedlib/sections.py`` (every section but the ceiling and Karula's), ``speedlib/ceiling.py`` (the
matmul ceiling), ``speed_karula.py`` (Karula's round against FedAvg's on the CNN of the
``karula-femnist`` stand-in, the projection on its own line) and ``speedlib/report.py`` (markdown, acceptance checks, writing the results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import jax

from fedjax_dro.core.precision import PRECISIONS, default_precision
from fedjax_dro.engine import request_cpu_devices
from fedjax_dro.engine.sharding import local_cpu_cores

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # benchmarks/speedlib/ beside this file, however it is loaded
  sys.path.insert(0, HERE)

from speedlib import (
  ceiling as speed_ceiling,
  report as speed_report,
  roofline,
  sections as speed_sections,
  workloads as speed_workloads,
)
from speedlib.workloads import BACKENDS, BATCH, EXAMPLES, LOCAL_STEPS, MODELS

SECTIONS = (
  "workloads",
  "ceiling",
  "precision",
  "algorithms",
  "run",
  "folding",
  "devices",
  "sweep_cache",
  "karula",
  "roofline",
)


def _karula_section(args):
  import speed_karula  # imports ott-jax (the OT dissimilarities): only where this section runs

  return speed_karula.karula_section(
    speed_karula.parser().parse_args(["--quick"] if args.quick else [])
  )


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
  parser.add_argument(
    "--out",
    default=None,
    help="results JSON (default results/speed.json; with --preset gpu results/speed_gpu.json on a "
    "GPU, speed_gpu_<platform>.json elsewhere)",
  )
  parser.add_argument(
    "--preset",
    choices=("gpu",),
    default=None,
    help="'gpu': every GPU acceptance point in one call (speedlib/gpu.py): the CNN at "
    "n = 1000 against the per-client loop, the MLP in bf16 against the bf16 dense rate, 10,000 "
    "CNN clients, the anchors",
  )
  parser.add_argument("--tiny", action="store_true", help="with --preset gpu: tiny sizes (a test)")
  parser.add_argument(
    "--budget-s", type=float, default=None, help="with --preset gpu: seconds for the whole call"
  )
  parser.add_argument(
    "--sweep-rounds", type=int, default=20, help="with --preset gpu: rounds of the sweep anchor"
  )
  parser.add_argument(
    "--sweep-seeds",
    default="16",
    help="with --preset gpu: comma-separated seed counts of the sweep anchor, each a sweep of "
    "4 client learning rates x that many seeds (default 16: 64 configurations)",
  )
  parser.add_argument(
    "--sweep-backend",
    default="map",
    help="with --preset gpu: comma-separated backends of the sweep anchor, each measured: 'map' "
    "(each configuration's participants one at a time, the configurations side by side) or "
    "'chunked:N' (N participants at a time); default map",
  )
  parser.add_argument(
    "--gpu-sections",
    default=None,
    help="with --preset gpu: comma-separated sections (default: femnist, variants, sweep, "
    "roofline, cifar)",
  )
  parser.add_argument(
    "--merge-from",
    default=None,
    help="with --preset gpu: keep the sections not measured here from this results file",
  )
  parser.add_argument(
    "--trace-dir", default=None, help="with --preset gpu: keep the FEMNIST round's trace here"
  )
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
  if args.tiny and args.preset is None:
    parser.error("--tiny goes with --preset gpu")
  if args.preset == "gpu":
    try:
      args.sweep_seeds = [int(v) for v in args.sweep_seeds.split(",") if v]
    except ValueError:
      parser.error(f"--sweep-seeds must be comma-separated integers, got {args.sweep_seeds!r}")
    if not args.sweep_seeds or min(args.sweep_seeds) < 1:
      parser.error(f"--sweep-seeds must list seed counts >= 1, got {args.sweep_seeds}")
    backends = []
    for b in args.sweep_backend.split(","):
      name, _, size = b.partition(":")
      if name == "map" and not size:
        backends.append(("map", None))
      elif name == "chunked" and size.isdigit() and int(size) >= 1:
        backends.append(("chunked", int(size)))
      else:
        parser.error(
          f"--sweep-backend takes 'map' or 'chunked:N' (N >= 1), comma-separated; got {b!r}"
        )
    args.sweep_backend = backends
    args.out_gpu = args.out
    from speedlib import gpu as speed_gpu

    return speed_gpu.run(args, list(sys.argv[1:] if argv is None else argv))
  args.out = args.out or os.path.join(HERE, "results", "speed.json")
  if args.render:
    return speed_report.render(args.out, args.markdown_out)
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
  args.roofline_workloads = (
    [("softmax", 10), ("mlp", 10)]
    if args.quick
    else [("softmax", 1000), ("mlp", 1000), ("cnn-patches", 100)]
  )
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
  dense = result["dense"] = speed_workloads.dense_rates(args.quick)
  measure = {
    "workloads": lambda: speed_sections.workloads(args, dense),
    "ceiling": lambda: speed_ceiling.matmul_ceiling(args, dense),
    "precision": lambda: speed_sections.precisions(args, dense),
    "algorithms": lambda: speed_sections.algorithms(args),
    "run": lambda: speed_sections.run_path(args),
    "folding": lambda: speed_sections.folding(args),
    "devices": lambda: speed_sections.devices_section(args),
    "sweep_cache": lambda: speed_sections.sweep_cache_section(args),
    "roofline": lambda: speed_sections.rooflines(
      args, dense, roofline.copy_bandwidth(args.quick)["bytes_per_s"]
    ),
    "karula": lambda: _karula_section(args),
  }
  for name in SECTIONS:  # in this order, whatever the order of --sections
    if name in args.sections:
      result[name] = measure[name]()
  md_path = speed_report.write_results(result, args.out, args.markdown_out)
  print(speed_report.markdown(result))
  print(f"wrote {args.out} and {md_path}")
  return result


if __name__ == "__main__":
  main()
