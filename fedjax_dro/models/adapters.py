"""Models written in Flax NNX or in Equinox, as a :class:`~fedjax_dro.common.model.Model`.

A :class:`Model`'s parameters are a plain pytree that the simulator stacks over clients (one row
per client, vmapped); the module's structure and its non-array attributes stay outside it.

* :func:`from_nnx`: a ``flax.nnx.Module`` (or a constructor ``rngs -> Module``): the parameters
  are its ``nnx.Param`` variables as a nested dict (``State.to_pure_dict``). Batch statistics
  (``nnx.BatchStat``, e.g. ``nnx.BatchNorm``'s) are model state, under the key ``"batch_stats"``
  (``Model.state_keys``); RNG streams (``nnx.Rngs`` held by ``nnx.Dropout`` or ``nnx.RNN``) are
  neither: they are re-seeded from the training step's key. ``Model.apply`` runs the module in
  ``eval()`` mode, ``Model.train_apply`` in ``train()`` mode.
* :func:`from_equinox`: an ``equinox.Module`` (or a constructor ``key -> Module``): the parameters
  are its floating-point arrays (``eqx.partition(module, eqx.is_inexact_array)``); Equinox state
  (``eqx.nn.StateIndex``, e.g. ``eqx.nn.BatchNorm``'s) is model state under the key ``"state"``,
  and ``eqx.nn.Dropout`` draws from the training step's key, in Equinox's calling convention
  (``module(x, state, *, key)``, see :func:`from_equinox`). Equinox is an optional extra
  (``pip install "fedjax-dro[equinox]"``).

A module with neither state nor randomness is a deterministic function: ``Model.apply`` only, its
parameters the bare weights. Any other mutable variable (NNX caches, intermediates, custom
``nnx.Variable`` types) is refused, naming each such variable, since one client's update returns
only its weights and its batch statistics.

Given an instance, every run starts from the instance's own weights (the run's seed then draws
clients and minibatches only); given a constructor, ``Model.init(key)`` builds the module from the
run's key, as the built-in models do.
"""

from __future__ import annotations

import inspect
import re
from typing import Callable, Optional, Union

import jax
import jax.numpy as jnp

from fedjax_dro.common.model import Model
from fedjax_dro.models.builtin import check_l2, loss_and_task


def _shown(obj) -> str:
  text = getattr(obj, "__qualname__", None) or repr(obj)
  return re.sub(r" at 0x[0-9a-fA-F]+", "", " ".join(str(text).split()))


def _refuse_state(kind: str, found):
  if found:
    listed = ", ".join(f"{path} ({what})" for path, what in found[:8])
    more = f" and {len(found) - 8} more" if len(found) > 8 else ""
    supported = (
      "nnx.Param (weights), nnx.BatchStat (batch statistics) and RNG streams (nnx.Rngs)"
      if kind == "NNX"
      else "inexact arrays (weights) and eqx.nn.StateIndex (state)"
    )
    raise ValueError(
      f"the {kind} module holds state the simulator cannot stack over clients: {listed}{more}. "
      f"Supported: {supported}; caches, intermediates and other mutable variables are not"
    )


def _takes(fn, name: str) -> bool:
  """Whether ``fn`` takes the keyword argument ``name``."""
  try:
    params = inspect.signature(fn).parameters
  except (TypeError, ValueError):  # pragma: no cover - a callable without a signature
    return False
  p = params.get(name)
  return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def _typed_key(rng):
  """``rng`` as a typed PRNG key (a raw ``uint32[2]`` key wrapped, as ``jax.random.key``'s)."""
  rng = jnp.asarray(rng)
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return rng
  return jax.random.wrap_key_data(rng)


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


def _model(
  init, apply, instance, make, head, l2, name, adapter: str, options: str = "", **train
) -> Model:
  """The :class:`Model` of an adapted module: ``head`` is the ``loss`` and ``metrics`` given and
  their ``(loss_fn, metrics_fn, task)`` (:func:`~fedjax_dro.models.builtin.loss_and_task`); its
  identity names the ``adapter``, the module (its constructor, else its class), ``options`` and
  the loss and metrics given; ``train``: the training mode's fields (``train_apply``,
  ``state_keys``, ``state_masked``)."""
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
    **train,
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

  A module of ``nnx.Param`` variables only is a deterministic function: its parameters are the
  ``nnx.Param`` values as a nested dict and ``Model.apply`` calls it. A module that also holds
  batch statistics (``nnx.BatchStat``, ``nnx.BatchNorm``'s) or RNG streams (``nnx.Rngs`` kept by
  ``nnx.Dropout`` or ``nnx.RNN``) gets a training mode:

  * ``Model.apply(params, x)`` calls a copy of the module set to ``eval()`` (running averages,
    no dropout);
  * ``Model.train_apply(params, x, mask, rng)`` calls a copy set to ``train()`` (batch
    statistics of the minibatch, dropout) whose every RNG stream is re-seeded from ``rng`` (the
    ``i``-th stream's key, in the order of the pure dict's leaves, ``fold_in(rng, i)``, its count
    0: the result depends on ``rng`` only),
    and returns its outputs and the updated ``{"batch_stats": ...}`` (``{}`` without batch
    statistics). When ``__call__`` takes a ``mask`` keyword, a module with batch statistics is
    passed the minibatch's valid rows ``[m]`` there (e.g. for
    ``nnx.BatchNorm(...)(x, mask=mask[:, None])``: statistics of the valid rows only,
    ``Model.state_masked``).

  With batch statistics the parameters are ``{"params": <Param dict>, "batch_stats": <BatchStat
  dict>}`` and ``Model.state_keys == ("batch_stats",)``; RNG streams are not parameters. Any
  other variable type is refused, by name.

  Args:
    module: a ``flax.nnx.Module`` whose ``__call__(x)`` maps a batch ``[m, ...]`` to outputs, or
      a constructor ``rngs -> Module`` (``Model.init(key)`` then builds it with
      ``nnx.Rngs(key)``). Its variables must be ``nnx.Param``, ``nnx.BatchStat`` or RNG streams.
    loss: ``"softmax_cross_entropy"`` (default), ``"sigmoid_cross_entropy"``,
      ``"squared_error"`` or a callable ``(outputs, y) -> per-example loss`` (as
      :func:`~fedjax_dro.models.from_flax`'s).
    metrics: callable ``(outputs, y) -> dict of per-example metrics`` (defaults follow ``loss``).
    task: ``"classification"`` or ``"regression"`` (defaults follow ``loss``).
    l2: coefficient of ``l2/2 ||params||^2`` added to every client objective (default 0).
    name: the model's name in results (default: the module's class name).

  Returns:
    A :class:`~fedjax_dro.common.model.Model` whose parameters are the module's ``nnx.Param``
    values as a nested dict (with batch statistics, beside them under ``"batch_stats"``).
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
  graphdef, params, stats, streams, rest = nnx.split(
    instance, nnx.Param, nnx.BatchStat, nnx.RngState, ...
  )
  found = [
    (jax.tree_util.keystr(path), type(v).__name__)
    for path, v in jax.tree_util.tree_leaves_with_path(
      rest, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
  ]
  _refuse_state("NNX", found)
  pure = getattr(nnx, "to_pure_dict", lambda state: state.to_pure_dict())
  stateful, random = bool(jax.tree.leaves(stats)), bool(jax.tree.leaves(streams))
  if not stateful and not random:
    graphdef, params, _ = nnx.split(instance, nnx.Param, ...)
    template = params

    def build(key):
      return pure(nnx.split(make(nnx.Rngs(key)), nnx.Param, ...)[1])

    def apply(p, x):
      state = jax.tree.map(lambda a: a, template)
      nnx.replace_by_pure_dict(state, p)
      return nnx.merge(graphdef, state)(x)

    init = _init(make, pure(params) if make is None else None, build)
    return _model(init, apply, instance, make, head, l2, name, "from_nnx")

  def weights(state_params, state_stats):
    if not stateful:
      return pure(state_params)
    return {"params": pure(state_params), "batch_stats": pure(state_stats)}

  stream_leaves, stream_def = jax.tree.flatten(pure(streams))
  # The i-th key (in the order of the pure dict's leaves) is seeded fold_in(rng, i); counts: -1.
  is_key = [jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) for a in stream_leaves]
  stream_index = [sum(is_key[:j]) if k else -1 for j, k in enumerate(is_key)]

  def module_of(p, rng):
    """A fresh module of the weights and statistics ``p``, its RNG streams seeded from ``rng``."""
    state_params, state_stats, state_streams = (
      jax.tree.map(lambda a: a, t) for t in (params, stats, streams)
    )
    nnx.replace_by_pure_dict(state_params, p["params"] if stateful else p)
    if stateful:
      nnx.replace_by_pure_dict(state_stats, p["batch_stats"])
    if random:
      key = _typed_key(rng)
      seeded = [
        jax.random.fold_in(key, i) if i >= 0 else jnp.zeros(a.shape, a.dtype)
        for a, i in zip(stream_leaves, stream_index)
      ]
      nnx.replace_by_pure_dict(state_streams, jax.tree.unflatten(stream_def, seeded))
    return nnx.merge(graphdef, state_params, state_stats, state_streams)

  takes_mask = stateful and _takes(instance.__call__, "mask")

  def build(key):
    _, p, b, _ = nnx.split(make(nnx.Rngs(key)), nnx.Param, nnx.BatchStat, ...)
    return weights(p, b)

  def apply(p, x):
    net = module_of(p, jax.random.PRNGKey(0))
    net.eval()
    return net(x)

  def train_apply(p, x, mask, rng):
    net = module_of(p, jax.random.PRNGKey(0) if rng is None else rng)
    net.train()
    out = net(x, mask=mask) if takes_mask else net(x)
    if not stateful:
      return out, {}
    return out, {"batch_stats": pure(nnx.state(net, nnx.BatchStat))}

  init = _init(make, weights(params, stats) if make is None else None, build)
  return _model(
    init,
    apply,
    instance,
    make,
    head,
    l2,
    name,
    "from_nnx",
    train_apply=train_apply,
    state_keys=("batch_stats",) if stateful else (),
    state_masked=takes_mask,
  )


def from_equinox(
  module,
  *,
  per_example: bool = True,
  axis_name: str = "batch",
  loss: Union[str, Callable] = "softmax_cross_entropy",
  metrics: Optional[Callable] = None,
  task: Optional[str] = None,
  l2: float = 0.0,
  name: Optional[str] = None,
) -> Model:
  """Adapts an Equinox module to a :class:`~fedjax_dro.common.model.Model`.

  A module without ``eqx.nn.StateIndex`` and without ``eqx.nn.Dropout`` is a deterministic
  function ``module(x)``: ``Model.apply`` only, the parameters its floating-point arrays.

  State and dropout follow Equinox's conventions (its BatchNorm example):

  * with state (``eqx.nn.StateIndex``, e.g. ``eqx.nn.BatchNorm(..., axis_name="batch")``):
    ``module(x, state, *, key=None) -> (outputs, state)``; the module is given as built
    (``Cls(...)``, its state then ``eqx.nn.State(module)``) or as the pair
    ``eqx.nn.make_with_state(Cls)(...)`` (a constructor may return either). The parameters are
    ``{"params": <inexact arrays>, "state": <the state's arrays, a tuple>}`` (its integer and
    boolean arrays, e.g. BatchNorm's first-step flag, stored as floats and cast back in each
    call) and ``Model.state_keys == ("state",)``;
  * with dropout only: ``module(x, *, key=None) -> outputs``;
  * ``per_example=True`` (default): ``module`` maps one example and the model vmaps it over the
    batch under the axis name ``axis_name`` (``jax.vmap(module, axis_name=axis_name,
    in_axes=(0, None), out_axes=(0, None))``, the name BatchNorm's ``axis_name`` must be), each
    example drawing dropout from its own key (``jax.random.split(rng, m)``); False: ``module``
    maps the batch ``[m, ...]`` (its batch axis its own business) with the key ``rng``;
  * ``Model.apply`` calls ``eqx.nn.inference_mode(module)`` (running statistics, no dropout, no
    key) and drops the state; ``Model.train_apply(params, x, mask, rng)`` calls
    ``eqx.nn.inference_mode(module, False)`` with ``key=rng`` and returns the outputs and the
    new ``{"state": ...}`` (``{}`` without state). The mask is not passed: the batch statistics
    count every row (``Model.state_masked`` False).

  Args:
    module: an ``equinox.Module``, or a constructor ``key -> Module`` (``Model.init(key)`` then
      builds it from the run's key); with state also the pair ``(module, state)`` or a
      constructor returning it, as above.
    per_example: True (default, Equinox's convention): ``module(x)`` maps one example and the
      model vmaps it over the batch; False: ``module(x)`` maps a batch ``[m, ...]``.
    axis_name: the name of the batch axis of ``per_example``'s vmap (default ``"batch"``).
    loss: ``"softmax_cross_entropy"`` (default), ``"sigmoid_cross_entropy"``,
      ``"squared_error"`` or a callable ``(outputs, y) -> per-example loss`` (as
      :func:`~fedjax_dro.models.from_flax`'s).
    metrics: callable ``(outputs, y) -> dict of per-example metrics`` (defaults follow ``loss``).
    task: ``"classification"`` or ``"regression"`` (defaults follow ``loss``).
    l2: coefficient of ``l2/2 ||params||^2`` added to every client objective (default 0).
    name: the model's name in results (default: the module's class name).

  Returns:
    A :class:`~fedjax_dro.common.model.Model` whose parameters are the module's floating-point
    arrays (the module's other leaves held as static), with state as above.
  """
  try:
    import equinox as eqx
  except ImportError:  # pragma: no cover - the optional extra
    raise ImportError(
      'from_equinox needs Equinox: pip install "fedjax-dro[equinox]" (or pip install equinox)'
    ) from None
  if not isinstance(per_example, bool):
    raise TypeError(f"per_example must be a bool, got {per_example!r}")
  if not isinstance(axis_name, str) or not axis_name:
    raise TypeError(f"axis_name must be a non-empty str, got {axis_name!r}")
  is_state = lambda v: isinstance(v, eqx.nn.StateIndex)  # noqa: E731
  is_pair = lambda v: (  # noqa: E731
    isinstance(v, tuple)
    and len(v) == 2
    and isinstance(v[0], eqx.Module)
    and isinstance(v[1], eqx.nn.State)
  )

  def split_pair(built):
    """``(module, state or None)`` of a module or a ``make_with_state`` pair."""
    if is_pair(built):
      return built
    if isinstance(built, tuple):
      return built, None  # refused below
    if isinstance(built, eqx.Module) and any(
      is_state(v) for v in jax.tree.leaves(built, is_leaf=is_state)
    ):
      return eqx.nn.delete_init_state(built), eqx.nn.State(built)
    return built, None

  what = "an equinox.Module, a pair (module, eqx.nn.State) or a constructor key -> Module"
  if isinstance(module, eqx.Module) or is_pair(module):
    (instance, state0), make = split_pair(module), None
  elif callable(module) and not isinstance(module, tuple):
    make = module
    built = eqx.filter_eval_shape(
      lambda k: (lambda b: split_pair(b) if isinstance(b, (eqx.Module, tuple)) else (b, None))(
        make(k)
      ),
      jax.random.PRNGKey(0),
    )
    instance, state0 = built
    if not isinstance(instance, eqx.Module) or isinstance(instance, tuple):
      raise TypeError(f"module must be {what}; the constructor returned {type(instance).__name__}")
  else:
    raise TypeError(f"module must be {what}, got {type(module).__name__}")
  head = (loss, metrics, *loss_and_task(loss, metrics, task))
  l2 = check_l2(l2)
  stateful = state0 is not None
  random = any(
    isinstance(v, eqx.nn.Dropout)
    for v in jax.tree.leaves(instance, is_leaf=lambda v: isinstance(v, eqx.nn.Dropout))
  )
  params, static = eqx.partition(instance, eqx.is_inexact_array)
  sig = "" if per_example else ", per_example=False"
  if not stateful and not random:

    def build(key):
      return eqx.partition(make(key), eqx.is_inexact_array)[0]

    def apply(p, x):
      model = eqx.combine(p, static)
      return jax.vmap(model)(x) if per_example else model(x)

    init = _init(make, params, build)
    return _model(init, apply, instance, make, head, l2, name, "from_equinox", sig)

  state_def = jax.tree.structure(state0) if stateful else None

  state_dtypes = [a.dtype for a in jax.tree.leaves(state0)] if stateful else []
  real = jnp.result_type(float)

  def state_leaves(state):
    """The state's arrays, a tuple; integer and boolean ones (BatchNorm's counters and flags) as
    floats, so that every entry of the parameters is differentiable and can be averaged."""
    return tuple(
      a if jnp.issubdtype(a.dtype, jnp.inexact) else jnp.asarray(a, real)
      for a in jax.tree.leaves(state)
    )

  def state_of(leaves):
    """The ``eqx.nn.State`` of ``state_leaves``, each array in its own dtype again."""
    return jax.tree.unflatten(
      state_def,
      [
        a if jnp.issubdtype(dt, jnp.inexact) else jnp.round(a).astype(dt) if dt != bool else a != 0
        for a, dt in zip(leaves, state_dtypes)
      ],
    )

  def weights(p, state):
    return {"params": p, "state": state_leaves(state)} if stateful else p

  # An abstract instance (a constructor's) holds ShapeDtypeStructs where the weights will be.
  params, static = eqx.partition(
    instance,
    lambda v: (
      eqx.is_inexact_array(v)
      or (isinstance(v, jax.ShapeDtypeStruct) and jnp.issubdtype(v.dtype, jnp.inexact))
    ),
  )
  params_def = jax.tree.structure(params)

  def build(key):
    # The instance's tree structures (a class's StateIndex markers differ between builds).
    model, state = split_pair(make(key))
    p = jax.tree.leaves(eqx.partition(model, eqx.is_inexact_array)[0])
    return weights(jax.tree.unflatten(params_def, p), state)

  def call(p, x, key, inference: bool):
    """``(outputs, state)`` of the module of ``p`` (state None without state)."""
    model = eqx.nn.inference_mode(eqx.combine(p["params"] if stateful else p, static), inference)
    kw = {} if inference else {"key": key}
    if stateful:
      state = state_of(p["state"])
      if not per_example:
        return model(x, state, **kw)
      keys = None if inference else jax.random.split(key, x.shape[0])
      one = lambda xi, s, k: model(xi, s, **({} if k is None else {"key": k}))  # noqa: E731
      return jax.vmap(one, axis_name=axis_name, in_axes=(0, None, 0), out_axes=(0, None))(
        x, state, keys
      )
    if not per_example:
      return model(x, **kw), None
    if inference:
      return jax.vmap(model, axis_name=axis_name)(x), None
    keys = jax.random.split(key, x.shape[0])
    return jax.vmap(lambda xi, k: model(xi, key=k), axis_name=axis_name)(x, keys), None

  def apply(p, x):
    return call(p, x, None, True)[0]

  def train_apply(p, x, mask, rng):
    del mask  # the statistics count every row (state_masked False)
    out, state = call(p, x, jax.random.PRNGKey(0) if rng is None else rng, False)
    return out, ({"state": state_leaves(state)} if stateful else {})

  init = _init(make, weights(params, state0) if make is None else None, build)
  if axis_name != "batch":
    sig += f", axis_name={axis_name!r}"
  return _model(
    init,
    apply,
    instance,
    make,
    head,
    l2,
    name,
    "from_equinox",
    sig,
    train_apply=train_apply,
    state_keys=("state",) if stateful else (),
  )
