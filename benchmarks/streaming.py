"""Streamed rounds against device-resident rounds, and the reader against what a round consumes.

A federation of ``--clients`` clients of ``--rows`` CIFAR-shaped 32x32x3 uint8 images (random
pixels, 10 classes) is written once in the prepared format (``fd.data.prepared.prepare``) and
run two ways, side by side in one process, the same FedAvg rounds (``--per-round`` clients,
``--steps`` local steps of ``--batch`` rows):

* resident: the split as device-resident ``FederatedData`` (``load_prepared(...).to_device()``,
  float32 in [0, 1]);
* streamed: ``load_prepared(...)``: each participant's minibatch rows read from the memory-mapped
  arrays by one host call per client and round.

Ratio 1 = streamed seconds per round / resident seconds per round (the target: at most 1.25 on
the CPU). Ratio 2 = the reader's rows per second (the store's gather of a round's rows: uniform
rows of uniformly drawn clients, uint8 -> float32, from the page cache, best of ``--repeats``)
over the rows a resident round consumes per second (``s x T x B`` / its seconds): at least 1.5
means the device never waits for the disk. Workloads: ``cnn`` (pfl-research's CIFAR-10 CNN,
``models.cifar_cnn`` without dropout) and ``resnet`` (ResNet-18 with GroupNorm, CIFAR stem,
width ``--width``). Each program is compiled and run once first (warm-up); then best of
``--repeats`` calls of ``--rounds`` rounds.

    python benchmarks/streaming.py               # n = 1000 clients (minutes on 2 CPU cores)
    python benchmarks/streaming.py --quick       # a smoke run

Writes ``benchmarks/results/streaming.{json,md}`` (``--out DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import jax
import numpy as np


def _workload(name, args, x0):
  from fedjax_dro import models

  if name == "cnn":
    module = models.cifar_cnn(10, dropout=0.0, dense_dropout=0.0)
    desc = "pfl-research CIFAR-10 CNN"
  else:
    w = args.width
    module = models.resnet18(10, norm="group", groups=min(32, w), stem="cifar", num_filters=w)
    desc = f"ResNet-18-GN, CIFAR stem, width {w}"
  return models.from_flax(module, x0, name=name), desc


def _best(fn, repeats):
  jax.block_until_ready(fn())
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return best


def measure(name, args, prepared_dir):
  import fedjax_dro as fd

  streamed = fd.data.load_prepared(prepared_dir, "train")
  resident = streamed.to_device()
  model, desc = _workload(name, args, np.zeros((2, 32, 32, 3), np.float32))
  alg = fd.algorithms.fedavg(
    model, clients_per_round=args.per_round, local_steps=args.steps, batch_size=args.batch
  )
  hp = {"client_lr": 0.01}
  params = model.init(jax.random.PRNGKey(0))
  timings = {}
  for form, data in (("resident", resident), ("streamed", streamed)):
    ds = fd.data.FederatedDataset(train=data, test=data, task="classification", num_classes=10)
    prog = fd.compile_rounds(alg, ds, rounds=args.rounds, hparams=hp, init_params=params)
    timings[form] = _best(lambda prog=prog: prog()[0], args.repeats) / args.rounds
  store = streamed.store
  rng = np.random.default_rng(0)
  rows_per_round = args.per_round * args.steps * args.batch

  def read():
    clients = rng.choice(store.counts.size, args.per_round, replace=False)
    rows = rng.integers(
      0, store.counts[clients][:, None], (args.per_round, args.steps * args.batch)
    )
    return store.gather(clients, rows)[0]

  read_s = _best(read, args.repeats * 5)
  row = {
    "workload": name,
    "model": desc,
    "resident_round_s": timings["resident"],
    "streamed_round_s": timings["streamed"],
    "streamed_over_resident": timings["streamed"] / timings["resident"],
    "rows_per_round": rows_per_round,
    "reader_rows_per_s": rows_per_round / read_s,
    "consumed_rows_per_s": rows_per_round / timings["resident"],
  }
  row["reader_over_consumed"] = row["reader_rows_per_s"] / row["consumed_rows_per_s"]
  print(json.dumps(row), flush=True)
  return row


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="a smoke run (tiny sizes)")
  p.add_argument("--clients", type=int, default=1000)
  p.add_argument("--rows", type=int, default=50, help="rows per client")
  p.add_argument("--per-round", type=int, default=10, help="clients per round")
  p.add_argument("--steps", type=int, default=5, help="local steps")
  p.add_argument("--batch", type=int, default=10, help="rows per local step")
  p.add_argument("--rounds", type=int, default=4, help="rounds per timed call")
  p.add_argument("--width", type=int, default=64, help="the ResNet's width")
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--workloads", default="cnn,resnet")
  p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = p.parse_args(argv)
  if args.quick:
    args.clients, args.rows, args.per_round, args.steps, args.batch = 20, 8, 3, 2, 4
    args.rounds, args.width, args.repeats = 2, 8, 1
  import fedjax_dro as fd

  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (args.clients, args.rows, 32, 32, 3), dtype=np.uint8)
  y = rng.integers(0, 10, (args.clients, args.rows)).astype(np.int32)
  data = fd.data.from_client_arrays(list(x), list(y), dtype=np.uint8)
  with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    prepared_dir = fd.data.prepared.prepare(
      fd.data.prepared.federated_source(data), out=os.path.join(tmp, "p"), progress=False
    )
    prepare_s = time.perf_counter() - t0
    rows = [measure(name, args, prepared_dir) for name in args.workloads.split(",")]
  device = (
    f"{jax.devices()[0].device_kind} ({jax.default_backend()}, {os.cpu_count()} cores, "
    f"{platform.machine()})"
  )
  keys = ("quick", "clients", "rows", "per_round", "steps", "batch", "rounds", "repeats")
  meta = {k: getattr(args, k) for k in keys}
  result = {"meta": {**meta, "device": device, "prepare_s": prepare_s}, "rows": rows}
  lines = [
    "# Streamed rounds against device-resident rounds",
    "",
    f"Device: {device}. {args.clients:,} clients x {args.rows} rows of 32x32x3 uint8 images "
    f"(prepared in {prepare_s:.1f} s); FedAvg, {args.per_round} clients a round x "
    f"{args.steps} local steps of {args.batch} rows; best of {args.repeats} calls of "
    f"{args.rounds} rounds after a warm-up, both forms in one process"
    + (" (`--quick`: a smoke run, not a measurement)." if args.quick else ".")
    + " The reader reads from the page cache (a freshly written file).",
    "",
    "| workload | resident round (s) | streamed round (s) | streamed / resident | reader rows/s "
    "| rows/s a round consumes | reader / consumed |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['model']} | {r['resident_round_s']:.3g} | {r['streamed_round_s']:.3g} | "
      f"{r['streamed_over_resident']:.2f} | {r['reader_rows_per_s']:,.0f} | "
      f"{r['consumed_rows_per_s']:,.0f} | {r['reader_over_consumed']:.1f} |"
    )
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "streaming.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(args.out, "streaming.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  return result


if __name__ == "__main__":
  main()
