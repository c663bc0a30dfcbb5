"""Convolutions in canonical layout, forward and backward: how XLA:CPU runs them at full speed
inside loops.

XLA:CPU runs a convolution fast only in its canonical layout (batch, spatial, feature inputs;
spatial, input-feature, output-feature kernels). At the top level of a program its layout passes
bring every convolution there, but inside a loop body (every round of the simulator is a
``lax.scan`` of ``lax.map`` and ``lax.scan``) the gradients' convolutions keep the layout the
autodiff transpose gives them: the weight gradient ``f01b_i01o->01bf`` and the input gradient's
``01oi`` kernel, which XLA:CPU computes an order of magnitude slower (measured on 2 cores: a
3 x 3 convolution 32 -> 64 channels on 16 x 16 images, the weight gradient 260 ms in a loop
against 10 ms at the top level; the open JAX report is jax-ml/jax issue 12868).

:func:`canonical_convs` rewrites a function so that every convolution it computes, and every
convolution of its gradient, takes canonical operands that are laid out explicitly (transposes
behind ``lax.optimization_barrier``, which XLA cannot fold back into the convolution), then
transposes the result back: the same numbers (the convolutions are the same sums), at top-level
speed inside loops. The rewrite evaluates the function's jaxpr with each ``conv_general_dilated``
replaced (nested ``jit`` calls are inlined); convolutions inside other control flow of the
function, and grouped convolutions (``feature_group_count`` or ``batch_group_count`` above 1:
depthwise layers, the patches form of the built-in CNN), keep XLA's form. A function without
convolutions is returned as it is. Whether the simulator applies it is ``Tuning.canonical_conv``
(on by default on the CPU, by measurement: ``benchmarks/conv_loops.py``).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jex_core

CONV = lax.conv_general_dilated_p


def _identity(perm) -> bool:
  return tuple(perm) == tuple(range(len(perm)))


def canonical_conv(lhs, rhs, params: dict):
  """``conv_general_dilated`` with ``params`` (an equation's) computed on operands transposed
  to the canonical layout, the result transposed back to the layout ``params`` asks for."""
  dn = params["dimension_numbers"]
  ls, rs, os_ = dn.lhs_spec, dn.rhs_spec, dn.out_spec
  nd = len(ls) - 2
  lperm, rperm = (ls[0], *ls[2:], ls[1]), (*rs[2:], rs[1], rs[0])
  moved = not (_identity(lperm) and _identity(rperm))
  if moved:
    lhs, rhs = lax.optimization_barrier((jnp.transpose(lhs, lperm), jnp.transpose(rhs, rperm)))
  canonical = lax.ConvDimensionNumbers(
    lhs_spec=(0, nd + 1, *range(1, nd + 1)),
    rhs_spec=(nd + 1, nd, *range(nd)),
    out_spec=(0, nd + 1, *range(1, nd + 1)),
  )
  out = CONV.bind(lhs, rhs, **{**params, "dimension_numbers": canonical})
  source = [0] * (nd + 2)  # the canonical axis each axis of the result comes from
  source[os_[0]], source[os_[1]] = 0, nd + 1
  for i in range(nd):
    source[os_[2 + i]] = 1 + i
  if _identity(source):
    return out
  return jnp.transpose(lax.optimization_barrier(out), source)


def _plain(params):
  return lambda a, b: CONV.bind(a, b, **params)


def _rewritable(params) -> bool:
  return params.get("feature_group_count", 1) == 1 and params.get("batch_group_count", 1) == 1


def _fast_conv(lhs, rhs, params: dict):
  """A convolution whose forward and backward convolutions are all canonical."""

  @jax.custom_vjp
  def conv(a, b):
    return canonical_conv(a, b, params)

  def forward(a, b):
    return canonical_conv(a, b, params), (a, b)

  def backward(saved, g):
    def grads(a, b, g):
      return jax.vjp(_plain(params), a, b)[1](g)

    return tuple(_rewrite(grads, canonical_conv)(*saved, g))

  conv.defvjp(forward, backward)
  return conv(lhs, rhs)


def _has_conv(jaxpr) -> bool:
  for eqn in jaxpr.eqns:
    if eqn.primitive is CONV and _rewritable(eqn.params):
      return True
    if eqn.primitive.name in ("pjit", "jit") and _has_conv(eqn.params["jaxpr"].jaxpr):
      return True
  return False


def _evaluate(jaxpr, consts, args, replace: Callable):
  """``jaxpr`` evaluated with each rewritable convolution computed by ``replace(lhs, rhs,
  params)`` and nested ``jit`` calls inlined."""
  env = {}

  def read(v):
    return v.val if isinstance(v, jex_core.Literal) else env[v]

  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    values = [read(v) for v in eqn.invars]
    if eqn.primitive is CONV and _rewritable(eqn.params):
      out = replace(*values, eqn.params)
    elif eqn.primitive.name in ("pjit", "jit"):
      inner = eqn.params["jaxpr"]
      out = _evaluate(inner.jaxpr, inner.consts, values, replace)
    else:
      out = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))
    if eqn.primitive.multiple_results:
      env.update(zip(eqn.outvars, out))
    else:
      env[eqn.outvars[0]] = out
  return [read(v) for v in jaxpr.outvars]


def _rewrite(fn: Callable, replace: Callable) -> Callable:
  def rewritten(*args):
    closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    if not _has_conv(closed.jaxpr):
      return fn(*args)
    out = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args), replace)
    return jax.tree.unflatten(jax.tree.structure(shape), out)

  return rewritten


def canonical_convs(fn: Callable) -> Callable:
  """``fn`` with every convolution of its forward and backward passes in canonical layout (see
  the module docstring): the same results, fast inside loops on XLA:CPU."""
  return _rewrite(fn, _fast_conv)
