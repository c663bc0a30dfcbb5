"""No module-level mutable state is read while a program is traced: every mutable container
(dict, list, set, deque) held by a module of the package is replaced by a copy that records any
read made while JAX traces, and a round of every kind of algorithm, plain and private, a sweep,
the built-in models' tunable forms and evaluation are traced with them in place. A read of such a
container from traced code (a switch in a module-level dict or list, a cache consulted while
tracing) fails the test and names the container. The performance choices reach a program through
its one :class:`fedjax_dro.Tuning` (the engine's scope, which keys the program caches), and
privacy through the release mechanism passed to the round."""

import collections
import importlib
import pkgutil

import jax
import numpy as np
import pytest
from jax._src import core as jax_core

import fedjax_dro
import fedjax_dro as fd
from fedjax_dro import models
from tests.helpers import dataset, linreg, regression_clients

READS = {
  dict: ("__getitem__", "get", "__contains__", "__iter__", "keys", "values", "items", "__len__"),
  list: ("__getitem__", "__iter__", "__len__", "__contains__", "index", "count"),
  set: ("__contains__", "__iter__", "__len__"),
  collections.deque: ("__getitem__", "__iter__", "__len__", "__contains__"),
  collections.OrderedDict: ("__getitem__", "get", "__contains__", "__iter__", "__len__"),
}


def _watched(value, label, seen):
  """A copy of the container ``value`` of the same type (a subclass) whose reads made while JAX
  traces are recorded under ``label`` in ``seen``."""
  base = type(value)
  if base not in READS:
    return None

  def watch(name):
    original = getattr(base, name)

    def method(self, *args, **kwargs):
      if not jax_core.trace_state_clean():
        seen.add(label)
      return original(self, *args, **kwargs)

    return method

  cls = type(f"Watched{base.__name__}", (base,), {n: watch(n) for n in READS[base]})
  if base is collections.deque:
    return cls(value, maxlen=value.maxlen)
  return cls(value)


def _package_modules():
  out = [fedjax_dro]
  for info in pkgutil.walk_packages(fedjax_dro.__path__, "fedjax_dro."):
    if ".reproduce." in info.name or info.name.endswith("__main__"):
      continue  # scripts of experiments: not imported by a round
    try:
      out.append(importlib.import_module(info.name))
    except ImportError:  # an optional extra (tensorboard, mlflow)
      continue
  return out


@pytest.fixture()
def watched_globals(monkeypatch):
  seen = set()
  replaced = {}
  for module in _package_modules():
    for name, value in list(vars(module).items()):
      if name.startswith("__") or type(value) not in READS:
        continue
      key = id(value)
      if key not in replaced:
        copy = _watched(value, f"{module.__name__}.{name}", seen)
        if copy is None:
          continue
        replaced[key] = copy
      monkeypatch.setattr(module, name, replaced[key])
  assert replaced, "no module-level containers found: the watch would see nothing"
  return seen


def _trace_everything():
  ds = dataset(regression_clients(n=6, d=3, seed=0))
  model = linreg(3)
  A = fd.algorithms
  runs = [
    A.fedavg(model, local_epochs=2, batch_size=4, clients_per_round=3),
    A.fedavg(model, local_epochs=2, batch_size=4, backend="vmap"),
    A.scaffold(model, local_steps=2, batch_size=4, clients_per_round=3),
    A.scaff_pd(model, local_steps=2, batch_size=4),
    A.drfa(model, local_steps=2, clients_per_round=3),
    A.fgdro_kl(model, local_steps=2, batch_size=4, clients_per_round=3),
    A.pfedme(model, local_steps=2, batch_size=4, clients_per_round=3),
    A.ifca(model, local_steps=2, batch_size=4, num_clusters=2),
    A.karula(model, dissimilarity="ones"),
    fd.private(A.fedavg(model, weighting="uniform", clients_per_round=3), 1.0, 0.5, rate=0.5),
    fd.private(A.qffl(model, clients_per_round=3), 1.0, 0.5, rate=0.5, loss_bound=10.0),
  ]
  for alg in runs:
    fd.run(alg, ds, rounds=2, seed=0, tuning=fd.Tuning(folded_step=True, epoch_groups=2))
  fd.sweep(runs[0], ds, rounds=2, grid={"client_lr": [0.05, 0.1]}, seeds=(0,))
  # the models' tunable forms, traced
  x = np.zeros((2, 8, 8), np.float32)
  cnn = models.cnn((8, 8), 4, features=(2,), dense=None)
  jax.make_jaxpr(cnn.apply)(cnn.init(jax.random.PRNGKey(0)), x)
  soft = models.softmax_regression(5, 3)
  jax.make_jaxpr(soft.apply)(soft.init(jax.random.PRNGKey(0)), np.zeros((2, 5), np.float32))


def test_no_module_level_mutable_state_is_read_while_tracing(watched_globals):
  _trace_everything()
  assert not watched_globals, (
    f"module-level mutable containers read while a program was traced: {sorted(watched_globals)}"
  )


def test_the_watch_sees_a_module_level_switch_read_while_tracing(watched_globals, monkeypatch):
  """The watch can fail: a module-level dict consulted by traced code is reported."""
  from fedjax_dro.core import ragged

  switch = _watched({"cpu": 1}, "fedjax_dro.core.ragged.SWITCH", watched_globals)
  monkeypatch.setattr(ragged, "step_block", lambda: switch["cpu"])
  fd.run(
    fd.algorithms.fedavg(linreg(3), local_epochs=2, batch_size=4),
    dataset(regression_clients(n=4, d=3, seed=0)),
    rounds=1,
  )
  assert watched_globals == {"fedjax_dro.core.ragged.SWITCH"}


# ----------------------------------------------------------------------------------------------
# Privacy is a value passed to the round, never decided by hidden state or by a name
# ----------------------------------------------------------------------------------------------
def _package_sources():
  import pathlib

  root = pathlib.Path(fedjax_dro.__file__).parent
  return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.py"))}


def _private_round_copies(sources):
  """Functions whose name says they are a private copy of a round, and reads of a privacy
  state (``privacy_active``, ``core.privacy.active``, ``privatizing``)."""
  import ast

  found = []
  for path, text in sources.items():
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.Lambda)) and "private" in getattr(node, "name", ""):
        if "round" in node.name or "aggregate" in node.name or "epochs" in node.name:
          found.append(f"{path}: def {node.name}")
      if isinstance(node, ast.ImportFrom) and node.module == "fedjax_dro.core.privacy":
        names = {a.name for a in node.names}
        if names & {"active", "privatizing", "suspended", "unclipped_updates"}:
          found.append(f"{path}: imports {sorted(names)}")
      if isinstance(node, ast.Name) and node.id in ("privacy_active", "privatizing", "_ACTIVE"):
        found.append(f"{path}: {node.id}")
  return sorted(set(found))


def _name_comparisons(sources):
  """Comparisons of an algorithm's ``.name`` with a string (a behaviour decided by a name)
  outside the registry (``algorithms/base.py``)."""
  import ast

  found = []
  for path, text in sources.items():
    if path == "algorithms/base.py":
      continue
    for node in ast.walk(ast.parse(text)):
      if not isinstance(node, ast.Compare):
        continue
      sides = [node.left, *node.comparators]
      named = any(
        isinstance(s, ast.Attribute) and s.attr == "name" and getattr(s.value, "id", "") == "alg"
        for s in sides
      )
      if named:
        found.append(f"{path}:{node.lineno}")
  return found


def test_no_private_copy_of_a_round_and_no_privacy_state():
  assert _private_round_copies(_package_sources()) == []


def test_no_behaviour_decided_by_an_algorithm_name():
  assert _name_comparisons(_package_sources()) == []


def test_the_static_checks_can_fail():
  sources = {
    "algorithms/x.py": (
      "from fedjax_dro.core.privacy import active\n"
      "def private_round_fn(state):\n  return state\n"
      "def f(alg):\n  return alg.name == 'drfa'\n"
    )
  }
  assert _private_round_copies(sources) == [
    "algorithms/x.py: def private_round_fn",
    "algorithms/x.py: imports ['active']",
  ]
  assert _name_comparisons(sources) == ["algorithms/x.py:5"]
