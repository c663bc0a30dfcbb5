"""Scale benchmarks: a vectorized sweep against sequential runs, client-axis sharding over 1, 2 and
4 devices, and federations kept in host memory (100,000 tabular / 10,000 image clients).

Three parts, each measured side by side in one invocation (public API only):

* ``sweep``: 64 configurations (16 learning rates x 4 seeds) of FedAvg on a tabular task
  (softmax regression, 200 rounds) as one ``fd.sweep`` against 64 sequential ``fd.run`` calls
  (the loop a user would write); wall time *including compilation* on both sides.
* ``devices``: round throughput of ``fd.compile_rounds(..., mesh=make_mesh(clients=k))`` for
  k = 1, 2, 4 (on CPU: forced host devices, one subprocess per k since ``XLA_FLAGS`` must be set
  before JAX starts), the same federation and algorithm on every k.
* ``host``: FedAvg with 100 clients per round on 100,000 tabular clients and on 10,000 image
  clients (28x28, the built-in CNN), with the client data memory-mapped from disk
  (:class:`fedjax_dro.data.host.HostFederatedData`) against the same run with the data resident
  on the device; each in its own subprocess so that peak resident memory (``ru_maxrss``) is that
  run's. The final models must be equal.

    python benchmarks/scale.py                 # all parts (~10 min on 2 CPU cores)
    python benchmarks/scale.py --parts sweep   # one part
    python benchmarks/scale.py --parts devices --merge   # re-measure one part, keep the others
    python benchmarks/scale.py --quick         # tiny sizes (smoke test)

Writes ``benchmarks/results/scale.json`` and ``scale.md`` and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _env(devices=1):
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  return env


def _child(args, devices=1):
  """Runs this script as a child (``--child ...``); returns the JSON it prints last."""
  proc = subprocess.run(
    [sys.executable, os.path.abspath(__file__), "--child", *args],
    env=_env(devices),
    capture_output=True,
    text=True,
  )
  if proc.returncode != 0:
    raise RuntimeError(f"child {args} failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _peak_rss_mb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


# ----------------------------------------------------------------------------------------------
# Part 1: sweep vs sequential runs
# ----------------------------------------------------------------------------------------------
def part_sweep(quick: bool):
  import jax
  import numpy as np

  import fedjax_dro as fd
  from fedjax_dro import algorithms, data, models

  ds = data.synthetic_classification(seed=0)
  model = models.softmax_regression(int(np.prod(ds.train.feature_shape)), ds.num_classes)
  alg = algorithms.fedavg(model, clients_per_round=10, local_steps=5, batch_size=16)
  lrs = list(np.geomspace(0.003, 1.0, 4 if quick else 16))
  seeds = [0, 1] if quick else [0, 1, 2, 3]
  rounds = 20 if quick else 200
  t0 = time.perf_counter()
  res = fd.sweep(alg, ds, rounds=rounds, grid={"client_lr": lrs}, seeds=seeds, eval_every=rounds)
  jax.block_until_ready(res.final_state)
  t_sweep = time.perf_counter() - t0
  t0 = time.perf_counter()
  worst = 0.0
  for k, cfg in enumerate(res.configs):
    h = fd.run(alg, ds, rounds=rounds, seed=cfg["seed"], hparams=cfg["hparams"], eval_every=rounds)
    for key, v in h.evaluations[-1]["per_client"].items():
      worst = max(worst, float(np.max(np.abs(np.asarray(v) - res.final_per_client[key][k]))))
  t_seq = time.perf_counter() - t0
  return {
    "configs": len(res.configs),
    "rounds": rounds,
    "sweep_s": t_sweep,
    "sweep_compile_s": res.compile_time,
    "sequential_s": t_seq,
    "speedup": t_seq / t_sweep,
    "max_abs_diff_vs_sequential": worst,
  }


# ----------------------------------------------------------------------------------------------
# Part 2: client-axis sharding over 1, 2, 4 devices
# ----------------------------------------------------------------------------------------------
def child_devices(devices: int, quick: bool):
  import jax
  import numpy as np

  import fedjax_dro as fd
  from fedjax_dro import algorithms, models
  from fedjax_dro.data import from_client_arrays
  from fedjax_dro.engine import make_mesh

  n = 64 if quick else 512
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(32, 784)).astype(np.float32) for _ in range(n)]
  ys = [rng.integers(0, 62, 32).astype(np.int32) for _ in range(n)]
  data = from_client_arrays(xs, ys)
  model = models.mlp((784,), 62, (200, 200))
  alg = algorithms.fedavg(model, local_steps=5, batch_size=16, backend="vmap")
  rounds = 2
  prog = fd.compile_rounds(alg, data, rounds=rounds, mesh=make_mesh(clients=devices))
  timing = prog.time(repeats=2 if quick else 3)
  state, _ = prog()
  w = np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(jax.device_get(state))])
  return {
    "devices": devices,
    "num_clients": n,
    "client_updates_per_s": n / timing.seconds_per_round,
    "seconds_per_round": timing.seconds_per_round,
    "compile_s": prog.compile_time,
    "checksum": float(np.sum(w.astype(np.float64) ** 2)),
    "all_reduce_in_hlo": "all-reduce" in prog.as_text(),
  }


def part_devices(quick: bool):
  rows = [
    _child(["devices", str(k)] + (["--quick"] if quick else []), devices=k) for k in (1, 2, 4)
  ]
  base = rows[0]["client_updates_per_s"]
  for r in rows:
    r["speedup_vs_1_device"] = r["client_updates_per_s"] / base
  return rows


# ----------------------------------------------------------------------------------------------
# Part 3: host-resident federations
# ----------------------------------------------------------------------------------------------
def _write_federation(path: str, kind: str, n: int, m: int):
  """Writes an ``n``-client federation as .npy files chunk by chunk (never all in memory)."""
  import numpy as np

  from fedjax_dro.data.host import FORMAT

  os.makedirs(path, exist_ok=True)
  feature = (20,) if kind == "tabular" else (28, 28)
  classes = 10
  x = np.lib.format.open_memmap(os.path.join(path, "x.npy"), "w+", np.float32, (n, m) + feature)
  y = np.lib.format.open_memmap(os.path.join(path, "y.npy"), "w+", np.int32, (n, m))
  rng = np.random.default_rng(0)
  centers = rng.normal(size=(classes,) + feature).astype(np.float32)
  step = 5000 if kind == "tabular" else 500
  for start in range(0, n, step):
    k = min(step, n - start)
    labels = rng.integers(0, classes, (k, m))
    shift = rng.normal(scale=0.5, size=(k, 1) + feature).astype(np.float32)
    noise = rng.normal(size=(k, m) + feature).astype(np.float32)
    x[start : start + k] = centers[labels] + shift + noise
    y[start : start + k] = labels
  x.flush()
  y.flush()
  nex = rng.integers(m // 2, m + 1, n).astype(np.int32)
  np.save(os.path.join(path, "num_examples.npy"), nex)
  with open(os.path.join(path, "manifest.json"), "w") as f:
    json.dump({"format": FORMAT, "num_clients": n, "max_examples": m}, f)


def child_host(path: str, kind: str, mode: str, rounds: int, out: str):
  import jax
  import numpy as np

  import fedjax_dro as fd
  from fedjax_dro import algorithms, models
  from fedjax_dro.data import FederatedDataset
  from fedjax_dro.data.host import load_npy_dir

  host = load_npy_dir(path)
  train = host if mode == "host" else host.to_device()
  jax.block_until_ready(train.num_examples)
  if kind == "tabular":
    model = models.softmax_regression(20, 10)
  else:
    model = models.cnn((28, 28), 10, features=(8, 16), dense=32)
  alg = algorithms.fedavg(model, clients_per_round=100, local_steps=2, batch_size=16)
  ds = FederatedDataset(train=train, test=None, task="classification", num_classes=10)
  t0 = time.perf_counter()
  # one evaluation at the end (over all clients, in chunks for host data)
  h = fd.run(alg, ds, rounds=rounds, eval_every=rounds)
  wall = time.perf_counter() - t0
  leaves = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(h.final_state.params))]
  np.savez(out, *leaves)
  stats = host.store.stats if mode == "host" else {}
  return {
    "kind": kind,
    "mode": mode,
    "num_clients": host.num_clients,
    "rounds": rounds,
    "wall_s_incl_compile": wall,
    "rounds_per_s": rounds / h.wall_time,
    "peak_rss_mb": _peak_rss_mb(),
    "data_on_disk_mb": (host.store.x.nbytes + host.store.y.nbytes) / 2**20,
    "final_accuracy_mean": h.final["accuracy"]["mean"],
    "prefetch": stats,
  }


def part_host(quick: bool):
  import numpy as np

  rows = []
  sizes = {"tabular": (2000 if quick else 100_000, 32), "image": (200 if quick else 10_000, 16)}
  with tempfile.TemporaryDirectory() as tmp:
    for kind, (n, m) in sizes.items():
      path = os.path.join(tmp, kind)
      _write_federation(path, kind, n, m)
      rounds = 5 if quick else (50 if kind == "tabular" else 10)
      results = {}
      for mode in ("host", "device"):
        out = os.path.join(tmp, f"{kind}-{mode}.npz")
        results[mode] = _child(["host", path, kind, mode, str(rounds), out])
        with np.load(out) as f:
          results[mode]["_params"] = [f[k] for k in sorted(f.files, key=lambda s: int(s[4:]))]
      diff = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(results["host"]["_params"], results["device"]["_params"])
      )
      for mode in ("host", "device"):
        results[mode].pop("_params")
        results[mode]["max_abs_diff_host_vs_device"] = diff
        rows.append(results[mode])
  return rows


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------
def markdown(result) -> str:
  meta = result["meta"]
  lines = [f"Device: {meta['device']} ({meta['cpu_count']} cores), jax {meta['jax']}.", ""]
  if "sweep" in result:
    s = result["sweep"]
    lines += [
      f"**Sweep vs sequential runs** (FedAvg, softmax regression, {s['rounds']} rounds, "
      f"{s['configs']} configurations; wall time including compilation):",
      "",
      f"| one fd.sweep [s] | {s['configs']} sequential fd.run [s] | speed-up | max abs diff |",
      "|---|---|---|---|",
      f"| {s['sweep_s']:.1f} (compile {s['sweep_compile_s']:.1f}) | {s['sequential_s']:.1f} | "
      f"{s['speedup']:.1f}x | {s['max_abs_diff_vs_sequential']:.1e} |",
      "",
    ]
  if "devices" in result:
    rows = result["devices"]
    lines += [
      f"**Client-axis sharding** (FedAvg, MLP 784-200-200-62, {rows[0]['num_clients']} clients, "
      "full participation, 5 local steps of batch 16; forced host devices on CPU):",
      "",
      "| devices | client updates / s | speed-up vs 1 | compile [s] | all-reduce in HLO |",
      "|---|---|---|---|---|",
    ]
    for r in rows:
      lines.append(
        f"| {r['devices']} | {r['client_updates_per_s']:.0f} | {r['speedup_vs_1_device']:.2f}x | "
        f"{r['compile_s']:.1f} | {r['all_reduce_in_hlo']} |"
      )
    lines.append("")
  if "host" in result:
    lines += [
      "**Host-resident federations** (FedAvg, 100 clients per round, data memory-mapped from "
      "disk vs resident on the device; each run in its own process):",
      "",
      "| task | clients | data on disk [MB] | mode | rounds/s | peak RSS [MB] | prefetch hits / "
      "misses | max abs diff host vs device |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["host"]:
      pf = r["prefetch"]
      lines.append(
        f"| {r['kind']} | {r['num_clients']} | {r['data_on_disk_mb']:.0f} | {r['mode']} | "
        f"{r['rounds_per_s']:.1f} | {r['peak_rss_mb']:.0f} | "
        f"{(str(pf.get('hits')) + ' / ' + str(pf.get('misses'))) if pf else '-'} | "
        f"{r['max_abs_diff_host_vs_device']:.1e} |"
      )
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--parts", default="sweep,devices,host")
  parser.add_argument("--out", default=os.path.join(HERE, "results", "scale.json"))
  parser.add_argument("--merge", action="store_true", help="keep the other parts of --out")
  parser.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    kind, *rest = args.child
    if kind == "devices":
      print(json.dumps(child_devices(int(rest[0]), args.quick)))
    else:
      path, task, mode, rounds, out = rest
      print(json.dumps(child_host(path, task, mode, int(rounds), out)))
    return None
  import jax

  result = {
    "meta": {
      "device": str(jax.devices()[0]),
      "platform": jax.default_backend(),
      "cpu_count": os.cpu_count(),
      "jax": jax.__version__,
      "python": platform.python_version(),
      "quick": args.quick,
    }
  }
  if args.merge and os.path.exists(args.out):  # keep the parts this invocation does not measure
    with open(args.out) as f:
      kept = json.load(f)
    result.update({k: v for k, v in kept.items() if k != "meta"})
  parts = args.parts.split(",")
  unknown = set(parts) - {"sweep", "devices", "host"}
  if unknown:
    raise SystemExit(f"unknown --parts {sorted(unknown)}")
  for part in parts:
    t0 = time.perf_counter()
    result[part] = {"sweep": part_sweep, "devices": part_devices, "host": part_host}[part](
      args.quick
    )
    print(f"[scale] {part} done in {time.perf_counter() - t0:.1f}s", flush=True)
  table = markdown(result)
  print(table)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
    f.write(table)
  print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
