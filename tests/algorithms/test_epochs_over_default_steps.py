"""Every registered factory with ``local_steps`` and ``local_epochs``: ``local_epochs`` alone (or
with ``local_steps`` at the factory's declared default) is accepted and recorded with
``local_steps=None``; with any other ``local_steps`` it is refused. The default is the one the
factory declares (``algorithms.base.with_settings``), which also writes the signature and the
docstring's entries of the shared settings."""

import inspect

import pytest

from fedjax_dro.algorithms import list_algorithms
from fedjax_dro.algorithms.base import with_args_entries, with_settings
from fedjax_dro.core.settings import DECLARED
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
  @with_settings(("local_steps", "batch_size"), defaults={"local_steps": 3})
  def no_epochs(model, settings):
    return settings

  assert no_epochs(None).local_steps == 3 and no_epochs(None, local_steps=5).local_steps == 5
  with pytest.raises(TypeError, match="local_epochs"):
    no_epochs(None, local_epochs=1)

  @with_settings(defaults={"local_steps": 7}, fixed={"weighting": "uniform"})
  def both(model, settings, *, own=0):
    """Both.

    Args:
      own: the factory's own setting.
      local_steps: ``I``, the paper's interval.
      model: the model.
    """
    return settings.local_steps, settings.local_epochs, settings.weighting, own

  assert both(None, local_epochs=1) == (None, 1, "uniform", 0)
  assert both(None, local_epochs=1, local_steps=7) == (None, 1, "uniform", 0)
  with pytest.raises(ValueError, match="give exactly one of local_steps"):
    both(None, local_epochs=1, local_steps=8)
  with pytest.raises(ValueError, match="give exactly one of local_steps"):
    both(None, local_epochs=1, local_steps=True)  # a bool is not 7
  assert both(None, own=4) == (7, None, "uniform", 4)
  with pytest.raises(TypeError, match="weighting"):
    both(None, weighting="num_examples")  # fixed, not a parameter
  names = list(inspect.signature(both).parameters)
  assert names == [
    "model",
    "own",
    "clients_per_round",
    "local_steps",
    "local_epochs",
    "batch_size",
    "backend",
    "chunk_size",
    "model_state",
  ]
  assert inspect.signature(both).parameters["local_steps"].default == 7
  # the docstring: own entries kept, the declared ones added, all in the signature's order
  doc = both.__doc__
  entries = [
    line.strip().split(":")[0]
    for line in doc.split("\n")
    if line.startswith("      ") and not line.startswith("       ")
  ]
  assert entries == names
  assert "``I``, the paper's interval" in doc and "default ``7``" not in doc
  assert "planned from memory (default ``None``)" in " ".join(doc.split())


def test_declared_settings_are_refused_when_misdeclared():
  with pytest.raises(ValueError, match="DECLARED"):
    with_settings(("local_step",))
  with pytest.raises(ValueError, match="defaults among names"):
    with_settings(("batch_size",), defaults={"local_steps": 2})
  with pytest.raises(TypeError, match="model, settings"):
    with_settings()(lambda model, *, local_steps=1: None)
  with pytest.raises(TypeError, match="own keyword parameters"):

    @with_settings()
    def clash(model, settings, *, batch_size=None):
      return settings


def test_args_entries_are_added_once_and_wrapped():
  doc = with_args_entries("One.\n\n  Args:\n    a: first.\n\n  Returns:\n    x.", {"b": "y " * 60})
  lines = doc.split("\n")
  assert lines[3] == "    a: first." and lines[4].startswith("    b: y y")
  assert all(len(line) <= 100 for line in lines) and lines[5].startswith("      y")
  assert doc.endswith("\n\n  Returns:\n    x.")
  assert with_args_entries(doc, {"b": "other"}) == doc
  assert with_args_entries("One.", {"c": "z."}) == "One.\n\nArgs:\n  c: z."
  assert set(DECLARED) >= {"clients_per_round", "local_steps", "local_epochs", "batch_size"}
