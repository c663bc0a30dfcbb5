"""Masked weighted aggregation of stacked client pytrees."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def weighted_sum(tree, weights):
  """``sum_k weights[k] * tree[k]`` over the leading axis of every leaf."""
  return jax.tree.map(lambda a: jnp.tensordot(weights.astype(a.dtype), a, axes=1), tree)


def weighted_mean(tree, weights, mask=None):
  """Weighted average over the leading axis; entries with ``mask=False`` get weight zero."""
  w = weights if mask is None else jnp.where(mask, weights, 0.0)
  w = w / jnp.maximum(jnp.sum(w), jnp.finfo(jnp.result_type(float)).tiny)
  return weighted_sum(tree, w)


def tree_mean(tree):
  """Unweighted mean over the leading (participant) axis of every leaf, keeping dtypes."""
  return jax.tree.map(lambda a: jnp.mean(a, axis=0).astype(a.dtype), tree)


def tree_add(a, b, scale=1.0):
  """``a + scale * b`` leafwise, keeping the dtypes of ``a``."""
  return jax.tree.map(lambda x, y: (x + scale * y).astype(jnp.result_type(x)), a, b)


def tree_sub(a, b):
  return jax.tree.map(lambda x, y: x - y, a, b)


def tree_scale(a, scale):
  return jax.tree.map(lambda x: scale * x, a)


def tree_zeros_like(a):
  return jax.tree.map(jnp.zeros_like, a)


def tree_sq_norm(a):
  return sum(jnp.vdot(x, x).real for x in jax.tree.leaves(a))


def tree_stack(tree, n: int):
  """``n`` copies of ``tree`` stacked on a new leading axis."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), tree)


def scatter_rows(stacked, idx, rows):
  """``stacked`` with rows ``idx`` replaced by ``rows`` (per-client persistent state)."""
  return jax.tree.map(lambda a, r: a.at[idx].set(r), stacked, rows)


def gather_rows(stacked, idx):
  return jax.tree.map(lambda a: a[idx], stacked)
