"""Whole-run wall time of two published federated workloads, beside the published figures.

* ``flute_femnist``: FLUTE's FedAvg on FEMNIST: a 2-conv CNN, 3400 clients, 10 per round, batch
  20, 1 local epoch, 1500 rounds. FLUTE's README: 8 min 22 s on 4 GPUs (FLUTE), 5 h 50 min for
  FedML on the same task.
* ``pfl_cifar10``: pfl-research's CIFAR-10 benchmark: a simple CNN, cohort 50, 50 points per user
  (1000 users), batch 10, 1 local epoch, 1500 central iterations, one A100: the setting in which
  pfl-research reports being 7-72x faster than other open-source frameworks.

On generated data of the same shapes and client-size distributions: FEMNIST-like clients of
28x28x1 images, 62 classes, sizes drawn from a lognormal of mean 226 (sigma 0.5: a heavy right
tail, the largest of 3400 clients around 1,000 examples; LEAF's FEMNIST has a mean of about 226);
CIFAR-like users of exactly 50 32x32x3 images, 10 classes. Pixels are one generated pool of
``max_examples`` images shared by every client (3400 clients padded to the largest would be
~10 GB of float32 pixels; the speed of a round does not depend on the pixel values), labels are
drawn per client. Federations over ``--device-bytes`` of pixels stay on the host
(``fedjax_dro.data.host``: only the sampled clients' rows go to the device each round), smaller
ones are device-resident.

Models: ``models.cnn`` with its default ``conv="auto"``: FEMNIST, convolutions 32/64 and a 2048
dense layer (LEAF's FEMNIST CNN layout, with 3x3 kernels where LEAF has 5x5); CIFAR-10,
convolutions 32/64 and a 128 dense layer (a simple CNN; pfl's own layer sizes are not restated
here).

Local work: one local epoch of batch B (``local_epochs=1``; each participant's loop stops at its
own ceil(size / B) steps); ``--local-work steps`` runs ``local_steps = ceil(mean examples / B)``
minibatches drawn with replacement instead (12 for FEMNIST, 5 for CIFAR-10). The results say which.

Timing, through :func:`fedjax_dro.run` (the user path): a first run of ``--rounds`` rounds
(compiles the rounds and the evaluation: ``first_run_s``), then the same run with another seed
(the compiled programs are reused: ``s_per_round`` = its wall time / rounds, one evaluation
included). On an accelerator, ``--full`` runs the whole workload (1500 rounds) after that and
reports its wall time, compilation included; otherwise the whole run is projected as
``compile + 1500 x s_per_round`` and labelled a projection.

    python benchmarks/anchors.py                 # both workloads, measured rounds + projection
    python benchmarks/anchors.py --full          # the whole runs (meant for a GPU)
    python benchmarks/anchors.py --quick         # tiny sizes (smoke test, seconds)

Writes ``benchmarks/results/anchors.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.algorithms import fedavg
from fedjax_dro.data import FederatedData
from fedjax_dro.data.host import HostFederatedData, HostStore

HERE = os.path.dirname(os.path.abspath(__file__))

WORKLOADS = {
  "flute_femnist": {
    "title": "FLUTE FEMNIST (FedAvg, 2-conv CNN)",
    "num_clients": 3400,
    "clients_per_round": 10,
    "batch_size": 20,
    "local_epochs": 1,
    "rounds": 1500,
    "image": (28, 28, 1),
    "classes": 62,
    "features": (32, 64),
    "dense": 2048,
    "sizes": {"kind": "lognormal", "mean": 226.0, "sigma": 0.5},
    "published": [
      {"framework": "FLUTE", "wall_s": 8 * 60 + 22, "hardware": "4 GPUs", "source": "FLUTE README"},
      {
        "framework": "FedML",
        "wall_s": 5 * 3600 + 50 * 60,
        "hardware": "the hardware of FLUTE's comparison",
        "source": "FLUTE README",
      },
    ],
  },
  "pfl_cifar10": {
    "title": "pfl-research CIFAR-10 (FedAvg, simple CNN)",
    "num_clients": 1000,
    "clients_per_round": 50,
    "batch_size": 10,
    "local_epochs": 1,
    "rounds": 1500,
    "image": (32, 32, 3),
    "classes": 10,
    "features": (32, 64),
    "dense": 128,
    "sizes": {"kind": "fixed", "mean": 50.0},
    "published": [
      {
        "framework": "pfl-research",
        "wall_s": None,
        "hardware": "one A100",
        "source": "pfl-research: 7-72x faster than other open-source frameworks in this setting",
      }
    ],
  },
}

# The tiny stand-ins of --quick: the same code path in seconds on a CPU.
QUICK = {  # 8x8 images (28x28 / 32x32 scaled down), 2 rounds
  "num_clients": 12,
  "clients_per_round": 3,
  "features": (4, 8),
  "dense": 16,
  "mean": 12.0,
}


def client_sizes(spec, num_clients, rng):
  """Examples per client: a lognormal of the given mean (its median ``mean * exp(-sigma^2 / 2)``)
  rounded and at least 1, or a fixed size."""
  sizes = spec["sizes"]
  if sizes["kind"] == "fixed":
    return np.full(num_clients, int(sizes["mean"]), np.int32)
  sigma = sizes["sigma"]
  mu = math.log(sizes["mean"]) - sigma**2 / 2
  return np.maximum(1, np.rint(rng.lognormal(mu, sigma, num_clients))).astype(np.int32)


def federation(spec, num_clients, image, device_bytes, seed=0):
  """``(train, eval_data, sizes, where)``: ``num_clients`` clients of the spec's sizes, one shared
  pool of generated pixels, labels per client; ``eval_data`` is one example per client."""
  rng = np.random.default_rng(seed)
  sizes = client_sizes(spec, num_clients, rng)
  m = int(sizes.max())
  pool = rng.standard_normal((m,) + image, dtype=np.float32)
  x = np.broadcast_to(pool, (num_clients, m) + image)
  y = rng.integers(0, spec["classes"], (num_clients, m)).astype(np.int32)
  pixel_bytes = num_clients * m * pool[0].nbytes
  if pixel_bytes > device_bytes:
    train, where = HostFederatedData(HostStore(x, y, sizes), jnp.asarray(sizes)), "host"
  else:
    mask = np.arange(m)[None, :] < sizes[:, None]
    train = FederatedData(
      x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.asarray(mask), num_examples=jnp.asarray(sizes)
    )
    where = "device"
  eval_data = FederatedData(
    x=jnp.asarray(np.broadcast_to(pool[:1], (num_clients, 1) + image)),
    y=jnp.asarray(y[:, :1]),
    mask=jnp.ones((num_clients, 1), bool),
    num_examples=jnp.ones((num_clients,), jnp.int32),
  )
  return train, eval_data, sizes, where


def local_work(spec, mean_examples, form="auto"):
  """The factory's local-work arguments and how they are described: ``form="epochs"``: one local
  epoch (``local_epochs``); ``"steps"``: ``ceil(mean examples / batch)`` steps; ``"auto"``: epochs
  where fedavg accepts ``local_epochs``, else steps."""
  if form not in ("auto", "epochs", "steps"):
    raise ValueError(f"local work must be 'auto', 'epochs' or 'steps', got {form!r}")
  accepted = "local_epochs" in inspect.signature(fedavg).parameters
  if form == "epochs" or (form == "auto" and accepted):
    kw = {"local_epochs": spec["local_epochs"], "batch_size": spec["batch_size"]}
    return kw, f"local_epochs={spec['local_epochs']}, batch {spec['batch_size']}"
  steps = math.ceil(mean_examples / spec["batch_size"])
  kw = {"local_steps": steps, "batch_size": spec["batch_size"]}
  why = "chosen with --local-work steps" if accepted else "fedavg has no local_epochs yet"
  return kw, (
    f"local_steps={steps} = ceil({mean_examples:g} / {spec['batch_size']}) minibatches drawn "
    f"with replacement ({why})"
  )


def _timed_run(alg, train, eval_data, rounds, seed, params):
  t0 = time.perf_counter()
  hist = fd.run(
    alg,
    train,
    rounds=rounds,
    seed=seed,
    eval_data=eval_data,
    eval_every=rounds,
    hparams={"client_lr": 0.05},
    init_params=params,
  )
  return time.perf_counter() - t0, hist


def measure(name, spec, *, quick, rounds, full, device_bytes, budget_s=None, work="auto"):
  """One workload's row: the measured rounds, the projection (or the whole run) and the
  published figures."""
  start = time.perf_counter()
  num_clients = QUICK["num_clients"] if quick else spec["num_clients"]
  cohort = QUICK["clients_per_round"] if quick else spec["clients_per_round"]
  image = (8, 8, spec["image"][2]) if quick else spec["image"]
  spec_used = dict(spec)
  if quick:
    spec_used["sizes"] = dict(spec["sizes"], mean=QUICK["mean"])
  t0 = time.perf_counter()
  train, eval_data, sizes, where = federation(spec_used, num_clients, image, device_bytes)
  data_s = time.perf_counter() - t0
  model = models.cnn(
    image,
    spec["classes"],
    features=QUICK["features"] if quick else spec["features"],
    dense=QUICK["dense"] if quick else spec["dense"],
  )
  params = model.init(jax.random.PRNGKey(0))
  kw, work = local_work(spec_used, float(spec_used["sizes"]["mean"]), work)
  alg = fedavg(model, clients_per_round=cohort, **kw)
  first_s, first = _timed_run(alg, train, eval_data, rounds, 0, params)
  again_s, again = _timed_run(alg, train, eval_data, rounds, 1, params)
  s_per_round = again.wall_time / rounds
  total_rounds = spec["rounds"]
  compile_s = first.compile_time
  row = {
    "workload": name,
    "title": spec["title"],
    "quick": quick,
    "num_clients": num_clients,
    "clients_per_round": cohort,
    "batch_size": spec["batch_size"],
    "local_work": work,
    "local_kwargs": kw,
    "rounds_full": total_rounds,
    "image": list(image),
    "classes": spec["classes"],
    "model": model.name,
    "examples_per_client": {
      "mean": float(sizes.mean()),
      "median": float(np.median(sizes)),
      "p99": float(np.percentile(sizes, 99)),
      "max": int(sizes.max()),
      "total": int(sizes.sum()),
    },
    "data_on": where,
    "data_build_s": data_s,
    "rounds_measured": rounds,
    "first_run_s": first_s,
    "compile_s": compile_s,
    "second_run_s": again_s,
    "second_run_compile_s": again.compile_time,
    "s_per_round": s_per_round,
    "projected_run_s": compile_s + total_rounds * s_per_round,
    "published": spec["published"],
  }
  if full:
    remaining = None if budget_s is None else budget_s - (time.perf_counter() - start)
    if remaining is None or row["projected_run_s"] < remaining:
      full_s, hist = _timed_run(alg, train, eval_data, total_rounds, 2, params)
      row["full_run_s"] = full_s
      row["full_run_compile_s"] = hist.compile_time
    else:
      row["full_run_skipped"] = (
        f"projected {row['projected_run_s']:.0f} s > the {remaining:.0f} s left of the budget"
      )
  if isinstance(train, HostFederatedData):
    row["host_store_stats"] = dict(train.store.stats)
    train.store.close()
  print(json.dumps({k: v for k, v in row.items() if k != "published"}), flush=True)
  return row


def _fmt_s(s):
  if s is None:
    return "-"
  if s >= 3600:
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
  if s >= 60:
    return f"{int(s // 60)} min {s % 60:.0f} s"
  return f"{s:.1f} s"


def markdown(result):
  meta = result["meta"]
  lines = [
    "# Published anchors: whole runs (`benchmarks/anchors.py`)",
    "",
    f"Device: **{meta['device_kind']}** ({meta['platform']}, {meta['cpu_count']} CPU cores), "
    f"jax {meta['jax']}; load average before / after: {meta['load_before']} / "
    f"{meta['load_after']}. Command: `{meta['command']}`.",
    "",
    "Generated data of the workloads' shapes and client-size distributions, run through "
    "`fd.run`. 'measured' = the wall time of `rounds` rounds after a first run that compiled "
    "them; the whole run is measured where the table says so, otherwise projected as "
    "compile + rounds x s/round (**a projection, not a measurement**).",
    "",
    "| workload | clients (per round) | examples / client: mean, max | local work | data | "
    "measured rounds | s / round | compile s | whole run (1500 rounds) | published |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    e = r["examples_per_client"]
    if "full_run_s" in r:
      whole = f"**{_fmt_s(r['full_run_s'])}** measured"
    else:
      whole = f"{_fmt_s(r['projected_run_s'])} (projection)"
    published = "; ".join(
      f"{p['framework']}: {_fmt_s(p['wall_s'])} on {p['hardware']}"
      if p["wall_s"] is not None
      else f"{p['framework']} on {p['hardware']}: no wall time restated ({p['source']})"
      for p in r["published"]
    )
    lines.append(
      f"| {r['title']}{' (quick sizes)' if r['quick'] else ''} | {r['num_clients']} "
      f"({r['clients_per_round']}) | {e['mean']:.0f}, {e['max']} | {r['local_work']} | "
      f"{r['data_on']} | {r['rounds_measured']} | {r['s_per_round']:.3f} | "
      f"{r['compile_s']:.1f} | {whole} | {published} |"
    )
  lines += ["", "Ratios against the published whole runs (ours / theirs; below 1 is faster):", ""]
  for r in result["rows"]:
    ours = r.get("full_run_s", r["projected_run_s"])
    kind = "measured" if "full_run_s" in r else "projected"
    for p in r["published"]:
      if p["wall_s"]:
        lines.append(
          f"- {r['title']}: {kind} {_fmt_s(ours)} on {meta['device_kind']} / {p['framework']} "
          f"{_fmt_s(p['wall_s'])} on {p['hardware']} = {ours / p['wall_s']:.3g}"
        )
  lines.append("")
  return "\n".join(lines)


def run_all(
  *,
  quick=False,
  rounds=None,
  full=False,
  device_bytes=None,
  budget_s=None,
  workloads=tuple(WORKLOADS),
  work="auto",
):
  """The workloads' rows (``quick``: tiny sizes, 2 rounds). ``budget_s``: seconds for all of
  them; a whole run (``full``) that its projection says would not fit in what is left is
  skipped, and says so."""
  cpu = jax.default_backend() == "cpu"
  if device_bytes is None:
    device_bytes = (2 if cpu else 24) * 2**30
  if rounds is None:
    rounds = 2 if quick else (5 if cpu else 50)
  start = time.perf_counter()
  rows = []
  for name in workloads:
    left = None if budget_s is None else budget_s - (time.perf_counter() - start)
    rows.append(
      measure(
        name,
        WORKLOADS[name],
        quick=quick,
        rounds=rounds,
        full=full,
        device_bytes=device_bytes,
        budget_s=left,
        work=work,
      )
    )
  return rows


def meta(argv, load_before):
  device = jax.devices()[0]
  return {
    "platform": jax.default_backend(),
    "device_kind": getattr(device, "device_kind", str(device)),
    "cpu_count": os.cpu_count(),
    "machine": platform.machine(),
    "python": sys.version.split()[0],
    "jax": jax.__version__,
    "command": "python benchmarks/anchors.py " + " ".join(argv),
    "load_before": round(load_before, 2),
    "load_after": round(os.getloadavg()[0], 2),
    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
  }


def write(result, out):
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump(result, f, indent=2)
  md = os.path.splitext(out)[0] + ".md"
  with open(md, "w") as f:
    f.write(markdown(result))
  return md


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
  parser.add_argument("--full", action="store_true", help="also run the whole 1500 rounds")
  parser.add_argument("--rounds", type=int, default=None, help="rounds measured (default 5 CPU)")
  parser.add_argument("--workloads", default=",".join(WORKLOADS))
  parser.add_argument(
    "--device-bytes",
    type=float,
    default=None,
    help="pixels above this many bytes stay on the host (default 2 GiB on CPU, 24 GiB else)",
  )
  parser.add_argument(
    "--local-work",
    choices=("auto", "epochs", "steps"),
    default="auto",
    help="one local epoch (local_epochs=1), ceil(mean examples / batch) local steps, or 'auto': "
    "epochs where fedavg accepts local_epochs",
  )
  parser.add_argument("--out", default=os.path.join(HERE, "results", "anchors.json"))
  args = parser.parse_args(argv)
  names = [w for w in args.workloads.split(",") if w]
  for w in names:
    if w not in WORKLOADS:
      parser.error(f"unknown workload {w!r}; choose from {tuple(WORKLOADS)}")
  if args.rounds is not None and args.rounds < 1:
    parser.error("--rounds must be >= 1")
  load_before = os.getloadavg()[0]
  rows = run_all(
    quick=args.quick,
    rounds=args.rounds,
    full=args.full,
    device_bytes=args.device_bytes,
    workloads=names,
    work=args.local_work,
  )
  result = {"meta": meta(argv, load_before), "rows": rows}
  md = write(result, args.out)
  print(markdown(result))
  print(f"wrote {args.out} and {md}")
  return result


if __name__ == "__main__":
  main()
