"""Streamed rounds: a prepared split read from disk, each round reading only the rows it uses.

:func:`load_prepared` opens a split written by :func:`~fedjax_dro.data.prepared.prepare` as
:class:`StreamedFederatedData`: its arrays stay memory-mapped on the host, unpadded; only
``num_examples`` (``[n]`` int32) lives on the device. It stands in for
:class:`~fedjax_dro.data.federated.FederatedData` in :func:`fedjax_dro.run` and
:func:`fedjax_dro.sweep`.

How a round reads rows. A round samples its participants as always and gathers their data with
``data.take_clients(idx)``; for streamed data that returns the participants' *row handles*
(:class:`ClientRows`: the client indices and the store, no rows). The local loop then asks a
handle for the rows of its minibatches: under ``local_steps`` it draws all ``T`` steps' rows
from the step keys (the same ``randint`` draws the resident loop makes inside its scan) and
reads them with one host call (``jax.pure_callback``) before the loop; under ``local_epochs`` it
reads each step's rows as the step comes; a full-batch step reads the whole client. The host
call gathers ``offsets[client] + row`` from the memory-mapped arrays on a pool of threads
(decoding encoded images with Pillow), so a round moves ``s x T x B`` rows to the device,
never whole clients: Camelyon17's hospitals hold about 100,000 patches each, a round of 3
hospitals x 32 steps x 32 rows reads 3,072. The rows reaching each step are the resident run's
rows, so results are the same as with the device-resident ``FederatedData`` built from the same
split (:meth:`StreamedFederatedData.to_device`; bitwise on the CPU, tested for FedAvg,
SCAFFOLD, DRFA, FGDRO-KL, Ditto and a sweep, with a kill and resume).

The rows are read when the round asks for them rather than drawn a chunk of rounds ahead: which
clients take part may depend on the algorithm's state (DRFA and AFL sample by their dual
weights), and each algorithm derives its clients' step keys in its own way; reading inside the
round is exact for all of them. An algorithm that reads whole participants outside its local
steps (a loss over all of a participant's rows) reads them whole through the same call.
Algorithms that read every client in every round (Karula's dissimilarities, SCAFF-PD's and AFL's
all-client losses) need the federation itself and get a ``ValueError`` naming the cause.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
from typing import Iterator, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.common.rows import ClientRows
from fedjax_dro.data.federated import FederatedData
from fedjax_dro.data.host import HostFederatedData
from fedjax_dro.data.prepared import PreparedError, read_manifest


class PreparedStore:
  """The memory-mapped arrays of one prepared split and the host gathers of streamed rounds.

  Attributes:
    path: the prepared directory; ``split`` its split's name.
    manifest: the directory's manifest.
    clients: the clients' names; ``counts`` ``[n]`` their rows; ``offsets`` ``[n + 1]``.
    x_shape, x_dtype: one row's input as the rounds see it (uint8 images as float32 in [0, 1]
      with ``to_float``).
    y_shape, y_dtype: one row's label.
    groups: the evaluation groups' names; ``group`` ``[rows]`` each row's.
    stats: ``{"calls", "rows"}`` of the host gathers.
  """

  def __init__(self, path: str, split: str, *, verify: bool = True, to_float: bool = True):
    manifest = read_manifest(path, verify=verify)
    if split not in manifest["splits"]:
      raise ValueError(
        f"split must be one of {sorted(manifest['splits'])} of {path}, got {split!r}"
      )
    self.path, self.split, self.manifest = os.fspath(path), split, manifest
    entry = manifest["splits"][split]
    directory = os.path.join(path, split)
    load = lambda name: np.load(
      os.path.join(directory, f"{name}.npy"), mmap_mode="r", allow_pickle=False
    )
    self.x, self.y, self.group = load("x"), load("y"), load("group")
    self.offsets = np.asarray(load("offsets"), np.int64)
    self.x_offsets = np.asarray(load("x_offsets")) if "x_offsets" in entry["arrays"] else None
    self.clients = tuple(entry["clients"])
    self.counts = np.diff(self.offsets).astype(np.int32)
    if len(self.counts) != len(self.clients) or self.offsets[-1] != len(self.y):
      raise PreparedError(f"{directory}/offsets.npy: does not match the manifest's clients/rows")
    self.groups = tuple(manifest["groups"])
    self.encoding = manifest["x"]["encoding"]
    stored = np.dtype(manifest["x"]["dtype"])
    self.to_float = bool(to_float) and stored == np.uint8
    self.x_shape = tuple(manifest["x"]["shape"])
    self.x_dtype = np.dtype(np.float32) if self.to_float else stored
    self.y_shape, self.y_dtype = tuple(self.y.shape[1:]), self.y.dtype
    self.stats = {"calls": 0, "rows": 0}
    self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None

  # The store is static metadata of the pytrees that refer to it: identity is equality.
  def __hash__(self):
    return id(self)

  def __eq__(self, other):
    return self is other

  @property
  def max_examples(self) -> int:
    return int(max(self.counts.max(), 1))

  def _decode(self, i: int) -> np.ndarray:
    from PIL import Image

    data = bytes(self.x[self.x_offsets[i] : self.x_offsets[i + 1]])
    try:
      with Image.open(io.BytesIO(data)) as image:
        image = image.convert("RGB")
        h, w = self.x_shape[:2]
        if image.size != (w, h):
          image = image.resize((w, h), Image.BILINEAR)
        return np.asarray(image, np.uint8)
    except Exception as e:  # noqa: BLE001  Pillow raises several types
      where = f"{self.path}/{self.split}/x.npy"
      raise PreparedError(f"{where}: row {i} is not a readable image ({e})") from None

  def _inputs(self, rows: np.ndarray) -> np.ndarray:
    flat = rows.reshape(-1)
    if self.encoding is None:
      order = np.argsort(flat, kind="stable")  # sorted reads of the memory map
      out = np.empty((flat.size,) + self.x_shape, self.x.dtype)
      out[order] = self.x[flat[order]]
    else:
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
          min(8, os.cpu_count() or 1), thread_name_prefix="fedjax-decode"
        )
      out = np.stack(list(self._pool.map(self._decode, flat))) if flat.size else None
      if out is None:
        out = np.empty((0,) + self.x_shape, np.uint8)
    out = out.reshape(rows.shape + self.x_shape)
    return (out.astype(np.float32) / 255.0).astype(np.float32) if self.to_float else out

  def global_rows(self, client, rows) -> np.ndarray:
    """Rows ``rows`` (of any shape, broadcast against ``client``'s) of clients ``client``, as
    indices into the split's arrays; rows past a client's count read its last row (they are
    masked wherever they are used)."""
    client = np.asarray(client, np.int64)
    rows = np.asarray(rows, np.int64)
    client = client.reshape(client.shape + (1,) * (rows.ndim - client.ndim))
    last = np.maximum(self.counts[client].astype(np.int64) - 1, 0)
    index = self.offsets[client] + np.minimum(rows, last)
    return np.minimum(index, max(len(self.y) - 1, 0))  # an empty last client reads row 0

  def gather(self, client, rows) -> Tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of rows ``rows`` of clients ``client`` (the host side of :class:`ClientRows`)."""
    index = self.global_rows(client, rows)
    self.stats["calls"] += 1
    self.stats["rows"] += int(index.size)
    y = np.asarray(self.y[index.reshape(-1)]).reshape(index.shape + self.y_shape)
    return self._inputs(index), y

  def eval_membership(self) -> Optional[np.ndarray]:
    """``[groups, G']`` bool: which of the dataset's evaluation groups each group id belongs to,
    for a dataset whose rows may belong to several (its reader's ``eval_membership``:
    CivilComments' 16 identity x label groups), else None."""
    import importlib

    from fedjax_dro.data._sources import READERS

    name = self.manifest.get("dataset")
    if name not in READERS or "eval_groups" not in self.manifest.get("info", {}):
      return None
    module = importlib.import_module(READERS[name])
    return module.eval_membership() if hasattr(module, "eval_membership") else None

  def check_arrays(self):
    """``(x, y, mask)`` for the model-data check before compiling: ``x`` and ``y`` carry the
    rows' shapes and dtypes (``[1, max_examples, ...]``), ``y`` holds the split's smallest and
    largest label (from the manifest) so the label range is checked without reading every row."""
    m = self.max_examples
    x = jax.ShapeDtypeStruct((1, m) + self.x_shape, self.x_dtype)
    y_range = self.manifest["splits"][self.split].get("y_range")
    if y_range is None:
      return x, np.asarray(self.y)[None], np.ones((1, len(self.y)), bool)
    y = np.broadcast_to(
      np.asarray(y_range, self.y_dtype).reshape((1, 2) + (1,) * len(self.y_shape)),
      (1, 2) + self.y_shape,
    )
    return x, y, np.ones((1, 2), bool)

  def close(self) -> None:
    if self._pool is not None:
      self._pool.shutdown(wait=False)
      self._pool = None


@jax.tree_util.register_pytree_node_class
class StreamedFederatedData(HostFederatedData):
  """A prepared split streamed by rounds (see the module docstring); build it with
  :func:`load_prepared`.

  The interface of :class:`~fedjax_dro.data.federated.FederatedData` that rounds use:
  ``num_clients``, ``max_examples`` (the largest client's rows), ``feature_shape``,
  ``num_examples``, ``take_clients(idx)``; ``client_names``, ``groups``; ``to_device()`` for the
  resident form. Reading ``x`` / ``y`` / ``mask`` of the whole federation raises.
  """

  streamed = True  # (host_resident, the pytree form and x / y / mask refused: inherited)

  @property
  def num_clients(self) -> int:
    return len(self.store.clients)

  @property
  def max_examples(self) -> int:
    return self.store.max_examples

  @property
  def feature_shape(self) -> tuple:
    return self.store.x_shape

  @property
  def client_names(self) -> Tuple[str, ...]:
    return self.store.clients

  @property
  def groups(self) -> Tuple[str, ...]:
    return self.store.groups

  def _whole(self, name):
    raise ValueError(
      f"this algorithm reads data.{name} of every client in every round, but the data is "
      "streamed (load_prepared: only the participants' minibatch rows are read). Use "
      "device-resident data (.to_device(), if it fits) for algorithms that touch every client "
      "in every round (e.g. Karula, SCAFF-PD, AFL)"
    )

  def take_clients(self, idx) -> FederatedData:
    """The participants ``idx``: row handles (:class:`ClientRows`) and their counts."""
    idx = jnp.asarray(idx)
    handle = ClientRows(idx, self.store)
    nex = self.num_examples[idx]
    return FederatedData(x=handle, y=handle, mask=handle, num_examples=nex)

  def rows(self, start: int, stop: int) -> FederatedData:
    """Clients ``start..stop-1`` padded to ``max_examples``, as device arrays."""
    return self._padded(np.arange(start, stop))

  def _padded(self, clients: np.ndarray) -> FederatedData:
    m = self.max_examples
    rows = np.broadcast_to(np.arange(m), (len(clients), m))
    x, y = self.store.gather(clients, rows)
    nex = self.store.counts[clients]
    mask = np.arange(m)[None, :] < nex[:, None]
    x = np.where(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x, 0).astype(x.dtype)
    y = np.where(mask.reshape(mask.shape + (1,) * (y.ndim - 2)), y, 0).astype(y.dtype)
    return FederatedData(
      x=jnp.asarray(x), y=jnp.asarray(y), mask=jnp.asarray(mask), num_examples=jnp.asarray(nex)
    )

  def client_chunks(self, size: int) -> Iterator[Tuple[int, FederatedData]]:
    """``(start, chunk)`` over the clients in chunks of ``size``, padded to ``max_examples`` (the
    last chunk padded by repeating its final client)."""
    n = self.num_clients
    for start in range(0, n, size):
      stop = min(start + size, n)
      rows = np.concatenate([np.arange(start, stop), np.full(size - (stop - start), stop - 1)])
      yield start, self._padded(rows)

  def evaluate(self, model, params, *, batch_size: int = 256, personalized: bool = False) -> dict:
    """``params`` evaluated on every row of this split, batch by batch: per client, per group
    and the dataset's own metrics (:func:`fedjax_dro.core.split_eval.evaluate_split`)."""
    from fedjax_dro.core.split_eval import evaluate_split

    return evaluate_split(model, params, self, batch_size=batch_size, personalized=personalized)

  def to_device(self) -> FederatedData:
    """The whole split as device-resident, padded :class:`FederatedData` (if it fits)."""
    return self._padded(np.arange(self.num_clients))

  def __repr__(self):
    return (
      f"StreamedFederatedData({self.store.manifest['dataset']!r}, split={self.store.split!r}, "
      f"num_clients={self.num_clients}, rows={int(self.store.counts.sum())}, "
      f"max_examples={self.max_examples}, feature_shape={self.feature_shape})"
    )


def load_prepared(
  path, split: str = "train", *, verify: bool = True, to_float: bool = True
) -> StreamedFederatedData:
  """The split ``split`` of the prepared directory ``path`` as :class:`StreamedFederatedData`.

  Args:
    path: a directory written by :func:`~fedjax_dro.data.prepared.prepare`.
    split: which split (``"train"``, ``"id_val"``, ``"val"``, ``"test"``, ...).
    verify: check every array's SHA-256 against the manifest first (a corrupt or changed file is
      refused naming it); False checks sizes only.
    to_float: uint8 inputs (images) reach the rounds as float32 in [0, 1].
  """
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"path must be a prepared directory, got {type(path).__name__}")
  store = PreparedStore(os.fspath(path), split, verify=verify, to_float=to_float)
  if not len(store.clients):
    raise ValueError(f"{path}: split {split!r} has no clients")
  return StreamedFederatedData(store, jnp.asarray(store.counts, jnp.int32))
