"""Real-size smoke runs of FGDRO's Tables 2 and 3: one round of each table's model at the real
shapes, its time per local iteration, the device named.

Guo and Yang, "Communication-Efficient Federated Group Distributionally Robust Optimization",
arXiv:2410.06369, Tables 2 and 3 (``fedjax-dro reproduce fgdro-table2`` / ``fgdro-table3``). For
each dataset, generated data of the real shapes (one client per training domain, ``--rows`` rows
each; nothing downloads) and the table's model from random initialisation:

* ``camelyon17``: DenseNet-121, 96 x 96 x 3, 2 classes, 3 clients;
* ``iwildcam``: ResNet-50, 448 x 448 x 3, 182 classes, 8 clients;
* ``poverty``: ResNet-50 on 224 x 224 x 8, a regression, 13 clients;
* ``pile``: GPT-2 124M, sequences of 1024 tokens of a 50257 vocabulary, 17 clients;
* ``civilcomments``: DistilBERT base, 300 tokens, 2 classes, 4 clients.

FGDRO-KL (the tables' reference row) with ``I = --local-steps`` local steps of ``--batch`` rows
and every client each round, through ``fd.compile_rounds`` (the path of ``fd.run``): compiled,
run once (a warm-up), then ``--rounds`` rounds timed. Time per local iteration = the round's
wall time / I (all clients take their step of an iteration side by side). The result is written
after every dataset (a killed run keeps the finished ones), with the projected hours of a run of
the table's budget: 625 rounds (20K local iterations); the Pile 6250 (the paper's 200K) and
625 (the default cut). A projection from the measured rounds, not a measured whole run. A
dataset that fails (out of device memory, say) is recorded with its error and the next one runs.

    python benchmarks/fgdro_real_size.py                    # every dataset, real shapes
    python benchmarks/fgdro_real_size.py --only pile --rounds 1
    python benchmarks/fgdro_real_size.py --quick            # tiny models and shapes (seconds)

Writes ``benchmarks/results/fgdro_real_size.{json,md}`` (``--out DIR``).
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

import jax  # noqa: E402
import numpy as np  # noqa: E402
from speedlib.workloads import meta_line, run_meta  # noqa: E402

import fedjax_dro as fd  # noqa: E402
from fedjax_dro import models  # noqa: E402
from fedjax_dro.algorithms import fgdro_kl  # noqa: E402
from fedjax_dro.data import from_client_arrays  # noqa: E402

# name: (model, x shape, x kind, classes (0: regression), clients, table rounds)
DATASETS = {
  "camelyon17": ("DenseNet-121", (96, 96, 3), "image", 2, 3, (625,)),
  "iwildcam": ("ResNet-50", (448, 448, 3), "image", 182, 8, (625,)),
  "poverty": ("ResNet-50 (8 bands)", (224, 224, 8), "image", 0, 13, (625,)),
  "pile": ("GPT-2 124M", (1024,), "tokens", 50257, 17, (6250, 625)),
  "civilcomments": ("DistilBERT base", (300,), "tokens", 2, 4, (625,)),
}
QUICK_SHAPES = {"camelyon17": (16, 16, 3), "iwildcam": (16, 16, 3), "poverty": (16, 16, 8)}


def make_model(name, quick):
  """``(model, sample input, n)``: the table's model (tiny with ``quick``), ``n`` the vocabulary
  of a token model, else the classes (0: a regression)."""
  label, shape, kind, classes, _, _ = DATASETS[name]
  shape = QUICK_SHAPES.get(name, (16,)) if quick else shape
  if kind == "tokens":
    sample = np.zeros((2,) + shape, np.int32)
    if name == "pile":
      vocab = 97 if quick else classes
      module = models.gpt2("tiny" if quick else "124M", vocab_size=vocab)
      loss, metrics = models.lm_loss_and_metrics(pad_id=-1)
      model = models.from_flax(module, sample, loss=loss, metrics=metrics, task="classification")
      return model, sample, vocab
    size = "tiny" if quick else "base"
    module = models.distilbert(size, num_labels=2, **({"vocab_size": 101} if quick else {}))
    return models.from_flax(module, sample), sample, 101 if quick else 30522
  sample = np.zeros((2,) + shape, np.float32)
  if quick:
    module = models.cifar_cnn(max(classes, 1), dropout=0.0, dense_dropout=0.0)
  elif name == "camelyon17":
    module = models.densenet121(classes)
  else:
    module = models.resnet50(max(classes, 1))
  loss = "squared_error" if classes == 0 else "softmax_cross_entropy"
  return models.from_flax(module, sample, loss=loss), sample, classes


def make_data(name, sample, n, rows, seed=0):
  """One client per training domain of ``rows`` generated rows of the real shapes (``n``: the
  vocabulary of token rows, the classes of images, 0 for a regression)."""
  _, _, kind, _, clients, _ = DATASETS[name]
  rng = np.random.default_rng(seed)
  xs, ys = [], []
  for _ in range(clients):
    shape = (rows,) + sample.shape[1:]
    if kind == "tokens":
      x = rng.integers(1, n, shape).astype(np.int32)  # no padding id 0
      y = np.roll(x, -1, axis=1) if name == "pile" else rng.integers(0, 2, rows).astype(np.int32)
    else:
      x = rng.random(shape, np.float32)
      y = (
        rng.normal(size=(rows, 1)).astype(np.float32)
        if n == 0
        else rng.integers(0, n, rows).astype(np.int32)
      )
    xs.append(x)
    ys.append(y)
  return from_client_arrays(xs, ys, dtype=np.int32 if kind == "tokens" else None)


def measure(name, args):
  label, _, _, _, clients, table_rounds = DATASETS[name]
  model, sample, n = make_model(name, args.quick)
  data = make_data(name, sample, n, args.rows)
  alg = fgdro_kl(
    model, local_steps=args.local_steps, batch_size=args.batch, clients_per_round=clients
  )
  hparams = {"client_lr": 1e-3, "beta1": 0.1, "beta2": 0.1, "beta3": 0.1}
  prog = fd.compile_rounds(alg, data, rounds=args.rounds, hparams=hparams)
  t0 = time.perf_counter()
  prog()  # the warm-up call
  warm = time.perf_counter() - t0
  t0 = time.perf_counter()
  prog()
  wall = time.perf_counter() - t0
  per_round = wall / args.rounds
  per_iteration = per_round / args.local_steps
  return {
    "dataset": name,
    "model": f"a tiny stand-in of {label} (--quick)" if args.quick else label,
    "parameters": int(sum(np.size(a) for a in jax.tree.leaves(prog.initial_state.params))),
    "clients": clients,
    "x_shape": list(sample.shape[1:]),
    "local_steps": args.local_steps,
    "batch": args.batch,
    "rounds_timed": args.rounds,
    "compile_s": prog.compile_time,
    "warmup_call_s": warm,
    "s_per_round": per_round,
    "s_per_local_iteration": per_iteration,
    "projected_hours": {
      str(r): r * per_round / 3600 + prog.compile_time / 3600 for r in table_rounds
    },
  }


def markdown(result):
  meta = result["meta"]
  lines = ["# FGDRO Tables 2 and 3 at real size: time per local iteration", ""]
  if meta["quick"]:
    lines += ["**Smoke run (`--quick`: tiny models and shapes), not a measurement.**", ""]
  lines += [
    meta_line(meta),
    "",
    "FGDRO-KL, every client each round, generated data of the real shapes, random "
    "initialisation, float32; one round compiled, a warm-up call, then the timed rounds. Hours "
    "of a table's run are **projected** (compile + rounds x s/round), not measured.",
    "",
    "| dataset | model | clients | input | I x batch | compile s | s / round | "
    "s / local iteration | projected hours (rounds) |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    hours = ", ".join(f"{h:.2f} ({k})" for k, h in r["projected_hours"].items())
    lines.append(
      f"| {r['dataset']} | {r['model']} | {r['clients']} | {r['x_shape']} | "
      f"{r['local_steps']} x {r['batch']} | {r['compile_s']:.1f} | {r['s_per_round']:.3g} | "
      f"{r['s_per_local_iteration']:.3g} | {hours} |"
    )
  for name, error in result.get("errors", {}).items():
    lines.append(f"\n{name}: failed: {error}")
  return "\n".join(lines) + "\n"


def write(result, out):
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "fgdro_real_size.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(out, "fgdro_real_size.md"), "w") as f:
    f.write(markdown(result))


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", nargs="*", choices=sorted(DATASETS), default=None)
  parser.add_argument("--rounds", type=int, default=1, help="rounds timed after the warm-up")
  parser.add_argument("--local-steps", type=int, default=32, help="I (the paper's 32)")
  parser.add_argument("--batch", type=int, default=32, help="local minibatch (the paper's 32)")
  parser.add_argument("--rows", type=int, default=64, help="generated rows per client")
  parser.add_argument("--quick", action="store_true", help="tiny models and shapes")
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  args = parser.parse_args(argv)
  if args.quick:
    args.local_steps, args.batch, args.rows = 2, 2, 4
  for what in ("rounds", "local_steps", "batch", "rows"):
    if getattr(args, what) < 1:
      parser.error(f"--{what.replace('_', '-')} must be >= 1")
  load_before = os.getloadavg()[0]
  result = {"rows": [], "errors": {}}
  for name in args.only or list(DATASETS):
    try:
      row = measure(name, args)
      result["rows"].append(row)
      print(json.dumps(row), flush=True)
    except Exception as e:  # noqa: BLE001 (one dataset's failure, e.g. out of memory, is recorded)
      result["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
      print(f"{name}: {result['errors'][name]}", flush=True)
    result["meta"] = run_meta("fgdro_real_size.py", argv, load_before, quick=args.quick)
    write(result, args.out)  # after every dataset
  return result


if __name__ == "__main__":
  main()
