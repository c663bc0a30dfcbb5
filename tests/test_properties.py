"""Property-based tests (hypothesis) of the public entry points: random shapes, dtypes, NaN/inf,
empty and all-padding clients, huge and tiny values. Every input either runs correctly or raises
``ValueError`` / ``TypeError`` with a message naming the argument: never another exception type,
never a silent acceptance of an input the oracle below calls invalid.

Each property runs with a small, derandomized example budget in the default suite and a larger,
random one behind ``-m slow``.
"""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fedjax_dro as fd
from fedjax_dro import NonFiniteError, algorithms as A, cli, models
from fedjax_dro.data import FederatedData, from_client_arrays
from tests.helpers import dataset, linreg, regression_clients

FAST = settings(
  max_examples=25,
  deadline=None,
  derandomize=True,
  database=None,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LONG = settings(
  max_examples=300,
  deadline=None,
  database=None,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _fast(n):
  return settings(FAST, max_examples=n)


def _expect(valid, fn, names):
  """Runs ``fn``; a valid input must not raise, an invalid one must raise ValueError/TypeError
  naming one of ``names``."""
  if valid:
    return fn()
  with pytest.raises((ValueError, TypeError)) as info:
    fn()
  assert any(n in str(info.value) for n in names), (names, str(info.value))
  return None


# ----------------------------------------------------------------------------------------------
# from_client_arrays
# ----------------------------------------------------------------------------------------------

DTYPES = ["float16", "float32", "float64", "int32", "uint8", "bool", "complex64", "<U2"]
SPECIALS = [None, None, None, "nan", "inf", "-inf", "huge", "tiny", "negzero"]


@st.composite
def client_arrays(draw):
  n = draw(st.integers(0, 4))
  feature_shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
  label_shape = tuple(draw(st.lists(st.integers(1, 2), max_size=1)))
  sizes = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
  x_dtype, y_dtype = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(DTYPES))
  ragged = n > 1 and draw(st.integers(0, 9)) == 0
  special = draw(st.sampled_from(SPECIALS))
  target = draw(st.sampled_from([None, "float32", "float64"]))
  seed = draw(st.integers(0, 2**16))
  rng = np.random.default_rng(seed)
  xs, ys = [], []
  for i, m in enumerate(sizes):
    fs = feature_shape + ((1,) if ragged and i == n - 1 else ())
    x = rng.normal(size=(m,) + fs) * 3
    y = rng.integers(0, 3, size=(m,) + label_shape)
    xs.append(_cast(x, x_dtype))
    ys.append(_cast(y, y_dtype))
  if special and n and sizes[0] and np.prod(feature_shape, dtype=int) > 0:
    value = {
      "nan": np.nan,
      "inf": np.inf,
      "-inf": -np.inf,
      "huge": 1e300,
      "tiny": 1e-300,
      "negzero": -0.0,
    }[special]
    if xs[0].dtype.kind in "fc":
      x = xs[0].astype(np.float64) if xs[0].dtype.kind == "f" else xs[0]
      x.reshape(-1)[0] = value
      xs[0] = x
  return xs, ys, target, ragged


def _cast(a, dtype):
  if dtype == "<U2":
    return a.astype(int).astype(dtype)
  if dtype == "complex64":
    return (a + 0.5j).astype(dtype)
  if dtype in ("int32", "uint8"):
    return np.abs(a).astype(dtype)
  return a.astype(dtype)


def _from_client_arrays_valid(xs, ys, target, ragged):
  if not xs or ragged or any(x.shape[0] == 0 for x in xs):
    return False
  if any(a.dtype.kind not in "biuf" for a in xs + ys):
    return False
  x_target = (
    np.dtype(target) if target else (np.float64 if xs[0].dtype == np.float64 else np.float32)
  )
  for x in xs:
    if x.dtype.kind == "f":
      if not np.all(np.isfinite(x)) or np.any(
        np.abs(x.astype(np.float64)) > np.finfo(x_target).max
      ):
        return False
  y_kind = ys[0].dtype.kind
  if y_kind in "biu" and any(y.dtype.kind != y_kind for y in ys):
    return False
  return True


def _check_from_client_arrays(case):
  xs, ys, target, ragged = case
  valid = _from_client_arrays_valid(xs, ys, target, ragged)
  data = _expect(valid, lambda: from_client_arrays(xs, ys, dtype=target), ["xs", "ys", "dtype"])
  if data is None:
    return
  sizes = [x.shape[0] for x in xs]
  assert np.asarray(data.num_examples).tolist() == sizes
  mask = np.asarray(data.mask)
  assert np.array_equal(mask, np.arange(max(sizes))[None] < np.array(sizes)[:, None])
  x = np.asarray(data.x)
  for i, xi in enumerate(xs):  # valid rows are the input, in the stored dtype
    np.testing.assert_array_equal(x[i, : sizes[i]], xi.astype(x.dtype))
    assert np.all(x[i, sizes[i] :] == 0)  # padding is zeros
  fd.data.validate_data(data)


@_fast(40)
@given(client_arrays())
def test_from_client_arrays_property(case):
  _check_from_client_arrays(case)


@pytest.mark.slow
@LONG
@given(client_arrays())
def test_from_client_arrays_property_long(case):
  _check_from_client_arrays(case)


# ----------------------------------------------------------------------------------------------
# validate_data on hand-built FederatedData: empty / all-padding clients, non-finite padding
# ----------------------------------------------------------------------------------------------


@st.composite
def federated_data(draw):
  n = draw(st.integers(1, 4))
  m = draw(st.integers(1, 4))
  sizes = draw(st.lists(st.integers(0, m), min_size=n, max_size=n))
  pad_value = draw(st.sampled_from([0.0, 0.0, np.nan, np.inf, 1e30]))
  valid_value = draw(st.sampled_from([None, None, np.nan, -np.inf]))
  rng = np.random.default_rng(draw(st.integers(0, 999)))
  mask = np.arange(m)[None] < np.array(sizes)[:, None]
  x = np.where(mask[..., None], rng.normal(size=(n, m, 2)), pad_value)
  if valid_value is not None and sizes[0]:
    x[0, 0, 0] = valid_value
  y = np.where(mask, rng.normal(size=(n, m)), 0.0)
  data = FederatedData(x=x, y=y, mask=mask, num_examples=np.array(sizes, np.int32))
  valid = (
    min(sizes) >= 1
    and (valid_value is None or not sizes[0])
    and (np.isfinite(pad_value) or all(s == m for s in sizes))
  )
  return data, valid


def _check_federated_data(case):
  data, valid = case
  _expect(valid, lambda: fd.data.validate_data(data), ["data"])


@_fast(30)
@given(federated_data())
def test_validate_data_property(case):
  _check_federated_data(case)


@pytest.mark.slow
@LONG
@given(federated_data())
def test_validate_data_property_long(case):
  _check_federated_data(case)


# ----------------------------------------------------------------------------------------------
# Model factories
# ----------------------------------------------------------------------------------------------

INTS = st.one_of(
  st.integers(-2, 6), st.sampled_from([True, 2.0, "3", None, float("nan")]), st.just(3)
)
SHAPES = st.one_of(
  st.lists(st.integers(-1, 9), max_size=3).map(tuple),
  st.sampled_from(["8", None, 4.0, (3.0, 4), (True, 8)]),
)
WIDTHS = st.one_of(
  st.lists(st.integers(-1, 5), max_size=3).map(tuple), st.sampled_from(["4", None, 4, (2.5,)])
)
L2S = st.sampled_from([0.0, 1e-3, 1.0, -1.0, float("nan"), float("inf"), True, "0.1", 1e300])


def _pos_int(v):
  return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _shape_ok(s, lo, hi=None):
  if isinstance(s, int) and not isinstance(s, bool):
    s = (s,)
  return (
    isinstance(s, tuple)
    and lo <= len(s) <= (hi or 99)
    and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in s)
  )


def _l2_ok(v):
  return isinstance(v, float) and math.isfinite(v) and v >= 0


@st.composite
def factory_calls(draw):
  kind = draw(st.sampled_from(["linear", "logistic", "softmax", "mlp", "cnn"]))
  if kind == "linear":
    d, k, l2 = draw(INTS), draw(st.one_of(st.none(), INTS)), draw(L2S)
    valid = _pos_int(d) and (k is None or _pos_int(k)) and _l2_ok(l2)
    call = lambda: models.linear_regression(d, num_outputs=k, l2=l2)
    shape, out = ((d,) if valid else None), ((k,) if k else ())
    names = ["num_features", "num_outputs", "l2"]
  elif kind == "logistic":
    d, l2 = draw(INTS), draw(L2S)
    valid = _pos_int(d) and _l2_ok(l2)
    call, shape, out = (lambda: models.logistic_regression(d, l2=l2)), (d,), ()
    names = ["num_features", "l2"]
  elif kind == "softmax":
    d, k = draw(INTS), draw(INTS)
    valid = _pos_int(d) and _pos_int(k)
    call, shape, out = (lambda: models.softmax_regression(d, k)), (d,), (k,)
    names = ["num_features", "num_classes"]
  elif kind == "mlp":
    s, h, k = draw(SHAPES), draw(WIDTHS), draw(INTS)
    valid = _shape_ok(s, 0) and _shape_ok(h, 0) and _pos_int(k)
    call, shape, out = (lambda: models.mlp(s, k, hidden=h)), s, (k,)
    names = ["input_shape", "hidden", "num_classes"]
  else:
    s, f, k = draw(SHAPES), draw(WIDTHS), draw(INTS)
    valid = _shape_ok(s, 2, 3) and _shape_ok(f, 0) and _pos_int(k) and min(s[:2]) >= 2 ** len(f)
    call = lambda: models.cnn(s, k, features=f, dense=4)
    shape, out = s, (k,)
    names = ["input_shape", "features", "num_classes"]
  return kind, valid, call, shape, out, names


def _check_factory(case):
  import jax
  import jax.numpy as jnp

  kind, valid, call, shape, out, names = case
  model = _expect(valid, call, names)
  if model is None:
    return
  params = model.init(jax.random.PRNGKey(0))
  shape = (shape,) if isinstance(shape, int) else tuple(shape)
  outputs = model.apply(params, jnp.zeros((2,) + shape))
  assert outputs.shape == (2,) + tuple(out)
  assert all(np.all(np.isfinite(np.asarray(p))) for p in jax.tree.leaves(params))


@_fast(40)
@given(factory_calls())
def test_model_factories_property(case):
  _check_factory(case)


@pytest.mark.slow
@LONG
@given(factory_calls())
def test_model_factories_property_long(case):
  _check_factory(case)


# ----------------------------------------------------------------------------------------------
# run and sweep: hyper-parameters, rounds, seeds
# ----------------------------------------------------------------------------------------------

DATA = dataset(regression_clients(n=3, d=2, sizes=[3, 5, 4], seed=5))
ALG = A.fedavg(linreg(2), local_steps=1)
LRS = st.one_of(
  st.floats(1e-3, 0.2),
  st.sampled_from(
    [0.0, -0.1, float("nan"), float("inf"), 1e308, 5e-324, "0.1", True, [0.1], 0.1j, None]
  ),
)
ROUNDS = st.one_of(st.integers(-1, 3), st.sampled_from([True, 2.0, "2", None]))
SEEDS = st.one_of(st.integers(-3, 3), st.sampled_from([2**32, 2**32 - 1, 1.5, "0", True]))


def _lr_ok(v):
  return isinstance(v, float) and math.isfinite(v) and v > 0 and not isinstance(v, bool)


def _run_ok(lr, rounds, seed):
  return (
    _lr_ok(lr)
    and isinstance(rounds, int)
    and not isinstance(rounds, bool)
    and rounds >= 1
    and isinstance(seed, int)
    and not isinstance(seed, bool)
    and 0 <= seed < 2**32
  )


def _check_run(lr, rounds, seed):
  valid = _run_ok(lr, rounds, seed)
  call = lambda: fd.run(ALG, DATA, rounds=rounds, seed=seed, hparams={"client_lr": lr})
  try:
    hist = _expect(valid, call, ["client_lr", "rounds", "seed"])
  except NonFiniteError:  # a valid but too large step: stopped, with the round named
    return
  if hist is not None:
    assert hist.config["hparams"]["client_lr"] == lr and hist.config["rounds"] == rounds
    assert len(hist.train_metrics["train_loss"]) == rounds
    assert all(np.isfinite(v) for v in hist.final["loss"].values())


@_fast(12)
@given(LRS, ROUNDS, SEEDS)
def test_run_property(lr, rounds, seed):
  _check_run(lr, rounds, seed)


@pytest.mark.slow
@settings(LONG, max_examples=60)
@given(LRS, ROUNDS, SEEDS)
def test_run_property_long(lr, rounds, seed):
  _check_run(lr, rounds, seed)


GRIDS = st.one_of(
  st.lists(st.floats(1e-3, 0.2), min_size=1, max_size=2).map(lambda v: {"client_lr": v}),
  st.sampled_from(
    [
      "client_lr=0.1",
      {"client_lr": 0.1},
      {"client_lr": []},
      {"client_lr": "0.1,0.2"},
      {"client_lr": [0.1, -1.0]},
      {"client_lr": [float("nan")]},
      {"lr": [0.1]},
      {"client_lr": [[0.1]]},
      None,
    ]
  ),
)
SEED_LISTS = st.one_of(
  st.lists(st.integers(-1, 3), min_size=0, max_size=2), st.sampled_from(["0,1", 3, [1.5]])
)


def _sweep_ok(grid, seeds):
  grid_ok = grid is None or (
    isinstance(grid, dict)
    and set(grid) == {"client_lr"}
    and isinstance(grid["client_lr"], list)
    and len(grid["client_lr"]) >= 1
    and all(_lr_ok(v) for v in grid["client_lr"])
  )
  seeds_ok = (
    isinstance(seeds, list)
    and len(seeds) >= 1
    and all(isinstance(s, int) and 0 <= s < 2**32 for s in seeds)
  )
  return grid_ok and seeds_ok


def _check_sweep(grid, seeds):
  valid = _sweep_ok(grid, seeds)
  res = _expect(
    valid,
    lambda: fd.sweep(ALG, DATA, rounds=2, grid=grid, seeds=seeds),
    ["grid", "client_lr", "seeds", "lr"],
  )
  if res is not None:
    rows = len(seeds) * (len(grid["client_lr"]) if grid else 1)
    assert len(res.configs) == rows and res.train_metrics["train_loss"].shape == (rows, 2)


@_fast(12)
@given(GRIDS, SEED_LISTS)
def test_sweep_property(grid, seeds):
  _check_sweep(grid, seeds)


@pytest.mark.slow
@settings(LONG, max_examples=60)
@given(GRIDS, SEED_LISTS)
def test_sweep_property_long(grid, seeds):
  _check_sweep(grid, seeds)


# ----------------------------------------------------------------------------------------------
# CLI flags
# ----------------------------------------------------------------------------------------------

FLAG_VALUES = {
  "--rounds": ["1", "2", "0", "-3", "abc", "1.5"],
  "--clients-per-round": ["1", "5", "6", "0", "x"],
  "--local-steps": ["1", "0", "-1"],
  "--batch-size": ["4", "0", "z"],
  "--eval-every": ["1", "0", "-2"],
  "--hparam": ["client_lr=0.05", "client_lr=-1", "client_lr=nan", "client_lr=abc", "client_lr"],
  "--backend": ["vmap", "map", "gpu"],
}


@st.composite
def cli_argv(draw):
  chosen = draw(st.dictionaries(st.sampled_from(sorted(FLAG_VALUES)), st.just(None), max_size=4))
  values = {f: draw(st.sampled_from(FLAG_VALUES[f])) for f in chosen}
  values.setdefault("--rounds", "1")
  argv = ["run", "--dataset", "synthetic-shift", "--no-progress"]
  for flag, value in values.items():
    argv += [flag, value]
  return values, argv


def _cli_valid(values):
  def pos(flag, hi=10**9):
    v = values.get(flag)
    return v is None or (v.lstrip("-").isdigit() and 1 <= int(v) <= hi)

  hp = values.get("--hparam")
  hp_ok = hp is None or hp == "client_lr=0.05"
  return (
    pos("--rounds")
    and pos("--clients-per-round", 5)
    and pos("--local-steps")
    and pos("--batch-size")
    and pos("--eval-every")
    and hp_ok
    and values.get("--backend", "vmap") in ("vmap", "map")
  )


def _check_cli(case, capsys):
  values, argv = case
  valid = _cli_valid(values)
  try:
    rc = cli.main(argv)
  except SystemExit as e:  # argparse: a wrong type or choice, message names the flag
    err = capsys.readouterr().err
    assert not valid and e.code == 2, err
    assert any(f in err for f in values), err
    return
  err = capsys.readouterr().err.strip()
  if valid:
    assert rc in (0, 3), err  # 3: a NaN stop naming the round
  else:
    assert rc == 2 and err.startswith("error: ") and "\n" not in err, (argv, err)


def test_cli_flags_property(capsys):
  @_fast(10)
  @given(cli_argv())
  def prop(case):
    _check_cli(case, capsys)

  prop()


@pytest.mark.slow
def test_cli_flags_property_long(capsys):
  @settings(LONG, max_examples=60)
  @given(cli_argv())
  def prop(case):
    _check_cli(case, capsys)

  prop()


def test_all_padding_and_empty_clients_are_refused_by_run():
  data = regression_clients(n=3, d=2, sizes=[3, 4, 2], seed=1)
  empty = data.replace(mask=data.mask.at[1].set(False), num_examples=data.num_examples.at[1].set(0))
  with pytest.raises(ValueError, match=r"data: clients \[1\] are empty"):
    fd.run(ALG, empty, rounds=1)
  with pytest.raises(ValueError, match=r"eval_data: clients \[1\] are empty"):
    fd.run(ALG, DATA, rounds=1, eval_data=empty)
