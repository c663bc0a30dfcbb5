"""Running a per-client function over the participating clients: the execution backends.

All backends compute the same thing; they differ in how XLA executes it:

* ``"vmap"``: all clients at once (batched GEMMs) — best on accelerators and for small models.
* ``"map"``: ``lax.map`` over clients inside the same program — no Python dispatch, one client's
  working set at a time; best for compute-bound models on CPU.
* ``"chunked"``: ``lax.map`` over chunks of ``chunk_size`` clients with ``vmap`` inside a chunk —
  bounds memory while keeping batching.
* ``"auto"``: ``vmap`` on GPU/TPU; on CPU ``vmap`` for small models and ``map`` beyond
  :data:`AUTO_CPU_PARAMS_THRESHOLD` parameters per client. The rule comes from
  ``benchmarks/round_throughput.py`` on 2 CPU cores: for logistic regression (51 parameters)
  batching clients is 20-60x faster than a per-client loop, while for the 784-200-200-62 MLP
  (210k parameters) per-client GEMMs are compute-bound and ``map`` (one client at a time, streaming
  aggregation) is the fastest backend.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

BACKENDS = ("vmap", "map", "chunked", "auto")
# Parameter count above which batched (vmap) client updates stop paying off on CPU
# (measured by benchmarks/round_throughput.py: logistic regression -> vmap, MLP 784-200-200-62 -> map).
AUTO_CPU_PARAMS_THRESHOLD = 20_000
DEFAULT_CHUNK_SIZE = 8


def validate_backend(backend: str, chunk_size: Optional[int]) -> None:
  if backend not in BACKENDS:
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
  if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
    raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")


def resolve_backend(backend: str, num_params: int, platform: Optional[str] = None) -> str:
  """The concrete backend ``"auto"`` stands for on this platform and model size."""
  if backend != "auto":
    return backend
  platform = platform or jax.default_backend()
  if platform != "cpu":
    return "vmap"
  return "vmap" if num_params <= AUTO_CPU_PARAMS_THRESHOLD else "map"


def map_clients(fn: Callable, *args, backend: str = "vmap", chunk_size: Optional[int] = None):
  """``fn`` applied to each slice along the leading (client) axis of every leaf of ``args``.

  Equivalent to ``jax.vmap(fn)(*args)`` for every backend.
  """
  if backend == "vmap":
    return jax.vmap(fn)(*args)
  if backend == "map":
    return jax.lax.map(lambda a: fn(*a), args)
  if backend == "chunked":
    return jax.lax.map(lambda a: fn(*a), args, batch_size=chunk_size or DEFAULT_CHUNK_SIZE)
  raise ValueError(
    f"backend must be resolved to one of ('vmap', 'map', 'chunked'), got {backend!r}"
  )


def map_clients_weighted_sum(
  fn: Callable, weights, *args, backend: str = "vmap", chunk_size: Optional[int] = None
):
  """``(sum_k weights[k] * fn(args_k)[0], stacked fn(args_k)[1])`` without materializing the
  stacked first outputs for the ``map`` / ``chunked`` backends.

  ``fn`` returns ``(tree, aux)``. With ``vmap`` the trees are stacked and reduced; with ``map`` and
  ``chunked`` a ``lax.scan`` over chunks of clients keeps a running weighted sum, so the memory is
  that of one chunk — the right shape for large models and many clients (a per-client delta of an
  EMNIST MLP times 1000 clients is ~0.8 GB). Clients padded to fill the last chunk get weight 0.
  """
  if backend == "vmap":
    trees, aux = jax.vmap(fn)(*args)
    return jax.tree.map(lambda a: jnp.tensordot(weights.astype(a.dtype), a, axes=1), trees), aux
  if backend not in ("map", "chunked"):
    raise ValueError(
      f"backend must be resolved to one of ('vmap', 'map', 'chunked'), got {backend!r}"
    )
  size = 1 if backend == "map" else (chunk_size or DEFAULT_CHUNK_SIZE)
  s = weights.shape[0]
  num_chunks = -(-s // size)
  pad = num_chunks * size - s
  if pad:  # fill the last chunk with copies of client 0 at weight 0
    rows = jnp.concatenate([jnp.arange(s), jnp.zeros((pad,), jnp.int32)])
    args = jax.tree.map(lambda a: a[rows], args)
    weights = jnp.concatenate([weights, jnp.zeros((pad,), weights.dtype)])
  chunked = jax.tree.map(lambda a: a.reshape((num_chunks, size) + a.shape[1:]), args)
  w = weights
  w = w.reshape(num_chunks, size)
  template, _ = jax.eval_shape(fn, *jax.tree.map(lambda a: a[0], args))
  zeros = jax.tree.map(lambda t: jnp.zeros(t.shape, t.dtype), template)

  def body(total, inputs):
    chunk_args, chunk_w = inputs
    trees, aux = jax.vmap(fn)(*chunk_args)
    total = jax.tree.map(
      lambda acc, a: acc + jnp.tensordot(chunk_w.astype(a.dtype), a, axes=1), total, trees
    )
    return total, aux

  total, aux = jax.lax.scan(body, zeros, (chunked, w))
  aux = jax.tree.map(lambda a: a.reshape((num_chunks * size,) + a.shape[2:])[:s], aux)
  return total, aux
