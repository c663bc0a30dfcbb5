"""Sharding runs and sweeps over devices with JAX's own engine (``jax.sharding``, GSPMD).

A federation is an array axis and a sweep is another, so scaling out is a matter of *placing*
those axes on a device mesh and letting XLA partition the compiled program:

* ``"clients"``: the client axis of the data (``x``, ``y``, ``mask``, ``num_examples``) is split
  over the devices of this mesh axis. Local training of the participants runs where their rows
  live, and aggregation over clients (a weighted sum over the client axis) becomes a
  cross-device reduction inserted by XLA (an all-reduce), not a gather to one device. State that
  XLA derives from the data (per-client control variates, personalized models) follows the
  same layout.

  A client count that the axis does not divide (30 clients on 4 devices) is padded, in storage
  only: :func:`place_data` stores the arrays with zero rows up to a multiple of the device count
  (:class:`PaddedClients`), and the compiled programs (:func:`real_clients`) slice them back to
  the real ``n`` (``x[:n]``) and constrain the slice to the same ``"clients"`` sharding. GSPMD
  partitions an uneven axis itself (each device holds ``ceil(n / devices)`` rows and XLA masks
  the rows past ``n`` in reductions), so the program sees exactly ``n`` clients: the sampler
  draws among ``n``, uniform client weights are ``1 / n``, per-client state keeps ``n`` rows,
  and results equal the unpadded run up to floating-point reassociation (tested with 30 clients
  on 4 devices). The alternative, padding the data with empty clients and a client mask that
  every algorithm (sampling, uniform weights, DRO dual variables over clients) would have to
  respect, was rejected: it touches every algorithm and a forgotten mask silently changes
  results, where the slice cannot.
* ``"sweep"``: the leading configuration axis of a :func:`fedjax_dro.sweep` (hyper-parameter
  combinations x seeds) is split over the devices of this mesh axis; each device runs its share of
  the configurations. The number of rows is padded to a multiple of the axis size with copies of
  the first row, which are dropped from the results.

Both at once (``make_mesh(clients=2, sweep=2)``) gives a 2-D mesh. Results equal the
single-device ones up to floating-point reassociation in the reductions (tested to 1e-6 with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``).

Multi-core CPU: :func:`request_cpu_devices` (before JAX starts; the CLI's ``--devices N|auto``)
splits the host into one JAX device per core, so that a ``"clients"`` or ``"sweep"`` mesh gives
each core its own share of the clients or configurations; it pays for federations with real work
per round and costs time on small ones (measured figures: docs/scale.md).

Multi-host: :func:`initialize_distributed` wraps ``jax.distributed.initialize``; afterwards
``jax.devices()`` lists the devices of every process and a mesh over them spans hosts. Every
process runs the same program on the same inputs (all inputs are replicated or derived from the
same seeds), and only process 0 writes results and checkpoints (:func:`is_writer`).
"""

from __future__ import annotations

import functools
import math
import os
import re
from typing import Any, Dict, Optional, Sequence, Union

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from fedjax_dro.common.checks import is_int

AXES = ("sweep", "clients")


def make_mesh(
  *, clients: Optional[int] = None, sweep: Optional[int] = None, devices: Optional[Sequence] = None
) -> Mesh:
  """A device mesh with axes ``("sweep", "clients")``.

  Args:
    clients: devices along the client axis (default: all devices not used by ``sweep``).
    sweep: devices along the sweep axis (default 1).
    devices: the devices to use (default ``jax.devices()``, all processes).

  Raises:
    ValueError: if the sizes are not positive integers or do not multiply to the device count.
  """
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("devices is empty: a mesh needs at least one device")
  for name, value in (("clients", clients), ("sweep", sweep)):
    if value is not None and (not is_int(value) or value < 1):
      raise ValueError(f"mesh axis {name!r} must be a positive integer, got {value!r}")
  sweep = 1 if sweep is None else sweep
  if clients is None:
    if len(devices) % sweep:
      raise ValueError(
        f"sweep={sweep} does not divide the {len(devices)} available devices; "
        f"give clients= and sweep= whose product is the device count"
      )
    clients = len(devices) // sweep
  if clients * sweep != len(devices):
    if clients * sweep > len(devices):
      raise ValueError(
        f"a mesh of clients={clients} x sweep={sweep} needs {clients * sweep} devices, "
        f"only {len(devices)} are available (jax.devices(): {len(jax.devices())})"
      )
    devices = devices[: clients * sweep]
  grid = np.asarray(devices, dtype=object).reshape(sweep, clients)
  return Mesh(grid, AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def local_cpu_cores() -> int:
  """The CPU cores this process may run on (its affinity mask where the OS has one)."""
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:  # pragma: no cover - macOS, Windows
    return max(1, os.cpu_count() or 1)


def request_cpu_devices(count: int) -> bool:
  """Splits the host CPU into ``count`` JAX devices; call before any JAX computation.

  One JAX device per core is how a multi-core CPU runs a federation fastest: with the clients
  split over a ``"clients"`` mesh axis each core trains its own share of them, where one device
  spreads every client's small matrix products over all cores (measured on 2 cores: the MLP and
  softmax federations of ``benchmarks/speed.py`` 1.2-1.9x faster from 100 clients on; a small
  federation, 10-30 clients of a linear model, 0.7-0.8x, so it is opt-in). The CLI's
  ``--devices auto`` / ``--devices N`` call this for you. Only the CPU backend is affected
  (``jax_num_cpu_devices``); accelerators keep their devices.

  Returns:
    True when the setting was made; False when it cannot be: JAX's backends have already started
    (any JAX operation starts them) or ``XLA_FLAGS`` already names a host device count, which is
    then left in charge. ``jax.devices()`` tells what is available either way.

  Raises:
    ValueError: if ``count`` is not a positive integer.
  """
  if not is_int(count) or count < 1:
    raise ValueError(f"count must be a positive integer, got {count!r}")
  if re.search(r"xla_force_host_platform_device_count", os.environ.get("XLA_FLAGS", "")):
    return False
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except (RuntimeError, AttributeError):  # backends already initialized; option absent
    return False
  return True


def even_devices(size: int, available: int) -> int:
  """The most devices, at most ``available``, that split an axis of ``size`` rows evenly (a mesh
  axis needs equal shares): ``--devices auto``'s choice."""
  if not is_int(size) or size < 1:
    raise ValueError(f"size must be a positive integer, got {size!r}")
  if not is_int(available) or available < 1:
    raise ValueError(f"available must be a positive integer, got {available!r}")
  return max(d for d in range(1, min(available, size) + 1) if size % d == 0)


def parse_mesh(
  spec: Optional[str] = None,
  devices: Union[int, str, None] = None,
  *,
  num_clients: Optional[int] = None,
  num_configs: Optional[int] = None,
) -> Optional[Mesh]:
  """The mesh of the CLI flags ``--mesh clients=4,sweep=2`` and ``--devices N|auto``.

  ``--devices N`` alone shards the client axis over the first ``N`` devices. ``--devices auto``
  uses as many of the process's devices as split an axis evenly: a sweep's ``num_configs``
  configuration rows when they split over at least as many devices as the clients (independent
  programs, no cross-device reduction: measured faster than the client axis), otherwise the
  ``num_clients`` clients; None when that is one device. Neither flag: None (single device, no
  sharding).
  """
  if spec is None and devices is None:
    return None
  if devices == "auto":
    available = jax.devices()
    if spec is not None:
      return parse_mesh(spec, len(available))
    by_clients = 1 if num_clients is None else even_devices(num_clients, len(available))
    by_configs = 1 if num_configs is None else even_devices(num_configs, len(available))
    if by_configs > 1 and by_configs >= by_clients:
      return make_mesh(clients=1, sweep=by_configs, devices=available[:by_configs])
    if by_clients > 1:
      return make_mesh(clients=by_clients, sweep=1, devices=available[:by_clients])
    return None
  if devices is not None and (not is_int(devices)):
    raise ValueError(f"--devices must be a positive integer or 'auto', got {devices!r}")
  if devices is not None and devices < 1:
    raise ValueError(f"--devices must be a positive integer or 'auto', got {devices}")
  available = jax.devices()
  if devices is not None and devices > len(available):
    raise ValueError(
      f"--devices {devices} asks for more devices than the {len(available)} available "
      f"({available[0].platform}); on CPU, ask for them before any JAX computation "
      f"(fedjax_dro.engine.request_cpu_devices({devices}); the CLI does this itself) or start "
      f"with XLA_FLAGS=--xla_force_host_platform_device_count={devices}"
    )
  sizes: Dict[str, int] = {}
  for item in (spec or "").split(","):
    if not item.strip():
      continue
    if "=" not in item:
      raise ValueError(f"--mesh expects AXIS=SIZE pairs like clients=4,sweep=2, got {item!r}")
    name, value = (s.strip() for s in item.split("=", 1))
    if name not in AXES:
      raise ValueError(f"--mesh axis must be one of {AXES}, got {name!r}")
    try:
      sizes[name] = int(value)
    except ValueError:
      raise ValueError(f"--mesh {name}={value!r} is not an integer") from None
  chosen = available[:devices] if devices is not None else available
  if spec is None:
    return make_mesh(clients=len(chosen), sweep=1, devices=chosen)
  total = math.prod(sizes.values()) if sizes else len(chosen)
  return make_mesh(
    clients=sizes.get("clients", 1 if "sweep" in sizes else total),
    sweep=sizes.get("sweep", 1),
    devices=chosen,
  )


def check_mesh(mesh) -> Mesh:
  """Validates a user-given mesh (a ``jax.sharding.Mesh`` with axes among ``AXES``)."""
  if not isinstance(mesh, Mesh):
    raise TypeError(
      f"mesh must be a jax.sharding.Mesh (e.g. fedjax_dro.engine.make_mesh(clients=4)), "
      f"got {type(mesh).__name__}"
    )
  unknown = [a for a in mesh.axis_names if a not in AXES]
  if unknown:
    raise ValueError(f"mesh axes must be among {AXES}, got {tuple(mesh.axis_names)}")
  return mesh


def axis_size(mesh: Optional[Mesh], name: str) -> int:
  if mesh is None or name not in mesh.axis_names:
    return 1
  return int(mesh.shape[name])


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def _put(tree, sharding):
  """``jax.device_put``; with several processes every process passes the same host values."""
  if jax.process_count() > 1:
    tree = jax.tree.map(np.asarray, tree)
  return jax.device_put(tree, sharding)


def shard_leading(tree, mesh: Mesh, axis: str, *, what: str):
  """``tree`` with the leading axis of every leaf split over the mesh axis ``axis``.

  Raises a ValueError naming ``what`` when a leading dimension is not divisible by the axis size
  (JAX's shardings are even; :func:`place_data` pads the client axis instead).
  """
  size = axis_size(mesh, axis)
  if size == 1:
    return _put(tree, replicated(mesh))
  for leaf in jax.tree.leaves(tree):
    if np.ndim(leaf) == 0 or np.shape(leaf)[0] % size:
      raise ValueError(
        f"{what}: the leading axis ({np.shape(leaf)[0] if np.ndim(leaf) else 'scalar'}) is not "
        f"divisible by the {size} devices of the mesh axis {axis!r}; use a mesh whose "
        f"{axis!r} size divides it"
        + (
          " (fedjax_dro.run and fedjax_dro.sweep pad the client axis)" if axis == "clients" else ""
        )
      )
  return _put(tree, NamedSharding(mesh, PartitionSpec(axis)))


@jax.tree_util.register_pytree_node_class
class PaddedClients:
  """Client data stored with its client axis padded to a multiple of a mesh's ``"clients"`` size.

  ``data`` holds ``n`` real clients followed by empty ones (zeros); the padding exists only in
  storage. A program wrapped by :func:`real_clients` receives :meth:`unpad`, the first ``n``
  clients, so nothing in it sees the padding. ``n`` and the mesh are static (part of the pytree
  structure, hence of program cache keys).

  Attributes:
    data: the padded :class:`~fedjax_dro.data.federated.FederatedData`, sharded over the mesh.
    n: the real number of clients.
    mesh: the mesh whose ``"clients"`` axis the data is split over.
  """

  def __init__(self, data, n: int, mesh: Mesh):
    self.data, self.n, self.mesh = data, int(n), mesh

  @property
  def num_clients(self) -> int:
    """The real number of clients (not the stored, padded one)."""
    return self.n

  def unpad(self):
    """The first ``n`` clients, constrained to the ``"clients"`` sharding (uneven: XLA pads
    internally). Call inside a jitted program."""
    sharding = NamedSharding(self.mesh, PartitionSpec("clients"))
    return jax.tree.map(
      lambda a: jax.lax.with_sharding_constraint(a[: self.n], sharding), self.data
    )

  def tree_flatten(self):
    return (self.data,), (self.n, self.mesh)

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(children[0], *aux)


def real_clients(fn):
  """``fn`` with every :class:`PaddedClients` argument replaced by its real clients
  (:meth:`PaddedClients.unpad`); other arguments pass unchanged. Wrap a program's function
  before ``jax.jit`` so that the slice happens inside the compiled program."""

  @functools.wraps(fn)  # the program keeps fn's name (jit_chunk_fn in XLA's logs and caches)
  def call(*args):
    return fn(*(a.unpad() if isinstance(a, PaddedClients) else a for a in args))

  return call


def place_data(data, mesh: Optional[Mesh], *, what: str = "data", pad: bool = False):
  """Client data sharded over the ``"clients"`` axis of ``mesh`` (replicated over the others).

  With ``pad`` a client count that the axis size does not divide is padded with empty clients
  (zeros) up to a multiple of it and returned as :class:`PaddedClients` (the programs must then
  be wrapped by :func:`real_clients`); without it such a count is a ValueError naming ``what``.
  """
  if mesh is None:
    return data
  size = axis_size(mesh, "clients")
  n = int(np.shape(data.x)[0])
  extra = (-n) % size
  if not pad or extra == 0:
    return shard_leading(data, mesh, "clients", what=what)
  padded = jax.tree.map(
    lambda a: np.pad(np.asarray(a), [(0, extra)] + [(0, 0)] * (np.ndim(a) - 1)), data
  )
  return PaddedClients(shard_leading(padded, mesh, "clients", what=what), n, mesh)


def place_replicated(tree, mesh: Optional[Mesh]):
  if mesh is None:
    return tree
  return _put(tree, replicated(mesh))


def sharding_key(tree) -> tuple:
  """A hashable description of the shardings of ``tree``'s leaves (for program caches)."""
  return tuple(str(getattr(x, "sharding", None)) for x in jax.tree.leaves(tree))


# ----------------------------------------------------------------------------------------------
# Multi-host
# ----------------------------------------------------------------------------------------------
def initialize_distributed(
  coordinator_address: str, num_processes: int, process_id: int, **kwargs: Any
) -> None:
  """``jax.distributed.initialize`` with validated arguments (call before any JAX computation).

  On CPU the cross-process collectives use gloo. Afterwards ``jax.devices()`` spans every
  process; build the mesh with :func:`make_mesh` as usual.
  """
  if not isinstance(coordinator_address, str) or ":" not in coordinator_address:
    raise ValueError(f"coordinator_address must be 'host:port', got {coordinator_address!r}")
  for name, value in (("num_processes", num_processes), ("process_id", process_id)):
    if not is_int(value) or value < 0:
      raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
  if num_processes < 1:
    raise ValueError(f"num_processes must be >= 1, got {num_processes}")
  if process_id >= num_processes:
    raise ValueError(f"process_id must be < num_processes={num_processes}, got {process_id}")
  try:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except Exception:  # pragma: no cover - option absent in some jax versions
    pass
  jax.distributed.initialize(
    coordinator_address=coordinator_address,
    num_processes=num_processes,
    process_id=process_id,
    **kwargs,
  )


def is_writer() -> bool:
  """True in the process that writes results and checkpoints (process 0)."""
  return jax.process_index() == 0


def fetch(tree):
  """A host (NumPy) copy of ``tree``, also for arrays spread over several processes."""
  leaves = jax.tree.leaves(tree)
  if jax.process_count() > 1 and any(
    isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves
  ):
    from jax.experimental import multihost_utils

    return jax.tree.map(
      lambda x: (
        np.asarray(multihost_utils.process_allgather(x, tiled=True))
        if isinstance(x, jax.Array) and not x.is_fully_addressable
        else np.asarray(x)
      ),
      tree,
    )
  return jax.device_get(tree)
