"""Server steps on the aggregated model difference: the adaptive steps of FedOpt and any optax
optimizer applied to the difference as a pseudo-gradient.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021 (arXiv:2003.00295), Algorithm 2. With ``Delta_t`` the weighted mean of
the participants' model differences of round ``t`` (``m_{-1} = 0``, ``v_{-1} = initial_v``)::

    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t = v_{t-1} + Delta_t^2                                         (FedAdagrad)
    v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                       (FedAdam)
    v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)   (FedYogi)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

``tau`` is added outside the root, as printed; ``bias_correction=True`` divides ``m_t`` by
``1 - beta1^(t+1)`` and ``v_t`` by ``1 - beta2^(t+1)`` first (Adam's form, FedAdam only: what
``optax.adam`` computes with ``eps = tau``). Algorithm 2 asks for ``v_{-1} >= tau^2`` in its
analysis; the default ``initial_v = 0`` is the form :func:`~fedjax_dro.algorithms.fedadam` has
always run (the difference is below ``tau`` in the first step's denominator), and
``initial_v = tau**2`` is the analysed one.

The FedOpt convention for optax (FedJAX's): the server hands ``-Delta_t`` to the optimizer as the
gradient and adds ``server_lr`` times the optimizer's update: ``optax.sgd(1.0)`` is FedAvg's step
and :func:`reddi_optimizer` returns the steps above as optax transformations (``eta`` is then
``server_lr`` times the optimizer's own rate, 1 for these).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_dro.common.checks import is_real
from fedjax_dro.core.aggregation import tree_add
from fedjax_dro.core.hparams import HParam
from fedjax_dro.core.model_state import averaged_state
from fedjax_dro.core.settings import round_zero, state_init

KINDS = ("adagrad", "adam", "yogi")


def second_moment(kind: str, v, d, b2):
  """``v_t`` of Algorithm 2 from ``v_{t-1}`` and ``Delta_t`` (``d``), one leaf."""
  if kind == "adagrad":
    return (v + d * d).astype(v.dtype)
  if kind == "adam":
    return (b2 * v + (1 - b2) * d * d).astype(v.dtype)
  if kind == "yogi":
    d2 = d * d
    return (v - (1 - b2) * d2 * jnp.sign(v - d2)).astype(v.dtype)
  raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def adaptive_step(kind: str, m, v, delta, *, b1, b2, tau, t=None):
  """``(m_t, v_t, step)``: Algorithm 2's moments from ``(m, v) = (m_{t-1}, v_{t-1})`` and the
  aggregated difference ``delta``, and the step ``m_t / (sqrt(v_t) + tau)`` that the server
  multiplies by ``eta`` (trees of the parameters' shape). ``t``: the round number ``t + 1`` of
  Adam's bias correction (None: none)."""
  m = jax.tree.map(lambda m, d: (b1 * m + (1 - b1) * d).astype(m.dtype), m, delta)
  v = jax.tree.map(lambda v, d: second_moment(kind, v, d, b2), v, delta)
  if t is not None:
    c1, c2 = 1 - b1**t, 1 - b2**t
    step = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v / c2) + tau), m, v)
  else:
    step = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + tau), m, v)
  return m, v, step


class Described(NamedTuple):
  """An optax transformation (``init``, ``update``) with the words ``Algorithm.config`` records
  for it (what :func:`reddi_optimizer` and :func:`named_server_optimizer` return)."""

  init: Callable
  update: Callable
  description: str


class ReddiState(NamedTuple):
  m: Any  # params-shaped first moment of Delta
  v: Any  # params-shaped second moment of Delta
  count: jnp.ndarray  # [] int32 steps done


def reddi_optimizer(
  kind: str,
  *,
  b1: float = 0.9,
  b2: float = 0.99,
  tau: float = 1e-3,
  bias_correction: bool = False,
  initial_v: float = 0.0,
) -> Described:
  """Algorithm 2's server step of ``kind`` (``"adagrad"``, ``"adam"`` or ``"yogi"``) as an optax
  transformation of the pseudo-gradient ``-Delta_t`` (see the module docstring): its update is
  ``m_t / (sqrt(v_t) + tau)``, the server's step at ``eta = 1``."""
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  if bias_correction and kind != "adam":
    raise ValueError(f"bias_correction is Adam's (kind='adam'), got kind={kind!r}")
  for name, value, top in (
    ("b1", b1, 1.0),
    ("b2", b2, 1.0),
    ("tau", tau, None),
    ("initial_v", initial_v, None),
  ):
    if not is_real(value) or value < 0 or (top is not None and value > top):
      where = f"[0, {top:g}]" if top is not None else "[0, inf)"
      raise ValueError(f"{name} must be a number in {where}, got {value!r}")

  def init(params):
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(lambda a: jnp.full_like(a, initial_v), params)
    return ReddiState(m, v, jnp.zeros((), jnp.int32))

  def update(grads, state, params=None):
    del params
    delta = jax.tree.map(jnp.negative, grads)
    t = (state.count + 1).astype(jnp.result_type(float)) if bias_correction else None
    m, v, step = adaptive_step(kind, state.m, state.v, delta, b1=b1, b2=b2, tau=tau, t=t)
    return step, ReddiState(m, v, state.count + 1)

  args = f"b1={b1}, b2={b2}, " if kind != "adagrad" else f"b1={b1}, "
  correction = ", bias_correction=True" if bias_correction else ""
  words = f"reddi_optimizer({kind!r}, {args}tau={tau}, initial_v={initial_v}{correction})"
  return Described(init, update, words)


def check_optimizer(optimizer, algorithm: str, argument: str = "server_optimizer"):
  """``optimizer`` if it is None or an optax transformation (an object with callable ``init``
  and ``update``), else a ``TypeError`` naming ``argument``."""
  if optimizer is None:
    return None
  if not isinstance(optimizer, optax.GradientTransformation) and not (
    callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))
  ):
    example = (
      "optax.sgd(1.0), optax.adam(1e-2), fedjax_dro.core.server.reddi_optimizer('yogi')"
      if argument == "server_optimizer"
      else "optax.sgd(1.0, momentum=0.9), optax.adam(1.0)"
    )
    raise TypeError(
      f"{algorithm}: {argument} must be an optax.GradientTransformation (e.g. {example}), got "
      f"{type(optimizer).__name__}"
    )
  return optimizer


def describe_optimizer(server_optimizer) -> Optional[str]:
  """How ``Algorithm.config`` records a server optimizer (None: the paper's plain step)."""
  if server_optimizer is None:
    return None
  what = getattr(server_optimizer, "description", None) or (
    f"an optax {type(server_optimizer).__name__}"
  )
  return f"{what} on -Delta (the pseudo-gradient), x += server_lr * update"


def describe_client_optimizer(client_optimizer) -> str:
  """How ``Algorithm.config`` records a client optimizer."""
  what = getattr(client_optimizer, "description", None) or (
    f"an optax {type(client_optimizer).__name__}"
  )
  return f"{what} on each local gradient, w += client_lr * update, its state fresh each round"


def optimizer_config(server_optimizer=None, client_optimizer=None) -> dict:
  """The ``Algorithm.config`` entries of the optimizers given (none for the paper's steps)."""
  out = {}
  if server_optimizer is not None:
    out["server_optimizer"] = describe_optimizer(server_optimizer)
  if client_optimizer is not None:
    out["client_optimizer"] = describe_client_optimizer(client_optimizer)
  return out


def server_step(server_optimizer, opt_state, params, delta, server_lr):
  """``(params', opt_state')``: ``params + server_lr * update`` of ``server_optimizer`` on the
  pseudo-gradient ``-delta`` (the parameters' dtypes kept)."""
  grads = jax.tree.map(jnp.negative, delta)
  updates, opt_state = server_optimizer.update(grads, opt_state, params)
  params = jax.tree.map(
    lambda x, u: (x + server_lr * u).astype(jnp.result_type(x)), params, updates
  )
  return params, opt_state


FEDAVG_HPARAMS = {
  "client_lr": HParam(0.1, "local SGD step size"),
  "server_lr": HParam(1.0, "server step on the averaged model difference"),
}
"""The hyper-parameters of FedAvg's round, which FedProx's extends: the local SGD step and the
server's step on the weighted mean model difference (1: plain averaging)."""


class FedAvgState(NamedTuple):
  """The state of a FedAvg-type algorithm (FedAvg, FedProx, FedSGD): the global model and a
  round counter."""

  params: Any  # global model pytree
  round: jnp.ndarray  # [] int32 rounds done


class ServerOptState(NamedTuple):
  """:class:`FedAvgState` with a server optimizer's state (``server_optimizer=``)."""

  params: Any  # global model pytree
  opt_state: Any  # the server optimizer's state (an optax state pytree)
  round: jnp.ndarray  # [] int32 rounds done


def optimizer_state_init(settings, initial_state: Callable, server_optimizer, opt_state_type):
  """``init`` of an algorithm with an optional ``server_optimizer``: the state
  ``initial_state(params, num_clients)`` (its last field the round counter) or, with an optimizer,
  ``opt_state_type``: the same fields with the optimizer's state before the round counter."""
  if server_optimizer is None:
    return state_init(settings, initial_state)

  def build(params, num_clients):
    *fields, rounds = initial_state(params, num_clients)
    return opt_state_type(*fields, server_optimizer.init(params), rounds)

  return state_init(settings, build)


def global_model_init(settings, server_optimizer=None):
  """``init`` of the algorithms whose whole state is the global model and a round counter (and,
  with a ``server_optimizer``, its state)."""
  initial_state = lambda params, num_clients: FedAvgState(params, round_zero())
  return optimizer_state_init(settings, initial_state, server_optimizer, ServerOptState)


class GlobalModelSetup(NamedTuple):
  """What a FedAvg-type algorithm with optional server and client optimizers builds once
  (:func:`global_model_setup`)."""

  server_optimizer: Any  # checked; None: the plain server step
  client_optimizer: Any  # checked; None: local SGD
  init: Callable  # the init of its state (:func:`global_model_init`)
  config: dict  # the Algorithm.config entries of the optimizers (:func:`optimizer_config`)


def global_model_setup(
  algorithm: str, settings, server_optimizer=None, client_optimizer=None
) -> GlobalModelSetup:
  """The optimizers of the FedAvg-type ``algorithm`` checked (:func:`check_optimizer`), the
  ``init`` of its state and the ``Algorithm.config`` entries of the optimizers."""
  server_optimizer = check_optimizer(server_optimizer, algorithm)
  client_optimizer = check_optimizer(client_optimizer, algorithm, "client_optimizer")
  return GlobalModelSetup(
    server_optimizer,
    client_optimizer,
    global_model_init(settings, server_optimizer),
    optimizer_config(server_optimizer, client_optimizer),
  )


def server_move(server_optimizer, state, center, delta, server_lr):
  """``(params, optimizer state)`` after the server's step: ``center + server_lr * delta`` (the
  plain step; no optimizer state, None), or ``server_optimizer``'s step from ``center`` on the
  pseudo-gradient ``-delta`` (from its state ``state.opt_state``)."""
  if server_optimizer is None:
    return tree_add(center, delta, server_lr), None
  return server_step(server_optimizer, state.opt_state, center, delta, server_lr)


def next_state(state, opt_state, *fields):
  """The state after a round: of ``state``'s type, ``fields``, then the server optimizer's
  ``opt_state`` if the state keeps one (an ``opt_state`` field: :func:`optimizer_state_init`),
  then the round counter plus one."""
  if "opt_state" in type(state)._fields:
    return type(state)(*fields, opt_state, state.round + 1)
  return type(state)(*fields, state.round + 1)


def server_update(server_optimizer, state, center, delta, server_lr, model=None):
  """The next state of a FedAvg-type server: ``center + server_lr * delta`` (the plain step), or
  ``server_optimizer``'s step on the pseudo-gradient ``-delta`` from ``center``. A ``model``
  with state gets the participants' mean statistics ``center + delta`` whatever the step
  (``model_state="average"``: :func:`~fedjax_dro.core.model_state.averaged_state`)."""
  params, opt_state = server_move(server_optimizer, state, center, delta, server_lr)
  if model is not None:
    params = averaged_state(model, params, center, delta)
  return next_state(state, opt_state, params)


# The server optimizers the command line names (``--server-optimizer NAME``), with the arguments
# each takes (``--server-option NAME=VALUE``) and their defaults; each at rate 1, ``server_lr``
# scaling its update.
NAMED = {
  "sgd": {},
  "momentum": {"momentum": 0.9},
  "adam": {"b1": 0.9, "b2": 0.99, "eps": 1e-3},
  "reddi-adam": {"b1": 0.9, "b2": 0.99, "tau": 1e-3, "initial_v": 0.0},
  "yogi": {"b1": 0.9, "b2": 0.99, "tau": 1e-3, "initial_v": 0.0},
  "adagrad": {"b1": 0.9, "tau": 1e-3, "initial_v": 0.0},
}


def named_server_optimizer(name: str, **options) -> optax.GradientTransformation:
  """The server optimizer ``name`` of :data:`NAMED` with ``options`` over its defaults:
  ``"sgd"`` (the plain step), ``"momentum"`` (``optax.sgd(1, momentum)``: FedAvgM), ``"adam"``
  (``optax.adam(1, b1, b2, eps)``: Adam's bias-corrected form), ``"reddi-adam"``, ``"yogi"``,
  ``"adagrad"`` (Algorithm 2's steps, :func:`reddi_optimizer`)."""
  if name not in NAMED:
    raise ValueError(f"server optimizer must be one of {sorted(NAMED)}, got {name!r}")
  unknown = sorted(set(options) - set(NAMED[name]))
  if unknown:
    raise ValueError(
      f"server optimizer {name!r} takes the options {sorted(NAMED[name])}, got {unknown}"
    )
  kw = {**NAMED[name], **options}
  for k, v in kw.items():
    if not is_real(v):
      raise ValueError(f"server optimizer option {k} must be a number, got {v!r}")
  if name in ("reddi-adam", "yogi", "adagrad"):
    return reddi_optimizer("adam" if name == "reddi-adam" else name, **kw)
  if name == "sgd":
    opt = optax.sgd(1.0)
  elif name == "momentum":
    opt = optax.sgd(1.0, momentum=kw["momentum"])
  else:
    opt = optax.adam(1.0, b1=kw["b1"], b2=kw["b2"], eps=kw["eps"])
  args = ", ".join(f"{k}={v}" for k, v in kw.items())
  return Described(
    opt.init,
    opt.update,
    f"optax.{'adam' if name == 'adam' else 'sgd'}(1.0" + (f", {args})" if args else ")"),
  )
