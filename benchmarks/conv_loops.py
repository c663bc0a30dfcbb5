"""Convolutional models' rounds on the CPU: the simulator against a Python loop of one jitted
single-client step, with the convolutions in canonical layout (``Tuning.canonical_conv``, the
CPU's default) and in XLA's own form, side by side in one process.

Workloads (FedAvg, 20 clients of 20 rows, 10 per round, 2 local steps of 8, float32):

* ``resnet18_gn``: the zoo's ResNet-18 with GroupNorm and the CIFAR stem (width ``--width``,
  64 the paper's) on 24 x 24 x 3 images, 10 classes, through ``models.from_flax``;
* ``user_nnx``: a user's convolutional network written in Flax NNX (three 3 x 3 convolutions of
  32, 64 and 64 channels with GroupNorm, the second strided, global pooling), through
  ``models.from_nnx``;
* ``densenet``: a DenseNet-121-style network with BatchNorm (two dense blocks of 4 layers, growth
  16: the batch statistics threaded through the steps), through ``models.from_flax``.

The simulator's rounds are ``fd.compile_rounds`` with the ``map`` backend (one client at a time,
what the ``auto`` plan picks for these on the CPU) timed by calls of ``--rounds`` rounds; the
loop is a Python loop over the participants and their steps of one ``jax.jit`` step (the
simulator's own ``client_loss_and_grad`` / ``train_value_and_grad``), then the weighted average.
Each form gets a warm-up call, then ``--repeats`` timed calls, the best kept.

    python benchmarks/conv_loops.py            # the issue's sizes (minutes: XLA's own form is slow)
    python benchmarks/conv_loops.py --quick    # tiny sizes (a smoke run)

Writes ``benchmarks/results/conv_loops.{json,md}`` (``--out DIR``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time

import jax
import numpy as np


def _user_nnx(width):
  from flax import nnx

  class UserConvNet(nnx.Module):
    def __init__(self, rngs):
      self.c1 = nnx.Conv(3, width, (3, 3), rngs=rngs)
      self.n1 = nnx.GroupNorm(width, num_groups=8, rngs=rngs)
      self.c2 = nnx.Conv(width, 2 * width, (3, 3), strides=(2, 2), rngs=rngs)
      self.n2 = nnx.GroupNorm(2 * width, num_groups=8, rngs=rngs)
      self.c3 = nnx.Conv(2 * width, 2 * width, (3, 3), rngs=rngs)
      self.out = nnx.Linear(2 * width, 10, rngs=rngs)

    def __call__(self, x):
      h = nnx.relu(self.n1(self.c1(x)))
      h = nnx.relu(self.n2(self.c2(h)))
      h = nnx.relu(self.c3(h))
      return self.out(h.mean(axis=(1, 2)))

  return UserConvNet


def build(name, cfg, xs):
  from fedjax_dro import models
  from fedjax_dro.models.densenet import DenseNet
  from fedjax_dro.models.resnet import resnet18

  w = cfg["width"]
  if name == "resnet18_gn":
    net = resnet18(10, norm="group", groups=min(32, w), stem="cifar", num_filters=w)
    return models.from_flax(net, xs[0][:2], name=name), f"ResNet-18 GroupNorm, width {w}"
  if name == "user_nnx":
    return models.from_nnx(_user_nnx(max(8, w // 2)), name=name), "user NNX conv net"
  net = DenseNet(
    growth_rate=max(4, w // 4), block_config=(4, 4), num_init_features=w, num_classes=10
  )
  return models.from_flax(net, xs[0][:2], name=name), "DenseNet blocks (BatchNorm)"


def loop_round(model, data, params, steps, batch, participants, lr):
  from fedjax_dro.common.model import (
    client_loss_and_grad,
    sample_batch,
    train_value_and_grad,
    with_state,
  )

  @jax.jit
  def step(w, x, y, n, k):
    if model.train_apply is None:
      _, g = client_loss_and_grad(model, w, x, y, n, k, batch)
      return jax.tree.map(lambda a, b: a - lr * b, w, g)
    bx, by, bm = sample_batch(k, x, y, n, batch)
    _, g, state = train_value_and_grad(model, w, bx, by, bm, k)
    return with_state(model, jax.tree.map(lambda a, b: a - lr * b, w, g), state)

  @jax.jit
  def average(ws):
    return jax.tree.map(lambda *a: sum(a) / len(a), *ws)

  xs = [data.x[i] for i in range(participants)]
  ys = [data.y[i] for i in range(participants)]
  ns = [data.num_examples[i] for i in range(participants)]
  keys = jax.random.split(jax.random.PRNGKey(1), steps)

  def one_round():
    finals = []
    for i in range(participants):
      w = params
      for s in range(steps):
        w = step(w, xs[i], ys[i], ns[i], keys[s])
      finals.append(w)
    return average(finals)

  return one_round


def _first(prog):
  return prog()[0]


def _best(fn, repeats):
  jax.block_until_ready(fn())  # warm-up (compilation)
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return best


def measure(name, cfg, repeats, rounds):
  import fedjax_dro as fd
  from fedjax_dro import algorithms as A, data

  rng = np.random.default_rng(0)
  side, n, m = cfg["side"], cfg["clients"], cfg["rows"]
  xs = [rng.normal(size=(m, side, side, 3)).astype(np.float32) for _ in range(n)]
  ys = [rng.integers(0, 10, m) for _ in range(n)]
  train = data.from_client_arrays(xs, ys)
  ds = data.FederatedDataset(train=train, test=train, name="images")
  model, desc = build(name, cfg, xs)
  params = model.init(jax.random.PRNGKey(0))
  alg = A.fedavg(
    model,
    local_steps=cfg["steps"],
    batch_size=cfg["batch"],
    clients_per_round=cfg["participants"],
    backend="map",
  )
  row = {"workload": name, "model": desc}
  for on in (True, False):
    with fd.tuned(canonical_conv=on):
      prog = fd.compile_rounds(
        alg, ds, rounds=rounds, hparams={"client_lr": 0.05}, init_params=params
      )
      seconds = _best(functools.partial(_first, prog), repeats) / rounds
      row[f"simulator_{'canonical' if on else 'xla'}_s"] = seconds
  with fd.tuned(canonical_conv=False):  # the loop's step at the top level: XLA's form is fast
    loop = loop_round(model, train, params, cfg["steps"], cfg["batch"], cfg["participants"], 0.05)
    row["loop_s"] = _best(loop, repeats)
  row["loop_over_simulator"] = row["loop_s"] / row["simulator_canonical_s"]
  row["xla_over_canonical"] = row["simulator_xla_s"] / row["simulator_canonical_s"]
  print(json.dumps(row), flush=True)
  return row


def markdown(result):
  meta = result["meta"]
  lines = [
    "# Convolutional rounds on the CPU",
    "",
    f"Device: {meta['device']}. FedAvg, {meta['clients']} clients of {meta['rows']} rows, "
    f"{meta['participants']} per round, {meta['steps']} local steps of {meta['batch']}, "
    f"{meta['side']}x{meta['side']}x3 images; seconds per round, best of {meta['repeats']} calls "
    "after a warm-up, in one process (`python benchmarks/conv_loops.py"
    + (" --quick`: a smoke run, not a measurement)." if meta["quick"] else "`)."),
    "",
    "| workload | simulator, canonical convolutions | simulator, XLA's form | Python loop of a "
    "jitted step | loop / simulator | XLA's form / canonical |",
    "|---|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    lines.append(
      f"| {r['model']} | {r['simulator_canonical_s']:.3g} | {r['simulator_xla_s']:.3g} | "
      f"{r['loop_s']:.3g} | {r['loop_over_simulator']:.2f} | {r['xla_over_canonical']:.1f} |"
    )
  return "\n".join(lines) + "\n"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
  p.add_argument("--width", type=int, default=None, help="ResNet width (64; quick 4)")
  p.add_argument("--repeats", type=int, default=None, help="timed calls (2; quick 1)")
  p.add_argument("--rounds", type=int, default=1, help="rounds per simulator call")
  p.add_argument("--workloads", default="resnet18_gn,user_nnx,densenet")
  p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = p.parse_args(argv)
  q = args.quick
  cfg = dict(
    width=args.width or (4 if q else 64),
    side=8 if q else 24,
    clients=4 if q else 20,
    rows=6 if q else 20,
    participants=2 if q else 10,
    steps=2,
    batch=4 if q else 8,
  )
  repeats = args.repeats or (1 if q else 2)
  rows = [measure(w, cfg, repeats, args.rounds) for w in args.workloads.split(",")]
  device = f"{jax.devices()[0].device_kind} ({jax.default_backend()}, {os.cpu_count()} cores, {platform.machine()})"
  result = {"meta": {**cfg, "quick": q, "repeats": repeats, "device": device}, "rows": rows}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "conv_loops.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(args.out, "conv_loops.md"), "w") as f:
    f.write(markdown(result))
  print(markdown(result))
  return result


if __name__ == "__main__":
  main()
