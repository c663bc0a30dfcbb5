"""The CNN's two convolution forms side by side on this device: the measurements behind
``models.cnn(..., conv="auto")`` (``speedlib/measured.py``'s ``CONV_MEASUREMENTS``, behind the platform defaults of
``fd.Tuning(conv=..., conv_bf16=...)``).

The built-in CNN of ``benchmarks/speed.py`` (28x28x1, 62 classes, convolutions 32/64, dense 128)
trained with FedAvg (4 local steps of batch 32, full participation) with the clients' per-client
weights side by side under ``vmap`` (``backend="vmap"``), at n = 1 and n = 100 clients, in each
precision policy (float32, bf16), with ``conv="lax"`` (``lax.conv``: under ``vmap`` a grouped
convolution) and ``conv="patches"`` (9 shifted slices and a matmul: under ``vmap`` a batched
matmul). Both forms are compiled first, then timed in interleaved passes (lax, patches, lax,
patches, ...), the best call of all passes kept: a slow stretch of a shared machine hits both
forms alike, and the ratio is measured side by side in one process. Through the public API
(``fd.compile_rounds(...).time()``, as every section of ``speed.py``).

    python benchmarks/speed_conv.py            # n = 1 and 100, float32 and bf16 (minutes on CPU)
    python benchmarks/speed_conv.py --quick    # n = 1 and 4, small images (seconds)

Writes ``benchmarks/results/speed_conv.{json,md}`` (``--out``); the rates of a CPU run are the
CPU rows of ``CONV_MEASUREMENTS`` (a test checks that they agree), the GPU rows are H100
figures measured with an earlier version of the library.
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
import numpy as np
from speedlib.measured import CONV_MEASUREMENTS
from speedlib.workloads import (
  BATCH,
  LOCAL_STEPS,
  best_interleaved,
  float32_params,
  meta_line,
  run_meta,
)

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.algorithms import fedavg
from fedjax_dro.data import from_client_arrays
from fedjax_dro.models.builtin import conv_form

FORMS = ("lax", "patches")
DTYPE_OF = {"float32": "float32", "bf16": "bfloat16"}  # precision policy -> compute dtype key


def _data(n, shape, classes, examples, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n, examples) + shape, dtype=np.float32)
  y = rng.integers(0, classes, (n, examples)).astype(np.int32)
  return from_client_arrays(list(x), list(y))


def measure(
  clients,
  precisions,
  shape=(28, 28),
  classes=62,
  features=(32, 64),
  dense=128,
  passes=3,
  repeats=2,
  max_call_s=60.0,
  on_row=None,
):
  """Rows ``{num_clients, precision, dtype, lax, patches, ratio}`` (client updates per second;
  ratio = patches / lax), both forms timed in interleaved passes, best call kept; a form whose
  first call takes over ``max_call_s`` is timed by that one call alone (listed in
  ``single_call``: on CPU ``lax.conv`` under vmap at n = 100 takes minutes a call)."""
  rows = []
  for n in clients:
    data = _data(n, shape, classes, 2 * BATCH)
    for precision in precisions:
      progs, compile_s = {}, {}
      for form in FORMS:
        model = models.cnn(shape, classes, features=features, dense=dense, conv=form)
        alg = fedavg(
          model, local_steps=LOCAL_STEPS, batch_size=BATCH, backend="vmap", precision=precision
        )
        progs[form] = fd.compile_rounds(
          alg, data, rounds=1, hparams={"client_lr": 0.05}, init_params=float32_params(model)
        )
        compile_s[form] = progs[form].compile_time
      best, single = {}, {}
      for form in FORMS:  # the first call of each form, timed: a form past max_call_s stops there
        t0 = time.perf_counter()
        jax.block_until_ready(progs[form]()[0])
        best[form] = time.perf_counter() - t0
        single[form] = best[form] > max_call_s
      skip = [form for form in FORMS if single[form]]
      best = best_interleaved(progs, passes, repeats, best=best, skip=skip)
      row = {"num_clients": n, "precision": precision, "dtype": DTYPE_OF[precision]}
      row.update({form: n / best[form] for form in FORMS})
      row["ratio_patches_over_lax"] = row["patches"] / row["lax"]
      row["compile_s"] = compile_s
      row["single_call"] = [form for form in FORMS if single[form]]
      rows.append(row)
      print(json.dumps(row), flush=True)
      if on_row is not None:
        on_row(row)
  return rows


def table(rows):
  """``{(platform-less) dtype: {n: {form: rate}}}`` in the layout of CONV_MEASUREMENTS."""
  out = {}
  for r in rows:
    out.setdefault(r["dtype"], {})[r["num_clients"]] = {f: float(f"{r[f]:.3g}") for f in FORMS}
  return out


def _num(x):
  return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def markdown(result):
  meta = result["meta"]
  lines = [
    "# Convolution forms of the CNN (`benchmarks/speed_conv.py`)",
    "",
    meta_line(meta),
    "",
    f"FedAvg client updates per second, the CNN {meta['model']} ({LOCAL_STEPS} local steps of "
    f"batch {BATCH}), per-client weights side by side under `vmap`; `lax` and `patches` compiled "
    "in the same process and timed in interleaved passes (best call; a form whose first call "
    "took over a minute is that one call, listed in the JSON's `single_call`). Rows can come from "
    "several invocations (`--merge`; the header names the last one): each row's two forms were "
    "measured side by side in one process.",
    "",
    "| n | precision | lax.conv | patches | patches / lax | faster |",
    "|---|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    faster = "patches" if r["patches"] > r["lax"] else "lax"
    lines.append(
      f"| {r['num_clients']} | {r['precision']} | {_num(r['lax'])} | {_num(r['patches'])} | "
      f"{r['ratio_patches_over_lax']:.2f} | {faster} |"
    )
  lines += [
    "",
    '## What `conv="auto"` picks (the platform defaults `Tuning.conv` / `conv_bf16`)',
    "",
    "The faster form at the largest measured n of each (platform, compute dtype). GPU: the H100",
    "figures of an earlier version (n = 1000 clients of the same CNN, older code; the per-client loop ran",
    "358 updates/s). CPU: this benchmark.",
    "",
    "| platform | dtype | n | lax.conv | patches | auto |",
    "|---|---|---|---|---|---|",
  ]
  for (plat, dtype), by_n in CONV_MEASUREMENTS.items():
    n = max(by_n)
    lines.append(
      f"| {plat} | {dtype} | {n} | {_num(by_n[n]['lax'])} | {_num(by_n[n]['patches'])} | "
      f"{conv_form(plat, dtype)} |"
    )
  lines.append("")
  return "\n".join(lines)


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="n = 1 and 4 on 8x8 images (seconds)")
  parser.add_argument("--clients", default=None, help="comma-separated n (default 1,100)")
  parser.add_argument("--precisions", default="float32,bf16")
  parser.add_argument(
    "--merge", action="store_true", help="keep the rows of --out at other (n, precision)"
  )
  parser.add_argument("--out", default=os.path.join(HERE, "results", "speed_conv.json"))
  args = parser.parse_args(argv)
  precisions = [p for p in args.precisions.split(",") if p]
  for p in precisions:
    if p not in DTYPE_OF:
      parser.error(f"--precisions: {p!r} is not one of {tuple(DTYPE_OF)}")
  kept = []
  if args.merge and os.path.exists(args.out):
    with open(args.out) as f:
      kept = json.load(f)["rows"]
  load_before = os.getloadavg()[0]
  if args.quick:
    kw = dict(shape=(8, 8), classes=10, features=(4, 8), dense=16, passes=1, repeats=1)
    clients = (1, 4)
    model = "8x8x1 -> 10 (convolutions 4/8, dense 16)"
  else:
    kw = {}
    clients = (1, 100)
    model = "28x28x1 -> 62 (convolutions 32/64, dense 128)"
  if args.clients:
    clients = tuple(int(n) for n in args.clients.split(",") if n)
  rows = []

  def save(row=None):
    if row is not None:
      rows.append(row)
    new = {(r["num_clients"], r["precision"]) for r in rows}
    merged = [r for r in kept if (r["num_clients"], r["precision"]) not in new] + rows
    merged.sort(key=lambda r: (r["num_clients"], list(DTYPE_OF).index(r["precision"])))
    return write(merged, args.out, argv, model, load_before)

  measure(clients, precisions, on_row=save, **kw)
  result = save()
  print(markdown(result))
  print(f"wrote {args.out} and {os.path.splitext(args.out)[0]}.md")
  return result


def write(rows, out, argv, model, load_before):
  """The results file of ``rows`` (written after every row: a long CPU run keeps what it has)."""
  result = {
    "meta": run_meta("speed_conv.py", argv, load_before, model=model),
    "rows": rows,
    "table": {dtype: {str(n): v for n, v in t.items()} for dtype, t in table(rows).items()},
  }
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump(result, f, indent=2)
  with open(os.path.splitext(out)[0] + ".md", "w") as f:
    f.write(markdown(result))
  return result


if __name__ == "__main__":
  main()
