"""The report of ``benchmarks/speed.py``: the markdown of a results file, its acceptance checks
(the targets and what they ask of the hardware), and writing both next to each other.
Derived from the JSON alone, so ``--render`` rewrites the markdown without measuring."""

from __future__ import annotations

import json
import math
import os

from speedlib.ceiling import HAND_WRITTEN_RUNGS
from speedlib.workloads import BACKENDS, BATCH, EXAMPLES, LOCAL_STEPS, LOOP_CLIENTS, plan_label

# Why an algorithm's round costs more than 2x FedAvg's at equal settings: what it computes that
# FedAvg does not (the acceptance asks for every round within 2x, exceptions
# explained). Shown under each algorithms table for the algorithms over 2x.
ROUND_COSTS = {
  "pfedme": "K = `personal_steps` (5 by default, the paper's) inner gradient steps on the "
  "Moreau envelope for every local step: K gradient evaluations where FedAvg computes one "
  "(pFedMe's Algorithm 1), and with "
  '`personal_updates="all"` (the paper\'s) every client trains every round',
  "ditto": "two local problems per round: FedAvg's pass on the global model and each client's "
  "own pass on its personal model (regularised towards the global one), plus reading and "
  "writing the [n, ...] personal models; about 2x FedAvg's products",
  "karula": "the pairwise projection of all n personal models every round (its time alone is the "
  "line under the table): in this section D = ones and the 3 timed rounds start cold, far from "
  "the warm-started late rounds of a real run, and the MLP has d = 210k parameters per client "
  "against one minibatch gradient per client; on the CNN of the `karula-femnist` stand-in "
  "(100 writers, warm start, the `karula` section) Karula's round is 0.24x FedAvg's",
}


def _fmt_rate(x):
  return f"{x / 1e6:.2f} M" if x >= 1e6 else (f"{x / 1e3:.1f} k" if x >= 1e4 else f"{x:.0f}")


def _rate_cell(part):
  """``updates/s (x the loop, % of dense)`` of a measured rate."""
  pct = f", {100 * part['fraction_of_dense']:.0f}%" if "fraction_of_dense" in part else ""
  return f"{_fmt_rate(part['updates_per_s'])} ({part['speedup_vs_loop']:.1f}x{pct})"


def markdown(result) -> str:
  meta = result["meta"]
  lines = [
    "# Simulator speed (`benchmarks/speed.py`)",
    "",
    f"Device: **{meta['device_kind']}** ({meta['platform']}, {meta['cpu_count']} CPU cores, "
    f"{meta.get('num_devices', 1)} JAX device(s)), "
    f"jax {meta['jax']}; default precision on this platform: `{meta['default_precision']}`. "
    f"FedAvg, {LOCAL_STEPS} local steps of batch {BATCH}, {EXAMPLES} examples per client, full "
    "participation. Command: `" + meta["command"] + "`.",
    "",
  ]
  dense = result.get("dense")
  if dense:
    lines += ["## Dense matmul rate (the yardstick)", "", "| precision | GFLOP/s | size |"]
    lines += ["|---|---|---|"]
    for p, d in dense.items():
      lines.append(f"| {p} | {d['flops_per_s'] / 1e9:.1f} | {d.get('size')} |")
    lines.append("")
  wl = result.get("workloads")
  if wl:
    lines += [
      f"## Client updates per second ({wl['precision']})",
      "",
      "x = speed-up over the per-client jitted loop (timed on up to "
      f"{LOOP_CLIENTS} clients); % = achieved FLOP/s as a share of the dense {wl['precision']} "
      "rate; auto's plan in brackets; 'auto, mesh': `fd.run(..., mesh=make_mesh())` with the "
      "clients split over all devices of the process (on CPU one device per core, "
      "`--cpu-devices`, as `fedjax-dro run --devices auto`; one device: '-').",
      "",
      "| model | n | params | MFLOP/update | loop | vmap | map | chunked | auto | auto, mesh | "
      "compile s (auto) | memory MB (auto) |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in wl["rows"]:

      def cell(b, r=r):
        return _rate_cell(r[b]) if b in r else "-"

      auto = r.get("auto", {})
      mem = auto.get("memory", {}).get("total")
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {r['num_params']} | "
        f"{r['flops_per_update'] / 1e6:.1f} | {_fmt_rate(r['loop']['updates_per_s'])} | "
        f"{cell('vmap')} | {cell('map')} | {cell('chunked')} | {cell('auto')} "
        f"[{plan_label(auto)}] | {cell('auto_mesh')} | {auto.get('compile_s', float('nan')):.1f} | "
        f"{'-' if mem is None else f'{mem / 2**20:.0f}'} |"
      )
    if wl.get("skipped"):
      s = ", ".join(f"{x['model']} n={x['num_clients']}" for x in wl["skipped"])
      lines += ["", f"Skipped (over --max-gflop-per-round): {s}."]
    lines.append("")
  lines += roofline_lines(result.get("roofline"))
  ceiling = result.get("ceiling")
  if ceiling and ceiling.get("rows"):
    lines += [
      f"## Matmul ceiling: what XLA's own kernels allow ({ceiling['precision']})",
      "",
      "The matrix products of one local step of c clients side by side (the `dot_general`s the",
      "step traces to), each timed alone in the fastest of its 8 operand and result layouts;",
      f"{LOCAL_STEPS} x their sum is the least time c updates can take with everything else",
      "(sampling, softmax, SGD update, aggregation, loop overhead) free. Best over c; the loop",
      "and `auto` measured in the same section. x = speed-up over the per-client loop, % = share",
      "of the dense rate.",
      "",
      "| model | n | loop | auto | ceiling | c at the ceiling | auto / ceiling |",
      "|---|---|---|---|---|---|---|",
    ]
    for r in ceiling["rows"]:
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {_fmt_rate(r['loop_updates_per_s'])} | "
        f"{_rate_cell(r['auto'])} [{r['auto']['plan']}] | {_rate_cell(r['ceiling'])} | "
        f"{r['ceiling']['chunk']} | {100 * r['auto_of_ceiling']:.0f}% |"
      )
    lines += [
      "",
      "The products at the ceiling (batch x m x k x n, the fastest layout, GFLOP/s, share of",
      "the step's product time); the ceiling at every c:",
      "",
      "| model | products | ceiling updates/s by c |",
      "|---|---|---|",
    ]
    for r in ceiling["rows"]:
      prods = "; ".join(
        f"{p['batch']}x{p['m']}x{p['k']}x{p['n']} `{p['layout']}` {p['gflop_per_s']:.0f} "
        f"({100 * p['share']:.0f}%)"
        for p in r["ceiling"]["products"]
      )
      chunks = ", ".join(f"{c['chunk']}: {_fmt_rate(c['updates_per_s'])}" for c in r["by_chunk"])
      lines.append(f"| {r['model']} | {prods} | {chunks} |")
    chains = [r for r in ceiling["rows"] if r.get("product_chain")]
    if chains:
      lines += [
        "",
        f"The softmax round's products alone as the round runs them: {LOCAL_STEPS} dependent",
        "steps (forward product and weight gradient; examples as stored, weights carried",
        "`[c, k, d]`, the fastest layout of this chain), nothing else; ms for all n clients by",
        "chunk c, and the best against the ceiling's time:",
        "",
        "| model | n | ms by c | best / ceiling time |",
        "|---|---|---|---|",
      ]
      for r in chains:
        ch = r["product_chain"]
        ms = ", ".join(f"{x['chunk']}: {1e3 * x['s']:.2f}" for x in ch["by_chunk"])
        lines.append(f"| {r['model']} | {r['num_clients']} | {ms} | {ch['of_ceiling_time']:.2f}x |")
    for r in ceiling["rows"]:
      if r.get("hand_written"):
        lines += _hand_written_table(r)
    lines.append("")
  pr = result.get("precision")
  if pr and pr.get("rows"):
    lines += [
      "## Precision policies (auto backend)",
      "",
      "| model | n | precision | updates/s | % of dense (same precision) | compile s |",
      "|---|---|---|---|---|---|",
    ]
    for r in pr["rows"]:
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {r['precision']} | "
        f"{_fmt_rate(r['updates_per_s'])} | {100 * r['fraction_of_dense']:.0f}% | "
        f"{r['compile_s']:.1f} |"
      )
    lines.append("")
  for block in result.get("algorithms") or []:
    lines += [
      f"## Round time relative to FedAvg ({block['model']}, n = {block['num_clients']})",
      "",
      "| algorithm | ms / round | x FedAvg | compile s |",
      "|---|---|---|---|",
    ]
    for r in sorted(block["rows"], key=lambda r: r.get("vs_fedavg", math.inf)):
      if "error" in r:
        lines.append(f"| {r['algorithm']} | error: {r['error']} | | |")
        continue
      lines.append(
        f"| {r['algorithm']} | {1e3 * r['s_per_round']:.2f} | {r['vs_fedavg']:.2f} | "
        f"{r['compile_s']:.1f} |"
      )
    over = [r for r in block["rows"] if r.get("vs_fedavg", 0) > 2 and r["algorithm"] in ROUND_COSTS]
    if over:
      lines += ["", "Over 2x FedAvg's round, by what they compute:", ""]
      lines += [
        f"- {r['algorithm']} ({r['vs_fedavg']:.2f}x): {ROUND_COSTS[r['algorithm']]}" for r in over
      ]
    proj = block.get("karula_projection")
    if proj:
      lines += [
        "",
        f"Karula's pairwise projection alone (dual, n = {block['num_clients']}, D = ones): "
        f"{1e3 * proj['s']:.1f} ms per call ({proj['iterations']} iterations).",
      ]
    lines.append("")
  run = result.get("run")
  if run:
    r = run["run"]
    lines += [
      f"## `fd.run` against its compiled chunk ({run['model']}, n = {run['num_clients']})",
      "",
      "| | s |",
      "|---|---|",
      f"| compiled chunk, per round (steady) | {run['compiled_chunk_s_per_round']:.4f} |",
      f"| fd.run, {run['rounds']} rounds: compile (rounds + evaluation) | {r['compile_s']:.2f} |",
      f"| fd.run, {run['rounds']} rounds: run (incl. one evaluation) | {r['wall_s']:.3f} |",
      f"| fd.run, per round incl. evaluation | {r['s_per_round_incl_eval']:.4f} |",
      f"| fd.run, outside compile and run (validation, init, setup) | {r['other_s']:.3f} |",
      f"| evaluation of all clients, per chunk (estimate) | {run['eval_s_per_chunk_estimate']:.3f} |",
      f"| data build + transfer (not in fd.run) | {run['data_build_and_transfer_s']:.2f} |",
    ]
    if "model_init_first_call_s" in run:
      lines.append(
        f"| model.init, first call (in fd.run without init_params; compiles) | "
        f"{run['model_init_first_call_s']:.2f} |"
      )
    again = run.get("run_again_other_seed")
    if again:
      lines += [
        f"| fd.run again, another seed: total (compile {again['compile_s']:.2f}: programs "
        f"reused) | {again['total_s']:.3f} |",
        f"| fd.run the first time: total | {r['total_s']:.3f} |",
      ]
    lines.append("")
  fold = result.get("folding")
  if fold:
    lines += [
      "## Shared model: client axis folded into the batch",
      "",
      "ms per call (best of 5); FedSGD's gradient: one local step per client (`local_round`) vs one",
      "backward pass over all clients' minibatches (`federated_gradient`); evaluation of a global",
      "model: one `vmap` over all clients vs the `auto` backend (chunks when memory is short).",
      "",
      "| model | n | gradient per client | gradient folded | x | eval vmap | eval auto | x |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for r in fold["rows"]:
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {1e3 * r['grad_per_client_s']:.1f} | "
        f"{1e3 * r['grad_folded_s']:.1f} | {r['grad_per_client_s'] / r['grad_folded_s']:.2f} | "
        f"{1e3 * r['eval_vmap_s']:.1f} | {1e3 * r['eval_auto_s']:.1f} | "
        f"{r['eval_vmap_s'] / r['eval_auto_s']:.2f} |"
      )
    lines.append("")
  dev = result.get("devices")
  if dev and dev.get("rows"):
    lines += [
      f"## A sweep on {dev['devices']} devices",
      "",
      "`fd.sweep` of 4 learning rates, seconds per call (best of 3, after a warm-up call): one",
      "device, then a mesh over all devices with the configurations split (`sweep` axis) or the",
      "clients split (`clients` axis); in brackets the speed-up over one device.",
      "",
      "| model | n | rounds | one device | configurations split | clients split |",
      "|---|---|---|---|---|---|",
    ]

    def split(r, name):
      if f"{name}_s" not in r:
        return "-"
      return f"{r[f'{name}_s']:.2f} ({r[f'{name}_speedup']:.2f}x)"

    for r in dev["rows"]:
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {r['rounds']} | {r['one_device_s']:.2f} | "
        f"{split(r, 'configs_split')} | {split(r, 'clients_split')} |"
      )
    lines.append("")
  cache = result.get("sweep_cache")
  if cache and cache.get("rows"):
    lines += [
      "## A sweep's rows share the CPU cache target",
      "",
      "`fd.sweep` of 4 learning rates on one device, seconds per call (best of 3, after a warm-up",
      "call): each row's client chunks planned into its share of `AUTO_CPU_CHUNK_BYTES` (the",
      "default) vs into the whole target, as one run (clients per chunk in brackets).",
      "",
      "| model | n | rounds | rows share the target | whole target per row | speed-up |",
      "|---|---|---|---|---|---|",
    ]
    for r in cache["rows"]:
      chunks = {k: ",".join(map(str, r[f"{k}_chunks"])) for k in ("row_shared", "whole_per_row")}
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {r['rounds']} | {r['row_shared_s']:.3f} "
        f"({chunks['row_shared']}) | {r['whole_per_row_s']:.3f} ({chunks['whole_per_row']}) | "
        f"{r['speedup']:.2f}x |"
      )
    lines.append("")
  if result.get("karula"):
    import speed_karula  # its own module: the section runs the reproduction's stand-in

    lines += ["#" + speed_karula.markdown(result["karula"]), ""]
  acc = result.get("acceptance")
  if acc:
    lines += ["## Acceptance checks (this run)", ""]
    lines += [f"- {a}" for a in acc]
    lines.append("")
  return "\n".join(lines)


def loop_ceiling(row, target):
  """What a speed-up of ``target`` over the per-client loop asks of the hardware.

  A backend's speed-up over the loop divided by its share of the dense matmul rate is the same
  for every backend of the row (both are its updates/s over a constant: the loop's rate, and the
  dense rate over the FLOP per update), so it is the speed-up at 100% of the dense rate; the
  target needs ``target / ceiling`` of that rate.
  """
  auto = row.get("auto") or {}
  x, f = auto.get("speedup_vs_loop"), auto.get("fraction_of_dense")
  if not x or not f:
    return ""
  ceiling = x / f
  return (
    f"; the loop runs {row['loop']['updates_per_s'] / 1e3:.1f} k updates/s, so 100% of the "
    f"dense rate would be {ceiling:.0f}x and {target}x needs {100 * target / ceiling:.0f}% of "
    f"it, where auto reaches {100 * f:.0f}%"
  )


# The CPU acceptance targets the ceiling section is compared with: (model, n) -> the least
# share of the ceiling ``auto`` is to reach.
CEILING_TARGETS = {("softmax", 1000): 0.5, ("mlp", 1000): 0.66}


def ceiling_lines(result):
  """One acceptance line per row of the ``ceiling`` section: ``auto`` against the ceiling, and
  where a target is set for the row (:data:`CEILING_TARGETS`), whether it lies above it."""
  out = []
  for r in (result.get("ceiling") or {}).get("rows", []):
    auto, c = r["auto"], r["ceiling"]

    def shown(part):
      pct = f", {100 * part['fraction_of_dense']:.0f}%" if "fraction_of_dense" in part else ""
      return f"{part['speedup_vs_loop']:.1f}x the loop{pct}"

    line = (
      f"ceiling, {r['model']} n={r['num_clients']}: auto {shown(auto)}; XLA's matmul ceiling "
      f"{shown(c)} ({c['chunk']} clients side by side, every other operation free): auto "
      f"reaches {100 * r['auto_of_ceiling']:.0f}% of it"
    )
    target = CEILING_TARGETS.get((r["model"], r["num_clients"]))
    if target:
      met = "met" if r["auto_of_ceiling"] >= target else "not met"
      line += f" (target {100 * target:.0f}% of the ceiling: {met})"
    chain = r.get("product_chain")
    if chain:
      line += (
        f"; the products alone, chained over the {LOCAL_STEPS} steps in their fastest layout, "
        f"take {chain['of_ceiling_time']:.1f}x the ceiling's time"
      )
    hand = r.get("hand_written")
    if hand:
      same, leanest = hand[HAND_WRITTEN_RUNGS[0][0]], max(hand.values(), key=_rate)
      line += (
        f"; the same round written by hand reaches {100 * same['of_ceiling']:.0f}% of it (auto "
        f"runs at {same['auto_of_this']:.2f}x its rate), the leanest hand-written round "
        f"{100 * leanest['of_ceiling']:.0f}%"
      )
    out.append(line)
  return out


def acceptance(result):
  out = []
  wl = result.get("workloads") or {}
  for r in wl.get("rows", []):
    best = max((r[b] for b in BACKENDS if b in r), key=lambda c: c["updates_per_s"], default=None)
    mesh = r.get("auto_mesh")
    on_mesh = f" ({mesh['devices']} devices)" if mesh else ""
    if r["model"] == "mlp" and r["num_clients"] == 1000 and "auto" in r:
      f = r["auto"].get("fraction_of_dense", float("nan"))
      fb = best.get("fraction_of_dense", float("nan"))
      fm = mesh.get("fraction_of_dense", float("nan")) if mesh else float("nan")
      out.append(
        f"MLP n=1000: auto {100 * f:.0f}% of the dense {wl['precision']} rate on one device"
        + (f", {100 * fm:.0f}% on the mesh{on_mesh}" if mesh else "")
        + f" (best single-device backend {100 * fb:.0f}%; "
        f"target 60% on CPU, 30% of bf16 on GPU): "
        f"{'PASS' if max(f, fm) >= 0.6 else 'FAIL'}"
      )
    if r["model"] == "softmax" and r["num_clients"] == 1000 and "auto" in r:
      x = r["auto"]["speedup_vs_loop"]
      xm = mesh["speedup_vs_loop"] if mesh else float("nan")
      out.append(
        f"softmax regression n=1000: auto {x:.0f}x the per-client loop on one device"
        + (f", {xm:.0f}x on the mesh{on_mesh}" if mesh else "")
        + f" (target 60x{loop_ceiling(r, 60)}): "
        f"{'PASS' if max(x, xm) >= 60 else 'FAIL'}"
      )
    if r["model"].startswith("cnn") and r["num_clients"] == 1000 and "auto" in r:
      x = r["auto"]["speedup_vs_loop"]
      out.append(f"{r['model']} n=1000: auto {x:.1f}x the per-client loop (GPU target 25x)")
  out += ceiling_lines(result)
  for block in result.get("algorithms") or []:
    worst = [r for r in block["rows"] if r.get("vs_fedavg", 0) > 2]
    names = (
      ", ".join(
        f"{r['algorithm']} {r['vs_fedavg']:.1f}x"
        + (" (explained under its table)" if r["algorithm"] in ROUND_COSTS else "")
        for r in worst
      )
      or "none"
    )
    out.append(f"algorithms over 2x FedAvg ({block['model']}, n={block['num_clients']}): {names}")
  return out


def render(out, markdown_out=None):
  """Rewrite the markdown of the results file ``out`` (and its acceptance checks) unmeasured."""
  with open(out) as f:
    result = json.load(f)
  if not isinstance(result, dict) or "meta" not in result:
    raise ValueError(f"--render: {out} is not a results file of benchmarks/speed.py (no 'meta')")
  md_path = write_results(result, out, markdown_out)
  print(f"rewrote {md_path} from {out}")
  return result


def write_results(result, out, markdown_out=None):
  """Derive the acceptance checks, save the JSON to ``out`` and its markdown; returns its path."""
  result["acceptance"] = acceptance(result)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump(result, f, indent=2, default=float)
  md_path = markdown_out or os.path.splitext(out)[0] + ".md"
  with open(md_path, "w") as f:
    f.write(markdown(result))
  return md_path


def _rate(part):
  return part["updates_per_s"]


def _hand_written_table(r):
  """The markdown lines of a ceiling row's hand-written rounds (the softmax workload)."""
  lines = [
    "",
    f"The softmax round written by hand ({r['num_clients']} clients; each rung does a subset of",
    "the work of the one above; ms for all clients by chunk c; `auto` is this section's",
    "measurement of the simulator, `same computation` returns the simulator's round):",
    "",
    "| round | what it does | ms by c | best updates/s | % of the ceiling |",
    "|---|---|---|---|---|",
    f"| `auto` | the simulator (`fd.compile_rounds`) | | {_fmt_rate(r['auto']['updates_per_s'])} "
    f"| {100 * r['auto_of_ceiling']:.0f}% |",
  ]
  for rung, what in HAND_WRITTEN_RUNGS:
    h = r["hand_written"].get(rung)
    if h is None:
      continue
    ms = ", ".join(f"{x['chunk']}: {1e3 * x['s']:.2f}" for x in h["by_chunk"])
    lines.append(
      f"| {rung} | {what} | {ms} | {_fmt_rate(h['updates_per_s'])} | {100 * h['of_ceiling']:.0f}% |"
    )
  return lines


def roofline_lines(section):
  """The markdown of a ``roofline`` section (``speed_sections.rooflines``)."""
  if not section or not section.get("rows"):
    return []
  lines = [
    f"## Rounds against the roofline ({section['precision']})",
    "",
    f"Peaks measured in the same process: dense {section['precision']} "
    f"{section['peak_flops_per_s'] / 1e9:.1f} GFLOP/s, copy bandwidth "
    f"{section['bytes_per_s'] / 1e9:.1f} GB/s. Bound = max(FLOPs / dense rate, bytes / "
    "bandwidth) of the round's local steps (FLOPs counted by the CPU compiler, bytes by the "
    "device's cost analysis of one loop-free step of 64 clients side by side; aggregation left "
    "out: a lower bound); % = bound / measured round time.",
    "",
    "| model | n | MFLOP / update | MB / update | FLOP / byte (ridge) | auto updates/s [plan] | "
    "ms / round | bound ms (limited by) | % of the bound |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for r in section["rows"]:
    u = r["per_update"]
    lines.append(
      f"| {r['model']} | {r['num_clients']} | {u['flops'] / 1e6:.2f} | {u['bytes'] / 1e6:.2f} | "
      f"{r['intensity']:.1f} ({r['ridge']:.1f}) | {_fmt_rate(r['updates_per_s'])} [{r['plan']}] | "
      f"{r['measured_s'] * 1e3:.2f} | {r['bound_s'] * 1e3:.3f} ({r['limited_by']}) | "
      f"{100 * r['share']:.0f}% |"
    )
  factored = [r for r in section["rows"] if r.get("factored")]
  if factored:
    lines += [
      "",
      "The same rounds with the wide dense layers kept factored over the local steps "
      "(`experimental.factored.local_factored_dense`), timed after the rows above:",
      "",
      "| model | n | layers factored | updates/s | against the dense rounds |",
      "|---|---|---|---|---|",
    ]
    for r in factored:
      f = r["factored"]
      lines.append(
        f"| {r['model']} | {r['num_clients']} | {', '.join(f['layers'])} | "
        f"{_fmt_rate(f['updates_per_s'])} | {f['speedup']:.2f}x |"
      )
  lines.append("")
  return lines
