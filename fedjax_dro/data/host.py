"""Federations larger than device memory: client data kept in host memory (or memory-mapped from
disk), with only the sampled clients' rows moved to the device each round.

:class:`HostFederatedData` stands in for :class:`~fedjax_dro.data.federated.FederatedData` in
``run`` / ``sweep``. Its arrays stay NumPy arrays on the host (``np.load(..., mmap_mode="r")``
for a directory written by :func:`save_npy_dir`, so a federation bigger than RAM works too); only
``num_examples`` (``[n]`` int32) lives on the device. Inside the compiled round, an algorithm
reaches clients through ``data.take_clients(idx)`` (the FedAvg skeleton
:func:`fedjax_dro.core.local.local_round` does); for host data that is a ``jax.pure_callback``
that gathers the rows ``idx`` on the host and hands the device exactly ``[s, max_examples, ...]``
arrays. The device therefore never holds more than the participants' rows, and results equal
the device-resident run (the same rows reach the same computation; tested).

Prefetching: before each compiled chunk, :func:`fedjax_dro.run` tells the store which clients
the uniform sampler of ``local_round`` will draw in the chunk's rounds (the indices depend only
on the round keys); a background thread gathers round ``r + 1``'s rows while the device computes
round ``r``. The prediction is a hint: the callback compares it with the indices the round
actually asks for and gathers synchronously on a miss (algorithms that sample from their state,
e.g. DRFA's lambda-sampling), so results never depend on it. ``store.stats`` counts hits and
misses.

Algorithms that read every client's arrays in every round (``data.x`` directly: Karula's
dissimilarities and full gradients, SCAFF-PD's all-client losses) cannot run on host data; they
get a ``ValueError`` that says so. Evaluation runs on the host side in chunks of clients.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
from typing import Iterator, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.data.federated import FederatedData

FORMAT = "fedjax_dro.host_data.v1"


class HostStore:
  """The host arrays of a :class:`HostFederatedData` and its prefetcher (not a pytree leaf).

  Attributes:
    x: ``[n, max_examples, *feature_shape]`` NumPy array (possibly memory-mapped).
    y: ``[n, max_examples, *label_shape]``.
    num_examples: ``[n]`` int32 (host copy).
    stats: ``{"hits", "misses", "rows_gathered"}`` of the gather callback.
  """

  def __init__(self, x: np.ndarray, y: np.ndarray, num_examples: np.ndarray):
    self.x, self.y = x, y
    self.num_examples = np.asarray(num_examples, np.int32)
    self.stats = {"hits": 0, "misses": 0, "rows_gathered": 0}
    self._lock = threading.Lock()
    self._pending: "list[Tuple[bytes, concurrent.futures.Future]]" = []
    self._upcoming: "list[np.ndarray]" = []
    self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
    self._last: Optional[Tuple[bytes, Tuple[np.ndarray, np.ndarray]]] = None

  # The store is static metadata of the pytree: identity is equality.
  def __hash__(self):
    return id(self)

  def __eq__(self, other):
    return self is other

  def _gather(self, idx: np.ndarray):
    return np.asarray(self.x[idx]), np.asarray(self.y[idx])

  def gather(self, idx) -> Tuple[np.ndarray, np.ndarray]:
    """``(x[idx], y[idx])`` for indices of any shape (the jax callback)."""
    idx = np.asarray(idx)
    key = idx.astype(np.int64).tobytes()
    with self._lock:
      last = self._last
      if last is not None and last[0] == key:  # the same clients again within a round
        self.stats["hits"] += 1
        return last[1]
      future = None
      for i, (k, f) in enumerate(self._pending):
        if k == key:
          future = f
          del self._pending[: i + 1]  # earlier predictions were not asked for: drop them
          break
      self._schedule_next_locked()
    if future is not None:
      out = future.result()
      self.stats["hits"] += 1
    else:
      out = self._gather(idx)
      self.stats["misses"] += 1
    self.stats["rows_gathered"] += int(idx.size)
    with self._lock:
      self._last = (key, out)
    return out

  def expect(self, predicted: Sequence[np.ndarray]) -> None:
    """Predicted participant indices of the next rounds, in order; prefetch one round ahead."""
    with self._lock:
      self._pending.clear()
      self._upcoming = [np.asarray(p) for p in predicted]
      self._schedule_next_locked()

  def _schedule_next_locked(self) -> None:
    if self._pending or not self._upcoming:
      return
    idx = self._upcoming.pop(0)
    if self._executor is None:
      self._executor = concurrent.futures.ThreadPoolExecutor(
        1, thread_name_prefix="fedjax-prefetch"
      )
    key = idx.astype(np.int64).tobytes()
    self._pending.append((key, self._executor.submit(self._gather, idx)))

  def close(self) -> None:
    with self._lock:
      self._last = None
      self._pending.clear()
      self._upcoming = []
      if self._executor is not None:
        self._executor.shutdown(wait=False)
        self._executor = None


@jax.tree_util.register_pytree_node_class
class HostFederatedData:
  """Client data in host memory; the device sees only the sampled clients (see module docstring).

  Build it with :func:`to_host` (from a :class:`FederatedData` or NumPy arrays) or
  :func:`load_npy_dir` (memory-mapped). It has the interface of ``FederatedData`` that algorithms
  use through sampling: ``num_clients``, ``max_examples``, ``feature_shape``, ``num_examples``,
  ``take_clients(idx)``; reading ``x`` / ``y`` / ``mask`` of the whole federation raises.
  """

  host_resident = True

  def __init__(self, store: HostStore, num_examples):
    self.store = store
    self.num_examples = num_examples

  def tree_flatten(self):
    return (self.num_examples,), self.store

  @classmethod
  def tree_unflatten(cls, store, children):
    return cls(store, children[0])

  @property
  def num_clients(self) -> int:
    return int(self.store.x.shape[0])

  @property
  def max_examples(self) -> int:
    return int(self.store.x.shape[1])

  @property
  def feature_shape(self) -> tuple:
    return tuple(self.store.x.shape[2:])

  def _whole(self, name):
    raise ValueError(
      f"this algorithm reads data.{name} of every client, but the data is host-resident "
      f"(HostFederatedData: only sampled clients reach the device). Use device-resident data "
      f"(FederatedData) for algorithms that touch every client in every round (e.g. Karula, "
      f"SCAFF-PD), or call .to_device() if it fits in device memory"
    )

  @property
  def x(self):
    self._whole("x")

  @property
  def y(self):
    self._whole("y")

  @property
  def mask(self):
    self._whole("mask")

  def take_clients(self, idx) -> FederatedData:
    """The sampled clients' rows on the device (a host gather through ``jax.pure_callback``)."""
    idx = jnp.asarray(idx)
    x_shape = jax.ShapeDtypeStruct(idx.shape + self.store.x.shape[1:], self.store.x.dtype)
    y_shape = jax.ShapeDtypeStruct(idx.shape + self.store.y.shape[1:], self.store.y.dtype)
    x, y = jax.pure_callback(self.store.gather, (x_shape, y_shape), idx, vmap_method="expand_dims")
    nex = self.num_examples[idx]
    mask = jnp.arange(self.max_examples) < nex[..., None]
    return FederatedData(x=x, y=y, mask=mask, num_examples=nex)

  def rows(self, start: int, stop: int) -> FederatedData:
    """Clients ``start..stop-1`` as device-resident :class:`FederatedData` (host side)."""
    x, y = self.store.x[start:stop], self.store.y[start:stop]
    nex = self.store.num_examples[start:stop]
    mask = np.arange(self.max_examples)[None, :] < nex[:, None]
    return FederatedData(
      x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.asarray(mask), num_examples=jnp.asarray(nex)
    )

  def client_chunks(self, size: int) -> Iterator[Tuple[int, FederatedData]]:
    """``(start, chunk)`` over the clients in chunks of ``size`` (the last one padded by repeating
    its final client, so every chunk has the same shape)."""
    n = self.num_clients
    for start in range(0, n, size):
      stop = min(start + size, n)
      rows = np.concatenate([np.arange(start, stop), np.full(size - (stop - start), stop - 1)])
      x, y = self.store._gather(rows)
      nex = self.store.num_examples[rows]
      mask = np.arange(self.max_examples)[None, :] < nex[:, None]
      yield (
        start,
        FederatedData(
          x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.asarray(mask), num_examples=jnp.asarray(nex)
        ),
      )

  def to_device(self) -> FederatedData:
    return self.rows(0, self.num_clients)

  def __repr__(self):
    return (
      f"HostFederatedData(num_clients={self.num_clients}, max_examples={self.max_examples}, "
      f"feature_shape={self.feature_shape}, x={type(self.store.x).__name__})"
    )


def _check_host_arrays(x, y, num_examples, name="data"):
  if x.ndim < 2:
    raise ValueError(f"{name}.x must be [n_clients, max_examples, ...], got shape {x.shape}")
  n, m = x.shape[:2]
  if y.shape[:2] != (n, m):
    raise ValueError(f"{name}.y must start with [n_clients, max_examples]={(n, m)}, got {y.shape}")
  if num_examples.shape != (n,):
    raise ValueError(f"{name}.num_examples must have shape {(n,)}, got {num_examples.shape}")
  if n == 0:
    raise ValueError(f"{name} has no clients")
  if np.any(num_examples < 1) or np.any(num_examples > m):
    raise ValueError(f"{name}.num_examples must be in [1, max_examples={m}] for every client")


def to_host(data: FederatedData) -> HostFederatedData:
  """A :class:`HostFederatedData` holding NumPy copies of ``data`` (validated)."""
  if isinstance(data, HostFederatedData):
    return data
  if not isinstance(data, FederatedData):
    raise TypeError(f"data must be a FederatedData, got {type(data).__name__}")
  x, y, nex = (np.asarray(a) for a in (data.x, data.y, data.num_examples))
  _check_host_arrays(x, y, nex)
  return HostFederatedData(HostStore(x, y, nex), jnp.asarray(nex, jnp.int32))


def save_npy_dir(data: FederatedData, path: str) -> str:
  """Writes ``data`` as ``x.npy``, ``y.npy``, ``num_examples.npy`` and ``manifest.json`` in
  ``path`` (for :func:`load_npy_dir`); returns ``path``."""
  if not isinstance(data, FederatedData):
    raise TypeError(f"data must be a FederatedData, got {type(data).__name__}")
  os.makedirs(path, exist_ok=True)
  arrays = {"x": data.x, "y": data.y, "num_examples": data.num_examples}
  for name, arr in arrays.items():
    np.save(os.path.join(path, f"{name}.npy"), np.asarray(arr), allow_pickle=False)
  manifest = {
    "format": FORMAT,
    "num_clients": int(data.num_clients),
    "max_examples": int(data.max_examples),
  }
  with open(os.path.join(path, "manifest.json"), "w") as f:
    json.dump(manifest, f)
  return path


def load_npy_dir(path: str, *, mmap: bool = True) -> HostFederatedData:
  """Host-resident data from a directory written by :func:`save_npy_dir` (memory-mapped by
  default, so the federation may exceed RAM). Never unpickles."""
  if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
    raise ValueError(f"path must be a directory written by save_npy_dir, got {path!r}")
  manifest_path = os.path.join(path, "manifest.json")
  try:
    with open(manifest_path) as f:
      manifest = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"{manifest_path} is missing or not valid JSON ({e})") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise ValueError(f"{manifest_path} is not a {FORMAT} manifest")
  arrays = {}
  for name in ("x", "y", "num_examples"):
    file = os.path.join(path, f"{name}.npy")
    try:
      arrays[name] = np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as e:
      raise ValueError(f"{file} is missing or not a valid .npy array ({e})") from None
  nex = np.asarray(arrays["num_examples"])
  if not np.issubdtype(nex.dtype, np.integer):
    raise ValueError(f"{path}/num_examples.npy must hold integers, got {nex.dtype}")
  _check_host_arrays(arrays["x"], arrays["y"], nex, name=path)
  if arrays["x"].shape[0] != manifest.get("num_clients"):
    raise ValueError(
      f"{path}: x.npy has {arrays['x'].shape[0]} clients, the manifest says "
      f"{manifest.get('num_clients')}"
    )
  return HostFederatedData(HostStore(arrays["x"], arrays["y"], nex), jnp.asarray(nex, jnp.int32))
