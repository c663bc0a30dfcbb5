"""Every registered factory with ``local_steps`` and ``local_epochs``: ``local_epochs`` alone (or
with ``local_steps`` at the factory's declared default) is accepted and recorded with
``local_steps=None``; with any other ``local_steps`` it is refused. The default is read from the
factory's signature at registration (``algorithms.base.with_epochs_over_default_steps``)."""

import inspect

import pytest

from fedjax_dro.algorithms import list_algorithms
from fedjax_dro.algorithms.base import with_epochs_over_default_steps
from tests.helpers import linreg

MODEL = linreg(3)
BOTH = [
  name
  for name, entry in list_algorithms().items()
  if {"local_steps", "local_epochs"} <= set(inspect.signature(entry.factory).parameters)
]


def test_the_factories_with_both_settings_are_many():
  assert len(BOTH) >= 15, BOTH


@pytest.mark.parametrize("name", BOTH)
def test_local_epochs_over_the_declared_default(name):
  factory = list_algorithms()[name].factory
  default = inspect.signature(factory).parameters["local_steps"].default
  for kwargs in ({"local_epochs": 2}, {"local_epochs": 2, "local_steps": default}):
    alg = factory(MODEL, **kwargs)
    assert alg.config["local_epochs"] == 2 and alg.config["local_steps"] is None, name
  other = (default or 1) + 1
  with pytest.raises(ValueError, match="give exactly one of local_steps"):
    factory(MODEL, local_epochs=2, local_steps=other)
  assert factory(MODEL, local_steps=other).config["local_steps"] == other


def test_the_wrapper_leaves_other_factories_alone():
  def no_epochs(model, *, local_steps=3):
    return local_steps

  assert with_epochs_over_default_steps(no_epochs) is no_epochs

  def both(model, *, local_steps=7, local_epochs=None):
    return local_steps, local_epochs

  wrapped = with_epochs_over_default_steps(both)
  assert wrapped(None, local_epochs=1) == (None, 1)
  assert wrapped(None, local_epochs=1, local_steps=7) == (None, 1)
  assert wrapped(None, local_epochs=1, local_steps=8) == (8, 1)
  assert wrapped(None, local_epochs=1, local_steps=True) == (True, 1)  # a bool is not 1
  assert wrapped(None) == (7, None)
