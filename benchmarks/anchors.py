"""Whole-run wall time of eight published federated workloads, beside the published figures.

The workloads (their table, generated client sizes and models: ``anchor_workloads.py``), all
FedAvg with one local epoch of SGD:

* ``flute_femnist``: FLUTE's FEMNIST: a 2-conv CNN, 3400 clients, 10 per round, batch 20, 1500
  rounds. FLUTE's README: 8 min 22 s on 4 GPUs (FLUTE), 5 h 50 min for FedML.
* ``pfl_cifar10``: pfl-research's CIFAR-10 benchmark: a simple CNN, cohort 50, 50 points per user
  (1000 users), batch 10, 1500 central iterations, one A100: the setting in which pfl-research
  reports being 7-72x faster than other open-source frameworks.
* ``flute_lr_mnist``: FLUTE's LR_MNIST: logistic regression 784 -> 10, 1000 clients, 10 per
  round, batch 10, 100 rounds: FLUTE 1:35, FedML 3:09, Flower 1.0 30:14 (CPU).
* ``flute_resnet_fedcifar100``: FLUTE's RESNET_FEDCIFAR100: ResNet-18 with GroupNorm and the CIFAR
  stem, 500 clients of 100 images, 10 per round, batch 20, 4000 rounds: FLUTE 1:42:01, FedML
  15:55:36.
* ``flute_rnn_fedshakespeare``: FLUTE's RNN_FEDSHAKESPEARE: a 2-layer character LSTM (embedding
  8, LSTM 256 x2, sequences of 80), 715 clients, 10 per round, batch 4, 1200 rounds: FLUTE 21:50,
  FedML 6:46:21.
* ``pfl_stackoverflow``: pfl-research's StackOverflow: a transformer (width 96, 8 heads,
  feed-forward 1536, 3 layers, dropout 0.1, vocabulary 10,000, length 20), cohort 400, at most 64
  sentences a user, batch 16, 2000 rounds; no wall time restated.
* ``fedjax_emnist_conv``: FedJAX's EMNIST_CONV: FedJAX's EMNIST CNN, 3400 clients, 10 per round,
  batch 10, 1500 rounds: "a few minutes" on a TPU.
* ``fedjax_stackoverflow_word``: FedJAX's STACKOVERFLOW_WORD: the word LSTM (embedding 96, LSTM
  670, vocabulary 10,000 + 4, sequences of 30), 50 per round, at most 500 steps, batch 16, 1500
  rounds: "roughly an hour" on a TPU. The Stack Overflow federations are 4000 generated users
  (342,477 in the real data).

On generated data of the same shapes and client-size distributions (nothing is downloaded):
images, or integer token sequences whose labels are the next tokens. The examples are one
generated pool of ``max_examples`` shared by every client (3400 FEMNIST clients padded to the
largest would be ~10 GB of float32 pixels; the speed of a round does not depend on the values),
image labels are drawn per client. Federations over ``--device-bytes`` of examples stay on the
host (``fedjax_dro.data.host``: only the sampled clients' rows go to the device each round),
smaller ones are device-resident.

Models of the two CNN workloads: ``models.cnn`` with its default ``conv="auto"``: FEMNIST,
convolutions 32/64 and a 2048 dense layer (LEAF's FEMNIST CNN layout, with 3x3 kernels where
LEAF has 5x5); CIFAR-10, convolutions 32/64 and a 128 dense layer (a simple CNN; pfl's own layer
sizes are not restated here). The others: ``anchor_workloads.WORKLOADS[name]["model_text"]``.

Local work: one local epoch of batch B (``local_epochs=1``; each participant's loop stops at its
own ceil(size / B) steps); ``--local-work steps`` runs ``local_steps = ceil(mean examples / B)``
minibatches drawn with replacement instead (12 for FEMNIST, 5 for CIFAR-10). The results say which.

Timing, through :func:`fedjax_dro.run` (the user path): a first run of ``--rounds`` rounds
(compiles the rounds and the evaluation: ``first_run_s``), then the same run with another seed
(the compiled programs are reused: ``s_per_round`` = its wall time / rounds, one evaluation
included). On an accelerator, ``--full`` runs the whole workload (its rounds) after that and
reports its wall time, compilation included; otherwise the whole run is projected as
``compile + rounds x s_per_round`` and labelled a projection.

    python benchmarks/anchors.py                 # every workload, measured rounds + projection
    python benchmarks/anchors.py --rounds 2 --workloads flute_lr_mnist,fedjax_emnist_conv --merge
    python benchmarks/anchors.py --full          # the whole runs (meant for a GPU)
    python benchmarks/anchors.py --quick         # tiny sizes (smoke test, seconds)
    python benchmarks/anchors.py --full --factored-dense   # the dense layer kept factored

Writes ``benchmarks/results/anchors.{json,md}`` (``--out``; ``--merge`` keeps the file's rows of
the workloads not measured in this call, and says which run measured them). Over 600 lines: the
workloads' runs, their rooflines, traces and variants, the sweep against one run and their
report are one script, as the GPU preset calls them.
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
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import fedjax_dro as fd
from fedjax_dro.algorithms import fedavg
from fedjax_dro.core.ragged import (
  epoch_chunk,
  local_epoch_chunk,
  local_folded_step,
  local_step_block,
  step_block,
)
from fedjax_dro.data import FederatedData
from fedjax_dro.data.host import HostFederatedData, HostStore
from fedjax_dro.engine.prepare import derive_keys
from fedjax_dro.engine.programs import predicted_participants
from fedjax_dro.experimental.factored import local_factored_dense

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from speedlib import (
  roofline,  # noqa: E402
  trace as speed_trace,  # noqa: E402
)

HERE = os.path.dirname(os.path.abspath(__file__))

from anchor_workloads import (  # noqa: E402
  QUICK,
  WORKLOADS,
  build_model,
  client_sizes,
  example_shape,
  vocab,
)


def federation(spec, num_clients, example, device_bytes, seed=0, tokens=None):
  """``(train, eval_data, sizes, where)``: ``num_clients`` clients of the spec's sizes, one shared
  pool of generated examples of shape ``example``: images with labels drawn per client, or
  (``tokens``: a vocabulary size) integer sequences in ``[1, tokens)`` whose labels are the next
  tokens (``y [m, T]``, no padding); ``eval_data`` is one example per client."""
  rng = np.random.default_rng(seed)
  sizes = client_sizes(spec, num_clients, rng)
  m = int(sizes.max())
  if tokens:
    seq = rng.integers(1, tokens, (m, example[0] + 1)).astype(np.int32)
    pool, ypool = seq[:, :-1], seq[:, 1:]
    y = np.broadcast_to(ypool, (num_clients,) + ypool.shape)
  else:
    pool = rng.standard_normal((m,) + tuple(example), dtype=np.float32)
    y = rng.integers(0, spec["classes"], (num_clients, m)).astype(np.int32)
  x = np.broadcast_to(pool, (num_clients,) + pool.shape)
  data_bytes = num_clients * m * (pool[0].nbytes + (pool[0].nbytes if tokens else 0))
  if data_bytes > device_bytes:
    train, where = HostFederatedData(HostStore(x, y, sizes), jnp.asarray(sizes)), "host"
  else:
    mask = np.arange(m)[None, :] < sizes[:, None]
    # the examples broadcast on the device (the same values as x, without ~10 GB through the host)
    dev_x = jnp.broadcast_to(jnp.asarray(pool), x.shape)
    dev_y = jnp.broadcast_to(jnp.asarray(ypool), y.shape) if tokens else jnp.asarray(y)
    train = FederatedData(x=dev_x, y=dev_y, mask=jnp.asarray(mask), num_examples=jnp.asarray(sizes))
    where = "device"
  eval_data = FederatedData(
    x=jnp.asarray(np.broadcast_to(pool[:1], (num_clients, 1) + pool.shape[1:])),
    y=jnp.asarray(np.ascontiguousarray(y[:, :1])),
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


def _timed_run(alg, train, eval_data, rounds, seed, params, lr=0.05):
  """``(seconds, history)`` of one ``fd.run`` (``params`` None: initialized from the seed)."""
  t0 = time.perf_counter()
  hist = fd.run(
    alg,
    train,
    rounds=rounds,
    seed=seed,
    eval_data=eval_data,
    eval_every=rounds,
    hparams={"client_lr": lr},
    init_params=params,
  )
  return time.perf_counter() - t0, hist


class Workload(NamedTuple):
  """A workload built at its sizes (or the quick ones): federation, model and local work."""

  num_clients: int
  cohort: int
  image: tuple
  train: Any
  eval: Any
  sizes: np.ndarray
  where: str
  model: Any
  params: Any
  kw: dict
  work: str


def workload(spec, quick, device_bytes, work="auto") -> Workload:
  """The federation of ``spec`` (quick: :data:`QUICK` sizes on the spec's tiny examples), its
  model, the model's initial parameters and the factory's local-work arguments."""
  num_clients = QUICK["num_clients"] if quick else spec["num_clients"]
  cohort = QUICK["clients_per_round"] if quick else spec["clients_per_round"]
  example = example_shape(spec, quick)
  spec_used = dict(spec)
  if quick:
    spec_used["sizes"] = dict(spec["sizes"], mean=QUICK["mean"])
  train, eval_data, sizes, where = federation(
    spec_used, num_clients, example, device_bytes, tokens=vocab(spec, quick)
  )
  model = build_model(spec, example, quick)
  params = model.init(jax.random.PRNGKey(0))
  # capped sizes: the mean of the generated ones (the cap lowers it), else the distribution's
  mean = float(sizes.mean()) if "cap" in spec["sizes"] else float(spec_used["sizes"]["mean"])
  kw, described = local_work(spec_used, mean, work)
  return Workload(
    num_clients, cohort, example, train, eval_data, sizes, where, model, params, kw, described
  )


def executed_steps(alg, sizes, kw, seed, rounds, block, chunk=None):
  """``(executed, useful)`` local client-steps per round, averaged over rounds ``0 .. rounds -
  1`` of ``seed``: ``executed`` = the steps the participants run side by side (each group runs
  until its largest is done, in whole blocks of ``block`` steps, the others masked), counted
  per participant; ``useful`` = the sum of the participants' own steps (``local_steps``, or
  ``local_epochs * ceil(size / batch)``). ``chunk``: the participants sorted by their steps in
  groups of ``chunk`` (``core.ragged.local_epoch_chunk``; None: one group)."""
  run_key = derive_keys(seed)[2]
  idx = predicted_participants(alg, len(sizes), run_key, range(rounds))
  s = idx.shape[1]
  if "local_epochs" in kw:
    own = kw["local_epochs"] * -(-np.asarray(sizes)[idx] // kw["batch_size"])
  else:
    own = np.full(idx.shape, kw["local_steps"])
    block = 1
  ranked = np.sort(own, axis=1)
  size = s if chunk is None or "local_epochs" not in kw else min(chunk, s)
  executed = np.zeros(idx.shape[0])
  for start in range(0, s, size):
    group = ranked[:, start : start + size]
    executed += group.shape[1] * (-(-group.max(axis=1) // block) * block)
  return float(executed.mean()), float(own.sum(axis=1).mean())


def sweep_executed_steps(alg, sizes, kw, seeds, rounds, block, cohort, chunk=1):
  """Local client-steps executed per configuration and round of an ``fd.sweep`` over ``seeds``
  (every grid point of a seed samples the same participants) with the ``map`` (``chunk`` 1) or
  ``chunked`` backend: each configuration's participants in step-sorted order
  (``core.participants.ClientPlan.arranged``), groups of ``chunk`` consecutive ranks, the
  configurations' ``j``-th groups side by side until the largest of them is done, in whole
  blocks of ``block`` steps; averaged over rounds ``0 .. rounds - 1``."""
  if "local_epochs" not in kw:
    return float(cohort * kw["local_steps"])
  own = []
  for seed in seeds:
    idx = predicted_participants(alg, len(sizes), derive_keys(seed)[2], range(rounds))
    own.append(np.sort(kw["local_epochs"] * -(-np.asarray(sizes)[idx] // kw["batch_size"]), 1))
  own = np.stack(own)  # [seeds, rounds, participants], each row ascending
  executed = np.zeros(own.shape[1])
  for start in range(0, own.shape[2], chunk):
    group = own[:, :, start : start + chunk]
    executed += group.shape[2] * (-(-group.max(axis=(0, 2)) // block) * block)
  return float(executed.mean())


def round_roofline(model, params, train, cohort, batch, executed, peaks, s_per_round):
  """The roofline of a round of ``executed`` local client-steps: one step of the ``cohort``
  participants side by side (``roofline.cohort_step_cost``: its FLOPs and bytes) divided by
  ``cohort`` is a client-step's work; on the measured ``peaks`` (``{"flops_per_s",
  "bytes_per_s"}``), against the measured seconds per round."""
  x = jnp.asarray(np.asarray(train.x[:cohort, :batch]))
  y = jnp.asarray(np.asarray(train.y[:cohort, :batch]))
  cost = roofline.cohort_step_cost(model, params, x, y, batch)
  per_client_step = {k: cost[k] / cohort for k in ("flops", "bytes")}
  row = roofline.roofline_row(
    per_client_step, executed, peaks["flops_per_s"], peaks["bytes_per_s"], s_per_round
  )
  return {"step_cost": cost, "client_step": per_client_step, "executed_steps": executed, **row}


def measure(
  name,
  spec,
  *,
  quick,
  rounds,
  full,
  device_bytes,
  budget_s=None,
  work="auto",
  peaks=None,
  profile=False,
  keep_trace=None,
):
  """One workload's row: the measured rounds, the projection (or the whole run) and the
  published figures; with ``peaks`` (``{"flops_per_s", "bytes_per_s"}``) the round's roofline
  (``roofline``), with ``profile`` a trace of the measured rounds (``trace``: kernels, copies
  and device busy time, per executed local step)."""
  start = time.perf_counter()
  t0 = time.perf_counter()
  w = workload(spec, quick, device_bytes, work)
  data_s = time.perf_counter() - t0
  num_clients, cohort, image, train, eval_data = w.num_clients, w.cohort, w.image, w.train, w.eval
  sizes, where, model, params, kw, work = w.sizes, w.where, w.model, w.params, w.kw, w.work
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
    "classes": spec.get("classes"),
    "vocab": vocab(spec, quick),
    "model": model.name,
    "model_text": spec.get("model_text", model.name),
    "note": spec.get("note"),
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
    "step_block": step_block(),
    "epoch_chunk": epoch_chunk(participants=cohort) if cohort < num_clients else None,
  }
  block = step_block() if "local_epochs" in kw else 1
  row["executed_steps_per_round"], row["useful_client_steps_per_round"] = executed_steps(
    alg, sizes, kw, 1, rounds, block, row["epoch_chunk"]
  )
  if peaks is not None:
    row["roofline"] = round_roofline(
      model,
      params,
      train,
      cohort,
      spec["batch_size"],
      row["executed_steps_per_round"],
      peaks,
      s_per_round,
    )
  if profile:
    try:
      _, summary = speed_trace.traced(
        lambda: _timed_run(alg, train, eval_data, rounds, 1, params)[1].final_state,
        keep_trace=keep_trace,
      )
    except Exception as e:  # a profiler that cannot run here is a result, not a lost row
      summary = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    row["trace"] = {**summary, **speed_trace.per_round(summary, rounds), "rounds": rounds}
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


SWEEP_LRS = (0.0125, 0.025, 0.05, 0.1)  # 4 client learning rates x 16 seeds = 64 configurations
SWEEP_SEEDS = 16


def measure_sweep(
  name,
  spec,
  *,
  quick,
  rounds,
  peaks=None,
  lrs=SWEEP_LRS,
  seeds=SWEEP_SEEDS,
  backend="auto",
  chunk_size=None,
):
  """The workload as one ``fd.sweep`` over ``len(lrs) x seeds`` configurations against one
  ``fd.run`` of it, both over ``rounds`` rounds, side by side in this process: each timed whole
  on its first call (compilation included) and again on a second call (its compiled program
  reused), the federation on the device. With ``peaks``: the roofline of one configuration's
  round and of the sweep's (``configs`` times that work). ``backend``: the participants'
  backend (of the sweep and the run alike)."""
  w = workload(spec, quick, float("inf"), "auto")  # the federation on the device
  num_clients, cohort, train, eval_data = w.num_clients, w.cohort, w.train, w.eval
  sizes, where, model, params, kw, work = w.sizes, w.where, w.model, w.params, w.kw, w.work
  grid = {"client_lr": [float(v) for v in lrs]}
  seed_list = list(range(seeds))
  configs = len(lrs) * seeds

  def one_run(seed, alg):
    return _timed_run(alg, train, eval_data, rounds, seed, None, float(lrs[len(lrs) // 2]))[0]

  def one_sweep(alg):
    t0 = time.perf_counter()
    res = fd.sweep(
      alg, train, rounds=rounds, grid=grid, seeds=seed_list, eval_data=eval_data, eval_every=rounds
    )
    return time.perf_counter() - t0, res  # its results are fetched to the host: finished

  alg = fedavg(model, clients_per_round=cohort, backend=backend, chunk_size=chunk_size, **kw)
  run_whole = one_run(0, alg)
  run_again = one_run(1, alg)
  salg = fedavg(model, clients_per_round=cohort, backend=backend, chunk_size=chunk_size, **kw)
  sweep_whole, first = one_sweep(salg)
  sweep_again, again = one_sweep(salg)
  row = {
    "workload": name,
    "title": spec["title"],
    "quick": quick,
    "num_clients": num_clients,
    "clients_per_round": cohort,
    "local_work": work,
    "rounds": rounds,
    "configs": configs,
    "grid": grid,
    "seeds": seeds,
    "backend": backend,
    "chunk_size": chunk_size,
    "data_on": where,
    "run_whole_s": run_whole,
    "run_compiled_s": run_again,
    "sweep_whole_s": sweep_whole,
    "sweep_compiled_s": sweep_again,
    "ratio_whole": sweep_whole / run_whole,
    "ratio_compiled": sweep_again / run_again,
    "sweep_compile_s": first.compile_time,
    "sweep_second_compile_s": again.compile_time,
    "diverged": int(np.sum(again.diverged)),
  }
  # the whole workload (the spec's rounds), projected from the measured calls: what the first
  # call spent beyond the second (compilation), plus the rounds at the compiled program's rate
  row["projected_rounds"] = spec["rounds"]
  row["run_projected_s"] = run_whole - run_again + spec["rounds"] * run_again / rounds
  row["sweep_projected_s"] = sweep_whole - sweep_again + spec["rounds"] * sweep_again / rounds
  row["ratio_projected"] = row["sweep_projected_s"] / row["run_projected_s"]
  if peaks is not None:
    block = step_block() if "local_epochs" in kw else 1
    # the participants' groups: step-sorted chunks (auto on a GPU, map, chunked) or one group
    chunk = {"map": 1, "chunked": chunk_size, "vmap": cohort}.get(backend)
    if backend == "auto":
      chunk = epoch_chunk(participants=cohort) if cohort < num_clients else cohort
    executed, useful = executed_steps(alg, sizes, kw, 1, rounds, block, chunk)
    one = round_roofline(
      model, params, train, cohort, spec["batch_size"], executed, peaks, run_again / rounds
    )
    row["roofline_run"] = one
    row["useful_client_steps_per_round"] = useful
    row["sweep_executed_steps_per_config"] = sweep_executed_steps(
      salg, sizes, kw, seed_list, rounds, block, cohort, chunk if chunk < cohort else cohort
    )
    # the sweep: every configuration's participants' own steps (a lower bound of its work)
    row["roofline_sweep"] = {
      **roofline.bound(
        one["client_step"]["flops"] * useful * configs,
        one["client_step"]["bytes"] * useful * configs,
        peaks["flops_per_s"],
        peaks["bytes_per_s"],
      ),
      "measured_s": sweep_again / rounds,
    }
    row["roofline_sweep"]["share"] = roofline.share(
      row["roofline_sweep"]["bound_s"], sweep_again / rounds
    )
    # what the sweep's bound allows against one run as measured: the least ratio possible
    row["least_ratio_by_roofline"] = row["roofline_sweep"]["bound_s"] / (run_again / rounds)
  print(json.dumps({k: v for k, v in row.items() if not k.startswith("roofline")}), flush=True)
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
    f"{meta['load_after']}. Command: `{meta['command']}`."
    + (
      " Every run with the folded local step and the wide dense layer factored (`experimental.factored`)."
      if meta.get("factored_dense")
      else ""
    ),
    "",
    *_kept_lines(meta),
    "Generated data of the workloads' shapes and client-size distributions, run through "
    "`fd.run`. 'measured' = the wall time of `rounds` rounds after a first run that compiled "
    "them; the whole run is measured where the table says so, otherwise projected as "
    "compile + rounds x s/round (**a projection, not a measurement**).",
    "",
    "| workload | clients (per round) | examples / client: mean, max | local work | data | "
    "measured rounds | s / round | compile s | whole run (the workload's rounds) | published |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    e = r["examples_per_client"]
    if "full_run_s" in r:
      whole = f"{r['rounds_full']}: **{_fmt_s(r['full_run_s'])}** measured"
    else:
      whole = f"{r['rounds_full']}: {_fmt_s(r['projected_run_s'])} (projection)"
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
    kind = "measured" if "full_run_s" in r else "projection"
    for p in r["published"]:
      if p["wall_s"]:
        lines.append(
          f"- {r['title']}: {kind} {_fmt_s(ours)} on {meta['device_kind']} / {p['framework']} "
          f"{_fmt_s(p['wall_s'])} on {p['hardware']} = {ours / p['wall_s']:.3g}"
        )
  lines += ["", "Models and generated data:", ""]
  for r in result["rows"]:
    note = f"; {r['note']}" if r.get("note") else ""
    lines.append(f"- {r['title']}: {r.get('model_text', r['model'])}{note}.")
  lines.append("")
  lines += roofline_markdown(result)
  return "\n".join(lines)


def _kept_lines(meta):
  """The lines saying which rows earlier runs measured (``--merge``), one a run."""
  return [
    line
    for k in meta.get("kept_from") or []
    for line in (
      f"Rows kept from an earlier run (`--merge`): {', '.join(k['workloads'])}, measured by "
      f"`{k['command']}` on {k['device_kind']}, jax {k['jax']}, {k['date']} (load average "
      f"{k['load_before']} / {k['load_after']}).",
      "",
    )
  ]


def _roofline_cells(r):
  """``bound ms (limited by), % of the bound`` of a row's roofline."""
  return (
    f"{r['bound_s'] * 1e3:.2f} ({r['limited_by']}; {r['intensity']:.0f} FLOP/B, ridge "
    f"{r['ridge']:.0f})",
    f"{100 * r['share']:.0f}%",
  )


def _chunk_cell(r):
  """The participants' chunking of a row: its sorted chunk size, or 'no' (the backend's plan)."""
  c = r.get("epoch_chunk")
  return "no (one group)" if c is None or c >= r["clients_per_round"] else str(c)


def roofline_markdown(result):
  """The markdown of the rooflines, the loop-block variants, the traces and the sweep."""
  lines = []
  peaks = result.get("peaks")
  rows = [r for r in result.get("rows", []) + result.get("blocks", []) if "roofline" in r]
  if peaks and rows:
    lines += [
      "## Rounds against the roofline",
      "",
      f"Peaks measured in this process: dense {peaks['precision']} "
      f"{peaks['flops_per_s'] / 1e12:.2f} TFLOP/s, copy bandwidth "
      f"{peaks['bytes_per_s'] / 1e9:.0f} GB/s. A round's bound = the client-steps it executes "
      "(participants side by side run until the largest of their group is done, in whole "
      "blocks of the loop's exit test; sorted by step count into chunks where the table says "
      "so) x the work of one client-step (one step of the cohort side by side, divided by its "
      "size) (FLOPs counted by the CPU compiler, bytes by "
      "the device's cost analysis of the loop-free step program; sampling and aggregation left "
      "out: a lower bound).",
      "",
      "| workload | exit test every k steps | participants sorted, in chunks of | client-steps "
      "executed / round (participants' own) | MFLOP / client-step | MB / client-step | "
      "ms / round | bound ms (limited by) | % of the bound |",
      "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
      rf = r["roofline"]
      bound_cell, share_cell = _roofline_cells(rf)
      lines.append(
        f"| {r['title']}{' (quick sizes)' if r['quick'] else ''} | {r['step_block']} | "
        f"{_chunk_cell(r)} | "
        f"{r['executed_steps_per_round']:.1f} ({r['useful_client_steps_per_round']:.1f}) | "
        f"{rf['client_step']['flops'] / 1e6:.0f} | {rf['client_step']['bytes'] / 1e6:.1f} | "
        f"{r['s_per_round'] * 1e3:.2f} | {bound_cell} | {share_cell} |"
      )
    lines.append("")
  traced = [r for r in result.get("rows", []) + result.get("blocks", []) if "trace" in r]
  if traced:
    lines += [
      "## What the device executed (jax.profiler trace of the measured rounds)",
      "",
      "| workload | exit test every k steps | participants sorted, in chunks of | kernels / round | "
      "kernel ms / round | device-to-host copies / round | device busy over the traced span |",
      "|---|---|---|---|---|---|---|",
    ]
    for r in traced:
      t = r["trace"]
      head = f"| {r['title']} | {r['step_block']} | {_chunk_cell(r)} |"
      if t.get("error"):
        lines.append(f"{head} - | - | - | {t['error'][:80]} |")
        continue
      if not t.get("device_events"):
        lines.append(f"{head} - | - | - | no device streams in the trace (CPU) |")
        continue
      lines.append(
        f"{head} {t['kernels_per_round']:.0f} | {t['kernel_ms_per_round']:.2f} | "
        f"{t['d2h_per_round']:.1f} | {100 * t['busy_share']:.0f}% |"
      )
    lines.append("")
    for r in traced:
      if r["trace"].get("top"):
        lines += [
          f"Top kernels, {r['title']} (exit test every {r['step_block']} steps, chunks: "
          f"{_chunk_cell(r)}): "
          + "; ".join(f"`{n[:60]}` x{c} {us / 1e3:.1f} ms" for n, c, us in r["trace"]["top"][:6]),
          "",
        ]
  for r in result.get("sweep", []) or []:
    lines += [
      "## A sweep of the workload against one run",
      "",
      f"{r['title']}{' (quick sizes)' if r['quick'] else ''}: `fd.sweep` over {r['configs']} "
      f"configurations ({len(r['grid']['client_lr'])} client learning rates x {r['seeds']} "
      f"seeds) against one `fd.run`, {r['rounds']} rounds each, federation on the {r['data_on']}, "
      f"backend `{r.get('backend', 'auto')}`"
      + (f" (chunks of {r['chunk_size']})" if r.get("chunk_size") else "")
      + ".",
      "",
      "| | one run | the sweep | sweep / run |",
      "|---|---|---|---|",
      f"| whole call, compilation included | {_fmt_s(r['run_whole_s'])} | "
      f"{_fmt_s(r['sweep_whole_s'])} | {r['ratio_whole']:.2f}x |",
      f"| second call (compiled program reused) | {_fmt_s(r['run_compiled_s'])} | "
      f"{_fmt_s(r['sweep_compiled_s'])} | {r['ratio_compiled']:.2f}x |",
    ]
    if "ratio_projected" in r:
      lines.append(
        f"| the whole workload, {r['projected_rounds']} rounds (projected: the first call's "
        f"excess over the second + the rounds at the second's rate) | "
        f"{_fmt_s(r['run_projected_s'])} | {_fmt_s(r['sweep_projected_s'])} | "
        f"{r['ratio_projected']:.2f}x |"
      )
    lines += [
      "",
    ]
    if "roofline_sweep" in r:
      one, sw = r["roofline_run"], r["roofline_sweep"]
      lines += [
        f"Roofline (the sweep's bound counts each configuration's participants' own steps): one "
        f"configuration's round is bounded at {one['bound_s'] * 1e3:.2f} ms "
        f"({one['limited_by']}-bound; measured {one['measured_s'] * 1e3:.2f} ms, "
        f"{100 * one['share']:.0f}% of it); the sweep's round, {r['configs']} times that work, "
        f"at {sw['bound_s'] * 1e3:.1f} ms (measured {sw['measured_s'] * 1e3:.1f} ms, "
        f"{100 * sw['share']:.0f}% of it). The least sweep / run ratio the device's peaks allow "
        f"against the run as measured: {r['least_ratio_by_roofline']:.1f}x.",
        "",
      ]
    if "sweep_executed_steps_per_config" in r:
      lines += [
        f"Client-steps per configuration and round: {r['useful_client_steps_per_round']:.1f} "
        f"the participants' own; {r['roofline_run']['executed_steps']:.1f} executed by the run; "
        f"{r['sweep_executed_steps_per_config']:.1f} executed by the sweep (its configurations' "
        f"step-sorted participants side by side, each slot until the largest is done).",
        "",
      ]
  return lines


def run_all(
  *,
  quick=False,
  rounds=None,
  full=False,
  device_bytes=None,
  budget_s=None,
  workloads=tuple(WORKLOADS),
  work="auto",
  peaks=None,
  profile=False,
):
  """The workloads' rows (``quick``: tiny sizes, 2 rounds). ``budget_s``: seconds for all of
  them; a whole run (``full``) that its projection says would not fit in what is left is
  skipped, and says so. ``peaks``: the device's rates (:func:`measure_peaks`), for the rounds'
  rooflines; ``profile``: a trace of each workload's measured rounds."""
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
        peaks=peaks,
        profile=profile,
      )
    )
  return rows


def measure_peaks(quick=False, dense=None):
  """The device's peak rates for the rooflines: the dense-matmul rate of the default precision
  policy (``dense``, else measured by ``speed_workloads.dense_rates``) and the copy bandwidth
  (``roofline.copy_bandwidth``)."""
  from speedlib import workloads as speed_workloads

  from fedjax_dro.core.precision import default_precision

  precision = default_precision()
  dense = dense or speed_workloads.dense_rates(quick)
  key = precision if precision in dense else "float32"
  copy = roofline.copy_bandwidth(quick)
  return {
    "precision": key,
    "flops_per_s": dense[key]["flops_per_s"],
    "bytes_per_s": copy["bytes_per_s"],
    "dense": dense,
    "copy": copy,
  }


def run_variants(
  variants, *, quick=False, rounds=None, device_bytes=None, peaks=None, profile=False
):
  """The FEMNIST workload's measured rounds under each ``(k, c)`` of ``variants`` side by side:
  the epoch loop's exit tested every ``k`` local steps (``core.ragged.local_step_block``) and the
  participants sorted by step count in chunks of ``c`` (``core.ragged.local_epoch_chunk``; None:
  the backend's plan, unsorted)."""
  rows = []
  for k, c in variants:
    with local_step_block(int(k)), local_epoch_chunk(None if c is None else int(c)):
      rows += run_all(
        quick=quick,
        rounds=rounds,
        device_bytes=device_bytes,
        workloads=("flute_femnist",),
        peaks=peaks,
        profile=profile,
      )
  return rows


def run_blocks(blocks, **kw):
  """:func:`run_variants` of the exit-test blocks ``blocks`` (the platform's chunks)."""
  cohort = QUICK["clients_per_round"] if kw.get("quick") else 10
  return run_variants([(k, epoch_chunk(participants=cohort)) for k in blocks], **kw)


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


def merge_earlier(result, path):
  """``result`` with the rows of ``path`` (an earlier run's JSON) whose workloads this call did
  not measure, in the table's order, and where those rows came from (``meta["kept_from"]``: one
  entry a run, the earlier file's own kept rows under the runs that measured them)."""
  if not os.path.exists(path):
    return result
  with open(path) as f:
    earlier = json.load(f)
  measured = {r["workload"] for r in result["rows"]}
  kept = [r for r in earlier.get("rows", []) if r["workload"] not in measured]
  if not kept:
    return result
  order = list(WORKLOADS)
  rank = lambda r: order.index(r["workload"]) if r["workload"] in order else len(order)
  result["rows"] = sorted(result["rows"] + kept, key=rank)
  em = earlier.get("meta", {})
  names = [r["workload"] for r in kept]
  entries, claimed = [], set()
  for e in em.get("kept_from") or []:  # rows the earlier file itself kept: their own runs
    ws = [w for w in e["workloads"] if w in names]
    if ws:
      entries.append(dict(e, workloads=ws))
      claimed.update(ws)
  fields = ("command", "date", "jax", "device_kind", "load_before", "load_after")
  own = [w for w in names if w not in claimed]
  if own:
    entries.append({"workloads": own, **{k: em.get(k) for k in fields}})
  result["meta"]["kept_from"] = entries
  return result


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
  parser.add_argument("--full", action="store_true", help="also run the whole workloads")
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
  parser.add_argument(
    "--roofline", action="store_true", help="measure the device's peaks; each round's roofline"
  )
  parser.add_argument("--profile", action="store_true", help="trace the measured rounds")
  parser.add_argument(
    "--blocks",
    default="",
    help="comma-separated k: also the FEMNIST rounds with the epoch loop's exit tested every k "
    "local steps (core.ragged.local_step_block)",
  )
  parser.add_argument(
    "--sweep", action="store_true", help="also the FEMNIST workload as a 64-configuration sweep"
  )
  parser.add_argument("--sweep-rounds", type=int, default=None, help="rounds of the sweep anchor")
  parser.add_argument(
    "--factored-dense",
    action="store_true",
    help="every run with the folded local step and wide dense layers kept factored "
    "(core.ragged.local_folded_step, experimental.factored.local_factored_dense)",
  )
  parser.add_argument(
    "--merge",
    action="store_true",
    help="keep the rows of --out's workloads not measured in this call (their command noted)",
  )
  parser.add_argument("--out", default=os.path.join(HERE, "results", "anchors.json"))
  args = parser.parse_args(argv)
  if args.factored_dense:
    with local_folded_step(True), local_factored_dense(True):
      return _main(parser, args, argv)
  return _main(parser, args, argv)


def _main(parser, args, argv):
  names = [w for w in args.workloads.split(",") if w]
  for w in names:
    if w not in WORKLOADS:
      parser.error(f"unknown workload {w!r}; choose from {tuple(WORKLOADS)}")
  if args.rounds is not None and args.rounds < 1:
    parser.error("--rounds must be >= 1")
  try:
    blocks = [int(k) for k in args.blocks.split(",") if k]
  except ValueError:
    parser.error(f"--blocks must be comma-separated positive integers, got {args.blocks!r}")
  if any(k < 1 for k in blocks):
    parser.error(f"--blocks must be comma-separated positive integers, got {args.blocks!r}")
  if args.sweep_rounds is not None and args.sweep_rounds < 1:
    parser.error("--sweep-rounds must be >= 1")
  load_before = os.getloadavg()[0]
  peaks = measure_peaks(args.quick) if args.roofline else None
  rows = run_all(
    quick=args.quick,
    rounds=args.rounds,
    full=args.full,
    device_bytes=args.device_bytes,
    workloads=names,
    work=args.local_work,
    peaks=peaks,
    profile=args.profile,
  )
  result = {"meta": meta(argv, load_before), "rows": rows}
  result["meta"]["factored_dense"] = bool(args.factored_dense)
  if peaks is not None:
    result["peaks"] = peaks
  if blocks:
    result["blocks"] = run_blocks(
      blocks,
      quick=args.quick,
      rounds=args.rounds,
      device_bytes=args.device_bytes,
      peaks=peaks,
      profile=args.profile,
    )
  if args.sweep:
    cpu = jax.default_backend() == "cpu"
    sweep_rounds = args.sweep_rounds or (2 if args.quick or cpu else 20)
    spec = WORKLOADS["flute_femnist"]
    result["sweep"] = [
      measure_sweep(
        "flute_femnist",
        spec,
        quick=args.quick,
        rounds=sweep_rounds,
        peaks=peaks,
        **({"lrs": SWEEP_LRS[:2], "seeds": 2} if args.quick else {}),
      )
    ]
  if args.merge:
    result = merge_earlier(result, args.out)
  md = write(result, args.out)
  print(markdown(result))
  print(f"wrote {args.out} and {md}")
  return result


if __name__ == "__main__":
  main()
