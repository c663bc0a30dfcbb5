"""SHA-256 fingerprints of every registered algorithm's runs and sweeps, for refactorings that
must not change behaviour: run ``python -m tests.fingerprints > before.txt`` on the old tree and
``> after.txt`` on the new one, then ``diff`` them.

Each algorithm runs on small float64 regression clients under several settings (defaults, partial
participation with minibatches, ``local_epochs`` where it is declared, uniform weighting where
it is a setting) through :func:`fedjax_dro.run`, and one two-row sweep; the digest covers the
final state, the history's metrics and the sweep's states and metrics, byte for byte.
"""

from __future__ import annotations

import hashlib
import inspect

import jax
import numpy as np

from fedjax_dro import algorithms as A
from fedjax_dro.core.precision import float64
from fedjax_dro.engine import run, sweep
from tests.helpers import dataset, linreg, regression_clients

OPTIONS = {"karula": {"dissimilarity": "ones"}}


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


def fingerprints():
  data = dataset(regression_clients(n=6, d=3, seed=0))
  model = linreg(3)
  lines = []
  for name in sorted(A.list_algorithms()):
    factory = A.get_algorithm(name).factory
    for label, options in variants(factory).items():
      alg = factory(model, **{**OPTIONS.get(name, {}), **options})
      res = run(alg, data, rounds=3, seed=1, eval_every=1, check_finite=False)
      evals = [e["per_client"] for e in res.evaluations]
      digest = _digest(res.final_state, res.train_metrics, evals, repr(sorted(alg.config.items())))
      lines.append(f"{name:18s} {label:18s} run   {digest}")
    alg = factory(model, **OPTIONS.get(name, {}))
    grid = {next(iter(alg.hparams)): [0.01, 0.05]} if alg.hparams else None
    sw = sweep(alg, data, rounds=2, grid=grid, seeds=(0, 1), check_finite=False)
    lines.append(
      f"{name:18s} {'defaults':18s} sweep {_digest(sw.final_state, sw.train_metrics, sw.final_per_client)}"
    )
  return lines


if __name__ == "__main__":
  with float64():
    for line in fingerprints():
      print(line)
