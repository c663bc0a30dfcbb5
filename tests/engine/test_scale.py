"""Scale-out: sharded runs and sweeps equal single-device ones (4 forced CPU devices, in a
subprocess), two jax.distributed processes equal one, a sharded checkpoint resumes on another
device count; host-resident data equals device-resident data while moving only sampled rows;
CSV results and plots."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro import algorithms as A, cli, models
from fedjax_dro.data import synthetic_classification
from fedjax_dro.data.host import HostFederatedData, load_npy_dir, save_npy_dir, to_host
from fedjax_dro.engine import make_mesh, request_cpu_devices
from fedjax_dro.engine.sharding import even_devices, local_cpu_cores, parse_mesh
from fedjax_dro.records import read_run
from fedjax_dro.records.history import read_csv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PRELUDE = """
import json, os, sys
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import fedjax_dro as fd
from fedjax_dro import algorithms as A, models
from fedjax_dro.data import synthetic_classification
from fedjax_dro.engine import make_mesh

def problem():
  ds = synthetic_classification(seed=0)   # 20 clients
  model = models.softmax_regression(ds.train.x.shape[-1], ds.num_classes)
  return ds, model

def make(name, model):
  return A.get_algorithm(name).factory(model, clients_per_round=8, local_steps=3, batch_size=8)

def leaves(tree):
  return [np.asarray(x).tolist() for x in jax.tree.leaves(tree)]
"""


def _python(code, devices=1, env_extra=None, timeout=240):
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env.update(env_extra or {})
  return subprocess.Popen(
    [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _result(proc, timeout=240):
  out, err = proc.communicate(timeout=timeout)
  assert proc.returncode == 0, err[-3000:]
  return json.loads(out.strip().splitlines()[-1])


def _problem():
  ds = synthetic_classification(seed=0)
  return ds, models.softmax_regression(ds.train.x.shape[-1], ds.num_classes)


def _json_leaves_diff(json_leaves, tree):
  """Max difference between leaves printed as JSON lists by a subprocess and ``tree``'s leaves."""
  leaves = jax.tree.leaves(tree)
  assert len(json_leaves) == len(leaves)
  return max(
    float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(json_leaves, leaves)
  )


def _max_diff(a, b):
  return max(
    float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


# ----------------------------------------------------------------------------------------------
# Sharding on 4 forced CPU devices
# ----------------------------------------------------------------------------------------------
SHARDED_EQUALS_SINGLE = """
import fedjax_dro.engine.sweeps as sweeps_module
shares, rows_per_device = [], {}
scope = sweeps_module.scope

def recording_scope(tuning):  # the rows each device runs side by side, as the planner is told
  shares.append(tuning.memory_share)
  return scope(tuning)

sweeps_module.scope = recording_scope
ds, model = problem()
diffs = {}
for name in NAMES:
  alg = make(name, model)
  base = fd.run(alg, ds, rounds=6, eval_every=3)
  for c, s in [(4, 1), (2, 2)]:
    h = fd.run(alg, ds, rounds=6, eval_every=3, mesh=make_mesh(clients=c, sweep=s))
    d = max(np.max(np.abs(np.asarray(a) - np.asarray(b)))
            for a, b in zip(jax.tree.leaves(h.final_state), jax.tree.leaves(base.final_state)))
    e = max(np.max(np.abs(np.asarray(h.evaluations[-1]["per_client"][k])
                          - np.asarray(base.evaluations[-1]["per_client"][k])))
            for k in base.evaluations[-1]["per_client"])
    diffs[f"run {name} clients={c} sweep={s}"] = float(max(d, e))
  grid = {"client_lr": [0.05, 0.1, 0.2]}
  ref = fd.sweep(alg, ds, rounds=4, grid=grid, seeds=[0, 1])
  for c, s in [(1, 4), (2, 2), (4, 1)]:
    shares.clear()
    res = fd.sweep(alg, ds, rounds=4, grid=grid, seeds=[0, 1], mesh=make_mesh(clients=c, sweep=s))
    rows_per_device[f"{name} clients={c} sweep={s}"] = sorted(set(shares))
    d = max(np.max(np.abs(np.asarray(a) - np.asarray(b)))
            for a, b in zip(jax.tree.leaves(res.final_state), jax.tree.leaves(ref.final_state)))
    e = max(np.max(np.abs(res.final_per_client[k] - ref.final_per_client[k]))
            for k in ref.final_per_client)
    assert res.train_metrics["train_loss"].shape == (6, 4) and len(res.configs) == 6
    diffs[f"sweep {name} clients={c} sweep={s}"] = float(max(d, e))
prog = fd.compile_rounds(make("fedavg", model), ds, rounds=2, mesh=make_mesh(clients=4))
text = prog.as_text()
print(json.dumps({"diffs": diffs, "all_reduce": "all-reduce" in text, "rows": rows_per_device}))
"""


@pytest.mark.parametrize(
  "names",
  [
    ["fedavg", "local"],
    pytest.param(["scaffold", "fedprox", "qffl", "drfa"], marks=pytest.mark.slow),
  ],
)
def test_sharded_runs_and_sweeps_equal_single_device(names):
  out = _result(_python(f"NAMES = {names!r}\n" + SHARDED_EQUALS_SINGLE, devices=4))
  assert out["all_reduce"]  # aggregation over sharded clients is a cross-device reduction
  assert len(out["diffs"]) == 5 * len(names)
  # 6 sweep rows (padded to 8 over 4 sweep shards): each device plans for its own rows only
  expected = {"clients=1 sweep=4": [2], "clients=2 sweep=2": [3], "clients=4 sweep=1": [6]}
  assert len(out["rows"]) == 3 * len(names)
  for what, rows in out["rows"].items():
    assert rows == expected[what.split(" ", 1)[1]], (what, rows)
  for what, diff in out["diffs"].items():
    assert diff <= 1e-6, what


def test_mesh_validation_and_single_device_mesh():
  ds, model = _problem()
  alg = A.fedavg(model, clients_per_round=4, local_steps=2, batch_size=4)
  base = fd.run(alg, ds, rounds=3)
  h = fd.run(alg, ds, rounds=3, mesh=make_mesh(clients=1))
  assert _max_diff(h.final_state, base.final_state) == 0.0
  with pytest.raises(ValueError, match="needs 4 devices"):
    make_mesh(clients=4)
  with pytest.raises(ValueError, match="clients"):
    make_mesh(clients=0)
  with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
    fd.run(alg, ds, rounds=3, mesh="clients=2")
  with pytest.raises(ValueError, match="--devices 8"):
    parse_mesh(None, 8)
  with pytest.raises(ValueError, match="axis must be one of"):
    parse_mesh("hosts=2")
  with pytest.raises(ValueError, match="not an integer"):
    parse_mesh("clients=two")
  assert dict(parse_mesh("clients=1").shape) == {"sweep": 1, "clients": 1}
  with pytest.raises(ValueError, match="cannot be combined"):
    fd.run(alg, dataclasses.replace(ds, train=to_host(ds.train)), rounds=2, mesh=make_mesh())


# ----------------------------------------------------------------------------------------------
# Multi-process (jax.distributed on loopback) and resuming on another device count
# ----------------------------------------------------------------------------------------------
def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


TWO_PROCESSES = """
from fedjax_dro.engine.sharding import initialize_distributed, is_writer
initialize_distributed(f"127.0.0.1:{PORT}", 2, PID)
ds, model = problem()
alg = make("scaffold", model)
h = fd.run(alg, ds, rounds=6, eval_every=3, mesh=make_mesh(clients=4), out_dir=OUT)
res = fd.sweep(alg, ds, rounds=4, grid={"client_lr": [0.05, 0.1]}, seeds=[0, 1],
               mesh=make_mesh(clients=2, sweep=2))
print(json.dumps({"devices": len(jax.devices()), "writer": is_writer(),
                  "state": leaves(h.final_state),
                  "per_client": {k: np.asarray(v).tolist()
                                 for k, v in h.evaluations[-1]["per_client"].items()},
                  "sweep": {k: v.tolist() for k, v in res.final_per_client.items()}}))
"""


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
  port = _free_port()
  procs = []
  for pid in (0, 1):
    out = repr(str(tmp_path / f"out{pid}"))
    code = f"PORT = {port}\nPID = {pid}\nOUT = {out}\n" + TWO_PROCESSES
    procs.append(_python(code, devices=2))
  results = [_result(p, timeout=300) for p in procs]
  ds, model = _problem()
  alg = A.scaffold(model, clients_per_round=8, local_steps=3, batch_size=8)
  ref = fd.run(alg, ds, rounds=6, eval_every=3)
  ref_sweep = fd.sweep(alg, ds, rounds=4, grid={"client_lr": [0.05, 0.1]}, seeds=[0, 1])
  for res in results:
    assert res["devices"] == 4
    assert _json_leaves_diff(res["state"], ref.final_state) <= 1e-6
    for k, v in ref.evaluations[-1]["per_client"].items():
      np.testing.assert_allclose(res["per_client"][k], v, atol=1e-6)
    for k, v in ref_sweep.final_per_client.items():
      np.testing.assert_allclose(res["sweep"][k], v, atol=1e-6)
  assert [r["writer"] for r in results] == [True, False]
  assert os.path.exists(tmp_path / "out0" / "summary.json")
  assert not os.path.exists(tmp_path / "out1")  # only process 0 writes


INTERRUPTED = """
import fedjax_dro.engine.runner as runner
ds, model = problem()
alg = make("scaffold", model)
calls = {"n": 0}
original = runner.summarize_per_client
def crash(*args):
  calls["n"] += 1
  if calls["n"] == 2:
    raise KeyboardInterrupt("simulated crash")
  return original(*args)
if CRASH:
  runner.summarize_per_client = crash
try:
  h = fd.run(alg, ds, rounds=9, eval_every=3, checkpoint_dir=CKPT, mesh=make_mesh(clients=DEVICES))
  print(json.dumps({"state": leaves(h.final_state), "rounds": len(h.train_metrics["train_loss"])}))
except KeyboardInterrupt:
  print(json.dumps({"interrupted": True}))
"""


@pytest.mark.slow
def test_sharded_checkpoint_resumes_on_another_device_count(tmp_path):
  ckpt = repr(str(tmp_path / "ckpt"))
  first = _result(_python(f"CKPT = {ckpt}\nDEVICES = 4\nCRASH = True\n" + INTERRUPTED, 4))
  assert first == {"interrupted": True}
  resumed = _result(_python(f"CKPT = {ckpt}\nDEVICES = 2\nCRASH = False\n" + INTERRUPTED, 2))
  ds, model = _problem()
  ref = fd.run(
    A.scaffold(model, clients_per_round=8, local_steps=3, batch_size=8), ds, rounds=9, eval_every=3
  )
  assert resumed["rounds"] == 9
  assert _json_leaves_diff(resumed["state"], ref.final_state) <= 1e-6


# ----------------------------------------------------------------------------------------------
# Host-resident data
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
  "name, clients_per_round",
  [("fedavg", 5)]
  + [
    pytest.param(*c, marks=pytest.mark.slow)
    for c in [("scaffold", 5), ("fedavg", None), ("qffl", 5)]
  ],
)
def test_host_resident_data_equals_device_resident(tmp_path, name, clients_per_round):
  ds, model = _problem()
  alg = A.get_algorithm(name).factory(
    model, clients_per_round=clients_per_round, local_steps=3, batch_size=8
  )
  base = fd.run(alg, ds, rounds=6, eval_every=3)
  save_npy_dir(ds.train, str(tmp_path / "train"))
  save_npy_dir(ds.test, str(tmp_path / "test"))
  train, test = load_npy_dir(str(tmp_path / "train")), load_npy_dir(str(tmp_path / "test"))
  assert isinstance(train.store.x, np.memmap)
  host = dataclasses.replace(ds, train=train, test=test)
  h = fd.run(alg, host, rounds=6, eval_every=3)
  assert _max_diff(h.final_state, base.final_state) == 0.0
  for k, v in base.evaluations[-1]["per_client"].items():
    np.testing.assert_array_equal(h.evaluations[-1]["per_client"][k], v)
  stats = train.store.stats
  if clients_per_round is not None:
    # only the sampled clients' rows reached the device: s rows per round, every round
    assert stats["rows_gathered"] == 6 * clients_per_round
    assert stats["hits"] >= 6 and stats["misses"] == 0  # the prefetch predicted every round
  res = fd.sweep(alg, host, rounds=4, grid={"client_lr": [0.05, 0.1]}, seeds=[0, 1])
  ref = fd.sweep(alg, ds, rounds=4, grid={"client_lr": [0.05, 0.1]}, seeds=[0, 1])
  assert _max_diff(res.final_state, ref.final_state) == 0.0


def test_host_data_with_state_dependent_sampling_and_chunked_evaluation(monkeypatch):
  import fedjax_dro.engine.programs as programs

  ds, model = _problem()
  alg = A.drfa(model, clients_per_round=5, local_steps=3, batch_size=8)
  base = fd.run(alg, ds, rounds=4, eval_every=2)
  monkeypatch.setattr(programs, "EVAL_CHUNK_CLIENTS", 7)  # 20 clients: chunks 7, 7, 6(+1)
  host = dataclasses.replace(ds, train=to_host(ds.train), test=to_host(ds.test))
  h = fd.run(alg, host, rounds=4, eval_every=2)
  assert _max_diff(h.final_state, base.final_state) == 0.0
  for k, v in base.evaluations[-1]["per_client"].items():
    # chunks of 7 clients instead of one batch of 20: equal up to the last bits of the sums
    np.testing.assert_allclose(h.evaluations[-1]["per_client"][k], v, rtol=1e-12, atol=1e-14)
  assert host.train.store.stats["misses"] > 0  # lambda-sampling is not predictable: still exact


def test_host_data_errors(tmp_path):
  ds, model = _problem()
  host = to_host(ds.train)
  assert isinstance(host, HostFederatedData) and host.num_clients == 20
  with pytest.raises(ValueError, match="host-resident"):
    _ = host.x
  karula = A.karula(models.linear_regression(ds.train.x.shape[-1]))
  with pytest.raises(ValueError, match="host-resident"):
    fd.run(karula, dataclasses.replace(ds, train=host, test=to_host(ds.test)), rounds=1)
  with pytest.raises(ValueError, match="directory"):
    load_npy_dir(str(tmp_path / "missing"))
  os.makedirs(tmp_path / "bad")
  with pytest.raises(ValueError, match="manifest"):
    load_npy_dir(str(tmp_path / "bad"))
  save_npy_dir(ds.train, str(tmp_path / "ok"))
  np.save(tmp_path / "ok" / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
  with pytest.raises(ValueError, match="x.npy"):  # an object (pickle) array is refused
    load_npy_dir(str(tmp_path / "ok"))
  with pytest.raises(TypeError, match="FederatedData"):
    to_host(np.zeros((3, 4)))


# ----------------------------------------------------------------------------------------------
# CSV results and plots
# ----------------------------------------------------------------------------------------------
def test_run_and_sweep_csv_and_plots(tmp_path):
  ds, model = _problem()
  alg = A.fedavg(model, clients_per_round=5, local_steps=2, batch_size=8)
  dirs = []
  for seed in (0, 1):
    out = str(tmp_path / f"run{seed}")
    h = fd.run(alg, ds, rounds=6, eval_every=3, seed=seed, out_dir=out)
    dirs.append(out)
  metrics = read_csv(os.path.join(dirs[-1], "metrics.csv"))
  np.testing.assert_allclose(metrics["round"], np.arange(1, 7))
  np.testing.assert_allclose(metrics["train_loss"], h.train_metrics["train_loss"], rtol=1e-12)
  assert np.isnan(metrics["accuracy_mean"][0]) and np.isfinite(metrics["accuracy_mean"][2])
  assert metrics["accuracy_worst20"][5] == pytest.approx(h.final["accuracy"]["worst20"])
  clients = read_csv(os.path.join(dirs[-1], "clients.csv"))
  last = clients["round"] == 6
  np.testing.assert_allclose(
    clients["accuracy"][last], h.evaluations[-1]["per_client"]["accuracy"], rtol=1e-12
  )
  assert read_run(dirs[0])["summary"]["algorithm"] == "fedavg"
  res = fd.sweep(
    alg, ds, rounds=3, grid={"client_lr": [0.05, 0.1], "server_lr": [0.5, 1.0]}, seeds=[0, 1]
  )
  sweep_dir = str(tmp_path / "sweep")
  res.save(sweep_dir)
  table = read_csv(os.path.join(sweep_dir, "sweep.csv"))
  assert len(table["seed"]) == 8
  np.testing.assert_allclose(
    table["accuracy_mean"], [s["accuracy"]["mean"] for s in res.final_summary], rtol=1e-12
  )
  assert cli.main(["plot", *dirs, sweep_dir, "--out", str(tmp_path / "plots")]) == 0
  for name in ("curves.png", "clients.png", "sweep_accuracy.png"):
    with open(tmp_path / "plots" / name, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert cli.main(["plot", str(tmp_path / "nothing-here")]) == 2
  assert cli.main(["plot", str(tmp_path)]) == 2  # not a run directory


def test_cli_host_data_and_mesh_flags(tmp_path, capsys):
  jax.devices()  # JAX has started in this process, so --devices cannot add CPU devices here
  out = str(tmp_path / "run")
  args = ["run", "--dataset", "synthetic-classification", "--rounds", "4", "--no-progress"]
  assert cli.main(args + ["--host-data", "--clients-per-round", "5", "--out", out]) == 0
  assert "devices: 1 x cpu" in capsys.readouterr().out
  with open(os.path.join(out, "summary.json")) as f:
    host_summary = json.load(f)
  assert cli.main(args + ["--clients-per-round", "5", "--mesh", "clients=1"]) == 0
  assert "mesh {'sweep': 1, 'clients': 1}" in capsys.readouterr().out
  assert host_summary["final"]["accuracy"]["mean"] > 0.5
  assert cli.main(args + ["--devices", "3"]) == 2
  assert "--devices 3" in capsys.readouterr().err
  assert cli.main(args + ["--devices", "auto"]) == 0  # one device: nothing to shard
  out = capsys.readouterr().out
  assert "devices: 1 x cpu;" in out and "mesh" not in out
  with pytest.raises(SystemExit):
    cli.main(args + ["--devices", "many"])
  assert "positive integer or 'auto'" in capsys.readouterr().err
  assert cli.main(args + ["--coordinator", "127.0.0.1:1"]) == 2
  assert "must be given together" in capsys.readouterr().err


CHUNKED_ON_A_MESH = """
from fedjax_dro.core import clients
from fedjax_dro.core.clients import memory_budget_limit
ds, model = problem()   # 20 clients, full participation below
out = {}
for name in ("fedavg", "scaffold"):
  alg = A.get_algorithm(name).factory(model, local_steps=3, batch_size=8, backend="chunked",
                                      chunk_size=4)
  base = fd.run(alg, ds, rounds=3, eval_every=3)
  h = fd.run(alg, ds, rounds=3, eval_every=3, mesh=make_mesh(clients=2))
  out[name] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                  for a, b in zip(jax.tree.leaves(h.final_state), jax.tree.leaves(base.final_state)))
  text = fd.compile_rounds(alg, ds, rounds=1, mesh=make_mesh(clients=2)).as_text()
  data_shape = "[" + ",".join(map(str, ds.train.x.shape)) + "]"
  gathers = [l for l in text.splitlines() if "all-gather(" in l]
  out[name + " all-gather"] = [l.strip()[:120] for l in gathers if data_shape in l]
# auto under a tiny budget on the mesh: chunks that split evenly over the 2 devices
clients.recent_plans.clear()
with memory_budget_limit(60_000):
  fd.compile_rounds(A.fedavg(model, local_steps=3, batch_size=8), ds, rounds=1,
                    mesh=make_mesh(clients=2))
out["plans"] = [(p.backend, p.chunk_size) for p in clients.recent_plans if p.num_clients == 20]
print(json.dumps(out))
"""


def test_chunked_rounds_on_a_mesh_keep_the_data_sharded():
  """Chunks of clients are strided over the client axis, so with the clients split over two
  devices each device runs its half of every chunk: no all-gather of the data (contiguous chunks
  made XLA gather all clients onto every device and run every chunk twice), results of one
  device; ``auto`` plans chunk sizes that are multiples of the device count and divide n."""
  out = _result(_python(CHUNKED_ON_A_MESH, devices=2))
  for name in ("fedavg", "scaffold"):
    assert out[name] <= 1e-6, out
    assert not out[name + " all-gather"], out  # the clients' data is never gathered
  assert out["plans"], out
  for backend, size in out["plans"]:
    assert backend == "chunked" and size % 2 == 0 and 20 % size == 0, out["plans"]


def test_sharded_chunk_size():
  from fedjax_dro.core.clients import sharded_chunk_size

  assert sharded_chunk_size(1000, 10, 1) == 10
  assert sharded_chunk_size(1000, 10, 2) == 20  # 50 chunks of 10 per device
  assert sharded_chunk_size(1000, 1, 2) == 2
  assert sharded_chunk_size(1000, 600, 2) is None  # all at once
  assert sharded_chunk_size(24, 3, 4) == 12  # 2 chunks of 12 (3 per device)
  assert sharded_chunk_size(999, 10, 2) == 10  # odd n: no even split exists


# ----------------------------------------------------------------------------------------------
# --devices N|auto: one JAX device per CPU core
# ----------------------------------------------------------------------------------------------
def test_even_devices_and_auto_mesh():
  assert [even_devices(n, 4) for n in (1, 2, 3, 4, 6, 9, 20, 30, 7)] == [1, 2, 3, 4, 3, 3, 4, 3, 1]
  assert even_devices(30, 2) == 2 and even_devices(31, 8) == 1 and even_devices(12, 1) == 1
  for bad in (0, -1, 2.0, True):
    with pytest.raises(ValueError, match="size must be a positive integer"):
      even_devices(bad, 4)
    with pytest.raises(ValueError, match="available must be a positive integer"):
      even_devices(4, bad)
  # this process has one device: auto shards nothing, whatever the sizes
  assert parse_mesh(None, "auto", num_clients=20, num_configs=8) is None
  assert local_cpu_cores() >= 1


def test_request_cpu_devices_after_start_and_under_xla_flags(monkeypatch):
  jax.devices()
  for bad in (0, -2, 1.5, True, "2"):
    with pytest.raises(ValueError, match="count must be a positive integer"):
      request_cpu_devices(bad)
  assert request_cpu_devices(2) is False  # JAX has started: left as it is
  assert len(jax.devices()) == 1
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
  assert request_cpu_devices(2) is False  # the user's XLA_FLAGS stay in charge


AUTO_MESHES = """
from fedjax_dro.engine.sharding import parse_mesh
shape = lambda m: None if m is None else dict(m.shape)
print(json.dumps({
  "clients20": shape(parse_mesh(None, "auto", num_clients=20)),
  "clients30": shape(parse_mesh(None, "auto", num_clients=30)),
  "prime": shape(parse_mesh(None, "auto", num_clients=7)),
  "configs8": shape(parse_mesh(None, "auto", num_clients=20, num_configs=8)),
  "configs6": shape(parse_mesh(None, "auto", num_clients=20, num_configs=6)),
  "configs6_clients7": shape(parse_mesh(None, "auto", num_clients=7, num_configs=6)),
  "spec": shape(parse_mesh("sweep=2", "auto")),
}))
"""


def test_auto_mesh_on_four_devices():
  out = _result(_python(AUTO_MESHES, devices=4))
  assert out == {
    "clients20": {"sweep": 1, "clients": 4},
    "clients30": {"sweep": 1, "clients": 3},
    "prime": None,
    "configs8": {"sweep": 4, "clients": 1},  # configurations split over as many: no reduction
    "configs6": {"sweep": 1, "clients": 4},  # 6 rows over 3 devices < 20 clients over 4
    "configs6_clients7": {"sweep": 3, "clients": 1},
    "spec": {"sweep": 2, "clients": 1},
  }


def _cli(*argv, timeout=240):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run(
    [sys.executable, "-m", "fedjax_dro", *argv],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


def test_cli_devices_split_the_cpu_without_xla_flags():
  common = ["--rounds", "2", "--no-progress", "--local-steps", "1"]
  out = _cli("run", "--devices", "2", *common)  # synthetic-ridge: 30 clients
  assert "devices: 2 x cpu, mesh {'sweep': 1, 'clients': 2}" in out
  out = _cli("run", "--devices", "auto", "--host-data", *common)  # host data runs on one device
  assert "mesh" not in out.splitlines()[0]
  out = _cli("run", "--devices", "auto", *common)
  count = even_devices(30, local_cpu_cores())
  if count > 1:
    assert f"mesh {{'sweep': 1, 'clients': {count}}}" in out
  else:
    assert "devices: 1 x cpu;" in out and "mesh" not in out
  sweep = ["sweep", "--grid", "client_lr=0.01,0.02", "--seeds", "0", "--rounds", "2"]
  out = _cli(*sweep, "--devices", "2")
  assert "devices: 2 x cpu, mesh {'sweep': 1, 'clients': 2}" in out
  out = _cli(*sweep, "--devices", "auto")  # 2 configurations: split them, not the clients
  count = even_devices(2, local_cpu_cores())
  if count > 1:
    assert f"mesh {{'sweep': {count}, 'clients': 1}}" in out
  else:
    assert "devices: 1 x cpu;" in out and "mesh" not in out
