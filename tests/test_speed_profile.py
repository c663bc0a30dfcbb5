"""benchmarks/speed_profile.py on its quick workload: every part of the round is accounted for
(the parts' traced times add up to the traced round), the classification of HLO instructions,
and the self times of nested trace events."""

import pytest

from tests.helpers import load_benchmark


def test_self_times_subtract_nested_events():
  prof = load_benchmark("speed_profile")
  ev = lambda name, ts, dur, tid=1: {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid}
  events = [ev("while", 0, 100), ev("a", 10, 30), ev("b", 50, 20), ev("c", 55, 5), ev("d", 0, 7, 2)]
  totals = prof.self_times(events)
  assert totals == {"while": 50, "a": 30, "b": 15, "c": 5, "d": 7}


def test_classification_of_instructions():
  prof = load_benchmark("speed_profile")
  body = "jit(f)/while/body/closed_call/vmap()/while/body/closed_call/"
  assert prof.classify("f", "fusion", body + "jit(_randint)/vmap()/add") == "index generation"
  assert prof.classify("g", "fusion", body + "gather") == "minibatch gathers"
  assert prof.classify("d", "dot", body + "transpose(jvp())/transpose") == "products"
  assert prof.classify("y", "fusion", body + "jvp()/dot_general") == "products"
  assert prof.classify("e", "fusion", body + "jvp()/exp") == "softmax / elementwise"
  assert prof.classify("u", "fusion", body + "sub") == "parameter update"
  assert (
    prof.classify("w", "while", "jit(f)/while/body/closed_call/vmap()/while") == "loop overhead"
  )
  assert prof.classify("s", "fusion", "jit(f)/while/body/closed_call/mul") == "aggregation"
  assert prof.classify("c", "copy", "") == "loop overhead"
  assert prof.classify("x", "fusion", "jit(f)/while/body/dynamic_slice") == "loop overhead"
  text = '  %dot.8 = f32[5,6]{1,0} dot(%a, %b), lhs_batch_dims={0}, metadata={op_name="x/y/dot"}'
  assert prof.instruction_metadata(text) == {"dot.8": ("dot", "x/y/dot")}


def test_quick_profile_accounts_for_the_round(tmp_path):
  prof = load_benchmark("speed_profile")
  (row,) = prof.main(["--quick", "--out", str(tmp_path / "p.json"), "--md", str(tmp_path / "p.md")])
  parts = row["parts"]
  assert set(parts) == set(prof.PARTS)
  assert sum(p["traced_s"] for p in parts.values()) == pytest.approx(row["traced_round_s"])
  assert sum(p["share"] for p in parts.values()) == pytest.approx(1.0)
  assert parts["products"]["traced_s"] > 0 and parts["minibatch gathers"]["traced_s"] > 0
  assert row["round_s"] > 0 and row["products_alone_s"] > 0
  text = (tmp_path / "p.md").read_text()
  assert all(f"| {p} |" in text for p in prof.PARTS)
