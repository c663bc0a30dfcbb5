"""Models: per-client evaluation, minibatches, the built-in and flax models training, flax init."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, models, run
from fedjax_dro.data import FederatedDataset, from_client_arrays
from fedjax_dro.models.base import per_client_eval, sample_batch


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
