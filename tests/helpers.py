"""Small shared builders for tests (float64 data, numpy oracles)."""

import os
import subprocess
import sys

import numpy as np

from fedjax_dro import models
from fedjax_dro.data import FederatedDataset, from_client_arrays


def regression_clients(n=6, d=3, sizes=None, seed=0, shift=1.0):
  """Heterogeneous linear-regression clients (float64)."""
  rng = np.random.default_rng(seed)
  sizes = sizes or [int(s) for s in rng.integers(5, 20, n)]
  xs, ys = [], []
  for i, m in enumerate(sizes):
    x = rng.normal(size=(m, d)) + shift * rng.normal(size=d)
    w = rng.normal(size=d) * (1 + shift * i / n)
    xs.append(x)
    ys.append(x @ w + 0.1 * rng.normal(size=m) + shift * i)
  return from_client_arrays(xs, ys, dtype=np.float64)


def dataset(train, test=None, task="regression", num_classes=None):
  return FederatedDataset(
    train=train, test=test if test is not None else train, task=task, num_classes=num_classes
  )


def linreg(d, l2=0.0):
  return models.linear_regression(d, l2=l2, fit_intercept=True)


def numpy_linreg_grad(w, b, x, y, l2):
  """Gradient of mean 0.5 (x.w + b - y)^2 + l2/2 (||w||^2 + b^2)."""
  r = x @ w + b - y
  return x.T @ r / len(y) + l2 * w, np.mean(r) + l2 * b


def run_float32(code: str) -> None:
  """Runs ``code`` in a fresh Python with JAX's x64 off (float32 defaults) and the repository on
  the path; asserts it exits cleanly and prints ``ok``."""
  env = dict(os.environ, JAX_ENABLE_X64="0")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  res = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
  )
  assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def load_benchmark(name: str):
  """The module ``benchmarks/<name>.py``, loaded from its file, or a module of
  ``benchmarks/speedlib/`` by its dotted name (``"speedlib.roofline"``). ``benchmarks/`` goes on
  ``sys.path`` so the scripts' own imports (``from speedlib import ...``) resolve."""
  import importlib
  import importlib.util
  import pathlib

  bench_dir = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
  if str(bench_dir) not in sys.path:
    sys.path.insert(0, str(bench_dir))
  if "." in name:
    return importlib.import_module(name)
  spec = importlib.util.spec_from_file_location(name, bench_dir / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def numpy_epoch_batches(x, y, num_examples: int, key, batch_size: int, epochs: int):
  """One client's ``local_epochs`` minibatches for a reference loop: each epoch's order of its
  ``num_examples`` rows from the simulator's key schedule (``epoch_permutations``), cut here into
  consecutive batches of ``batch_size`` (the last one partial). ``x``, ``y``: the client's padded
  rows (NumPy)."""
  from fedjax_dro.core.sampling import epoch_permutations

  perms = np.asarray(epoch_permutations(key, num_examples, x.shape[0], epochs))
  for e in range(epochs):
    order = perms[e, :num_examples]
    for start in range(0, num_examples, batch_size):
      rows = order[start : start + batch_size]
      yield x[rows], y[rows]


def has_module(module: str) -> bool:
  """Whether ``module`` imports here (an optional extra installed)."""
  try:
    __import__(module)
  except ImportError:
    return False
  return True
