"""Round reductions computed without a stacked per-client copy, against the per-client path they
replace: FedSGD's folded gradient (one backward pass over all participants' minibatches) against
one local SGD step of size 1 per client, deltas averaged; the ``averaged`` carries of
``stateful_local_round`` (LocalAdam, FGDRO) against the mean of the stacked carries."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import models
from fedjax_dro.core.clients import map_clients_weighted_sum
from fedjax_dro.core.local import federated_gradient, local_round, stateful_local_round
from fedjax_dro.core.settings import common_settings
from fedjax_dro.data import from_client_arrays


def _data(n, shape, k, seed=0):
  rng = np.random.default_rng(seed)
  xs = [rng.normal(size=(int(rng.integers(5, 12)),) + shape) for _ in range(n)]
  ys = [rng.integers(0, k, len(x)).astype(np.int32) for x in xs]
  return from_client_arrays(xs, ys)


def _mlp_round(clients_per_round, backend, chunk_size, weighting, seed):
  """An MLP, 9 clients' data and round settings of 3 local steps of batch 4."""
  settings = common_settings(
    clients_per_round=clients_per_round,
    local_steps=3,
    batch_size=4,
    backend=backend,
    chunk_size=chunk_size,
    weighting=weighting,
  )
  return models.mlp((6,), 3, (8,)), _data(9, (6,), 3, seed=seed), settings


@pytest.mark.parametrize(
  "kind, clients_per_round, batch_size, backend, chunk_size",
  [
    ("mlp", None, 4, "vmap", None),
    ("mlp", 5, 4, "chunked", 2),  # partial participation, chunks with a remainder
    ("mlp", None, None, "map", None),  # full batches, one client at a time
    ("cnn", 6, 3, "chunked", 4),
    ("cnn", None, 3, "auto", None),
  ],
)
def test_folded_gradient_equals_one_local_step_per_client(
  kind, clients_per_round, batch_size, backend, chunk_size
):
  if kind == "mlp":
    model, data = models.mlp((6,), 3, (8,)), _data(9, (6,), 3)
  else:
    model = models.cnn((8, 8), 3, features=(2, 3), dense=None, conv="patches")
    data = _data(9, (8, 8), 3, seed=1)
  settings = common_settings(
    clients_per_round=clients_per_round,
    local_steps=1,
    batch_size=batch_size,
    backend=backend,
    chunk_size=chunk_size,
    weighting="num_examples",
  )
  params = model.init(jax.random.PRNGKey(3))
  key = jax.random.PRNGKey(7)
  ref = jax.jit(lambda p: local_round(model, settings, p, data, key, 1.0, mean_only=True))(params)
  got = jax.jit(lambda p: federated_gradient(model, settings, p, data, key))(params)
  np.testing.assert_array_equal(got.idx, ref.idx)
  np.testing.assert_array_equal(got.weights, ref.weights)
  chex.assert_trees_all_close(got.losses, ref.losses, rtol=1e-13, atol=0)
  # ref's deltas are (w - g) - w: rounding of |w| ~ 1 in float64
  chex.assert_trees_all_close(got.deltas, ref.deltas, rtol=0, atol=1e-13)
  assert max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(got.deltas)) > 1e-3


def test_folded_and_per_client_sums_agree_for_every_backend():
  w = jnp.array([0.5, 0.25, 0.125, 0.125, 1.0])
  xs = jnp.arange(15.0).reshape(5, 3)

  def fn(x):
    return {"s": x * 2.0}, jnp.sum(x)

  def folded(wc, x):
    return {"s": 2.0 * jnp.tensordot(wc, x, axes=1)}, jnp.sum(x, axis=1)

  ref = map_clients_weighted_sum(fn, w, xs, backend="vmap")
  for backend, chunk in (("vmap", None), ("map", None), ("chunked", 2), ("chunked", 5)):
    got = map_clients_weighted_sum(fn, w, xs, backend=backend, chunk_size=chunk, folded=folded)
    chex.assert_trees_all_close(got, ref, rtol=1e-14)


@pytest.mark.parametrize(
  "clients_per_round, backend, chunk_size",
  [(None, "vmap", None), (7, "chunked", 3), (None, "map", None), (None, "auto", None)],
)
def test_averaged_carries_equal_the_mean_of_stacked_carries(clients_per_round, backend, chunk_size):
  model, data, settings = _mlp_round(clients_per_round, backend, chunk_size, "uniform", seed=0)
  params = model.init(jax.random.PRNGKey(3))
  estimates = jnp.arange(9.0) / 9.0

  def start(u):
    return {"params": params, "m": jax.tree.map(jnp.zeros_like, params), "u": u}

  def step(carry, loss, grad):  # a momentum step and a per-client loss estimate
    m = jax.tree.map(lambda a, g: 0.9 * a + g, carry["m"], grad)
    w = jax.tree.map(lambda p, d: p - 0.1 * d, carry["params"], m)
    return {"params": w, "m": m, "u": 0.5 * carry["u"] + 0.5 * loss}

  def run(averaged):
    return stateful_local_round(
      model,
      settings,
      data,
      jax.random.PRNGKey(5),
      start=start,
      step=step,
      client_state=estimates,
      averaged=averaged,
    )

  ref = jax.jit(lambda: run(()))()
  got = jax.jit(lambda: run(("params", "m")))()
  np.testing.assert_array_equal(got.idx, ref.idx)
  for name in ("params", "m"):
    mean = jax.tree.map(lambda a: jnp.mean(a, axis=0), ref.carries[name])
    chex.assert_trees_all_close(got.carries[name], mean, rtol=1e-13, atol=1e-15)
  chex.assert_trees_all_close(got.carries["u"], ref.carries["u"], rtol=1e-14)  # stays stacked
  assert got.carries["u"].shape == ref.idx.shape
  chex.assert_trees_all_close(got.losses, ref.losses, rtol=1e-14)


@pytest.mark.parametrize(
  "clients_per_round, backend, chunk_size",
  [(None, "vmap", None), (5, "chunked", 2), (None, "chunked", 3), (6, "map", None)],
)
def test_state_update_equals_the_scatter_of_stacked_deltas(clients_per_round, backend, chunk_size):
  """local_round(state_update=f): every participant's new state row f(row, delta) written back
  (others unchanged), equal to the stacked deltas' path it replaces; mean_only's mean delta too."""
  model, data, settings = _mlp_round(clients_per_round, backend, chunk_size, "num_examples", seed=2)
  params = model.init(jax.random.PRNGKey(4))
  rng = np.random.default_rng(5)
  state = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=(9,) + a.shape)), params)
  key = jax.random.PRNGKey(8)
  # the row enters the local steps too (a SCAFFOLD-like correction), so a wrong row shows
  correct = lambda w, g, row: jax.tree.map(lambda gi, ri: gi - 0.1 * ri, g, row)
  update = lambda row, d: jax.tree.map(lambda r, di: 0.5 * r - di, row, d)

  def both(p):
    ref = local_round(
      model, settings, p, data, key, 0.2, client_state=state, grad_transform=correct
    )
    got = local_round(
      model,
      settings,
      p,
      data,
      key,
      0.2,
      client_state=state,
      grad_transform=correct,
      state_update=update,
      mean_only=True,
    )
    return ref, got

  ref, got = jax.jit(both)(params)
  rows = update(jax.tree.map(lambda a: a[ref.idx], state), ref.deltas)
  want = jax.tree.map(lambda a, r: a.at[ref.idx].set(r), state, rows)
  chex.assert_trees_all_close(got.client_state, want, rtol=0, atol=1e-13)
  untouched = np.setdiff1d(np.arange(9), np.asarray(ref.idx))
  assert len(untouched) == 9 - (clients_per_round or 9)
  for a, b in zip(jax.tree.leaves(got.client_state), jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(a)[untouched], np.asarray(b)[untouched])
  w = ref.weights / jnp.sum(ref.weights)
  mean = jax.tree.map(lambda d: jnp.tensordot(w, d, axes=1), ref.deltas)
  chex.assert_trees_all_close(got.deltas, mean, rtol=0, atol=1e-13)
  chex.assert_trees_all_close(got.losses, ref.losses, rtol=1e-13, atol=0)
  with pytest.raises(ValueError, match="state_update needs the client_state"):
    local_round(model, settings, params, data, key, 0.2, state_update=update)


@pytest.mark.parametrize("backend, chunk, n", [("map", None, 4), ("chunked", 3, 4)])
def test_one_client_at_a_time_is_called_unbatched(backend, chunk, n):
  """The map backend (and a chunked round's leftover single client) calls the client's function
  on the client itself, as map_clients' map backend does, not a vmap over a chunk of one (whose
  batch axis of size 1 XLA:CPU lays out worse); the sum and the stacked outputs are unchanged."""
  from fedjax_dro.core.clients import client_axis_bound

  bound = []

  def fn(x):
    bound.append(client_axis_bound())
    return {"s": jnp.sin(x)}, jnp.sum(x)

  xs = jnp.arange(n * 3, dtype=jnp.float64).reshape(n, 3) / 7
  w = jnp.linspace(0.5, 2.0, n)
  ref = map_clients_weighted_sum(fn, w, xs, backend="vmap")
  bound.clear()
  got = map_clients_weighted_sum(fn, w, xs, backend=backend, chunk_size=chunk)
  chex.assert_trees_all_close(got, ref, rtol=1e-14)
  if backend == "map":
    assert not any(bound)
  else:  # the shape template and the leftover client unbatched, the chunk of 3 vmapped
    assert bound.count(False) == 2 and True in bound
