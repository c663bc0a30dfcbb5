"""benchmarks/speedlib/roofline.py and trace.py: the roofline arithmetic on cases worked by hand,
the cost of a loop-free cohort step against counts made from the shapes, the summary of a
device trace on a hand-made trace, and the anchors' count of executed client-steps."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import load_benchmark


def test_bound_worked_by_hand():
  rf = load_benchmark("speedlib.roofline")
  # 2 TFLOP and 1 GB on a device of 1 PFLOP/s and 2 TB/s: compute 2 ms, memory 0.5 ms
  b = rf.bound(2e12, 1e9, 1e15, 2e12)
  assert b["compute_s"] == pytest.approx(2e-3) and b["memory_s"] == pytest.approx(5e-4)
  assert b["bound_s"] == pytest.approx(2e-3) and b["limited_by"] == "compute"
  assert b["intensity"] == pytest.approx(2000.0) and b["ridge"] == pytest.approx(500.0)
  # 8 GFLOP and 1 GB on the same device: intensity 8 < ridge 500, memory-bound at 0.5 ms
  b = rf.bound(8e9, 1e9, 1e15, 2e12)
  assert b["limited_by"] == "memory" and b["bound_s"] == pytest.approx(5e-4)
  # a round measured at 2 ms against a bound of 0.5 ms reaches a quarter of it
  assert rf.share(5e-4, 2e-3) == pytest.approx(0.25)
  row = rf.roofline_row({"flops": 4e9, "bytes": 5e8}, 2, 1e15, 2e12, 1e-3)
  assert row["bound_s"] == pytest.approx(5e-4) and row["share"] == pytest.approx(0.5)


@pytest.mark.parametrize(
  "args,match",
  [
    ((1.0, 1.0, 0.0, 1.0), "peak_flops"),
    ((1.0, 1.0, 1.0, -1.0), "bandwidth"),
    ((-1, 1, 1, 1), "flops"),
  ],
)
def test_bound_rejects_bad_rates(args, match):
  rf = load_benchmark("speedlib.roofline")
  with pytest.raises(ValueError, match=match):
    rf.bound(*args)
  with pytest.raises(ValueError, match="measured_s"):
    rf.share(1.0, 0.0)


def test_cohort_step_cost_counts_the_products_and_the_weights():
  """A linear model's step for c clients: at least the two products per client (forward
  x @ w, backward x^T g: 2 * 2 * B * d FLOPs each), and at least each client's weights read
  and the updated weights written (2 * c * d * 4 bytes)."""
  from fedjax_dro import models

  rf = load_benchmark("speedlib.roofline")
  c, B, d, k = 3, 8, 32, 5
  model = models.softmax_regression(d, k)
  params = jax.tree.map(lambda a: a.astype(jnp.float32), model.init(jax.random.PRNGKey(0)))
  x = jnp.ones((c, B, d), jnp.float32)
  y = jnp.zeros((c, B), jnp.int32)
  cost = rf.cohort_step_cost(model, params, x, y, B)
  assert cost["clients"] == c
  assert cost["flops"] >= c * 2 * (2 * B * d * k)
  assert cost["flops"] < 50 * c * 2 * (2 * B * d * k)  # the products dominate, not 50x more
  assert cost["bytes"] >= 2 * c * (d * k + k) * 4
  assert math.isfinite(cost["bytes_cpu"])


def test_copy_bandwidth_quick_is_positive_per_size():
  rf = load_benchmark("speedlib.roofline")
  bw = rf.copy_bandwidth(quick=True, repeats=2)
  assert bw["bytes_per_s"] > 0 and set(bw["by_size"]) == {str(2**20), str(2**22)}
  assert bw["bytes_per_s"] == max(bw["by_size"].values())


def _event(name, ts, dur, pid=1, tid=7):
  return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid}


def test_device_summary_of_a_hand_made_trace():
  tr = load_benchmark("speedlib.trace")
  events = [
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
    {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #13"}},
    _event("gemm_fusion_dot", 0, 10),
    _event("loop_select_fusion", 5, 10, tid=8),  # overlaps the first: busy 0..15
    _event("MemcpyDtoH", 20, 2),
    _event("gemm_fusion_dot", 30, 10),
    _event("host_work", 0, 100, pid=2),  # not on the device
  ]
  s = tr.device_summary(events)
  assert s["device_events"] == 4 and s["kernels"] == 3
  assert s["kernel_us"] == 30 and s["copies"] == {"d2h": 1}
  assert s["span_us"] == 40 and s["busy_us"] == 15 + 2 + 10
  assert s["busy_share"] == pytest.approx(27 / 40)
  assert s["top"][0] == ["gemm_fusion_dot", 2, 20.0]
  assert s["processes"] == ["/device:GPU:0"] and s["threads"] == ["Stream #13"]
  per = tr.per_round(s, 2)
  assert per == {"kernels_per_round": 1.5, "kernel_ms_per_round": 0.015, "d2h_per_round": 0.5}
  assert tr.busy_time([(0, 4), (1, 2), (6, 1)]) == 5


def test_executed_client_steps_of_sorted_chunks_by_hand():
  """Participants of 1, 2, 3, 5 steps (batch 10, one epoch): one group runs 4 x 5 client-steps;
  sorted chunks of 2 run 2 x 2 + 2 x 5; exit tests every 2 steps round each group up."""
  from fedjax_dro import models
  from fedjax_dro.algorithms import fedavg
  from fedjax_dro.engine.prepare import derive_keys
  from fedjax_dro.engine.programs import predicted_participants

  a = load_benchmark("anchors")
  model = models.softmax_regression(4, 2)
  alg = fedavg(model, clients_per_round=4, local_epochs=1, batch_size=10)
  sizes = np.array([10, 20, 30, 50, 40, 5])
  idx = predicted_participants(alg, len(sizes), derive_keys(0)[2], range(3))
  kw = {"local_epochs": 1, "batch_size": 10}
  own = -(-sizes[idx] // 10)  # [rounds, 4]
  executed, useful = a.executed_steps(alg, sizes, kw, 0, 3, 1)
  assert useful == pytest.approx(own.sum(1).mean())
  assert executed == pytest.approx(4 * own.max(1).mean())
  ranked = np.sort(own, 1)
  executed, _ = a.executed_steps(alg, sizes, kw, 0, 3, 1, chunk=2)
  assert executed == pytest.approx((2 * ranked[:, 1] + 2 * ranked[:, 3]).mean())
  executed, _ = a.executed_steps(alg, sizes, kw, 0, 3, 2, chunk=2)
  up = lambda v: -(-v // 2) * 2  # noqa: E731
  assert executed == pytest.approx((2 * up(ranked[:, 1]) + 2 * up(ranked[:, 3])).mean())
  executed, useful = a.executed_steps(alg, sizes, {"local_steps": 3, "batch_size": 10}, 0, 3, 4)
  assert executed == useful == 12
