"""benchmarks/femnist_levers.py: the five forms of the local epoch compute the same weights as a
plain per-client loop (on a CPU: no TF32), the tables it publishes, and its tiny run end to end
(its logic, not its timings)."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from tests.helpers import load_benchmark


def test_every_form_of_the_step_matches_a_per_client_loop():
  lv = load_benchmark("femnist_levers")
  model, w, x, y, steps, batch = lv._chunk(quick=True)
  lr = 0.05

  def loss_at(p, xi, yi, j):
    bx, by = xi[j * batch : (j + 1) * batch], yi[j * batch : (j + 1) * batch]
    return jnp.mean(model.loss(model.apply(p, bx), by))

  grad = jax.jit(jax.grad(loss_at), static_argnums=3)
  expected = []
  for i in range(steps.shape[0]):  # the oracle: each client's own steps, one at a time
    p = jax.tree.map(lambda a, i=i: a[i], w)
    for j in range(int(steps[i])):
      p = jax.tree.map(lambda a, g: a - lr * g, p, grad(p, x[i], y[i], j))
    expected.append(p)
  expected = jax.tree.map(lambda *a: jnp.stack(a), *expected)
  forms = lv._variants(model, batch, lr)
  assert tuple(forms) == lv.VARIANTS
  for name, fn in forms.items():
    got = jax.jit(fn)(w, x, y, steps)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6, err_msg=name)


def test_markdown_ratios_and_a_failed_mode():
  lv = load_benchmark("femnist_levers")
  step = [
    {
      "variant": v,
      "ms_per_iteration": ms,
      "iterations": 47,
      "participants": 5,
      "fusions": 40,
      "custom_calls": 1,
      "max_abs_diff_vs_select": 0.0,
    }
    for v, ms in zip(lv.VARIANTS, (0.5, 0.5, 0.45, 0.25))
  ]
  comp = [
    {
      "mode": "default",
      "rounds": 300,
      "whole_s": 18.0,
      "compile_s": 12.0,
      "s_per_round_after_compile": 0.02,
    },
    {"mode": "cache_warm", "error": "Traceback ...\nRuntimeError: no cache here\n"},
  ]
  md = lv.markdown(
    {
      "device": "cpu",
      "platform": "cpu",
      "jax": "0",
      "quick": False,
      "argv": [],
      "step": step,
      "compile": comp,
    }
  )
  assert "| folded_shared_exit | 0.250 | 0.50x |" in md
  # 1500 rounds projected: 12 s compiling + 1500 x 20 ms = 42 s
  assert "| default | 300 | 18.0 | 12.0 | 20.0 | 42.0 |" in md
  assert "failed: `RuntimeError: no cache here`" in md


def test_tiny_run_writes_both_sections(tmp_path):
  lv = load_benchmark("femnist_levers")
  out = tmp_path / "levers.json"
  lv.main(
    [
      "--quick",
      "--repeats",
      "1",
      "--rounds",
      "2",
      "--out",
      str(out),
      "--cache-dir",
      str(tmp_path / "c"),
    ]
  )
  result = json.loads(out.read_text())
  assert [r["variant"] for r in result["step"]] == list(lv.VARIANTS)
  assert [r["form"] for r in result["run"]] == ["select", "folded", "factored", "select"]
  for r in result["run"][1:3]:  # the same model (float32)
    assert r["max_abs_diff_of_final_params"] < 1e-5
  factored = [r for r in result["step"] if r["variant"] == "factored_shared_exit"][0]
  assert factored["iteration_bytes"] > 0 and factored["iteration_flops"] > 0
  assert [r["mode"] for r in result["compile"]] == list(lv.COMPILE_MODES)
  assert all("error" not in r and r["compile_s"] > 0 for r in result["compile"])
  assert (tmp_path / "levers.md").read_text().startswith("# What moves")
