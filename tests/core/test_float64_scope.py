"""Float64 is scoped: no library function turns ``jax_enable_x64`` on for the whole process."""

import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from fedjax_dro.core.precision import float64

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "fedjax_dro"


def test_float64_block_turns_x64_on_and_restores_the_setting():
  with jax.enable_x64(False):  # the test process runs with x64 on (conftest)
    assert jnp.zeros(1).dtype == jnp.float32
    with float64():
      assert jax.config.jax_enable_x64
      inside = jnp.ones(2) * 2
      assert inside.dtype == jnp.float64
      assert jax.jit(lambda x: x / 3)(inside).dtype == jnp.float64
    assert not jax.config.jax_enable_x64
    assert jnp.zeros(1).dtype == jnp.float32
    assert inside.dtype == jnp.float64  # what the block returns keeps its dtype
    with pytest.raises(RuntimeError):  # restored on the way out of an error too
      with float64():
        raise RuntimeError("boom")
    assert not jax.config.jax_enable_x64


def test_no_module_changes_x64_for_the_process():
  """Only the scoped helper touches the setting: no ``config.update("jax_enable_x64", ...)``
  anywhere in the package."""
  pattern = re.compile(r"""config\.update\(\s*["']jax_enable_x64""")
  offenders = [
    str(p.relative_to(PACKAGE))
    for p in PACKAGE.rglob("*.py")
    if pattern.search(p.read_text(encoding="utf-8"))
  ]
  assert offenders == []


SCRIPT = """
import warnings
import jax, jax.numpy as jnp
from fedjax_dro.reproduce.{module} import {function}
with warnings.catch_warnings():
  warnings.simplefilter("{warnings}")  # solve_saddle warns when its start point is not float64
  result = {function}(quick=True, verbose=False, **{kwargs})
assert not jax.config.jax_enable_x64, "the reproduction left jax_enable_x64 on"
assert jnp.zeros(1).dtype == jnp.float32
assert jnp.asarray(1.0).dtype == jnp.float32
print("ok", sorted(result)[:3])
"""


def _run(module, function, kwargs, timeout, warnings="default"):
  env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
  code = SCRIPT.format(module=module, function=function, kwargs=kwargs, warnings=warnings)
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.startswith("ok")


def test_scaffpd_reproduction_runs_in_float64_and_leaves_the_process_float32():
  """The SCAFF-PD reproduction solves its saddle point in float64 (warnings are errors: its
  solver warns on a float32 start) and the process's default dtype is float32 afterwards."""
  _run(
    "scaffpd",
    "scaffpd_synthetic",
    {"rounds": 3, "rhos": (0.05,), "num_seeds": 1, "plot": False},
    300,
    warnings="error",
  )


@pytest.mark.slow
def test_karula_heart_reproduction_leaves_the_process_float32():
  _run("karula", "karula_heart", {}, timeout=600)
