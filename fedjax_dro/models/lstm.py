"""Word- and character-level LSTM language models, and the language-model loss.

An embedding, ``L`` LSTM layers (Hochreiter and Schmidhuber, "Long Short-Term Memory", 1997),
an optional linear projection and a dense layer to the vocabulary. Presets: ``shakespeare()``,
the next-character model of LEAF's Shakespeare benchmark (Caldas, Duddu, Wu, Li, Konecny,
McMahan, Smith and Talwalkar, "LEAF: A Benchmark for Federated Settings", 2018,
arXiv:1812.01097, after McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", 2017, arXiv:1602.05629): 90 symbols, embedding 8, two layers of 256; and
``stackoverflow()``, the next-word model of Reddi, Charles, Zaheer, Garrett, Rush, Konecny,
Kumar and McMahan, "Adaptive Federated Optimization" (ICLR 2021, arXiv:2003.00295), as FedJAX
builds it: 10000 words + 4 special tokens, embedding 96, one layer of 670, a projection to 96
and the output layer.

:func:`lm_loss_and_metrics` gives the per-example next-token cross-entropy over non-padding
tokens, with accuracy and log-perplexity.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class LSTMConfig:
  """Hyper-parameters of :class:`LSTMLanguageModel`."""

  vocab_size: int
  embed_size: int
  hidden_sizes: Sequence[int]
  projection: Optional[int] = None  # a linear layer to this width before the output layer
  dtype: Any = jnp.float32  # computation
  param_dtype: Any = jnp.float32

  @classmethod
  def shakespeare(cls, **overrides) -> "LSTMConfig":
    """LEAF's / FedAvg's Shakespeare next-character model: vocabulary 90 (86 characters, pad,
    OOV, beginning and end of sequence), embedding 8, two LSTM layers of 256."""
    return cls(**{**dict(vocab_size=90, embed_size=8, hidden_sizes=(256, 256)), **overrides})

  @classmethod
  def stackoverflow(cls, **overrides) -> "LSTMConfig":
    """The Stack Overflow next-word model (Reddi et al. 2021; FedJAX): vocabulary 10000 + 4
    (pad, beginning and end of sequence, one OOV bucket), embedding 96, one LSTM layer of 670,
    a projection to 96, then the output layer."""
    base = dict(vocab_size=10004, embed_size=96, hidden_sizes=(670,), projection=96)
    return cls(**{**base, **overrides})

  @classmethod
  def tiny(cls, **overrides) -> "LSTMConfig":
    """For tests: vocabulary 11, embedding 5, layers of 7 and 6, a projection to 4."""
    base = dict(vocab_size=11, embed_size=5, hidden_sizes=(7, 6), projection=4)
    return cls(**{**base, **overrides})


class LSTMLanguageModel(nn.Module):
  """Integer tokens ``[m, T]`` to next-token logits ``[m, T, vocab_size]``: ``embed``, LSTM
  layers (``nn.RNN`` over the cells ``lstm_{i}``, ``nn.OptimizedLSTMCell`` with parameters
  ``ii, if, ig, io`` (input kernels) and ``hi, hf, hg, ho`` (recurrent kernels and biases); zero
  initial state, left to right),
  an optional linear ``projection`` and the output layer ``logits``."""

  config: LSTMConfig

  @nn.compact
  def __call__(self, tokens):
    cfg = self.config
    x = nn.Embed(
      cfg.vocab_size, cfg.embed_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="embed"
    )(tokens.astype(jnp.int32))
    for i, hidden in enumerate(cfg.hidden_sizes):
      cell = nn.OptimizedLSTMCell(
        hidden, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name=f"lstm_{i}"
      )
      x = nn.RNN(cell)(x)
    if cfg.projection:
      x = nn.Dense(cfg.projection, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="projection")(
        x
      )
    return nn.Dense(cfg.vocab_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="logits")(x)


def lm_loss_and_metrics(pad_id: int = 0) -> Tuple[Callable, Callable]:
  """The language-model loss and metrics, for ``from_flax(..., loss=loss_fn, metrics=metrics_fn)``.

  ``y [m, T]`` holds each position's next token (the inputs shifted by one, as FedJAX's
  language datasets give them); positions where ``y == pad_id`` are ignored. An example's loss is
  the mean cross-entropy of its valid positions (0 when it has none).

  Returns:
    ``(loss_fn, metrics_fn)``: ``loss_fn(logits [m, T, V], y [m, T]) -> [m]``;
    ``metrics_fn(logits, y) -> {"accuracy": [m], "log_perplexity": [m]}``, per example over its
    valid positions (argmax accuracy; log-perplexity, the mean cross-entropy).
  """

  def per_token(logits, y):
    y = y.astype(jnp.int32)
    picked = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
    valid = (y != pad_id).astype(logits.dtype)
    count = jnp.maximum(valid.sum(axis=-1), 1)
    return jax.nn.logsumexp(logits, axis=-1) - picked, valid, count

  def loss_fn(logits, y):
    ce, valid, count = per_token(logits, y)
    return (ce * valid).sum(axis=-1) / count

  def metrics_fn(logits, y):
    ce, valid, count = per_token(logits, y)
    hits = (jnp.argmax(logits, axis=-1) == y.astype(jnp.int32)).astype(logits.dtype)
    return {
      "accuracy": (hits * valid).sum(axis=-1) / count,
      "log_perplexity": (ce * valid).sum(axis=-1) / count,
    }

  return loss_fn, metrics_fn


def lstm_language_model(preset: str = "shakespeare", **overrides) -> LSTMLanguageModel:
  """A character or word LSTM language model as a Flax linen module.

  Args:
    preset: ``"shakespeare"`` (next character: vocabulary 90, embedding 8, two LSTM layers of
      256; McMahan et al. 2017 and LEAF, Caldas et al. 2018), ``"stackoverflow"`` (next word:
      vocabulary 10004, embedding 96, one layer of 670, a projection to 96; Reddi et al. 2021)
      or ``"tiny"`` (for tests).
    **overrides: any :class:`LSTMConfig` field.

  Returns:
    An :class:`LSTMLanguageModel` mapping integer tokens ``[m, T]`` to next-token logits
    ``[m, T, vocab_size]``; train it with :func:`lm_loss_and_metrics`'s loss.
  """
  presets = {"shakespeare": LSTMConfig.shakespeare, "stackoverflow": LSTMConfig.stackoverflow}
  presets["tiny"] = LSTMConfig.tiny
  if preset not in presets:
    raise ValueError(f"preset must be one of {sorted(presets)}, got {preset!r}")
  return LSTMLanguageModel(presets[preset](**overrides))
