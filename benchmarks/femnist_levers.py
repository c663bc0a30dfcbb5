"""What moves the FEMNIST-sized FedAvg run's wall time on a GPU: the compilation and the local step.

The FLUTE FEMNIST anchor (``benchmarks/anchors.py``: 3400 clients, 10 a round, one local epoch of
batch 20, a 2-conv CNN of 6.6 M parameters, 1500 rounds) spends its time in two places: compiling
the round program, and the participants' local steps, each of which reads and writes the client's
whole dense layer (a memory-bound step). This script measures the levers on each, side by side in
one call:

* ``compile``: the whole ``fd.run`` in fresh processes, with XLA's defaults, with its kernel
  autotuning off (``--xla_gpu_autotune_level=0``), and with JAX's persistent compilation cache,
  cold and then warm (a researcher's second run of the same program).
* ``run``: the whole ``fd.run`` (``--rounds``, default 1500) with the library's forms of the
  masked local step (``core.ragged.local_folded_step``, ``experimental.factored.local_factored_dense``)
  side by side in one process: select, folded, folded with the dense layer factored, select
  again.
* ``step``: the local epoch of one step-sorted chunk of participants (5 side by side, as the
  library runs them on a GPU), written four ways with the same arithmetic: the vmapped
  ``while_loop`` with each client's own exit test (JAX batches it into a loop whose every step
  selects between the new and the old weights: the select form, the library's wherever
  ``core.ragged.FOLDED_STEP_AUTO`` is off), a loop with one exit test for the chunk and the step masked by ``where``, the same with the step size (0 for a client
  past its steps) multiplied into the update, and with the step size folded into the loss before
  differentiating (``w + grad(-lr * mask * loss)``: the update is the gradient's own product plus
  the weights, which XLA may fuse into one kernel). Each variant's final weights are compared with
  the select form's and with a run of the select form at full float32 precision. A fifth form,
  the folded step with the wide dense layer factored (``experimental.factored``: the layer's kernel
  kept as ``W_0 + A^T G`` over the epoch, ``W_0`` shared by the chunk), and for every form with
  one exit test XLA's cost analysis of one iteration (FLOPs, bytes accessed).

Usage::

    python benchmarks/femnist_levers.py --out results/femnist_levers.json   # a GPU
    python benchmarks/femnist_levers.py --quick --out /tmp/levers.json      # tiny sizes (tests)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

VARIANTS = (
  "select_own_exit",
  "where_shared_exit",
  "scaled_shared_exit",
  "folded_shared_exit",
  "factored_shared_exit",
)


def _child(mode, rounds, quick, cache_dir):
  """One fresh process: the anchor's ``fd.run`` for ``rounds`` rounds, whole and its compile."""
  import anchors

  factored = mode.startswith("factored_")
  mode_kind = mode[len("factored_") :] if factored else mode
  if mode_kind.startswith("enable_compile_cache"):  # the library's call, before anything computes
    import fedjax_dro as fd

    fd.enable_compile_cache(cache_dir + ("_lib_factored" if factored else "_lib"))

  from fedjax_dro.algorithms import fedavg
  from fedjax_dro.core.ragged import local_folded_step
  from fedjax_dro.experimental.factored import local_factored_dense

  spec = anchors.WORKLOADS["flute_femnist"]
  w = anchors.workload(spec, quick, device_bytes=40 << 30)
  with local_folded_step(True) if factored else contextlib.nullcontext():
    with local_factored_dense(True) if factored else contextlib.nullcontext():
      alg = fedavg(w.model, clients_per_round=w.cohort, **w.kw)
      whole_s, hist = anchors._timed_run(alg, w.train, w.eval, rounds, 0, w.params)
  return {
    "mode": mode,
    "rounds": rounds,
    "whole_s": whole_s,
    "compile_s": hist.compile_time,
    "s_per_round_after_compile": (whole_s - hist.compile_time) / rounds,
    "device": str(jax.devices()[0].device_kind),
  }


_NO_TRITON = "--xla_gpu_enable_triton_gemm=false"
_NO_LT = "--xla_gpu_enable_cublaslt=false"
COMPILE_MODES = {
  "default": {},
  "autotune_off": {"XLA_FLAGS": "--xla_gpu_autotune_level=0"},
  "cache_cold": {"JAX_COMPILATION_CACHE_DIR": "{cache}"},
  "cache_warm": {"JAX_COMPILATION_CACHE_DIR": "{cache}"},
  # the dots as cuBLAS calls, not Triton fusions (cuBLAS folds ``w + dot`` into its beta = 1)
  "triton_gemm_off": {"XLA_FLAGS": _NO_TRITON},
  "triton_gemm_off_autotune_off": {"XLA_FLAGS": f"{_NO_TRITON} --xla_gpu_autotune_level=0"},
  # the persistent cache with the legacy cuBLAS path (its warm load is what failed with cuBLASLt)
  "triton_and_cublaslt_off_cache_cold": {
    "XLA_FLAGS": f"{_NO_TRITON} {_NO_LT}",
    "JAX_COMPILATION_CACHE_DIR": "{cache}_nolt",
  },
  "triton_and_cublaslt_off_cache_warm": {
    "XLA_FLAGS": f"{_NO_TRITON} {_NO_LT}",
    "JAX_COMPILATION_CACHE_DIR": "{cache}_nolt",
  },
  # what users call: fd.enable_compile_cache (cuBLASLt off, Triton's fusions kept)
  "enable_compile_cache_cold": {},
  "enable_compile_cache_warm": {},
  # the same with the wide dense layer factored (experimental.factored.local_factored_dense)
  "factored_enable_compile_cache_cold": {},
  "factored_enable_compile_cache_warm": {},
  "factored_default": {},
}


def compile_section(rounds, quick, cache_dir, modes=None):
  """Each mode (all of ``COMPILE_MODES`` by default) in a fresh process (a cache's warm run after
  its cold one)."""
  for suffix in ("", "_nolt", "_lib", "_lib_factored"):  # the cold runs start from empty caches
    shutil.rmtree(cache_dir + suffix, ignore_errors=True)
  rows = []
  for mode in modes or COMPILE_MODES:
    env_extra = COMPILE_MODES[mode]
    env = dict(os.environ)
    for k, v in env_extra.items():
      env[k] = v.format(cache=cache_dir)
      if k == "XLA_FLAGS" and os.environ.get(k):  # the caller's own flags come first
        env[k] = f"{os.environ[k]} {env[k]}"
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    argv = [sys.executable, __file__, "--child", mode, "--rounds", str(rounds)]
    argv += ["--quick"] if quick else []
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    row = {"mode": mode, "process_s": time.perf_counter() - t0}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode == 0 and lines:
      row.update(json.loads(lines[-1]))
    else:
      row["error"] = (done.stderr or done.stdout)[-800:]
    print(json.dumps(row), flush=True)
    rows.append(row)
  return rows


# the run section's forms of the local step, in this order (the select form again last: what
# the order of the calls costs or saves)
RUN_FORMS = ("select", "folded", "factored", "select")


def run_section(quick, rounds):
  """The anchor's whole ``fd.run`` (``rounds`` rounds, compilation included) with the masked
  step's select form, its folded form (``core.ragged.local_folded_step``), the folded form with
  the wide dense layer factored (``experimental.factored.local_factored_dense``), and the select form
  again, in this process."""
  import anchors

  from fedjax_dro.algorithms import fedavg
  from fedjax_dro.core.ragged import local_folded_step
  from fedjax_dro.experimental.factored import local_factored_dense

  spec = anchors.WORKLOADS["flute_femnist"]
  w = anchors.workload(spec, quick, device_bytes=40 << 30)
  rows, finals = [], {}
  for form in RUN_FORMS:
    folded, factored = form != "select", form == "factored"
    with local_folded_step(folded), local_factored_dense(factored):
      alg = fedavg(w.model, clients_per_round=w.cohort, **w.kw)
      whole_s, hist = anchors._timed_run(alg, w.train, w.eval, rounds, 0, w.params)
    finals.setdefault(form, hist.final_state.params)
    row = {
      "form": form,
      "folded_step": folded,
      "factored_dense": factored,
      "rounds": rounds,
      "whole_s": whole_s,
      "compile_s": hist.compile_time,
      "s_per_round": (whole_s - hist.compile_time) / rounds,
    }
    if form != "select":
      row["max_abs_diff_of_final_params"] = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(finals["select"]), jax.tree.leaves(finals[form]))
      )
      row["max_abs_final_param"] = max(
        float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(finals["select"])
      )
    print(json.dumps(row), flush=True)
    rows.append(row)
  return rows


def _chunk(quick):
  """A chunk of 5 participants of the FEMNIST workload (1 to 47 local steps of batch 20)."""
  from fedjax_dro import models

  if quick:
    # dense 64: its 32 x 64 kernel is worth factoring over 6 steps of 4 rows (24 < 42.7)
    image, feats, dense, classes, batch = (8, 8, 1), (4, 8), 64, 62, 4
    steps = np.array([6, 5, 4, 3, 2], np.int32)
  else:
    image, feats, dense, classes, batch = (28, 28, 1), (32, 64), 2048, 62, 20
    steps = np.array([47, 40, 33, 26, 19], np.int32)
  model = models.cnn(image, classes, features=feats, dense=dense)
  c = len(steps)
  rows = int(steps.max()) * batch
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((c, rows) + image, dtype=np.float32))
  y = jnp.asarray(rng.integers(0, classes, (c, rows)).astype(np.int32))
  w0 = model.init(jax.random.PRNGKey(0))
  w = jax.tree.map(lambda a: jnp.broadcast_to(a, (c,) + a.shape).copy(), w0)
  return model, w, x, y, jnp.asarray(steps), batch


def _variants(model, batch, lr):
  def loss_at(p, x, y, j):
    bx = jax.lax.dynamic_slice_in_dim(x, j * batch, batch)
    by = jax.lax.dynamic_slice_in_dim(y, j * batch, batch)
    return jnp.mean(model.loss(model.apply(p, bx), by))

  def sgd(p, x, y, j):
    g = jax.grad(loss_at)(p, x, y, j)
    return jax.tree.map(lambda a, b: a - lr * b, p, g)

  def select(w, x, y, steps):
    def one(p, x, y, s):
      return jax.lax.while_loop(
        lambda st: st[0] < s, lambda st: (st[0] + 1, sgd(st[1], x, y, st[0])), (0, p)
      )[1]

    return jax.vmap(one)(w, x, y, steps)

  def chunk_loop(client_step, start=None, end=None):
    """The chunk's loop of ``client_step(carry, x, y, j, steps)``, one exit test for all;
    ``start(w)`` / ``end(carry)`` map the weights to the loop's carry and back. The returned
    function's ``iteration(carry, x, y, j, steps)`` is one pass of the loop's body."""

    def iteration(c, x, y, j, steps):
      return jax.vmap(client_step, in_axes=(0, 0, 0, None, 0))(c, x, y, j, steps)

    def run(w, x, y, steps):
      top = jnp.max(steps)

      def body(st):
        j, c = st
        return j + 1, iteration(c, x, y, j, steps)

      c = w if start is None else start(w)
      c = jax.lax.while_loop(lambda st: st[0] < top, body, (0, c))[1]
      return c if end is None else end(c)

    run.iteration = iteration
    run.start = start
    return run

  def where_step(p, x, y, j, s):
    new = sgd(p, x, y, j)
    return jax.tree.map(lambda a, b: jnp.where(j < s, a, b), new, p)

  def scaled_step(p, x, y, j, s):
    g = jax.grad(loss_at)(p, x, y, j)
    c = jnp.where(j < s, lr, 0.0)
    return jax.tree.map(lambda a, b: a - c * b, p, g)

  def folded_step(p, x, y, j, s):
    c = jnp.where(j < s, -lr, 0.0)
    g = jax.grad(lambda q: c * loss_at(q, x, y, j))(p)
    return jax.tree.map(lambda a, b: a + b, p, g)

  def factored_loop(start, rows):
    """The library's factored step (``experimental.factored``): the chunk's wide dense layers as
    ``W_0 + A^T G`` over ``rows`` (its largest count of steps times the batch), every client
    starting from the model ``start`` (as in a round)."""
    from fedjax_dro.experimental.factored import (
      chosen_layers,
      factored_end,
      factored_start,
      factored_step,
    )

    layers = chosen_layers(model, rows)
    objective = lambda out, by, m: jnp.mean(model.loss(out, by))  # noqa: E731
    step = factored_step(model, layers, start, lr, objective)

    def client_step(c, x, y, j, s):
      bx = jax.lax.dynamic_slice_in_dim(x, j * batch, batch)
      by = jax.lax.dynamic_slice_in_dim(y, j * batch, batch)
      return step(j, j < s, c, bx, by, None)[0]

    return chunk_loop(
      client_step,
      start=jax.vmap(lambda p: factored_start(p, layers, rows)),
      end=jax.vmap(lambda c: factored_end(c, layers, start)),
    )

  def factored(w, x, y, steps):
    return factored_loop(jax.tree.map(lambda a: a[0], w), x.shape[1])(w, x, y, steps)

  factored.loop_for = factored_loop

  return {
    "select_own_exit": select,
    "where_shared_exit": chunk_loop(where_step),
    "scaled_shared_exit": chunk_loop(scaled_step),
    "folded_shared_exit": chunk_loop(folded_step),
    "factored_shared_exit": factored,
  }


def _iteration_cost(fn, w, x, y, steps):
  """XLA's cost analysis (FLOPs, bytes accessed) of one pass of ``fn``'s loop body, all the
  chunk's participants side by side (None for a loop without one exit test)."""
  if hasattr(fn, "loop_for"):
    fn = fn.loop_for(jax.tree.map(lambda a: a[0], w), x.shape[1])
  if not hasattr(fn, "iteration"):
    return None, None
  carry = w if fn.start is None else fn.start(w)
  lowered = jax.jit(fn.iteration).lower(carry, x, y, jnp.int32(1), steps)
  cost = lowered.compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def _count_ops(hlo: str):
  lines = hlo.splitlines()
  return {
    "fusions": sum(1 for ln in lines if " fusion(" in ln and "=" in ln),
    "custom_calls": sum(1 for ln in lines if "custom-call(" in ln),
  }


def step_section(quick, repeats, hlo_dir=None):
  model, w, x, y, steps, batch = _chunk(quick)
  lr = 0.05
  rows, finals = [], {}
  # the oracle: the select form with every product at full float32 precision (no TF32)
  with jax.default_matmul_precision("highest"):
    exact = jax.block_until_ready(
      jax.jit(_variants(model, batch, lr)["select_own_exit"])(w, x, y, steps)
    )
  for name, fn in _variants(model, batch, lr).items():
    jitted = jax.jit(fn)
    t0 = time.perf_counter()
    compiled = jitted.lower(w, x, y, steps).compile()
    compile_s = time.perf_counter() - t0
    hlo = compiled.as_text() or ""
    if hlo_dir:
      with open(os.path.join(hlo_dir, f"hlo_{name}.txt"), "w") as f:
        f.write(hlo)
    out = jax.block_until_ready(compiled(w, x, y, steps))
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(compiled(w, x, y, steps))
      times.append(time.perf_counter() - t0)
    finals[name] = out
    iters = int(steps.max())
    flops, nbytes = _iteration_cost(fn, w, x, y, steps)
    row = {
      "variant": name,
      "compile_s": compile_s,
      "best_s": min(times),
      "ms_per_iteration": 1e3 * min(times) / iters,
      "iterations": iters,
      "participants": int(steps.shape[0]),
      "iteration_flops": flops,
      "iteration_bytes": nbytes,
      **_count_ops(hlo),
    }
    ref = finals["select_own_exit"]
    row["max_abs_diff_vs_select"] = float(
      max(jnp.max(jnp.abs(a - b)) for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)))
    )
    row["max_abs_diff_vs_full_precision"] = float(
      max(jnp.max(jnp.abs(a - b)) for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(exact)))
    )
    print(json.dumps(row), flush=True)
    rows.append(row)
  return rows


def _ratio(a, b):
  return f"{a / b:.2f}x" if a and b else "-"


def markdown(result) -> str:
  """The results as the published tables (ratios against the select form, the defaults)."""
  out = [
    "# What moves the FEMNIST-sized FedAvg run's wall time",
    "",
    f"Device: **{result['device']}** ({result['platform']}), jax {result['jax']}; command: "
    f"`python benchmarks/femnist_levers.py {' '.join(result['argv'])}`"
    + (" (tiny sizes: a test, not a measurement)" if result["quick"] else ""),
    "",
  ]
  out += [f"- Note: {n}" for n in result.get("notes", [])] + ([""] if result.get("notes") else [])
  step = result.get("step") or []
  if step:
    base = step[0]["ms_per_iteration"]
    out += [
      f"## The local epoch of one chunk of {step[0]['participants']} participants "
      f"({step[0]['iterations']} loop iterations)",
      "",
      "| form of the step | ms / iteration | against the select form | kernels (fusions, "
      "library calls) | one iteration, XLA's cost analysis: GFLOP, MB accessed | "
      "max abs difference of the final weights from the select form's | "
      "from the select form's at full float32 precision |",
      "|---|---|---|---|---|---|---|",
    ]
    for r in step:
      cost = (
        f"{r['iteration_flops'] / 1e9:.2f}, {r['iteration_bytes'] / 1e6:.0f}"
        if r.get("iteration_bytes")
        else "-"
      )
      out.append(
        f"| {r['variant']} | {r['ms_per_iteration']:.3f} | {_ratio(r['ms_per_iteration'], base)} "
        f"| {r['fusions']}, {r['custom_calls']} | {cost} | {r['max_abs_diff_vs_select']:.2g} | "
        + (
          f"{r['max_abs_diff_vs_full_precision']:.2g} |"
          if "max_abs_diff_vs_full_precision" in r
          else "- |"
        )
      )
    out.append("")
  comp = result.get("compile") or []
  if comp:
    out += [
      "## The whole `fd.run`, each in a fresh process",
      "",
      "| XLA / JAX setting | rounds | whole s | of which compiling s | ms / round after it | "
      "1500 rounds projected s |",
      "|---|---|---|---|---|---|",
    ]
    for r in comp:
      if "error" in r:
        last = r["error"].strip().splitlines()[-1][:160]
        out.append(f"| {r['mode']} | - | - | - | - | failed: `{last}` |")
        continue
      proj = r["compile_s"] + 1500 * r["s_per_round_after_compile"]
      out.append(
        f"| {r['mode']} | {r['rounds']} | {r['whole_s']:.1f} | {r['compile_s']:.1f} | "
        f"{1e3 * r['s_per_round_after_compile']:.1f} | {proj:.1f} |"
      )
    out.append("")
  run = result.get("run") or []
  if run:
    base = run[0]
    out += [
      "## The whole `fd.run`, the forms of the local step side by side",
      "",
      "| masked step | rounds | whole s | of which compiling s | ms / round after it | "
      "whole against the first select run |",
      "|---|---|---|---|---|---|",
    ]
    names = {
      "select": "select",
      "folded": "folded (`w + grad(-lr * active * loss)`)",
      "factored": "folded, dense layer factored (`W_0 + A^T G`)",
    }
    for r in run:
      form = names[r.get("form") or ("folded" if r["folded_step"] else "select")]
      out.append(
        f"| {form} | {r['rounds']} | {r['whole_s']:.1f} | {r['compile_s']:.1f} | "
        f"{1e3 * r['s_per_round']:.2f} | {_ratio(r['whole_s'], base['whole_s'])} |"
      )
    for r in run:
      if "max_abs_diff_of_final_params" in r:
        form = r.get("form", "folded")
        out += [
          "",
          f"Final model of the {form} form against the select form's: max abs difference "
          f"{r['max_abs_diff_of_final_params']:.2g} (largest parameter "
          f"{r['max_abs_final_param']:.2g}).",
        ]
    out.append("")
  return "\n".join(out)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=os.path.join(HERE, "results", "femnist_levers.json"))
  p.add_argument("--quick", action="store_true", help="tiny sizes (a test on a CPU)")
  p.add_argument("--rounds", type=int, default=None, help="rounds of each compile-section run")
  p.add_argument("--sections", default="step,run,compile")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--hlo-dir", default=None, help="write each step variant's optimized HLO here")
  p.add_argument("--cache-dir", default="/tmp/fedjax_dro_levers_cache")
  p.add_argument(
    "--modes",
    default=None,
    help=f"compile-section modes, comma-separated: {', '.join(COMPILE_MODES)}",
  )
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  rounds = args.rounds or (2 if args.quick else 1500)
  modes = args.modes.split(",") if args.modes else None
  unknown = sorted(set(modes or ()) - set(COMPILE_MODES))
  if unknown:
    p.error(f"--modes: unknown {unknown}; expected some of {sorted(COMPILE_MODES)}")
  if args.child:
    print(json.dumps(_child(args.child, rounds, args.quick, args.cache_dir)), flush=True)
    return
  result = {
    "device": str(jax.devices()[0].device_kind),
    "platform": jax.default_backend(),
    "jax": jax.__version__,
    "quick": args.quick,
    "argv": sys.argv[1:] if argv is None else list(argv),
  }
  for section in args.sections.split(","):
    if section == "step":
      result["step"] = step_section(args.quick, args.repeats, args.hlo_dir)
    elif section == "run":
      result["run"] = run_section(args.quick, rounds)
    elif section == "compile":
      result["compile"] = compile_section(rounds, args.quick, args.cache_dir, modes)
    else:
      p.error(f"unknown section {section!r}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
      f.write(markdown(result))


if __name__ == "__main__":
  main()
