"""GPT-2: a decoder-only causal transformer language model.

The architecture of Radford, Wu, Child, Luan, Amodei and Sutskever, "Language Models are
Unsupervised Multitask Learners" (OpenAI, 2019): token and learned position embeddings,
``n_layer`` pre-LayerNorm blocks (causal multi-head self-attention with one combined ``qkv``
projection, a 4x MLP with the tanh approximation of GELU), a final LayerNorm and a language-model
head tied to the token embedding. Written as Flax's own linen examples write transformers (the
lm1b example); :func:`gpt2_params_from_hf` maps the tensors of Hugging Face's GPT-2 checkpoints
(``openai-community/gpt2``'s ``model.safetensors``, read with
:func:`fedjax_dro.models.weights.read_safetensors`) onto its parameters.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, Mapping

import flax.linen as nn
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class GPT2Config:
  """Hyper-parameters of :class:`GPT2` (defaults: the 124M-parameter ``gpt2``)."""

  vocab_size: int = 50257
  n_positions: int = 1024
  n_embd: int = 768
  n_layer: int = 12
  n_head: int = 12
  dropout: float = 0.0
  layer_norm_epsilon: float = 1e-5
  dtype: Any = jnp.float32  # computation
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if self.n_embd % self.n_head:
      raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")

  @classmethod
  def tiny(cls, **overrides) -> "GPT2Config":
    """A two-layer model for tests: vocabulary 97, 16 positions, width 32, 4 heads."""
    base = dict(vocab_size=97, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    return cls(**{**base, **overrides})


def causal_self_attention(x, qkv_dense, proj_dense, n_head, dropout, deterministic, dtype):
  """Causal multi-head self-attention of ``x [m, T, d]`` with one ``qkv`` projection."""
  m, t, d = x.shape
  q, k, v = jnp.split(qkv_dense(x), 3, axis=-1)
  heads = lambda a: a.reshape(m, t, n_head, d // n_head)
  q, k, v = heads(q), heads(k), heads(v)
  scores = jnp.einsum("mqhd,mkhd->mhqk", q, k) / jnp.sqrt(jnp.asarray(d // n_head, dtype))
  causal = nn.make_causal_mask(jnp.ones((m, t), jnp.bool_), dtype=jnp.bool_)  # [m, 1, T, T]
  scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
  weights = nn.Dropout(dropout)(nn.softmax(scores, axis=-1), deterministic=deterministic)
  out = jnp.einsum("mhqk,mkhd->mqhd", weights, v).reshape(m, t, d)
  return proj_dense(out)


class CausalSelfAttention(nn.Module):
  """GPT-2's attention: ``c_attn`` (``d -> 3d``: queries, keys, values) and ``c_proj``."""

  config: GPT2Config

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    dense = lambda n, name: nn.Dense(n, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name=name)
    out = causal_self_attention(
      x,
      dense(3 * cfg.n_embd, "c_attn"),
      dense(cfg.n_embd, "c_proj"),
      cfg.n_head,
      cfg.dropout,
      deterministic,
      cfg.dtype,
    )
    return nn.Dropout(cfg.dropout)(out, deterministic=deterministic)


class MLP(nn.Module):
  """``c_fc`` (``d -> 4d``), GELU (tanh approximation), ``c_proj`` (``4d -> d``)."""

  config: GPT2Config

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    x = nn.Dense(4 * cfg.n_embd, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="c_fc")(x)
    x = nn.gelu(x, approximate=True)
    x = nn.Dense(cfg.n_embd, dtype=cfg.dtype, param_dtype=cfg.param_dtype, name="c_proj")(x)
    return nn.Dropout(cfg.dropout)(x, deterministic=deterministic)


class Block(nn.Module):
  """A pre-LayerNorm block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

  config: GPT2Config

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    norm = lambda name: nn.LayerNorm(
      cfg.layer_norm_epsilon,
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      use_fast_variance=False,
      name=name,
    )
    x = x + CausalSelfAttention(cfg, name="attn")(norm("ln_1")(x), deterministic)
    return x + MLP(cfg, name="mlp")(norm("ln_2")(x), deterministic)


class GPT2(nn.Module):
  """GPT-2 language model: integer tokens ``[m, T]`` (``T <= n_positions``) to next-token logits
  ``[m, T, vocab_size]``.

  Parameters (Flax names, with Hugging Face's in brackets): ``wte`` and ``wpe`` embeddings,
  blocks ``h_{i}`` (``h.{i}``) with ``ln_1``, ``attn/c_attn``, ``attn/c_proj``, ``ln_2``,
  ``mlp/c_fc``, ``mlp/c_proj``, and ``ln_f``. The head is ``wte``'s transpose.
  """

  config: GPT2Config

  @nn.compact
  def __call__(self, tokens, deterministic: bool = True):
    cfg = self.config
    t = tokens.shape[-1]
    if t > cfg.n_positions:
      raise ValueError(f"sequence length {t} exceeds n_positions = {cfg.n_positions}")
    init = nn.initializers.normal(stddev=0.02)
    embed = lambda n, name: nn.Embed(
      n, cfg.n_embd, dtype=cfg.dtype, param_dtype=cfg.param_dtype, embedding_init=init, name=name
    )
    wte = embed(cfg.vocab_size, "wte")
    x = wte(tokens.astype(jnp.int32)) + embed(cfg.n_positions, "wpe")(jnp.arange(t))[None]
    x = nn.Dropout(cfg.dropout)(x, deterministic=deterministic)
    for i in range(cfg.n_layer):
      x = Block(cfg, name=f"h_{i}")(x, deterministic)
    x = nn.LayerNorm(
      cfg.layer_norm_epsilon,
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      use_fast_variance=False,
      name="ln_f",
    )(x)
    return wte.attend(x)  # the tied head


def _hf_layout(config: GPT2Config) -> Dict[str, tuple]:
  """Hugging Face name -> (Flax path, expected shape) of every GPT-2 parameter."""
  d, layout = config.n_embd, {}
  layout["wte.weight"] = (("wte", "embedding"), (config.vocab_size, d))
  layout["wpe.weight"] = (("wpe", "embedding"), (config.n_positions, d))
  dense = {"attn.c_attn": 3 * d, "attn.c_proj": d, "mlp.c_fc": 4 * d, "mlp.c_proj": d}
  for i in range(config.n_layer):
    for ln in ("ln_1", "ln_2"):
      layout[f"h.{i}.{ln}.weight"] = ((f"h_{i}", ln, "scale"), (d,))
      layout[f"h.{i}.{ln}.bias"] = ((f"h_{i}", ln, "bias"), (d,))
    for name, out in dense.items():
      fan_in = 4 * d if name == "mlp.c_proj" else d
      path = (f"h_{i}",) + tuple(name.split("."))
      layout[f"h.{i}.{name}.weight"] = (path + ("kernel",), (fan_in, out))  # Conv1D: [in, out]
      layout[f"h.{i}.{name}.bias"] = (path + ("bias",), (out,))
  layout["ln_f.weight"] = (("ln_f", "scale"), (d,))
  layout["ln_f.bias"] = (("ln_f", "bias"), (d,))
  return layout


# Buffers and tied copies that checkpoints carry besides the parameters (ignored when present).
_IGNORED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$|^lm_head\.weight$")


def _set(tree, path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def gpt2_params_from_hf(tensors: Mapping[str, np.ndarray], config: GPT2Config) -> Dict[str, Any]:
  """The :class:`GPT2` parameters held in a Hugging Face GPT-2 state dict.

  Names are those of ``openai-community/gpt2``'s ``model.safetensors`` (``wte.weight``,
  ``wpe.weight``, ``h.{i}.ln_1.weight`` ... ``ln_f.bias``), optionally prefixed ``transformer.``
  (``GPT2LMHeadModel`` checkpoints). GPT-2's ``Conv1D`` weights are already ``[in, out]``, Flax's
  kernel layout. The attention-mask buffers (``h.{i}.attn.bias``, ``h.{i}.attn.masked_bias``) and
  ``lm_head.weight`` (tied to ``wte.weight``) are ignored.

  Args:
    tensors: ``{name: array}``, e.g. from :func:`~fedjax_dro.models.weights.read_safetensors`.
    config: the model's configuration (its sizes are checked against the tensors').

  Returns:
    The parameter pytree (NumPy arrays in ``config.param_dtype``) for
    ``GPT2(config).apply({"params": params}, tokens)``.

  Raises:
    ValueError: one error listing every missing, unexpected and mis-shaped tensor.
  """
  layout = _hf_layout(config)
  found = {}
  for name, value in tensors.items():
    key = name[len("transformer.") :] if name.startswith("transformer.") else name
    found[key] = (name, value)
  return params_from_layout(layout, found, _IGNORED, config.param_dtype, "GPT-2")[0]


def params_from_layout(layout, found, ignored, dtype, what, optional=(), transposed=()):
  """Fills the pytree of ``layout`` (name -> (path, shape in the file)) from ``found`` (name ->
  (name as in the file, array)); ``optional`` names may be absent; ``transposed`` ones are
  transposed (torch ``Linear``'s ``[out, in]`` to Flax's ``[in, out]``). Raises one
  ``ValueError`` naming every missing, unexpected and mis-shaped tensor. Returns ``(params,
  absent optional names)``."""
  missing = [k for k in layout if k not in found and k not in optional]
  unexpected = [n for k, (n, _) in found.items() if k not in layout and not ignored.search(k)]
  misshaped = [
    f"{found[k][0]}: {tuple(np.shape(found[k][1]))}, expected {shape}"
    for k, (_, shape) in layout.items()
    if k in found and tuple(np.shape(found[k][1])) != shape
  ]
  if missing or unexpected or misshaped:
    lines = [f"missing: {', '.join(missing)}"] if missing else []
    lines += [f"unexpected: {', '.join(unexpected)}"] if unexpected else []
    lines += [f"mis-shaped: {'; '.join(misshaped)}"] if misshaped else []
    raise ValueError(f"{what} weights do not fit the configuration:\n  " + "\n  ".join(lines))
  params = {}
  for key, (path, _) in layout.items():
    if key in found:
      value = np.asarray(found[key][1], dtype=dtype)
      _set(params, path, np.ascontiguousarray(value.T) if key in transposed else value)
  return params, [k for k in optional if k not in found]


def gpt2(size: str = "124M", **overrides) -> GPT2:
  """A causal transformer in GPT-2's architecture (Radford, Wu, Child, Luan, Amodei, Sutskever
  2019, "Language Models are Unsupervised Multitask Learners"), as a Flax linen module.

  Args:
    size: ``"124M"`` (12 layers, 12 heads, width 768, vocabulary 50257, 1024 positions: the
      ``openai-community/gpt2`` checkpoint's shapes) or ``"tiny"`` (two layers of width 32).
    **overrides: any :class:`GPT2Config` field (``n_layer``, ``vocab_size``, ``dropout``,
      ``param_dtype``, ...).

  Returns:
    A :class:`GPT2` module mapping integer tokens ``[m, T]`` to next-token logits
    ``[m, T, vocab_size]`` (``models.from_flax`` adapts it; Hugging Face's ``model.safetensors``
    loads with :func:`gpt2_params_from_hf`).
  """
  if size not in ("124M", "tiny"):
    raise ValueError(f"size must be '124M' or 'tiny', got {size!r}")
  return GPT2(GPT2Config.tiny(**overrides) if size == "tiny" else GPT2Config(**overrides))
