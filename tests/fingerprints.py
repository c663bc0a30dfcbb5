"""SHA-256 fingerprints of every registered algorithm's runs and sweeps, for refactorings that
must not change behaviour: run ``python -m tests.fingerprints > before.txt`` on the old tree and
``> after.txt`` on the new one, then ``diff`` them.

Each algorithm runs on small float64 regression clients under several settings (defaults, partial
participation with minibatches, ``local_epochs`` where it is declared, uniform weighting where
it is a setting) through :func:`fedjax_dro.run`, and one two-row sweep; every algorithm with a
private form also runs made private (fixed-size and Poisson participation, ``local_epochs``
where declared, adaptive clipping for FedAvg) and in one sweep over the noise multiplier. The
digest covers the final state, the history's metrics and the sweep's states and metrics, byte
for byte (not the algorithm's descriptive settings record, whose form may change).
"""

from __future__ import annotations

import hashlib
import inspect

import jax
import numpy as np

from fedjax_dro import algorithms as A
from fedjax_dro.core.precision import float64
from fedjax_dro.engine.runner import run
from fedjax_dro.engine.sweeps import sweep
from fedjax_dro.privacy.wrapper import private
from tests.helpers import dataset, linreg, regression_clients

OPTIONS = {
  "karula": {"dissimilarity": "ones"},
  "fedbn": {"local": "^b$"},
  "fedper": {"head": "^b$"},
}
# the algorithms with a private form, and what their private form needs besides clip and noise
PRIVATE = {
  "afl": {"loss_bound": 5.0},
  "agnostic_fedavg": {"loss_bound": 5.0},
  "ditto": {},
  "dr_dsgd": {},
  "drfa": {"loss_bound": 5.0},
  "fedadagrad": {},
  "fedadam": {},
  "fedavg": {},
  "fedavg_momentum": {},
  "fedprox": {},
  "fedsgd": {},
  "fedyogi": {},
  "fgdro_cvar": {},
  "fgdro_kl": {},
  "fgdro_kl_adam": {},
  "ifca": {"cluster_count_noise": 0.4},
  "pfedme": {},
  "qffl": {"loss_bound": 50.0},
  "scaff_pd": {"loss_bound": 5.0},
  "scaffold": {},
}


def _digest(*trees) -> str:
  h = hashlib.sha256()
  for tree in trees:
    if isinstance(tree, str):
      h.update(tree.encode())
      continue
    for leaf in jax.tree_util.tree_leaves(tree):
      arr = np.asarray(leaf)
      h.update(str(arr.dtype).encode() + str(arr.shape).encode())
      h.update(np.ascontiguousarray(arr).tobytes())
  return h.hexdigest()


def variants(factory):
  """The settings each algorithm is fingerprinted under (those its signature accepts)."""
  accepted = inspect.signature(factory).parameters
  out = {"defaults": {}}
  if "clients_per_round" in accepted and "batch_size" in accepted:
    out["partial-minibatch"] = {"clients_per_round": 3, "batch_size": 4}
  if "local_epochs" in accepted:
    out["epochs"] = {"local_epochs": 2, "batch_size": 5}
  if "weighting" in accepted:
    out["uniform"] = {"weighting": "uniform"}
  return out


def fingerprints(names=None):
  """The fingerprint lines of every registered algorithm (or of ``names`` only)."""
  data = dataset(regression_clients(n=6, d=3, seed=0))
  model = linreg(3)
  lines = []
  for name in sorted(names or A.list_algorithms()):
    factory = A.get_algorithm(name).factory
    for label, options in variants(factory).items():
      alg = factory(model, **{**OPTIONS.get(name, {}), **options})
      res = run(alg, data, rounds=3, seed=1, eval_every=1, check_finite=False)
      evals = [e["per_client"] for e in res.evaluations]
      digest = _digest(res.final_state, res.train_metrics, evals)
      lines.append(f"{name:18s} {label:18s} run   {digest}")
    alg = factory(model, **OPTIONS.get(name, {}))
    grid = {next(iter(alg.hparams)): [0.01, 0.05]} if alg.hparams else None
    sw = sweep(alg, data, rounds=2, grid=grid, seeds=(0, 1), check_finite=False)
    lines.append(
      f"{name:18s} {'defaults':18s} sweep {_digest(sw.final_state, sw.train_metrics, sw.final_per_client)}"
    )
    if name in PRIVATE:
      lines += private_fingerprints(name, factory, data, model)
  return lines


def private_variants(factory):
  """The settings and privacy each private form is fingerprinted under."""
  accepted = inspect.signature(factory).parameters
  base = {"weighting": "uniform"} if "weighting" in accepted else {}
  partial = {**base}
  if "clients_per_round" in accepted:
    partial["clients_per_round"] = 3
  if "batch_size" in accepted:
    partial["batch_size"] = 4
  out = {
    "dp-fixed": (partial, {"sampling": "fixed"}),
    "dp-poisson": (base, {"rate": 0.5}),
  }
  if "local_epochs" in accepted:
    out["dp-epochs"] = ({**base, "local_epochs": 2, "batch_size": 5}, {"rate": 0.5})
  return out


def private_fingerprints(name, factory, data, model):
  lines = []
  for label, (options, privacy) in private_variants(factory).items():
    alg = factory(model, **{**OPTIONS.get(name, {}), **options})
    palg = private(alg, 0.5, 0.3, **privacy, **PRIVATE[name])
    res = run(palg, data, rounds=3, seed=1, eval_every=1, check_finite=False)
    evals = [e["per_client"] for e in res.evaluations]
    digest = _digest(res.final_state, res.train_metrics, evals)
    lines.append(f"{name:18s} {label:18s} run   {digest}")
  if name == "fedavg":
    alg = factory(model, weighting="uniform", clients_per_round=3)
    palg = private(alg, 0.5, 0.3, sampling="fixed", adaptive_quantile=0.5)
    res = run(palg, data, rounds=3, seed=1, eval_every=1, check_finite=False)
    evals = [e["per_client"] for e in res.evaluations]
    digest = _digest(res.final_state, res.train_metrics, evals)
    lines.append(f"{name:18s} {'dp-adaptive':18s} run   {digest}")
  options, privacy = private_variants(factory)["dp-poisson"]
  palg = private(factory(model, **{**OPTIONS.get(name, {}), **options}), 0.5, 0.3, **privacy,
                 **PRIVATE[name])  # fmt: skip
  sw = sweep(palg, data, rounds=2, grid={"dp_noise": [0.1, 0.5]}, seeds=(0, 1), check_finite=False)
  digest = _digest(sw.final_state, sw.train_metrics, sw.final_per_client)
  lines.append(f"{name:18s} {'dp-poisson':18s} sweep {digest}")
  return lines


if __name__ == "__main__":
  import sys

  with float64():  # python -m tests.fingerprints [NAME ...]
    for line in fingerprints(sys.argv[1:] or None):
      print(line, flush=True)
