"""Precision policies: the dtype of the forward and backward passes, separate from the parameters'.

Every algorithm factory takes ``precision=`` (added by :func:`fedjax_dro.algorithms.register`):

* ``"float32"``: compute in the parameters' own dtype, matrix products and convolutions at full
  precision (``jax.default_matmul_precision("highest")``; on NVIDIA GPUs JAX's default for float32
  operands is TF32, so this is the setting that gives true float32 there). Nothing is cast: a
  float64 model (``jax_enable_x64``) stays float64, and the results are those of the unwrapped
  model.
* ``"tf32"``: floating parameters and inputs are computed in float32 (float64 models are cast
  down) and products run at ``"tensorfloat32"`` precision: TF32 tensor cores on Ampere and newer
  GPUs, bf16x3 passes on TPUs; CPUs compute float32 exactly as ``"float32"`` does.
* ``"bf16"``: floating parameters and inputs are cast to bfloat16 for the forward and backward
  passes (products accumulate in float32 on GPUs and TPUs).

In every policy the *master* copy of the parameters keeps its dtype (float32, or float64 under
x64): the model's outputs are cast back to it, so the losses, the gradients (the cast's transpose
returns them in the master dtype), the aggregation and the optimizer state are float32.

``precision=None`` (the default) picks per platform (:func:`default_precision`): ``"float32"``
on CPU, where lower precision buys nothing (XLA's CPU kernels run float32 products at full
precision), and ``"tf32"`` on GPU/TPU, the usual accelerator trade (float32 storage, TF32
products). The default never casts a float64 model down: with ``jax_enable_x64`` and float64
parameters it computes as ``"float32"`` does (in float64, products at full precision) on every
platform, so that results under x64 do not depend on the device; ``precision="tf32"`` or
``"bf16"`` asked for explicitly casts them down as described above. ``"bf16"`` is never a
default: it changes results visibly (see ``tests/core/test_precision.py`` for the tolerance
measured on a small task) and is asked for explicitly.
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Iterator, Optional

import jax
import jax.numpy as jnp

from fedjax_dro.common.model import Model

PRECISIONS = ("float32", "tf32", "bf16")
# jax.default_matmul_precision value of each policy (None: the context's / JAX's default).
_MATMUL_PRECISION = types.MappingProxyType(
  {"float32": "highest", "tf32": "tensorfloat32", "bf16": None}
)
# Compute dtype of the floating parameters and inputs (None: leave them as they are).
_COMPUTE_DTYPE = types.MappingProxyType(
  {"float32": None, "tf32": jnp.float32, "bf16": jnp.bfloat16}
)
_TAG = "__fedjax_precision__"


@contextlib.contextmanager
def float64() -> Iterator[None]:
  """Within the block, 64-bit types are on (``jax_enable_x64``) for this thread; after it, the
  process's setting is what it was. The one place the package turns float64 on: a library
  function that needs it (a reproduction compared against float64 closed forms) runs its body
  under this block instead of changing the setting for the user's whole program. Arrays it
  returns keep their dtype."""
  scoped = getattr(jax, "enable_x64", None)  # jax >= 0.6: a context-manager config state
  if scoped is None:  # older jax
    from jax.experimental import enable_x64 as scoped_x64

    with scoped_x64():
      yield
    return
  with scoped(True):
    yield


def default_precision(platform: Optional[str] = None) -> str:
  """``"float32"`` on CPU, ``"tf32"`` on GPU/TPU (``platform`` defaults to JAX's backend)."""
  platform = platform or jax.default_backend()
  return "float32" if platform == "cpu" else "tf32"


def validate_precision(precision) -> Optional[str]:
  """``precision`` if it is ``None`` or one of :data:`PRECISIONS`, else a ``ValueError``."""
  if precision is not None and (not isinstance(precision, str) or precision not in PRECISIONS):
    raise ValueError(
      f"precision must be one of {PRECISIONS} or None (per platform: float32 on CPU, tf32 on "
      f"GPU/TPU), got {precision!r}"
    )
  return precision


def resolve_precision(precision, platform: Optional[str] = None) -> str:
  """The concrete policy ``precision`` stands for (``None`` -> :func:`default_precision`)."""
  validate_precision(precision)
  return default_precision(platform) if precision is None else precision


def model_precision(model: Model) -> Optional[str]:
  """The policy a model was wrapped with by :func:`with_precision` (``None`` if unwrapped)."""
  return getattr(model.apply, _TAG, None)


def _is_float(x) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def _master_dtype(params):
  leaves = [leaf for leaf in jax.tree.leaves(params) if _is_float(leaf)]
  return jnp.result_type(leaves[0]) if leaves else None


def params_float_dtype(params):
  """The dtype of the first floating leaf of ``params`` (the default float dtype if none).

  The dtype an algorithm gives its own float state (dual weights, loss vectors) so that it
  follows the master parameters.
  """
  dtype = _master_dtype(params)
  return jnp.result_type(float) if dtype is None else dtype


def with_precision(model: Model, precision) -> Model:
  """``model`` whose ``apply`` runs under the policy ``precision`` (see the module docstring).

  ``init``, ``loss`` and ``metrics`` are unchanged; ``apply(params, x)`` casts the floating leaves
  of ``params`` and a floating ``x`` to the compute dtype, traces the model under the policy's
  matmul precision and casts floating outputs back to the parameters' dtype. Wrapping a wrapped
  model re-wraps the original ``apply`` (policies do not nest). With ``precision=None``, float64
  parameters are computed as ``"float32"`` does on every platform (the recorded policy is still
  the platform's default, which applies to float32 parameters). The model's factored form
  (``factored_apply``, :mod:`fedjax_dro.experimental.factored`) runs under the same policy.
  """
  by_default = precision is None
  precision = resolve_precision(precision)
  wrapped_before = model_precision(model) is not None

  def under_policy(fn):
    fn = getattr(fn, "__wrapped__", fn) if wrapped_before else fn

    @functools.wraps(fn)
    def wrapped(params, x, *rest):
      master = _master_dtype(params)
      policy = precision
      if by_default and master == jnp.float64:
        policy = "float32"  # the default never casts a float64 model down (x64 asks for float64)
      compute, matmul = _COMPUTE_DTYPE[policy], _MATMUL_PRECISION[policy]
      if compute is not None:
        params = jax.tree.map(lambda a: a.astype(compute) if _is_float(a) else a, params)
        x = x.astype(compute) if _is_float(x) else x
      if matmul is None:
        out = fn(params, x, *rest)
      else:
        with jax.default_matmul_precision(matmul):
          out = fn(params, x, *rest)
      if compute is None or master is None:
        return out
      return jax.tree.map(lambda o: o.astype(master) if _is_float(o) else o, out)

    setattr(wrapped, _TAG, precision)
    return wrapped

  factored, train = model.factored_apply, model.train_apply
  return model._replace(
    apply=under_policy(model.apply),
    factored_apply=None if factored is None else under_policy(factored),
    train_apply=None if train is None else under_policy(train),
  )
