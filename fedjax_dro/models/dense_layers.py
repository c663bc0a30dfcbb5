"""The plain ``flax.linen.Dense`` layers of a flax model, and its factored form: what
:func:`~fedjax_dro.models.from_flax` declares in
:attr:`~fedjax_dro.common.model.Model.dense_layers` and
:attr:`~fedjax_dro.common.model.Model.factored_apply` for local SGD's factored dense layers
(:mod:`fedjax_dro.experimental.factored`)."""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_dro.common.model import DenseLayer


def factored_apply(module: nn.Module):
  """``(params, x, corrections) -> outputs``: ``module`` applied with the output of each plain
  dense layer whose kernel path is a key of ``corrections`` plus ``corrections[path](x_in)``."""

  def apply(params, x, corrections):
    def intercept(call, args, kwargs, context):
      out = call(*args, **kwargs)
      path = plain_dense_path(context)
      if path in corrections:
        out = out + corrections[path](args[0]).astype(out.dtype)
      return out

    with nn.intercept_methods(intercept):
      return module.apply({"params": params}, x)

  return apply


def plain_dense_path(context):
  """The kernel's path of a call of a plain ``flax.linen.Dense`` (the class itself, default
  ``dot_general`` and ``dtype``: ``x @ kernel + bias`` in the parameters' dtype), else None."""
  m = context.module
  if context.method_name != "__call__" or type(m) is not nn.Dense:
    return None
  if m.dtype is not None or m.dot_general is not None or m.dot_general_cls is not None:
    return None
  return tuple(m.path) + ("kernel",)


def _rows_of(shape):
  """The rows of a ``[rows, d]`` shape; None for any other."""
  return shape[0] if shape is not None and len(shape) == 2 else None


def dense_layers(module, init, sample_input) -> tuple:
  """The module's plain dense layers called exactly once per call, on the batch's rows as
  vectors (``x [m, d_in]`` for a batch of ``m`` examples), found by applying it abstractly to
  batches of two sizes: what local SGD may keep factored (:mod:`fedjax_dro.experimental.factored`)."""
  params = jax.eval_shape(init, jax.random.PRNGKey(0))
  m = sample_input.shape[0]
  found = []
  for rows in (m, m + 1):
    calls = {}

    def intercept(call, args, kwargs, context, calls=calls):
      path = plain_dense_path(context)
      if path is not None:
        calls.setdefault(path, []).append(getattr(args[0], "shape", None) if args else None)
      return call(*args, **kwargs)

    batch = jax.ShapeDtypeStruct((rows,) + sample_input.shape[1:], sample_input.dtype)
    with nn.intercept_methods(intercept):
      jax.eval_shape(lambda p, x: module.apply({"params": p}, x), params, batch)
    # called once, on a [rows, d_in] input: one input row per example of the batch
    found.append(
      [p for p, shapes in calls.items() if len(shapes) == 1 and _rows_of(shapes[0]) == rows]
    )
  layers = []
  for path in (p for p in found[0] if p in found[1]):  # in the order they are called
    kernel = params
    for key in path:
      kernel = kernel[key] if isinstance(kernel, dict) and key in kernel else None
      if kernel is None:
        break
    if kernel is not None and len(kernel.shape) == 2:
      layers.append(DenseLayer(path, int(kernel.shape[0]), int(kernel.shape[1])))
  return tuple(layers)
