"""Test configuration: float64 everywhere so that oracle comparisons can use tight tolerances;
the tests listed in ``tests/slow_tests.txt`` are marked ``slow`` (left out of the default run)."""

import pathlib

import jax
import pytest

jax.config.update("jax_enable_x64", True)

SLOW_LIST = pathlib.Path(__file__).with_name("slow_tests.txt")


def slow_node_ids():
  """The node IDs of ``tests/slow_tests.txt`` (comments and blank lines skipped)."""
  lines = SLOW_LIST.read_text().splitlines()
  return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before the -m selection reads the marks
def pytest_collection_modifyitems(config, items):
  slow = slow_node_ids()
  for item in items:
    if item.nodeid in slow:
      item.add_marker(pytest.mark.slow)
