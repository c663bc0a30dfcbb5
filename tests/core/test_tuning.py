"""``fd.Tuning``: one value holds every performance choice that changes a compiled program; runs
resolve it (argument over an enclosing ``fd.tuned`` block over the platform's defaults), key
their program caches on it and trace inside its scope, so the same algorithm object run under two
tunings compiles two programs, each of its own form."""

import jax
import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro.common.tuning import PLATFORM_FIELDS, platform_defaults, resolve
from fedjax_dro.engine import runner, sweeps
from tests.helpers import dataset, linreg, regression_clients


@pytest.fixture(scope="module")
def task():
  return dataset(regression_clients(n=6, d=3, seed=0)), linreg(3)


def _programs(cache, alg):
  """The compiled chunk programs a cache holds for ``alg``, with the tuning each was keyed on."""
  out = []
  for key, (owner, value) in cache._entries.items():
    if owner is alg:
      tuning = next(k for k in key if isinstance(k, fd.Tuning))
      out.append((tuning, value[0]))
  return out


def test_the_same_algorithm_under_two_tunings_compiles_twice_each_of_its_own_form(task):
  ds, model = task
  # local_epochs with every client side by side (vmap): the folded step shares one exit test
  alg = fd.algorithms.fedavg(model, local_epochs=2, batch_size=4, backend="vmap")
  plain = fd.run(alg, ds, rounds=2, seed=0, tuning=fd.Tuning(folded_step=False))
  with fd.tuned(folded_step=True):
    folded = fd.run(alg, ds, rounds=2, seed=0)
  again = fd.run(alg, ds, rounds=2, seed=1, tuning=fd.Tuning(folded_step=True))
  assert plain.compile_time > 0 and folded.compile_time > 0  # the second is not the first
  assert again.compile_time == 0.0  # the same resolved tuning: the cached program
  programs = {t.folded_step: p for t, p in _programs(runner._RUN_PROGRAMS, alg)}
  assert set(programs) == {False, True}
  # checked on the compiled programs: only the folded one has the shared exit loop
  assert "shared_exit" in programs[True].as_text()
  assert "shared_exit" not in programs[False].as_text()
  # the same rounds either way (up to rounding)
  for a, b in zip(jax.tree.leaves(plain.final_state), jax.tree.leaves(folded.final_state)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_sweep_keys_its_programs_on_the_tuning(task):
  ds, model = task
  alg = fd.algorithms.fedavg(model, local_epochs=2, batch_size=4, backend="vmap")
  grid = {"client_lr": [0.05, 0.1]}
  a = fd.sweep(alg, ds, rounds=2, grid=grid, tuning=fd.Tuning(folded_step=False))
  b = fd.sweep(alg, ds, rounds=2, grid=grid, tuning=fd.Tuning(folded_step=True))
  assert a.compile_time > 0 and b.compile_time > 0
  programs = {t.folded_step: p for t, p in _programs(sweeps._SWEEP_PROGRAMS, alg)}
  assert "shared_exit" in programs[True].as_text()
  assert "shared_exit" not in programs[False].as_text()
  # the sweep's rows share the memory plan: the tuning it keyed on says how many
  assert {t.memory_share for t, _ in _programs(sweeps._SWEEP_PROGRAMS, alg)} == {2}


def test_compile_rounds_takes_a_tuning(task):
  ds, model = task
  alg = fd.algorithms.fedavg(model, local_epochs=2, batch_size=4, backend="vmap")
  on = fd.compile_rounds(alg, ds, rounds=1, tuning=fd.Tuning(folded_step=True))
  off = fd.compile_rounds(alg, ds, rounds=1, tuning=fd.Tuning(folded_step=False))
  assert "shared_exit" in on.as_text() and "shared_exit" not in off.as_text()


def test_resolution_order_argument_block_platform():
  base = platform_defaults()
  assert resolve() == resolve(fd.Tuning())
  assert all(getattr(resolve(), f) == getattr(base, f) for f in PLATFORM_FIELDS)
  assert resolve().memory_share == 1 and resolve().client_shards == 1
  assert resolve().memory_budget is None and resolve().epoch_chunk is None
  with fd.tuned(step_block=3, memory_budget=1000):
    assert resolve().step_block == 3 and resolve().memory_budget == 1000
    with fd.tuned(step_block=5):  # the inner block wins, the outer's other fields stay
      assert resolve().step_block == 5 and resolve().memory_budget == 1000
    assert resolve(fd.Tuning(step_block=7)).step_block == 7  # the argument wins
  assert resolve().step_block == base.step_block
  # platforms: cuda and rocm are gpu; an unmeasured platform takes XLA's native forms
  assert resolve(platform="cuda") == resolve(platform="gpu")
  assert resolve(platform="tpu").conv == "lax" and not resolve(platform="tpu").folded_step
  # a value equal in every field is the same cache key
  assert hash(resolve()) == hash(resolve(fd.Tuning()))


@pytest.mark.parametrize(
  "fields, match",
  [
    ({"folded_step": 1}, "Tuning.folded_step must be True, False or None"),
    ({"step_block": 0}, "Tuning.step_block must be an integer >= 1"),
    ({"epoch_groups": 2.0}, "Tuning.epoch_groups must be an integer >= 1"),
    ({"memory_budget": -1}, "Tuning.memory_budget must be an integer >= 0"),
    ({"conv": "fft"}, r"Tuning.conv must be one of \('lax', 'patches'\)"),
    ({"head_transposed_max_classes": True}, "Tuning.head_transposed_max_classes"),
    ({"factored_dense": "yes"}, "Tuning.factored_dense must be True, False or None"),
  ],
)
def test_bad_tuning_names_the_field(fields, match):
  with pytest.raises(ValueError, match=match):
    fd.Tuning(**fields)
  with pytest.raises(ValueError, match=match):
    with fd.tuned(**fields):
      pass


def test_a_run_refuses_a_tuning_of_another_type(task):
  ds, model = task
  with pytest.raises(TypeError, match="tuning must be a fedjax_dro.Tuning"):
    fd.run(fd.algorithms.fedavg(model), ds, rounds=1, tuning={"folded_step": True})
  with pytest.raises(TypeError):
    fd.tuned(folded_step=True, bogus=1).__enter__()
