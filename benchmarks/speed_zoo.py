"""The model zoo's architectures through the simulator against a per-client loop:
FedAvg rounds of ``fd.compile_rounds`` (the clients side by side under ``vmap``) and a Python
loop over the clients of the same jitted single-client update, side by side in one process.

Architectures (each adapted with ``models.from_flax``):

* ``resnet18``: ``models.resnet18(classes, norm="group", stem="cifar", num_filters=--width)`` on
  CIFAR-shaped 32x32x3 images (10 classes);
* ``resnet18_bn``: the same ResNet-18 with BatchNorm (the batch statistics threaded through the
  local steps and averaged, ``model_state="average"``);
* ``cifar_cnn``: ``models.cifar_cnn(10)`` without dropout on 32x32x3 images;
* ``cifar_cnn_dropout``: the same with its dropouts (0.25 and 0.5), a key per local step;
* ``lstm``: ``models.lstm_language_model("shakespeare")`` on integer tokens (sequence length 80,
  vocabulary 90), ``models.lm_loss_and_metrics()``'s loss;
* ``gpt2``: ``models.gpt2("tiny")`` on integer tokens (its 16 positions, vocabulary 97), the same
  loss.

Both sides run FedAvg (``LOCAL_STEPS`` local SGD steps of ``BATCH`` examples, full participation,
float32): the simulator's round is ``fedavg(..., backend="vmap")`` compiled by
``fd.compile_rounds`` and timed by its ``.time()``; the loop is one ``jax.jit`` of a client's
local steps (the simulator's own step: ``client_loss_and_grad``, or for a model with a training
form ``train_value_and_grad`` with its dropout key, the new statistics kept) called once per
client, then the example-weighted average of the clients' models (statistics included). Each side gets a warm-up call (its
compilation), then ``--repeats`` timed calls in interleaved passes (simulator, loop, simulator,
...), the best call kept (as ``speed.py``: the best, not the median, on a shared machine).

    python benchmarks/speed_zoo.py                 # 8 clients, ResNet width 16 (minutes on CPU)
    python benchmarks/speed_zoo.py --quick         # 2 clients, tiny widths (a smoke run, seconds)

Writes ``benchmarks/results/speed_zoo.{json,md}`` (``--out DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
  sys.path.insert(0, HERE)

import jax
import jax.numpy as jnp
import numpy as np
from speedlib.workloads import float32_params, meta_line, run_meta

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.algorithms import fedavg
from fedjax_dro.common.model import (
  client_loss_and_grad,
  sample_batch,
  train_value_and_grad,
  with_state,
)
from fedjax_dro.data import from_client_arrays

ARCHS = ("resnet18", "resnet18_bn", "cifar_cnn", "cifar_cnn_dropout", "lstm", "gpt2")
LR = 0.05


def build(arch, cfg, n, seed=0):
  """``(model, data of n clients, description)`` of one architecture (random data: speed only)."""
  rng = np.random.default_rng(seed)
  m = cfg["examples"]
  if arch in ("resnet18", "resnet18_bn", "cifar_cnn", "cifar_cnn_dropout"):
    x = rng.standard_normal((n, m, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, (n, m)).astype(np.int32)
    if arch.startswith("resnet18"):
      w = cfg["width"]
      norm = "batch" if arch == "resnet18_bn" else "group"
      module = models.resnet18(10, norm=norm, groups=min(32, w), stem="cifar", num_filters=w)
      desc = f"ResNet-18, {'BatchNorm' if norm == 'batch' else 'GroupNorm'}, CIFAR stem, width {w}; 32x32x3 -> 10"
    elif arch == "cifar_cnn":
      module = models.cifar_cnn(10, dropout=0.0, dense_dropout=0.0)
      desc = "pfl-research CIFAR CNN (no dropout); 32x32x3 -> 10"
    else:
      module = models.cifar_cnn(10)
      desc = "pfl-research CIFAR CNN (dropout 0.25, 0.5); 32x32x3 -> 10"
    model = models.from_flax(module, x[0, :2], name=arch)
    return model, from_client_arrays(list(x), list(y)), desc
  if arch == "lstm":
    hidden = cfg["lstm_hidden"]
    module = models.lstm_language_model(
      "shakespeare", **({"hidden_sizes": hidden} if hidden else {})
    )
    seq, vocab = 80, 90
    desc = f"Shakespeare LSTM (layers {hidden or (256, 256)}); tokens T=80, V=90"
  else:
    module = models.gpt2("tiny")
    seq, vocab = 16, 97
    desc = "GPT-2 tiny (2 layers, width 32); tokens T=16, V=97"
  tokens = rng.integers(1, vocab, (n, m, seq + 1)).astype(np.int32)
  loss, metrics = models.lm_loss_and_metrics()
  model = models.from_flax(module, tokens[0, :2, :-1], loss=loss, metrics=metrics, name=arch)
  xs, ys = list(tokens[:, :, :-1]), list(tokens[:, :, 1:])
  return model, from_client_arrays(xs, ys, dtype=np.int32), desc


def loop_round(model, data, params, local_steps, batch):
  """One round of the per-client loop: a jitted client update (its local steps, the simulator's
  ``client_loss_and_grad``) called per client, then the example-weighted average."""

  @jax.jit
  def client_update(w0, x, y, nex, key):
    def step(w, k):
      if model.train_apply is None:
        _, g = client_loss_and_grad(model, w, x, y, nex, k, batch)
        return jax.tree.map(lambda a, b: a - LR * b, w, g), None
      bx, by, bmask = sample_batch(k, x, y, nex, batch)
      _, g, state = train_value_and_grad(model, w, bx, by, bmask, k)
      return with_state(model, jax.tree.map(lambda a, b: a - LR * b, w, g), state), None

    return jax.lax.scan(step, w0, jax.random.split(key, local_steps))[0]

  @jax.jit
  def accumulate(total, w, weight):
    return jax.tree.map(lambda t, a: t + weight * a, total, w)

  n = data.num_clients
  xs, ys = [data.x[i] for i in range(n)], [data.y[i] for i in range(n)]
  nex = [data.num_examples[i] for i in range(n)]
  weights = np.asarray(data.num_examples, np.float32) / float(np.sum(data.num_examples))

  def one_round():
    keys = jax.random.split(jax.random.PRNGKey(1), n)
    total = jax.tree.map(jnp.zeros_like, params)
    for i in range(n):
      total = accumulate(total, client_update(params, xs[i], ys[i], nex[i], keys[i]), weights[i])
    return total

  return one_round


def _timed(fn):
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def measure(arch, cfg, n, rounds, repeats):
  """One row: seconds per round of the simulator and of the loop, and loop / simulator."""
  model, data, desc = build(arch, cfg, n)
  params = float32_params(model)
  alg = fedavg(model, local_steps=cfg["local_steps"], batch_size=cfg["batch"], backend="vmap")
  prog = fd.compile_rounds(alg, data, rounds=rounds, hparams={"client_lr": LR}, init_params=params)
  loop = loop_round(model, data, params, cfg["local_steps"], cfg["batch"])
  warm = {"simulator": _timed(lambda: prog()[0]), "loop": _timed(loop)}  # warm-up calls
  best = {"simulator": float("inf"), "loop": float("inf")}
  for _ in range(repeats):  # interleaved: a slow stretch of a shared machine hits both alike
    best["simulator"] = min(best["simulator"], _timed(lambda: prog()[0]) / rounds)
    best["loop"] = min(best["loop"], _timed(loop))
  row = {
    "arch": arch,
    "model": desc,
    "num_params": int(sum(a.size for a in jax.tree.leaves(params))),
    "num_clients": n,
    "rounds_per_call": rounds,
    "simulator_s_per_round": best["simulator"],
    "loop_s_per_round": best["loop"],
    "loop_over_simulator": best["loop"] / best["simulator"],
    "simulator_compile_s": prog.compile_time,
    "warmup_call_s": warm,
  }
  print(json.dumps(row), flush=True)
  return row


def _s(x):
  return f"{x:.3g}"


def markdown(result):
  meta, cfg = result["meta"], result["config"]
  title = "Model zoo: simulator vs per-client loop (`benchmarks/speed_zoo.py`)"
  lines = [f"# {title}", ""]
  if meta["quick"]:
    lines += ["**Smoke run (`--quick`: tiny sizes), not a measurement.**", ""]
  lines += [
    meta_line(meta),
    "",
    f"FedAvg, {meta['num_clients']} clients of {cfg['examples']} examples, full participation, "
    f"{cfg['local_steps']} local steps of batch {cfg['batch']}, float32. Seconds per round: the "
    "simulator (`fd.compile_rounds`, clients under `vmap`, "
    f"{meta['rounds']} round(s) a call) and a Python loop over the clients of one jitted client "
    "update (the same local steps), then the weighted average; best of "
    f"{meta['repeats']} interleaved calls after a warm-up call, in one process.",
    "",
    "| architecture | parameters | simulator s/round | loop s/round | loop / simulator |",
    "|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    lines.append(
      f"| {r['model']} | {r['num_params']:,} | {_s(r['simulator_s_per_round'])} | "
      f"{_s(r['loop_s_per_round'])} | {r['loop_over_simulator']:.2f} |"
    )
  lines.append("")
  return "\n".join(lines)


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 clients (seconds)")
  parser.add_argument("--clients", type=int, default=None, help="clients (default 8; quick 2)")
  parser.add_argument("--rounds", type=int, default=None, help="rounds a call (default 2; quick 1)")
  parser.add_argument("--repeats", type=int, default=None, help="timed calls (default 3; quick 1)")
  parser.add_argument("--width", type=int, default=None, help="ResNet num_filters (16; quick 2)")
  parser.add_argument("--archs", default=",".join(ARCHS))
  parser.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
  args = parser.parse_args(argv)
  archs = [a for a in args.archs.split(",") if a]
  for a in archs:
    if a not in ARCHS:
      parser.error(f"--archs: {a!r} is not one of {ARCHS}")
  q = args.quick
  cfg = {
    "width": args.width or (2 if q else 16),
    "lstm_hidden": (8, 8) if q else None,
    "examples": 4 if q else 32,
    "batch": 2 if q else 16,
    "local_steps": 1 if q else 2,
  }
  n = args.clients or (2 if q else 8)
  rounds = args.rounds or (1 if q else 2)
  repeats = args.repeats or (1 if q else 3)
  load_before = os.getloadavg()[0]
  rows = [measure(a, cfg, n, rounds, repeats) for a in archs]
  meta = run_meta("speed_zoo.py", argv, load_before, quick=q, num_clients=n, rounds=rounds)
  meta["repeats"] = repeats
  result = {"meta": meta, "config": cfg, "rows": rows}
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "speed_zoo")
  with open(path + ".json", "w") as f:
    json.dump(result, f, indent=2)
  with open(path + ".md", "w") as f:
    f.write(markdown(result))
  print(markdown(result))
  print(f"wrote {path}.json and {path}.md")
  return result


if __name__ == "__main__":
  main()
