"""What the federation does with a model's state (batch statistics), and which parameters stay on
the clients.

A model with state (``Model.state_keys``: BatchNorm's running statistics) carries it in entries of
its parameters that no gradient moves: every local step replaces them by what the step's
training pass returns (:func:`fedjax_dro.common.model.train_value_and_grad`). The setting
``model_state`` of every algorithm says what happens to them across clients:

* ``"average"``: they travel with the parameters, and the server's new statistics are the
  participants' statistics averaged with the weights of the parameters' average (whatever step
  the server takes on the parameters: :func:`averaged_state`).
* ``"local"``: each client keeps its own statistics between rounds and is evaluated with them
  (the statistics of FedBN, Li et al., and of SiloBN, Andreux et al.): the parameter partition
  below with the state entries local.
* ``"frozen"``: the statistics the run starts from (pretrained, or the initial ones) are never
  updated: training steps normalize with the minibatch's statistics, as the model's training
  form computes them, and discard them (:func:`policy_model`), so nothing is exchanged and every
  evaluation uses the starting statistics.

An algorithm declares the choices it honours (``build_algorithm(..., model_states=...)``) and
refuses the others by name (:func:`check_model_state`): ``"frozen"`` is honoured by every
algorithm; ``"average"`` by those whose server averages the participants' models; ``"local"`` by
those built on the partition (FedAvg, FedBN, FedPer). Under ``fd.private`` the state that leaves a
client (``"average"``) is part of the clipped and noised update, like the parameters.

A **parameter partition** names the leaves of the parameters that stay on the clients
(:func:`local_leaves`): a predicate on the leaf's path (the keys joined by ``/``,
``params/bn1/scale``) or the defaults of FedBN (the normalization layers that hold batch
statistics, and the statistics) and FedPer (the output layer).
"""

from __future__ import annotations

import re
from typing import Callable, Optional, Sequence, Tuple, Union

import jax

from fedjax_dro.common.model import Model

AVERAGED = ("average", "frozen")
"""The ``model_states`` of an algorithm whose server's new model is built from the participants'
mean difference or mean model: the statistics averaged with the parameters' weights."""


def policy_model(model: Model, settings) -> Model:
  """``model`` as the local steps of ``settings.model_state`` run it: under ``"frozen"`` its
  training pass returns the statistics it was given (the new ones discarded); else ``model``."""
  if not getattr(model, "state_keys", ()) or settings is None or settings.model_state != "frozen":
    return model
  train_apply = model.train_apply

  def frozen(params, x, mask, rng):
    out, _ = train_apply(params, x, mask, rng)
    return out, {k: params[k] for k in model.state_keys}

  return model._replace(train_apply=frozen)


def check_model_state(name: str, model: Model, settings, supported: Sequence[str]) -> None:
  """Refuses, naming ``name``, a ``model_state`` the algorithm cannot honour for a model with
  state, and batch statistics that would include padding rows (a model whose training pass does
  not leave out masked rows, ``Model.state_masked`` False, with full-batch steps or
  ``local_epochs``, whose last batch of an epoch is partly padding)."""
  if not model.state_keys:
    return
  if settings is None:  # no shared settings: its one-gradient steps drop the new statistics
    return
  if settings.model_state not in supported:
    raise ValueError(
      f"{name} cannot honour model_state={settings.model_state!r} for the model "
      f"{model.name!r}, which holds state {list(model.state_keys)}: it supports "
      f"{', '.join(repr(s) for s in supported)}"
    )
  if settings.model_state == "frozen" or model.state_masked:
    return
  if settings.batch_size is None or settings.local_epochs is not None:
    raise ValueError(
      f"{name}: the model {model.name!r} computes batch statistics over whole minibatches "
      "(its training pass does not leave out padding rows), so it needs minibatches of valid rows "
      "only: give batch_size with local_steps (full-batch steps and the last batch of an epoch "
      "hold padding rows), a model whose training pass takes the row mask, or "
      'model_state="frozen"'
    )


def averaged_state(model: Model, params, center, delta):
  """``params`` with its state entries ``center + delta`` (``delta`` the weighted mean of the
  participants' differences: their weighted mean statistics), whatever step the server took on
  the parameters (a server learning rate, an optimizer)."""
  if not model.state_keys:
    return params
  return {
    **params,
    **{
      k: jax.tree.map(lambda c, d: (c + d).astype(c.dtype), center[k], delta[k])
      for k in model.state_keys
    },
  }


def _key_name(key) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def leaf_paths(params) -> Tuple[str, ...]:
  """The paths of ``params``' leaves (keys joined by ``/``), in ``jax.tree`` order."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return tuple("/".join(_key_name(k) for k in path) for path, _ in flat)


Partition = Union[str, Callable[[str], bool]]


def local_leaves(params, local: Partition) -> Tuple[bool, ...]:
  """Per leaf of ``params`` (``jax.tree`` order), whether it stays on the clients: ``local`` a
  predicate on the leaf's path or a regular expression searched in it."""
  paths = leaf_paths(params)
  if isinstance(local, str):
    try:
      pattern = re.compile(local)
    except re.error as e:
      raise ValueError(f"local must be a regular expression over leaf paths: {e}") from None
    return tuple(bool(pattern.search(p)) for p in paths)
  if not callable(local):
    raise TypeError(
      f"local must be a regular expression or a predicate on leaf paths, got {type(local).__name__}"
    )
  return tuple(bool(local(p)) for p in paths)


def state_leaves(model: Model, params) -> Tuple[bool, ...]:
  """Per leaf, whether it belongs to the model's state entries."""
  return tuple(p.split("/", 1)[0] in model.state_keys for p in leaf_paths(params))


def norm_layers(model: Model, params) -> Tuple[bool, ...]:
  """FedBN's local leaves: the model's state and the parameters of every layer that holds
  batch statistics (a leaf ``params/<layer>/scale`` is local when some state leaf lives under
  ``<state key>/<layer>/``)."""
  paths = leaf_paths(params)
  layers = {
    p.split("/", 1)[1].rsplit("/", 1)[0]
    for p in paths
    if p.split("/", 1)[0] in model.state_keys and "/" in p
  }

  def local(path: str) -> bool:
    top, _, rest = path.partition("/")
    return top in model.state_keys or rest.rsplit("/", 1)[0] in layers

  return tuple(local(p) for p in paths)


HEAD_NAMES = ("fc", "classifier", "head", "lm_head", "dense2", "out", "output", "logits")
"""The names of an output layer FedPer finds by itself: the zoo's (``fc`` of the ResNets,
``classifier`` of DenseNet and DistilBERT, ``dense2`` of the CIFAR CNN) and common ones."""


def last_layer(model: Model, params) -> Tuple[bool, ...]:
  """FedPer's default local leaves: the output layer, an entry of the trainable parameters
  (``params["params"]`` of a model with state, else ``params``) named in :data:`HEAD_NAMES`, else
  the ``Dense_k`` of largest ``k`` (Flax's automatic names, in creation order). The parameters'
  own order cannot say which layer is last: JAX sorts a dict's keys when it rebuilds one."""
  tree = params["params"] if model.state_keys else params
  keys = list(tree) if isinstance(tree, dict) else []
  named = [k for k in HEAD_NAMES if k in keys]
  dense = sorted(
    (int(m.group(1)), k) for k in keys for m in [re.fullmatch(r"Dense_(\d+)", str(k))] if m
  )
  head = named[0] if named else dense[-1][1] if dense else None
  if head is None:
    raise ValueError(
      f"fedper: no output layer among the parameters' entries {keys[:8]} (none is named "
      f"{', '.join(HEAD_NAMES)} or Dense_k): give head= a regular expression over the leaf paths"
    )
  prefix = f"params/{head}" if model.state_keys else str(head)
  return tuple(p == prefix or p.startswith(prefix + "/") for p in leaf_paths(params))


def described(partition: Optional[Partition]) -> str:
  """How ``Algorithm.config`` records a partition argument: ``"default"``, the regular
  expression, or the predicate's name."""
  if partition is None:
    return "default"
  return getattr(partition, "__qualname__", None) or str(partition)


def split_leaves(params, mask: Sequence[bool]):
  """``(shared leaves, local leaves)`` of ``params`` by ``mask`` (lists, ``jax.tree`` order)."""
  leaves = jax.tree.leaves(params)
  return [a for a, m in zip(leaves, mask) if not m], [a for a, m in zip(leaves, mask) if m]


def join_leaves(params, mask: Sequence[bool], shared, local):
  """``params``' structure with its shared and local leaves from the two lists."""
  shared, local = iter(shared), iter(local)
  leaves = [next(local) if m else next(shared) for m in mask]
  return jax.tree.unflatten(jax.tree.structure(params), leaves)


def default_partition(kind: str, model: Model, params, local: Optional[Partition]):
  """The local-leaf mask of FedBN (``kind="norm"``), FedPer (``"head"``) or local state
  (``"state"``), ``local`` overriding the default; refuses a partition with nothing local or
  nothing shared."""
  if local is not None:
    mask = local_leaves(params, local)
  elif kind == "norm":
    mask = norm_layers(model, params)
  elif kind == "head":
    mask = last_layer(model, params)
  else:
    mask = state_leaves(model, params)
  if not any(mask):
    what = {"norm": "normalization layers with batch statistics", "head": "head"}.get(kind, "")
    raise ValueError(
      f"the partition leaves no parameter on the clients (the model has no {what or 'state'}"
      f"; its leaves: {', '.join(leaf_paths(params)[:8])}...): give local= a regular expression "
      "over the leaf paths"
    )
  if all(mask):
    raise ValueError("the partition leaves no parameter shared: every leaf would stay local")
  return mask
