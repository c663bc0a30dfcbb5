"""Bad input gets a clear ValueError / TypeError naming the argument (never an XLA traceback).

``CASES`` (Python API) and ``CLI_CASES`` (command line) are the table of distinct bad inputs;
``docs/bad_inputs.md`` lists them (``python -m tests.test_bad_inputs`` prints that table; a test
keeps the two in sync). Every case asserts the exception type (or, for the CLI, exit status 2 and
a one-line ``error:``) and that the message names the argument. The file runs over 600 lines
because it is one table: its rows stay together, in the order the docs list them.
"""

import os
import tempfile

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, cli, compare as C, models, privacy as P, run, sweep
from fedjax_dro.data import (
  dirichlet_partition,
  from_arrays,
  from_client_arrays,
  get_dataset,
  load_cifar10,
  load_cifar100,
  load_features,
  load_leaf_json,
  load_tiny_imagenet,
  train_test_split,
  validate_data,
  write_features,
)
from fedjax_dro.data.user_cifar import write_cifar10_bin, write_cifar100_bin
from tests.data import hostile_prepared as H
from tests.helpers import dataset, linreg, regression_clients
from tests.records.test_checkpoint_manifest import CHECKPOINT_CASES, resume_line_behaviour
from tests.records.test_io_errors import disk_full_behaviour
from tests.records.test_loggers import tensorboard_disk_full_behaviour
from tests.test_cli import one_writer_behaviour

DATA = regression_clients(n=4, d=2, seed=0)
RNG = np.random.default_rng(0)


def _with_nan(x, index):
  x = np.array(x)  # a writable copy
  x[index] = np.nan
  return x


def _clients(d=2, n=3, m=6, labels=None, x_dtype=np.float64):
  xs = [RNG.normal(size=(m, d)).astype(x_dtype) for _ in range(n)]
  ys = [labels(m) if labels else RNG.normal(size=m) for _ in range(n)]
  return xs, ys


def _classes(k, n=3, m=6, d=2, **kw):
  xs, ys = _clients(d=d, n=n, m=m, labels=lambda m: np.arange(m) % k, **kw)
  return from_client_arrays(xs, ys)


def _fedavg(model=None):
  return A.fedavg(model or linreg(2))


def _uniform_fedavg():
  return A.fedavg(linreg(2), weighting="uniform")


def _run(**kw):
  kw.setdefault("rounds", 1)
  return run(kw.pop("alg", None) or _fedavg(), kw.pop("data", None) or dataset(DATA), **kw)


def _sweep(**kw):
  kw.setdefault("rounds", 1)
  return sweep(_fedavg(), dataset(DATA), **kw)


_TMP = []


def _fresh_dir() -> str:
  """A new empty folder under one temporary folder of this module (removed at exit)."""
  if not _TMP:
    _TMP.append(tempfile.TemporaryDirectory(prefix="fedjax-dro-bad-inputs-"))
  return tempfile.mkdtemp(dir=_TMP[0].name)


def _edited(folder, name, edit):
  """Rewrites the file ``name`` of ``folder`` as ``edit(its bytes)``; returns ``folder``."""
  path = os.path.join(folder, name)
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(edit(data))
  return folder


def _cifar10_with(name, edit):
  images = np.zeros((5, 32, 32, 3), np.uint8)
  names = [f"class {k}" for k in range(10)]
  folder = write_cifar10_bin(
    _fresh_dir(), images, np.arange(5), images[:2], [0, 9], class_names=names
  )
  return load_cifar10(_edited(folder, name, edit))


def _cifar100_with(name, edit, **kw):
  images = np.zeros((2, 32, 32, 3), np.uint8)
  folder = write_cifar100_bin(_fresh_dir(), images, [0, 99], images, [5, 6])
  return load_cifar100(_edited(folder, name, edit), **kw)


def _npz(name, loader, **arrays):
  path = os.path.join(_fresh_dir(), name)
  np.savez(path, **arrays)
  return loader(path)


def _features_file(**arrays):
  return _npz("features.npz", load_features, **arrays)


def _leaf_text(text):
  """``load_leaf_json`` of a file holding ``text``."""
  path = os.path.join(_fresh_dir(), "leaf.json")
  with open(path, "w") as f:
    f.write(text)
  return load_leaf_json(path)


_LEAF_HEAD = '{"users": ["u"], "num_samples": [1], "user_data": {"u": {"x": '


def _tiny_npz(**change):
  x = np.zeros((2, 64, 64, 3), np.uint8)
  arrays = {"x_train": x, "y_train": [0, 1], "x_test": x, "y_test": [1, 0], **change}
  return _npz("tiny.npz", load_tiny_imagenet, **arrays)


def _tiny_folder(annotations="v.png\tn1\t0\t0\t63\t63\n", train_size=64):
  from PIL import Image

  root = _fresh_dir()
  with open(os.path.join(root, "wnids.txt"), "w") as f:
    f.write("n1\n")
  for folder, name, size in (("train/n1/images", "a.png", train_size), ("val/images", "v.png", 64)):
    os.makedirs(os.path.join(root, folder))
    Image.fromarray(np.zeros((size, size, 3), np.uint8)).save(os.path.join(root, folder, name))
  with open(os.path.join(root, "val", "val_annotations.txt"), "w") as f:
    f.write(annotations)
  return load_tiny_imagenet(root)


F32_X = np.zeros((4, 2), np.float32)
Y4 = np.array([0, 1, 1, 0])


F32_PARAMS = {"w": np.zeros(2, np.float32), "b": np.zeros((), np.float32)}
_FILE = os.path.abspath(__file__)


def _toml(text: str) -> str:
  """A config file of ``text`` in a fresh folder (for the ``compare`` rows)."""
  path = os.path.join(tempfile.mkdtemp(prefix="fedjax_dro_bad_"), "c.toml")
  with open(path, "w") as f:
    f.write(text)
  return path


def _optax():
  import optax

  return optax


def _nnx_with_cache(rngs):
  from flax import nnx

  class WithCache(nnx.Module):
    def __init__(self, rngs):
      self.lin = nnx.Linear(2, 2, rngs=rngs)
      self.seen = nnx.Cache(jnp.zeros(2))

    def __call__(self, x):
      return self.lin(x)

  return WithCache(rngs)


def _linen_batch_norm_without_train_flag():
  import flax.linen as nn

  class NoTrainFlag(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.BatchNorm(use_running_average=True)(nn.Dense(2)(x))

  return NoTrainFlag()


_STRATEGY = '[[strategy]]\nlabel = "A"\nalgorithm = "fedavg"\n'


# description: (callable, exception type, fragment naming the argument)
def _stateful_model():
  """A model declaring batch statistics (what the settings' checks read)."""
  return linreg(2)._replace(name="bn_model", state_keys=("batch_stats",), state_masked=True)


CASES = {
  "from_flax of a module with batch statistics (BatchNorm) and no train keyword": (
    lambda: models.from_flax(_linen_batch_norm_without_train_flag(), np.zeros((1, 2), np.float32)),
    ValueError,
    "train",
  ),
  # ---- building federated data ----
  "ragged feature shapes": (
    lambda: from_client_arrays([np.zeros((3, 2)), np.zeros((3, 4))], [np.zeros(3), np.zeros(3)]),
    ValueError,
    "xs[1]",
  ),
  "ragged label shapes": (
    lambda: from_client_arrays([np.zeros((3, 2))] * 2, [np.zeros(3), np.zeros((3, 2))]),
    ValueError,
    "ys[1]",
  ),
  "x / y row mismatch": (
    lambda: from_client_arrays([np.zeros((3, 2))], [np.zeros(4)]),
    ValueError,
    "ys[0]",
  ),
  "empty client": (
    lambda: from_client_arrays([np.zeros((3, 2)), np.zeros((0, 2))], [np.zeros(3), np.zeros(0)]),
    ValueError,
    "xs[1]",
  ),
  "no clients": (lambda: from_client_arrays([], []), ValueError, "xs"),
  "NaN in features": (
    lambda: from_client_arrays([np.array([[1.0, np.nan]])], [np.zeros(1)]),
    ValueError,
    "xs[0]",
  ),
  "inf in labels": (
    lambda: from_client_arrays([np.zeros((1, 2))], [np.array([np.inf])]),
    ValueError,
    "ys[0]",
  ),
  "complex features": (
    lambda: from_client_arrays(*_clients(x_dtype=np.complex128)),
    TypeError,
    "xs[0]",
  ),
  "complex labels": (
    lambda: from_client_arrays([np.zeros((2, 2))], [np.array([1 + 1j, 2.0])]),
    TypeError,
    "ys[0]",
  ),
  "string labels": (
    lambda: from_client_arrays([np.zeros((2, 2))], [np.array(["cat", "dog"])]),
    TypeError,
    "ys[0]",
  ),
  "string features": (
    lambda: from_client_arrays([np.array([["a", "b"]])], [np.zeros(1)]),
    TypeError,
    "xs[0]",
  ),
  "features beyond float32": (
    lambda: from_client_arrays([np.full((2, 2), 1e300)], [np.zeros(2)], dtype=np.float32),
    ValueError,
    "xs[0]",
  ),
  "integer then float labels": (
    lambda: from_client_arrays([np.zeros((2, 2))] * 2, [np.array([0, 1]), np.array([0.5, 1.0])]),
    TypeError,
    "ys[1]",
  ),
  "integer dtype for x": (
    lambda: from_client_arrays([np.zeros((2, 2))], [np.zeros(2)], dtype=np.int32),
    TypeError,
    "dtype",
  ),
  "max_examples zero": (
    lambda: from_client_arrays([np.zeros((2, 2))], [np.zeros(2)], max_examples=0),
    ValueError,
    "max_examples",
  ),
  "xs not a list": (
    lambda: from_client_arrays(np.zeros((2, 3, 2)), np.zeros((2, 3))),
    TypeError,
    "xs",
  ),
  "client_id float": (
    lambda: from_arrays(np.zeros((4, 2)), np.zeros(4), np.zeros(4)),
    TypeError,
    "client_id",
  ),
  "client_id missing client": (
    lambda: from_arrays(np.zeros((4, 2)), np.zeros(4), np.array([0, 0, 2, 2])),
    ValueError,
    "client_id",
  ),
  "client_id negative": (
    lambda: from_arrays(np.zeros((4, 2)), np.zeros(4), np.array([0, -1, 1, 1])),
    ValueError,
    "client_id",
  ),
  "client_id length": (
    lambda: from_arrays(np.zeros((4, 2)), np.zeros(4), np.array([0, 1])),
    ValueError,
    "client_id",
  ),
  "from_arrays x a scalar": (
    lambda: from_arrays(np.float32(1), np.zeros(3), np.array([0, 1, 2])),
    ValueError,
    "x must have one row",
  ),
  "from_arrays num_clients=10**9 (no loop over it)": (
    lambda: from_arrays(np.zeros((4, 2)), np.zeros(4), np.array([0, 1, 0, 1]), num_clients=10**9),
    ValueError,
    "num_clients",
  ),
  "from_arrays client id 10**12 (no loop over it)": (
    lambda: from_arrays(np.zeros((4, 2)), np.zeros(4), np.array([0, 1, 0, 10**12])),
    ValueError,
    "client_id",
  ),
  "from_arrays empty arrays": (
    lambda: from_arrays(np.zeros((0, 2)), np.zeros(0), np.zeros(0, int)),
    ValueError,
    "x, y and client_id have no rows",
  ),
  "from_arrays num_clients a float": (
    lambda: from_arrays(np.zeros((4, 2)), np.zeros(4), np.array([0, 1, 0, 1]), num_clients=2.0),
    ValueError,
    "num_clients",
  ),
  "non-prefix mask": (
    lambda: validate_data(DATA.replace(mask=DATA.mask[:, ::-1])),
    ValueError,
    "data.mask",
  ),
  "num_examples float": (
    lambda: validate_data(DATA.replace(num_examples=DATA.num_examples.astype(float))),
    TypeError,
    "data.num_examples",
  ),
  "NaN in padded rows": (
    lambda: validate_data(DATA.replace(x=DATA.x.at[3, -1].set(np.nan))),
    ValueError,
    "data.x",
  ),
  "inf in a valid row (checked on the device)": (
    lambda: validate_data(DATA.replace(x=DATA.x.at[1, 0].set(np.inf))),
    ValueError,
    "data.x has NaN or infinite values in clients [1]",
  ),
  "NaN in a valid row of NumPy data": (
    lambda: validate_data(DATA.replace(x=_with_nan(np.asarray(DATA.x), (2, 0)))),
    ValueError,
    "data.x has NaN or infinite values in clients [2]",
  ),
  "FederatedData with complex x": (
    lambda: _run(data=DATA.replace(x=DATA.x.astype(np.complex64))),
    TypeError,
    "data.x",
  ),
  "dirichlet alpha": (
    lambda: dirichlet_partition(np.arange(10) % 2, 2, alpha=0.0),
    ValueError,
    "alpha",
  ),
  "dirichlet float labels": (
    lambda: dirichlet_partition(np.zeros(10), 2, alpha=1.0),
    TypeError,
    "labels",
  ),
  "split fraction": (lambda: train_test_split(DATA, 1.5), ValueError, "test_fraction"),
  "unknown dataset": (lambda: get_dataset("mnist-online"), ValueError, "dataset"),
  # ---- model factories ----
  "num_features zero": (lambda: models.logistic_regression(0), ValueError, "num_features"),
  "l2 below the smallest normal float": (
    lambda: models.linear_regression(3, l2=1e-320),
    ValueError,
    "l2",
  ),
  "num_classes zero": (lambda: models.softmax_regression(3, 0), ValueError, "num_classes"),
  "num_outputs zero": (
    lambda: models.linear_regression(3, num_outputs=0),
    ValueError,
    "num_outputs",
  ),
  "fit_intercept not a bool": (
    lambda: models.linear_regression(3, fit_intercept="yes"),
    TypeError,
    "fit_intercept",
  ),
  "negative l2": (lambda: models.linear_regression(3, l2=-1.0), ValueError, "l2"),
  "NaN l2": (lambda: models.linear_regression(3, l2=float("nan")), ValueError, "l2"),
  "MLP hidden layer of size 0": (lambda: models.mlp((4,), 3, hidden=(0,)), ValueError, "hidden"),
  "MLP hidden as a string": (lambda: models.mlp((4,), 3, hidden="200"), ValueError, "hidden"),
  "MLP negative input_shape": (lambda: models.mlp((-4,), 3), ValueError, "input_shape"),
  "CNN on 1-D input_shape": (lambda: models.cnn((64,), 10), ValueError, "input_shape"),
  "CNN input too small to pool": (lambda: models.cnn((2, 2), 10), ValueError, "input_shape"),
  "CNN dense zero": (lambda: models.cnn((8, 8), 10, dense=0), ValueError, "dense"),
  "flax adapter non-module": (
    lambda: models.from_flax(lambda x: x, np.zeros((1, 2))),
    TypeError,
    "module",
  ),
  "flax adapter unknown loss": (
    lambda: models.from_flax(models.builtin._MLP((4,), 2), np.zeros((1, 2)), loss="hinge"),
    ValueError,
    "loss",
  ),
  "flax adapter string sample_input": (
    lambda: models.from_flax(models.builtin._MLP((4,), 2), np.array([["a", "b"]])),
    TypeError,
    "sample_input",
  ),
  "flax adapter unknown task": (
    lambda: models.from_flax(models.builtin._MLP((4,), 2), np.zeros((1, 2)), task="ranking"),
    ValueError,
    "task",
  ),
  # ---- algorithms ----
  "unknown algorithm": (lambda: A.get_algorithm("fedavgg"), ValueError, "algorithm"),
  "clients_per_round > n": (
    lambda: run(A.fedavg(linreg(2), clients_per_round=9), dataset(DATA), rounds=1),
    ValueError,
    "clients_per_round",
  ),
  "clients_per_round zero": (
    lambda: A.fedavg(linreg(2), clients_per_round=0),
    ValueError,
    "clients_per_round",
  ),
  "unknown backend": (lambda: A.fedavg(linreg(2), backend="pmap"), ValueError, "backend"),
  "negative local steps": (lambda: A.fedavg(linreg(2), local_steps=-3), ValueError, "local_steps"),
  "batch size zero": (lambda: A.fedavg(linreg(2), batch_size=0), ValueError, "batch_size"),
  "bad weighting": (lambda: A.fedavg(linreg(2), weighting="size"), ValueError, "weighting"),
  "unknown model_state": (
    lambda: A.fedavg(linreg(2), model_state="global"),
    ValueError,
    "model_state must be one of",
  ),
  "a model_state the algorithm cannot honour": (
    lambda: A.drfa(_stateful_model(), batch_size=4),
    ValueError,
    "drfa cannot honour model_state='average'",
  ),
  "batch statistics over padding rows (full-batch steps)": (
    lambda: A.fedavg(_stateful_model()._replace(state_masked=False)),
    ValueError,
    "padding rows",
  ),
  "Karula dissimilarity of the wrong size": (
    lambda: run(A.karula(linreg(2), dissimilarity=1.0 - np.eye(3)), dataset(DATA), rounds=1),
    ValueError,
    "dissimilarity",
  ),
  "Karula dissimilarity not square": (
    lambda: A.karula(linreg(2), dissimilarity=np.ones((4, 3))),
    ValueError,
    "dissimilarity",
  ),
  "batch_size=2**63": (lambda: A.fedavg(linreg(2), batch_size=2**63), ValueError, "batch_size"),
  "local_steps=2**31": (lambda: A.fedavg(linreg(2), local_steps=2**31), ValueError, "local_steps"),
  "clients_per_round a bool": (
    lambda: A.fedavg(linreg(2), clients_per_round=True),
    ValueError,
    "clients_per_round",
  ),
  "chunk_size a float": (lambda: A.fedavg(linreg(2), chunk_size=4.0), ValueError, "chunk_size"),
  # ---- model against data (the compatibility check before compiling) ----
  "model for 7 features on data with 2": (
    lambda: _run(alg=_fedavg(models.linear_regression(7))),
    ValueError,
    "data.x",
  ),
  "CNN on 1-D features": (
    lambda: _run(alg=_fedavg(models.cnn((8, 8), 3)), data=_classes(3, d=64)),
    ValueError,
    "data.x",
  ),
  "logistic regression on labels 0..3": (
    lambda: _run(alg=_fedavg(models.logistic_regression(2)), data=_classes(4)),
    ValueError,
    "data.y",
  ),
  "float labels for a classifier": (
    lambda: _run(alg=_fedavg(models.logistic_regression(2)), data=DATA),
    ValueError,
    "data.y",
  ),
  "softmax transposed head on 1-feature data": (
    lambda: _run(
      alg=_fedavg(models.softmax_regression(2, 3, head="transposed")), data=_classes(3, d=1)
    ),
    ValueError,
    "data.x",
  ),
  "softmax labels beyond the classes": (
    lambda: _run(alg=_fedavg(models.softmax_regression(2, 3)), data=_classes(5)),
    ValueError,
    "data.y",
  ),
  "softmax labels negative": (
    lambda: _run(
      alg=_fedavg(models.softmax_regression(2, 3)),
      data=from_client_arrays(*_clients(labels=lambda m: np.arange(m) % 3 - 1)),
    ),
    ValueError,
    "data.y",
  ),
  "regression with 3 outputs on scalar labels": (
    lambda: _run(alg=_fedavg(models.linear_regression(2, num_outputs=3))),
    ValueError,
    "data.y",
  ),
  "eval data of another feature shape": (
    lambda: _run(eval_data=regression_clients(n=4, d=3, seed=1)),
    ValueError,
    "eval_data.x",
  ),
  "eval data client mismatch": (
    lambda: _run(eval_data=regression_clients(n=3, d=2)),
    ValueError,
    "eval_data",
  ),
  "init_params of the wrong shape": (
    lambda: _run(init_params={"w": np.zeros(3), "b": np.zeros(())}),
    ValueError,
    "init_params",
  ),
  "init_params missing a leaf": (
    lambda: _run(init_params={"w": np.zeros(2)}),
    ValueError,
    "init_params",
  ),
  "init_params integer": (
    lambda: _run(init_params={"w": np.zeros(2, int), "b": np.zeros((), int)}),
    TypeError,
    "init_params",
  ),
  "init_params NaN": (
    lambda: _run(init_params={"w": np.full(2, np.nan), "b": np.zeros(())}),
    ValueError,
    "init_params",
  ),
  # ---- hyper-parameters ----
  "hparams not a dict": (lambda: _run(hparams=[0.1]), TypeError, "hparams"),
  "hparams as a string": (lambda: _run(hparams="client_lr=0.1"), TypeError, "hparams"),
  "unknown hparam": (lambda: _run(hparams={"learning_rate": 0.1}), ValueError, "learning_rate"),
  "negative step size": (lambda: _run(hparams={"client_lr": -0.1}), ValueError, "client_lr"),
  "NaN step size": (lambda: _run(hparams={"client_lr": float("nan")}), ValueError, "client_lr"),
  "infinite step size": (lambda: _run(hparams={"client_lr": np.inf}), ValueError, "client_lr"),
  "step size as a string": (lambda: _run(hparams={"client_lr": "0.1"}), TypeError, "client_lr"),
  "step size as a bool": (lambda: _run(hparams={"client_lr": True}), TypeError, "client_lr"),
  "complex step size": (lambda: _run(hparams={"client_lr": 0.1j}), TypeError, "client_lr"),
  "step size array in run": (
    lambda: _run(hparams={"client_lr": [0.1, 0.2]}),
    ValueError,
    "client_lr",
  ),
  "client_lr=1e308 for a float32 model": (
    lambda: _run(hparams={"client_lr": 1e308}, init_params=F32_PARAMS),
    ValueError,
    "client_lr",
  ),
  "client_lr=1e308 in float32 (make_hparams)": (
    lambda: A.make_hparams(_fedavg(), {"client_lr": 1e308}, dtype=jnp.float32),
    ValueError,
    "client_lr",
  ),
  "client_lr underflowing float32": (
    lambda: _run(hparams={"client_lr": 1e-60}, init_params=F32_PARAMS),
    ValueError,
    "client_lr",
  ),
  "client_lr below float32's smallest normal (make_hparams)": (
    lambda: A.make_hparams(_fedavg(), {"client_lr": 3e-39}, dtype=jnp.float32),
    ValueError,
    "client_lr",
  ),
  "beta1 > 1": (
    lambda: _run(alg=A.fedadam(linreg(2)), hparams={"beta1": 1.5}),
    ValueError,
    "beta1",
  ),
  "server optimizer not an optax transformation": (
    lambda: A.fedavg(linreg(2), server_optimizer="adam"),
    TypeError,
    "server_optimizer",
  ),
  "server optimizer on an algorithm without a plain server step": (
    lambda: A.afl(linreg(2), server_optimizer=_optax().sgd(1.0)),
    TypeError,
    "server_optimizer",
  ),
  "client optimizer on an algorithm with its paper's own local steps": (
    lambda: A.fedadam(linreg(2), client_optimizer=_optax().sgd(1.0)),
    TypeError,
    "client_optimizer",
  ),
  "NNX module with a variable other than Param, BatchStat and RNG streams": (
    lambda: models.from_nnx(_nnx_with_cache),
    ValueError,
    "Cache",
  ),
  # ---- run arguments ----
  "data wrong type": (lambda: run(_fedavg(), {"x": 1}, rounds=1), TypeError, "data"),
  "alg wrong type": (lambda: run("fedavg", dataset(DATA), rounds=1), TypeError, "alg"),
  "rounds zero": (lambda: _run(rounds=0), ValueError, "rounds"),
  "rounds a float": (lambda: _run(rounds=10.0), ValueError, "rounds"),
  "rounds a bool": (lambda: _run(rounds=True), ValueError, "rounds"),
  "rounds=10**20": (lambda: _run(rounds=10**20), ValueError, "rounds"),
  "rounds=2**31 (beyond the int32 round counter)": (
    lambda: _run(rounds=2**31, eval_every=2**31),
    ValueError,
    "rounds",
  ),
  "eval_every=2**31": (lambda: _run(rounds=2, eval_every=2**31), ValueError, "eval_every"),
  "eval_every negative": (lambda: _run(rounds=2, eval_every=-1), ValueError, "eval_every"),
  "eval_every a bool": (lambda: _run(rounds=2, eval_every=True), ValueError, "eval_every"),
  "seed not int": (lambda: _run(seed="zero"), TypeError, "seed"),
  "seed negative": (lambda: _run(seed=-3), ValueError, "seed"),
  "seed a float key": (lambda: _run(seed=np.zeros(2)), TypeError, "seed"),
  "loggers entry without the logger methods": (
    lambda: _run(loggers=[object()]),
    TypeError,
    "loggers[0]",
  ),
  "loggers a string": (lambda: _run(loggers="tensorboard"), TypeError, "loggers"),
  "true_params of the wrong size (model has 3)": (
    lambda: _run(true_params=np.zeros((4, 5))),
    ValueError,
    "true_params",
  ),
  "true_params for other clients": (
    lambda: _run(true_params=np.zeros((3, 3))),
    ValueError,
    "true_params",
  ),
  "true_params NaN": (lambda: _run(true_params=np.full((4, 3), np.nan)), ValueError, "true_params"),
  "sweep true_params NaN": (
    lambda: _sweep(true_params=np.full((4, 3), np.nan)),
    ValueError,
    "true_params",
  ),
  "sweep true_params of the wrong size (model has 3)": (
    lambda: _sweep(true_params=np.zeros((4, 5))),
    ValueError,
    "true_params",
  ),
  "progress not a bool": (lambda: _run(progress="yes"), TypeError, "progress"),
  "out_dir under /proc": (lambda: _run(out_dir="/proc/x"), ValueError, "out_dir"),
  "out_dir is a file": (lambda: _run(out_dir=_FILE), ValueError, "out_dir"),
  "checkpoint_dir is a file": (
    lambda: _run(checkpoint_dir=_FILE),
    ValueError,
    "checkpoint_dir",
  ),
  "checkpoint_every zero": (
    lambda: _run(checkpoint_dir="/tmp/unused", checkpoint_every=0),
    ValueError,
    "checkpoint_every",
  ),
  "checkpoint_every without checkpoint_dir": (
    lambda: _run(checkpoint_every=5),
    ValueError,
    "checkpoint_dir",
  ),
  "keep_checkpoints zero": (
    lambda: _run(checkpoint_dir="/proc/unused", keep_checkpoints=0),
    ValueError,
    "keep_checkpoints",
  ),
  # ---- sweep ----
  "sweep grid as a string": (lambda: _sweep(grid="client_lr=0.1,0.2"), TypeError, "grid"),
  "sweep grid value a scalar": (lambda: _sweep(grid={"client_lr": 0.1}), TypeError, "grid"),
  "sweep grid values a string": (
    lambda: _sweep(grid={"client_lr": "0.1,0.2"}),
    TypeError,
    "grid['client_lr']",
  ),
  "sweep grid empty": (lambda: _sweep(grid={"client_lr": []}), ValueError, "grid['client_lr']"),
  "sweep unknown grid key": (lambda: _sweep(grid={"lr": [0.1]}), ValueError, "grid"),
  "sweep grid negative step": (
    lambda: _sweep(grid={"client_lr": [0.1, -1]}),
    ValueError,
    "client_lr",
  ),
  "sweep empty seeds": (lambda: _sweep(seeds=[]), ValueError, "seeds"),
  "sweep negative seed": (lambda: _sweep(seeds=[0, -1]), ValueError, "seeds"),
  "sweep seeds as a string": (lambda: _sweep(seeds="0,1"), TypeError, "seeds"),
  "sweep float seed": (lambda: _sweep(seeds=[1.5]), TypeError, "seeds"),
  "sweep hparams array": (
    lambda: _sweep(hparams={"client_lr": [0.1, 0.2]}),
    ValueError,
    "hparams['client_lr']",
  ),
  # ---- comparisons (fedjax_dro.compare) ----
  "compare budget of uploads without an amount": (
    lambda: C.Budget("uploads"),
    ValueError,
    "amount=B and match",
  ),
  "compare protocol scoring failures without a score": (
    lambda: C.Protocol(on_failure="score"),
    ValueError,
    "failure_score",
  ),
  "compare strategies with unequal grids and no note": (
    lambda: C.Experiment(
      "x",
      lambda seed: dataset(DATA),
      linreg(2),
      [
        C.Strategy("A", A.fedavg, {"client_lr": [0.1, 0.2]}),
        C.Strategy("B", A.fedsgd, {"lr": [0.1]}),
      ],
    ),
    ValueError,
    "note",
  ),
  "compare reference that is not a strategy": (
    lambda: C.Experiment(
      "x",
      lambda seed: dataset(DATA),
      linreg(2),
      [C.Strategy("A", A.fedavg)],
      C.Protocol(reference="B"),
    ),
    ValueError,
    "reference 'B'",
  ),
  # ---- readers of the user's files (CIFAR binary, TinyImageNet, features .npz) ----
  "CIFAR-10 batch not a whole number of records": (
    lambda: _cifar10_with("data_batch_2.bin", lambda b: b[:-7]),
    ValueError,
    "data_batch_2.bin",
  ),
  "CIFAR-10 empty test batch": (
    lambda: _cifar10_with("test_batch.bin", lambda b: b""),
    ValueError,
    "test_batch.bin",
  ),
  "CIFAR-10 label byte out of range": (
    lambda: _cifar10_with("data_batch_1.bin", lambda b: bytes([10]) + b[1:]),
    ValueError,
    "data_batch_1.bin",
  ),
  "CIFAR-10 class names file with 2 names": (
    lambda: _cifar10_with("batches.meta.txt", lambda b: b"cat\ndog\n"),
    ValueError,
    "batches.meta.txt",
  ),
  "CIFAR-10 data_dir is a file": (lambda: load_cifar10(_FILE), ValueError, "data_dir"),
  "CIFAR-100 file cut short": (
    lambda: _cifar100_with("train.bin", lambda b: b[:-2]),
    ValueError,
    "train.bin",
  ),
  "CIFAR-100 fine label byte out of range": (
    lambda: _cifar100_with("test.bin", lambda b: b[:1] + bytes([100]) + b[2:]),
    ValueError,
    "test.bin",
  ),
  "CIFAR-100 label neither fine nor coarse": (
    lambda: _cifar100_with("test.bin", lambda b: b, label="superclass"),
    ValueError,
    "label",
  ),
  "features file without labels": (
    lambda: _features_file(features=F32_X, y=Y4),
    ValueError,
    "labels",
  ),
  "features file with 1-D features": (
    lambda: _features_file(features=Y4 * 1.0, labels=Y4),
    ValueError,
    "'features'",
  ),
  "features file with NaN": (
    lambda: _features_file(features=_with_nan(F32_X, (1, 0)), labels=Y4),
    ValueError,
    "'features'",
  ),
  "features file with float labels": (
    lambda: _features_file(features=F32_X, labels=Y4 + 0.5),
    TypeError,
    "'labels'",
  ),
  "features file with a label of 123456789": (
    lambda: _features_file(features=F32_X, labels=np.array([0, 1, 2, 123_456_789])),
    ValueError,
    "'labels'",
  ),
  "LEAF file nested 30,000 levels": (
    lambda: _leaf_text(_LEAF_HEAD + "[" * 30_000 + "]" * 30_000),
    ValueError,
    "leaf.json",
  ),
  "LEAF file of a million empty lists": (
    lambda: _leaf_text(_LEAF_HEAD + "[[" + "[]," * 1_000_000 + '[]]], "y": [0]}}}'),
    ValueError,
    "leaf.json",
  ),
  "features file with negative labels": (
    lambda: _features_file(features=F32_X, labels=Y4 - 1),
    ValueError,
    "'labels'",
  ),
  "features file labels / features length mismatch": (
    lambda: _features_file(features=F32_X, labels=Y4[:3]),
    ValueError,
    "'labels'",
  ),
  "features file split of unknown strings": (
    lambda: _features_file(features=F32_X, labels=Y4, split=["train", "val", "test", "test"]),
    ValueError,
    "'split'",
  ),
  "features file split of another length": (
    lambda: _features_file(features=F32_X, labels=Y4, split=[0, 1, 1]),
    ValueError,
    "'split'",
  ),
  "features file with an object (pickled) array": (
    lambda: _features_file(features=F32_X.astype(object), labels=Y4),
    TypeError,
    "'features'",
  ),
  "features file not an npz": (lambda: load_features(_FILE), ValueError, "features file"),
  "TinyImageNet npz images 32x32": (
    lambda: _tiny_npz(x_train=np.zeros((2, 32, 32, 3), np.uint8)),
    ValueError,
    "'x_train'",
  ),
  "TinyImageNet npz float pixels in 0-255": (
    lambda: _tiny_npz(x_test=np.full((2, 64, 64, 3), 200.0)),
    ValueError,
    "'x_test'",
  ),
  "TinyImageNet annotation with an unknown wnid": (
    lambda: _tiny_folder(annotations="v.png\tn2\t0\t0\t63\t63\n"),
    ValueError,
    "val_annotations.txt",
  ),
  "TinyImageNet image not 64x64": (lambda: _tiny_folder(train_size=32), ValueError, "a.png"),
  "write_cifar10_bin images not 32x32": (
    lambda: write_cifar10_bin(_fresh_dir(), F32_X, Y4, F32_X, Y4),
    ValueError,
    "x_train",
  ),
  "write_features split of 2s": (
    lambda: write_features(os.path.join(_fresh_dir(), "f.npz"), F32_X, Y4, split=[2, 0, 0, 0]),
    ValueError,
    "'split'",
  ),
  # ---- prepared datasets (fedjax-dro prepare, load_prepared) ----
  "prepare: a truncated PNG patch (Camelyon17)": (H.truncated_png, ValueError, ".png"),
  "prepare: a truncated JPEG (iWildCam)": (H.truncated_jpeg, ValueError, ".jpg"),
  "prepare: a truncated npz tile (PovertyMap)": (H.truncated_npz, ValueError, ".npz"),
  "prepare: metadata.csv without a required column": (
    H.csv_without_a_column,
    ValueError,
    "metadata.csv",
  ),
  "prepare: metadata.csv with an unknown split string": (
    H.unknown_split_string,
    ValueError,
    "metadata.csv",
  ),
  "prepare: a Pile line that is not JSON": (H.pile_line_not_json, ValueError, "val.jsonl.zst"),
  "prepare: a finished prepared directory as --out again": (
    H.finished_directory_again,
    ValueError,
    "overwrite",
  ),
  "load_prepared: an array whose checksum does not match": (
    H.changed_prepared_array,
    ValueError,
    "x.npy",
  ),
  # ---- differential privacy (fd.private) ----
  "private: negative clip": (
    lambda: P.private(_uniform_fedavg(), -1.0, 1.0, rate=0.5),
    ValueError,
    "clip_norm",
  ),
  "private: delta >= 1": (
    lambda: P.private(_uniform_fedavg(), 1.0, 1.0, rate=0.5, delta=1.0),
    ValueError,
    "delta",
  ),
  "private: Poisson without a rate": (
    lambda: P.private(_uniform_fedavg(), 1.0, 1.0),
    ValueError,
    "rate",
  ),
  "private: sample-count weighting": (
    lambda: P.private(_fedavg(), 1.0, 1.0, rate=0.5),
    ValueError,
    "weighting='uniform'",
  ),
  "private: a refused algorithm (karula)": (
    lambda: P.private(A.karula(linreg(2)), 1.0, 1.0, rate=0.5),
    ValueError,
    "'karula' cannot be made client-level private",
  ),
  "private: an algorithm whose releases are not declared (a user's)": (
    lambda: P.private(
      A.fedavg(linreg(2), weighting="uniform")._replace(name="mine", releases=None),
      1.0,
      1.0,
      rate=0.5,
    ),
    ValueError,
    "'mine' declares no releases: build it with",
  ),
  "private: AFL without a loss bound": (
    lambda: P.private(A.afl(linreg(2)), 1.0, 1.0, rate=0.5),
    ValueError,
    "loss_bound",
  ),
  "privacy_budget: neither rate nor clients_per_round": (
    lambda: P.privacy_budget(1.0, 1.0, delta=1e-5, num_clients=10),
    ValueError,
    "rate",
  ),
  **CHECKPOINT_CASES,  # hostile / damaged checkpoints (tests/records/test_checkpoint_manifest.py)
}

# description: (argv, fragment naming the flag); each must exit with status 2 and "error: ..."
_SAME_DIR = os.path.join("never-created", "same")  # refused before anything is made
CLI_CASES = {
  "prepare with an unknown SOURCE": (["prepare", "wilds", "/tmp", "--out", "/tmp/p"], "SOURCE"),
  "prepare --option without =": (
    ["prepare", "camelyon17", "/tmp", "--out", "/tmp/p", "--option", "image_size"],
    "--option",
  ),
  "unknown --server-optimizer": (["run", "--server-optimizer", "rmsprop"], "--server-optimizer"),
  "--server-option without --server-optimizer": (
    ["run", "--server-option", "b2=0.9"],
    "--server-option",
  ),
  "--out under /proc": (["run", "--out", "/proc/x"], "--out"),
  "--checkpoint-dir is a file": (["run", "--checkpoint-dir", _FILE], "--checkpoint-dir"),
  "--compile-cache is a file": (["run", "--compile-cache", _FILE], "--compile-cache"),
  "--dp-noise without --dp-clip": (["run", "--dp-noise", "1"], "--dp-clip"),
  "--dp-clip negative": (["run", "--dp-clip", "-1"], "--dp-clip"),
  "--dp-delta >= 1": (["run", "--dp-clip", "1", "--dp-delta", "1"], "--dp-delta"),
  "--dp-clip on karula": (["run", "--algorithm", "karula", "--dp-clip", "1"], "karula"),
  "--dp-cluster-noise on fedavg": (
    ["run", "--dp-clip", "1", "--dp-cluster-noise", "1"],
    "--dp-cluster-noise",
  ),
  "--seeds not integers": (["sweep", "--seeds", "0,a"], "--seeds"),
  "--seeds negative": (["sweep", "--seeds", "-1", "--rounds", "1"], "seeds"),
  "--hparam not a number": (["run", "--hparam", "client_lr=abc"], "--hparam"),
  "--hparam without =": (["run", "--hparam", "client_lr"], "--hparam"),
  "--hparam underflowing float32": (
    ["run", "--hparam", "client_lr=1e-310", "--rounds", "1"],
    "client_lr",
  ),
  "--eval-every zero": (["run", "--eval-every", "0", "--rounds", "1"], "--eval-every"),
  "--grid empty value": (["sweep", "--grid", "client_lr="], "--grid"),
  "--option without =": (["run", "--option", "clients_per_round"], "--option"),
  "--option unknown": (["run", "--option", "momentum=0.9", "--rounds", "1"], "momentum"),
  "--checkpoint-every without --checkpoint-dir": (
    ["run", "--checkpoint-every", "5"],
    "checkpoint_every",
  ),
  "--rounds zero": (["run", "--rounds", "0"], "--rounds"),
  "--rounds negative (sweep)": (["sweep", "--rounds", "-1"], "--rounds"),
  "--rounds 99999999999999999999": (["run", "--rounds", "99999999999999999999"], "--rounds"),
  "--rounds 2**31 --eval-every 2**31": (
    ["run", "--rounds", "2147483648", "--eval-every", "2147483648"],
    "--rounds",
  ),
  "--eval-every 2**31 (sweep)": (
    ["sweep", "--rounds", "2", "--eval-every", "2147483648"],
    "--eval-every",
  ),
  "--seed -1": (["run", "--seed", "-1", "--rounds", "1"], "--seed"),
  "reproduce --out a file (refused before computing)": (
    ["reproduce", "karula-synthetic", "--out", _FILE, "--quick"],
    "--out",
  ),
  "compare: a config key that does not exist": (
    ["compare", _toml('name = "x"\n[data]\ndataset = "synthetic-ridge"\n[protocol]\nfold = 3\n')],
    "protocol.fold",
  ),
  "compare: a grid key the algorithm does not have": (
    [
      "compare",
      _toml(
        'name = "x"\n[data]\ndataset = "synthetic-ridge"\n' + _STRATEGY + "grid = { lr = [0.1] }\n"
      ),
    ],
    "strategy[0].grid.lr",
  ),
  "compare: a config that is not TOML": (["compare", _toml("name = \n")], "not valid TOML"),
  "--devices zero": (["run", "--devices", "0", "--rounds", "1"], "--devices"),
  "--algorithm unknown": (["run", "--algorithm", "nope", "--rounds", "1"], "algorithm"),
  "--dataset unknown": (["run", "--dataset", "nope", "--rounds", "1"], "dataset"),
  "--clients-per-round too many": (
    ["run", "--clients-per-round", "1000", "--rounds", "1"],
    "--clients-per-round",
  ),
  "--batch-size zero": (["run", "--batch-size", "0", "--rounds", "1"], "--batch-size"),
  "--local-steps for afl (which takes none)": (
    ["run", "--algorithm", "afl", "--local-steps", "3"],
    "--local-steps",
  ),
  "--dp-adaptive-lr without --dp-adaptive-quantile": (
    ["run", "--dp-clip", "1", "--dp-adaptive-lr", "0.5"],
    "--dp-adaptive-quantile",
  ),
  "--log-to unknown tracker": (["run", "--log-to", "wandb", "--rounds", "1"], "--log-to"),
  "--log-to a tracker twice (sweep)": (
    ["sweep", "--log-to", "mlflow,mlflow", "--rounds", "1"],
    "--log-to",
  ),
  "--log-to with --log-dir a file": (
    ["run", "--log-to", "tensorboard", "--log-dir", _FILE, "--rounds", "1"],
    "--log-dir",
  ),
  "--log-dir without --log-to": (["run", "--log-dir", "logs", "--rounds", "1"], "--log-dir"),
  "--out equal to --checkpoint-dir": (
    ["run", "--rounds", "1", "--out", _SAME_DIR, "--checkpoint-dir", _SAME_DIR],
    "--checkpoint-dir",
  ),
}


def _constant_client_r2():
  xs, ys = _clients(n=3, m=4)
  ys[1] = np.full(4, 3.0)  # constant responses: R^2 undefined
  data = from_client_arrays(xs, ys)
  hist = _run(data=data)
  summary, per_client = hist.final["r2"], hist.evaluations[-1]["per_client"]["r2"]
  assert np.isnan(per_client[1]) and np.all(np.isfinite(per_client[[0, 2]]))
  assert summary["undefined"] == 1 and summary["mean"] == np.mean(per_client[[0, 2]])


def _nan_in_a_result_file():
  import json

  from fedjax_dro.records.history import json_text

  def refuse(token):
    raise AssertionError(f"bare {token} in a result file")

  out = json.loads(json_text({"summary": {"r2": {"mean": np.nan}}}), parse_constant=refuse)
  assert out == {"summary": {"r2": {"mean": None}}, "nonfinite": ["summary.r2.mean"]}


def _numpy_integer_settings():
  alg = A.fedavg(linreg(2), clients_per_round=np.int64(2), batch_size=np.int32(3))
  hist = _run(alg=alg, rounds=np.int64(2), eval_every=np.uint16(1), seed=np.int64(0))
  assert hist.config["rounds"] == 2 and hist.config["settings"]["batch_size"] == 3


def _finished_result_of_another_configuration():
  import contextlib
  import io
  import json

  with tempfile.TemporaryDirectory(prefix="fedjax-dro-finished-") as out:
    argv = ["sweep", "--rounds", "2", "--grid", "client_lr=0.01,0.1", "--out", out]
    with contextlib.redirect_stdout(io.StringIO()):
      assert cli.main(argv) == 0
    with open(os.path.join(out, "sweep.json")) as f:
      first = f.read()
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
      assert cli.main([*argv, "--seeds", "1"]) == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and "differs in seeds" in lines[0] and "--overwrite" in lines[0]
    with open(os.path.join(out, "sweep.json")) as f:
      assert f.read() == first
    with contextlib.redirect_stdout(io.StringIO()):
      assert cli.main([*argv, "--seeds", "1", "--overwrite"]) == 0
    with open(os.path.join(out, "sweep.json")) as f:
      assert {c["seed"] for c in json.load(f)["configs"]} == {1}


def _ctrl_c_is_one_line():
  import signal
  import subprocess
  import sys
  import time

  with tempfile.TemporaryDirectory(prefix="fedjax-dro-sigint-") as out:
    proc = subprocess.Popen(
      [sys.executable, "-m", "fedjax_dro", "run", "--rounds", "1000000", "--out", out],
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
    )
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, "metrics.jsonl")):
      assert proc.poll() is None and time.monotonic() < deadline
      time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130 and len(err.strip().splitlines()) == 1, err
  assert err.startswith("interrupted") and "Traceback" not in err, err


def _killed_comparison_resumes():
  from fedjax_dro.compare import harness
  from tests.compare.test_compare import _experiment

  calls, original = [], harness._run

  def killed_at_third(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
      raise KeyboardInterrupt
    return original(*args, **kwargs)

  experiment = _experiment()
  with tempfile.TemporaryDirectory(prefix="fedjax-dro-resume-") as out:
    harness._run = killed_at_third
    try:
      with pytest.raises(KeyboardInterrupt):
        C.compare(experiment, out, verbose=False)
      calls.clear()
      harness._run = lambda *a, **k: (calls.append(1), original(*a, **k))[1]
      C.compare(experiment, out, verbose=False)
    finally:
      harness._run = original
  assert len(calls) == 2  # of 4 runs: the two finished before the kill were read back


def _numpy_float_settings():
  model = models.linear_regression(2, l2=np.float32(2.0), init_scale=np.float64(0.5))
  assert model.l2 == 2.0 and type(model.l2) is float
  budget = dict(delta=1e-5, num_clients=100, clients_per_round=10)
  assert P.privacy_budget(
    np.float32(4.0), np.float64(1.0), **{**budget, "delta": np.float64(1e-5)}
  ) == P.privacy_budget(4.0, 1.0, **budget)
  alg = P.private(_uniform_fedavg(), np.float32(1.0), np.float64(0.0), rate=np.float32(0.5))
  hist = _run(alg=alg, rounds=1)
  assert hist.final


# description: (check that raises AssertionError if the documented behaviour breaks, behaviour)
BEHAVIOURS = {
  "a full disk while prepare writes a prepared directory": (
    H.disk_full_behaviour,
    "one line `OSError`: the disk filled while writing `OUT.partial/SPLIT`, `OUT` unchanged (the "
    "finished directory stays byte for byte); the same command, rerun, resumes and finishes",
  ),
  "a client whose test responses are constant (or one row)": (
    _constant_client_r2,
    "its r2 is NaN (undefined), left out of the r2 summary, counted as `undefined`",
  ),
  "a non-finite value in a result file (metrics.jsonl, summary.json, sweep.json)": (
    _nan_in_a_result_file,
    "written as `null`; the record's `nonfinite` lists the fields",
  ),
  "NumPy integers for integer settings (rounds, eval_every, seed, batch_size...)": (
    _numpy_integer_settings,
    "accepted like Python ints (and recorded as ints)",
  ),
  "NumPy floats for float settings (l2, init_scale, clip, noise, delta...)": (
    _numpy_float_settings,
    "accepted like Python floats (`np.float32(2.0)` is 2.0)",
  ),
  "a full disk while a run writes its results or checkpoints (CLI)": (
    disk_full_behaviour,
    "exit 1 and one line `error: cannot write PATH: No space left on device (ENOSPC)`; the "
    "files finished before it stay whole; the same command, rerun, resumes and finishes",
  ),
  "a full disk under the event file of --log-to tensorboard (CLI)": (
    tensorboard_disk_full_behaviour,
    "exit 1 and one line `error: cannot write EVENT_FILE: No space left on device (ENOSPC)`, no "
    "traceback (tensorboardX's writer thread and its exit handler included)",
  ),
  "two commands writing one --out directory at once (CLI)": (
    one_writer_behaviour,
    "the first proceeds; the second (run, sweep, compare or reproduce), whenever it starts, exits "
    "2 with one line `error: ... is in use by another run (process PID holds "
    "DIR/.fedjax-dro.lock)`: each command claims its --out before it checks, loads or compiles "
    "anything; a killed holder's lock is taken over by the next command",
  ),
  "a finished sweep, comparison or reproduction of another configuration in --out (CLI)": (
    _finished_result_of_another_configuration,
    "exit 2 and one line naming what differs (`differs in seeds`) and `--overwrite`; the "
    "finished files untouched; with --overwrite, replaced (a finished run: the same, as before)",
  ),
  "Ctrl-C (SIGINT) while a command imports, compiles, runs or writes (CLI)": (
    _ctrl_c_is_one_line,
    "exit 130 and one line on stderr saying what is kept (`interrupted ...`), never a "
    "traceback or a crash",
  ),
  "a comparison (compare, reproduce) killed part way and started again": (
    _killed_comparison_resumes,
    "the runs that finished before the kill are read back from `--out`/runs/NAME/, the others "
    "computed; the table equals an uninterrupted one",
  ),
  "a run resumed from a checkpoint": (
    resume_line_behaviour,
    "prints `resuming from round R (checkpoint FILE)` to stderr",
  ),
}


@pytest.mark.parametrize("case", list(BEHAVIOURS))
def test_documented_behaviour(case):
  BEHAVIOURS[case][0]()


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_clear_error(case):
  fn, exc, argument = CASES[case]
  with pytest.raises(exc) as info:
    fn()
  assert type(info.value) in (ValueError, TypeError) or issubclass(
    type(info.value), (ValueError, TypeError)
  )
  assert argument in str(info.value), str(info.value)
  assert "Traceback" not in str(info.value) and "jaxlib" not in str(info.value)


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_bad_input_is_one_clear_line(case, capsys):
  argv, flag = CLI_CASES[case]
  rc = cli.main(argv + (["--no-progress"] if argv[0] == "run" else []))
  captured = capsys.readouterr()
  err = captured.err.strip()
  assert rc == 2, err
  assert err.startswith("error: ") and "\n" not in err, err
  assert flag in err, err
  if flag in ("--rounds", "--eval-every"):  # refused before the run's header line is printed
    assert captured.out == "", captured.out


def test_table_has_at_least_60_distinct_cases_and_the_docs_list_them():
  assert len(CASES) + len(CLI_CASES) >= 60
  names = set(CASES) | set(CLI_CASES) | set(BEHAVIOURS)
  assert len(names) == len(CASES) + len(CLI_CASES) + len(BEHAVIOURS)
  docs = os.path.join(os.path.dirname(os.path.dirname(_FILE)), "docs", "bad_inputs.md")
  with open(docs) as f:
    assert f.read() == markdown_table()


def test_cli_reports_bad_names_without_traceback(capsys):
  assert cli.main(["run", "--algorithm", "nope", "--rounds", "1", "--no-progress"]) == 2
  assert "unknown algorithm 'nope'" in capsys.readouterr().err
  assert cli.main(["run", "--dataset", "nope", "--rounds", "1", "--no-progress"]) == 2
  assert "unknown dataset 'nope'" in capsys.readouterr().err
  assert cli.main(["run", "--hparam", "client_lr=-1", "--rounds", "1", "--no-progress"]) == 2
  assert "client_lr" in capsys.readouterr().err


def test_from_arrays_groups_rows_without_a_loop_over_num_clients():
  # the oracle: a per-client boolean selection of the pooled rows, order kept within a client
  x = np.arange(12.0).reshape(6, 2)
  cid = np.array([2, 0, 2, 1, 0, 1])
  data = from_arrays(x, x[:, 0], cid, num_clients=np.int64(3))
  for i in range(3):
    rows = x[cid == i]
    np.testing.assert_array_equal(np.asarray(data.x[i, : len(rows)]), rows)
    assert int(data.num_examples[i]) == len(rows)


def test_integer_settings_accept_any_integer_type():
  # the same run with numpy integers and Python ints: equal settings and results
  as_np = A.fedavg(
    linreg(2),
    clients_per_round=np.int64(2),
    local_steps=np.int32(2),
    batch_size=np.uint8(3),
    chunk_size=np.int16(2),
  )
  as_py = A.fedavg(linreg(2), clients_per_round=2, local_steps=2, batch_size=3, chunk_size=2)
  assert as_np.config == as_py.config
  assert all(type(v) is not np.int64 for v in as_np.config.values())
  a = _run(alg=as_np, rounds=np.int64(2), eval_every=np.int32(1), seed=np.int64(1))
  b = _run(alg=as_py, rounds=2, eval_every=1, seed=1)
  assert a.config["rounds"] == b.config["rounds"] == 2 and a.config["seed"] == b.config["seed"] == 1
  assert set(a.train_metrics) == set(b.train_metrics) and a.train_metrics
  for k in a.train_metrics:
    np.testing.assert_array_equal(a.train_metrics[k], b.train_metrics[k])
  np.testing.assert_array_equal(
    a.evaluations[-1]["per_client"]["r2"], b.evaluations[-1]["per_client"]["r2"]
  )


def test_true_params_of_the_model_size_give_the_estimation_error():
  # oracle: ||theta - theta_i*||^2 by hand from the final global parameters
  truth = RNG.normal(size=(4, 3))
  hist = _run(rounds=2, true_params=truth)
  p = hist.final_state.params
  flat = np.concatenate([np.ravel(p["b"]), np.ravel(p["w"])])  # ravel_pytree: keys sorted
  np.testing.assert_allclose(
    hist.evaluations[-1]["per_client"]["estimation_error"],
    np.sum((flat[None, :] - truth) ** 2, axis=1),
    rtol=1e-5,
  )


def markdown_table() -> str:
  rows = [
    "# Bad inputs and the errors they get",
    "",
    "Every row is a test case in `tests/test_bad_inputs.py` (this file is checked against it; "
    "regenerate with `python -m tests.test_bad_inputs > docs/bad_inputs.md`). Each raises the "
    "exception shown (the CLI exits with status 2 and prints one `error: ...` line) with a "
    "message naming the argument.",
    "",
    "| # | bad input | where | exception | message names |",
    "|---|---|---|---|---|",
  ]
  for i, (name, (_, exc, arg)) in enumerate(CASES.items(), 1):
    rows.append(f"| {i} | {name} | Python API | `{exc.__name__}` | `{arg}` |")
  for j, (name, (argv, flag)) in enumerate(CLI_CASES.items(), len(CASES) + 1):
    # no machine-specific paths in the docs
    shown = ["FILE" if a == _FILE else "CONFIG.toml" if a.endswith(".toml") else a for a in argv]
    rows.append(f"| {j} | {name} | `fedjax-dro {' '.join(shown)}` | exit 2 | `{flag}` |")
  rows += [
    "",
    "## Inputs with a documented behaviour instead of an error",
    "",
    "Each row is checked by `test_documented_behaviour` in the same file.",
    "",
    "| # | input | behaviour |",
    "|---|---|---|",
  ]
  for k, (name, (_, behaviour)) in enumerate(BEHAVIOURS.items(), 1):
    rows.append(f"| {k} | {name} | {behaviour} |")
  return "\n".join(rows) + "\n"


if __name__ == "__main__":
  print(markdown_table(), end="")
