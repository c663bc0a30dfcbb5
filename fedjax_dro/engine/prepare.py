"""Argument preparation of :func:`fedjax_dro.run`, :func:`fedjax_dro.sweep` and
:func:`fedjax_dro.compile_rounds`: what they share before anything compiles (and
:func:`compile_program`, how they compile).

* :func:`check_run_args` (the algorithm, ``rounds``, ``eval_every``), :func:`split_data` (training
  data, evaluation data, true parameters, dataset name; :func:`checked_data` with the compatibility
  check below), :func:`derive_keys` (the model, init and round keys of a seed),
  :func:`prepare_hparams` (the hyper-parameters, validated once), :func:`place_run_data` (the data
  on a mesh), :func:`program_key` (the key of the compiled programs in their cache);
* :func:`evaluate_per_client`, :func:`summarize_per_client` and :func:`main_metric`, how
  evaluations are fetched, summarized and shown.

One compatibility check runs before anything compiles: model x data x hyper-parameters x paths.
:func:`check_run_inputs` is called right after the data is split, before the model is
initialised or any program is traced. It checks, in this order:

1. ``init_params`` (if given) against ``jax.eval_shape(model.init, key)``: same tree, shapes and
   float dtypes;
2. the model applied *abstractly* (``jax.eval_shape``) to one client's batch of ``data.x``: a
   model built for other features (7 features on data with 5, a CNN on 1-D features) fails here
   with a ``ValueError`` that names the data's feature shape / dtype and the model, instead of a
   ``dot_general`` trace from XLA;
3. the labels against the model's task and output: classification needs integer (or bool, or
   integral float) labels in ``[0, k)`` for a ``k``-way output and in ``{0, 1}`` for a single
   logit; regression needs real-valued responses whose shape matches the output (checked on the
   valid rows only);
4. the per-example loss applied abstractly to (outputs, labels).

Every failure is a ``ValueError`` / ``TypeError`` naming the argument (``data.x``, ``data.y``,
``init_params``, ``hparams[...]``, ``out_dir``...), what was given and what was expected.
:func:`~fedjax_dro.records.files.check_writable_dir` checks result and checkpoint paths up front.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.algorithms.base import Algorithm, make_hparams
from fedjax_dro.common.tuning import scope
from fedjax_dro.core.metrics import summarize_all
from fedjax_dro.data.federated import FederatedData, FederatedDataset, validate_data
from fedjax_dro.engine.errors import is_out_of_memory, memory_error
from fedjax_dro.engine.programs import abstract_key, evaluate_host
from fedjax_dro.engine.sharding import fetch, place_data, sharding_key
from fedjax_dro.models.builtin import squared_error
from fedjax_dro.records.files import check_writable_dir


def is_host_data(data) -> bool:
  """Whether ``data`` is host-resident (:class:`~fedjax_dro.data.host.HostFederatedData`)."""
  return bool(getattr(data, "host_resident", False))


def _validate(data, name):
  if is_host_data(data):  # validated when built (to_host / load_npy_dir)
    return
  validate_data(data, name)


def split_data(data, eval_data, true_params):
  """``(train, eval_data, true_params, name)`` of the ``data`` argument of a run or sweep.

  A :class:`FederatedDataset` gives its training split, its test split (else its training split)
  as the default evaluation data, its true parameters and its name; :class:`FederatedData` (or
  host-resident data) is the training data and the default evaluation data, named ``"custom"``.
  Both are validated and must have the same number of clients. ``true_params`` given as an
  argument is checked (:func:`check_true_params`); a dataset's own are used as they are (a model
  of another size than the dataset's ground truth gets no estimation error).
  """
  if isinstance(data, FederatedDataset):
    train = data.train
    eval_data = (
      eval_data if eval_data is not None else (data.test if data.test is not None else data.train)
    )
    true_params = true_params if true_params is not None else data.true_params
    name = data.name
  elif isinstance(data, FederatedData) or is_host_data(data):
    train, name = data, "custom"
    eval_data = eval_data if eval_data is not None else data
  else:
    raise TypeError(f"data must be a FederatedDataset or FederatedData, got {type(data).__name__}")
  if true_params is not None and not (
    isinstance(data, FederatedDataset) and true_params is data.true_params
  ):
    true_params = check_true_params(true_params, train.num_clients)
  _validate(train, "data")
  _validate(eval_data, "eval_data")
  if eval_data.num_clients != train.num_clients:
    raise ValueError(f"eval_data has {eval_data.num_clients} clients, data has {train.num_clients}")
  return train, eval_data, true_params, name


def checked_data(alg, data, eval_data, true_params, **paths):
  """:func:`split_data`, then :func:`check_run_inputs` of its training and evaluation data (the
  ``true_params`` given, and ``paths``: ``init_params``, ``out_dir``, ``checkpoint_dir``):
  ``(train, eval_data, true_params, name)``."""
  train, eval_data, dataset_true_params, name = split_data(data, eval_data, true_params)
  check_run_inputs(alg, train, eval_data, true_params=true_params, **paths)
  return train, eval_data, dataset_true_params, name


def place_run_data(mesh, train, eval_data):
  """``(train, eval_data, eval_num_examples)``: the evaluation clients' example counts as a host
  array (before any padding), and the data placed on ``mesh`` with the client axis split over
  its ``"clients"`` axis (padded; unchanged without a mesh). Host-resident data cannot be
  combined with a mesh yet."""
  eval_num_examples = np.asarray(eval_data.num_examples)  # host copy (before any sharding)
  if mesh is not None and (is_host_data(train) or is_host_data(eval_data)):
    raise ValueError(
      "mesh and host-resident data (HostFederatedData) cannot be combined yet: shard "
      "device-resident data, or run host-resident data on one device"
    )
  if mesh is not None:
    train = place_data(train, mesh, what="data", pad=True)
    eval_data = place_data(eval_data, mesh, what="eval_data", pad=True)
  return train, eval_data, eval_num_examples


def compile_program(jitted, args, tuning, what: str):
  """``jitted`` lowered for ``args`` and compiled, traced within
  :func:`~fedjax_dro.common.tuning.scope` of ``tuning``; running out of device memory raises the
  :class:`~fedjax_dro.engine.errors.DeviceMemoryError` of ``what`` (``"compiling ..."``)."""
  try:
    with scope(tuning):
      return jitted.lower(*args).compile()
  except Exception as e:
    if is_out_of_memory(e):
      raise memory_error(e, what) from None
    raise


def program_key(settings: tuple, *trees) -> tuple:
  """The key of compiled programs in a :class:`~fedjax_dro.engine.programs.ProgramCache`: the
  caller's static ``settings``, then the structure, shapes, dtypes and shardings of each of
  ``trees`` (the programs' arguments)."""
  return tuple(settings) + tuple(
    part for tree in trees for part in (abstract_key(tree), sharding_key(tree))
  )


MAX_ROUNDS = 2**31 - 1  # the round counter is an int32 on the device


def check_true_params(true_params, num_clients: int, num_params: Optional[int] = None):
  """``true_params`` (the argument of a run or sweep) as a float array ``[num_clients, dim]`` of
  finite values, ``dim`` equal to ``num_params`` (the model's parameter count) when given."""
  try:
    arr = np.asarray(true_params)
  except Exception:  # pragma: no cover - defensive
    raise TypeError(f"true_params must be an array, got {type(true_params).__name__}") from None
  if arr.dtype.kind not in "iuf":
    raise TypeError(f"true_params must be a real-valued array, got dtype {arr.dtype}")
  if arr.ndim != 2 or arr.shape[0] != num_clients:
    raise ValueError(
      f"true_params must have shape [num_clients={num_clients}, num_parameters], got {arr.shape}"
    )
  if num_params is not None and arr.shape[1] != num_params:
    raise ValueError(
      f"true_params has {arr.shape[1]} parameters per client but the model has {num_params}: "
      f"the estimation error compares the raveled model parameters with them"
    )
  if not np.all(np.isfinite(arr)):
    raise ValueError("true_params has NaN or infinite values")
  return true_params


def check_run_args(alg, rounds, eval_every) -> Tuple[int, int]:
  """``(rounds, rounds per chunk)``: checks the algorithm and the round counts of a run (integers of
  any type in ``[1, 2**31 - 1]``, the range of the device's int32 round counter); the chunk is
  ``eval_every`` (default ``min(rounds, 10)``), at most ``rounds``."""
  if not isinstance(alg, Algorithm):
    raise TypeError(
      f"alg must be an Algorithm (e.g. fedjax_dro.algorithms.fedavg(model)), got "
      f"{type(alg).__name__}"
    )
  for name, value in (("rounds", rounds), ("eval_every", eval_every)):
    if name == "eval_every" and value is None:
      continue
    if (
      not isinstance(value, numbers.Integral)
      or isinstance(value, (bool, np.bool_))
      or not 1 <= value <= MAX_ROUNDS
    ):
      raise ValueError(f"{name} must be an integer in [1, 2**31 - 1], got {value!r}")
  return int(rounds), int(min(eval_every or max(1, min(rounds, 10)), rounds))


def derive_keys(seed_or_key):
  """``(model_key, init_key, run_key)`` of an int seed in ``[0, 2**32)`` or a PRNG key: the
  model's initial parameters, the algorithm's initial state and the rounds derive from them."""
  if isinstance(seed_or_key, (int, np.integer)) and not isinstance(seed_or_key, bool):
    if not 0 <= seed_or_key < 2**32:  # a negative seed would wrap silently
      raise ValueError(f"seed must be an integer in [0, 2**32), got {seed_or_key}")
    key = jax.random.PRNGKey(int(seed_or_key))
  elif (
    isinstance(seed_or_key, jax.Array)
    and seed_or_key.shape == (2,)
    and seed_or_key.dtype == jnp.uint32
  ):
    key = seed_or_key
  else:
    raise TypeError(f"seed must be an int or a PRNG key, got {seed_or_key!r}")
  model_key, init_key, run_key = jax.random.split(key, 3)
  return model_key, init_key, run_key


def summarize_per_client(per_client, num_examples) -> Dict[str, Dict[str, float]]:
  """``{metric: {mean, weighted_mean, worst20, ...}}`` of per-client metrics ``{metric: [n]}``
  (:func:`~fedjax_dro.core.metrics.summarize_all`, weighted by the clients' example counts)."""
  return summarize_all({k: np.asarray(v) for k, v in per_client.items()}, np.asarray(num_examples))


def evaluate_per_client(alg, state, eval_data, true_params, evaluate, *, batched=False):
  """The per-client evaluation of ``state`` (``batched``: a stacked state, one row per sweep row)
  on the host: host-resident ``eval_data`` is evaluated in chunks of clients
  (:func:`~fedjax_dro.engine.programs.evaluate_host`), other data by the compiled
  ``evaluate(state, eval_data)``."""
  if is_host_data(eval_data):
    return evaluate_host(alg, state, eval_data, true_params, batched=batched)
  return fetch(evaluate(state, eval_data))


def main_metric(alg) -> str:
  """The metric a progress bar shows: ``accuracy`` for classification, else ``r2``."""
  return "accuracy" if alg.model.task == "classification" else "r2"


def _short(e: BaseException, limit: int = 300) -> str:
  text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  text = text.rstrip(". ")
  return text if len(text) <= limit else text[:limit] + "..."


def _abstractly(fn, *args, refusal):
  """``jax.eval_shape(fn, *args)``; a failure is the ``ValueError`` ``refusal(reason)``, the
  reason :func:`_short` of the error."""
  try:
    return jax.eval_shape(fn, *args)
  except Exception as e:
    raise ValueError(refusal(_short(e))) from None


def _host_arrays(data):
  """``(x, y, mask)`` as host arrays (HostFederatedData: its store; mask from num_examples)."""
  if getattr(data, "streamed", False):  # a prepared split: specs and the labels' range
    return data.store.check_arrays()
  if getattr(data, "host_resident", False):
    store = data.store
    mask = np.arange(store.x.shape[1])[None, :] < store.num_examples[:, None]
    return store.x, store.y, mask
  return data.x, data.y, data.mask


def _check_params(model, init_params, key):
  expected = jax.eval_shape(model.init, key)
  exp_leaves, exp_tree = jax.tree.flatten(expected)
  try:
    got_leaves, got_tree = jax.tree.flatten(init_params)
  except Exception as e:  # pragma: no cover - defensive
    raise TypeError(
      f"init_params must be a pytree of arrays, got {type(init_params).__name__}"
    ) from e
  if got_tree != exp_tree:
    raise ValueError(
      f"init_params has the tree structure {got_tree}, but {model.name} expects {exp_tree} "
      f"(use model.init(key) as a template)"
    )
  for path_leaf, exp, got in zip(
    jax.tree_util.tree_leaves_with_path(expected), exp_leaves, got_leaves
  ):
    where = jax.tree_util.keystr(path_leaf[0])
    shape = np.shape(got)
    if tuple(shape) != tuple(exp.shape):
      raise ValueError(
        f"init_params{where} has shape {tuple(shape)}, but {model.name} expects {tuple(exp.shape)}"
      )
    dtype = np.asarray(got).dtype if not hasattr(got, "dtype") else got.dtype
    if not jnp.issubdtype(dtype, jnp.floating):
      raise TypeError(f"init_params{where} must be a real floating-point array, got dtype {dtype}")
    if not np.all(np.isfinite(np.asarray(got))):
      raise ValueError(f"init_params{where} contains NaN or infinite values")


def check_model_data(model, data, *, name: str = "data", init_params=None) -> None:
  """Checks ``model`` against ``data`` abstractly (see the module docstring)."""
  key = jax.random.PRNGKey(0)
  if init_params is not None:
    _check_params(model, init_params, key)
  params = jax.eval_shape(model.init, key)
  x, y, mask = _host_arrays(data)
  feature_shape, x_dtype = tuple(x.shape[2:]), x.dtype
  size = getattr(model, "input_size", None)
  if size is not None and math.prod(feature_shape) != size:
    raise ValueError(
      f"the model {model.name!r} takes examples of {size} features, but {name}.x has feature "
      f"shape {feature_shape} ({math.prod(feature_shape)} features). Build the model for these "
      f"features (e.g. models.mlp({feature_shape}, ...)) or reshape the data"
    )
  batch = jax.ShapeDtypeStruct((min(int(x.shape[1]), 8),) + feature_shape, x_dtype)
  out = _abstractly(
    model.apply,
    params,
    batch,
    refusal=lambda reason: (
      f"the model {model.name!r} cannot be applied to {name}.x with feature shape "
      f"{feature_shape} and dtype {x_dtype}: {reason}. Build the model for these features "
      f"(e.g. models.mlp({feature_shape}, ...)) or reshape the data"
    ),
  )
  if not hasattr(out, "shape") or out.shape[:1] != batch.shape[:1]:
    raise ValueError(
      f"the model {model.name!r} maps a batch of {batch.shape[0]} examples of {name}.x to an "
      f"output of shape {getattr(out, 'shape', None)}; expected one output row per example"
    )
  label_shape, y_dtype = tuple(y.shape[2:]), np.dtype(y.dtype)
  if y_dtype.kind not in "biuf":
    raise TypeError(
      f"{name}.y must hold numeric labels / responses, got dtype {y_dtype} (encode string "
      f"labels as integers, e.g. np.unique(y, return_inverse=True)[1])"
    )
  valid = np.asarray(y)[np.asarray(mask)]
  if model.task == "classification":
    # one label per example ([m] or [m, 1] against [m, k]), or one per position (a sequence:
    # y [m, T] against [m, T, k], as a language model's next tokens)
    per_position = len(out.shape) > 2 and tuple(out.shape[1:-1]) == label_shape
    k = int(out.shape[-1]) if len(out.shape) == 2 or per_position else 1
    if not per_position and (len(out.shape) > 2 or label_shape not in ((), (1,))):
      raise ValueError(
        f"classification expects one integer label per example, or one per position with "
        f"outputs [*label_shape, classes]; {name}.y has label shape {label_shape} and the model "
        f"outputs {tuple(out.shape[1:])} per example"
      )
    if (
      y_dtype.kind == "f"
      and valid.size
      and not np.all(np.isfinite(valid) & (valid == np.round(valid)))
    ):
      bad = valid[~(np.isfinite(valid) & (valid == np.round(valid)))][:3].tolist()
      raise ValueError(
        f"{name}.y holds non-integer values {bad} but the model {model.name!r} is a classifier: "
        f"labels must be class indices (use a regression model for real-valued targets)"
      )
    lo, hi = (float(valid.min()), float(valid.max())) if valid.size else (0.0, 0.0)
    upper = 2 if k == 1 else k
    if lo < 0 or hi >= upper:
      what = (
        "{0, 1} (a single logit: binary classification)" if k == 1 else f"[0, {k}) ({k} classes)"
      )
      raise ValueError(
        f"{name}.y has labels in [{lo:g}, {hi:g}] but the model {model.name!r} expects labels in "
        f"{what}; build the model with num_classes={int(hi) + 1} or fix the labels"
      )
  else:
    if y_dtype.kind == "b":
      raise TypeError(f"{name}.y is boolean but the model {model.name!r} is a regression model")
    outputs = int(np.prod(out.shape[1:], dtype=int))
    if model.loss is squared_error and outputs != int(np.prod(label_shape, dtype=int)):
      raise ValueError(
        f"{name}.y has label shape {label_shape} per example but the model {model.name!r} "
        f"returns {tuple(out.shape[1:])} outputs per example: the squared error needs one label "
        f"per output (it would broadcast them)"
      )
  y_batch = jax.ShapeDtypeStruct((batch.shape[0],) + label_shape, y.dtype)
  loss = _abstractly(
    model.loss,
    out,
    y_batch,
    refusal=lambda reason: (
      f"the loss of {model.name!r} cannot take the model's outputs {tuple(out.shape)} and "
      f"{name}.y of label shape {label_shape}: {reason}"
    ),
  )
  if tuple(loss.shape) != (batch.shape[0],):
    raise ValueError(
      f"the loss of {model.name!r} returns shape {tuple(loss.shape)} for a batch of "
      f"{batch.shape[0]}: expected one loss per example (outputs {tuple(out.shape)}, "
      f"{name}.y label shape {label_shape})"
    )


def prepare_hparams(
  alg,
  hparams: Optional[Dict[str, Any]],
  *,
  batched: bool = False,
  num_rows: Optional[int] = None,
  init_params=None,
) -> Dict[str, jnp.ndarray]:
  """The hyper-parameters of a run or sweep: the algorithm's defaults merged with ``hparams`` and
  validated (:func:`~fedjax_dro.algorithms.base.make_hparams`: names, types, finiteness, ranges
  of the algorithm), then checked against the run: one scalar each for ``run`` (``[num_rows]``
  or scalars for a ``sweep``, ``batched``), and inside the range of the float dtype of the
  model's parameters (``client_lr=1e308`` overflows a float32 model to inf even when the
  simulator computes in float64; ``1e-60`` underflows it to 0)."""
  hp = make_hparams(alg, hparams)
  _check_hparams_dtype(alg, hp, batched=batched, num_rows=num_rows, init_params=init_params)
  return hp


def _check_hparams_dtype(alg, hp, *, batched, num_rows, init_params) -> None:
  params = init_params
  if params is None:
    params = jax.eval_shape(alg.model.init, jax.random.PRNGKey(0))
  dtypes = [np.dtype(jnp.result_type(leaf)) for leaf in jax.tree.leaves(params)]
  dtypes = [d for d in dtypes if jnp.issubdtype(d, jnp.floating)]
  finfo = jnp.finfo(min(dtypes, key=lambda d: d.itemsize) if dtypes else jnp.float32)
  for name, value in hp.items():
    arr = np.asarray(value, np.float64)
    if not batched and arr.ndim != 0:
      raise ValueError(
        f"hparams[{name!r}] must be a scalar for run, got an array of shape {arr.shape} (use "
        f"fedjax_dro.sweep with grid={{{name!r}: [...]}} to run several values)"
      )
    if batched and arr.shape not in ((), (num_rows,)):
      raise ValueError(
        f"hparams[{name!r}] must be a scalar shared by every sweep row, got shape {arr.shape} "
        f"(put several values in grid[{name!r}])"
      )
    big = np.abs(arr) > float(finfo.max)
    if np.any(big):
      raise ValueError(
        f"hparams[{name!r}] = {arr[big].reshape(-1)[0].item()!r} overflows {finfo.dtype}, the "
        f"dtype of the model's parameters (largest {float(finfo.max):.3g})"
      )
    tiny = (arr != 0) & (np.abs(arr) < float(finfo.tiny))  # XLA flushes subnormals to 0
    if np.any(tiny):
      raise ValueError(
        f"hparams[{name!r}] = {arr[tiny].reshape(-1)[0].item()!r} underflows to 0 in "
        f"{finfo.dtype}, the dtype of the model's parameters (smallest normal "
        f"{float(finfo.tiny):.3g})"
      )


def check_run_inputs(
  alg,
  train,
  eval_data,
  *,
  init_params=None,
  out_dir: Optional[str] = None,
  checkpoint_dir: Optional[str] = None,
  true_params=None,
) -> None:
  """The compatibility check of ``run`` / ``sweep`` / ``compile_rounds`` (module docstring);
  ``true_params`` given as an argument are checked against the model's parameter count."""
  check_model_data(alg.model, train, name="data", init_params=init_params)
  if true_params is not None:
    shapes = jax.eval_shape(alg.model.init, jax.random.PRNGKey(0))
    size = sum(int(np.prod(leaf.shape, dtype=int)) for leaf in jax.tree.leaves(shapes))
    check_true_params(true_params, train.num_clients, size)
  if eval_data is not None and eval_data is not train:
    check_model_data(alg.model, eval_data, name="eval_data")
  check_writable_dir(out_dir, "out_dir")
  check_writable_dir(checkpoint_dir, "checkpoint_dir")
