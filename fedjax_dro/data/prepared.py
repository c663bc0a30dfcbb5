"""The prepared format: a dataset written once as client-sorted, unpadded, memory-mapped arrays.

:func:`prepare` writes it from a reader of a natural-split dataset (:data:`READERS`: WILDS
Camelyon17, iWildCam, PovertyMap and CivilComments, the uncopyrighted Pile, LEAF Shakespeare,
TFF's FedCIFAR-100 and StackOverflow), from a :class:`Source` of the user's own (a dataset larger
than memory, read client by client), or from in-memory data (:func:`federated_source`);
:func:`fedjax_dro.data.load_prepared` streams a split of it into rounds.
:func:`write_standin` writes a reader's tiny stand-in directory in the publisher's exact layout.

``prepare(SOURCE, DIR, out)`` (``fedjax-dro prepare SOURCE DIR --out PREPARED``) reads a dataset
in its publisher's layout through its reader (:mod:`fedjax_dro.data._sources`) and writes::

  PREPARED/manifest.json          format, dataset, row specs, groups, facts, splits, checksums
  PREPARED/SPLIT/x.npy            [rows, *x_shape] inputs, the clients' rows one after another
                                  (an encoded source: [bytes] uint8, the files' bytes, with
                                  x_offsets.npy [rows + 1] int64 where each row's bytes start)
  PREPARED/SPLIT/y.npy            [rows, *y_shape] labels
  PREPARED/SPLIT/group.npy        [rows] int32 evaluation group of each row
  PREPARED/SPLIT/offsets.npy      [clients + 1] int64: client i's rows are offsets[i]:offsets[i+1]

Plain ``.npy`` files (``np.load(..., mmap_mode="r", allow_pickle=False)``) and JSON; nothing is
padded, so a federation with a 258x imbalance between its largest and smallest client costs its
rows, not 258x its smallest client times the clients.

Writing is resumable and never replaces a finished directory silently:

* the work goes to ``PREPARED.partial`` (a sibling), locked against a second writer; after each
  chunk of rows the bytes written are recorded in its ``progress.json`` (atomically, after the
  arrays are flushed). A killed ``prepare`` run again resumes there: the arrays are cut back to
  the recorded bytes and the reader's chunks already written are skipped (counted, not
  rewritten), so the result, manifest and checksums included, is the uninterrupted one's;
* the manifest is written last, then ``PREPARED.partial`` is renamed to ``PREPARED``. An existing
  ``PREPARED`` is refused unless ``overwrite=True``; with it, the old directory is replaced only
  once the new one is complete, so an error (a full disk, a corrupt input file) leaves it intact.

Each array's ``.npy`` header is reserved at a fixed size when the file is created and rewritten
with the final shape at the end (the format allows a header padded with spaces), so rows are
appended without copying.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from typing import Any, Dict, Optional, Tuple

import numpy as np

from fedjax_dro.data._sources import READERS, reader
from fedjax_dro.data._sources.base import Source, SourceError, SplitSource
from fedjax_dro.records.files import DirectoryLock, atomic_write

__all__ = [
  "prepare",
  "read_manifest",
  "federated_source",
  "write_standin",
  "READERS",
  "Source",
  "SplitSource",
  "SourceError",
  "PreparedError",
]

FORMAT = "fedjax_dro.prepared.v1"
MANIFEST = "manifest.json"
PROGRESS = "progress.json"
HEADER_BYTES = 256  # the reserved .npy header (magic, version, length, dict, spaces, newline)
ARRAYS = ("x", "y", "group")


class PreparedError(ValueError):
  """A prepared directory is incomplete, foreign or corrupt (one line: the file and what is
  wrong)."""


# ----------------------------------------------------------------------------------------------
# .npy files written by appending
# ----------------------------------------------------------------------------------------------
def _npy_header(dtype: np.dtype, shape: Tuple[int, ...]) -> bytes:
  """A version 1.0 ``.npy`` header of exactly :data:`HEADER_BYTES` bytes."""
  descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
  text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
  room = HEADER_BYTES - 10 - 1
  if len(text) > room:
    raise ValueError(f"shape {shape} does not fit the reserved .npy header")
  body = (text + " " * (room - len(text)) + "\n").encode("latin1")
  return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


class _Appender:
  """Rows appended to one ``.npy`` file whose header is rewritten with the final shape."""

  def __init__(self, path: str, dtype, row_shape: Tuple[int, ...], committed: int):
    self.path, self.dtype, self.row_shape = path, np.dtype(dtype), tuple(row_shape)
    self.row_bytes = self.dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64))
    mode = "r+b" if os.path.exists(path) else "w+b"
    self.file = open(path, mode)
    if mode == "w+b":
      self.file.write(_npy_header(self.dtype, (0,) + self.row_shape))
    self.file.truncate(HEADER_BYTES + committed)  # bytes past the last recorded chunk: dropped
    self.file.seek(HEADER_BYTES + committed)

  @property
  def nbytes(self) -> int:
    return self.file.tell() - HEADER_BYTES

  def append(self, rows: np.ndarray) -> None:
    self.file.write(np.ascontiguousarray(rows, self.dtype).tobytes())

  def finish(self) -> None:
    rows = self.nbytes // max(self.row_bytes, 1)
    self.file.seek(0)
    self.file.write(_npy_header(self.dtype, (rows,) + self.row_shape))
    self.file.close()


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      h.update(block)
  return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# prepare
# ----------------------------------------------------------------------------------------------
def _fingerprint(source: Source, options: Dict[str, Any]) -> Dict[str, Any]:
  """What identifies the prepared result (a resumed run must have the same)."""
  return {
    "dataset": source.dataset,
    "options": options,
    "x": {"shape": list(source.x_shape), "dtype": source.x_dtype, "encoding": source.encoding},
    "y": {"shape": list(source.y_shape), "dtype": source.y_dtype},
    "groups": list(source.groups),
    "splits": {s.name: list(s.clients) for s in source.splits},
  }


def _check_chunk(chunk, source: Source, where: str):
  if not (isinstance(chunk, tuple) and len(chunk) == 3):
    raise SourceError(f"{where}: a reader chunk must be (x, y, group)")
  x, y, group = chunk
  y, group = np.asarray(y), np.asarray(group)
  k = len(group)
  if source.encoding is None:
    x = np.asarray(x)
    if x.shape != (k,) + tuple(source.x_shape):
      raise SourceError(f"{where}: x has shape {x.shape}, expected {(k,) + tuple(source.x_shape)}")
  elif len(x) != k or not all(isinstance(b, (bytes, bytearray)) for b in x):
    raise SourceError(f"{where}: an encoded source's x must be {k} bytes objects")
  if y.shape != (k,) + tuple(source.y_shape):
    raise SourceError(f"{where}: y has shape {y.shape}, expected {(k,) + tuple(source.y_shape)}")
  if group.ndim != 1 or (k and (group.min() < 0 or group.max() >= len(source.groups))):
    raise SourceError(f"{where}: group ids must be [k] in [0, {len(source.groups)})")
  return x, y, group


def _write_split(split, source: Source, directory: str, progress: Dict[str, Any], save, bar):
  """Writes one split into ``directory``, resuming from ``progress`` (updated through ``save``
  after every chunk)."""
  os.makedirs(directory, exist_ok=True)
  committed = progress.setdefault("bytes", {})
  encoded = source.encoding is not None
  x_spec = (np.uint8, ()) if encoded else (np.dtype(source.x_dtype), tuple(source.x_shape))
  files = {
    "x": _Appender(os.path.join(directory, "x.npy"), *x_spec, committed.get("x", 0)),
    "y": _Appender(
      os.path.join(directory, "y.npy"), source.y_dtype, source.y_shape, committed.get("y", 0)
    ),
    "group": _Appender(
      os.path.join(directory, "group.npy"), np.int32, (), committed.get("group", 0)
    ),
  }
  if encoded:
    files["x_offsets"] = _Appender(
      os.path.join(directory, "x_offsets.npy"), np.int64, (), committed.get("x_offsets", 0)
    )
  counts = progress.setdefault("counts", [])
  try:
    if encoded and not files["x_offsets"].nbytes:
      files["x_offsets"].append(np.zeros(1, np.int64))
    for i in range(len(counts) - (1 if progress.get("open") else 0), len(split.clients)):
      if not progress.get("open"):
        counts.append(0)
        progress.update(open=True, chunks=0)
      done_chunks = progress["chunks"]
      for c, chunk in enumerate(split.rows(i)):
        if c < done_chunks:
          continue  # written before an interruption
        where = f"{source.dataset} {split.name} client {split.clients[i]!r}"
        x, y, group = _check_chunk(chunk, source, where)
        if encoded:
          lengths = np.array([len(b) for b in x], np.int64)
          start = files["x"].nbytes
          files["x"].append(np.frombuffer(b"".join(x), np.uint8))
          files["x_offsets"].append(start + np.cumsum(lengths))
        else:
          files["x"].append(x)
        files["y"].append(y)
        files["group"].append(group.astype(np.int32))
        for f in files.values():
          f.file.flush()
        counts[i] += len(group)
        if len(group) and y.dtype.kind in "biuf":
          low, high = float(np.min(y)), float(np.max(y))
          progress["y_range"] = [
            min(low, progress.get("y_range", [low, high])[0]),
            max(high, progress.get("y_range", [low, high])[1]),
          ]
        progress["chunks"] = c + 1
        progress["bytes"] = {name: f.nbytes for name, f in files.items()}
        save()
        bar.update(len(group))
      if split.num_rows is not None and counts[i] != split.num_rows[i]:
        raise SourceError(
          f"{source.dataset} {split.name} client {split.clients[i]!r}: the reader yielded "
          f"{counts[i]} rows, its metadata lists {split.num_rows[i]}"
        )
      progress["open"] = False
      save()
  finally:
    for f in files.values():
      if not f.file.closed:
        f.file.flush()
  for f in files.values():
    f.finish()
  offsets = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))]).astype(np.int64)
  np.save(os.path.join(directory, "offsets.npy"), offsets, allow_pickle=False)
  return counts


def _split_manifest(split, directory: str, counts, y_range) -> Dict[str, Any]:
  arrays = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith(".npy"):
      path = os.path.join(directory, name)
      arr = np.load(path, mmap_mode="r", allow_pickle=False)
      arrays[name[:-4]] = {
        "shape": list(arr.shape),
        "dtype": arr.dtype.str,
        "bytes": os.path.getsize(path),
        "sha256": _sha256(path),
      }
  return {
    "clients": list(split.clients),
    "num_rows": [int(c) for c in counts],
    "total_rows": int(sum(counts)),
    "y_range": y_range,
    "arrays": arrays,
  }


class _NoBar:
  def update(self, n):
    pass

  def close(self):
    pass


def _progress_bar(show: bool, total: Optional[int], desc: str):
  if not show:
    return _NoBar()
  from tqdm.auto import tqdm

  return tqdm(total=total, desc=desc, unit="row", leave=False)


def prepare(
  source,
  path: Optional[str] = None,
  out: Optional[str] = None,
  *,
  overwrite: bool = False,
  progress: bool = True,
  **options,
) -> str:
  """Writes a dataset once in the prepared format (see the module docstring); returns ``out``.

  Args:
    source: a reader's name (``"camelyon17"``, ``"iwildcam"``, ``"poverty"``, ``"civilcomments"``,
      ``"pile"``, ``"shakespeare"``, ``"fedcifar100"``, ``"stackoverflow"``) read from ``path``
      with ``options``, or a :class:`~fedjax_dro.data._sources.base.Source`.
    path: the dataset's directory in its publisher's layout (with a reader's name).
    out: the prepared directory to write.
    overwrite: replace a finished prepared directory at ``out`` (only once the new one is
      complete).
    progress: show a progress bar of the rows written.
    **options: the reader's options (``image_size``, ``seq_len``, ``clients``, ``tokenizer``...).

  Raises:
    ValueError: an unknown source, a finished directory at ``out`` without ``overwrite``, a
      partial directory of another configuration, or a malformed input file (one line naming it).
    OSError: the disk filled (:class:`~fedjax_dro.records.files.FileWriteError`, naming the file;
      the partial work is kept for a resume, ``out`` untouched).
  """
  if out is None or not isinstance(out, (str, os.PathLike)):
    raise TypeError(f"out must be a directory path, got {out!r}")
  out = os.path.abspath(os.fspath(out))
  if isinstance(source, str):
    if path is None:
      raise ValueError(f"path must be the {source} dataset's directory, got None")
    src = reader(source).source(os.fspath(path), **options)
  elif isinstance(source, Source):
    src = source
  else:
    raise TypeError(f"source must be a reader's name or a Source, got {type(source).__name__}")
  if os.path.exists(os.path.join(out, MANIFEST)) and not overwrite:
    raise ValueError(
      f"out {out} is a finished prepared directory; pass overwrite=True (--overwrite) to "
      "replace it, or choose another --out"
    )
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"out {out} exists and is not a directory")
  json_options = json.loads(json.dumps(options, sort_keys=True, default=str))
  fingerprint = _fingerprint(src, json_options)
  partial = out + ".partial"
  with DirectoryLock(partial, "prepare's output", lock_file=".lock"):
    state = _read_progress(partial)
    if state is not None and state.get("fingerprint") != fingerprint:
      if not overwrite:
        raise ValueError(
          f"{partial} holds an interrupted prepare of another configuration; remove it or pass "
          "overwrite=True (--overwrite) to start over"
        )
      state = None
    if state is None:
      for name in os.listdir(partial):
        if name != ".lock":
          _remove(os.path.join(partial, name))
      state = {"fingerprint": fingerprint, "splits": {}}
    progress_path = os.path.join(partial, PROGRESS)

    def save():
      atomic_write(progress_path, json.dumps(state, sort_keys=True))

    save()
    manifest_splits = {}
    for split in src.splits:
      total = None if split.num_rows is None else int(sum(split.num_rows))
      bar = _progress_bar(progress, total, f"{src.dataset} {split.name}")
      try:
        split_state = state["splits"].setdefault(split.name, {})
        directory = os.path.join(partial, split.name)
        counts = _write_split(split, src, directory, split_state, save, bar)
      except SourceError as e:  # a bad input file met while writing: the work so far kept
        raise SourceError(
          f"{e} (prepare stopped: {out} unchanged, the rows before it kept in {partial}; fix "
          "the file and run again to resume)"
        ) from None
      except OSError as e:
        if e.errno == errno.ENOSPC:
          raise OSError(
            errno.ENOSPC,
            f"the disk filled while writing {partial}/{split.name}; {out} is unchanged and the "
            "work so far is kept: free space and run prepare again to resume",
          ) from None
        raise
      finally:
        bar.close()
      y_range = split_state.get("y_range")
      manifest_splits[split.name] = _split_manifest(split, directory, counts, y_range)
    manifest = {
      "format": FORMAT,
      "dataset": src.dataset,
      "options": json_options,
      "x": {"shape": list(src.x_shape), "dtype": src.x_dtype, "encoding": src.encoding},
      "y": {"shape": list(src.y_shape), "dtype": src.y_dtype},
      "groups": list(src.groups),
      "info": json.loads(json.dumps(src.info, default=str)),
      "splits": manifest_splits,
    }
    atomic_write(os.path.join(partial, MANIFEST), json.dumps(manifest, indent=1) + "\n")
    os.remove(progress_path)
  _remove(os.path.join(partial, ".lock"))
  if os.path.exists(out):  # overwrite: the old directory goes only now, the new one complete
    old = out + ".old"
    _remove(old)
    os.rename(out, old)
    os.rename(partial, out)
    _remove(old)
  else:
    os.rename(partial, out)
  return out


def _read_progress(partial: str) -> Optional[Dict[str, Any]]:
  try:
    with open(os.path.join(partial, PROGRESS)) as f:
      state = json.load(f)
  except (OSError, ValueError):
    return None
  return state if isinstance(state, dict) else None


def _remove(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path)
  elif os.path.lexists(path):
    os.remove(path)


# ----------------------------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------------------------
def read_manifest(path: str, *, verify: bool = True) -> Dict[str, Any]:
  """The manifest of the prepared directory ``path``, its arrays checked against it (sizes, and
  with ``verify`` their SHA-256 checksums). Raises :class:`PreparedError` naming the file."""
  path = os.fspath(path)
  file = os.path.join(path, MANIFEST)
  if not os.path.isdir(path):
    raise PreparedError(f"{path}: not a directory (a prepared dataset written by prepare)")
  if not os.path.isfile(file):
    hint = " (an interrupted prepare: run it again to finish)" if path.endswith(".partial") else ""
    raise PreparedError(f"{file}: missing; {path} is not a finished prepared directory{hint}")
  try:
    with open(file) as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    raise PreparedError(f"{file}: not valid JSON ({e})") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise PreparedError(f"{file}: not a {FORMAT} manifest")
  for split, entry in manifest["splits"].items():
    for name, spec in entry["arrays"].items():
      array = os.path.join(path, split, f"{name}.npy")
      if not os.path.isfile(array):
        raise PreparedError(f"{array}: missing (listed in the manifest)")
      if os.path.getsize(array) != spec["bytes"]:
        raise PreparedError(
          f"{array}: {os.path.getsize(array)} bytes, the manifest says {spec['bytes']}"
        )
      if verify and _sha256(array) != spec["sha256"]:
        raise PreparedError(f"{array}: checksum does not match the manifest (the file changed)")
  return manifest


def federated_source(data, *, dataset: str = "custom", chunk: int = 256) -> Source:
  """A :class:`~fedjax_dro.data._sources.base.Source` of in-memory federated data, to write it in
  the prepared format: a :class:`~fedjax_dro.data.federated.FederatedDataset` (its train, and
  test and validation splits where present, named ``"train"``, ``"test"``, ``"validation"``) or
  one :class:`~fedjax_dro.data.federated.FederatedData` (``"train"``). Each client's valid rows,
  in order; one group ``"all"``."""
  from fedjax_dro.data.federated import FederatedData, FederatedDataset

  if isinstance(data, FederatedData):
    splits, names = {"train": data}, None
  elif isinstance(data, FederatedDataset):
    splits = {"train": data.train, "test": data.test, "validation": data.validation}
    splits = {k: v for k, v in splits.items() if v is not None}
    names = data.client_names
  else:
    raise TypeError(f"data must be a FederatedData or FederatedDataset, got {type(data).__name__}")
  first = splits["train"]
  x0, y0 = np.asarray(first.x), np.asarray(first.y)
  n = first.num_clients
  clients = tuple(names) if names is not None else tuple(f"client_{i}" for i in range(n))

  def split_source(name, part):
    x, y = np.asarray(part.x), np.asarray(part.y)
    counts = tuple(int(c) for c in np.asarray(part.num_examples))

    def rows(i):
      for start in range(0, counts[i], chunk):
        stop = min(start + chunk, counts[i])
        yield x[i, start:stop], y[i, start:stop], np.zeros(stop - start, np.int32)

    return SplitSource(name, clients, rows, counts)

  return Source(
    dataset=dataset,
    x_shape=tuple(x0.shape[2:]),
    x_dtype=x0.dtype.name,
    y_shape=tuple(y0.shape[2:]),
    y_dtype=y0.dtype.name,
    groups=("all",),
    splits=tuple(split_source(k, v) for k, v in splits.items()),
    info={"task": getattr(data, "task", None), "num_classes": getattr(data, "num_classes", None)},
  )


def write_standin(name: str, path) -> str:
  """Writes the reader ``name``'s stand-in, a tiny generated directory in the publisher's exact
  on-disk layout (its quirks included: zero-padded patient ids, split strings, labels absent from
  a split, a removed Pile subset), at ``path``; returns the path to give :func:`prepare`. For
  tests and ``--quick`` runs: its numbers mean nothing."""
  return reader(name).write_standin(os.fspath(path))
