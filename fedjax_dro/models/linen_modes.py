"""The training mode of a Flax linen module (what :func:`~fedjax_dro.models.from_flax` reads):
the keyword that selects it (Flax's examples' ``train``, or ``deterministic``), whether the
module draws dropout in it, and ``Model.train_apply`` built from it (dropout from the step's key,
the updated ``batch_stats`` returned)."""

from __future__ import annotations

import inspect

import flax
import flax.linen as nn
import jax


def mode_flag(module: nn.Module):
  """``(flag, takes_mask)``: the keyword of ``module.__call__`` that selects training mode
  (``"train"``, True in training, else ``"deterministic"``, False in training; None: neither)
  and whether it takes a ``mask`` keyword (the minibatch's valid rows)."""
  try:
    names = {
      name
      for name, p in inspect.signature(module.__call__).parameters.items()
      if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
  except (TypeError, ValueError):  # pragma: no cover - a __call__ without a signature
    return None, False
  flag = "train" if "train" in names else "deterministic" if "deterministic" in names else None
  return flag, "mask" in names


def draws_dropout(module: nn.Module, flag: str, shapes, sample_input) -> bool:
  """Whether ``module`` in training mode draws from the ``"dropout"`` PRNG stream (traced
  abstractly, without the stream: flax's InvalidRngError says it asked)."""
  try:
    jax.eval_shape(
      lambda v: module.apply(v, sample_input, **{flag: flag == "train"}),
      {"params": shapes["params"]},
    )
  except flax.errors.InvalidRngError:
    return True
  return False


def flax_train_apply(module: nn.Module, flag: str, stateful: bool, takes_mask: bool):
  """``Model.train_apply`` of a linen module with a training flag: the flag set to training
  mode, dropout drawn from ``rng`` (the ``"dropout"`` stream), and with batch statistics the
  updated ``batch_stats`` returned (the row mask passed as ``mask=`` when ``__call__`` takes
  it)."""
  train_mode = {flag: flag == "train"}

  def train_apply(params, x, mask, rng):
    kwargs = dict(train_mode)
    if rng is not None:
      kwargs["rngs"] = {"dropout": rng}
    if not stateful:
      return module.apply({"params": params}, x, **kwargs), {}
    if takes_mask:
      kwargs["mask"] = mask
    out, new = module.apply(params, x, mutable=["batch_stats"], **kwargs)
    return out, {"batch_stats": new["batch_stats"]}

  return train_apply
