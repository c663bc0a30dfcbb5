"""Federated data as padded, stacked arrays with masks.

Every client is padded to one ``max_examples`` so that the whole federation is a single pytree
with a leading client axis. Valid rows always come first (``mask[i, :num_examples[i]]`` is True,
the rest False): this *prefix* layout lets minibatch sampling draw only valid rows with one
``randint`` and makes padding invisible to every loss, gradient and metric.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = Any


@flax.struct.dataclass
class FederatedData:
  """Padded stacked client data (a pytree).

  Attributes:
    x: ``[n_clients, max_examples, *feature_shape]`` features.
    y: ``[n_clients, max_examples, *label_shape]`` labels / responses.
    mask: ``[n_clients, max_examples]`` bool, True on valid rows (a prefix of each row).
    num_examples: ``[n_clients]`` int32, number of valid rows per client.
  """

  x: Array
  y: Array
  mask: Array
  num_examples: Array

  @property
  def num_clients(self) -> int:
    return int(self.x.shape[0])

  def __repr__(self) -> str:  # shapes and counts, not the arrays
    def spec(a):
      return f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}"

    try:
      rows = f", {int(np.sum(np.asarray(self.num_examples)))} valid rows"
    except Exception:  # under tracing: shapes only
      rows = ""
    return f"FederatedData(x={spec(self.x)}, y={spec(self.y)}{rows})"

  @property
  def max_examples(self) -> int:
    return int(self.x.shape[1])

  @property
  def feature_shape(self) -> tuple:
    return tuple(self.x.shape[2:])

  def take_clients(self, idx) -> "FederatedData":
    """The sub-federation of clients ``idx`` (works under jit)."""
    return jax.tree.map(lambda a: a[idx], self)

  def pad_to(self, max_examples: int) -> "FederatedData":
    """The same data padded with extra masked rows (zeros) up to ``max_examples``."""
    extra = int(max_examples) - self.max_examples
    if extra < 0:
      raise ValueError(
        f"max_examples={max_examples} is smaller than the current {self.max_examples}"
      )
    pad = lambda a: jnp.pad(a, [(0, 0), (0, extra)] + [(0, 0)] * (a.ndim - 2))
    return FederatedData(
      x=pad(self.x), y=pad(self.y), mask=pad(self.mask), num_examples=self.num_examples
    )


@dataclasses.dataclass(frozen=True)
class FederatedDataset:
  """A train / test pair of :class:`FederatedData` with the same client order, plus static metadata.

  Attributes:
    train: the training split.
    test: the test split (may be None).
    task: ``"regression"`` or ``"classification"``.
    num_classes: number of classes for classification (None for regression).
    name: short name.
    client_names: optional names of the clients.
    true_params: optional ``[n_clients, dim]`` ground-truth parameters (synthetic tasks).
    description: one line.
    validation: an optional validation split (the same clients), for model selection that must
      not touch the training or test rows (``fedjax_dro.compare.Protocol(selection="validation")``).
  """

  train: FederatedData
  test: Optional[FederatedData] = None
  task: str = "regression"
  num_classes: Optional[int] = None
  name: str = "custom"
  client_names: Optional[Sequence[str]] = None
  true_params: Optional[np.ndarray] = None
  description: str = ""
  validation: Optional[FederatedData] = None

  @property
  def num_clients(self) -> int:
    return self.train.num_clients

  def __repr__(self) -> str:  # the splits' shapes, not their arrays
    parts = [f"name={self.name!r}", f"task={self.task!r}", f"{self.num_clients} clients"]
    if self.num_classes is not None:
      parts.append(f"num_classes={self.num_classes}")
    parts += [f"{k}={v!r}" for k in ("train", "validation", "test") if (v := getattr(self, k))]
    if self.true_params is not None:
      parts.append(f"true_params={np.asarray(self.true_params).shape}")
    return "FederatedDataset(" + ", ".join(parts) + ")"


def _as_array(value, name: str) -> np.ndarray:
  try:
    arr = np.asarray(value)
  except Exception as e:  # pragma: no cover - defensive
    raise TypeError(f"{name} must be array-like, got {type(value).__name__}") from e
  if arr.dtype == object:
    raise TypeError(f"{name} must be a numeric array, got an object array (ragged input?)")
  if arr.dtype.kind == "c":
    raise TypeError(
      f"{name} is complex-valued (dtype {arr.dtype}); the simulator needs real numbers (pass "
      f"the real and imaginary parts as separate features if both matter)"
    )
  if arr.dtype.kind in "USV":
    raise TypeError(
      f"{name} must be numeric, got dtype {arr.dtype} (encode string labels as integers, e.g. "
      f"np.unique(y, return_inverse=True)[1])"
    )
  if arr.dtype.kind not in "biuf":
    raise TypeError(f"{name} must hold real numbers (bool, int or float), got dtype {arr.dtype}")
  return arr


def _check_values(arr: np.ndarray, dtype, name: str) -> None:
  """``arr`` is finite and fits ``dtype`` (before the cast, so the error names the input)."""
  if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} has NaN or infinite values")
  if np.dtype(dtype).kind == "f" and arr.size:
    limit = float(np.finfo(dtype).max)
    big = np.abs(arr.astype(np.float64)) > limit
    if np.any(big):
      raise ValueError(
        f"{name} has values beyond the {np.dtype(dtype)} range (largest {limit:.3g}), e.g. "
        f"{arr[big].reshape(-1)[0].item()!r}: they would become inf; rescale the data"
      )
  if np.dtype(dtype).kind in "iu" and arr.dtype.kind in "iu" and arr.size:
    info = np.iinfo(dtype)
    low, high = int(arr.min()), int(arr.max())
    if low < info.min or high > info.max:
      raise ValueError(
        f"{name} has integers outside the {np.dtype(dtype)} range [{info.min}, {info.max}] "
        f"(from {low} to {high}); pass a wider integer dtype"
      )


def from_client_arrays(
  xs: Sequence, ys: Sequence, *, max_examples: Optional[int] = None, seed: int = 0, dtype=None
) -> FederatedData:
  """Builds :class:`FederatedData` from per-client lists of arrays.

  Args:
    xs: list of ``[N_i, *feature_shape]`` arrays, one per client.
    ys: list of ``[N_i, *label_shape]`` arrays.
    max_examples: optional cap on rows per client; larger clients are subsampled (without
      replacement, deterministically from ``seed``) to bound padding memory.
    seed: seed of the subsampling.
    dtype: optional dtype for ``x``: a float dtype for features (default: float32, or float64
      when x64 is enabled and the input is float64), or an integer dtype (``np.int32``) for
      integer inputs such as token ids, kept as integers (every value must fit the dtype).
  """
  if not isinstance(xs, (list, tuple)) or not isinstance(ys, (list, tuple)):
    raise TypeError(
      f"xs and ys must be lists of per-client arrays, got {type(xs).__name__} and "
      f"{type(ys).__name__}"
    )
  if len(xs) != len(ys):
    raise ValueError(f"xs and ys must have one entry per client: got {len(xs)} and {len(ys)}")
  if len(xs) == 0:
    raise ValueError("xs is empty: at least one client is required")
  xs = [_as_array(x, f"xs[{i}]") for i, x in enumerate(xs)]
  ys = [_as_array(y, f"ys[{i}]") for i, y in enumerate(ys)]
  feature_shape, label_shape = xs[0].shape[1:], ys[0].shape[1:]
  for i, (x, y) in enumerate(zip(xs, ys)):
    if x.ndim < 1 or x.shape[0] == 0:
      raise ValueError(
        f"client {i} is empty: xs[{i}] has shape {x.shape}; every client needs >= 1 row"
      )
    if y.shape[:1] != x.shape[:1]:
      raise ValueError(f"client {i}: xs[{i}] has {x.shape[0]} rows but ys[{i}] has {y.shape[:1]}")
    if x.shape[1:] != feature_shape:
      raise ValueError(
        f"client {i}: xs[{i}] has feature shape {x.shape[1:]}, which differs from client 0's "
        f"{feature_shape}"
      )
    if y.shape[1:] != label_shape:
      raise ValueError(
        f"client {i}: ys[{i}] has label shape {y.shape[1:]}, which differs from client 0's "
        f"{label_shape}"
      )
  if max_examples is not None and (
    not isinstance(max_examples, numbers.Integral)
    or isinstance(max_examples, (bool, np.bool_))
    or max_examples < 1
  ):
    raise ValueError(f"max_examples must be a positive integer, got {max_examples!r}")
  rng = np.random.default_rng(seed)
  sizes = []
  for i in range(len(xs)):
    if max_examples is not None and xs[i].shape[0] > max_examples:
      keep = np.sort(rng.choice(xs[i].shape[0], max_examples, replace=False))
      xs[i], ys[i] = xs[i][keep], ys[i][keep]
    sizes.append(xs[i].shape[0])
  m = max(sizes)
  n = len(xs)
  if dtype is not None:
    try:
      dtype = np.dtype(dtype)
    except TypeError:
      raise TypeError(
        f"dtype must be a float dtype such as np.float32 (features) or an integer dtype such as "
        f"np.int32 (token ids), got {dtype!r}"
      ) from None
    if dtype.kind not in "fiu":
      raise TypeError(
        f"dtype must be a float dtype such as np.float32 (features) or an integer dtype such as "
        f"np.int32 (token ids), got {dtype}"
      )
    if dtype.kind in "iu" and not all(np.issubdtype(x.dtype, np.integer) for x in xs):
      bad = next(i for i, x in enumerate(xs) if not np.issubdtype(x.dtype, np.integer))
      raise TypeError(
        f"dtype {dtype} keeps x as integers (token ids), but xs[{bad}] has dtype "
        f"{xs[bad].dtype}: pass integer arrays, or a float dtype for features"
      )
  x_dtype = dtype or (
    np.float64 if xs[0].dtype == np.float64 and jax.config.jax_enable_x64 else np.float32
  )
  y_dtype = ys[0].dtype if np.issubdtype(ys[0].dtype, np.integer) else x_dtype
  for i in range(n):
    _check_values(xs[i], x_dtype, f"xs[{i}]")
    _check_values(ys[i], y_dtype, f"ys[{i}]")
    if np.issubdtype(y_dtype, np.integer) and not np.issubdtype(ys[i].dtype, np.integer):
      raise TypeError(
        f"ys[{i}] has dtype {ys[i].dtype} but ys[0] has {ys[0].dtype}: labels would be cast to "
        f"{ys[0].dtype} (0.5 -> 0); give every client labels of one kind"
      )
  x = np.zeros((n, m) + feature_shape, x_dtype)
  y = np.zeros((n, m) + label_shape, y_dtype)
  mask = np.zeros((n, m), bool)
  for i in range(n):
    x[i, : sizes[i]] = xs[i]
    y[i, : sizes[i]] = ys[i]
    mask[i, : sizes[i]] = True
  data = FederatedData(
    x=jnp.asarray(x),
    y=jnp.asarray(y),
    mask=jnp.asarray(mask),
    num_examples=jnp.asarray(np.array(sizes, np.int32)),
  )
  validate_data(data)
  return data


def from_arrays(
  x,
  y,
  client_id,
  *,
  num_clients: Optional[int] = None,
  max_examples: Optional[int] = None,
  seed: int = 0,
) -> FederatedData:
  """Builds :class:`FederatedData` from pooled ``(x, y, client_id)`` arrays.

  ``client_id[k]`` in ``[0, num_clients)`` says which client owns row ``k``; rows keep their order
  within a client.
  """
  x, y, cid = _as_array(x, "x"), _as_array(y, "y"), _as_array(client_id, "client_id")
  for name, arr in (("x", x), ("y", y)):
    if arr.ndim < 1:
      raise ValueError(f"{name} must have one row per example, got a scalar ({arr.dtype})")
  if cid.ndim != 1 or not np.issubdtype(cid.dtype, np.integer):
    raise TypeError(
      f"client_id must be a 1-D integer array, got shape {cid.shape} dtype {cid.dtype}"
    )
  if x.shape[0] != cid.shape[0] or y.shape[0] != cid.shape[0]:
    raise ValueError(
      f"x, y and client_id must have the same number of rows: got {x.shape[0]}, "
      f"{y.shape[0]}, {cid.shape[0]}"
    )
  rows = cid.shape[0]
  if rows == 0:
    raise ValueError("x, y and client_id have no rows: at least one example is required")
  if cid.min() < 0:
    raise ValueError(f"client_id must be >= 0, got min {cid.min()}")
  # Every client needs >= 1 row, so no valid count exceeds the number of rows: both are checked
  # before anything is allocated per client (a client id of 10**12 is refused, not looped over).
  if num_clients is not None and (
    not isinstance(num_clients, numbers.Integral)
    or isinstance(num_clients, (bool, np.bool_))
    or not 1 <= num_clients <= rows
  ):
    raise ValueError(
      f"num_clients must be an integer in [1, {rows}] (every client needs >= 1 of the {rows} "
      f"rows), got {num_clients!r}"
    )
  if cid.max() >= rows:
    raise ValueError(
      f"client_id has value {cid.max()} but there are only {rows} rows: client ids must be "
      f"0..num_clients-1 and every client needs >= 1 row"
    )
  n = int(num_clients) if num_clients is not None else int(cid.max()) + 1
  if cid.max() >= n:
    raise ValueError(f"client_id has value {cid.max()} >= num_clients={n}")
  counts = np.bincount(cid, minlength=n)
  if np.any(counts == 0):
    raise ValueError(
      f"client {int(np.argmin(counts))} has no rows in client_id: every client needs >= 1 example"
    )
  order = np.argsort(cid, kind="stable")  # rows keep their order within a client
  bounds = np.cumsum(counts)[:-1]
  xs = np.split(x[order], bounds)
  ys = np.split(y[order], bounds)
  return from_client_arrays(xs, ys, max_examples=max_examples, seed=seed)


@jax.jit
def _all_finite_on_device(a):
  return jnp.all(jnp.isfinite(a))


def _all_finite(a) -> bool:
  if isinstance(a, jax.Array):
    return bool(_all_finite_on_device(a))
  return bool(np.all(np.isfinite(a)))


def validate_data(data: FederatedData, name: str = "data") -> None:
  """Checks shapes, dtypes, the prefix-mask layout, non-empty clients and finiteness of every
  row, padding included (the masks on the host; the finiteness of JAX arrays on their device)."""
  if not isinstance(data, FederatedData):
    raise TypeError(f"{name} must be a FederatedData, got {type(data).__name__}")
  # x and y stay where they are: shapes and dtypes are metadata, and their finiteness is one
  # reduction on the device (a 200 MB federation: ~10 ms, where copying it to the host and
  # scanning it there took 0.25 s per call of fd.run); the host copy is made only to name the
  # offending clients
  x, y = (a if isinstance(a, (jax.Array, np.ndarray)) else np.asarray(a) for a in (data.x, data.y))
  mask, nex = (np.asarray(a) for a in (data.mask, data.num_examples))
  if x.ndim < 2:
    raise ValueError(f"{name}.x must be [n_clients, max_examples, ...], got shape {x.shape}")
  n, m = x.shape[:2]
  if y.shape[:2] != (n, m):
    raise ValueError(f"{name}.y must start with [n_clients, max_examples]={(n, m)}, got {y.shape}")
  if mask.shape != (n, m) or mask.dtype != bool:
    raise ValueError(
      f"{name}.mask must be a bool array of shape {(n, m)}, got {mask.shape} {mask.dtype}"
    )
  if nex.shape != (n,):
    raise ValueError(f"{name}.num_examples must have shape {(n,)}, got {nex.shape}")
  if nex.dtype.kind not in "iu":
    raise TypeError(f"{name}.num_examples must be an integer array, got dtype {nex.dtype}")
  for field, arr in (("x", x), ("y", y)):
    if arr.dtype.kind not in "biuf":
      raise TypeError(
        f"{name}.{field} must hold real numbers (bool, int or float), got dtype {arr.dtype}"
      )
  if n == 0:
    raise ValueError(f"{name} has no clients")
  if np.any(nex < 1):
    bad = np.flatnonzero(nex < 1).tolist()
    raise ValueError(f"{name}: clients {bad} are empty; every client needs >= 1 example")
  if not np.array_equal(mask.sum(1), nex):
    raise ValueError(
      f"{name}.num_examples does not equal the number of True entries of {name}.mask"
    )
  if not np.array_equal(mask, np.arange(m)[None, :] < nex[:, None]):
    raise ValueError(f"{name}.mask must be a prefix mask (valid rows first in every client)")
  for field, arr in (("x", x), ("y", y)):
    if jnp.issubdtype(arr.dtype, jnp.floating) and not _all_finite(arr):
      arr = np.asarray(arr)
      valid = arr[mask]
      if not np.all(np.isfinite(valid)):
        bad = sorted(
          set(
            np.argwhere(~np.isfinite(arr) & mask.reshape(mask.shape + (1,) * (arr.ndim - 2)))[
              :, 0
            ].tolist()
          )
        )
        raise ValueError(f"{name}.{field} has NaN or infinite values in clients {bad[:10]}")
      if not np.all(np.isfinite(arr)):
        # Masks multiply (0 * NaN = NaN): non-finite padding would poison full-batch losses.
        bad = sorted(set(np.argwhere(~np.isfinite(arr))[:, 0].tolist()))
        raise ValueError(
          f"{name}.{field} has NaN or infinite values in padded rows (mask False) of clients "
          f"{bad[:10]}: padding must be finite (from_client_arrays pads with zeros)"
        )


def train_test_split(
  data: FederatedData, test_fraction: float, *, seed: int = 0, stratify: bool = False
) -> tuple[FederatedData, FederatedData]:
  """Per-client random split of every client's valid rows (each split keeps >= 1 row per client).

  With ``stratify=True`` (integer labels) the split is stratified per client by label.
  """
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
  validate_data(data)
  rng = np.random.default_rng(seed)
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  tr_x, tr_y, te_x, te_y = [], [], [], []
  for i in range(data.num_clients):
    if nex[i] < 2:
      raise ValueError(f"client {i} has {nex[i]} example(s): cannot split it into train and test")
    xi, yi = x[i, : nex[i]], y[i, : nex[i]]
    if stratify:
      test_idx = []
      for label in np.unique(yi):
        rows = np.flatnonzero(yi == label)
        k = int(round(test_fraction * len(rows)))
        test_idx.extend(rng.choice(rows, k, replace=False).tolist())
      test_idx = np.array(sorted(test_idx), int)
    else:
      k = int(round(test_fraction * nex[i]))
      test_idx = np.sort(rng.choice(nex[i], k, replace=False))
    k = len(test_idx)
    if k == 0 or k == nex[i]:
      test_idx = np.sort(rng.choice(nex[i], min(max(k, 1), nex[i] - 1), replace=False))
    is_test = np.zeros(nex[i], bool)
    is_test[test_idx] = True
    tr_x.append(xi[~is_test])
    tr_y.append(yi[~is_test])
    te_x.append(xi[is_test])
    te_y.append(yi[is_test])
  return (
    from_client_arrays(tr_x, tr_y, dtype=x.dtype),
    from_client_arrays(te_x, te_y, dtype=x.dtype),
  )
