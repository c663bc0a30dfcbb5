"""Models written in Flax NNX or in Equinox, as a :class:`~fedjax_dro.common.model.Model`.

A :class:`Model`'s parameters are a plain pytree that the simulator stacks over clients (one row
per client, vmapped); the module's structure and its non-array attributes stay outside it. Only
trainable weights can be stacked this way: a module that also carries mutable state (batch
statistics, RNG streams, caches, Equinox's ``StateIndex``) is refused, naming each such variable,
since one client's update would have to return that state beside its weights and the algorithms
here exchange weights only.

* :func:`from_nnx`: a ``flax.nnx.Module`` (or a constructor ``rngs -> Module``): the parameters
  are its ``nnx.Param`` variables as a nested dict (``State.to_pure_dict``).
* :func:`from_equinox`: an ``equinox.Module`` (or a constructor ``key -> Module``): the parameters
  are its floating-point arrays (``eqx.partition(module, eqx.is_inexact_array)``); Equinox is an
  optional extra (``pip install "fedjax-dro[equinox]"``).

Given an instance, every run starts from the instance's own weights (the run's seed then draws
clients and minibatches only); given a constructor, ``Model.init(key)`` builds the module from the
run's key, as the built-in models do.
"""

from __future__ import annotations

import re
from typing import Callable, Optional, Union

import jax

from fedjax_dro.common.model import Model
from fedjax_dro.models.builtin import check_l2, loss_and_task


def _shown(obj) -> str:
  text = getattr(obj, "__qualname__", None) or repr(obj)
  return re.sub(r" at 0x[0-9a-fA-F]+", "", " ".join(str(text).split()))


def _refuse_state(kind: str, found):
  if found:
    listed = ", ".join(f"{path} ({what})" for path, what in found[:8])
    more = f" and {len(found) - 8} more" if len(found) > 8 else ""
    raise ValueError(
      f"the {kind} module holds state the simulator cannot stack over clients: {listed}{more}. "
      f"Supported: trainable weights only ({'nnx.Param' if kind == 'NNX' else 'inexact arrays'}); "
      f"batch statistics, RNG streams and other mutable variables are not (use a module without "
      f"them, e.g. LayerNorm or GroupNorm for BatchNorm, and no Dropout)"
    )


def _instance(module, module_type, what: str, abstract):
  """``(instance, make)``: ``module`` itself and None when it is a ``module_type``, else the
  constructor's module built abstractly (``abstract(make)``) and the constructor ``make``."""
  if isinstance(module, module_type):
    return module, None
  if not callable(module):
    raise TypeError(f"module must be {what}, got {type(module).__name__}")
  instance = abstract(module)
  if not isinstance(instance, module_type):
    raise TypeError(f"module must be {what}; the constructor returned {type(instance).__name__}")
  return instance, module


def _init(make, weights, build):
  """``Model.init``: a copy of the instance's own ``weights`` (no constructor), else the weights
  of ``build(key)`` (the constructor's module built from the run's key), compiled."""
  if make is None:

    def init(key):
      del key  # the instance's own weights
      return jax.tree.map(lambda a: a, weights)

    return init
  return jax.jit(build)


def _model(init, apply, instance, make, head, l2, name, adapter: str, options: str = "") -> Model:
  """The :class:`Model` of an adapted module: ``head`` is the ``loss`` and ``metrics`` given and
  their ``(loss_fn, metrics_fn, task)`` (:func:`~fedjax_dro.models.builtin.loss_and_task`); its
  identity names the ``adapter``, the module (its constructor, else its class), ``options`` and
  the loss and metrics given."""
  loss, metrics, loss_fn, metrics_fn, task = head
  what = _shown(make) if make is not None else _shown(type(instance))
  return Model(
    init,
    apply,
    loss_fn,
    metrics_fn,
    task=task,
    l2=float(l2),
    name=name or type(instance).__name__,
    identity=f"{adapter}({what}{options}, loss={_shown(loss)}, metrics={_shown(metrics)})",
  )


def from_nnx(
  module,
  *,
  loss: Union[str, Callable] = "softmax_cross_entropy",
  metrics: Optional[Callable] = None,
  task: Optional[str] = None,
  l2: float = 0.0,
  name: Optional[str] = None,
) -> Model:
  """Adapts a Flax NNX module to a :class:`~fedjax_dro.common.model.Model`.

  Args:
    module: a ``flax.nnx.Module`` whose ``__call__(x)`` maps a batch ``[m, ...]`` to outputs, or
      a constructor ``rngs -> Module`` (``Model.init(key)`` then builds it with
      ``nnx.Rngs(key)``). Its variables must all be ``nnx.Param``.
    loss: ``"softmax_cross_entropy"`` (default), ``"sigmoid_cross_entropy"``,
      ``"squared_error"`` or a callable ``(outputs, y) -> per-example loss`` (as
      :func:`~fedjax_dro.models.from_flax`'s).
    metrics: callable ``(outputs, y) -> dict of per-example metrics`` (defaults follow ``loss``).
    task: ``"classification"`` or ``"regression"`` (defaults follow ``loss``).
    l2: coefficient of ``l2/2 ||params||^2`` added to every client objective (default 0).
    name: the model's name in results (default: the module's class name).

  Returns:
    A :class:`~fedjax_dro.common.model.Model` whose parameters are the module's ``nnx.Param``
    values as a nested dict.
  """
  from flax import nnx

  instance, make = _instance(
    module,
    nnx.Module,
    "a flax.nnx.Module or a constructor rngs -> Module",
    lambda make: nnx.eval_shape(lambda: make(nnx.Rngs(0))),
  )
  head = (loss, metrics, *loss_and_task(loss, metrics, task))
  l2 = check_l2(l2)
  graphdef, params, rest = nnx.split(instance, nnx.Param, ...)
  found = [
    (jax.tree_util.keystr(path), type(v).__name__)
    for path, v in jax.tree_util.tree_leaves_with_path(
      rest, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
  ]
  _refuse_state("NNX", found)
  template = params
  pure = getattr(nnx, "to_pure_dict", lambda state: state.to_pure_dict())

  def build(key):
    return pure(nnx.split(make(nnx.Rngs(key)), nnx.Param, ...)[1])

  def apply(p, x):
    state = jax.tree.map(lambda a: a, template)
    nnx.replace_by_pure_dict(state, p)
    return nnx.merge(graphdef, state)(x)

  init = _init(make, pure(params) if make is None else None, build)
  return _model(init, apply, instance, make, head, l2, name, "from_nnx")


def from_equinox(
  module,
  *,
  per_example: bool = True,
  loss: Union[str, Callable] = "softmax_cross_entropy",
  metrics: Optional[Callable] = None,
  task: Optional[str] = None,
  l2: float = 0.0,
  name: Optional[str] = None,
) -> Model:
  """Adapts an Equinox module to a :class:`~fedjax_dro.common.model.Model`.

  Args:
    module: an ``equinox.Module``, or a constructor ``key -> Module`` (``Model.init(key)`` then
      builds it from the run's key). It must hold no ``equinox.nn.StateIndex`` (batch norm's
      running statistics and other mutable state).
    per_example: True (default, Equinox's convention): ``module(x)`` maps one example and the
      model vmaps it over the batch; False: ``module(x)`` maps a batch ``[m, ...]``.
    loss: ``"softmax_cross_entropy"`` (default), ``"sigmoid_cross_entropy"``,
      ``"squared_error"`` or a callable ``(outputs, y) -> per-example loss`` (as
      :func:`~fedjax_dro.models.from_flax`'s).
    metrics: callable ``(outputs, y) -> dict of per-example metrics`` (defaults follow ``loss``).
    task: ``"classification"`` or ``"regression"`` (defaults follow ``loss``).
    l2: coefficient of ``l2/2 ||params||^2`` added to every client objective (default 0).
    name: the model's name in results (default: the module's class name).

  Returns:
    A :class:`~fedjax_dro.common.model.Model` whose parameters are the module's floating-point
    arrays (the module's other leaves held as static).
  """
  try:
    import equinox as eqx
  except ImportError:  # pragma: no cover - the optional extra
    raise ImportError(
      'from_equinox needs Equinox: pip install "fedjax-dro[equinox]" (or pip install equinox)'
    ) from None
  if not isinstance(per_example, bool):
    raise TypeError(f"per_example must be a bool, got {per_example!r}")
  instance, make = _instance(
    module,
    eqx.Module,
    "an equinox.Module or a constructor key -> Module",
    lambda make: eqx.filter_eval_shape(make, jax.random.PRNGKey(0)),
  )
  head = (loss, metrics, *loss_and_task(loss, metrics, task))
  l2 = check_l2(l2)
  is_state = lambda v: isinstance(v, eqx.nn.StateIndex)  # noqa: E731
  found = [
    (jax.tree_util.keystr(path), type(v).__name__)
    for path, v in jax.tree_util.tree_leaves_with_path(instance, is_leaf=is_state)
    if is_state(v)
  ]
  _refuse_state("Equinox", found)
  params, static = eqx.partition(instance, eqx.is_inexact_array)

  def build(key):
    return eqx.partition(make(key), eqx.is_inexact_array)[0]

  def apply(p, x):
    model = eqx.combine(p, static)
    return jax.vmap(model)(x) if per_example else model(x)

  init = _init(make, params, build)
  sig = "" if per_example else ", per_example=False"
  return _model(init, apply, instance, make, head, l2, name, "from_equinox", sig)
