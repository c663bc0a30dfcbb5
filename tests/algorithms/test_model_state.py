"""Batch statistics and dropout through the federation: FedAvg under each ``model_state``, FedBN,
FedPer and a dropout model against plain per-client Python loops (float64, the simulator's key
schedule: participants, minibatch rows, dropout keys (run key, round, client, step)); the same
results on every backend and chunking; the choices an algorithm cannot honour refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro import algorithms as A, run
from fedjax_dro.common.model import Model, step_rng
from fedjax_dro.core.sampling import sample_clients, step_rows
from fedjax_dro.models.builtin import loss_and_task
from tests.helpers import dataset, regression_clients

D, H, KEEP, MOMENTUM, EPS = 3, 4, 0.8, 0.9, 1e-5


def forward(params, x, mask, rng, train):
  """A dense layer, batch normalization (masked batch statistics in training, running ones in
  inference), ReLU, dropout (training only) and a dense output."""
  p, st = params["params"], params["batch_stats"]
  h = x @ p["dense1"]["kernel"]
  if train:
    w = mask.astype(h.dtype) / jnp.maximum(jnp.sum(mask), 1)
    mu = jnp.sum(w[:, None] * h, 0)
    var = jnp.sum(w[:, None] * (h - mu) ** 2, 0)
    new = {
      "bn": {
        "mean": MOMENTUM * st["bn"]["mean"] + (1 - MOMENTUM) * mu,
        "var": MOMENTUM * st["bn"]["var"] + (1 - MOMENTUM) * var,
      }
    }
  else:
    mu, var, new = st["bn"]["mean"], st["bn"]["var"], st
  h = (h - mu) / jnp.sqrt(var + EPS) * p["bn"]["scale"] + p["bn"]["bias"]
  h = jax.nn.relu(h)
  if train and rng is not None:
    keep = jax.random.bernoulli(rng, KEEP, h.shape)
    h = jnp.where(keep, h / KEEP, 0.0)
  out = h @ p["head"]["kernel"] + p["head"]["bias"]
  return out[:, 0], new


def init(key):
  k1, k2 = jax.random.split(key)
  return {
    "params": {
      "dense1": {"kernel": jax.random.normal(k1, (D, H)) / np.sqrt(D)},
      "bn": {"scale": jnp.ones(H), "bias": jnp.zeros(H)},
      "head": {"kernel": jax.random.normal(k2, (H, 1)) / np.sqrt(H), "bias": jnp.zeros(1)},
    },
    "batch_stats": {"bn": {"mean": jnp.zeros(H), "var": jnp.ones(H)}},
  }


def bn_model(dropout=True):
  loss, metrics, task = loss_and_task("squared_error", None, None)
  return Model(
    init,
    lambda p, x: forward(p, x, None, None, False)[0],
    loss,
    metrics,
    task=task,
    name="bn_mlp",
    identity=f"bn_mlp(dropout={dropout})",
    train_apply=lambda p, x, m, r: (lambda o, s: (o, {"batch_stats": s}))(
      *forward(p, x, m, r if dropout else None, True)
    ),
    state_keys=("batch_stats",),
    state_masked=True,
  )


def dropout_model():
  """The same network without state: dropout only (the statistics fixed at 0 and 1)."""
  base = bn_model()
  stats = {"bn": {"mean": jnp.zeros(H), "var": jnp.ones(H)}}

  def full(p):
    return {"params": p, "batch_stats": stats}

  return base._replace(
    init=lambda k: init(k)["params"],
    apply=lambda p, x: forward(full(p), x, None, None, False)[0],
    train_apply=lambda p, x, m, r: (_dropped(p, x, r, stats), {}),
    state_keys=(),
    identity="dropout_mlp",
  )


def _dropped(p, x, rng, stats):
  h = x @ p["dense1"]["kernel"]
  h = (h - stats["bn"]["mean"]) / jnp.sqrt(stats["bn"]["var"] + EPS) * p["bn"]["scale"]
  h = jax.nn.relu(h + p["bn"]["bias"])
  keep = jax.random.bernoulli(rng, KEEP, h.shape)
  h = jnp.where(keep, h / KEEP, 0.0)
  return (h @ p["head"]["kernel"] + p["head"]["bias"])[:, 0]


def _tree_np(t):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), t)


def _reference(
  model, data, rounds, seed, s, J, B, lr, policy, local_of=None, dropout=True, server_lr=1.0
):
  """FedAvg with a stateful model as a plain Python loop over rounds, participants and steps.

  ``policy``: ``"average"`` (the participants' final statistics averaged with the sample-count
  weights), ``"frozen"`` (never updated) or ``"partition"`` (``local_of(path)`` True: the leaf
  kept by each client, FedBN / FedPer / local statistics). Gradients by ``jax.grad`` of one
  client's minibatch loss; everything else (sampling, averaging, state) in NumPy."""
  n = data.num_clients
  x, y, nex = np.asarray(data.x), np.asarray(data.y), np.asarray(data.num_examples)
  init_key, _, run_key = jax.random.split(jax.random.PRNGKey(seed), 3)
  params = _tree_np(model.init(init_key))
  paths = [
    "/".join(str(k.key) for k in path)
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
  ]
  treedef = jax.tree.structure(params)
  is_state = [p.startswith("batch_stats") for p in paths]
  local = [bool(local_of and local_of(p)) for p in paths]
  own = [list(jax.tree.leaves(params)) for _ in range(n)]  # each client's local leaves

  def loss_fn(p, bx, by, rng):
    out, new = model.train_apply(p, bx, jnp.ones(len(by), bool), rng)
    return jnp.mean(0.5 * (out - by) ** 2), new

  grad = jax.jit(jax.grad(loss_fn, has_aux=True))
  for r in range(rounds):
    key = jax.random.fold_in(run_key, r)
    sample_key, local_key = jax.random.split(key)
    idx = np.asarray(sample_clients(sample_key, n, s))
    client_keys = jax.random.split(local_key, s)
    finals, weights = [], []
    g_leaves = jax.tree.leaves(params)
    for k, i in enumerate(idx):
      start = [own[i][j] if local[j] else g_leaves[j] for j in range(len(paths))]
      w = jax.tree.unflatten(treedef, [a.copy() for a in start])
      rows = np.asarray(step_rows(client_keys[k], nex[i], B, J))
      for t in range(J):
        rng = step_rng(client_keys[k], t) if dropout else None
        g, new = grad(w, x[i, rows[t]], y[i, rows[t]], rng)
        w = jax.tree.map(lambda a, b: np.asarray(a - lr * np.asarray(b)), w, _tree_np(g))
        if policy != "frozen":
          w = {**w, "batch_stats": _tree_np(new["batch_stats"])}
      fin = jax.tree.leaves(w)
      for j in range(len(paths)):
        if local[j]:
          own[i][j] = fin[j]
      finals.append(fin)
      weights.append(float(nex[i]))
    wts = np.array(weights) / np.sum(weights)
    mean = [sum(wt * f[j] for wt, f in zip(wts, finals)) for j in range(len(paths))]
    g_leaves = [
      g_leaves[j]
      if local[j]
      else mean[j]
      if is_state[j]  # the statistics averaged whatever the server's step
      else g_leaves[j] + server_lr * (mean[j] - g_leaves[j])
      for j in range(len(paths))
    ]
    params = jax.tree.unflatten(treedef, g_leaves)
  return params, own, local


SETUP = dict(clients_per_round=3, local_steps=3, batch_size=4)
HP = {"client_lr": 0.05, "server_lr": 1.0}


def _data():
  return regression_clients(n=6, d=D, seed=2)


def _close(a, b):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=0, atol=1e-10)


@pytest.mark.parametrize("policy,server_lr", [("average", 1.0), ("average", 0.5), ("frozen", 1.0)])
def test_fedavg_with_batch_statistics_matches_the_reference_loop(policy, server_lr):
  model, data = bn_model(), _data()
  alg = A.fedavg(model, model_state=policy, backend="vmap", **SETUP)
  hp = {**HP, "server_lr": server_lr}
  hist = run(alg, dataset(data), rounds=4, seed=1, hparams=hp, eval_every=4)
  ref, _, _ = _reference(model, data, 4, 1, 3, 3, 4, HP["client_lr"], policy, server_lr=server_lr)
  _close(hist.final_state.params, ref)
  stats = np.asarray(hist.final_state.params["batch_stats"]["bn"]["var"])
  if policy == "frozen":
    np.testing.assert_array_equal(stats, np.ones(H))
  else:  # the statistics moved, so the comparison above can fail
    assert np.max(np.abs(stats - 1)) > 1e-3


@pytest.mark.parametrize(
  "name,local_of",
  [
    ("fedavg", lambda p: p.startswith("batch_stats")),  # model_state="local"
    ("fedbn", lambda p: p.startswith("batch_stats") or p.startswith("params/bn/")),
    ("fedper", lambda p: p.startswith("params/head/")),
  ],
)
def test_partitioned_algorithms_match_the_reference_loop(name, local_of):
  model, data = bn_model(), _data()
  options = {"model_state": "local"} if name == "fedavg" else {}
  alg = A.get_algorithm(name).factory(model, backend="vmap", **SETUP, **options)
  assert alg.personalized
  hist = run(alg, dataset(data), rounds=4, seed=1, hparams=HP, eval_every=4)
  policy = "average" if name == "fedper" else "partition"
  ref, own, local = _reference(model, data, 4, 1, 3, 3, 4, HP["client_lr"], policy, local_of)
  state = hist.final_state
  shared_sim = [a for a, m in zip(jax.tree.leaves(state.params), local) if not m]
  shared_ref = [a for a, m in zip(jax.tree.leaves(ref), local) if not m]
  _close(shared_sim, shared_ref)
  for j, row in enumerate(state.local):
    leaf = [k for k, m in enumerate(local) if m][j]
    np.testing.assert_allclose(
      np.asarray(row), np.stack([own[i][leaf] for i in range(6)]), rtol=0, atol=1e-10
    )
  models = alg.client_models(state)  # each client's own model: shared leaves and its local ones
  for i in range(6):
    mine = jax.tree.map(lambda a, i=i: a[i], models)
    full = [own[i][k] if m else a for k, (a, m) in enumerate(zip(jax.tree.leaves(ref), local))]
    _close(mine, full)


def test_dropout_keys_follow_the_step_and_the_reference_loop():
  model, data = dropout_model(), _data()
  alg = A.fedavg(model, backend="vmap", **SETUP)
  hist = run(alg, dataset(data), rounds=3, seed=4, hparams=HP, eval_every=3)
  wrapped = model._replace(
    init=lambda k: {"params": model.init(k), "batch_stats": {}},
    train_apply=lambda p, x, m, r: (model.train_apply(p["params"], x, m, r)[0], {}),
  )
  ref, _, _ = _reference(wrapped, data, 3, 4, 3, 3, 4, HP["client_lr"], "frozen")
  _close(hist.final_state.params, ref["params"])
  # the keys matter: the same loop without dropout lands elsewhere
  no_drop = wrapped._replace(
    train_apply=lambda p, x, m, r: (model.apply(p["params"], x), {}),
  )
  other, _, _ = _reference(no_drop, data, 3, 4, 3, 3, 4, HP["client_lr"], "frozen")
  diff = max(
    float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    for a, b in zip(jax.tree.leaves(hist.final_state.params), jax.tree.leaves(other["params"]))
  )
  assert diff > 1e-4


@pytest.mark.parametrize(
  "name,options",
  [
    ("fedavg", {}),
    ("fedbn", {}),
    pytest.param("fedavg", {"model_state": "local"}, marks=pytest.mark.slow),
    pytest.param("fedper", {}, marks=pytest.mark.slow),
    pytest.param("fedprox", {}, marks=pytest.mark.slow),
    pytest.param("scaffold", {}, marks=pytest.mark.slow),
    pytest.param("fedadam", {}, marks=pytest.mark.slow),
    ("fgdro_cvar", {}),
    pytest.param("fgdro_kl_adam", {}, marks=pytest.mark.slow),
  ],
)
def test_the_same_on_every_backend_and_chunking(name, options):
  model, data = bn_model(), _data()
  results = []
  for backend, chunk in [("vmap", None), ("map", None), ("chunked", 2)]:
    alg = A.get_algorithm(name).factory(
      model, backend=backend, chunk_size=chunk, **SETUP, **options
    )
    hp = {k: v for k, v in HP.items() if k in alg.hparams}
    hist = run(alg, dataset(data), rounds=2, seed=2, hparams=hp, eval_every=2)
    results.append(hist.final_state)
  for other in results[1:]:
    _close(jax.tree.leaves(results[0]), jax.tree.leaves(other))


def test_choices_an_algorithm_cannot_honour_are_refused_by_name():
  model = bn_model()
  with pytest.raises(ValueError, match="drfa cannot honour model_state='average'"):
    A.drfa(model, **SETUP)  # one gradient per sampled step: the statistics are not carried
  A.drfa(model, model_state="frozen", **SETUP)  # never updated: every algorithm honours it
  with pytest.raises(ValueError, match="fedprox cannot honour model_state='local'"):
    A.fedprox(model, model_state="local", **SETUP)
  with pytest.raises(ValueError, match="model_state must be one of"):
    A.fedavg(model, model_state="global", **SETUP)
  unmasked = model._replace(state_masked=False)
  with pytest.raises(ValueError, match="padding rows"):
    A.fedavg(unmasked, clients_per_round=3, local_steps=2)  # full-batch steps
  A.fedavg(unmasked, **SETUP)  # minibatches of valid rows: accepted


def test_evaluation_uses_the_running_statistics_without_dropout():
  model, data = bn_model(), _data()
  alg = A.fedavg(model, backend="vmap", **SETUP)
  hist = run(alg, dataset(data), rounds=2, seed=1, hparams=HP, eval_every=2)
  params = hist.final_state.params
  x, y, m = data.x[0], data.y[0], data.mask[0]
  out = forward(params, x, None, None, False)[0]
  expected = float(np.sum(0.5 * (np.asarray(out) - np.asarray(y)) ** 2 * m) / np.sum(m))
  from fedjax_dro.core.metrics import evaluate_clients

  got = float(evaluate_clients(alg.model, params, data, personalized=False)["loss"][0])
  np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_private_rounds_release_the_statistics_with_the_parameters():
  """Under ``fd.private`` the averaged statistics are part of each participant's clipped update:
  at noise 0 and an unreachable clip the run is the plain one; with a small clip the statistics
  move less than in the plain run (they are clipped with the parameters)."""
  from fedjax_dro.privacy import private

  model, data = bn_model(), _data()
  plain = A.fedavg(model, weighting="uniform", backend="vmap", **SETUP)
  ref = run(plain, dataset(data), rounds=2, seed=1, hparams=HP, eval_every=2)
  loose = private(plain, 1e12, 0.0, sampling="fixed")
  got = run(loose, dataset(data), rounds=2, seed=1, hparams=HP, eval_every=2)
  _close(got.final_state.params, ref.final_state.params)
  tight = private(plain, 1e-3, 0.0, sampling="fixed")
  clipped = run(tight, dataset(data), rounds=2, seed=1, hparams=HP, eval_every=2)
  moved = lambda h: float(  # noqa: E731
    np.max(np.abs(np.asarray(h.final_state.params["batch_stats"]["bn"]["var"]) - 1))
  )
  assert moved(clipped) < 0.1 * moved(ref)


def test_fedper_finds_the_output_layer_by_name_not_by_order():
  """JAX rebuilds dicts with sorted keys, so the head is found by its name: the zoo's (``fc``...)
  or Flax's last ``Dense_k`` (by its number, not its place among sorted keys); else refused."""
  from fedjax_dro.core.model_state import last_layer

  model = bn_model()._replace(state_keys=())
  dense = {f"Dense_{k}": {"kernel": jnp.zeros(2)} for k in (0, 2, 10)}
  assert last_layer(model, dense) == (False, True, False)  # sorted: Dense_0, Dense_10, Dense_2
  assert last_layer(model, {"body": jnp.zeros(2), "fc": jnp.zeros(2)}) == (False, True)
  with pytest.raises(ValueError, match="give head="):
    last_layer(model, {"w": jnp.zeros(2), "b": jnp.zeros(())})
  A.fedper(linreg_model(), head="^b$")  # a regular expression names it


def linreg_model():
  from tests.helpers import linreg

  return linreg(3)


def test_a_client_beyond_the_memory_is_refused_before_compiling():
  """The auto plan refuses a round whose one client's update cannot fit, naming the sizes."""
  from fedjax_dro.core.clients import memory_budget_limit

  model, data = bn_model(), _data()
  alg = A.fedavg(model, local_steps=3, batch_size=4)  # backend "auto"
  with memory_budget_limit(2_000), pytest.raises(ValueError, match="no backend fits it"):
    run(alg, dataset(data), rounds=1, hparams=HP)
  with memory_budget_limit(2**30):
    run(alg, dataset(data), rounds=1, hparams=HP)


@pytest.mark.parametrize("name", ["fedavg", "fedbn"])
def test_a_resumed_run_with_batch_statistics_equals_the_uninterrupted_one(tmp_path, name):
  """The statistics (global, or each client's under FedBN) are checkpointed with the state."""
  model, data = bn_model(), _data()
  alg = A.get_algorithm(name).factory(model, backend="vmap", **SETUP)
  ckpt = tmp_path / "ckpt"
  whole = run(
    alg, dataset(data), rounds=4, seed=5, hparams=HP, eval_every=2, checkpoint_dir=str(ckpt)
  )
  for newest in ckpt.glob("ckpt-00000004.*"):  # as if killed before round 4's checkpoint
    newest.unlink()
  assert sorted(p.name for p in ckpt.glob("ckpt-*.npz")) == ["ckpt-00000002.npz"]
  resumed = run(
    alg, dataset(data), rounds=4, seed=5, hparams=HP, eval_every=2, checkpoint_dir=str(ckpt)
  )
  assert [e["round"] for e in resumed.evaluations][-1] == 4
  for a, b in zip(jax.tree.leaves(resumed.final_state), jax.tree.leaves(whole.final_state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
