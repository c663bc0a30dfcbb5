"""The zoo's stateless forms train through the simulator: a ResNet-18 with GroupNorm and the CIFAR
stem (FLUTE's FedCIFAR-100 model; here at width 4 on 8 x 8 images) adapted with ``from_flax``
runs through ``fd.run`` and ``fd.sweep`` on CIFAR-shaped clients, compiling once (a second sweep
of the same shapes traces nothing), and its FedAvg round equals a per-client loop (float64)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

import fedjax_dro as fd
from fedjax_dro import algorithms as A, data, models
from fedjax_dro.core.precision import float64
from fedjax_dro.engine.prepare import derive_keys
from fedjax_dro.models.resnet import resnet18

CLASSES = 5


def _cifar_shaped(n=4, seed=0):
  rng = np.random.default_rng(seed)
  sizes = [3 + i % 3 for i in range(n)]
  xs = [rng.normal(size=(m, 8, 8, 3)) for m in sizes]
  ys = [rng.integers(0, CLASSES, size=m) for m in sizes]
  return xs, ys


def _model(xs, traces=None):
  net = resnet18(CLASSES, norm="group", groups=2, stem="cifar", num_filters=4)
  model = models.from_flax(net, xs[0][:2], name="resnet18-gn")
  if traces is None:
    return model

  def counted(params, x):
    traces["n"] += 1
    return model.apply(params, x)

  return model._replace(apply=counted)


def test_resnet18_gn_fedavg_round_equals_the_per_client_loop():
  with float64():
    xs, ys = _cifar_shaped()
    train = data.from_client_arrays(xs, ys, dtype=np.float64)
    ds = data.FederatedDataset(train=train, test=train, name="cifar-shaped")
    model = _model(xs)
    init = model.init  # the module's parameters in float64 (Flax's default param dtype is float32)
    model = model._replace(
      init=lambda key: jax.tree.map(lambda a: a.astype(jnp.float64), init(key))
    )
    hist = fd.run(A.fedavg(model, local_steps=1), ds, rounds=1, hparams={"client_lr": 0.1})
    w0 = model.init(derive_keys(0)[0])

    def loss(w, x, y):
      return jnp.mean(model.loss(model.apply(w, x), y))

    grad = jax.jit(jax.grad(loss))
    finals = [jax.tree.map(lambda a, g: a - 0.1 * g, w0, grad(w0, x, y)) for x, y in zip(xs, ys)]
    sizes = np.array([len(x) for x in xs], float)
    ref = jax.tree.map(lambda *ws: sum(s * w for s, w in zip(sizes, ws)) / sizes.sum(), *finals)
    chex.assert_trees_all_close(hist.final_state.params, ref, rtol=1e-10, atol=1e-12)


def test_resnet18_gn_sweeps_compile_once():
  xs, ys = _cifar_shaped(n=100)  # CIFAR-shaped clients, n = 100
  ds = data.FederatedDataset(
    train=data.from_client_arrays(xs, ys), test=data.from_client_arrays(xs, ys), name="cifar"
  )
  traces = {"n": 0}
  alg = A.fedavg(_model(xs, traces), local_steps=2, batch_size=2, clients_per_round=2)
  res = fd.sweep(alg, ds, rounds=2, grid={"client_lr": [0.01, 0.1]}, seeds=[0, 1])
  assert len(res.configs) == 4
  assert all(np.isfinite(s["accuracy"]["mean"]) for s in res.final_summary)
  first = traces["n"]
  fd.sweep(alg, ds, rounds=2, grid={"client_lr": [0.02, 0.05]}, seeds=[0, 1])
  assert traces["n"] == first
