"""``local_epochs``: E passes over each client's own rows without replacement, against plain
per-client NumPy loops (float64) that take only the permutations from the simulator's key
schedule; clients of different sizes (fewer rows, fewer steps) and partial participation."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, cli, run
from fedjax_dro.core.sampling import epoch_permutations, epoch_step_rows, sample_clients, step_rows
from fedjax_dro.core.schedule import local_schedule, local_step_counts
from fedjax_dro.core.settings import common_settings
from tests.helpers import dataset, linreg, numpy_linreg_grad, regression_clients, run_float32

L2 = 0.01
SIZES = [3, 7, 12, 5, 9, 16, 4]  # B = 4: 1, 2, 3, 2, 3, 4, 1 steps an epoch (4 static)


def _reference(name, data, rounds, seed, s, E, B, hp, weighting="uniform"):
  """The round as a plain loop (SCAFFOLD under ``weighting``: see
  ``tests/algorithms/test_reference.py``); only the participants and each epoch's order of a client's rows
  come from the simulator's key schedule, the batches are cut here: consecutive slices of
  ``B`` rows of that order, the last one holding the remaining rows."""
  n, m, d = data.num_clients, data.x.shape[1], data.x.shape[-1]
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  _, _, run_key = jax.random.split(jax.random.PRNGKey(seed), 3)
  w, b = np.zeros(d), 0.0
  c_w, c_b = np.zeros(d), 0.0
  ci_w, ci_b = np.zeros((n, d)), np.zeros(n)
  for r in range(rounds):
    sample_key, local_key = jax.random.split(jax.random.fold_in(run_key, r))
    idx = np.asarray(sample_clients(sample_key, n, s))
    client_keys = jax.random.split(local_key, s)
    dws, dbs, weights, new_c = [], [], [], []
    for k, i in enumerate(idx):
      perms = np.asarray(epoch_permutations(client_keys[k], nex[i], m, E))
      uw, ub, steps = w.copy(), b, 0
      for e in range(E):
        order = perms[e, : nex[i]]
        assert sorted(order) == list(range(nex[i]))  # a pass over the client's own rows
        for start in range(0, nex[i], B):
          rows = order[start : start + B]
          gw, gb = numpy_linreg_grad(uw, ub, x[i, rows], y[i, rows], L2)
          if name == "fedprox":
            gw, gb = gw + hp["mu"] * (uw - w), gb + hp["mu"] * (ub - b)
          if name == "scaffold":
            gw, gb = gw - ci_w[i] + c_w, gb - ci_b[i] + c_b
          uw, ub = uw - hp["client_lr"] * gw, ub - hp["client_lr"] * gb
          steps += 1
      assert steps == E * -(-nex[i] // B)
      dws.append(uw - w)
      dbs.append(ub - b)
      weights.append(1.0 if name == "scaffold" and weighting == "uniform" else float(nex[i]))
      if name == "scaffold":
        scale = steps * hp["client_lr"]
        new_c.append((ci_w[i] - c_w - (uw - w) / scale, ci_b[i] - c_b - (ub - b) / scale))
    wts = np.array(weights) / np.sum(weights)
    w = w + hp["server_lr"] * np.tensordot(wts, np.array(dws), 1)
    b = b + hp["server_lr"] * float(np.dot(wts, dbs))
    if name == "scaffold" and weighting == "num_examples":
      p = nex / np.sum(nex)
      for nc, i in zip(new_c, idx):
        c_w, c_b = c_w + p[i] * (nc[0] - ci_w[i]), c_b + p[i] * (nc[1] - ci_b[i])
        ci_w[i], ci_b[i] = nc
    elif name == "scaffold":
      dcw = np.mean([nc[0] - ci_w[i] for nc, i in zip(new_c, idx)], axis=0)
      dcb = np.mean([nc[1] - ci_b[i] for nc, i in zip(new_c, idx)])
      for nc, i in zip(new_c, idx):
        ci_w[i], ci_b[i] = nc
      c_w, c_b = c_w + s / n * dcw, c_b + s / n * dcb
  return w, b


@pytest.mark.parametrize(
  "name,epochs,s", [("fedavg", 2, 4), ("fedavg", 1, 7), ("fedprox", 2, 3), ("scaffold", 2, 4)]
)
def test_local_epochs_match_a_reference_loop_of_shuffled_passes(name, epochs, s):
  data = regression_clients(n=len(SIZES), d=3, sizes=SIZES, seed=5)
  model = linreg(3, l2=L2)
  alg = A.get_algorithm(name).factory(
    model, clients_per_round=s, local_epochs=epochs, batch_size=4, backend="vmap"
  )
  hp = {"client_lr": 0.05, "server_lr": 0.9}
  if name == "fedprox":
    hp["mu"] = 0.3
  hist = run(alg, dataset(data), rounds=4, seed=2, hparams=hp, eval_every=4)
  w_ref, b_ref = _reference(name, data, 4, 2, s, epochs, 4, hp)
  params = hist.final_state.params
  np.testing.assert_allclose(np.asarray(params["w"]), w_ref, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(params["b"]), b_ref, rtol=0, atol=1e-10)


def test_sample_weighted_scaffold_with_local_epochs_matches_the_reference_loop():
  data = regression_clients(n=len(SIZES), d=3, sizes=SIZES, seed=5)
  alg = A.scaffold(
    linreg(3, l2=L2),
    clients_per_round=4,
    local_epochs=2,
    batch_size=4,
    backend="vmap",
    weighting="num_examples",
  )
  hp = {"client_lr": 0.05, "server_lr": 0.9}
  params = run(alg, dataset(data), rounds=4, seed=2, hparams=hp, eval_every=4).final_state.params
  w_ref, b_ref = _reference("scaffold", data, 4, 2, 4, 2, 4, hp, "num_examples")
  np.testing.assert_allclose(np.asarray(params["w"]), w_ref, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(params["b"]), b_ref, rtol=0, atol=1e-10)
  w_uni, _ = _reference("scaffold", data, 4, 2, 4, 2, 4, hp)
  assert np.max(np.abs(w_uni - w_ref)) > 1e-4  # the weighting changes the iterates


def test_epoch_schedule_passes_over_each_clients_rows_once_per_epoch():
  key = jax.random.PRNGKey(0)
  for nex, batch in [(3, 4), (12, 4), (13, 4), (16, 5), (1, 1), (0, 4)]:
    sched = local_schedule(key, jnp.int32(nex), 16, batch_size=batch, num_epochs=3)
    per_epoch = -(-nex // batch)
    assert sched.num_steps == 3 * -(-16 // batch)  # the losses' length: the largest client's
    assert int(sched.steps) == 3 * per_epoch  # the loop stops at the client's own count
    epochs = []
    for e in range(3):
      taken = []
      for j in range(e * per_epoch, (e + 1) * per_epoch):
        rows, mask = (np.asarray(a) for a in epoch_step_rows(sched.perm, j, nex, batch))
        assert mask.any()  # every step the client takes has a valid row
        assert mask[: int(mask.sum())].all()  # valid rows first (only the last batch is partial)
        taken += list(rows[mask])
      assert sorted(taken) == list(range(nex))  # every own row once, no padding row
      epochs.append(taken)
    assert nex <= 1 or epochs[0] != epochs[1]  # a fresh order every epoch
  counts = local_step_counts(
    common_settings(local_epochs=2, batch_size=4), jnp.asarray([3, 4, 5, 16])
  )
  np.testing.assert_array_equal(np.asarray(counts), [2, 2, 4, 8])


def _counting_epoch_loop(block):
  """``(calls, w, losses)``: three clients of 5, 9 and 2 rows (batch 4, two epochs) side by side
  under ``vmap``, each step summing its minibatch's rows; ``calls`` counts the executions of the
  step's body (a host callback), the loop's exit tested every ``block`` steps."""
  from fedjax_dro.core.ragged import local_step_block
  from fedjax_dro.core.schedule import scan_schedule

  calls = []

  def step(w, bx, by, bmask):
    jax.debug.callback(lambda: calls.append(1))
    return w + jnp.sum(jnp.where(bmask, bx, 0.0)), jnp.sum(bmask).astype(jnp.float32)

  x = jnp.arange(40, dtype=jnp.float32)
  y = jnp.zeros(40)

  def client(nex, key):
    sched = local_schedule(key, nex, 40, batch_size=4, num_epochs=2)
    return scan_schedule(step, jnp.float32(0.0), sched, x, y, nex)

  keys = jax.random.split(jax.random.PRNGKey(1), 3)
  with local_step_block(block):
    w, losses = jax.jit(jax.vmap(client))(jnp.asarray([5, 9, 2]), keys)
  jax.block_until_ready(w)
  return calls, w, losses


def test_epoch_loop_runs_to_the_largest_participating_client():
  """The local loop stops at the participants' own step counts: with the federation's largest
  client absent from a round, the round runs fewer loop iterations (the body's executions are
  counted with a host callback) and its result is that of the full-length masked loop."""
  calls, w, losses = _counting_epoch_loop(1)
  assert len(calls) == 2 * 3  # the largest of the three takes 2 x ceil(9 / 4) steps, not 2 x 10
  # each client summed its own rows once per epoch, and reports the rows of each step it took
  np.testing.assert_allclose(np.asarray(w), [2 * sum(range(5)), 2 * sum(range(9)), 2.0])
  np.testing.assert_array_equal(
    np.asarray(losses[:, :7]), [[4, 1, 4, 1, 0, 0, 0], [4, 4, 1, 4, 4, 1, 0], [2, 2, 0, 0, 0, 0, 0]]
  )
  assert losses.shape == (3, 20)


@pytest.mark.parametrize("block", [2, 3, 4, 7])
def test_epoch_loop_in_blocks_of_steps_is_the_same_loop(block):
  """With the exit condition tested every ``block`` steps, the loop computes what the one-step
  loop computes (steps past a client's own count are masked: its carry kept, its loss 0), and
  runs ceil(largest participant's steps / block) blocks of ``block`` steps."""
  _, w1, losses1 = _counting_epoch_loop(1)
  calls, w, losses = _counting_epoch_loop(block)
  assert len(calls) == -(-6 // block) * block  # the largest takes 6 steps
  np.testing.assert_array_equal(np.asarray(w), np.asarray(w1))
  np.testing.assert_array_equal(np.asarray(losses), np.asarray(losses1))


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_local_epochs_in_blocks_match_the_reference_loop(name):
  from fedjax_dro.core.ragged import local_step_block

  data = regression_clients(n=len(SIZES), d=3, sizes=SIZES, seed=5)
  hp = {"client_lr": 0.05, "server_lr": 0.9}
  with local_step_block(3):
    alg = A.get_algorithm(name).factory(
      linreg(3, l2=L2), clients_per_round=4, local_epochs=2, batch_size=4, backend="vmap"
    )
    hist = run(alg, dataset(data), rounds=4, seed=2, hparams=hp, eval_every=4)
  w_ref, b_ref = _reference(name, data, 4, 2, 4, 2, 4, hp)
  np.testing.assert_allclose(np.asarray(hist.final_state.params["w"]), w_ref, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(hist.final_state.params["b"]), b_ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_step_sorted_chunks_match_the_reference_loop(name, chunk):
  """Participants sorted by step count and run in chunks (2: strided chunks of the 4
  participants, 3: a contiguous chunk and a remainder, 1: one at a time) give the reference
  loop's model: each participant keeps its key, minibatches and aggregation weight."""
  from fedjax_dro.core.ragged import local_epoch_chunk

  data = regression_clients(n=len(SIZES), d=3, sizes=SIZES, seed=5)
  hp = {"client_lr": 0.05, "server_lr": 0.9}
  with local_epoch_chunk(chunk):
    alg = A.get_algorithm(name).factory(
      linreg(3, l2=L2), clients_per_round=4, local_epochs=2, batch_size=4
    )
    hist = run(alg, dataset(data), rounds=4, seed=2, hparams=hp, eval_every=4)
  w_ref, b_ref = _reference(name, data, 4, 2, 4, 2, 4, hp)
  np.testing.assert_allclose(np.asarray(hist.final_state.params["w"]), w_ref, rtol=0, atol=1e-10)
  np.testing.assert_allclose(float(hist.final_state.params["b"]), b_ref, rtol=0, atol=1e-10)


def _sampled_round(settings, mean_only):
  """One jitted ``local_round`` of 6 sampled participants of clients of ``SIZES`` rows with a
  per-client state (the participants' deltas added to it)."""
  from fedjax_dro.core.local import local_round

  data = regression_clients(n=len(SIZES), d=3, sizes=SIZES, seed=5)
  model = linreg(3, l2=L2)
  params = model.init(jax.random.PRNGKey(0))
  state = jax.tree.map(lambda a: jnp.zeros((data.num_clients,) + a.shape, a.dtype), params)
  return jax.jit(
    lambda p, st, k: local_round(
      model,
      settings,
      p,
      data,
      k,
      0.05,
      client_state=st,
      state_update=lambda row, d: jax.tree.map(jnp.add, row, d),
      mean_only=mean_only,
    )
  )(params, state, jax.random.PRNGKey(3))


@pytest.mark.parametrize("mean_only", [False, True])
def test_step_sorted_round_returns_rows_in_the_order_of_idx(mean_only):
  """``local_round`` under step-sorted chunks returns every per-participant output (deltas,
  losses, the updated client state) in the order of ``idx``, as the unsorted round does, and
  the chunks really are sorted: the participants' step counts differ."""
  from fedjax_dro.core.participants import step_sorted_order
  from fedjax_dro.core.ragged import local_epoch_chunk
  from fedjax_dro.core.settings import common_settings

  settings = common_settings(clients_per_round=6, local_epochs=1, batch_size=4)

  def one(chunk):
    with local_epoch_chunk(chunk):
      return _sampled_round(settings, mean_only)

  plain, chunked = one(None), one(2)
  assert len(set(np.asarray(local_step_counts(settings, plain.num_examples)).tolist())) > 1
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(chunked)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-12)
  # the layout: strided chunks of consecutive ranks
  order = np.asarray(step_sorted_order(jnp.asarray([5, 1, 4, 2, 6, 3]), 2))
  assert [sorted(np.asarray([5, 1, 4, 2, 6, 3])[order[j::3]]) for j in range(3)] == [
    [1, 2],
    [3, 4],
    [5, 6],
  ]
  order = np.asarray(step_sorted_order(jnp.asarray([5, 1, 4, 2, 6]), 2))  # contiguous + rest
  assert np.asarray([5, 1, 4, 2, 6])[order].tolist() == [1, 2, 4, 5, 6]


def test_epoch_chunk_by_platform_and_bad_chunk():
  from fedjax_dro.common.tuning import platform_defaults, resolve, scope
  from fedjax_dro.core.ragged import epoch_chunk, local_epoch_chunk

  assert platform_defaults("cpu").epoch_groups == 1  # the backend's plan: one group
  with scope(resolve(platform="cpu")):
    assert epoch_chunk(participants=10) == 10
  groups = platform_defaults("gpu").epoch_groups
  assert platform_defaults("cuda") == platform_defaults("gpu") and groups == 2
  with scope(resolve(platform="cuda")):
    assert epoch_chunk(participants=10) == -(-10 // groups)
    assert epoch_chunk(participants=9) == -(-9 // groups)
    assert epoch_chunk() is None  # no cohort size known
  with local_epoch_chunk(3):
    assert epoch_chunk() == 3
    with local_epoch_chunk(None):
      assert epoch_chunk(participants=9) == 9  # one group: the backend's plan
  for bad in (0, -2, 1.5, True):
    with pytest.raises(ValueError, match="local_epoch_chunk needs a positive integer or None"):
      with local_epoch_chunk(bad):
        pass


def test_step_block_by_platform_and_bad_block():
  from fedjax_dro.common.tuning import platform_defaults
  from fedjax_dro.core.ragged import local_step_block, step_block

  assert platform_defaults("cpu").step_block == 1
  assert platform_defaults("cuda").step_block == platform_defaults("gpu").step_block == 1
  assert platform_defaults("tpu").step_block == 1
  assert step_block() == 1
  with local_step_block(5):
    assert step_block() == 5
  assert step_block() == 1
  for bad in (0, -1, 2.0, True, None):
    with pytest.raises(ValueError, match="local_step_block needs a positive integer"):
      with local_step_block(bad):
        pass


def test_full_batch_epochs_are_full_batch_steps():
  data = regression_clients(n=4, d=2, sizes=[3, 6, 4, 5], seed=1)
  model = linreg(2, l2=L2)
  hp = {"client_lr": 0.1, "server_lr": 1.0}
  h_e = run(A.fedavg(model, local_epochs=3, backend="vmap"), dataset(data), rounds=2, hparams=hp)
  h_s = run(A.fedavg(model, local_steps=3, backend="vmap"), dataset(data), rounds=2, hparams=hp)
  for k in ("w", "b"):
    np.testing.assert_allclose(
      np.asarray(h_e.final_state.params[k]), np.asarray(h_s.final_state.params[k]), atol=1e-12
    )


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(local_steps=5, local_epochs=2), "local_steps.*local_epochs"),
    (dict(local_epochs=0), "local_epochs"),
    (dict(local_epochs=True), "local_epochs"),
    (dict(local_epochs=1.5), "local_epochs"),
    (dict(local_epochs=2**31), "local_epochs"),
  ],
)
def test_bad_local_epochs(kwargs, match):
  with pytest.raises(ValueError, match=match):
    A.fedavg(linreg(2), batch_size=4, **kwargs)
  with pytest.raises(ValueError, match=match):
    common_settings(**kwargs)


def test_local_steps_at_the_declared_default_gives_way_to_local_epochs():
  alg = A.fedavg(linreg(2), local_epochs=2, batch_size=4)
  assert alg.config["local_epochs"] == 2 and alg.config["local_steps"] is None
  alg = A.fgdro_kl(linreg(2), local_epochs=1)  # declared default local_steps=32
  assert alg.config["local_epochs"] == 1 and alg.config["local_steps"] is None
  assert A.fedavg(linreg(2)).config["local_steps"] == 10  # neither given: the declared default
  assert common_settings().local_steps == 1


def test_step_rows_are_the_documented_randint_schedule():
  """``local_steps``' rows: step t's are randint(split(key, J)[t], (B,), 0, max(n, 1))."""
  key = jax.random.PRNGKey(7)
  for n in (1, 5, 64):
    rows = np.asarray(step_rows(key, jnp.int32(n), 6, 3))
    for t, k in enumerate(jax.random.split(key, 3)):
      np.testing.assert_array_equal(rows[t], np.asarray(jax.random.randint(k, (6,), 0, n)))


def test_cli_local_epochs(tmp_path, capsys):
  """``--local-epochs`` reaches the factory (recorded in the run's config); with
  ``--local-steps`` as well the run is refused naming both."""
  out = tmp_path / "run"
  args = ["run", "--rounds", "2", "--batch-size", "8", "--no-progress", "--out", str(out)]
  assert cli.main(args + ["--local-epochs", "2"]) == 0
  summary = json.loads((out / "summary.json").read_text())
  settings = summary["config"]["settings"]
  assert settings["local_epochs"] == 2 and settings["local_steps"] is None
  assert cli.main(args + ["--local-epochs", "2", "--local-steps", "3"]) == 2
  err = capsys.readouterr().err
  assert "local_steps" in err and "local_epochs" in err


def test_local_epochs_run_with_x64_off():
  # JAX's default (x64 off): the padding rows' sort key must be built as a uint32, not a Python
  # int that overflows int32; rows stay a permutation of each client's valid rows.
  run_float32(
    "import numpy as np, jax\n"
    "import fedjax_dro as fd\n"
    "from fedjax_dro import algorithms as A, models\n"
    "from fedjax_dro.core.sampling import epoch_permutations\n"
    "from fedjax_dro.data import synthetic\n"
    "perm = np.asarray(epoch_permutations(jax.random.PRNGKey(0), 5, 8, 2))\n"
    "assert perm.dtype == np.int32 and all(sorted(p[:5]) == list(range(5)) for p in perm)\n"
    "assert (perm[:, 5:] == np.arange(5, 8)).all()\n"
    "ds = synthetic.synthetic_classification()\n"
    "m = models.softmax_regression(ds.train.feature_shape[0], ds.num_classes)\n"
    "alg = A.fedavg(m, local_epochs=1, batch_size=4, clients_per_round=5)\n"
    "h = fd.run(alg, ds, rounds=2)\n"
    "assert np.isfinite(np.asarray(h.train_metrics['train_loss'])).all()\n"
    "print('ok')\n"
  )


@pytest.mark.parametrize("mean_only", [False, True])
def test_map_and_chunked_backends_run_participants_step_sorted(mean_only):
  """With the ``map`` and ``chunked`` backends a ``local_epochs`` round runs its sampled
  participants in step-sorted order (so a vmapped sweep's configurations run their ``i``-th
  participants, of similar step counts, side by side) and returns every per-participant output
  in the order of ``idx``: the same round as ``vmap`` to rounding."""
  from fedjax_dro.core.participants import ClientPlan
  from fedjax_dro.core.settings import common_settings

  def sorted_participants(counts, inputs, backend, chunk_size):
    idx = jnp.arange(6)
    plan = ClientPlan(idx, idx, None, {}, None, None, False, backend, chunk_size)
    return plan.arranged(None, inputs, counts)

  def one(backend, chunk_size=None):
    settings = common_settings(
      clients_per_round=6, local_epochs=1, batch_size=4, backend=backend, chunk_size=chunk_size
    )
    return _sampled_round(settings, mean_only)

  plain = one("vmap")
  counts = np.asarray(
    local_step_counts(common_settings(local_epochs=1, batch_size=4), plain.num_examples)
  )
  assert len(set(counts.tolist())) > 1
  for backend, size in (("map", None), ("chunked", 2), ("chunked", 4)):
    out = one(backend, size)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(out)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-12)
  # the order they run in: ascending step counts (map), consecutive ranks per chunk (chunked)
  c = jnp.asarray([5, 1, 4, 2, 6, 3])
  inputs = (None, c, c, c, c)
  ran, backend, size, inverse = sorted_participants(c, inputs, "map", None)
  assert (backend, size) == ("map", None)
  assert np.asarray(ran[1]).tolist() == [1, 2, 3, 4, 5, 6]
  assert np.asarray(ran[1])[np.asarray(inverse)].tolist() == [5, 1, 4, 2, 6, 3]
  ran, backend, size, _ = sorted_participants(c, inputs, "chunked", 2)
  assert [sorted(np.asarray(ran[1])[j::3].tolist()) for j in range(3)] == [[1, 2], [3, 4], [5, 6]]
  # without step counts (fixed local_steps, or every client taking part): as they are
  ran, _, _, inverse = sorted_participants(None, inputs, "map", None)
  assert ran is inputs and inverse is None
