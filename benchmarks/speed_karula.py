"""Karula's round against FedAvg's on a small CNN (the target: at most 3x), side by side in one
process, through :func:`fedjax_dro.run`.

Workload: the stand-in of ``fedjax-dro reproduce karula-femnist``: ``--writers`` (default 100)
writers of :func:`fedjax_dro.data.digits_by_writer` (16x16 digits, 40 per writer, 4 style groups;
pixels standardized as in the reproduction); the built-in CNN ``models.cnn((16, 16), 10,
features=(8, 16))`` (dense 128, ~35k parameters), ``conv="patches"`` (``--conv lax`` for the
other form).

* FedAvg: ``local_steps=10`` SGD steps of ``batch_size=32`` (its usual setting), full
  participation, ``client_lr = 0.1``.
* Karula: the SAGA gradient oracle on a ``batch_size=32`` minibatch per client (one gradient per
  client and round), full participation, the dual projection (float32 default tolerance,
  warm-started), ``D`` Karula's OT dissimilarities on pixels + label (the reproduction's
  ``IMAGE_OT_OPTIONS``, computed once), ``eta = 10`` (``eta / n = 0.1`` per client), ``t`` the median of
  ``||theta_i - theta_j||^2 / D_ij`` after a run with inactive constraints (half the pairs
  would violate ``t D`` without the projection); the fraction of pairs with a positive
  multiplier at the end is reported (``active_fraction``).

Both run ``--rounds`` rounds per call, one evaluation at the end, after a warm-up call (its
compile time reported apart); ``--repeats`` calls alternate between the two algorithms and the
figure is the best call (``benchmarks/speed.py`` explains why the best and not the median on a
shared CPU; the medians are recorded too). The projection is timed alone on its own line: the
round's projection problem rebuilt from Karula's state after the warm-up (``theta - eta g``, the
stored table for ``nu``), warm-started from the state's multipliers as in a round, and cold.

    python benchmarks/speed_karula.py --out benchmarks/results/speed_karula.json
    python benchmarks/speed_karula.py --quick --out /tmp/speed_karula.json   # smoke (seconds)

The entry point for ``benchmarks/speed.py`` is :func:`karula_section` (``args`` as parsed by
:func:`parser`); :func:`main` writes the ``.json`` and a ``.md`` beside it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see benchmarks/projection_scaling.py

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import fedjax_dro as fd  # noqa: E402
from fedjax_dro import models  # noqa: E402
from fedjax_dro.algorithms import fedavg, karula  # noqa: E402
from fedjax_dro.algorithms.karula import flatten_clients  # noqa: E402
from fedjax_dro.data.femnist_digits import digits_by_writer
from fedjax_dro.ot import dissimilarity_matrix  # noqa: E402
from fedjax_dro.reproduce.karula_femnist import IMAGE_OT_OPTIONS, standardize_pixels  # noqa: E402
from fedjax_dro.solvers.pairwise import project_pairwise  # noqa: E402

FEDAVG = dict(local_steps=10, batch_size=32)
FEDAVG_HPARAMS = {"client_lr": 0.1}
KARULA_BATCH = 32
ETA_PER_CLIENT = (
  0.1  # eta = 0.1 n: each block moves by 0.1 alpha_i grad f_i (nu_i = alpha_i g_i / n)
)


def parser():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true", help="tiny workload (smoke test, seconds)")
  p.add_argument("--out", default=None, help="write the JSON here (and the .md beside it)")
  p.add_argument("--writers", type=int, default=100, help="clients (writers)")
  p.add_argument("--rounds", type=int, default=10, help="rounds per timed fd.run call")
  p.add_argument("--repeats", type=int, default=3, help="timed calls per algorithm")
  p.add_argument("--conv", choices=("patches", "lax"), default="patches")
  return p


def writers_data(num_writers, side=16, seed=0):
  """``(FederatedDataset, D)``: the reproduction's stand-in
  (:func:`fedjax_dro.data.digits_by_writer`, 40 digits per writer, pixels standardized as in
  ``reproduce karula-femnist``) and Karula's OT dissimilarities on it (pixels + label,
  ``IMAGE_OT_OPTIONS``), computed once outside the timed calls."""
  data = standardize_pixels(digits_by_writer(num_writers, image_size=side, seed=seed))
  train = data.train
  D = np.asarray(dissimilarity_matrix(train.x, train.y, train.mask, **IMAGE_OT_OPTIONS))
  return data, D


def _timed_runs(algs, data, rounds, repeats, params, compiled_before=None):
  """Warm-up call of every ``(alg, hparams)``, then ``repeats`` alternating timed calls.
  ``compiled_before``: ``{name: compile seconds}`` of algorithms whose rounds an earlier call
  compiled (their warm-up reuses the program)."""
  out = {}
  for name, (alg, hp) in algs.items():
    t0 = time.perf_counter()
    hist = fd.run(alg, data, rounds=rounds, eval_every=rounds, hparams=hp, init_params=params)
    out[name] = {
      "warmup_total_s": time.perf_counter() - t0,
      "compile_s": hist.compile_time,
      "calls_s_per_round": [],
      "history": hist,
    }
    if name in (compiled_before or {}):
      out[name]["probe_compile_s"] = compiled_before[name]
  for rep in range(repeats):
    for name, (alg, hp) in algs.items():
      hist = fd.run(
        alg, data, rounds=rounds, eval_every=rounds, hparams=hp, init_params=params, seed=rep + 1
      )
      out[name]["calls_s_per_round"].append(hist.wall_time / rounds)
      out[name]["history"] = hist
  for rec in out.values():
    if rec["compile_s"] == 0.0 and "probe_compile_s" in rec:
      rec["compile_s"] = rec["probe_compile_s"]
    rec["best_s_per_round"] = min(rec["calls_s_per_round"])
    rec["median_s_per_round"] = float(np.median(rec["calls_s_per_round"]))
  return out


def _time(fn, repeats):
  jax.block_until_ready(fn())  # warm-up (compiles)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return min(times), out


def _projection_alone(state, eta, t, tol, repeats, cold=True):
  """The round's projection rebuilt from a Karula state: warm-started (as in a round) and, with
  ``cold``, from zero multipliers."""
  z = jax.tree.map(lambda p, g: p - eta * g, state.params, state.grad_table)
  r = t * state.dissimilarity
  proj = jax.jit(lambda z, r, mu: project_pairwise(z, r, tol=tol, initial_multipliers=mu))
  zero = jnp.zeros_like(state.multipliers)
  rec = {}
  for label, mu in (("warm", state.multipliers), ("cold", zero))[: 2 if cold else 1]:
    fn = lambda: proj(z, r, mu)  # noqa: E731, B023 (called within the iteration)
    s, out = _time(fn, repeats)
    a = float(out.restoration_scale)
    rec[label] = {
      "s": s,
      "iterations": int(out.iterations),
      "converged": bool(out.converged),
      "certified_relative_gap": float(out.dual_residual),
      "violation_before_restoration_rel": max(1.0 / a**2 - 1.0, 0.0),
    }
  return rec


def karula_section(args) -> dict:
  """Karula's round against FedAvg's (see the module docstring); a JSON-ready dict."""
  quick = bool(getattr(args, "quick", False))
  writers = 8 if quick else args.writers
  side = 8 if quick else 16
  rounds = 2 if quick else args.rounds
  repeats = 1 if quick else args.repeats
  features, dense = ((2, 4), 16) if quick else ((8, 16), 128)
  load_start = os.getloadavg()
  data, D = writers_data(writers, side=side)
  model = models.cnn((side, side), 10, features=features, dense=dense, conv=args.conv)
  params = jax.tree.map(lambda a: a.astype(jnp.float32), model.init(jax.random.PRNGKey(0)))
  d = int(sum(a.size for a in jax.tree.leaves(params)))
  eta = ETA_PER_CLIENT * writers
  # t: after a warm-up run without active constraints, half of the pairs would violate t D
  # (the same algorithm object: fd.run reuses its compiled rounds for the timed calls)
  kalg = karula(model, dissimilarity=D, batch_size=KARULA_BATCH)
  probe = fd.run(kalg, data, rounds=rounds, hparams={"eta": eta, "t": 1e6}, init_params=params)
  flat = np.asarray(flatten_clients(probe.final_state.params), np.float64)
  d2 = np.sum((flat[:, None] - flat[None]) ** 2, -1, dtype=np.float64)
  off = ~np.eye(writers, dtype=bool)
  t = float(np.median(d2[off] / D[off]))
  karula_hp = {"eta": eta, "t": t}
  algs = {
    "fedavg": (fedavg(model, **FEDAVG), FEDAVG_HPARAMS),
    "karula": (kalg, karula_hp),
  }
  runs = _timed_runs(algs, data, rounds, repeats, params, {"karula": probe.compile_time})
  state = runs["karula"]["history"].final_state
  tm = runs["karula"]["history"].train_metrics
  tol = max(1e-8, 100 * float(jnp.finfo(jnp.float32).eps))  # Karula's float32 default
  projection = _projection_alone(state, eta, t, tol, max(repeats, 1), cold=not quick)
  mu = np.asarray(state.multipliers)
  fed, kar = runs["fedavg"], runs["karula"]
  result = {
    "device": {
      "platform": jax.default_backend(),
      "device_kind": jax.devices()[0].device_kind,
      "cpu_count": os.cpu_count(),
      "processor": platform.processor() or platform.machine(),
      "load_average_start": load_start,
      "load_average_end": os.getloadavg(),
      "jax": jax.__version__,
      "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
    },
    "workload": {
      "writers": writers,
      "image": [side, side],
      "examples_per_writer": int(np.median(np.asarray(data.train.num_examples))),
      "model": model.name,
      "features": list(features),
      "dense": dense,
      "parameters": d,
      "rounds_per_call": rounds,
      "repeats": repeats,
      "fedavg": {**FEDAVG, **FEDAVG_HPARAMS},
      "karula": {"batch_size": KARULA_BATCH, "projection": "dual", "tol": tol, **karula_hp},
    },
    "fedavg": {k: v for k, v in fed.items() if k != "history"},
    "karula": {k: v for k, v in kar.items() if k != "history"},
    "ratio_best": kar["best_s_per_round"] / fed["best_s_per_round"],
    "ratio_median": kar["median_s_per_round"] / fed["median_s_per_round"],
    "projection": projection,
    "projection_share_of_karula_round": projection["warm"]["s"] / kar["best_s_per_round"],
    "karula_round_metrics": {
      "projection_iterations_mean": float(np.mean(tm["projection_iterations"])),
      "projection_converged_fraction": float(np.mean(tm["projection_converged"])),
      "projection_residual_max": float(np.max(tm["projection_residual"])),
      "constraint_violation_max": float(np.max(tm["constraint_violation"])),
    },
    "active_fraction": float(np.mean(mu[off] > 0)),
    "accuracy_after_timed_call": {
      "fedavg": fed["history"].final["accuracy"]["mean"],
      "karula": kar["history"].final["accuracy"]["mean"],
    },
    "acceptance_ratio_at_most": 3.0,
  }
  result["acceptance_met"] = result["ratio_best"] <= 3.0
  return result


def markdown(res) -> str:
  w, dev, p = res["workload"], res["device"], res["projection"]
  lines = [
    "# Karula's round against FedAvg's (CNN)",
    "",
    f"Device: {dev['platform']} ({dev['device_kind']}, {dev['cpu_count']} cores, "
    f"{dev['processor']}), load average {dev['load_average_start'][0]:.1f} at the start, "
    f"{dev['load_average_end'][0]:.1f} at the end; JAX {dev['jax']}.",
    f"Workload: {w['writers']} writers of {w['image'][0]}x{w['image'][1]} digits "
    f"(~{w['examples_per_writer']} each), {w['model']}, features {tuple(w['features'])}, "
    f"dense {w['dense']}, d = {w['parameters']:,} parameters; {w['rounds_per_call']} rounds per "
    f"fd.run call, best of {w['repeats']} alternating calls after a warm-up.",
    "",
    "| algorithm | s / round (best) | s / round (median) | vs FedAvg (best) | compile [s] |",
    "|---|---|---|---|---|",
  ]
  for name, ratio in (("fedavg", 1.0), ("karula", res["ratio_best"])):
    r = res[name]
    lines.append(
      f"| {name} | {r['best_s_per_round']:.3g} | {r['median_s_per_round']:.3g} | "
      f"{ratio:.2f}x | {r['compile_s']:.1f} |"
    )
  for label, q in p.items():
    lines.append(
      f"| karula projection alone ({label} start: {q['iterations']} it., certified gap "
      f"{q['certified_relative_gap']:.1e}) | {q['s']:.3g} | - | - | - |"
    )
  m = res["karula_round_metrics"]
  lines += [
    "",
    f"Karula/FedAvg: {res['ratio_best']:.2f}x (best), {res['ratio_median']:.2f}x (median); "
    f"acceptance (<= 3x): {'met' if res['acceptance_met'] else 'NOT met'}. The projection is "
    f"{100 * res['projection_share_of_karula_round']:.0f}% of Karula's round; in the timed run "
    f"it took {m['projection_iterations_mean']:.1f} iterations on average (warm start), "
    f"converged in {100 * m['projection_converged_fraction']:.0f}% of the rounds, certified "
    f"relative gap <= {m['projection_residual_max']:.1e}, constraint violation after the step "
    f"{m['constraint_violation_max']:.1e}; {100 * res['active_fraction']:.0f}% of the pairs "
    f"carry a positive multiplier (t = {w['karula']['t']:.3g}, eta = {w['karula']['eta']:.3g}).",
  ]
  return "\n".join(lines) + "\n"


def main(argv=None):
  args = parser().parse_args(argv)
  res = karula_section(args)
  text = markdown(res)
  print(text)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(res, f, indent=1, allow_nan=False)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
      f.write(text)
  return res


if __name__ == "__main__":
  main()
