"""A device running out of memory ends with a message naming the settings to change, not an XLA
trace. The out-of-memory error here is real: a round that sorts 2**36 floats (256 GiB) makes XLA
fail its allocation with RESOURCE_EXHAUSTED, on CPU as on an accelerator."""

import jax
import jax.numpy as jnp
import pytest

import fedjax_dro as fd
from fedjax_dro import algorithms as A, cli
from fedjax_dro.algorithms.base import _REGISTRY, register
from fedjax_dro.engine import DeviceMemoryError
from tests.helpers import dataset, linreg, regression_clients

SETTINGS = ("--chunk-size", "chunk_size", "--backend", "--clients-per-round")


def _memory_hungry(model, **settings):
  """FedAvg whose every round also sorts 256 GiB of random numbers."""
  base = A.fedavg(model, **settings)

  def round_fn(state, data, key, hparams):
    big = jnp.sort(jax.random.uniform(key, (2**36,)))
    state, metrics = base.round(state, data, key, hparams)
    return state, {**metrics, "big": big[0]}

  return base._replace(round=round_fn)


def test_out_of_memory_in_sweep_names_the_settings():
  data = dataset(regression_clients(n=3, d=2, seed=0))
  with pytest.raises(DeviceMemoryError) as err:
    fd.sweep(_memory_hungry(linreg(2)), data, rounds=1, seeds=[0, 1])
  message = str(err.value)
  assert "ran out of device memory" in message and "sweep" in message, message
  assert all(s in message for s in SETTINGS), message
  assert isinstance(err.value, MemoryError)


def test_out_of_memory_in_cli_run_is_one_line_naming_the_flags(capsys):
  register("memory-hungry", "test only")(_memory_hungry)
  try:
    rc = cli.main(["run", "--algorithm", "memory-hungry", "--rounds", "1", "--no-progress"])
  finally:
    _REGISTRY.pop("memory-hungry")
  err = capsys.readouterr().err.strip()
  assert rc == 2, err
  assert err.startswith("error: ") and "ran out of device memory" in err, err
  assert "\n" not in err and "Traceback" not in err
  assert all(s in err for s in SETTINGS), err
