"""The viewer commands of the tracking page work on what a run logged: ``tensorboard`` and
``mlflow ui`` are started on a free local port against a CLI run's files, their index page and
their list of runs / experiments are fetched, and they are stopped (skipped where a viewer is
not installed: ``pip install "fedjax_dro[tensorboard]"``, ``pip install mlflow``)."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from fedjax_dro import cli
from tests.helpers import has_module


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _fetch_while_serving(cmd, port, paths, env=None, timeout=120):
  """Starts ``cmd``, fetches ``paths`` once the server answers, stops it; the bodies."""
  proc = subprocess.Popen(
    cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
  )
  try:
    deadline, bodies = time.monotonic() + timeout, []
    for path in paths:
      while True:
        assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
        try:
          with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            assert r.status == 200
            bodies.append(r.read().decode("utf-8", "replace"))
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
          assert time.monotonic() < deadline, f"{cmd[0]} did not answer {path} in {timeout} s"
          time.sleep(0.5)
    return bodies
  finally:
    proc.terminate()
    try:
      proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      proc.kill()


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("viewers") / "run")
  trackers = [
    t for t, m in (("tensorboard", "tensorboardX"), ("mlflow", "mlflow")) if has_module(m)
  ]
  if not trackers:
    pytest.skip("no tracker library installed")
  argv = ["run", "--rounds", "4", "--no-progress", "--out", out, "--log-to", ",".join(trackers)]
  assert cli.main(argv) == 0
  return out


@pytest.mark.skipif(shutil.which("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_serves_the_logged_run(logged):
  port = _free_port()
  cmd = ["tensorboard", "--logdir", os.path.join(logged, "tensorboard"), "--port", str(port)]
  index, runs = _fetch_while_serving(cmd + ["--host", "127.0.0.1"], port, ["/", "/data/runs"])
  assert "<html" in index.lower()
  names = json.loads(runs)
  assert len(names) == 1 and names[0].startswith("fedavg-synthetic-ridge-d0-s0-")


@pytest.mark.skipif(
  shutil.which("mlflow") is None, reason="the full mlflow package is not installed"
)
def test_mlflow_ui_serves_the_logged_run(logged):
  pytest.importorskip("flask")  # mlflow-skinny has the `mlflow` command but no UI server
  port = _free_port()
  store = "file:" + os.path.join(logged, "mlruns")
  cmd = ["mlflow", "ui", "--backend-store-uri", store, "--host", "127.0.0.1", "--port", str(port)]
  index, experiments = _fetch_while_serving(
    cmd,
    port,
    ["/", "/ajax-api/2.0/mlflow/experiments/search?max_results=10"],
    env={"MLFLOW_ALLOW_FILE_STORE": "true"},
  )
  assert "<html" in index.lower()
  assert "fedjax-dro" in [e["name"] for e in json.loads(experiments)["experiments"]]
