"""Experiment tracking: what a run sends to its loggers, read back from TensorBoard's event files
and MLflow's file store, equals ``metrics.jsonl`` (TensorBoard: to float32); the CLI's
``--log-to`` for runs and sweeps; unknown trackers and missing extras are clear errors."""

import glob
import json
import os
import struct
import sys

import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro import algorithms as A, cli, models
from fedjax_dro.data import synthetic_classification
from fedjax_dro.records import Logger, MLflowLogger, TensorBoardLogger
from fedjax_dro.records.loggers import check_loggers, parse_log_to, sweep_row_name
from tests.helpers import has_module

QUANTILES = ["q10", "q25", "q50", "q75", "q90"]


def _problem():
  ds = synthetic_classification(seed=0, num_clients=6, examples_per_class=20)
  model = models.softmax_regression(ds.train.x.shape[-1], ds.num_classes)
  return ds, A.fedavg(model, clients_per_round=3, local_steps=2, batch_size=4)


def _jsonl(out_dir):
  """``(round records, eval records)`` of a run's metrics.jsonl."""
  with open(os.path.join(out_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return [r for r in records if r["type"] == "round"], [r for r in records if r["type"] == "eval"]


def _expected_scalars(out_dir):
  """``{(tag, step): value}`` that the loggers should hold, from metrics.jsonl alone."""
  rounds, evals = _jsonl(out_dir)
  want = {}
  for r in rounds:
    for k, v in r.items():
      if k not in ("type", "round", "nonfinite") and v is not None:
        want[(f"train/{k}", r["round"])] = v
  for e in evals:
    for metric, stats in e["summary"].items():
      for stat, v in stats.items():
        if v is not None:
          want[(f"eval/{metric}/{stat}", e["round"])] = v
  return want


class Recorder:
  """A logger that keeps what it is given."""

  def __init__(self):
    self.scalars, self.histograms, self.closed = {}, {}, False

  def log_scalars(self, step, scalars):
    for k, v in scalars.items():
      assert (k, step) not in self.scalars, (k, step)
      self.scalars[(k, step)] = v

  def log_histogram(self, step, name, values):
    self.histograms[(name, step)] = np.asarray(values)

  def close(self):
    self.closed = True


def test_run_sends_loggers_what_metrics_jsonl_holds(tmp_path):
  ds, alg = _problem()
  rec = Recorder()
  assert isinstance(rec, Logger)
  hist = fd.run(alg, ds, rounds=5, eval_every=2, out_dir=str(tmp_path), loggers=[rec])
  want = _expected_scalars(str(tmp_path))
  assert set(rec.scalars) == set(want)
  for key, v in want.items():
    assert rec.scalars[key] == v, key
  # every round once; the evaluations at rounds 2, 4, 5 with the fairness quantiles
  assert sorted(s for (k, s) in rec.scalars if k == "train/train_loss") == [1, 2, 3, 4, 5]
  for q in QUANTILES:
    assert ("eval/accuracy/" + q, 5) in rec.scalars
  _, evals = _jsonl(str(tmp_path))
  assert [e["round"] for e in evals] == [2, 4, 5]
  for e in evals:
    for metric, values in e["per_client"].items():
      np.testing.assert_array_equal(rec.histograms[(f"eval/{metric}", e["round"])], values)
  assert not rec.closed  # the caller's logger stays open
  assert len(hist.evaluations) == 3


def test_check_loggers_names_the_bad_one():
  assert check_loggers(None) == []
  with pytest.raises(TypeError, match=r"loggers\[1\] \(object\) lacks log_scalars"):
    check_loggers([Recorder(), object()])
  with pytest.raises(TypeError, match="loggers must be a list"):
    check_loggers("tensorboard")
  ds, alg = _problem()
  with pytest.raises(TypeError, match=r"loggers\[0\]"):
    fd.run(alg, ds, rounds=1, loggers=[42])


# ----------------------------------------------------------------------------------------------
# TensorBoard event files, read back without TensorFlow
# ----------------------------------------------------------------------------------------------
def _tfrecords(path):
  """The payloads of a TFRecord file (u64 length, u32 length CRC, data, u32 data CRC)."""
  with open(path, "rb") as f:
    blob = f.read()
  pos, out = 0, []
  while pos < len(blob):
    (length,) = struct.unpack("<Q", blob[pos : pos + 8])
    out.append(blob[pos + 12 : pos + 12 + length])
    pos += 12 + length + 4
  assert pos == len(blob)
  return out


def _read_tensorboard(log_dir):
  """``({(tag, step): float32 value}, {(tag, step): HistogramProto})`` of a directory's events."""
  from tensorboardX.proto import event_pb2

  scalars, histograms = {}, {}
  files = glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
  assert files, os.listdir(log_dir)
  for path in files:
    for payload in _tfrecords(path):
      event = event_pb2.Event.FromString(payload)
      for value in event.summary.value:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
          scalars[(value.tag, event.step)] = value.simple_value
        elif kind == "histo":
          histograms[(value.tag, event.step)] = value.histo
  return scalars, histograms


def _check_tensorboard(log_dir, out_dir):
  scalars, histograms = _read_tensorboard(log_dir)
  want = _expected_scalars(out_dir)
  assert set(scalars) == set(want)
  for key, v in want.items():
    assert scalars[key] == np.float32(v), (key, scalars[key], v)  # TensorBoard stores float32
  _, evals = _jsonl(out_dir)
  for e in evals:
    for metric, values in e["per_client"].items():
      values = np.asarray([v for v in values if v is not None], np.float64)
      h = histograms[(f"eval/{metric}", e["round"])]
      assert h.num == len(values)
      np.testing.assert_allclose([h.min, h.max], [values.min(), values.max()], rtol=1e-6)
      np.testing.assert_allclose(h.sum, values.sum(), rtol=1e-6)
      assert sum(h.bucket) == len(values)


def test_tensorboard_event_file_reads_back_metrics_jsonl(tmp_path):
  pytest.importorskip("tensorboardX")
  ds, alg = _problem()
  out, tb = str(tmp_path / "out"), str(tmp_path / "tb")
  with TensorBoardLogger(tb) as logger:
    fd.run(alg, ds, rounds=5, eval_every=2, out_dir=out, loggers=[logger])
  _check_tensorboard(tb, out)


# ----------------------------------------------------------------------------------------------
# MLflow's file store
# ----------------------------------------------------------------------------------------------
def _check_mlflow(tracking_dir, out_dir, run_name):
  from mlflow.tracking import MlflowClient

  client = MlflowClient(tracking_uri="file:" + os.path.abspath(tracking_dir))
  experiment = client.get_experiment_by_name("fedjax-dro")
  (run,) = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{run_name}'")
  assert run.info.status == "FINISHED"
  want = _expected_scalars(out_dir)
  got = {}
  for key in run.data.metrics:
    for m in client.get_metric_history(run.info.run_id, key):
      got[(key, m.step)] = m.value
  assert got == want  # float64 values, exactly
  # the plain files of the store agree: metrics/<name> holds "timestamp value step" lines
  run_dir = os.path.join(tracking_dir, experiment.experiment_id, run.info.run_id)
  _, evals = _jsonl(out_dir)
  metric = "accuracy" if "accuracy" in evals[0]["per_client"] else "r2"
  with open(os.path.join(run_dir, "metrics", "eval", metric, "q10")) as f:
    lines = [line.split() for line in f]
  assert {int(s): float(v) for _, v, s in lines} == {
    step: v for (k, step), v in want.items() if k == f"eval/{metric}/q10"
  }
  for e in evals:
    path = os.path.join(run_dir, "artifacts", "per_client", metric, f"step_{e['round']:08d}.json")
    with open(path) as f:
      assert json.load(f) == {"step": e["round"], "values": e["per_client"][metric]}
  return run


def test_mlflow_file_store_reads_back_metrics_jsonl(tmp_path):
  pytest.importorskip("mlflow")
  ds, alg = _problem()
  out, store = str(tmp_path / "out"), str(tmp_path / "mlruns")
  with MLflowLogger(store, run_name="fedavg-test", params={"client_lr": 0.1}) as logger:
    fd.run(alg, ds, rounds=5, eval_every=2, out_dir=out, loggers=[logger])
  run = _check_mlflow(store, out, "fedavg-test")
  assert run.data.params == {"client_lr": "0.1"}


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def _only_dir(pattern):
  found = glob.glob(pattern)
  assert len(found) == 1, found
  return found[0]


def test_cli_run_log_to_tensorboard_and_mlflow(tmp_path, capsys):
  pytest.importorskip("tensorboardX")
  trackers = "tensorboard,mlflow" if has_module("mlflow") else "tensorboard"
  out, logs = str(tmp_path / "out"), str(tmp_path / "logs")
  argv = ["run", "--rounds", "4", "--eval-every", "2", "--no-progress", "--out", out]
  assert cli.main(argv + ["--log-to", trackers, "--log-dir", logs]) == 0
  assert "logging to" in capsys.readouterr().out
  _check_tensorboard(_only_dir(os.path.join(logs, "tensorboard", "*")), out)
  if has_module("mlflow"):
    name = os.path.basename(_only_dir(os.path.join(logs, "tensorboard", "*")))
    _check_mlflow(os.path.join(logs, "mlruns"), out, name)


def test_cli_sweep_logs_one_run_per_row(tmp_path, capsys):
  pytest.importorskip("tensorboardX")
  logs, out = str(tmp_path / "logs"), str(tmp_path / "out")
  argv = ["sweep", "--rounds", "3", "--grid", "client_lr=0.01,0.1", "--seeds", "0,1"]
  assert cli.main(argv + ["--out", out, "--log-to", "tensorboard", "--log-dir", logs]) == 0
  assert "logged 4 rows" in capsys.readouterr().out
  with open(os.path.join(out, "sweep.json")) as f:
    saved = json.load(f)
  final = saved["final"]
  assert saved["metadata"] == {"data_seed": 0}
  # every row's run is named by its hyper-parameters and training seed
  rows = sorted(glob.glob(os.path.join(logs, "tensorboard", "*", "client_lr=*")))
  assert [os.path.basename(r) for r in rows] == [
    "client_lr=0.01,seed=0",
    "client_lr=0.01,seed=1",
    "client_lr=0.1,seed=0",
    "client_lr=0.1,seed=1",
  ]
  for i, config in enumerate(saved["configs"]):
    row_dir = [r for r in rows if os.path.basename(r) == sweep_row_name(config)][0]
    scalars, histograms = _read_tensorboard(row_dir)
    assert sorted(s for (k, s) in scalars if k == "train/train_loss") == [1, 2, 3]
    for stat in ["mean", "worst20"] + QUANTILES:
      assert scalars[(f"eval/r2/{stat}", 3)] == np.float32(final[i]["r2"][stat])
    assert ("eval/r2", 3) in histograms


def test_log_sweep_rows_read_back(tmp_path):
  pytest.importorskip("tensorboardX")
  ds, alg = _problem()
  # fd.sweep(loggers=...) logs every row as the sweep ends (log_sweep)
  res = fd.sweep(
    alg,
    ds,
    rounds=3,
    grid={"client_lr": [0.05, 0.2]},
    seeds=[0],
    loggers=lambda row, config: [TensorBoardLogger(str(tmp_path / f"row{row}"))],
  )
  with pytest.raises(TypeError, match="loggers"):
    fd.sweep(alg, ds, rounds=1, loggers=[TensorBoardLogger(str(tmp_path / "x"))])
  for i in range(2):
    scalars, histograms = _read_tensorboard(str(tmp_path / f"row{i}"))
    curve = [scalars[("train/train_loss", r)] for r in (1, 2, 3)]
    np.testing.assert_array_equal(curve, np.float32(res.train_metrics["train_loss"][i]))
    for stat, v in res.final_summary[i]["accuracy"].items():
      assert scalars[(f"eval/accuracy/{stat}", 3)] == np.float32(v)
    h = histograms[("eval/accuracy", 3)]
    assert h.num == ds.num_clients
    np.testing.assert_allclose(h.sum, res.final_per_client["accuracy"][i].sum(), rtol=1e-6)


def test_unknown_tracker_and_missing_extra_are_clear_errors(tmp_path, capsys, monkeypatch):
  with pytest.raises(ValueError, match="--log-to expects .*tensorboard, mlflow, got 'wandb'"):
    parse_log_to("tensorboard,wandb")
  with pytest.raises(ValueError, match="twice"):
    parse_log_to("mlflow,mlflow")
  assert cli.main(["run", "--rounds", "1", "--log-to", "wandb", "--no-progress"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: --log-to") and "wandb" in err and "\n" not in err
  assert cli.main(["run", "--rounds", "1", "--log-dir", str(tmp_path), "--no-progress"]) == 2
  assert "--log-dir is given but --log-to is not" in capsys.readouterr().err
  # the library missing: an error naming the extra to install (a None entry blocks the import)
  monkeypatch.setitem(sys.modules, "tensorboardX", None)
  monkeypatch.setitem(sys.modules, "mlflow", None)
  with pytest.raises(ModuleNotFoundError, match=r'pip install "fedjax_dro\[tensorboard\]"'):
    TensorBoardLogger(str(tmp_path / "tb"))
  with pytest.raises(ModuleNotFoundError, match=r'pip install "fedjax_dro\[mlflow\]"'):
    MLflowLogger(str(tmp_path / "mlruns"))
  monkeypatch.chdir(tmp_path)  # where the default --log-dir would go
  assert cli.main(["run", "--rounds", "1", "--log-to", "mlflow", "--no-progress"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: --log-to") and "fedjax_dro[mlflow]" in err, err
  assert not os.path.exists(tmp_path / "fedjax-dro-logs")  # a refused command creates nothing
  assert not os.path.exists(tmp_path / "tb")


def tensorboard_disk_full_behaviour(tmp_path=None):
  """The disk fills under TensorBoard's event file (its writes fail with ENOSPC, also from
  tensorboardX's writer thread and at exit): the CLI ends with exit 1 and one line naming the
  event file, and no traceback, not even at interpreter exit (a row of the bad-input table,
  tested there: tests/test_bad_inputs.py)."""
  import pathlib
  import subprocess
  import tempfile

  pytest.importorskip("tensorboardX")
  if tmp_path is None:
    with tempfile.TemporaryDirectory(prefix="fedjax-dro-tb-full-") as tmp:
      return tensorboard_disk_full_behaviour(pathlib.Path(tmp))
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  script = f"""
import errno, os, sys
import tensorboardX.record_writer as rw

class Full:
  def __init__(self, path):
    self.f = open(path, "wb")
  def write(self, data):
    return len(data)
  def flush(self):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  def fileno(self):
    return self.f.fileno()
  def close(self):
    self.f.close()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

rw.open_file = Full
from fedjax_dro import cli
sys.exit(cli.main(["run", "--rounds", "4", "--eval-every", "2", "--no-progress",
                   "--log-to", "tensorboard", "--out", {str(tmp_path / "out")!r}]))
"""
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run(
    [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
  )
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith("error: cannot write ") and "events.out.tfevents" in lines[0]
  assert "No space left on device (ENOSPC)" in lines[0]


def test_a_tracked_run_carries_its_full_configuration():
  """The parameters of a CLI run: algorithm, dataset, data and training seeds, rounds, every
  setting and hyper-parameter (defaults included, floats as given) and the package version."""
  import argparse

  from fedjax_dro import __version__

  ds, alg = _problem()
  args = argparse.Namespace(data_seed=3, seed=7, rounds=20)
  params = cli.tracking_params(alg, ds, args, {"client_lr": 0.1})
  assert params["algorithm"] == "fedavg" and params["dataset"] == ds.name
  assert params["data_seed"] == 3 and params["seed"] == 7 and params["rounds"] == 20
  assert params["hparam.client_lr"] == 0.1 and params["hparam.server_lr"] == 1.0
  assert params["setting.clients_per_round"] == 3 and params["setting.local_steps"] == 2
  assert params["fedjax_dro_version"] == __version__
  assert sweep_row_name({"hparams": {"client_lr": 0.1, "q": 2.0}, "seed": 1}) == (
    "client_lr=0.1,q=2,seed=1"
  )
