"""Forward FLOPs per example of the model zoo at each architecture's standard input, from XLA's
cost analysis of the compiled inference pass (``jax.jit(...).lower(...).compile().cost_analysis()``,
batch of 2, divided by 2), and the parameter counts; writes ``zoo_flops.json`` and prints a table.

    python benchmarks/zoo_flops.py [--out DIR] [--quick]

XLA counts a multiply-add as 2 FLOPs, and a loop's body once: the LSTMs are measured on one
position and multiplied by the sequence length. ``--quick`` measures the small inputs only (CIFAR-sized
images, short sequences): the full table compiles ResNet-50, DenseNet-121, GPT-2 at 1024 tokens and
DistilBERT at 512 (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import jax
import jax.numpy as jnp
import numpy as np


def rows(quick: bool):
  from fedjax_dro.models import (
    cifar_cnn,
    densenet121,
    distilbert,
    gpt2,
    lstm_language_model,
    resnet18,
    resnet50,
  )

  img = lambda s, c=3: np.zeros((2, s, s, c), np.float32)  # noqa: E731
  tok = lambda t: np.ones((2, t), np.int32)  # noqa: E731
  table = [
    ("resnet18, CIFAR stem, 32x32x3, 100 classes", resnet18(100, stem="cifar"), img(32)),
    (
      "resnet18, CIFAR stem, GroupNorm, 32x32x3, 100 classes",
      resnet18(100, stem="cifar", norm="group"),
      img(32),
    ),
    ("cifar_cnn, 32x32x3, 10 classes", cifar_cnn(10), img(32)),
    # XLA counts a loop's body once: the recurrent models are measured on one position and
    # multiplied by the sequence's length (every position costs the same)
    (
      "lstm_language_model shakespeare, 80 characters",
      lstm_language_model("shakespeare"),
      (tok(1), 80),
    ),
    (
      "lstm_language_model stackoverflow, 20 words",
      lstm_language_model("stackoverflow"),
      (tok(1), 20),
    ),
  ]
  if not quick:
    table += [
      ("resnet18, ImageNet stem, 224x224x3, 1000 classes", resnet18(1000), img(224)),
      ("resnet50, ImageNet stem, 224x224x3, 1000 classes", resnet50(1000), img(224)),
      ("resnet50, ImageNet stem, 448x448x3, 182 classes (iWildCam)", resnet50(182), img(448)),
      ("resnet18, ImageNet stem, 224x224x8, 1 output (PovertyMap)", resnet18(1), img(224, 8)),
      ("densenet121, 96x96x3, 2 classes (Camelyon17)", densenet121(2), img(96)),
      ("densenet121, 224x224x3, 1000 classes", densenet121(1000), img(224)),
      ("gpt2 124M, 1024 tokens", gpt2("124M"), tok(1024)),
      ("distilbert base, 512 tokens, 2 classes", distilbert("base"), tok(512)),
      ("distilbert base, 300 tokens, 2 classes (CivilComments)", distilbert("base"), tok(300)),
    ]
  return table


def measure(module, x):
  variables = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)
  params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(variables.get("params", variables)))
  concrete = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), variables)
  compiled = jax.jit(lambda v, x: module.apply(v, x)).lower(concrete, x).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return params, float(cost["flops"]) / x.shape[0]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default="benchmarks/results")
  p.add_argument("--quick", action="store_true")
  args = p.parse_args(argv)
  device = f"{jax.devices()[0].device_kind} ({jax.default_backend()}), {platform.processor() or platform.machine()}"
  results = []
  print("| model and input | parameters | forward GFLOPs per example |\n|---|---|---|")
  for name, module, x in rows(args.quick):
    x, positions = x if isinstance(x, tuple) else (x, 1)
    params, flops = measure(module, x)
    flops *= positions
    results.append({"model": name, "parameters": params, "forward_flops_per_example": flops})
    print(f"| {name} | {params:,} | {flops / 1e9:.3g} |", flush=True)
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "zoo_flops.json")
  with open(path, "w") as f:
    json.dump({"device": device, "quick": args.quick, "rows": results}, f, indent=1)
  print(f"wrote {path} ({device})")


if __name__ == "__main__":
  main()
