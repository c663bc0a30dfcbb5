"""Where a compiled FedAvg round spends its time: the profile behind the ``ceiling`` section.

The round of ``benchmarks/speed.py``'s workloads (FedAvg, 4 local steps of batch 32 from 64
examples per client, full participation, the ``auto`` backend) is compiled once through
``fd.compile_rounds`` and run under ``jax.profiler.trace``. XLA's CPU runtime records one trace
event per executed thunk (a fusion, a dot, a while loop, a copy...), named after its HLO
instruction; this script reads the trace (``perfetto_trace.json.gz``), takes each event's self
time (its duration less that of the events nested in it on the same thread: a while loop's own
time is its loop overhead, not its body's) and assigns every instruction to a part of the round
from its opcode and the ``op_name`` metadata JAX wrote into the compiled HLO (which ``jax``
function of the round produced it):

* ``index generation``: the minibatch rows (``randint``, threefry bits and key splits, sorts);
* ``minibatch gathers``: the gathers of the rows of each step's minibatch;
* ``products``: the matrix products of the local steps (``dot_general``);
* ``softmax / elementwise``: the rest of the forward and backward pass (softmax, loss,
  activations, their gradients);
* ``parameter update``: the SGD step ``w - lr g`` and the client's delta;
* ``aggregation``: everything outside the per-client ``vmap`` (weighted sums over the clients,
  the server step, the round's bookkeeping);
* ``loop overhead``: the while loops' own time (the local-step scan, the chunks of clients),
  slicing the chunks' data and copies.

Tracing costs time per thunk, so the traced round is slower than an untraced one; the table
gives the shares of the traced time and, beside them, the untraced round time measured in the
same process, so the parts can be read as shares of the real round. The products' time is also
measured alone (the same einsums over the same chunks, in a program of their own), which is the
figure the matmul ceiling generalizes.

    python benchmarks/speed_profile.py                 # softmax and MLP at n = 1000
    python benchmarks/speed_profile.py --quick         # tiny (smoke test)
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.extend as jex  # noqa: E402
import numpy as np  # noqa: E402
from speedlib.workloads import BATCH, LOCAL_STEPS, make_workload  # noqa: E402

import fedjax_dro as fd  # noqa: E402
from fedjax_dro.algorithms import fedavg  # noqa: E402

PARTS = (
  "index generation",
  "minibatch gathers",
  "products",
  "softmax / elementwise",
  "parameter update",
  "aggregation",
  "loop overhead",
)
RANDOM = ("randint", "threefry", "random_bits", "random_split", "_split", "sort", "permutation")
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?[\]}) ] ?(\w[\w\-]*)\(")
OP_NAME = re.compile(r'op_name="([^"]*)"')


def instruction_metadata(hlo_text):
  """``{instruction name: (opcode, op_name)}`` of every instruction of compiled HLO text
  (``op_name`` empty where XLA added the instruction itself: copies, layout changes)."""
  out = {}
  for line in hlo_text.splitlines():
    m = INSTRUCTION.match(line)
    if m:
      op = OP_NAME.search(line)
      out[m.group(1)] = (m.group(2), op.group(1) if op else "")
  return out


def classify(name, opcode, op_name):
  """The part of the round (one of :data:`PARTS`) an instruction belongs to."""
  last = op_name.rsplit("/", 1)[-1]
  if not op_name:
    return "loop overhead"  # copies and layout changes XLA inserted
  if any(r in op_name for r in RANDOM):
    return "index generation"
  if opcode == "while" or opcode in ("copy", "copy-start", "copy-done", "tuple", "bitcast"):
    return "loop overhead"
  if "dynamic_slice" in last or "dynamic_update_slice" in last:
    return "loop overhead"  # a chunk's clients sliced out of the round's arrays, results put back
  if "vmap(" not in op_name:
    return "aggregation"
  if last == "gather" or opcode == "gather":
    return "minibatch gathers"
  if opcode == "dot" or last in ("dot_general", "dot"):
    return "products"
  if "jvp(" in op_name or "transpose(" in op_name:
    return "softmax / elementwise"
  return "parameter update"


def self_times(events):
  """``{name: total self microseconds}`` of complete trace events: each event's duration less
  that of the events nested in it on the same thread."""
  by_thread = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and "dur" in e:
      by_thread[(e.get("pid"), e.get("tid"))].append(e)
  totals = collections.Counter()
  for evs in by_thread.values():
    evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []  # [event, child time]
    for e in evs:
      while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
        done, child = stack.pop()
        totals[done["name"]] += done["dur"] - child
      if stack:
        stack[-1][1] += e["dur"]
      stack.append([e, 0.0])
    while stack:
      done, child = stack.pop()
      totals[done["name"]] += done["dur"] - child
  return totals


def traced_parts(prog, calls):
  """``(seconds per round by part, traced seconds per round)`` of a compiled program, from the
  self times of the thunks of ``calls`` traced calls."""
  meta = instruction_metadata(prog.as_text())
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(calls):
        jax.block_until_ready(prog()[0])
    (path,) = glob.glob(os.path.join(tmp, "**", "perfetto_trace.json.gz"), recursive=True)
    with gzip.open(path, "rt") as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  parts = dict.fromkeys(PARTS, 0.0)
  for name, us in self_times(events).items():
    if name in meta:
      parts[classify(name, *meta[name])] += us * 1e-6 / calls / prog.rounds
  return parts, sum(parts.values())


def dot_equations(jaxpr):
  """Every ``dot_general`` equation of ``jaxpr``, those of its sub-jaxprs included."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      yield eqn
    for sub in jex.core.jaxprs_in_params(eqn.params):
      yield from dot_equations(sub)


def product(eqn, lhs, rhs):
  """The ``dot_general`` of equation ``eqn`` (its dimensions, precision, result type)."""
  return jax.lax.dot_general(
    lhs,
    rhs,
    eqn.params["dimension_numbers"],
    precision=eqn.params.get("precision"),
    preferred_element_type=eqn.params.get("preferred_element_type"),
  )


def products_alone(model, params, data, chunk, repeats):
  """Seconds per round of the local steps' matrix products alone: the ``dot_general``s of one
  vmapped step over ``chunk`` clients (traced from the model, operands random), ``LOCAL_STEPS``
  times per chunk of the round, in one program of their own."""
  from fedjax_dro.common.model import client_loss_and_grad

  x0, y0 = data.x[0], data.y[0]
  nex = x0.shape[0]

  def step(w, key):
    return client_loss_and_grad(model, w, x0, y0, nex, key, BATCH)[1]

  stacked = jax.tree.map(lambda a: np.broadcast_to(a, (chunk,) + a.shape), params)
  keys = jax.random.split(jax.random.PRNGKey(0), chunk)
  jaxpr = jax.make_jaxpr(jax.vmap(step))(stacked, keys).jaxpr
  dots = list(dot_equations(jaxpr))
  operands = [
    [jax.random.normal(jax.random.PRNGKey(i), v.aval.shape, v.aval.dtype) for v in e.invars]
    for i, e in enumerate(dots)
  ]
  chunks = -(-data.num_clients // chunk)

  def all_products(ops):
    # the operands and results ride in the loop's carry through an optimization barrier, so XLA
    # can neither hoist the loop-invariant products out of the loop nor simplify them away
    def body(_, carry):
      a, _ = jax.lax.optimization_barrier(carry)
      outs = [product(e, lhs, rhs) for e, (lhs, rhs) in zip(dots, a)]
      return a, outs

    outs = [jax.eval_shape(lambda a, b, e=e: product(e, a, b), *o) for e, o in zip(dots, ops)]
    zeros = [np.zeros(o.shape, o.dtype) for o in outs]
    return jax.lax.fori_loop(0, LOCAL_STEPS * chunks, body, (ops, zeros))[1]

  f = jax.jit(all_products)
  jax.block_until_ready(f(operands))
  best = np.inf
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(f(operands))
    best = min(best, time.perf_counter() - t0)
  return best


def profile(kind, n, quick):
  """The profile of one workload's round (a dict, see :func:`main`)."""
  model, params, data = make_workload(kind, n)
  alg = fedavg(model, local_steps=LOCAL_STEPS, batch_size=BATCH)
  prog = fd.compile_rounds(alg, data, rounds=1, hparams={"client_lr": 0.05}, init_params=params)
  chunk = _auto_chunk(prog, n)
  repeats = 2 if quick else 5
  parts, traced = traced_parts(prog, 1 if quick else 3)
  # the untraced round and the products alone, alternately, the best of each (a loaded CPU
  # changes speed for seconds at a time: each is taken in the machine's fast regime)
  untraced = alone = np.inf
  for _ in range(1 if quick else 3):
    untraced = min(untraced, min(prog.time(repeats=repeats).call_seconds))
    alone = min(alone, products_alone(model, params, data, chunk, repeats))
  return {
    "model": kind,
    "num_clients": n,
    "chunk": chunk,
    "round_s": untraced,
    "updates_per_s": n / untraced,
    "traced_round_s": traced,
    "parts": {
      p: {"traced_s": s, "share": s / traced if traced else 0.0, "s": untraced * s / traced}
      for p, s in parts.items()
    },
    "products_alone_s": alone,
    "products_alone_share": alone / untraced,
  }


def _auto_chunk(prog, n):
  """Clients per chunk the ``auto`` backend planned (``n``: one ``vmap``)."""
  from fedjax_dro.core import clients as client_backends

  plans = list(client_backends.recent_plans)
  if not plans or plans[-1].backend == "vmap" or not plans[-1].chunk_size:
    return n
  return int(plans[-1].chunk_size)


def markdown(rows, uptime):
  lines = [
    "# Where a FedAvg round's time goes (`benchmarks/speed_profile.py`)",
    "",
    f"Device: {jax.devices()[0].platform}, jax {jax.__version__}; FedAvg, {LOCAL_STEPS} local "
    f"steps of batch {BATCH}, 64 examples per client, `auto` backend. Load (uptime): {uptime}.",
    "",
    "Method: the compiled round run under `jax.profiler.trace`; each executed XLA thunk's self "
    "time (less the thunks nested in it), assigned to a part by its HLO opcode and the `op_name` "
    "JAX recorded for it. Shares are of the traced time (tracing slows small thunks); ms are "
    "those shares of the untraced round measured in the same process. `products alone`: the "
    "same matrix products in a program of their own.",
    "",
    "| part | " + " | ".join(f"{r['model']} n={r['num_clients']}" for r in rows) + " |",
    "|---|" + "---|" * len(rows),
  ]
  for p in PARTS:
    cells = [f"{r['parts'][p]['share']:.0%} ({r['parts'][p]['s'] * 1e3:.2f} ms)" for r in rows]
    lines.append(f"| {p} | " + " | ".join(cells) + " |")
  lines.append(
    "| **round (untraced)** | "
    + " | ".join(
      f"{r['round_s'] * 1e3:.2f} ms, {r['updates_per_s'] / 1e3:.1f} k updates/s" for r in rows
    )
    + " |"
  )
  lines.append(
    "| products alone | "
    + " | ".join(
      f"{r['products_alone_s'] * 1e3:.2f} ms ({r['products_alone_share']:.0%} of the round)"
      for r in rows
    )
    + " |"
  )
  lines.append("| chunk (auto) | " + " | ".join(str(r["chunk"]) for r in rows) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny workloads (smoke test)")
  parser.add_argument("--out", default=None, help="JSON results path")
  parser.add_argument("--md", default=None, help="markdown table path")
  args = parser.parse_args(argv)
  workloads = [("softmax", 40)] if args.quick else [("softmax", 1000), ("mlp", 1000)]
  rows = []
  for kind, n in workloads:
    row = profile(kind, n, args.quick)
    print(json.dumps(row), flush=True)
    rows.append(row)
  uptime = " ".join(os.popen("uptime").read().split()[-5:]) if os.path.exists("/proc") else "?"
  text = markdown(rows, uptime)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"uptime": uptime, "rows": rows}, f, indent=1)
  if args.md:
    with open(args.md, "w") as f:
      f.write(text)
  return rows


if __name__ == "__main__":
  main()
