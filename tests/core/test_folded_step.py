"""The folded form of local SGD's masked step (``core.ragged.local_folded_step``): one exit test
shared by the clients side by side, the step size (0 past a client's own steps) folded into the
loss. Against the float64 reference loop of ``test_local_epochs``, against the select form, and
the program's shape (an unbatched loop)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, run
from fedjax_dro.core.clients import CLIENT_AXIS, client_axis_bound, map_clients
from fedjax_dro.core.local import local_sgd
from fedjax_dro.core.ragged import (
  folded_step,
  local_epoch_chunk,
  local_folded_step,
  local_step_block,
)
from tests.core.test_local_epochs import L2, SIZES, _reference
from tests.helpers import dataset, linreg, regression_clients


@pytest.mark.parametrize(
  "backend,chunk", [("vmap", None), ("auto", 2), ("auto", 3), ("chunked", None)]
)
def test_folded_step_matches_the_reference_loop(backend, chunk):
  """FedAvg with one local epoch pass of each participant's rows, its participants side by side
  (all at once, step-sorted chunks of 2 and of 3 with a remainder, the chunked backend), the
  folded step forced: the reference loop's model to 1e-10."""
  data = regression_clients(n=len(SIZES), d=3, sizes=SIZES, seed=5)
  hp = {"client_lr": 0.05, "server_lr": 0.9}
  with local_folded_step(True), local_epoch_chunk(chunk):
    alg = A.fedavg(
      linreg(3, l2=L2),
      clients_per_round=4,
      local_epochs=2,
      batch_size=4,
      backend=backend,
      chunk_size=2 if backend == "chunked" else None,
    )
    hist = run(alg, dataset(data), rounds=4, seed=2, hparams=hp, eval_every=4)
  w_ref, b_ref = _reference("fedavg", data, 4, 2, 4, 2, 4, hp)
  np.testing.assert_allclose(np.asarray(hist.final_state.params["w"]), w_ref, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(hist.final_state.params["b"]), b_ref, rtol=0, atol=1e-10)


def _clients_side_by_side(folded, nex=(5, 0, 9, 2)):
  """``(jaxpr, (w, losses))``: local SGD (2 epochs of batch 4) of clients with ``nex`` rows side
  by side in ``map_clients``' vmap, the folded form on or off."""
  model = linreg(3, l2=L2)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((len(nex), 12, 3)))
  y = jnp.asarray(rng.standard_normal((len(nex), 12)))
  params = model.init(jax.random.PRNGKey(0))
  keys = jax.random.split(jax.random.PRNGKey(1), len(nex))

  def client(x, y, n, k):
    return local_sgd(model, params, x, y, n, k, batch_size=4, lr=0.1, num_epochs=2)

  def clients(x, y, n, k):
    return map_clients(client, x, y, n, k, backend="vmap")

  args = (x, y, jnp.asarray(nex, jnp.int32), keys)
  with local_folded_step(folded):
    return jax.make_jaxpr(clients)(*args), jax.jit(clients)(*args), params


def _loop_counters(jaxpr):
  """The shapes of the loops' counters (the first carry after the loops' constants)."""
  return [
    eqn.invars[eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]].aval.shape
    for eqn in _whiles(jaxpr.jaxpr)
  ]


def _whiles(jaxpr):
  return [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "while"]


def test_folded_step_is_one_unbatched_loop_and_keeps_done_clients():
  folded_jaxpr, (w, losses), params = _clients_side_by_side(True)
  select_jaxpr, (w_sel, losses_sel), _ = _clients_side_by_side(False)
  # the shared exit test: the loop's counter is one scalar, not one per client
  assert _loop_counters(folded_jaxpr) == [()]
  assert _loop_counters(select_jaxpr) == [(4,)]
  for a, b in zip(jax.tree.leaves(w), jax.tree.leaves(w_sel)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-12)
  np.testing.assert_allclose(np.asarray(losses), np.asarray(losses_sel), rtol=0, atol=1e-12)
  # the client without rows keeps its weights exactly; steps past a client's count record 0
  for a, p in zip(jax.tree.leaves(w), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(p))
  assert np.all(np.asarray(losses[1]) == 0) and np.all(np.asarray(losses[3, 2:]) == 0)
  assert np.all(np.asarray(losses[3, :2]) != 0)  # 2 rows, batch 4: one step an epoch


def test_the_select_form_where_the_folded_one_does_not_apply():
  """A block of several steps, one client at a time (``map``), or a gradient correction
  (FedProx) keep the select form; the client axis is named only inside map_clients' vmap."""
  with local_folded_step(True), local_step_block(2):
    jaxpr, _, _ = _clients_side_by_side(True)
  assert _loop_counters(jaxpr) == [(4,)]
  assert not client_axis_bound()
  seen = []
  jax.vmap(lambda a: seen.append(client_axis_bound()) or a, axis_name=CLIENT_AXIS)(jnp.ones(2))
  map_clients(lambda a: seen.append(client_axis_bound()) or a, jnp.ones(2), backend="map")
  assert seen == [True, False]


def test_folded_step_by_platform_and_bad_value():
  from fedjax_dro.common.tuning import platform_defaults

  assert platform_defaults("cuda").folded_step and platform_defaults("gpu").folded_step
  assert not platform_defaults("cpu").folded_step
  assert not platform_defaults("tpu").folded_step  # not measured there: the select form
  assert folded_step() == platform_defaults().folded_step
  with local_folded_step(True):
    assert folded_step()
    with local_folded_step(False):
      assert not folded_step()
  for bad in (1, None, "yes"):
    with pytest.raises(ValueError, match="local_folded_step needs True or False"):
      with local_folded_step(bad):
        pass
