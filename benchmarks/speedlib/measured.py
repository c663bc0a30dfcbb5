"""The measurements behind the platform defaults of ``fd.Tuning``'s ``conv``, ``conv_bf16`` and
``head_transposed_max_classes`` (``fedjax_dro.common.tuning.platform_defaults``;
``docs/benchmarks/tuning.md``): ``speed_conv.py`` and ``speed_head.py`` render them, and the
tests check that each default is the faster form they record and that the CPU rows are the
recorded runs."""

# FedAvg rounds of softmax regression through ``fd.compile_rounds`` (d = 64, 4 local steps of
# batch 32, 1000 clients side by side, float32), client updates / s with the weights read as
# stored ("plain") and through a transposed copy ("transposed"), by number of classes k:
# speed_head.py, results in benchmarks/results/speed_head.{json,md}, 2-core CPU. Other
# platforms have no measurements and read the weights as stored.
HEAD_MEASUREMENTS = {
  "cpu": {
    2: {"plain": 54100.0, "transposed": 78600.0},
    10: {"plain": 45500.0, "transposed": 53900.0},
    16: {"plain": 44300.0, "transposed": 48500.0},
    32: {"plain": 31100.0, "transposed": 24700.0},
    62: {"plain": 21100.0, "transposed": 18600.0},
  },
}


# Client updates per second of the built-in CNN (28x28x1, 62 classes, convolutions 32/64, dense
# 128; FedAvg, 4 local steps of batch 32) with per-client weights side by side under vmap, each
# convolution form in the same process: (platform, compute dtype) -> {clients: {form: rate}}.
# GPU, float32 row: an NVIDIA H200 with this version, tf32 products (the GPU default policy),
# n = 1000 clients (benchmarks/results/speed_gpu.md; an H100 with an earlier version gave the same
# order: lax 919, patches 3132). GPU, bfloat16 row: an H100 with an earlier version, n = 1000.
# CPU: speed_conv.py (results in benchmarks/results/speed_conv.{json,md}), 2 cores
# shared with other jobs (load 9-14: low absolute rates, the ratios are the point; bf16 at
# n = 100 not measured: lax's one call would take about an hour). ``conv="auto"`` takes the
# faster form at the largest measured n (see conv_form).
CONV_MEASUREMENTS = {
  ("gpu", "float32"): {1000: {"lax": 3520.2, "patches": 9501.2}},
  ("gpu", "bfloat16"): {1000: {"lax": 6216.0, "patches": 3766.0}},
  ("cpu", "float32"): {1: {"lax": 0.996, "patches": 14.9}, 100: {"lax": 0.0841, "patches": 5.28}},
  ("cpu", "bfloat16"): {1: {"lax": 0.165, "patches": 1.21}},
}


def conv_choice(rates_by_n) -> str:
  """The faster form at the largest measured n."""
  return max(rates_by_n[max(rates_by_n)].items(), key=lambda kv: kv[1])[0]


def head_limit(rates_by_k) -> int:
  """The largest k below which every measured k is faster transposed (0: none)."""
  limit = 0
  for k in sorted(rates_by_k):
    if rates_by_k[k]["transposed"] <= rates_by_k[k]["plain"]:
      break
    limit = k
  return limit
