"""A client count that the mesh does not divide: 30 clients on 4 forced CPU devices (in a
subprocess) give the results of the 1-device run, for runs (FedAvg with partial participation,
SCAFFOLD's per-client control variates, Ditto's personalized models) and sweeps; the data is
padded in storage only and the compiled program sees the 30 real clients."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from fedjax_dro.data import synthetic_classification
from fedjax_dro.engine import make_mesh
from fedjax_dro.engine.sharding import PaddedClients, place_data, real_clients

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

UNEVEN_EQUALS_SINGLE = """
import json
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import fedjax_dro as fd
from fedjax_dro import algorithms as A, models
from fedjax_dro.data import synthetic_classification
from fedjax_dro.engine import make_mesh
from fedjax_dro.engine.sharding import PaddedClients, place_data

ds = synthetic_classification(seed=0, num_clients=30, examples_per_class=60)
model = models.softmax_regression(ds.train.x.shape[-1], ds.num_classes)
mesh = make_mesh(clients=4)
placed = place_data(ds.train, mesh, pad=True)
assert isinstance(placed, PaddedClients) and placed.num_clients == 30
assert placed.data.x.shape[0] == 32 and len(placed.data.x.sharding.device_set) == 4
try:  # without pad=True (fd.compile_rounds) an uneven count is still refused, naming the data
  place_data(ds.train, mesh, what="data")
  raise AssertionError("30 clients on 4 devices accepted without padding")
except ValueError as e:
  assert "data: the leading axis (30) is not divisible" in str(e), e

def diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

out = {}
for name in NAMES:
  alg = A.get_algorithm(name).factory(model, clients_per_round=7, local_steps=3, batch_size=8)
  base = fd.run(alg, ds, rounds=6, eval_every=3)
  h = fd.run(alg, ds, rounds=6, eval_every=3, mesh=mesh)
  assert h.config["num_clients"] == 30
  assert all(np.shape(v) == (30,) for v in h.evaluations[-1]["per_client"].values())
  out[f"run {name}"] = {
    "state": diff(h.final_state, base.final_state),
    "train_metrics": diff(h.train_metrics, base.train_metrics),
    "per_client": max(diff(e["per_client"], f["per_client"])
                      for e, f in zip(h.evaluations, base.evaluations)),
    "shapes_equal": [np.shape(x) for x in jax.tree.leaves(h.final_state)]
                    == [np.shape(x) for x in jax.tree.leaves(base.final_state)],
  }
  if SWEEPS:
    grid = {"client_lr": [0.05, 0.2]}
    ref = fd.sweep(alg, ds, rounds=4, grid=grid, seeds=[0, 1])
    for c, s in [(4, 1), (2, 2)]:  # 30 clients over 4 and 2 client shards
      res = fd.sweep(alg, ds, rounds=4, grid=grid, seeds=[0, 1],
                     mesh=make_mesh(clients=c, sweep=s))
      out[f"sweep {name} clients={c} sweep={s}"] = {
        "state": diff(res.final_state, ref.final_state),
        "train_metrics": diff(res.train_metrics, ref.train_metrics),
        "per_client": diff(res.final_per_client, ref.final_per_client),
        "shapes_equal": res.final_per_client["accuracy"].shape == (4, 30),
      }
print(json.dumps(out))
"""


def _run_4_devices(names, sweeps):
  env = dict(os.environ)
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  code = f"NAMES = {names!r}\nSWEEPS = {sweeps!r}\n" + textwrap.dedent(UNEVEN_EQUALS_SINGLE)
  proc = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(out, expected_keys):
  assert sorted(out) == sorted(expected_keys)
  for what, d in out.items():
    assert d["shapes_equal"], what
    # the same tolerance as the even-mesh tests: floating-point reassociation only (x64)
    for field in ("state", "train_metrics", "per_client"):
      assert d[field] <= 1e-6, (what, field, d[field])


def test_30_clients_on_4_devices_equal_1_device():
  out = _run_4_devices(["fedavg", "scaffold"], sweeps=False)
  _check(out, ["run fedavg", "run scaffold"])


@pytest.mark.slow
def test_30_clients_on_4_devices_equal_1_device_ditto_and_sweeps():
  out = _run_4_devices(["ditto", "fedavg"], sweeps=True)
  _check(
    out,
    ["run ditto", "run fedavg"]
    + [
      f"sweep {n} clients={c} sweep={s}" for n in ("ditto", "fedavg") for c, s in [(4, 1), (2, 2)]
    ],
  )


def test_padding_is_storage_only():
  """One device: PaddedClients stores zeros past n and real_clients hands a program the n real
  clients (the single-device mesh never pads; this checks the container directly)."""
  ds = synthetic_classification(seed=0, num_clients=6, examples_per_class=20)
  mesh = make_mesh(clients=1)
  assert place_data(ds.train, mesh, pad=True).x.shape[0] == 6  # divisible: plain data
  stored = jax.tree.map(lambda a: np.concatenate([a, np.zeros_like(a[:2])]), ds.train)
  padded = PaddedClients(stored, 6, mesh)
  assert padded.num_clients == 6

  @jax.jit
  @real_clients
  def count_and_sum(data, scale):
    return data.num_clients, scale * data.x.sum(), data.num_examples

  n, total, examples = count_and_sum(padded, 2.0)
  assert int(n) == 6
  np.testing.assert_allclose(total, 2.0 * np.asarray(ds.train.x).sum(), rtol=1e-6)
  np.testing.assert_array_equal(examples, ds.train.num_examples)
  leaves, treedef = jax.tree.flatten(padded)
  assert jax.tree.unflatten(treedef, leaves).n == 6  # n is static: part of the structure
