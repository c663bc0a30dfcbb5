"""FedAvg rounds of real FedJAX and of this simulator side by side, in one process, on FedJAX's own
models: rounds per second of both, and one round's agreement from the same initial weights and
the same batches.

FedJAX (Ro, Suresh and Wu, "FedJAX: Federated learning simulation with JAX", arXiv:2108.02117)
is installed in the benchmark's own environment, never as a dependency of the package::

    python -m venv .venv-fedjax && . .venv-fedjax/bin/activate
    pip install -e . fedjax
    python benchmarks/fedjax_side_by_side.py            # minutes on 2 CPU cores
    python benchmarks/fedjax_side_by_side.py --quick    # a smoke run (small clients)

Both frameworks train the same model functions: FedJAX's ``fedjax.models.emnist
.create_conv_model`` (EMNIST_CONV: two 3x3 convolutions of 32 and 64 channels, max-pool, dropout
0.25, dense 128, dropout 0.5, 62 classes; 28x28x1 images, batch 10) and
``fedjax.models.shakespeare.create_lstm_model`` (embedding 8, two LSTM layers of 256, 90 tokens;
sequences of 80, batch 4), brought into the simulator as a :class:`fedjax_dro.models.Model` whose
``init`` / ``apply`` / ``train_apply`` / ``loss`` are the FedJAX model's own ``init`` /
``apply_for_eval`` / ``apply_for_train`` / ``train_loss``. So the comparison measures the
federations, not two implementations of a network. FedJAX 0.0.17 reads two names current
JAX removed (``jnp.NINF``, ``jax.tree_map``); the benchmark defines them first as they were.

**Speed.** One federation of ``--clients`` clients (sizes drawn from the anchors' distributions,
``benchmarks/anchor_workloads.py``: EMNIST lognormal mean 197.5, Shakespeare lognormal mean 22.5
sequences), every client in every round (so both frameworks train the same clients), one local
epoch of SGD (client rate 0.1, dropout on), the server step plain averaging weighted by examples.
FedJAX runs ``fedjax.algorithms.fed_avg.federated_averaging`` (its ``for_each_client``: a jitted
step per batch in a Python loop); the simulator runs ``fedavg(local_epochs=1)`` through
``fd.compile_rounds`` (backend ``auto``). A third column runs the simulator on the package's own
model of the same architecture (``benchmarks/anchor_workloads.py``'s FedJAX EMNIST CNN in Flax;
``models.lstm_language_model("shakespeare")``, a ``lax.scan`` over positions where FedJAX's
model unrolls them), with the same parameter count (recorded). Each side gets a warm-up
(compilation, every batch shape), then ``--repeats`` timed calls of ``--rounds`` rounds, the best
kept.

**Agreement.** Clients of ``n`` equal rows, two local epochs of one full batch each (every
batch holds a client's whole data, so the batches are the same sets of rows in both frameworks
whatever either shuffles; Shakespeare's sequences cut to 20 positions, to keep the float64
compilation of the unrolled LSTM short), dropout off in both (the FedJAX model's train mode replaced by its
eval mode: the two frameworks draw dropout masks from different streams), in float64 under
``jax.enable_x64``: the max absolute difference of the parameters after one round, relative to the
round's largest update, must be at most ``AGREEMENT_TOL``.

Writes ``benchmarks/results/fedjax_side_by_side.{json,md}`` (``--out DIR``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anchor_workloads import WORKLOADS as ANCHORS, build_model  # noqa: E402

AGREEMENT_TOL = 1e-10
"""Max |ours - FedJAX's| over the parameters after one round in float64, relative to the round's
largest parameter change."""

WORKLOADS = {
  "emnist_conv": {
    "title": "EMNIST_CONV (FedJAX's CNN, 62 classes)",
    "example": (28, 28, 1),
    "classes": 62,
    "batch": 10,
    "sizes_mean": 197.5,
    "sizes_sigma": 0.5,
    "agree_rows": 6,
    "anchor": "fedjax_emnist_conv",
  },
  "shakespeare": {
    "title": "Shakespeare (FedJAX's character LSTM)",
    "example": (80,),
    "vocab": 86,  # FedJAX's vocabulary without its 4 special tokens (full vocabulary 90)
    "batch": 4,
    "sizes_mean": 22.5,
    "sizes_sigma": 1.0,
    "agree_rows": 3,
    "agree_example": (20,),
    "quick_example": (8,),
    "anchor": "flute_rnn_fedshakespeare",
  },
}


def _fedjax():
  """FedJAX, or SystemExit with the install line. FedJAX 0.0.17 reads two names current JAX
  removed, ``jnp.NINF`` (its Shakespeare model) and ``jax.tree_map`` (its tree utilities):
  they are defined first as what they were (``-inf``, ``jax.tree.map``)."""
  if not hasattr(jnp, "NINF"):
    jnp.NINF = -jnp.inf
  if not hasattr(jax, "tree_map"):
    jax.tree_map = jax.tree.map
  try:
    import fedjax
  except ImportError as e:
    raise SystemExit(
      "this benchmark needs FedJAX in its own environment: python -m venv .venv-fedjax && "
      f". .venv-fedjax/bin/activate && pip install -e . fedjax ({e})"
    ) from None
  return fedjax


def fedjax_model(name, quick):
  fedjax = _fedjax()
  if name == "emnist_conv":
    return fedjax.models.emnist.create_conv_model(only_digits=False)
  if quick:
    return fedjax.models.shakespeare.create_lstm_model(lstm_hidden_size=16)
  return fedjax.models.shakespeare.create_lstm_model()


def without_dropout(fj_model):
  """The FedJAX model with its training mode replaced by its evaluation mode."""
  return dataclasses.replace(
    fj_model, apply_for_train=lambda params, batch, rng=None: fj_model.apply_for_eval(params, batch)
  )


def as_simulator_model(fj_model, name, dtype=None):
  """A :class:`fedjax_dro.models.Model` made of the FedJAX model's own functions (``dtype``: its
  initial parameters cast to it)."""
  from fedjax_dro import models

  def init(key):
    params = fj_model.init(key)
    return params if dtype is None else jax.tree.map(lambda a: jnp.asarray(a, dtype), params)

  def loss(out, y):
    return fj_model.train_loss({"y": y}, out)

  def metrics(out, y):
    hit = (jnp.argmax(out, -1) == y).astype(out.dtype)
    return {"accuracy": hit.mean(-1) if hit.ndim > 1 else hit}

  def train_apply(params, x, mask, rng):
    return fj_model.apply_for_train(params, {"x": x}, rng), {}

  return models.Model(
    init=init,
    apply=lambda params, x: fj_model.apply_for_eval(params, {"x": x}),
    loss=loss,
    metrics=metrics,
    task="classification",
    name=f"fedjax:{name}",
    train_apply=train_apply,
  )


def client_data(spec, sizes, rng, quick=False, example="example"):
  """Per-client ``(x, y)``: standard-normal images with random labels, or token sequences in
  ``[1, vocab]`` whose labels are the next tokens, of the spec's ``example`` length
  (``quick``: its ``quick_example``)."""
  xs, ys = [], []
  for n in sizes:
    if "vocab" in spec:
      t = spec["quick_example" if quick else example][0]
      seq = rng.integers(1, spec["vocab"] + 1, (int(n), t + 1)).astype(np.int32)
      xs.append(seq[:, :-1])
      ys.append(seq[:, 1:])
    else:
      xs.append(rng.standard_normal((int(n),) + spec["example"]).astype(np.float32))
      ys.append(rng.integers(0, spec["classes"], int(n)).astype(np.int32))
  return xs, ys


def fedjax_round(fj_model, xs, ys, batch, epochs, lr, skip_shuffle=False):
  """``(init, one_round)``: FedJAX's FedAvg over every client of ``xs`` each round."""
  fedjax = _fedjax()
  from fedjax.algorithms import fed_avg

  alg = fed_avg.federated_averaging(
    grad_fn=fedjax.model_grad(fj_model),
    client_optimizer=fedjax.optimizers.sgd(lr),
    server_optimizer=fedjax.optimizers.sgd(1.0),
    client_batch_hparams=fedjax.ShuffleRepeatBatchHParams(
      batch_size=batch, num_epochs=epochs, seed=0, skip_shuffle=skip_shuffle
    ),
  )
  datasets = [fedjax.ClientDataset({"x": x, "y": y}) for x, y in zip(xs, ys)]
  keys = jax.random.split(jax.random.PRNGKey(1), len(xs))

  def one_round(state):
    clients = [(str(i).encode(), d, keys[i]) for i, d in enumerate(datasets)]
    state, _ = alg.apply(state, clients)
    return state

  return alg.init, one_round


def simulator_round(model, xs, ys, batch, epochs, lr, rounds, params):
  import fedjax_dro as fd
  from fedjax_dro import algorithms as A, data

  train = data.from_client_arrays(xs, ys, dtype=np.int32 if xs[0].dtype == np.int32 else None)
  ds = data.FederatedDataset(train=train, test=train, name="fedjax-side-by-side")
  alg = A.fedavg(model, clients_per_round=len(xs), local_epochs=epochs, batch_size=batch)
  return fd.compile_rounds(alg, ds, rounds=rounds, hparams={"client_lr": lr}, init_params=params)


def num_parameters(params) -> int:
  return int(sum(np.size(a) for a in jax.tree.leaves(params)))


def _best(fn, repeats):
  """``(best seconds of repeats calls, seconds of the warm-up call)``."""
  t0 = time.perf_counter()
  jax.block_until_ready(fn())  # warm-up: compilation
  first = time.perf_counter() - t0
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return best, first


def speed(name, spec, clients, rounds, repeats, quick, lr=0.1):
  rng = np.random.default_rng(0)
  sizes = np.maximum(
    1,
    np.rint(
      rng.lognormal(
        np.log(spec["sizes_mean"]) - 0.5 * spec["sizes_sigma"] ** 2, spec["sizes_sigma"], clients
      )
    ),
  ).astype(int)
  if quick:
    sizes = np.minimum(sizes, 4 * spec["batch"])
  xs, ys = client_data(spec, sizes, rng, quick)
  fj = fedjax_model(name, quick)
  params = fj.init(jax.random.PRNGKey(0))
  init, one_round = fedjax_round(fj, xs, ys, spec["batch"], 1, lr)

  def fedjax_rounds():
    state = init(params)
    for _ in range(rounds):
      state = one_round(state)
    return state.params

  t0 = time.perf_counter()
  prog = simulator_round(as_simulator_model(fj, name), xs, ys, spec["batch"], 1, lr, rounds, params)
  built = time.perf_counter() - t0
  ours, ours_first = _best(lambda: prog()[0], repeats)
  theirs, theirs_first = _best(fedjax_rounds, repeats)
  ours, theirs = ours / rounds, theirs / rounds
  anchor = ANCHORS[spec["anchor"]]
  example = spec["quick_example" if quick and "quick_example" in spec else "example"]
  zoo_model = build_model(anchor, example, quick and "vocab" in spec)
  zoo_params = zoo_model.init(jax.random.PRNGKey(0))
  zoo = simulator_round(zoo_model, xs, ys, spec["batch"], 1, lr, rounds, zoo_params)
  zoo_s = _best(lambda: zoo()[0], repeats)[0] / rounds
  row = {
    "workload": name,
    "title": spec["title"],
    "clients": clients,
    "examples": int(sizes.sum()),
    "steps_per_round": int(np.ceil(sizes / spec["batch"]).sum()),
    "batch": spec["batch"],
    "simulator_s_per_round": ours,
    "fedjax_s_per_round": theirs,
    "simulator_rounds_per_s": 1.0 / ours,
    "fedjax_rounds_per_s": 1.0 / theirs,
    "speedup": theirs / ours,
    "zoo_model": zoo_model.name,
    "zoo_s_per_round": zoo_s,
    "zoo_rounds_per_s": 1.0 / zoo_s,
    "zoo_speedup": theirs / zoo_s,
    "fedjax_parameters": num_parameters(params),
    "zoo_parameters": num_parameters(zoo_params),
    "simulator_first_call_s": built + ours_first,
    "fedjax_first_call_s": theirs_first,
    "rounds_per_call": rounds,
  }
  print(json.dumps(row), flush=True)
  return row


def agreement(name, spec, clients, quick, lr=0.1, epochs=2):
  """One round of both from the same weights and batches in float64 (dropout off)."""
  rng = np.random.default_rng(1)
  n = spec["agree_rows"]
  xs, ys = client_data(
    spec, [n] * clients, rng, quick, "agree_example" if "agree_example" in spec else "example"
  )
  xs = [x.astype(np.float64) if x.dtype == np.float32 else x for x in xs]
  with jax.enable_x64(True):
    fj = without_dropout(fedjax_model(name, quick))
    model = as_simulator_model(fj, name, jnp.float64)
    params = model.init(jax.random.PRNGKey(0))
    init, one_round = fedjax_round(fj, xs, ys, n, epochs, lr, skip_shuffle=True)
    theirs = one_round(init(params)).params
    state, _ = simulator_round(model, xs, ys, n, epochs, lr, 1, params)()
    ours = state.params
    diff = max(
      float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs))
    )
    moved = max(
      float(jnp.max(jnp.abs(a - b)))
      for a, b in zip(jax.tree.leaves(theirs), jax.tree.leaves(params))
    )
    dtypes = sorted({str(a.dtype) for a in jax.tree.leaves(ours)})
  row = {
    "workload": name,
    "clients": clients,
    "rows_per_client": n,
    "local_epochs": epochs,
    "dtypes": dtypes,
    "max_abs_diff": diff,
    "max_update": moved,
    "relative": diff / moved,
    "tolerance": AGREEMENT_TOL,
    "agree": bool(diff / moved <= AGREEMENT_TOL),
  }
  print(json.dumps(row), flush=True)
  return row


def markdown(result):
  meta = result["meta"]
  lines = [
    "# FedJAX and this simulator side by side",
    "",
    f"Device: {meta['device']}; FedJAX {meta['fedjax_version']}, JAX {meta['jax']}. FedAvg on "
    f"FedJAX's own models, {meta['clients']} clients all in every round, one local epoch of SGD "
    f"(dropout on), best of {meta['repeats']} calls of {meta['rounds']} rounds after a warm-up "
    + (f"(load average {meta['load_before']:.1f} before the run), " if meta["load_before"] else "")
    + "in one process (`python benchmarks/fedjax_side_by_side.py"
    + (" --quick`: a smoke run, not a measurement)." if meta["quick"] else "`)."),
    "",
    "| workload | steps a round (batch) | FedJAX rounds/s | simulator, FedJAX's model: "
    "rounds/s (x FedJAX) | simulator, the zoo's model: rounds/s (x FedJAX) | first call, FedJAX "
    "/ simulator (s) |",
    "|---|---|---|---|---|---|",
  ]
  for r in result["speed"]:
    lines.append(
      f"| {r['title']} | {r['steps_per_round']} ({r['batch']}) | {r['fedjax_rounds_per_s']:.3g} | "
      f"{r['simulator_rounds_per_s']:.3g} ({r['speedup']:.2f}) | "
      f"{r['zoo_rounds_per_s']:.3g} ({r['zoo_speedup']:.2f}) | "
      f"{r['fedjax_first_call_s']:.1f} / {r['simulator_first_call_s']:.1f} |"
    )
  lines += [
    "",
    "The first call holds compilation (FedJAX compiles its step once per batch shape, the "
    "simulator its whole round). The zoo's models are the same architectures written in Flax "
    "(parameters: "
    + "; ".join(
      f"{r['workload']} FedJAX {r['fedjax_parameters']:,}, zoo {r['zoo_parameters']:,} "
      f"({r['zoo_model']})"
      for r in result["speed"]
    )
    + ").",
    "",
    "One round from the same initial weights and batches (float64, dropout off in both, every "
    "batch a client's whole data, two local epochs): the largest parameter difference relative "
    f"to the round's largest update, tolerance {AGREEMENT_TOL:g}.",
    "",
    "| workload | clients x rows | max abs difference | largest update | relative | agree |",
    "|---|---|---|---|---|---|",
  ]
  for r in result["agreement"]:
    lines.append(
      f"| {r['workload']} | {r['clients']} x {r['rows_per_client']} | {r['max_abs_diff']:.2e} | "
      f"{r['max_update']:.3g} | {r['relative']:.2e} | {'yes' if r['agree'] else 'NO'} |"
    )
  return "\n".join(lines) + "\n"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="small clients and model (a smoke run)")
  p.add_argument(
    "--clients", type=int, default=None, help="clients in the federation (10; quick 3)"
  )
  p.add_argument("--rounds", type=int, default=None, help="rounds per timed call (2; quick 1)")
  p.add_argument("--repeats", type=int, default=None, help="timed calls (2; quick 1)")
  p.add_argument("--workloads", default="emnist_conv,shakespeare")
  p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = p.parse_args(argv)
  q = args.quick
  names = [w for w in args.workloads.split(",") if w]
  unknown = sorted(set(names) - set(WORKLOADS))
  if unknown:
    p.error(f"--workloads: unknown {unknown}; known: {sorted(WORKLOADS)}")
  clients = args.clients or (3 if q else 10)
  rounds = args.rounds or (1 if q else 2)
  repeats = args.repeats or (1 if q else 2)
  fedjax = _fedjax()
  from importlib.metadata import version

  result = {
    "meta": {
      "device": f"{jax.devices()[0].platform} ({platform.processor() or platform.machine()}, "
      f"{os.cpu_count()} cores)",
      "fedjax_version": version("fedjax") if fedjax else None,
      "jax": jax.__version__,
      "clients": clients,
      "rounds": rounds,
      "repeats": repeats,
      "quick": q,
      "load_before": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
      "argv": sys.argv[1:] if argv is None else list(argv),
    },
    "speed": [],
    "agreement": [],
  }
  for name in names:
    result["agreement"].append(agreement(name, WORKLOADS[name], 3, q))
    result["speed"].append(speed(name, WORKLOADS[name], clients, rounds, repeats, q))
  os.makedirs(args.out, exist_ok=True)
  stem = os.path.join(args.out, "fedjax_side_by_side" + ("_quick" if q else ""))
  with open(stem + ".json", "w") as f:
    json.dump(result, f, indent=1)
  with open(stem + ".md", "w") as f:
    f.write(markdown(result))
  print(markdown(result))
  if not all(r["agree"] for r in result["agreement"]):
    raise SystemExit("a round disagrees with FedJAX's beyond the tolerance")
  return result


if __name__ == "__main__":
  main()
