"""Softmax regression's two head forms side by side on this device: the measurements behind
``models.softmax_regression(..., head="auto")`` (``speedlib/measured.py``'s ``HEAD_MEASUREMENTS``, behind the platform default of
``fd.Tuning(head_transposed_max_classes=...)``).

FedAvg rounds of softmax regression (d = 64 features, 4 local steps of batch 32 from 64 examples
per client, full participation, float32, the ``auto`` backend) through ``fd.compile_rounds``, for
several numbers of classes k, with the weights read as stored (``head="plain"``: ``x @ w``) and
through a transposed copy behind an optimization barrier (``head="transposed"``: the backward
pass's weight gradient comes out class-major). Both forms give the same parameters and results;
they are compiled first, then timed in interleaved passes (plain, transposed, plain, ...), the best
call of all passes kept, so a slow stretch of a shared machine hits both alike.

    python benchmarks/speed_head.py            # k = 2, 10, 16, 32, 62 at n = 1000 (a few minutes)
    python benchmarks/speed_head.py --quick    # k = 2 and 62 at n = 8 (seconds)

Writes ``benchmarks/results/speed_head.{json,md}`` (``--out``); the rates of a CPU run are the
CPU row of ``HEAD_MEASUREMENTS`` (a test checks that they agree).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
  sys.path.insert(0, HERE)

import jax
import numpy as np
from speedlib.measured import HEAD_MEASUREMENTS
from speedlib.workloads import (
  BATCH,
  EXAMPLES,
  LOCAL_STEPS,
  best_interleaved,
  float32_params,
  meta_line,
  run_meta,
)

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.algorithms import fedavg
from fedjax_dro.common.tuning import platform_defaults
from fedjax_dro.data import from_client_arrays
from fedjax_dro.models.builtin import head_form

FORMS = ("plain", "transposed")
FEATURES = 64
CLASSES = (2, 10, 16, 32, 62)


def _data(n, classes, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n, EXAMPLES, FEATURES), dtype=np.float32)
  y = rng.integers(0, classes, (n, EXAMPLES)).astype(np.int32)
  return from_client_arrays(list(x), list(y))


def measure(num_clients, classes, passes=5, repeats=3):
  """Rows ``{num_classes, num_clients, plain, transposed, ratio}`` (client updates per second;
  ratio = transposed / plain), both forms timed in interleaved passes, the best call kept."""
  rows = []
  for k in classes:
    data = _data(num_clients, k)
    progs = {}
    for form in FORMS:
      model = models.softmax_regression(FEATURES, k, head=form)
      alg = fedavg(model, local_steps=LOCAL_STEPS, batch_size=BATCH)
      progs[form] = fd.compile_rounds(
        alg, data, rounds=1, hparams={"client_lr": 0.05}, init_params=float32_params(model)
      )
      jax.block_until_ready(progs[form]()[0])
    best = best_interleaved(progs, passes, repeats)
    row = {"num_classes": k, "num_clients": num_clients}
    row.update({form: num_clients / best[form] for form in FORMS})
    row["ratio_transposed_over_plain"] = row["transposed"] / row["plain"]
    rows.append(row)
    print(json.dumps(row), flush=True)
  return rows


def table(rows):
  """``{k: {form: rate}}``, the layout of one platform's row of HEAD_MEASUREMENTS."""
  return {r["num_classes"]: {f: float(f"{r[f]:.3g}") for f in FORMS} for r in rows}


def markdown(result):
  meta = result["meta"]
  lines = [
    "# Softmax regression's head forms (`benchmarks/speed_head.py`)",
    "",
    meta_line(meta),
    "",
    f"FedAvg client updates per second of softmax regression (d = {FEATURES}, {LOCAL_STEPS} local "
    f"steps of batch {BATCH}, float32, `auto` backend, {result['rows'][0]['num_clients']} clients) "
    "through `fd.compile_rounds`; the two forms compiled in one process and timed in interleaved "
    "passes (best call). Same parameters and results in both forms.",
    "",
    "| classes k | plain | transposed | transposed / plain | faster |",
    "|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    faster = "transposed" if r["transposed"] > r["plain"] else "plain"
    lines.append(
      f"| {r['num_classes']} | {r['plain']:.0f} | {r['transposed']:.0f} | "
      f"{r['ratio_transposed_over_plain']:.2f} | {faster} |"
    )
  lines += [
    "",
    '## What `head="auto"` picks (the platform default `Tuning.head_transposed_max_classes`)',
    "",
    "Transposed up to the largest k below which every measured k was faster transposed; plain",
    "above it and on platforms without measurements.",
    "",
    "| platform | transposed for k <= | auto at k = 2, 10, 16, 32, 62 |",
    "|---|---|---|",
  ]
  for plat in sorted(set(HEAD_MEASUREMENTS) | {"gpu"}):
    picks = ", ".join(head_form(k, plat) for k in CLASSES)
    limit = platform_defaults(plat).head_transposed_max_classes
    lines.append(f"| {plat} | {limit} | {picks} |")
  lines.append("")
  return "\n".join(lines)


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="k = 2 and 62 at n = 8 (seconds)")
  parser.add_argument("--clients", type=int, default=None, help="clients side by side (1000)")
  parser.add_argument("--out", default=os.path.join(HERE, "results", "speed_head.json"))
  args = parser.parse_args(argv)
  load_before = os.getloadavg()[0]
  if args.quick:
    rows = measure(args.clients or 8, (2, 62), passes=1, repeats=1)
  else:
    rows = measure(args.clients or 1000, CLASSES)
  meta = run_meta("speed_head.py", argv, load_before)
  result = {"meta": meta, "rows": rows, "table": {meta["platform"]: table(rows)}}
  out_dir = os.path.dirname(os.path.abspath(args.out))
  os.makedirs(out_dir, exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  md = os.path.splitext(args.out)[0] + ".md"
  with open(md, "w") as f:
    f.write(markdown(result))
  print(markdown(result))
  print(f"wrote {args.out} and {md}")
  return result


if __name__ == "__main__":
  main()
