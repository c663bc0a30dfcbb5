"""Models: per-client evaluation, minibatches, the built-in and flax models training, flax init."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, models, run
from fedjax_dro.common.model import per_client_eval, sample_batch
from fedjax_dro.data import FederatedDataset, from_client_arrays


def test_per_client_eval_r2_and_accuracy_oracles():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(7, 3)), rng.normal(size=7)
  model = models.linear_regression(3)
  params = {"w": jnp.array([0.5, -1.0, 2.0]), "b": jnp.array(0.3)}
  mask = jnp.array([True] * 5 + [False] * 2)
  out = per_client_eval(model, params, x, y, mask)
  pred = x[:5] @ np.array([0.5, -1.0, 2.0]) + 0.3
  mse = np.mean((pred - y[:5]) ** 2)
  assert float(out["mse"]) == pytest.approx(mse)
  assert float(out["r2"]) == pytest.approx(1 - mse / np.var(y[:5]))
  clf = models.softmax_regression(3, 4)
  p = {"w": jnp.asarray(rng.normal(size=(3, 4))), "b": jnp.zeros(4)}
  labels = rng.integers(0, 4, 7)
  acc = per_client_eval(clf, p, x, labels, mask)["accuracy"]
  assert float(acc) == pytest.approx(
    np.mean(np.argmax(x[:5] @ np.asarray(p["w"]), 1) == labels[:5])
  )


def test_minibatches_draw_only_valid_rows():
  x = jnp.arange(10.0)[:, None]
  for seed in range(20):
    bx, _, bmask = sample_batch(jax.random.PRNGKey(seed), x, x[:, 0], jnp.int32(3), 8)
    assert set(np.asarray(bx[:, 0]).tolist()) <= {0.0, 1.0, 2.0} and bool(bmask.all())


@pytest.mark.parametrize("make_model", ["mlp", "cnn", "flax"])
def test_builtin_and_flax_models_train_with_fedavg(make_model):
  import flax.linen as nn

  rng = np.random.default_rng(0)
  if make_model == "cnn":
    xs = [rng.normal(size=(12, 8, 8)) for _ in range(3)]
    model = models.cnn((8, 8), 3, features=(4,), dense=8)
  else:
    xs = [rng.normal(size=(12, 6)) for _ in range(3)]
    model = (
      models.mlp((6,), 3, (8,))
      if make_model == "mlp"
      else models.from_flax(nn.Dense(3), np.zeros((1, 6)))
    )
  ys = [(np.abs(x.reshape(12, -1)[:, 0]) * 2).astype(int) % 3 for x in xs]
  data = from_client_arrays(xs, ys)
  ds = FederatedDataset(train=data, test=data, task="classification", num_classes=3)
  h = run(
    A.fedavg(model, local_steps=5, batch_size=4),
    ds,
    rounds=20,
    hparams={"client_lr": 0.1},
    eval_every=20,
  )
  first = h.train_metrics["train_loss"][0]
  assert h.train_metrics["train_loss"][-5:].mean() < first
  assert 0.0 <= h.final["accuracy"]["mean"] <= 1.0


@pytest.mark.parametrize(
  "make_model",
  [
    lambda: models.mlp((20,), 5, (16, 8)),
    lambda: models.cnn((8, 8), 10, conv="patches"),
    lambda: models.cnn((12, 12), 4, features=(4, 6), conv="lax"),
  ],
)
def test_flax_model_init_is_one_program_with_the_op_by_op_values(make_model):
  """from_flax compiles a model's init as one program; the parameters are bit for bit those of
  flax's init called without it, each initializer compiled on its own (what model.init did
  before: the values every run and reproduced table starts from)."""
  model = make_model()
  for seed in range(3):
    key = jax.random.PRNGKey(seed)
    compiled = model.init(key)
    eager = model.init.__wrapped__(key)  # module.init(key, sample_input)["params"], no outer jit
    for a, b in zip(jax.tree.leaves(compiled), jax.tree.leaves(eager)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _mismatched_models():
  """Every built-in model, each head and convolution form, built for 4 features (or a 4x4x1
  image) where the data will have another count."""
  from fedjax_dro import models as M

  out = {
    "linear_regression": M.linear_regression(4),
    "linear_regression k=2": M.linear_regression(4, num_outputs=2),
    "logistic_regression": M.logistic_regression(4),
    "mlp": M.mlp((4,), 3, hidden=(5,)),
  }
  for head in ("plain", "transposed", "auto"):
    out[f"softmax_regression head={head}"] = M.softmax_regression(4, 3, head=head)
  for conv in ("lax", "patches", "auto"):
    out[f"cnn conv={conv}"] = M.cnn((4, 4, 1), 3, features=(2,), dense=None, conv=conv)
  return out


@pytest.mark.parametrize("name", list(_mismatched_models()))
@pytest.mark.parametrize("features", [1, 3, 16 + 1])
def test_every_model_refuses_data_of_another_feature_count(name, features):
  """A model built for 4 features (16 for the CNN's 4x4 image) refuses data of another count
  before anything is traced, naming the counts; a size-1 feature axis that a product would
  broadcast is refused too (the transposed softmax head's einsum broadcast it)."""
  from fedjax_dro import algorithms as A, run
  from fedjax_dro.data import from_client_arrays

  model = _mismatched_models()[name]
  if features == 4 or (name.startswith("cnn") and features == 16):
    pytest.skip("the model's own feature count")
  rng = np.random.default_rng(0)
  xs = [rng.standard_normal((5, features)) for _ in range(3)]
  ys = [rng.integers(0, 2, 5).astype(np.int32) for _ in range(3)]
  if model.task == "regression":
    ys = [y.astype(np.float64) for y in ys]
  with pytest.raises(ValueError, match=r"takes examples of (4|16) features, but data\.x has"):
    run(A.fedavg(model), from_client_arrays(xs, ys), rounds=1)


def test_models_accept_their_feature_count_in_any_shape():
  """The check counts features: an MLP for (4,) takes (2, 2) examples, a CNN for (4, 4, 1)
  takes (4, 4) images, as applying them always did."""
  from fedjax_dro import algorithms as A, models as M, run
  from fedjax_dro.data import from_client_arrays

  rng = np.random.default_rng(0)
  ys = [rng.integers(0, 3, 5).astype(np.int32) for _ in range(2)]
  for model, shape in [
    (M.mlp((4,), 3, hidden=(5,)), (2, 2)),
    (M.cnn((4, 4, 1), 3, features=(2,), dense=None), (4, 4)),
  ]:
    xs = [rng.standard_normal((5,) + shape) for _ in range(2)]
    hist = run(A.fedavg(model), from_client_arrays(xs, ys), rounds=1)
    assert np.isfinite(hist.final["loss"]["mean"])
    assert model.input_size == 4 * (4 if shape == (4, 4) else 1)


def test_l2_must_be_representable_in_the_parameter_dtype():
  """An l2 that the parameters' dtype flushes to 0 (or overflows) is refused, naming l2; with
  x64 off the dtype is float32."""
  import jax as _jax

  with pytest.raises(ValueError, match="l2 = 1e-320 is not representable"):
    models.logistic_regression(3, l2=1e-320)
  previous = _jax.config.jax_enable_x64
  _jax.config.update("jax_enable_x64", False)
  try:
    for bad in (1e-50, 1e39):
      with pytest.raises(ValueError, match="not representable in float32"):
        models.softmax_regression(3, 2, l2=bad)
    assert models.softmax_regression(3, 2, l2=1e-3).l2 == 1e-3
  finally:
    _jax.config.update("jax_enable_x64", previous)
