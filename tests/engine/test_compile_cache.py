"""fedjax_dro.enable_compile_cache: the persistent cache for every program size, with cuBLASLt
turned off before XLA starts (what makes cached GPU programs loadable), never behind the user's
own XLA flags, and its bad inputs."""

import json
import os
import subprocess
import sys

import jax
import pytest

import fedjax_dro as fd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = r"""
import json, os, sys
import fedjax_dro as fd
import jax, jax.numpy as jnp
ret = fd.enable_compile_cache(sys.argv[1])
jax.jit(lambda x: jnp.sin(x) * 2.0)(jnp.ones(3)).block_until_ready()
print(json.dumps({"ret": ret, "flags": os.environ.get("XLA_FLAGS", ""),
                  "dir": jax.config.jax_compilation_cache_dir}))
"""


def _child(cache, xla_flags=None):
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env.pop("XLA_FLAGS", None)
  if xla_flags is not None:
    env["XLA_FLAGS"] = xla_flags
  proc = subprocess.run(
    [sys.executable, "-c", _CHILD, str(cache)], env=env, capture_output=True, text=True, timeout=120
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_fresh_process_gets_the_cache_and_cublaslt_off(tmp_path):
  cache = tmp_path / "xla"
  got = _child(cache)
  assert got["ret"] is True
  assert got["flags"].split() == ["--xla_gpu_enable_cublaslt=false"]
  assert got["dir"] == str(cache)
  assert os.listdir(cache), "the tiny program (under 1 s to compile) was not written"


def test_the_users_own_flags_stay_in_charge(tmp_path):
  got = _child(tmp_path / "a", "--xla_gpu_enable_cublaslt=true")
  assert got["ret"] is False and got["flags"] == "--xla_gpu_enable_cublaslt=true"
  got = _child(tmp_path / "b", "--xla_gpu_enable_cublaslt=false --xla_gpu_autotune_level=2")
  assert got["ret"] is True
  assert got["flags"] == "--xla_gpu_enable_cublaslt=false --xla_gpu_autotune_level=2"
  got = _child(tmp_path / "c", "--xla_gpu_autotune_level=2")  # other flags: appended after them
  assert got["ret"] is True
  assert got["flags"] == "--xla_gpu_autotune_level=2 --xla_gpu_enable_cublaslt=false"


def test_after_the_backends_started_the_flags_are_left_alone(tmp_path, monkeypatch):
  jax.numpy.ones(1).block_until_ready()  # this process's backends are running
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  old_dir = jax.config.jax_compilation_cache_dir
  old_min = jax.config.jax_persistent_cache_min_compile_time_secs
  try:
    assert fd.enable_compile_cache(tmp_path / "xla") is False
    assert "XLA_FLAGS" not in os.environ
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    assert fd.enable_compile_cache(tmp_path / "xla", gpu_loadable=False) is False
  finally:
    jax.config.update("jax_compilation_cache_dir", old_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", old_min)


def test_bad_inputs(tmp_path):
  a_file = tmp_path / "f"
  a_file.write_text("x")
  with pytest.raises(TypeError, match="path must be a directory path"):
    fd.enable_compile_cache(None)
  with pytest.raises(TypeError, match="path must be a directory path"):
    fd.enable_compile_cache(3)
  with pytest.raises(ValueError, match="exists and is not a directory"):
    fd.enable_compile_cache(a_file)
  with pytest.raises(TypeError, match="gpu_loadable must be True or False"):
    fd.enable_compile_cache(tmp_path, gpu_loadable="yes")
