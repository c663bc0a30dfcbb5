"""Local SGD with a model's wide dense layers kept in factored form over the local steps.

A dense layer ``h = x W + b`` trained by plain SGD moves its kernel by a sum of outer products:
with ``g_t = dL_t / dh`` (the gradient of step ``t``'s minibatch loss with respect to the layer's
output, the step size folded in),

    W_j = W_0 + sum_{t < j} x_t^T (-lr g_t)                     (rank <= j * batch)

so step ``j``'s output is ``x_j W_0 + (x_j A_j^T) G_j`` with ``A_j`` the stacked inputs and
``G_j`` the stacked ``-lr g_t`` of the steps before it. The clients of a round start from the
same ``W_0``: side by side under ``vmap`` its product is one matmul over all their rows, and each
client reads and writes only its factors (``[steps * batch, d_in]`` and ``[steps * batch,
d_out]``), never a kernel of its own. Where ``steps * batch`` is small against the layer
(``rows * (d_in + d_out) < 2 * d_in * d_out``: the FEMNIST CNN's 3136 x 2048 layer at 47 steps
of 20 rows), a local step moves fewer bytes than the dense step's read of the kernel for the
forward and the backward pass and its read and write for the update. At the end of the epoch the
kernel is ``W_0 + A^T G``, one product per client.

It is the same arithmetic as the dense step, summed in another order (float64: equal to the
per-client reference loop to 1e-10, ``tests/core/test_factored.py``). It applies where the local
step is plain SGD on the model's objective: no gradient correction, no client optimizer, no ridge
penalty (``l2 = 0``), a model that declares its dense layers (:func:`~fedjax_dro.models.
builtin.from_flax` does, for every ``flax.linen.Dense`` called once on a batch of vectors), and
``local_steps``, or ``local_epochs`` with the folded masked step of clients side by side
(:func:`~fedjax_dro.core.ragged.shared_exit`).

Experimental: it moves fewer bytes for about the same FLOPs, so it can only pay where a local step
is bound by memory traffic, and no platform measured so far runs it faster
(``docs/benchmarks/tuning.md``): ``Tuning.factored_dense`` (or :func:`local_factored_dense`)
turns it on, off by default everywhere.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dro.common.model import DenseLayer
from fedjax_dro.common.tuning import current, switched


def local_factored_dense(enabled: bool):
  """Within the block, programs traced for local SGD (``local_steps``, or ``local_epochs`` with
  the folded masked step) keep the model's wide dense layers factored (``enabled``) or dense
  (``fd.tuned(factored_dense=enabled)``; off on every platform today). Results are the same up
  to rounding; only the speed differs."""
  return switched("local_factored_dense", factored_dense=enabled)


def factored_dense() -> bool:
  """Whether local SGD factors wide dense layers (the traced program's tuning)."""
  return current().factored_dense


def worth_factoring(layer: DenseLayer, rows: int) -> bool:
  """Whether factors of ``rows`` rows (local steps times minibatch rows) move fewer bytes a step
  than the dense kernel: the factors are read twice a step (forward, and the backward pass's
  input gradient), ``2 rows (d_in + d_out)`` values, against the kernel's four passes (read
  forward and backward, read and write in the update), ``4 d_in d_out``."""
  return rows * (layer.d_in + layer.d_out) < 2 * layer.d_in * layer.d_out


def chosen_layers(model, rows: int) -> tuple:
  """The layers of ``model`` local SGD factors over ``rows`` stacked rows: its declared
  :attr:`~fedjax_dro.common.model.Model.dense_layers` where :func:`worth_factoring`; none where
  the model has a ridge penalty or no factored form."""
  if model.factored_apply is None or model.l2:
    return ()
  return tuple(layer for layer in model.dense_layers if worth_factoring(layer, rows))


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _with(tree, path, value):
  """A copy of the nested dict ``tree`` with ``tree[path]`` replaced by ``value``."""
  if not path:
    return value
  out = dict(tree)
  out[path[0]] = _with(tree[path[0]], path[1:], value)
  return out


class FactoredCarry(NamedTuple):
  """The local loop's carry with factored layers.

  Attributes:
    rest: the parameters with each factored kernel replaced by None (trained densely).
    inputs: per factored layer, ``[rows, d_in]``: the layer's inputs of the steps so far.
    grads: per factored layer, ``[rows, d_out]``: ``-lr * dL/dh`` of those steps (0 past them).
  """

  rest: Any
  inputs: tuple
  grads: tuple


def factored_start(params, layers, rows: int) -> FactoredCarry:
  """The carry at the start of the local steps: ``params`` less the factored kernels, empty
  factors."""
  rest = params
  for layer in layers:
    rest = _with(rest, layer.path, None)
  inputs, grads = [], []
  for layer in layers:
    dtype = _get(params, layer.path).dtype
    inputs.append(jnp.zeros((rows, layer.d_in), dtype))
    grads.append(jnp.zeros((rows, layer.d_out), dtype))
  return FactoredCarry(rest, tuple(inputs), tuple(grads))


def factored_step(model, layers, start, lr, loss_fn):
  """The masked step ``(j, active, carry, bx, by, bmask) -> (carry, loss)`` of local SGD with
  ``layers`` factored (``active`` False: step size 0, as in the folded step): step ``j`` writes
  its layers' inputs and scaled output gradients at rows ``j * batch``; the other parameters
  move by ``grad(-lr * active * loss)``. ``start`` is the parameter tree the local steps start
  from (its kernels are ``W_0``); ``loss_fn(outputs, by, bmask)`` is the minibatch objective."""

  def step(j, active, carry, bx, by, bmask):
    kernels = [_get(start, layer.path) for layer in layers]

    def scaled(rest, probes):
      seen = {}
      corrections = {}
      for k, layer in enumerate(layers):

        def correction(x, k=k, layer=layer):
          # the layer's input is recorded; its output gains the factors' product and a zero
          # probe whose gradient is dL/dh
          if x.shape != (rows, layer.d_in):
            raise ValueError(
              f"the factored dense layer {'/'.join(layer.path)} takes one row per example, "
              f"[{rows}, {layer.d_in}]; got an input of shape {x.shape} (declare it out of "
              "Model.dense_layers)"
            )
          seen[layer.path] = x
          return (x @ carry.inputs[k].T) @ carry.grads[k] + probes[k]

        corrections[layer.path] = correction
      full = rest
      for layer, kernel in zip(layers, kernels):
        full = _with(full, layer.path, kernel)
      loss = loss_fn(model.factored_apply(full, bx, corrections), by, bmask)
      xs = tuple(jax.lax.stop_gradient(seen[layer.path]) for layer in layers)
      return jnp.where(active, -lr, 0).astype(loss.dtype) * loss, (loss, xs)

    rows = bx.shape[0]
    probes = tuple(
      jnp.zeros((rows, layer.d_out), kernel.dtype) for layer, kernel in zip(layers, kernels)
    )
    (g_rest, g_probes), (loss, xs) = jax.grad(scaled, argnums=(0, 1), has_aux=True)(
      carry.rest, probes
    )
    rest = jax.tree.map(lambda a, b: (a + b).astype(a.dtype), carry.rest, g_rest)
    at = j * rows
    inputs = tuple(
      jax.lax.dynamic_update_slice_in_dim(a, x.astype(a.dtype), at, 0)
      for a, x in zip(carry.inputs, xs)
    )
    grads = tuple(
      jax.lax.dynamic_update_slice_in_dim(a, g.astype(a.dtype), at, 0)
      for a, g in zip(carry.grads, g_probes)
    )
    return FactoredCarry(rest, inputs, grads), loss

  return step


def factored_end(carry: FactoredCarry, layers, start):
  """The parameters after the local steps: each factored kernel ``W_0 + A^T G``."""
  params = carry.rest
  for layer, a, g in zip(layers, carry.inputs, carry.grads):
    kernel = _get(start, layer.path)
    params = _with(params, layer.path, (kernel + a.T @ g).astype(kernel.dtype))
  return params
