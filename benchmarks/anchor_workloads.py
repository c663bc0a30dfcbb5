"""The workloads of ``benchmarks/anchors.py``: eight published federated runs, their generated
client sizes and their models. Not run on its own.

Each entry of :data:`WORKLOADS` holds the source's setting (clients, clients per round, batch,
local epochs, rounds), the shape of one example (``example``: an image, or ``(T,)`` tokens), its
labels (``classes``, or ``vocab`` for next-token data), the client-size distribution the data is
generated from (``sizes``), the model (``model`` and ``model_kw``, described in ``model_text``),
the published whole-run times (``published``: seconds, None where the source restates none,
with the source), what differs from the source (``note``) and the tiny stand-in of ``--quick``
(``quick``: its example shape and model sizes; :data:`QUICK` its federation).

Two models are written here, because the package's zoo has no equal: FedJAX's EMNIST CNN
(:class:`FedJaxEmnistCNN`: two unpooled 3x3 convolutions, one max-pool, dropout) and
pfl-research's StackOverflow transformer (:class:`PflTransformer`: width 96 with a 1536-wide
feed-forward layer, which ``models.gpt2`` cannot express, its MLP being fixed at 4x the width).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from fedjax_dro import models
from fedjax_dro.models.resnet import BasicBlock, ResNet

FLUTE = "FLUTE README"
FEDJAX = "FedJAX (Ro, Suresh, Wu 2021, 'FedJAX: Federated learning simulation with JAX')"
PFL = "pfl-research: 7-72x faster than other open-source frameworks in this setting"
# Stack Overflow (TFF): 342,477 training users, 135,818,730 sentences: ~397 a user, heavy-tailed
SO_SIZES = {"kind": "lognormal", "mean": 397.0, "sigma": 1.5}


def _flute(framework, wall_s, hardware=None):
  """A time of FLUTE's README: FLUTE on 4 GPUs of an unstated type, the others on the hardware
  of FLUTE's comparison unless it says."""
  if hardware is None:
    hardware = (
      "4 GPUs (type not stated)" if framework == "FLUTE" else "the hardware of FLUTE's comparison"
    )
  return {"framework": framework, "wall_s": wall_s, "hardware": hardware, "source": FLUTE}


WORKLOADS = {
  "flute_femnist": {
    "title": "FLUTE FEMNIST (FedAvg, 2-conv CNN)",
    "num_clients": 3400,
    "clients_per_round": 10,
    "batch_size": 20,
    "local_epochs": 1,
    "rounds": 1500,
    "image": (28, 28, 1),
    "classes": 62,
    "model": "cnn",
    "features": (32, 64),
    "dense": 2048,
    "sizes": {"kind": "lognormal", "mean": 226.0, "sigma": 0.5},
    "published": [
      {"framework": "FLUTE", "wall_s": 8 * 60 + 22, "hardware": "4 GPUs", "source": FLUTE},
      {
        "framework": "FedML",
        "wall_s": 5 * 3600 + 50 * 60,
        "hardware": "the hardware of FLUTE's comparison",
        "source": FLUTE,
      },
    ],
  },
  "pfl_cifar10": {
    "title": "pfl-research CIFAR-10 (FedAvg, simple CNN)",
    "num_clients": 1000,
    "clients_per_round": 50,
    "batch_size": 10,
    "local_epochs": 1,
    "rounds": 1500,
    "image": (32, 32, 3),
    "classes": 10,
    "model": "cnn",
    "features": (32, 64),
    "dense": 128,
    "sizes": {"kind": "fixed", "mean": 50.0},
    "published": [
      {"framework": "pfl-research", "wall_s": None, "hardware": "one A100", "source": PFL}
    ],
  },
  "flute_lr_mnist": {
    "title": "FLUTE LR_MNIST (FedAvg, logistic regression)",
    "num_clients": 1000,
    "clients_per_round": 10,
    "batch_size": 10,
    "local_epochs": 1,
    "rounds": 100,
    "example": (784,),
    "classes": 10,
    "model": "softmax_regression",
    "model_text": "multinomial logistic regression 784 -> 10 (models.softmax_regression)",
    "sizes": {"kind": "fixed", "mean": 60.0},
    "note": "MNIST's 60,000 training images split evenly over the 1000 clients (FLUTE's split "
    "is not restated here)",
    "published": [
      _flute("FLUTE", 60 + 35),
      _flute("FedML", 3 * 60 + 9),
      _flute("Flower 1.0", 30 * 60 + 14, "CPU"),
    ],
  },
  "flute_resnet_fedcifar100": {
    "title": "FLUTE RESNET_FEDCIFAR100 (FedAvg, ResNet-18 + GroupNorm)",
    "num_clients": 500,
    "clients_per_round": 10,
    "batch_size": 20,
    "local_epochs": 1,
    "rounds": 4000,
    "example": (32, 32, 3),
    "classes": 100,
    "model": "resnet18",
    "model_kw": {"norm": "group", "stem": "cifar"},
    "model_text": "ResNet-18, GroupNorm (32 groups), CIFAR stem (models.resnet18's network)",
    "sizes": {"kind": "fixed", "mean": 100.0},
    "note": "TFF's federated CIFAR-100: 500 training clients of 100 images each",
    # quick: one basic block a stage (ResNet-10's layout) of width 4, to halve its compilation
    "quick": {
      "example": (8, 8, 3),
      "model_kw": {"num_filters": 4, "groups": 2, "stage_sizes": (1, 1, 1, 1)},
    },
    "published": [_flute("FLUTE", 3600 + 42 * 60 + 1), _flute("FedML", 15 * 3600 + 55 * 60 + 36)],
  },
  "flute_rnn_fedshakespeare": {
    "title": "FLUTE RNN_FEDSHAKESPEARE (FedAvg, 2-layer LSTM)",
    "num_clients": 715,
    "clients_per_round": 10,
    "batch_size": 4,
    "local_epochs": 1,
    "rounds": 1200,
    "example": (80,),
    "vocab": 90,
    "model": "lstm",
    "model_kw": {"preset": "shakespeare"},
    "model_text": "character LSTM: embedding 8, two LSTM layers of 256, dense to 90 "
    "(models.lstm_language_model('shakespeare'), FedJAX's / TFF's Shakespeare model)",
    # TFF's Shakespeare: 16,068 training snippets over 715 speakers (~22.5 each)
    "sizes": {"kind": "lognormal", "mean": 22.5, "sigma": 1.0},
    "note": "sequences of 80 characters per client drawn from a lognormal of mean 22.5 (TFF's "
    "16,068 training snippets over 715 clients, one sequence a snippet: a lower bound where "
    "longer snippets are cut into several)",
    "quick": {"example": (8,), "model_kw": {"embed_size": 4, "hidden_sizes": (8, 8)}},
    "published": [_flute("FLUTE", 21 * 60 + 50), _flute("FedML", 6 * 3600 + 46 * 60 + 21)],
  },
  "pfl_stackoverflow": {
    "title": "pfl-research StackOverflow (FedAvg, transformer)",
    "num_clients": 4000,
    "clients_per_round": 400,
    "batch_size": 16,
    "local_epochs": 1,
    "rounds": 2000,
    "example": (20,),
    "vocab": 10000,
    "model": "pfl_transformer",
    "model_kw": {"width": 96, "heads": 8, "ff": 1536, "layers": 3, "dropout": 0.1},
    "model_text": "causal transformer: width 96, 8 heads, feed-forward 1536, 3 layers, "
    "dropout 0.1, vocabulary 10,000, length 20 (PflTransformer, written in "
    "benchmarks/anchor_workloads.py: models.gpt2's MLP is fixed at 4x the width, 384 here)",
    "sizes": dict(SO_SIZES, cap=64),
    "note": "4000 generated users (the real data has 342,477; a round's cost depends on its "
    "cohort, not on the federation's size), sentences per user from a lognormal of mean 397 "
    "(Stack Overflow's 135.8 M sentences over 342,477 users) capped at 64",
    "quick": {
      "example": (8,),
      "vocab": 50,
      "model_kw": {"width": 16, "heads": 2, "ff": 32, "layers": 1},
    },
    "published": [
      {"framework": "pfl-research", "wall_s": None, "hardware": "one A100", "source": PFL}
    ],
  },
  "fedjax_emnist_conv": {
    "title": "FedJAX EMNIST_CONV (FedAvg, FedJAX's EMNIST CNN)",
    "num_clients": 3400,
    "clients_per_round": 10,
    "batch_size": 10,
    "local_epochs": 1,
    "rounds": 1500,
    "example": (28, 28, 1),
    "classes": 62,
    "model": "fedjax_emnist_cnn",
    "model_kw": {"features": (32, 64), "dense": 128},
    "model_text": "conv 32 3x3, conv 64 3x3 (valid padding), max-pool 2, dropout 0.25, dense "
    "128, dropout 0.5, 62 classes (FedJaxEmnistCNN, written in benchmarks/anchor_workloads.py)",
    # TFF's EMNIST-62: 671,585 training images over 3400 writers (~197.5 each)
    "sizes": {"kind": "lognormal", "mean": 197.5, "sigma": 0.5},
    "note": "images per client from a lognormal of mean 197.5 (EMNIST-62's 671,585 training "
    "images over 3400 writers)",
    "quick": {"example": (8, 8, 1), "model_kw": {"features": (4, 8), "dense": 16}},
    "published": [
      {
        "framework": "FedJAX",
        "wall_s": None,
        "hardware": "TPU",
        "source": FEDJAX + ': "a few minutes"',
      }
    ],
  },
  "fedjax_stackoverflow_word": {
    "title": "FedJAX STACKOVERFLOW_WORD (FedAvg, word LSTM)",
    "num_clients": 4000,
    "clients_per_round": 50,
    "batch_size": 16,
    "local_epochs": 1,
    "rounds": 1500,
    "example": (30,),
    "vocab": 10004,
    "model": "lstm",
    "model_kw": {"preset": "stackoverflow"},
    "model_text": "word LSTM: embedding 96, one LSTM layer of 670, projection to 96, dense to "
    "10,000 + 4 (models.lstm_language_model('stackoverflow'))",
    "sizes": dict(SO_SIZES, cap=500 * 16),
    "note": "4000 generated users (the real data has 342,477), sentences per user from a "
    "lognormal of mean 397 capped at 500 steps of 16 (8000 sentences)",
    "quick": {
      "example": (8,),
      "vocab": 50,
      "model_kw": {"embed_size": 8, "hidden_sizes": (8,), "projection": 8},
    },
    "published": [
      {
        "framework": "FedJAX",
        "wall_s": None,
        "hardware": "TPU",
        "source": FEDJAX + ': "roughly an hour"',
      }
    ],
  },
}

# The tiny stand-ins of --quick: the same code path in seconds on a CPU.
QUICK = {  # images scaled down to 8x8, sequences to 8 tokens, 2 rounds
  "num_clients": 12,
  "clients_per_round": 3,
  "features": (4, 8),
  "dense": 16,
  "mean": 12.0,
}


class FedJaxEmnistCNN(nn.Module):
  """FedJAX's EMNIST CNN (``fedjax.models.emnist.create_conv_model``): two 3x3 convolutions
  with valid padding and ReLU, one 2x2 max-pool, dropout 0.25, a dense ReLU layer, dropout 0.5
  and the output layer."""

  num_classes: int = 62
  features: tuple = (32, 64)
  dense: int = 128

  @nn.compact
  def __call__(self, x, train: bool = False):
    for f in self.features:
      x = nn.relu(nn.Conv(f, (3, 3), padding="VALID")(x))
    x = nn.max_pool(x, (2, 2), strides=(2, 2))
    x = nn.Dropout(0.25, deterministic=not train)(x)
    x = nn.relu(nn.Dense(self.dense)(x.reshape(x.shape[0], -1)))
    x = nn.Dropout(0.5, deterministic=not train)(x)
    return nn.Dense(self.num_classes)(x)


class PflTransformer(nn.Module):
  """A causal transformer of pfl-research's StackOverflow benchmark's sizes: token and learned
  position embeddings, ``layers`` pre-LayerNorm blocks (causal self-attention of ``heads``
  heads, a ReLU feed-forward layer of ``ff``), dropout ``dropout`` after the embeddings, the
  attention weights and both sub-layers, a final LayerNorm and an untied output layer (pfl's
  norm placement and head are not restated here; the sizes are). Tokens ``[m, T]`` to logits
  ``[m, T, vocab]``."""

  vocab: int
  length: int
  width: int = 96
  heads: int = 8
  ff: int = 1536
  layers: int = 3
  dropout: float = 0.1

  @nn.compact
  def __call__(self, tokens, train: bool = False):
    drop = lambda h: nn.Dropout(self.dropout, deterministic=not train)(h)
    t = tokens.shape[-1]
    x = nn.Embed(self.vocab, self.width)(tokens.astype(jnp.int32))
    x = drop(x + nn.Embed(self.length, self.width)(jnp.arange(t))[None])
    mask = nn.make_causal_mask(tokens)
    for _ in range(self.layers):
      h = nn.LayerNorm()(x)
      h = nn.MultiHeadDotProductAttention(
        num_heads=self.heads, dropout_rate=self.dropout, deterministic=not train
      )(h, h, mask=mask)
      x = x + drop(h)
      h = nn.relu(nn.Dense(self.ff)(nn.LayerNorm()(x)))
      x = x + drop(nn.Dense(self.width)(drop(h)))
    return nn.Dense(self.vocab)(nn.LayerNorm()(x))


def client_sizes(spec, num_clients, rng):
  """Examples per client: a lognormal of the given mean (its median ``mean * exp(-sigma^2 / 2)``)
  rounded, at least 1 and at most the spec's ``cap``, or a fixed size."""
  sizes = spec["sizes"]
  if sizes["kind"] == "fixed":
    return np.full(num_clients, int(sizes["mean"]), np.int32)
  sigma = sizes["sigma"]
  mu = math.log(sizes["mean"]) - sigma**2 / 2
  drawn = np.maximum(1, np.rint(rng.lognormal(mu, sigma, num_clients)))
  return np.minimum(drawn, sizes.get("cap", np.inf)).astype(np.int32)


def example_shape(spec, quick):
  """The shape of one example: the spec's (``example`` or ``image``), or its quick stand-in
  (images 8x8 with the spec's channels unless the spec says otherwise)."""
  shape = tuple(spec.get("example") or spec["image"])
  if not quick:
    return shape
  return tuple(
    spec.get("quick", {}).get("example") or ((8, 8, shape[2]) if len(shape) == 3 else shape)
  )


def vocab(spec, quick):
  """The vocabulary of a token workload (None for labelled examples)."""
  return spec.get("quick", {}).get("vocab", spec.get("vocab")) if quick else spec.get("vocab")


def build_model(spec, example, quick):
  """The workload's model (``fedjax_dro.models.Model``) for examples of shape ``example``."""
  kind = spec["model"]
  kw = dict(
    spec.get("model_kw", {}), **(spec.get("quick", {}).get("model_kw", {}) if quick else {})
  )
  if kind == "cnn":
    return models.cnn(
      example,
      spec["classes"],
      features=QUICK["features"] if quick else spec["features"],
      dense=QUICK["dense"] if quick else spec["dense"],
    )
  if kind == "softmax_regression":
    return models.softmax_regression(math.prod(example), spec["classes"])
  sample = jnp.zeros((1,) + tuple(example), jnp.float32)
  if kind == "resnet18":
    stages = kw.pop("stage_sizes", (2, 2, 2, 2))  # ResNet-18's, unless a quick stand-in's
    net = ResNet(stages, BasicBlock, spec["classes"], **kw)
    return models.from_flax(net, sample, name=f"resnet(stages {stages}, {kw})")
  if kind == "fedjax_emnist_cnn":
    net = FedJaxEmnistCNN(spec["classes"], tuple(kw["features"]), kw["dense"])
    return models.from_flax(net, sample, name=f"fedjax_emnist_cnn({kw})")
  v = vocab(spec, quick)
  tokens = jnp.ones((1,) + tuple(example), jnp.int32)
  loss, metrics = models.lm_loss_and_metrics()
  if kind == "lstm":
    preset = kw.pop("preset")
    net = models.lstm_language_model(preset, vocab_size=v, **kw)
    name = f"lstm_language_model({preset!r}, vocab {v}, {kw})"
  elif kind == "pfl_transformer":
    net = PflTransformer(v, example[0], **kw)
    name = f"pfl_transformer(vocab {v}, {kw})"
  else:
    raise ValueError(f"unknown model {kind!r}")
  return models.from_flax(net, tokens, loss=loss, metrics=metrics, task="classification", name=name)
