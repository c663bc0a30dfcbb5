"""Karula, pFedMe, IFCA and Ditto with neural networks: the built-in CNN (``conv="lax"`` and
``"patches"``) and a ``models.from_flax`` module, run through ``fedjax_dro.run`` on a tiny image
federation.

Oracles: Karula on the CNN's pytree parameters against Karula on the same network written as a
model of one flat parameter vector (the projection, the SAGA table and every step then see
``[n, p]`` arrays: any pytree mishandling shows up as a difference); ``project_pairwise`` on a
stacked CNN pytree against the same call on its ``flatten_clients`` rows; the two convolution
forms (identical parameters and values) give the same runs; Karula's returned models satisfy
``||theta_i - theta_j||^2 <= t D_ij``, checked in numpy from the returned pytrees.
"""

import flax.linen as nn
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import models, run
from fedjax_dro.algorithms import ditto, ifca, karula, pfedme
from fedjax_dro.algorithms.karula import flatten_clients
from fedjax_dro.data import from_client_arrays
from fedjax_dro.models import Model
from fedjax_dro.solvers.pairwise import project_pairwise
from tests.helpers import dataset

N, SIDE, CLASSES, ROUNDS = 5, 8, 3, 3
T = 0.02  # Karula's constraint level: small enough that constraints are active every round


def _images(seed=0):
  """``N`` clients of 8x8 'images' whose label shifts the mean of one quadrant (learnable)."""
  rng = np.random.default_rng(seed)
  xs, ys = [], []
  for i in range(N):
    m = int(rng.integers(6, 12))
    y = rng.integers(0, CLASSES, m)
    x = 0.3 * rng.normal(size=(m, SIDE, SIDE))
    for k in range(m):
      q = y[k]
      x[k, (q % 2) * 4 : (q % 2) * 4 + 4, (q // 2) * 4 : (q // 2) * 4 + 4] += 1.0 + 0.1 * i
    xs.append(x)
    ys.append(y)
  train = from_client_arrays(xs, ys, dtype=np.float64)
  return dataset(train, task="classification", num_classes=CLASSES)


class _TinyNet(nn.Module):
  """A user flax module: conv, pool, dense (float64 parameters for the oracles)."""

  @nn.compact
  def __call__(self, x):
    x = x[..., None]
    x = nn.relu(nn.Conv(2, (3, 3), param_dtype=jnp.float64)(x))
    x = nn.avg_pool(x, (2, 2), (2, 2))
    x = x.reshape(x.shape[0], -1)
    return nn.Dense(CLASSES, param_dtype=jnp.float64)(x)


def _cnn(conv):
  return models.cnn((SIDE, SIDE), CLASSES, features=(2, 3), dense=None, conv=conv)


def _model(kind):
  if kind == "flax":
    return models.from_flax(_TinyNet(), np.zeros((1, SIDE, SIDE)))
  return _cnn(kind)


def _dissimilarity():
  rng = np.random.default_rng(4)
  a = rng.uniform(0.5, 1.5, (N, N))
  D = (a + a.T) / 2
  np.fill_diagonal(D, 0.0)
  return D


# (factory, settings, hyper-parameters) of every algorithm: a few local steps, minibatches
ALGORITHMS = {
  "karula": (karula, dict(dissimilarity=_dissimilarity(), batch_size=4), {"eta": 2.0, "t": T}),
  "pfedme": (pfedme, dict(local_steps=2, personal_steps=2, batch_size=4), {"client_lr": 0.05}),
  "ifca": (ifca, dict(local_steps=2, batch_size=4, num_clusters=2), {"client_lr": 0.1}),
  "ditto": (ditto, dict(local_steps=2, batch_size=4), {"client_lr": 0.1}),
}


def _run(name, model, seed=0, **overrides):
  factory, settings, hparams = ALGORITHMS[name]
  alg = factory(model, **{**settings, **overrides})
  return alg, run(alg, _images(), rounds=ROUNDS, hparams=hparams, seed=seed)


def _pairwise_sq(models_flat):
  diff = models_flat[:, None, :] - models_flat[None, :, :]
  return np.sum(diff * diff, axis=-1)


def _check(name, alg, hist, model):
  for metric, values in hist.train_metrics.items():
    assert np.all(np.isfinite(values)), (name, metric, values)
  for metric, stats in hist.final.items():
    assert np.isfinite(stats["mean"]), (name, metric, stats)
  assert 0.0 <= hist.final["accuracy"]["mean"] <= 1.0
  client = alg.client_models(hist.final_state)
  reference = model.init(jax.random.PRNGKey(0))
  assert jax.tree.structure(client) == jax.tree.structure(reference)
  for a, b in zip(jax.tree.leaves(client), jax.tree.leaves(reference)):
    assert a.shape == (N,) + b.shape and a.dtype == b.dtype
  if name == "karula":
    flat = np.asarray(flatten_clients(client), np.float64)
    d2 = _pairwise_sq(flat)
    bound = T * _dissimilarity()
    off = ~np.eye(N, dtype=bool)
    assert np.all(d2[off] <= bound[off] * (1 + 1e-9)), np.max(d2[off] - bound[off])
    # the constraints are active: some pair sits on its bound (else the test shows nothing)
    assert np.max(d2[off] / bound[off]) > 0.99
    assert np.all(hist.train_metrics["constraint_violation"] <= 1e-12)
    assert np.all(hist.train_metrics["projection_iterations"] > 0)
    # the certified accuracy of every round's projection: within Karula's float64 tolerance
    gap = hist.train_metrics["projection_certified_gap"]
    assert np.all((gap >= 0) & (gap <= 1e-8))
    rel = hist.train_metrics["projection_violation_rel"]
    a = hist.train_metrics["restoration_scale"]
    np.testing.assert_allclose(rel, np.maximum(1 / a**2 - 1, 0), rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
@pytest.mark.parametrize("kind", ["patches", "flax"])
def test_runs_with_cnn_and_flax_models(name, kind):
  model = _model(kind)
  alg, hist = _run(name, model)
  _check(name, alg, hist, model)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_lax_and_patch_convolutions_give_the_same_runs(name):
  """``conv="lax"`` and ``"patches"`` have identical parameters and values: the same runs."""
  runs = {conv: _run(name, _cnn(conv)) for conv in ("lax", "patches")}
  _check(name, *runs["lax"], _cnn("lax"))
  a = flatten_clients(runs["lax"][0].client_models(runs["lax"][1].final_state))
  b = flatten_clients(runs["patches"][0].client_models(runs["patches"][1].final_state))
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)


def _flat_model(model, params):
  """``model`` with one flat parameter vector: ``apply(w, x) = model.apply(unravel(w), x)``."""
  flat, unravel = jax.flatten_util.ravel_pytree(params)
  return Model(
    init=lambda key: flat,
    apply=lambda w, x: model.apply(unravel(w), x),
    loss=model.loss,
    metrics=model.metrics,
    task=model.task,
    l2=model.l2,
    name="flat",
  ), flat


@pytest.mark.parametrize("projection", ["dual", "admm"])
def test_karula_pytree_equals_karula_on_flat_parameters(projection):
  model = _cnn("patches")
  params = model.init(jax.random.PRNGKey(0))
  flat_model, flat = _flat_model(model, params)
  factory, settings, hparams = ALGORITHMS["karula"]
  settings = dict(settings, projection=projection)
  data = _images()
  tree_hist = run(
    factory(model, **settings), data, rounds=ROUNDS, hparams=hparams, init_params=params
  )
  flat_hist = run(
    factory(flat_model, **settings), data, rounds=ROUNDS, hparams=hparams, init_params=flat
  )
  tree_rows = np.asarray(flatten_clients(tree_hist.final_state.params))
  flat_rows = np.asarray(flat_hist.final_state.params)
  assert flat_rows.shape == (N, flat.size)
  # the runs moved the models apart (else equal rows would show nothing)
  assert np.max(np.abs(flat_rows - flat[None])) > 1e-3
  np.testing.assert_allclose(tree_rows, flat_rows, rtol=1e-10, atol=1e-12)
  tree_table = np.asarray(flatten_clients(tree_hist.final_state.grad_table))
  np.testing.assert_allclose(
    tree_table, np.asarray(flat_hist.final_state.grad_table), rtol=1e-10, atol=1e-13
  )
  for metric in ("train_loss", "projection_iterations", "projection_residual"):
    np.testing.assert_allclose(
      tree_hist.train_metrics[metric], flat_hist.train_metrics[metric], rtol=1e-8, atol=1e-12
    )


@pytest.mark.parametrize("method", ["dual", "admm", "dykstra"])
def test_projection_of_pytree_equals_projection_of_flattened_rows(method):
  model = _cnn("lax")
  params = model.init(jax.random.PRNGKey(1))
  keys = jax.random.split(jax.random.PRNGKey(2), N)
  z = jax.vmap(
    lambda k: jax.tree.map(
      lambda a: a + 0.1 * jax.random.normal(jax.random.fold_in(k, a.size), a.shape, a.dtype),
      params,
    )
  )(keys)
  rows = flatten_clients(z)
  assert rows.dtype == jnp.float64 and rows.shape[1] > N  # the d > n (row-space) path
  d2 = _pairwise_sq(np.asarray(rows))
  r = 0.3 * np.median(d2[~np.eye(N, dtype=bool)]) * _dissimilarity()
  tree_out = project_pairwise(z, r, method=method, tol=1e-9)
  flat_out = project_pairwise(rows, r, method=method, tol=1e-9)
  assert jax.tree.structure(tree_out.theta) == jax.tree.structure(params)
  np.testing.assert_allclose(
    np.asarray(flatten_clients(tree_out.theta)), np.asarray(flat_out.theta), rtol=0, atol=1e-10
  )
  np.testing.assert_allclose(
    np.asarray(tree_out.multipliers), np.asarray(flat_out.multipliers), rtol=1e-8, atol=1e-10
  )
  assert int(tree_out.iterations) == int(flat_out.iterations) > 0
  out_d2 = _pairwise_sq(np.asarray(flat_out.theta))
  off = ~np.eye(N, dtype=bool)
  assert np.all(out_d2[off] <= r[off] * (1 + 1e-9))
