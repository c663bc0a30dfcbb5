"""DistilBERT sequence classifier.

The model of Sanh, Debut, Chaumond and Wolf, "DistilBERT, a distilled version of BERT: smaller,
faster, cheaper and lighter" (2019, arXiv:1910.01108): word and learned position embeddings, an
embedding LayerNorm, ``n_layers`` post-LayerNorm transformer blocks (bidirectional multi-head
self-attention masked to the non-padding tokens, a GELU feed-forward layer), and the
classification head of Hugging Face's ``DistilBertForSequenceClassification``: ``pre_classifier``
(``dim -> dim``), ReLU and ``classifier`` on the first (``[CLS]``) token's hidden state. Written
as Flax's own linen examples write transformers (the lm1b example);
:func:`distilbert_params_from_hf` maps the tensors of Hugging Face's DistilBERT checkpoints
(``distilbert-base-uncased``'s ``model.safetensors``) onto its parameters.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.models.gpt2 import params_from_layout


@dataclasses.dataclass(frozen=True)
class DistilBertConfig:
  """Hyper-parameters of :class:`DistilBertClassifier` (defaults: ``distilbert-base-uncased``
  with a two-class head; dropout rates as Hugging Face's configuration)."""

  vocab_size: int = 30522
  max_position_embeddings: int = 512
  dim: int = 768
  n_layers: int = 6
  n_heads: int = 12
  hidden_dim: int = 3072
  num_labels: int = 2
  dropout: float = 0.1
  attention_dropout: float = 0.1
  seq_classif_dropout: float = 0.2
  pad_token_id: int = 0
  layer_norm_eps: float = 1e-12
  dtype: Any = jnp.float32  # computation
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if self.dim % self.n_heads:
      raise ValueError(f"dim ({self.dim}) must be a multiple of n_heads ({self.n_heads})")

  @classmethod
  def tiny(cls, **overrides) -> "DistilBertConfig":
    """A two-layer model for tests: vocabulary 101, 16 positions, width 32, 4 heads, FFN 64,
    3 labels, no dropout."""
    base = dict(
      vocab_size=101,
      max_position_embeddings=16,
      dim=32,
      n_layers=2,
      n_heads=4,
      hidden_dim=64,
      num_labels=3,
      dropout=0.0,
      attention_dropout=0.0,
      seq_classif_dropout=0.0,
    )
    return cls(**{**base, **overrides})


def _dense(cfg, n, name):
  return nn.Dense(
    n,
    dtype=cfg.dtype,
    param_dtype=cfg.param_dtype,
    kernel_init=nn.initializers.normal(stddev=0.02),
    name=name,
  )


def _norm(cfg, name):
  return nn.LayerNorm(
    cfg.layer_norm_eps,
    dtype=cfg.dtype,
    param_dtype=cfg.param_dtype,
    use_fast_variance=False,
    name=name,
  )


class MultiHeadSelfAttention(nn.Module):
  """``q_lin``, ``k_lin``, ``v_lin`` and ``out_lin``; keys where ``mask`` is False are ignored."""

  config: DistilBertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool = True):
    cfg = self.config
    m, t, d = x.shape
    heads = lambda a: a.reshape(m, t, cfg.n_heads, d // cfg.n_heads)
    q = heads(_dense(cfg, d, "q_lin")(x)) / jnp.sqrt(jnp.asarray(d // cfg.n_heads, cfg.dtype))
    k = heads(_dense(cfg, d, "k_lin")(x))
    v = heads(_dense(cfg, d, "v_lin")(x))
    scores = jnp.einsum("mqhd,mkhd->mhqk", q, k)
    scores = jnp.where(mask[:, None, None, :], scores, jnp.finfo(scores.dtype).min)
    weights = nn.softmax(scores, axis=-1)
    weights = nn.Dropout(cfg.attention_dropout)(weights, deterministic=deterministic)
    out = jnp.einsum("mhqk,mkhd->mqhd", weights, v).reshape(m, t, d)
    return _dense(cfg, d, "out_lin")(out)


class FFN(nn.Module):
  """``lin1`` (``dim -> hidden_dim``), GELU (exact, erf), ``lin2``, dropout."""

  config: DistilBertConfig

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.config
    x = nn.gelu(_dense(cfg, cfg.hidden_dim, "lin1")(x), approximate=False)
    x = _dense(cfg, cfg.dim, "lin2")(x)
    return nn.Dropout(cfg.dropout)(x, deterministic=deterministic)


class TransformerBlock(nn.Module):
  """A post-LayerNorm block: ``sa_layer_norm(x + attention(x))``, then
  ``output_layer_norm(h + ffn(h))``."""

  config: DistilBertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool = True):
    cfg = self.config
    h = MultiHeadSelfAttention(cfg, name="attention")(x, mask, deterministic)
    h = _norm(cfg, "sa_layer_norm")(h + x)
    return _norm(cfg, "output_layer_norm")(h + FFN(cfg, name="ffn")(h, deterministic))


class DistilBertClassifier(nn.Module):
  """DistilBERT for sequence classification: integer tokens ``[m, T]`` (``T <=
  max_position_embeddings``) to class logits ``[m, num_labels]``.

  ``attention_mask`` (``[m, T]``, true or 1 at real tokens) defaults to ``tokens !=
  pad_token_id``. Parameters (Flax names): ``embeddings/{word_embeddings, position_embeddings,
  LayerNorm}``, ``layer_{i}/{attention/{q_lin, k_lin, v_lin, out_lin}, sa_layer_norm,
  ffn/{lin1, lin2}, output_layer_norm}``, ``pre_classifier``, ``classifier``.
  """

  config: DistilBertConfig

  @nn.compact
  def __call__(self, tokens, attention_mask=None, deterministic: bool = True):
    cfg = self.config
    t = tokens.shape[-1]
    if t > cfg.max_position_embeddings:
      raise ValueError(
        f"sequence length {t} exceeds max_position_embeddings = {cfg.max_position_embeddings}"
      )
    tokens = tokens.astype(jnp.int32)
    mask = tokens != cfg.pad_token_id if attention_mask is None else attention_mask.astype(bool)
    x = EmbeddingsBlock(cfg, name="embeddings")(tokens, deterministic)
    for i in range(cfg.n_layers):
      x = TransformerBlock(cfg, name=f"layer_{i}")(x, mask, deterministic)
    pooled = nn.relu(_dense(cfg, cfg.dim, "pre_classifier")(x[:, 0]))
    pooled = nn.Dropout(cfg.seq_classif_dropout)(pooled, deterministic=deterministic)
    return _dense(cfg, cfg.num_labels, "classifier")(pooled)


class EmbeddingsBlock(nn.Module):
  """Word + position embeddings, LayerNorm, dropout."""

  config: DistilBertConfig

  @nn.compact
  def __call__(self, tokens, deterministic: bool = True):
    cfg = self.config
    embed = lambda n, name: nn.Embed(
      n,
      cfg.dim,
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      embedding_init=nn.initializers.normal(stddev=0.02),
      name=name,
    )
    x = embed(cfg.vocab_size, "word_embeddings")(tokens)
    x = (
      x
      + embed(cfg.max_position_embeddings, "position_embeddings")(jnp.arange(tokens.shape[-1]))[
        None
      ]
    )
    x = _norm(cfg, "LayerNorm")(x)
    return nn.Dropout(cfg.dropout)(x, deterministic=deterministic)


_HEAD = ("pre_classifier.weight", "pre_classifier.bias", "classifier.weight", "classifier.bias")
# The masked-LM head of distilbert-base-uncased (DistilBertForMaskedLM) and buffers: ignored.
_IGNORED = re.compile(
  r"^(vocab_transform|vocab_layer_norm|vocab_projector)\.|position_ids$|^distilbert\.pooler\."
)


def _hf_layout(config: DistilBertConfig) -> Dict[str, tuple]:
  """Hugging Face name -> (Flax path, shape in the file) of every DistilBERT parameter."""
  d, h, layout = config.dim, config.hidden_dim, {}
  emb = "distilbert.embeddings"
  layout[f"{emb}.word_embeddings.weight"] = (
    ("embeddings", "word_embeddings", "embedding"),
    (config.vocab_size, d),
  )
  layout[f"{emb}.position_embeddings.weight"] = (
    ("embeddings", "position_embeddings", "embedding"),
    (config.max_position_embeddings, d),
  )

  def norm(prefix, path):
    layout[f"{prefix}.weight"] = (path + ("scale",), (d,))
    layout[f"{prefix}.bias"] = (path + ("bias",), (d,))

  def linear(prefix, path, n_in, n_out):
    layout[f"{prefix}.weight"] = (path + ("kernel",), (n_out, n_in))  # torch Linear: [out, in]
    layout[f"{prefix}.bias"] = (path + ("bias",), (n_out,))

  norm(f"{emb}.LayerNorm", ("embeddings", "LayerNorm"))
  for i in range(config.n_layers):
    prefix, path = f"distilbert.transformer.layer.{i}", (f"layer_{i}",)
    for lin in ("q_lin", "k_lin", "v_lin", "out_lin"):
      linear(f"{prefix}.attention.{lin}", path + ("attention", lin), d, d)
    norm(f"{prefix}.sa_layer_norm", path + ("sa_layer_norm",))
    linear(f"{prefix}.ffn.lin1", path + ("ffn", "lin1"), d, h)
    linear(f"{prefix}.ffn.lin2", path + ("ffn", "lin2"), h, d)
    norm(f"{prefix}.output_layer_norm", path + ("output_layer_norm",))
  linear("pre_classifier", ("pre_classifier",), d, d)
  linear("classifier", ("classifier",), d, config.num_labels)
  return layout


def _canonical(name: str) -> str:
  """Old BERT-style names (``LayerNorm.gamma`` / ``.beta``) as today's (``.weight`` / ``.bias``)."""
  if name.endswith(".gamma"):
    return name[: -len("gamma")] + "weight"
  if name.endswith(".beta"):
    return name[: -len("beta")] + "bias"
  return name


def distilbert_params_from_hf(
  tensors: Mapping[str, np.ndarray],
  config: DistilBertConfig,
  key: Optional[jax.Array] = None,
) -> Tuple[Dict[str, Any], List[str]]:
  """The :class:`DistilBertClassifier` parameters held in a Hugging Face DistilBERT state dict.

  Names are those of ``distilbert-base-uncased`` (``distilbert.embeddings.word_embeddings.weight``,
  ``distilbert.transformer.layer.{i}.attention.q_lin.weight``, ...; ``LayerNorm.gamma`` /
  ``.beta`` accepted for ``.weight`` / ``.bias``) and of ``DistilBertForSequenceClassification``
  (``pre_classifier.*``, ``classifier.*``). torch ``Linear`` weights (``[out, in]``) are
  transposed to Flax kernels (``[in, out]``). The masked-LM head of the base checkpoint
  (``vocab_transform``, ``vocab_layer_norm``, ``vocab_projector``) is ignored. The classification
  head is optional: when the file has none (the base checkpoint), ``pre_classifier`` and
  ``classifier`` are freshly initialized from ``key`` (default ``PRNGKey(0)``) and reported.

  Args:
    tensors: ``{name: array}``, e.g. from :func:`~fedjax_dro.models.weights.read_safetensors`.
    config: the model's configuration (its sizes are checked against the tensors').
    key: the random key of a fresh classification head.

  Returns:
    ``(params, initialized)``: the parameter pytree (NumPy arrays in ``config.param_dtype``) for
    ``DistilBertClassifier(config).apply({"params": params}, tokens)``, and the Hugging Face
    names of the tensors the file lacked and that were freshly initialized (empty when the file
    has a classification head).

  Raises:
    ValueError: one error listing every missing, unexpected and mis-shaped tensor (a head given
      in part counts as missing the rest).
  """
  layout = _hf_layout(config)
  found = {_canonical(name): (name, value) for name, value in tensors.items()}
  has_head = any(k in found for k in _HEAD)
  transposed = {k for k in layout if k.endswith(".weight") and "lin" in k.split(".")[-2]}
  transposed |= {"pre_classifier.weight", "classifier.weight"}
  params, absent = params_from_layout(
    layout,
    found,
    _IGNORED,
    config.param_dtype,
    "DistilBERT",
    optional=() if has_head else _HEAD,
    transposed=transposed,
  )
  if absent:
    key = jax.random.PRNGKey(0) if key is None else key
    zeros = jnp.zeros((1, config.dim), config.dtype)
    for name, (k, n) in zip(
      ("pre_classifier", "classifier"), zip(jax.random.split(key), (config.dim, config.num_labels))
    ):
      fresh = _dense(config, n, name).init(k, zeros)["params"]
      params[name] = jax.tree.map(np.asarray, fresh)
  return params, absent


def distilbert(size: str = "base", **overrides) -> DistilBertClassifier:
  """DistilBERT for sequence classification (Sanh, Debut, Chaumond, Wolf 2019, arXiv:1910.01108),
  as a Flax linen module.

  Args:
    size: ``"base"`` (``distilbert-base-uncased``'s shapes: 6 layers, 12 heads, width 768,
      vocabulary 30522) or ``"tiny"`` (two layers of width 32, no dropout).
    **overrides: any :class:`DistilBertConfig` field (``num_labels``, ``dropout``, ...).

  Returns:
    A :class:`DistilBertClassifier` mapping integer tokens ``[m, T]`` to class logits
    ``[m, num_labels]`` (the checkpoint's tensors load with :func:`distilbert_params_from_hf`).
  """
  if size not in ("base", "tiny"):
    raise ValueError(f"size must be 'base' or 'tiny', got {size!r}")
  config = DistilBertConfig.tiny(**overrides) if size == "tiny" else DistilBertConfig(**overrides)
  return DistilBertClassifier(config)
