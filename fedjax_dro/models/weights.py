"""Pretrained weights without pickle: a pure-NumPy reader and writer of the safetensors format,
and a refusal of the pickle-based checkpoint formats.

A safetensors file is an 8-byte little-endian unsigned header length ``N``, ``N`` bytes of a JSON
header ``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
"__metadata__": {str: str}}`` and the tensors' raw little-endian bytes, ``data_offsets`` counted
from the start of that buffer. Nothing here runs code from the file: the header is JSON and the
data are bytes read as arrays. ``.bin``, ``.pth``, ``.pt``, ``.pkl`` and ``.ckpt`` checkpoints are
Python pickles, whose loading runs arbitrary code, and are refused (:func:`refuse_pickle_formats`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Mapping, Optional

import numpy as np

# safetensors dtype -> little-endian NumPy dtype (BF16: its raw 16 bits, widened when read)
_DTYPES = {
  "F64": np.dtype("<f8"),
  "F32": np.dtype("<f4"),
  "F16": np.dtype("<f2"),
  "BF16": np.dtype("<u2"),
  "I64": np.dtype("<i8"),
  "I32": np.dtype("<i4"),
  "I16": np.dtype("<i2"),
  "I8": np.dtype("i1"),
  "U64": np.dtype("<u8"),
  "U32": np.dtype("<u4"),
  "U16": np.dtype("<u2"),
  "U8": np.dtype("u1"),
  "BOOL": np.dtype("?"),
}
_NAMES = {
  np.dtype(np.float64): "F64",
  np.dtype(np.float32): "F32",
  np.dtype(np.float16): "F16",
  np.dtype(np.int64): "I64",
  np.dtype(np.int32): "I32",
  np.dtype(np.int16): "I16",
  np.dtype(np.int8): "I8",
  np.dtype(np.uint64): "U64",
  np.dtype(np.uint32): "U32",
  np.dtype(np.uint16): "U16",
  np.dtype(np.uint8): "U8",
  np.dtype(np.bool_): "BOOL",
}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the limit of the reference implementation
PICKLE_SUFFIXES = (".bin", ".pth", ".pt", ".pkl", ".ckpt")


def refuse_pickle_formats(path) -> None:
  """Raises ``ValueError`` when ``path`` names a pickle-based checkpoint (``.bin``, ``.pth``,
  ``.pt``, ``.pkl``, ``.ckpt``): unpickling runs whatever code the file holds. Returns None for
  any other name."""
  name = os.fspath(path)
  suffix = os.path.splitext(name)[1].lower()
  if suffix in PICKLE_SUFFIXES:
    raise ValueError(
      f"{name}: refusing to load a {suffix} checkpoint: it is a Python pickle, and loading a "
      "pickle runs arbitrary code stored in the file. Use a .safetensors file instead (most "
      "Hugging Face repositories publish model.safetensors), or convert this one on a trusted "
      "machine: torch.load it there and save it with safetensors.torch.save_file(state_dict, "
      "'model.safetensors')."
    )


def _widen_bf16(raw: np.ndarray) -> np.ndarray:
  """bfloat16 bit patterns (uint16) as float32: the same values, exactly."""
  return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _no_duplicates(pairs):
  keys = [k for k, _ in pairs]
  twice = sorted({k for k in keys if keys.count(k) > 1})
  if twice:
    raise ValueError(f"duplicate names {twice}")
  return dict(pairs)


def read_safetensors(path) -> Dict[str, np.ndarray]:
  """The tensors of a safetensors file as NumPy arrays (BF16 widened to float32, exactly).

  Everything is checked before anything is returned: the header length against the file's size,
  the header's JSON, each tensor's dtype, shape and offsets (inside the data buffer, its byte
  count ``prod(shape) * itemsize``), and that the tensors tile the buffer (contiguous, no
  overlaps, no gaps). Any problem raises one ``ValueError`` naming the file and every tensor at
  fault.

  Args:
    path: the ``.safetensors`` file.

  Returns:
    ``{name: array}`` in the header's order (``__metadata__`` left out).
  """
  name = os.fspath(path)
  refuse_pickle_formats(name)
  size = os.path.getsize(name)
  data = bytearray(size)  # one buffer; the returned arrays are (writable) views of it
  with open(name, "rb") as f:
    if f.readinto(data) != size:
      raise ValueError(f"{name}: the file changed size while it was read")
  if size < 8:
    raise ValueError(
      f"{name}: not a safetensors file: {size} bytes, fewer than the 8 of its header"
    )
  n = int.from_bytes(data[:8], "little")
  if n < 2 or n > MAX_HEADER_BYTES or 8 + n > size:
    raise ValueError(
      f"{name}: not a safetensors file or truncated: header length {n} does not fit a file of "
      f"{size} bytes (the header takes 8 + {n})"
    )
  try:
    header = json.loads(data[8 : 8 + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
  except (UnicodeDecodeError, ValueError) as e:
    raise ValueError(f"{name}: the safetensors header is not valid JSON ({e})") from None
  if not isinstance(header, dict):
    raise ValueError(f"{name}: the safetensors header is not a JSON object")
  header.pop("__metadata__", None)
  buffer = memoryview(data)[8 + n :]
  problems, spans = [], []
  for key, entry in header.items():
    where = f"tensor {key!r}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
      problems.append(f"{where}: entry must hold exactly dtype, shape and data_offsets")
      continue
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in _DTYPES:
      problems.append(f"{where}: unknown dtype {dtype!r} (known: {', '.join(_DTYPES)})")
      continue
    if not isinstance(shape, list) or not all(
      type(d) is int and d >= 0 for d in shape
    ):  # bool is not int here
      problems.append(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
      continue
    if (
      not isinstance(offsets, list)
      or len(offsets) != 2
      or not all(type(o) is int for o in offsets)
      or not 0 <= offsets[0] <= offsets[1] <= len(buffer)
    ):
      problems.append(
        f"{where}: data_offsets {offsets!r} are not [begin, end] inside the data buffer of "
        f"{len(buffer)} bytes"
      )
      continue
    expected = math.prod(shape) * _DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != expected:
      problems.append(
        f"{where}: {offsets[1] - offsets[0]} bytes, but {dtype}{shape} takes {expected}"
      )
      continue
    spans.append((offsets[0], offsets[1], key))
  if not problems:
    end = 0
    for begin, stop, key in sorted(spans):
      if begin < end:
        problems.append(f"tensor {key!r}: data_offsets [{begin}, {stop}] overlap another tensor")
      elif begin > end:
        problems.append(f"tensor {key!r}: data_offsets [{begin}, {stop}] leave a gap before it")
      end = max(end, stop)
    if end != len(buffer):
      problems.append(
        f"the tensors end at byte {end} of a {len(buffer)}-byte data buffer (trailing bytes)"
      )
  if problems:
    raise ValueError(f"{name}: invalid safetensors file:\n  " + "\n  ".join(problems))
  tensors = {}
  for key, entry in header.items():
    begin, stop = entry["data_offsets"]
    dtype = _DTYPES[entry["dtype"]]
    raw = np.frombuffer(buffer[begin:stop], dtype=dtype).reshape(entry["shape"])
    if entry["dtype"] == "BF16":
      raw = _widen_bf16(raw)
    elif (8 + n + begin) % dtype.itemsize:
      raw = raw.copy()  # aligned
    tensors[key] = raw
  return tensors


def write_safetensors(
  path, tensors: Mapping[str, np.ndarray], metadata: Optional[Mapping[str, str]] = None
) -> None:
  """Writes ``tensors`` to a safetensors file (``path`` is overwritten).

  Arrays of a ``bfloat16`` dtype (``jnp.bfloat16`` / ``ml_dtypes.bfloat16``) are written as
  BF16; other dtypes as their safetensors names (float64, float32, float16, signed and unsigned
  integers, bool). The header is padded with spaces to a multiple of 8 bytes, as the reference
  implementation does.

  Args:
    path: the file to write.
    tensors: ``{name: array}``; names must be non-empty strings other than ``__metadata__``.
    metadata: optional ``{str: str}`` stored under ``__metadata__``.
  """
  name = os.fspath(path)
  header, chunks, offset = {}, [], 0
  for key in sorted(tensors):
    if not isinstance(key, str) or not key or key == "__metadata__":
      raise ValueError(f"{name}: invalid tensor name {key!r}")
    array = np.asarray(tensors[key])
    if array.dtype.name == "bfloat16":
      dtype, raw = "BF16", array.view(np.uint16)
    elif array.dtype.newbyteorder("=") in _NAMES:  # either byte order; written little-endian
      dtype, raw = _NAMES[array.dtype.newbyteorder("=")], array
    else:
      raise ValueError(f"{name}: tensor {key!r} has dtype {array.dtype}, not storable")
    raw = np.ascontiguousarray(raw, dtype=_DTYPES[dtype]).tobytes()
    header[key] = {
      "dtype": dtype,
      "shape": [int(d) for d in array.shape],
      "data_offsets": [offset, offset + len(raw)],
    }
    chunks.append(raw)
    offset += len(raw)
  if metadata is not None:
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
      raise ValueError(f"{name}: metadata must map strings to strings")
    header["__metadata__"] = dict(metadata)
  text = json.dumps(header, separators=(",", ":")).encode("utf-8")
  text += b" " * (-len(text) % 8)
  with open(name, "wb") as f:
    f.write(len(text).to_bytes(8, "little"))
    f.write(text)
    for chunk in chunks:
      f.write(chunk)


def load_weights(module, path, *, key=None) -> Dict[str, Any]:
  """The Flax variables of a zoo module from a ``.safetensors`` file with its publishers' names.

  Dispatches on the module's type to the mapping of its family:

  * :class:`~fedjax_dro.models.resnet.ResNet` (torchvision / timm ``resnet18``, ``resnet50``
    names): :func:`~fedjax_dro.models.resnet.resnet_variables_from_torchvision`;
  * :class:`~fedjax_dro.models.densenet.DenseNet` (torchvision / timm ``densenet121``):
    :func:`~fedjax_dro.models.densenet.densenet_variables_from_torchvision`;
  * :class:`~fedjax_dro.models.gpt2.GPT2` (Hugging Face ``gpt2``):
    :func:`~fedjax_dro.models.gpt2.gpt2_params_from_hf`;
  * :class:`~fedjax_dro.models.distilbert.DistilBertClassifier` (Hugging Face
    ``distilbert-base-uncased`` or a ``DistilBertForSequenceClassification``):
    :func:`~fedjax_dro.models.distilbert.distilbert_params_from_hf`. A file without a
    classification head (the base checkpoint) gets a fresh ``pre_classifier`` and ``classifier``
    drawn from ``key`` (default ``PRNGKey(0)``), and a ``UserWarning`` names those tensors (the
    return value is the variables alone, as for every family; call
    :func:`~fedjax_dro.models.distilbert.distilbert_params_from_hf` directly to get the names
    as a list).

  Args:
    module: the module the weights are for (its sizes are checked against the file's).
    path: the ``.safetensors`` file (``~`` expanded); pickle formats (``.bin``, ``.pth``, ``.pt``, ``.pkl``,
      ``.ckpt``) are refused (:func:`refuse_pickle_formats`).
    key: the random key of DistilBERT's fresh classification head (other families ignore it).

  Returns:
    ``{"params": ...}``, plus ``"batch_stats"`` for the BatchNorm models (ResNet with
    ``norm="batch"``, DenseNet), as NumPy arrays: ``module.apply(variables, x, ...)``.

  Raises:
    TypeError: ``module`` is not of a supported type (they are listed).
    ValueError: a pickle format, an invalid safetensors file, or tensors that do not fit
      ``module`` (every missing, unexpected and mis-shaped one named).
  """
  import warnings

  from fedjax_dro.models.densenet import DenseNet, densenet_variables_from_torchvision
  from fedjax_dro.models.distilbert import DistilBertClassifier, distilbert_params_from_hf
  from fedjax_dro.models.gpt2 import GPT2, gpt2_params_from_hf
  from fedjax_dro.models.resnet import ResNet, resnet_variables_from_torchvision

  supported = (ResNet, DenseNet, GPT2, DistilBertClassifier)
  if not isinstance(module, supported):
    raise TypeError(
      f"load_weights: no weight mapping for a {type(module).__name__}; supported modules: "
      + ", ".join(t.__name__ for t in supported)
    )
  path = os.path.expanduser(os.fspath(path))
  refuse_pickle_formats(path)
  tensors = read_safetensors(path)
  if isinstance(module, ResNet):
    return resnet_variables_from_torchvision(tensors, module)
  if isinstance(module, DenseNet):
    return densenet_variables_from_torchvision(tensors, module)
  if isinstance(module, GPT2):
    return {"params": gpt2_params_from_hf(tensors, module.config)}
  params, initialized = distilbert_params_from_hf(tensors, module.config, key)
  if initialized:
    warnings.warn(
      f"{path} has no classification head: freshly initialized " + ", ".join(initialized),
      UserWarning,
      stacklevel=2,
    )
  return {"params": params}
