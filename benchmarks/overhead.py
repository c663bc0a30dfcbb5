"""The federation's overhead on big models: one FedAvg round of ``s`` clients x ``k`` local steps
through the simulator against ``s x k`` plain SGD steps of one model on the same batch shapes
(one ``jax.jit`` train step called in a Python loop), side by side in one process.

Models: GPT-2 124M (its dropout 0.1, integer tokens of ``--tokens`` positions) and ResNet-50
(BatchNorm, ImageNet stem, ``--side`` x ``--side`` x 3 images, 100 classes). The simulator runs
``fedavg(local_steps=k, batch_size=b, backend="auto")`` compiled by ``fd.compile_rounds``; the
plain step is the simulator's own training step of one model (``train_value_and_grad`` with its
dropout key, the new statistics kept). Ratio = the round's seconds / (``s x k`` plain steps'
seconds): 1 is no overhead (the round's aggregation and the per-client copies are all it adds).
Each side gets a warm-up call, then ``--repeats`` timed calls, the best kept.

    python benchmarks/overhead.py                  # s=4, k=2, batch 2 (minutes on 2 CPU cores)
    python benchmarks/overhead.py --quick          # tiny models (a smoke run)

Writes ``benchmarks/results/overhead.{json,md}`` (``--out DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import numpy as np


def build(name, args, rng):
  from fedjax_dro import data, models

  n, m = args.clients, args.batch * args.steps
  if name == "gpt2":
    size = "tiny" if args.quick else "124M"
    t = 8 if args.quick else args.tokens
    vocab = 97 if args.quick else 50257
    toks = [rng.integers(1, vocab, size=(m, t + 1)) for _ in range(n)]
    loss, metrics = models.lm_loss_and_metrics()
    model = models.from_flax(
      models.gpt2(size, dropout=0.1),
      np.zeros((1, t), np.int32),
      loss=loss,
      metrics=metrics,
      task="classification",
      name=f"GPT-2 {size}, dropout 0.1, {t} tokens",
    )
    xs, ys = [s[:, :-1] for s in toks], [s[:, 1:] for s in toks]
    return model, data.from_client_arrays(xs, ys, dtype=np.int32)
  side = 16 if args.quick else args.side
  width = 8 if args.quick else 64
  xs = [rng.normal(size=(m, side, side, 3)).astype(np.float32) for _ in range(n)]
  ys = [rng.integers(0, 100, m) for _ in range(n)]
  net = models.resnet50(100, num_filters=width)
  model = models.from_flax(net, xs[0][:2], name=f"ResNet-50 BatchNorm, width {width}, {side}px")
  return model, data.from_client_arrays(xs, ys)


def _best(fn, repeats):
  jax.block_until_ready(fn())
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return best


def measure(name, args):
  import fedjax_dro as fd
  from fedjax_dro import algorithms as A
  from fedjax_dro.common.model import train_value_and_grad, with_state
  from fedjax_dro.data import FederatedDataset

  rng = np.random.default_rng(0)
  model, train = build(name, args, rng)
  ds = FederatedDataset(train=train, test=train, name="random")
  params = model.init(jax.random.PRNGKey(0))
  alg = A.fedavg(model, local_steps=args.steps, batch_size=args.batch)
  prog = fd.compile_rounds(alg, ds, rounds=1, hparams={"client_lr": 1e-4}, init_params=params)
  round_s = _best(lambda: prog()[0], args.repeats)

  @jax.jit
  def step(w, x, y, key):
    mask = np.ones(x.shape[0], bool)
    _, g, state = train_value_and_grad(model, w, x, y, mask, key)
    return with_state(model, jax.tree.map(lambda a, b: a - 1e-4 * b, w, g), state)

  x, y = train.x[0][: args.batch], train.y[0][: args.batch]
  keys = jax.random.split(jax.random.PRNGKey(1), args.steps)

  def plain():
    w = params
    for _ in range(args.clients):
      for k in keys:
        w = step(w, x, y, k)
    return w

  with fd.tuned(canonical_conv=False):  # at the top level XLA's own form is the fast one
    steps_s = _best(plain, args.repeats)
  row = {
    "model": model.name,
    "parameters": int(sum(np.size(a) for a in jax.tree.leaves(params))),
    "round_s": round_s,
    "plain_steps_s": steps_s,
    "overhead": round_s / steps_s,
  }
  print(json.dumps(row), flush=True)
  return row


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="tiny models (a smoke run)")
  p.add_argument("--clients", type=int, default=4, help="s, the round's clients")
  p.add_argument("--steps", type=int, default=2, help="k, local steps per client")
  p.add_argument("--batch", type=int, default=2, help="examples per step")
  p.add_argument("--tokens", type=int, default=128, help="GPT-2's sequence length")
  p.add_argument("--side", type=int, default=64, help="ResNet-50's image side")
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--models", default="gpt2,resnet50")
  p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = p.parse_args(argv)
  rows = [measure(name, args) for name in args.models.split(",")]
  device = f"{jax.devices()[0].device_kind} ({jax.default_backend()}, {os.cpu_count()} cores, {platform.machine()})"
  meta = {k: getattr(args, k) for k in ("quick", "clients", "steps", "batch", "repeats")}
  result = {"meta": {**meta, "device": device}, "rows": rows}
  lines = [
    "# The federation's overhead on big models",
    "",
    f"Device: {device}. One FedAvg round of {args.clients} clients x {args.steps} local steps of "
    f"{args.batch} examples (`fd.compile_rounds`, backend `auto`) against {args.clients * args.steps} "
    "plain SGD steps of one model (one `jax.jit` step in a Python loop), best of "
    f"{args.repeats} calls after a warm-up, in one process"
    + (" (`--quick`: a smoke run, not a measurement)." if args.quick else "."),
    "",
    "| model | parameters | round (s) | plain steps (s) | round / plain steps |",
    "|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['model']} | {r['parameters']:,} | {r['round_s']:.3g} | {r['plain_steps_s']:.3g} | "
      f"{r['overhead']:.2f} |"
    )
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "overhead.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(args.out, "overhead.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  return result


if __name__ == "__main__":
  main()
