"""The memory-aware ``auto`` backend: the chunk planner as a pure function, the per-client memory
estimates, and runs where a forced tiny budget makes ``auto`` chunk with the results of ``vmap``."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro import models
from fedjax_dro.algorithms import fedavg, scaffold
from fedjax_dro.common.model import per_client_eval
from fedjax_dro.core import clients
from fedjax_dro.core.clients import (
  client_memory,
  jaxpr_peak_bytes,
  map_clients,
  map_clients_weighted_sum,
  memory_budget,
  memory_budget_limit,
  plan_chunk_size,
)
from fedjax_dro.core.metrics import evaluate_clients
from fedjax_dro.data import from_client_arrays

MB = 2**20


@pytest.mark.parametrize(
  "n, per_client, budget, shared, want",
  [
    (1000, MB, 2000 * MB, 0, None),  # all fit: vmap
    (1000, MB, 1000 * MB, 0, None),  # exactly
    (1000, MB, 999 * MB, 0, 500),  # 2 balanced chunks of 500, not 999 + 1
    (1000, MB, 300 * MB, 0, 250),  # 4 chunks of 250
    (1000, MB, 300 * MB, 100 * MB, 200),  # shared bytes come off the budget
    (10_000, 24 * MB, 40_000 * MB, 0, 1250),  # 7 chunks fit; 8 divide 10000 (no leftover)
    (10_007, 24 * MB, 40_000 * MB, 0, 1430),  # prime: 7 balanced chunks of 1430 (the last 1427)
    (100, MB, 7 * MB, 0, 5),  # 15 fit; 20 chunks of 5 divide 100
    (97, MB, 7 * MB, 0, 7),  # prime: 14 balanced chunks
    (100, MB, 30 * MB, 0, 25),  # 4 fit and divide
    (7, MB, MB // 2, 0, 1),  # less than one client: one at a time
    (7, MB, 0, 0, 1),
    (5, 0, 0, 0, None),  # no per-client memory
    (1, MB, 0, 0, None),  # one client: nothing to chunk
  ],
)
def test_plan_chunk_size(n, per_client, budget, shared, want):
  got = plan_chunk_size(n, per_client, budget, shared_bytes=shared)
  assert got == want
  if got is not None:
    chunks = -(-n // got)
    assert got * per_client + shared <= max(budget, per_client + shared)  # fits (or is 1)
    fewest = -(-n // max(1, (budget - shared) // per_client))
    divisors = [c for c in range(fewest, -(-3 * fewest // 2) + 1) if n % c == 0]
    # a chunk count that divides n, not over 1.5x the fewest that fit, else the fewest
    assert chunks == (divisors[0] if divisors else fewest)


def test_plan_chunk_size_cap_and_errors():
  assert plan_chunk_size(100, 1, 10**9, max_chunk=30) == 25  # 4 balanced chunks of 25
  assert plan_chunk_size(100, 1, 10**9, max_chunk=100) is None
  with pytest.raises(ValueError, match="num_clients"):
    plan_chunk_size(0, 1, 1)
  with pytest.raises(TypeError, match="num_clients"):
    plan_chunk_size(2.5, 1, 1)
  with pytest.raises(ValueError, match=">= 0"):
    plan_chunk_size(3, -1, 1)


def test_budget_overrides_and_sweep_share():
  assert memory_budget() is None or memory_budget() > 0
  with memory_budget_limit(1000):
    assert memory_budget() == 1000
    with fd.tuned(memory_share=4):
      assert memory_budget() == 250
    assert memory_budget() == 1000
  with pytest.raises(ValueError, match="num_bytes"):
    with memory_budget_limit(-1):
      pass


def test_jaxpr_peak_is_liveness_not_the_sum():
  def f(x):  # four [1000] temporaries, at most two alive at once beyond the input
    a = x * 2
    b = a + 1
    c = b * b
    return jnp.sum(c)

  x = jnp.ones((1000,), jnp.float32)
  peak = jaxpr_peak_bytes(jax.make_jaxpr(f)(x))
  assert 3 * 4000 <= peak < 4 * 4000 + 100


def _mlp_update(n=3):
  model = models.mlp((784,), 62, (200, 200))
  params = jax.tree.map(lambda a: a.astype(jnp.float32), model.init(jax.random.PRNGKey(0)))
  x = jnp.zeros((n, 64, 784), jnp.float32)
  y = jnp.zeros((n, 64), jnp.int32)

  def update(xi, yi):
    def step(w, _):
      g = jax.grad(lambda w: jnp.mean(model.loss(model.apply(w, xi[:32]), yi[:32])))(w)
      return jax.tree.map(lambda a, b: a - 0.1 * b, w, g), None

    return jax.lax.scan(step, params, None, length=4)[0]

  return update, (x, y), params


def test_compiled_memory_and_the_jaxpr_estimate():
  """XLA's measured per-client memory of a local update is within JAXPR_MARGIN of the jaxpr
  estimate, and both count the client's own copy of the model."""
  update, args, params = _mlp_update()
  estimate, shared_e, how_e = client_memory(update, args, measure=False)
  measured, shared_m, how_m = client_memory(update, args, measure=True)
  assert how_e == "jaxpr" and how_m == "compiled"
  n_params = sum(a.size for a in jax.tree.leaves(params))
  assert shared_e == shared_m == 4 * n_params  # the closed-over global model, counted once
  assert 4 * n_params <= measured <= clients.JAXPR_MARGIN * estimate
  assert 4 * n_params <= estimate


def test_cpu_caps_chunks_near_the_cache_accelerators_do_not():
  update, args, _ = _mlp_update(n=40)
  with memory_budget_limit(10**12):  # memory is no constraint
    assert clients.plan_clients(update, args, platform="gpu") == ("vmap", None)
    backend, chunk = clients.plan_clients(update, args, platform="cpu")
  per_client = clients.recent_plans[-1].bytes_per_client
  assert backend == "chunked" and chunk * per_client <= clients.AUTO_CPU_CHUNK_BYTES
  assert (chunk + 1) * per_client > clients.AUTO_CPU_CHUNK_BYTES * 0.5
  # a sweep's rows share the cache target as they share the memory: 4 rows side by side
  with memory_budget_limit(10**12), fd.tuned(memory_share=4):
    backend4, chunk4 = clients.plan_clients(update, args, platform="cpu")
  assert backend4 in ("chunked", "map") and (chunk4 or 1) < chunk
  assert (chunk4 or 1) * per_client <= clients.AUTO_CPU_CHUNK_BYTES / 4


def _classification(n, m=24, d=20, k=5, seed=0):
  rng = np.random.default_rng(seed)
  xs = [rng.normal(size=(int(rng.integers(m // 2, m)), d)).astype(np.float32) for _ in range(n)]
  ys = [rng.integers(0, k, len(x)).astype(np.int32) for x in xs]
  return from_client_arrays(xs, ys)


@pytest.mark.parametrize("factory, budget", [(fedavg, 100_000), (scaffold, 200_000)])
def test_tiny_budget_makes_auto_chunk_with_vmap_results(factory, budget):
  """A budget of a few clients (x64 here: ~12 kB per FedAvg client; SCAFFOLD also keeps every
  client's delta) and a budget below one client: ``auto`` chunks and matches ``vmap``."""
  data = _classification(23)
  model = models.mlp((20,), 5, (16,))
  kw = dict(local_steps=3, batch_size=8)
  finals = {}
  for backend, limit in (("vmap", None), ("auto", budget), ("auto", 1)):
    clients.recent_plans.clear()
    with memory_budget_limit(limit):
      h = fd.run(factory(model, backend=backend, **kw), data, rounds=3, seed=4)
    finals[(backend, limit)] = h.final_state
    if backend == "auto":
      plans = [p for p in clients.recent_plans if p.num_clients == 23]
      assert plans and all(p.measured_by == "compiled" for p in plans)
      if limit == 1:  # not even one client fits: one at a time
        assert {(p.backend, p.chunk_size) for p in plans} == {("map", None)}
      else:
        assert all(p.backend == "chunked" and 1 < p.chunk_size < 23 for p in plans), plans
  ref = jax.tree.leaves(finals[("vmap", None)])
  for key in (("auto", budget), ("auto", 1)):
    for a, b in zip(ref, jax.tree.leaves(finals[key])):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-9)


def test_auto_with_room_is_vmap_without_compiling_a_probe():
  data = _classification(6)
  clients.recent_plans.clear()
  fd.compile_rounds(fedavg(models.softmax_regression(20, 5)), data, rounds=1)
  plans = [p for p in clients.recent_plans if p.num_clients == 6]
  assert plans and all(p.backend == "vmap" and p.measured_by == "jaxpr" for p in plans)


@pytest.mark.parametrize("chunk", [1, 3, 4, 7])
def test_weighted_sum_remainder_without_padding(chunk):
  """Chunks sliced in place, the remainder as one smaller vmap: the vmap result."""
  w = jnp.arange(1.0, 8.0)
  xs = jnp.arange(7.0 * 3).reshape(7, 3)

  def fn(x):
    return {"a": x * 2.0, "b": jnp.sum(x)}, jnp.sum(x**2)

  ref, ref_aux = map_clients_weighted_sum(fn, w, xs, backend="vmap")
  got, aux = map_clients_weighted_sum(fn, w, xs, backend="chunked", chunk_size=chunk)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12), (ref, ref_aux), (got, aux)
  )
  out = map_clients(lambda x: x + 1, xs, backend="auto")
  np.testing.assert_array_equal(out, xs + 1)


@pytest.mark.parametrize("personalized", [False, True])
def test_evaluation_chunks_under_a_tiny_budget_with_vmap_results(personalized):
  """Evaluation runs through the ``auto`` backend: chunks of clients when all do not fit (the
  result of one ``vmap`` over all clients, computed here as the reference)."""
  data = _classification(23)
  model = models.mlp((20,), 5, (16,))
  params = model.init(jax.random.PRNGKey(0))
  if personalized:
    params = jax.tree.map(
      lambda a: a + 0.1 * jnp.arange(23.0).reshape((23,) + (1,) * a.ndim), params
    )
  ref = jax.vmap(
    lambda p, x, y, m: per_client_eval(model, p, x, y, m),
    in_axes=(0 if personalized else None, 0, 0, 0),
  )(params, data.x, data.y, data.mask)
  clients.recent_plans.clear()
  with memory_budget_limit(60_000):
    got = jax.jit(lambda p, d: evaluate_clients(model, p, d, personalized))(params, data)
  plan = clients.recent_plans[-1]
  assert plan.backend == "chunked" and 1 < plan.chunk_size < 23, plan
  chex.assert_trees_all_close(got, ref, rtol=1e-12, atol=1e-12)


def test_global_evaluation_folds_clients_into_one_matmul():
  """A global model is shared by a chunk's clients: the first layer is one dot over all the
  chunk's rows (no per-client batch dimension), not one batched dot per client."""
  data = _classification(8)
  model = models.mlp((20,), 5, (16,))
  params = model.init(jax.random.PRNGKey(0))
  jaxpr = jax.make_jaxpr(lambda d: evaluate_clients(model, params, d, False, backend="vmap"))(data)
  dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
  assert dots and all(not e.params["dimension_numbers"][1][0] for e in dots)  # no batch dims
  jaxpr = jax.make_jaxpr(lambda p, d: evaluate_clients(model, p, d, True, backend="vmap"))(
    jax.tree.map(lambda a: jnp.stack([a] * 8), params), data
  )
  dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
  assert dots and all(e.params["dimension_numbers"][1][0] for e in dots)  # per-client weights
