"""Notebooks run top to bottom with the public API (code cells executed in one namespace)."""

import glob
import json
import os

import pytest

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "notebooks", "*.ipynb")))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_executes(path):
  nb = json.load(open(path))
  namespace = {"__name__": "__notebook__"}
  for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] == "code":
      assert not cell.get("outputs"), f"{path}: cell {i} has stored outputs (strip them)"
      exec(compile("".join(cell["source"]), f"{os.path.basename(path)}[{i}]", "exec"), namespace)


def test_there_is_a_notebook():
  assert NOTEBOOKS
