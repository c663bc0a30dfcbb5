"""``python benchmarks/speed.py --preset gpu``: the GPU measurements in one call.

Meant for one H100 or H200 in under 8 minutes (``--budget-s``, default 480 s: the anchors'
whole runs are skipped, and projected, when they would not fit in what is left). The results
are written after each section (a call cut off at its limit keeps what it measured). First the
device's peaks: the dense-matmul rate of each precision and the copy bandwidth (the two terms of
the roofline, ``speedlib/roofline.py``). Then the sections of ``--gpu-sections``, in this order:

1. ``femnist``: FLUTE's FEMNIST-sized FedAvg workload through ``fd.run`` (``anchors.py``): 50
   measured rounds, the whole 1500-round run (compilation included), the round against its
   roofline, and a ``jax.profiler`` trace of the measured rounds (kernels, kernel time and
   device-to-host copies per round, how busy the device was: ``speedlib/trace.py``);
   ``femnist_factored``: the same with the wide dense layer kept factored over the local epoch
   (``experimental.factored.local_factored_dense``), measured whole where the budget allows;
2. ``variants``: the same rounds under the other ways of running the participants
   (:data:`VARIANTS`: the epoch loop's exit tested every k steps, the participants sorted by
   step count in chunks of c), side by side with their rooflines and traces;
3. ``sweep``: the workload as a 64-configuration ``fd.sweep`` (4 client learning rates x 16
   seeds) against one run of it, each timed whole and again compiled, with both rooflines;
4. ``roofline``: the built-in CNN and the MLP 784-200-200-62 at n = 1000 against their
   rooflines (``speed_sections.rooflines``);
5. ``cifar``: pfl-research's CIFAR-10 workload, whole where the budget allows.

Not run unless named (:data:`EXTRA_SECTIONS`): ``cnn`` (the CNN at n = 1000 with each
convolution form against the per-client jitted loop), ``cnn_bf16`` (both forms in bf16: does
``conv="auto"`` pick the faster?), ``mlp_precision`` (the MLP in float32, tf32 and bf16 against
the dense rate of each), ``cnn_10k`` (10,000 CNN clients complete).

``--merge-from FILE`` keeps the sections of an earlier results file that this call does not
measure (the kept keys and the command that measured them are recorded in ``meta.kept_from``).
``--tiny`` runs the same code path with tiny sizes on any device: the test of this entry point.
Writes ``benchmarks/results/speed_gpu.{json,md}`` on a GPU (``speed_gpu_<platform>``
elsewhere; ``--out``).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import platform
import sys
import time

import anchors
import jax

from fedjax_dro.core.precision import default_precision
from fedjax_dro.core.ragged import epoch_chunk, local_folded_step, step_block
from fedjax_dro.experimental.factored import local_factored_dense
from fedjax_dro.models.builtin import conv_form
from speedlib import (
  report as speed_report,
  sections as speed_sections,
  workloads as speed_workloads,
)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/
BUDGET_S = 480.0
# The FEMNIST round's variants side by side: (exit test every k local steps, participants sorted
# by step count in chunks of c; None: one group, the backend's plan)
VARIANTS = ((1, None), (1, 1), (1, 2), (4, 5))
GPU_SECTIONS = ("femnist", "femnist_factored", "variants", "sweep", "roofline", "cifar")
# also measurable, not run by default: the CNN at n = 1000 against the per-client loop with both
# convolution forms, both forms in bf16, the MLP in each precision, 10,000 CNN clients
EXTRA_SECTIONS = ("cnn", "cnn_bf16", "mlp_precision", "cnn_10k")
ANCHOR_SECTION = {"flute_femnist": "femnist", "pfl_cifar10": "cifar"}
# the keys of the results each section writes (--merge-from keeps the others)
SECTION_KEYS = {
  "anchors": ("femnist", "cifar"),
  "blocks": ("variants",),
  "sweep": ("sweep",),
  "roofline": ("roofline",),
  "workloads": ("cnn", "cnn_10k"),
  "cnn_bf16": ("cnn_bf16",),
  "precision": ("mlp_precision",),
  "cnn_10k": ("cnn_10k",),
}


def default_out():
  backend = jax.default_backend()
  name = "speed_gpu" if backend == "gpu" else f"speed_gpu_{backend}"
  return os.path.join(HERE, "results", f"{name}.json")


def _section_args(args, **changes):
  out = copy.copy(args)
  for k, v in changes.items():
    setattr(out, k, v)
  return out


def _guarded(name, fn, errors):
  """``fn()``, or ``None`` with the error recorded (an allocation failure is a result here)."""
  try:
    return fn()
  except Exception as e:  # reported in the results, not hidden
    errors[name] = f"{type(e).__name__}: {str(e)[:500]}"
    print(f"{name}: {errors[name]}", flush=True)
    return None


def run(args, argv):
  if args.tiny:
    with speed_workloads.tiny_sizes():
      return _run(args, argv)
  return _run(args, argv)


def _run(args, argv):
  start = time.perf_counter()
  tiny = args.tiny
  budget = args.budget_s if args.budget_s is not None else BUDGET_S
  cpu = jax.default_backend() == "cpu"
  base = _section_args(
    args,
    quick=tiny,
    max_clients=10**9,
    max_map_clients=0,
    backends=["auto"],
    max_gflop_per_round=args.max_gflop_per_round,
    precision=None,
  )
  device = jax.devices()[0]
  result = {
    "meta": {
      "platform": jax.default_backend(),
      "device": str(device),
      "device_kind": getattr(device, "device_kind", str(device)),
      "cpu_count": os.cpu_count(),
      "python": sys.version.split()[0],
      "jax": jax.__version__,
      "machine": platform.machine(),
      "default_precision": default_precision(),
      "command": "python benchmarks/speed.py " + " ".join(argv),
      "num_devices": len(jax.devices()),
      "local_steps": speed_workloads.LOCAL_STEPS,
      "batch_size": speed_workloads.BATCH,
      "examples_per_client": speed_workloads.EXAMPLES,
      "preset": "gpu",
      "tiny": tiny,
      "budget_s": budget,
      "load_before": round(os.getloadavg()[0], 2),
    },
    "errors": {},
  }
  sections = [x for x in (args.gpu_sections or ",".join(GPU_SECTIONS)).split(",") if x]
  for x in sections:
    if x not in GPU_SECTIONS + EXTRA_SECTIONS:
      raise ValueError(
        f"--gpu-sections: unknown section {x!r}; choose from {GPU_SECTIONS + EXTRA_SECTIONS}"
      )
  if args.merge_from:  # the sections not measured here are kept from an earlier results file
    with open(args.merge_from) as f:
      earlier = json.load(f)
    kept = [k for k in SECTION_KEYS if not set(SECTION_KEYS[k]) & set(sections) and k in earlier]
    result.update({k: earlier[k] for k in kept})
    rows = [
      r for r in earlier.get("anchors") or [] if ANCHOR_SECTION[r["workload"]] not in sections
    ]
    if rows and "anchors" not in kept:  # the anchors of the sections not measured here
      result["anchors"] = rows
      kept.append("anchors: " + ", ".join(r["workload"] for r in rows))
    result["meta"]["kept_from"] = {
      "command": earlier["meta"]["command"],
      "device_kind": earlier["meta"]["device_kind"],
      "keys": kept,
    }
    result["errors"] = {k: v for k, v in earlier.get("errors", {}).items() if k in kept}
  result["meta"]["gpu_sections"] = sections
  errors = result["errors"]
  out = args.out_gpu or default_out()

  def save():  # after each section: a call cut off at its time limit keeps what it measured
    result["meta"]["wall_s"] = time.perf_counter() - start
    write(result, out)

  dense = result["dense"] = speed_workloads.dense_rates(tiny)
  save()
  peaks = result["peaks"] = _guarded("peaks", lambda: anchors.measure_peaks(tiny, dense), errors)
  save()

  def left():
    return budget - (time.perf_counter() - start)

  device_bytes = (2 if cpu else 24) * 2**30
  rounds = 2 if tiny else 50
  anchor_rows = {r["workload"]: r for r in result.get("anchors") or []}

  def anchor(name, **kw):  # an anchor measured whole where the budget allows, with its roofline
    return anchors.measure(
      name,
      anchors.WORKLOADS[name],
      quick=tiny,
      rounds=rounds,
      full=not cpu,
      device_bytes=device_bytes,
      budget_s=left(),
      peaks=peaks,
      **kw,
    )

  # 1. the FEMNIST-sized anchor: the whole run at the platform's defaults, its roofline and a
  # trace of its measured rounds
  if "femnist" in sections:
    keep = os.path.join(args.trace_dir, "femnist_trace.json.gz") if args.trace_dir else None
    row = _guarded(
      "femnist", lambda: anchor("flute_femnist", profile=True, keep_trace=keep), errors
    )
    anchor_rows.pop("flute_femnist", None)
    if row:
      anchor_rows = {"flute_femnist": row, **anchor_rows}
    result["anchors"] = list(anchor_rows.values())
    save()
  # 1b. the same anchor with its wide dense layer factored over the local epoch (experimental.factored)
  if "femnist_factored" in sections:

    def factored():
      with local_folded_step(True), local_factored_dense(True):
        return anchor("flute_femnist")

    row = _guarded("femnist_factored", factored, errors)
    result["factored"] = [dict(row, factored_dense=True)] if row else []
    save()
  # 2. the same rounds under the other ways of running the participants
  if "variants" in sections:
    cohort = anchors.QUICK["clients_per_round"] if tiny else 10
    here = (step_block(), epoch_chunk(participants=cohort))
    result["blocks"] = _guarded(
      "variants",
      lambda: anchors.run_variants(
        [v for v in VARIANTS if v != here],
        quick=tiny,
        rounds=rounds,
        device_bytes=device_bytes,
        peaks=peaks,
        profile=True,
      ),
      errors,
    )
    save()
  # 3. the 64-configuration sweep against one run (and smaller sweeps: how the ratio scales)
  if "sweep" in sections:
    result["sweep"] = []
    for seeds, (backend, size) in itertools.product(
      [2] if tiny else args.sweep_seeds, args.sweep_backend
    ):
      row = _guarded(
        "sweep",
        lambda seeds=seeds, backend=backend, size=size: anchors.measure_sweep(
          "flute_femnist",
          anchors.WORKLOADS["flute_femnist"],
          quick=tiny,
          rounds=2 if tiny else args.sweep_rounds,
          peaks=peaks,
          backend=backend,
          chunk_size=size,
          seeds=seeds,
          **({"lrs": anchors.SWEEP_LRS[:2]} if tiny else {}),
        ),
        errors,
      )
      if row is not None:
        result["sweep"].append(row)
      save()
  # 4. the CNN and the MLP at n = 1000 against their rooflines
  if "roofline" in sections:
    n_cnn = 4 if tiny else 1000
    result["roofline"] = _guarded(
      "roofline",
      lambda: speed_sections.rooflines(
        _section_args(base, roofline_workloads=[("cnn-auto", n_cnn), ("mlp", n_cnn)]),
        dense,
        peaks["bytes_per_s"],
      ),
      errors,
    )
    save()
  # 5. the CIFAR-10 anchor, whole where the budget allows
  if "cifar" in sections:
    row = _guarded("cifar", lambda: anchor("pfl_cifar10"), errors)
    if row:
      anchor_rows["pfl_cifar10"] = row
    result["anchors"] = list(anchor_rows.values())
  _extra_sections(result, sections, base, dense, tiny, errors, save)
  result["meta"]["wall_s"] = time.perf_counter() - start
  result["meta"]["load_after"] = round(os.getloadavg()[0], 2)
  md_path = write(result, out)
  print(markdown(result))
  print(f"wrote {out} and {md_path}")
  return result


def _extra_sections(result, sections, base, dense, tiny, errors, save):
  """The sections of :data:`EXTRA_SECTIONS` that ``sections`` names."""
  n_cnn, n_big = (4, 8) if tiny else (1000, 10_000)
  if "cnn" in sections:
    models = ["cnn-auto"] if tiny else ["cnn-auto", "cnn-lax", "cnn-patches"]
    result["workloads"] = _guarded(
      "cnn",
      lambda: speed_sections.workloads(
        _section_args(base, models=models, client_grid=[n_cnn]), dense
      ),
      errors,
    )
    save()
  if "cnn_bf16" in sections:  # checks conv="auto"'s bf16 choice on this device
    result["cnn_bf16"] = _guarded(
      "cnn_bf16",
      lambda: speed_sections.workloads(
        _section_args(
          base, models=["cnn-lax", "cnn-patches"], client_grid=[n_cnn], precision="bf16"
        ),
        dense,
      ),
      errors,
    )
    save()
  if "mlp_precision" in sections:
    result["precision"] = _guarded(
      "mlp_precision",
      lambda: speed_sections.precisions(
        _section_args(base, models=["mlp"], precision_clients=n_cnn), dense
      ),
      errors,
    )
    save()
  if "cnn_10k" in sections:
    big = _guarded(
      "cnn_10k",
      lambda: speed_sections.workloads(
        _section_args(base, models=["cnn-auto"], client_grid=[n_big]), dense
      ),
      errors,
    )
    if big and big["rows"]:
      result["workloads"] = result.get("workloads") or {"precision": big["precision"], "rows": []}
      result["workloads"]["rows"] += big["rows"]
    result["cnn_10k"] = {
      "num_clients": n_big,
      "completed": bool(big and big["rows"]),
      "error": errors.get("cnn_10k"),
      "updates_per_s": big["rows"][0]["auto"]["updates_per_s"] if big and big["rows"] else None,
    }
    save()


def acceptance(result):
  """The GPU acceptance points read from this run's results."""
  out = []
  for r in (result.get("workloads") or {}).get("rows", []):
    if r["model"].startswith("cnn") and "auto" in r:
      out.append(
        f"{r['model']} n={r['num_clients']}: auto {r['auto']['updates_per_s']:.0f} updates/s, "
        f"{r['auto']['speedup_vs_loop']:.1f}x the per-client loop "
        f"({r['loop']['updates_per_s']:.0f}/s) on the same device (target: 25x)"
      )
  forms = {
    r["model"]: r["auto"]["updates_per_s"]
    for r in (result.get("cnn_bf16") or {}).get("rows", [])
    if "auto" in r
  }
  if {"cnn-lax", "cnn-patches"} <= set(forms):
    faster = max(("lax", "patches"), key=lambda f: forms[f"cnn-{f}"])
    chosen = conv_form(result["meta"]["platform"], "bfloat16")
    out.append(
      f"CNN n={n_of(result, 'cnn_bf16')} bf16: lax {forms['cnn-lax']:.0f}, patches "
      f'{forms["cnn-patches"]:.0f} updates/s; conv="auto" computes bf16 with {chosen} here: '
      + ("the faster form" if chosen == faster else f"NOT the faster form ({faster})")
    )
  for r in (result.get("precision") or {}).get("rows", []):
    if r["precision"] == "bf16":
      f = r["fraction_of_dense"]
      out.append(
        f"MLP n={r['num_clients']} bf16: {100 * f:.0f}% of the measured bf16 dense rate "
        f"(target 30% on GPU): {'PASS' if f >= 0.3 else 'FAIL'}"
      )
  big = result.get("cnn_10k") or {}
  if big:
    rate = big.get("updates_per_s")
    out.append(
      f"CNN n={big['num_clients']}: "
      + (
        f"completed, {rate:.0f} updates/s"
        if big.get("completed")
        else f"did not complete ({big.get('error')})"
      )
    )
  factored = [dict(r, label=", the dense layer factored") for r in result.get("factored") or []]
  for r in (result.get("anchors") or []) + factored:
    whole = (
      f"whole run {r['full_run_s']:.1f} s measured"
      if "full_run_s" in r
      else f"whole run projected {r['projected_run_s']:.1f} s"
    )
    line = (
      f"anchor {r['workload']}{r.get('label', '')}: {r['s_per_round'] * 1e3:.1f} ms / round, "
      f"{whole}"
    )
    if r["workload"] == "flute_femnist":
      took = r.get("full_run_s", r["projected_run_s"])
      line += f" (target <= 10 s: {'PASS' if took <= 10 else 'FAIL'})"
    if "roofline" in r:
      rf = r["roofline"]
      line += (
        f"; roofline {rf['bound_s'] * 1e3:.2f} ms / round ({rf['limited_by']}-bound), "
        f"{100 * rf['share']:.0f}% of it; 1500 rounds at the bound: "
        f"{1500 * rf['bound_s']:.1f} s + compile {r['compile_s']:.1f} s; with no masked "
        f"step at all (the participants' own steps alone): {1500 * own_bound(r):.1f} s + "
        f"compile"
      )
    out.append(line)
  for r in result.get("blocks") or []:
    out.append(
      f"anchor {r['workload']} with the exit test every {r['step_block']} steps, participants "
      f"in chunks of {r.get('epoch_chunk') or 'all'}: {r['s_per_round'] * 1e3:.1f} ms / round"
      + (f" ({r['call']})" if r.get("call") else "")
    )
  femnist = [r for r in result.get("anchors") or [] if r["workload"] == "flute_femnist"]
  if not result.get("sweep") and femnist and "roofline" in femnist[0]:
    r = femnist[0]
    out.append(
      f"sweep of 64 configurations: not measured; by the roofline its round costs at least 64 x "
      f"{own_bound(r) * 1e3:.2f} ms (each configuration's participants' own steps at the copy "
      f"bandwidth) = {64 * own_bound(r) / r['s_per_round']:.1f}x one run's measured round"
    )
  for r in result.get("sweep") or []:
    line = (
      f"sweep of {r['configs']} configurations (backend {r.get('backend', 'auto')}"
      + (f", chunks of {r['chunk_size']}" if r.get("chunk_size") else "")
      + f"), {r['rounds']} rounds measured: {r['ratio_whole']:.1f}x one run whole (compile "
      f"included), {r['ratio_compiled']:.1f}x compiled"
    )
    if "ratio_projected" in r:
      line += (
        f"; the whole workload of {r['projected_rounds']} rounds projected: "
        f"{r['ratio_projected']:.1f}x one run (target <= 3x: "
        f"{'PASS' if r['ratio_projected'] <= 3 else 'FAIL'})"
      )
    if "least_ratio_by_roofline" in r:
      line += f"; the least ratio the roofline allows: {r['least_ratio_by_roofline']:.1f}x"
    out.append(line)
  for r in (result.get("roofline") or {}).get("rows", []):
    line = (
      f"{r['model']} n={r['num_clients']}: {100 * r['share']:.0f}% of its roofline "
      f"({r['limited_by']}-bound, {r['intensity']:.1f} FLOP/byte)"
    )
    if r["model"].startswith("cnn"):
      line += f" (target 40%: {'PASS' if r['share'] >= 0.4 else 'FAIL'})"
    if r.get("factored"):
      f = r["factored"]
      line += (
        f"; with {', '.join(f['layers'])} factored: {f['updates_per_s']:.0f} updates/s, "
        f"{f['speedup']:.2f}x the dense rounds"
      )
    out.append(line)
  for name, err in (result.get("errors") or {}).items():
    # brackets would read as cross-references in the documentation's markdown
    out.append(f"error in {name}: " + err.replace("[", "(").replace("]", ")"))
  return out


def own_bound(row):
  """The roofline of an anchor row's round counting only the participants' own client-steps
  (no masked step): its bound scaled by own / executed client-steps."""
  rf = row["roofline"]
  return rf["bound_s"] * row["useful_client_steps_per_round"] / row["executed_steps_per_round"]


def n_of(result, section):
  rows = (result.get(section) or {}).get("rows", [])
  return rows[0]["num_clients"] if rows else None


def markdown(result):
  meta = result["meta"]
  lines = [
    f"# GPU preset (`{meta['command']}`)",
    "",
    f"Device: **{meta['device_kind']}** ({meta['platform']}), jax {meta['jax']}"
    + (
      " (**tiny sizes**: the CPU test of this entry point, not a measurement)"
      if meta["tiny"]
      else ""
    )
    + f"; wall time of the whole call: {meta.get('wall_s', float('nan')):.0f} s (budget "
    f"{meta['budget_s']:.0f} s); load average before / after: {meta['load_before']} / "
    f"{meta.get('load_after')}.",
    "",
  ]
  lines += [f"- Note: {n}" for n in meta.get("notes", [])]
  lines += ["", "## Acceptance (this run)", ""]
  lines += [f"- {a}" for a in acceptance(result)]
  lines.append("")
  body = speed_report.markdown(
    {
      k: v
      for k, v in result.items()
      if k not in ("anchors", "acceptance", "cnn_bf16", "blocks", "sweep", "peaks", "factored")
    }
  )
  lines += body.split("\n")[4:]  # the speed report's sections, without its title and device line
  if result.get("cnn_bf16"):
    bf16 = speed_report.markdown({"meta": meta, "workloads": result["cnn_bf16"]}).split("\n")[4:]
    lines += ["## The convolution forms in bf16", ""] + bf16[2:]
  if result.get("anchors") or result.get("blocks") or result.get("sweep"):
    anchor_md = anchors.markdown(
      {
        "meta": _anchor_meta(meta),
        "rows": result.get("anchors") or [],
        "peaks": result.get("peaks"),
        "blocks": result.get("blocks") or [],
        "sweep": result.get("sweep") or [],
      }
    )
    lines += ["", "## Anchors"] + anchor_md.split("\n")[5:]
  return "\n".join(lines)


def _anchor_meta(meta):
  return {
    "device_kind": meta["device_kind"],
    "platform": meta["platform"],
    "cpu_count": meta["cpu_count"],
    "jax": meta["jax"],
    "load_before": meta["load_before"],
    "load_after": meta.get("load_after"),
    "command": meta["command"],
  }


def write(result, out):
  result["acceptance"] = acceptance(result)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump(result, f, indent=2, default=float)
  md_path = os.path.splitext(out)[0] + ".md"
  with open(md_path, "w") as f:
    f.write(markdown(result))
  return md_path
