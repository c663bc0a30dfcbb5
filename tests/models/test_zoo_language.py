"""The language-model zoo: GPT-2, DistilBERT and the LSTM language models equal NumPy
implementations of their papers' equations (float64, tiny configurations), Hugging Face's
tensor names load through the pure-NumPy safetensors reader, bad files and pickles are refused
with one error, and the language-model loss equals a hand computation."""

import json
import math
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro.models.builtin import from_flax
from fedjax_dro.models.distilbert import (
  DistilBertClassifier,
  DistilBertConfig,
  distilbert_params_from_hf,
)
from fedjax_dro.models.gpt2 import GPT2, GPT2Config, gpt2_params_from_hf
from fedjax_dro.models.lstm import LSTMConfig, LSTMLanguageModel, lm_loss_and_metrics
from fedjax_dro.models.weights import read_safetensors, refuse_pickle_formats, write_safetensors

F64 = dict(dtype=jnp.float64, param_dtype=jnp.float64)
RTOL = 1e-10


def assert_close(actual, expected):
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.shape == expected.shape
  scale = np.max(np.abs(expected))
  np.testing.assert_allclose(actual, expected, rtol=0, atol=RTOL * scale)


# ---------------------------------------------------------------- NumPy references


def np_layer_norm(x, g, b, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * g + b


def np_softmax(s):
  e = np.exp(s - s.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def np_gelu_erf(x):
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def np_attention(q, k, v, n_head, allowed):
  """q, k, v [T, d]; allowed [T, T] (query, key) -> [T, d], per head."""
  t, d = q.shape
  hd = d // n_head
  out = np.zeros((t, d))
  for h in range(n_head):
    sl = slice(h * hd, (h + 1) * hd)
    s = q[:, sl] @ k[:, sl].T / math.sqrt(hd)
    s = np.where(allowed, s, -np.inf)
    out[:, sl] = np_softmax(s) @ v[:, sl]
  return out


def np_gpt2(w, tokens, cfg):
  """GPT-2 from Hugging Face-named tensors ``w`` (Conv1D weights [in, out])."""
  outs = []
  for seq in tokens:
    t = len(seq)
    x = w["wte.weight"][seq] + w["wpe.weight"][:t]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg.n_layer):
      p = lambda n, i=i: w[f"h.{i}.{n}"]
      h = np_layer_norm(x, p("ln_1.weight"), p("ln_1.bias"), 1e-5)
      qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
      q, k, v = np.split(qkv, 3, axis=-1)
      a = np_attention(q, k, v, cfg.n_head, causal)
      x = x + a @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
      h = np_layer_norm(x, p("ln_2.weight"), p("ln_2.bias"), 1e-5)
      h = np_gelu_tanh(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"))
      x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = np_layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    outs.append(x @ w["wte.weight"].T)
  return np.stack(outs)


def np_distilbert(w, tokens, mask, cfg):
  """DistilBERT classifier from Hugging Face-named tensors (torch Linear weights [out, in])."""
  lin = lambda x, n: x @ w[f"{n}.weight"].T + w[f"{n}.bias"]
  ln = lambda x, n: np_layer_norm(x, w[f"{n}.weight"], w[f"{n}.bias"], 1e-12)
  outs = []
  for seq, keep in zip(tokens, mask):
    t = len(seq)
    e = "distilbert.embeddings"
    x = w[f"{e}.word_embeddings.weight"][seq] + w[f"{e}.position_embeddings.weight"][:t]
    x = ln(x, f"{e}.LayerNorm")
    allowed = np.broadcast_to(keep[None, :].astype(bool), (t, t))
    for i in range(cfg.n_layers):
      pre = f"distilbert.transformer.layer.{i}"
      q, k, v = (lin(x, f"{pre}.attention.{n}_lin") for n in "qkv")
      a = lin(np_attention(q, k, v, cfg.n_heads, allowed), f"{pre}.attention.out_lin")
      h = ln(a + x, f"{pre}.sa_layer_norm")
      f = lin(np_gelu_erf(lin(h, f"{pre}.ffn.lin1")), f"{pre}.ffn.lin2")
      x = ln(f + h, f"{pre}.output_layer_norm")
    pooled = np.maximum(lin(x[0], "pre_classifier"), 0)
    outs.append(lin(pooled, "classifier"))
  return np.stack(outs)


def np_lstm_lm(params, tokens, cfg):
  """Embedding, LSTM layers (gates i, f, g, o as flax's OptimizedLSTMCell: ``i = sigmoid(x W_ii
  + h W_hi + b_hi)``, ..., ``c' = f c + i g``, ``h' = o tanh(c')``), projection, output layer."""
  p = jax.tree.map(np.asarray, params)
  sig = lambda z: 1 / (1 + np.exp(-z))
  x = p["embed"]["embedding"][tokens]  # [m, T, e]
  for i, hidden in enumerate(cfg.hidden_sizes):
    cell = p[f"lstm_{i}"]
    m, t, _ = x.shape
    h, c = np.zeros((m, hidden)), np.zeros((m, hidden))
    out = []
    for s in range(t):
      z = {
        g: x[:, s] @ cell[f"i{g}"]["kernel"] + h @ cell[f"h{g}"]["kernel"] + cell[f"h{g}"]["bias"]
        for g in "ifgo"
      }
      c = sig(z["f"]) * c + sig(z["i"]) * np.tanh(z["g"])
      h = sig(z["o"]) * np.tanh(c)
      out.append(h)
    x = np.stack(out, 1)
  if cfg.projection:
    x = x @ p["projection"]["kernel"] + p["projection"]["bias"]
  return x @ p["logits"]["kernel"] + p["logits"]["bias"]


# ---------------------------------------------------------------- Hugging Face-named tensors


def hf_gpt2_tensors(cfg, seed=0):
  """Random tensors under openai-community/gpt2's names and shapes, with its attention-mask
  buffers (h.{i}.attn.bias, [1, 1, n_positions, n_positions])."""
  rng = np.random.default_rng(seed)
  d, w = cfg.n_embd, {}
  r = lambda *s: 0.3 * rng.normal(size=s)
  w["wte.weight"], w["wpe.weight"] = r(cfg.vocab_size, d), r(cfg.n_positions, d)
  for i in range(cfg.n_layer):
    for ln in ("ln_1", "ln_2"):
      w[f"h.{i}.{ln}.weight"], w[f"h.{i}.{ln}.bias"] = 1 + r(d), r(d)
    for name, (a, b) in {
      "attn.c_attn": (d, 3 * d),
      "attn.c_proj": (d, d),
      "mlp.c_fc": (d, 4 * d),
      "mlp.c_proj": (4 * d, d),
    }.items():
      w[f"h.{i}.{name}.weight"], w[f"h.{i}.{name}.bias"] = r(a, b), r(b)
    w[f"h.{i}.attn.bias"] = np.tril(np.ones((cfg.n_positions,) * 2))[None, None]
  w["ln_f.weight"], w["ln_f.bias"] = 1 + r(d), r(d)
  return w


def hf_distilbert_tensors(cfg, seed=0, head=True, mlm_head=False):
  """Random tensors under distilbert-base-uncased's names (torch Linear weights [out, in]);
  ``head``: DistilBertForSequenceClassification's pre_classifier and classifier;
  ``mlm_head``: DistilBertForMaskedLM's vocab_* tensors, as the base checkpoint has."""
  rng = np.random.default_rng(seed)
  d, hd, w = cfg.dim, cfg.hidden_dim, {}
  r = lambda *s: 0.3 * rng.normal(size=s)
  e = "distilbert.embeddings"
  w[f"{e}.word_embeddings.weight"] = r(cfg.vocab_size, d)
  w[f"{e}.position_embeddings.weight"] = r(cfg.max_position_embeddings, d)
  w[f"{e}.LayerNorm.weight"], w[f"{e}.LayerNorm.bias"] = 1 + r(d), r(d)
  linears = {"attention.q_lin": (d, d), "attention.k_lin": (d, d), "attention.v_lin": (d, d)}
  linears.update({"attention.out_lin": (d, d), "ffn.lin1": (hd, d), "ffn.lin2": (d, hd)})
  for i in range(cfg.n_layers):
    pre = f"distilbert.transformer.layer.{i}"
    for name, (o, n) in linears.items():
      w[f"{pre}.{name}.weight"], w[f"{pre}.{name}.bias"] = r(o, n), r(o)
    for ln in ("sa_layer_norm", "output_layer_norm"):
      w[f"{pre}.{ln}.weight"], w[f"{pre}.{ln}.bias"] = 1 + r(d), r(d)
  if head:
    w["pre_classifier.weight"], w["pre_classifier.bias"] = r(d, d), r(d)
    w["classifier.weight"], w["classifier.bias"] = r(cfg.num_labels, d), r(cfg.num_labels)
  if mlm_head:
    w["vocab_transform.weight"], w["vocab_transform.bias"] = r(d, d), r(d)
    w["vocab_layer_norm.weight"], w["vocab_layer_norm.bias"] = 1 + r(d), r(d)
    w["vocab_projector.bias"] = r(cfg.vocab_size)
  return w


def tokens_for(vocab, shape, seed=1):
  return np.random.default_rng(seed).integers(1, vocab, size=shape)


def random_params(module, tokens, seed=0):
  """Normal random values (biases too, so that every term of the equations counts) in the
  shapes of ``module``'s parameters (from ``eval_shape``: flax's orthogonal initializer of the
  recurrent kernels takes seconds to compile and is not what is tested)."""
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.asarray(tokens)))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: 0.3 * rng.normal(size=a.shape), shapes["params"])


# ---------------------------------------------------------------- safetensors


def test_safetensors_round_trip_of_every_dtype_and_metadata(tmp_path):
  rng = np.random.default_rng(0)
  tensors = {
    "a.f64": rng.normal(size=(3, 4)),
    "b.f32": rng.normal(size=(5,)).astype(np.float32),
    "c.f16": rng.normal(size=(2, 3)).astype(np.float16),
    "d.i64": rng.integers(-(2**40), 2**40, size=(4,)),
    "e.i32": rng.integers(-100, 100, size=(2, 2)).astype(np.int32),
    "f.u8": rng.integers(0, 255, size=(7,)).astype(np.uint8),
    "g.bool": rng.random(size=(3,)) > 0.5,
    "h.scalar": np.float64(2.5),
    "i.empty": np.zeros((0, 3), np.float32),
  }
  path = tmp_path / "m.safetensors"
  write_safetensors(path, tensors, metadata={"format": "np"})
  raw = path.read_bytes()
  (n,) = struct.unpack("<Q", raw[:8])
  header = json.loads(raw[8 : 8 + n])
  assert n % 8 == 0 and header["__metadata__"] == {"format": "np"}
  assert header["c.f16"]["dtype"] == "F16" and header["d.i64"]["dtype"] == "I64"
  back = read_safetensors(path)
  assert set(back) == set(tensors)
  for k, v in tensors.items():
    assert back[k].dtype == np.asarray(v).dtype and back[k].shape == np.shape(v), k
    assert back[k].tobytes() == np.asarray(v).tobytes(), k
  back["a.f64"][0, 0] = 1.0  # writable
  big = np.arange(3, dtype=">f4")  # written little-endian
  write_safetensors(path, {"big": big})
  back = read_safetensors(path)["big"]
  assert back.dtype == np.dtype("<f4") and back.tolist() == [0.0, 1.0, 2.0]


def test_bf16_round_trips_and_widens_to_float32_exactly(tmp_path):
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.bfloat16)
  path = tmp_path / "bf16.safetensors"
  write_safetensors(path, {"w": np.asarray(x)})
  raw = path.read_bytes()
  (n,) = struct.unpack("<Q", raw[:8])
  assert json.loads(raw[8 : 8 + n])["w"]["dtype"] == "BF16"
  back = read_safetensors(path)["w"]
  assert back.dtype == np.float32
  np.testing.assert_array_equal(back, np.asarray(x, np.float32))
  # hand-made BF16 bits: 1.0 = 0x3F80, -2.0 = 0xC000, 0.15625 = 0x3E20
  bits = np.array([0x3F80, 0xC000, 0x3E20], "<u2").tobytes()
  head = json.dumps({"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
  path.write_bytes(struct.pack("<Q", len(head)) + head + bits)
  np.testing.assert_array_equal(read_safetensors(path)["x"], [1.0, -2.0, 0.15625])


def _file(path, header, buffer, n=None):
  text = json.dumps(header).encode() if isinstance(header, dict) else header
  path.write_bytes(struct.pack("<Q", len(text) if n is None else n) + text + buffer)
  return path


def test_bad_safetensors_files_give_one_error_naming_the_file(tmp_path):
  good = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
  f = tmp_path / "f.safetensors"
  cases = {
    "truncated buffer": (good, b"\0" * 4, None, "'w'"),
    "header past the end": (good, b"\0" * 8, 10**6, "header length"),
    "not JSON": (b"{not json", b"", None, "JSON"),
    "unknown dtype": ({"w": {**good["w"], "dtype": "Q7"}}, b"\0" * 8, None, "'w'"),
    "byte count": ({"w": {**good["w"], "shape": [3]}}, b"\0" * 8, None, "'w'"),
    "overlap": (
      {
        "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
      },
      b"\0" * 12,
      None,
      "overlap",
    ),
    "trailing bytes": (good, b"\0" * 12, None, "trailing"),
    "duplicate names": (
      b'{"w": '
      + json.dumps(good["w"]).encode()
      + b', "w": '
      + json.dumps(good["w"]).encode()
      + b"}",
      b"\0" * 8,
      None,
      "duplicate names ['w']",
    ),
  }
  for what, (header, buffer, n, words) in cases.items():
    _file(f, header, buffer, n)
    with pytest.raises(ValueError) as e:
      read_safetensors(f)
    assert str(f) in str(e.value) and words in str(e.value), what
  f.write_bytes(b"\x01\x02")
  with pytest.raises(ValueError, match="fewer than the 8"):
    read_safetensors(f)


@pytest.mark.parametrize("suffix", [".bin", ".pth", ".pt", ".pkl", ".ckpt"])
def test_pickle_checkpoints_are_refused_with_the_reason(tmp_path, suffix):
  path = tmp_path / f"pytorch_model{suffix}"
  path.write_bytes(b"\x80\x04not-to-be-unpickled")
  for call in (refuse_pickle_formats, read_safetensors):
    with pytest.raises(ValueError) as e:
      call(path)
    text = str(e.value)
    assert str(path) in text and "pickle" in text and "arbitrary code" in text
    assert "safetensors.torch.save_file" in text
  refuse_pickle_formats(tmp_path / "model.safetensors")  # fine


# ---------------------------------------------------------------- GPT-2


def test_gpt2_forward_equals_numpy_and_is_causal():
  cfg = GPT2Config.tiny(**F64)
  w = hf_gpt2_tensors(cfg)
  params = gpt2_params_from_hf(w, cfg)
  tokens = tokens_for(cfg.vocab_size, (3, 9))
  logits = GPT2(cfg).apply({"params": params}, jnp.asarray(tokens))
  assert logits.shape == (3, 9, cfg.vocab_size) and logits.dtype == jnp.float64
  assert_close(logits, np_gpt2(w, tokens, cfg))
  changed = tokens.copy()
  changed[:, 5:] = (changed[:, 5:] + 1) % cfg.vocab_size
  later = GPT2(cfg).apply({"params": params}, jnp.asarray(changed))
  np.testing.assert_array_equal(later[:, :5], logits[:, :5])
  assert not np.allclose(later[:, 5:], logits[:, 5:])


def test_init_params_have_the_tree_the_hf_mapping_fills():
  shapes = lambda t: jax.tree.map(lambda a: (tuple(a.shape), np.dtype(a.dtype)), t)
  tokens = jnp.ones((1, 4), jnp.int32)
  cfg = GPT2Config.tiny(**F64)
  init = jax.eval_shape(lambda: GPT2(cfg).init(jax.random.PRNGKey(0), tokens))["params"]
  assert shapes(init) == shapes(gpt2_params_from_hf(hf_gpt2_tensors(cfg), cfg))
  cfg = DistilBertConfig.tiny(**F64)
  init = jax.eval_shape(lambda: DistilBertClassifier(cfg).init(jax.random.PRNGKey(0), tokens))
  mapped, _ = distilbert_params_from_hf(hf_distilbert_tensors(cfg), cfg)
  assert shapes(init["params"]) == shapes(mapped)


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_gpt2_loads_a_safetensors_file_with_the_publishers_names(tmp_path, prefix):
  cfg = GPT2Config.tiny(**F64)
  w = hf_gpt2_tensors(cfg)
  stored = {prefix + k: v for k, v in w.items()}
  if prefix:
    stored["lm_head.weight"] = w["wte.weight"]  # GPT2LMHeadModel's tied copy
  path = tmp_path / "model.safetensors"
  write_safetensors(path, stored, metadata={"format": "pt"})
  params = gpt2_params_from_hf(read_safetensors(path), cfg)
  for leaf, name in [
    (params["wte"]["embedding"], "wte.weight"),
    (params["h_1"]["attn"]["c_attn"]["kernel"], "h.1.attn.c_attn.weight"),
    (params["h_0"]["mlp"]["c_proj"]["bias"], "h.0.mlp.c_proj.bias"),
    (params["ln_f"]["scale"], "ln_f.weight"),
  ]:
    assert leaf.tobytes() == w[name].tobytes(), name
  tokens = tokens_for(cfg.vocab_size, (2, cfg.n_positions))
  assert_close(GPT2(cfg).apply({"params": params}, jnp.asarray(tokens)), np_gpt2(w, tokens, cfg))


def test_gpt2_missing_unexpected_and_misshaped_tensors_in_one_error():
  cfg = GPT2Config.tiny(**F64)
  w = hf_gpt2_tensors(cfg)
  del w["h.1.ln_2.bias"]
  w["h.0.attn.rotary.weight"] = np.zeros(3)
  w["h.0.mlp.c_fc.weight"] = w["h.0.mlp.c_fc.weight"].T  # [out, in]: a torch Linear's layout
  with pytest.raises(ValueError) as e:
    gpt2_params_from_hf(w, cfg)
  text = str(e.value)
  assert "missing: h.1.ln_2.bias" in text
  assert "unexpected: h.0.attn.rotary.weight" in text
  assert "h.0.mlp.c_fc.weight: (128, 32), expected (32, 128)" in text


# ---------------------------------------------------------------- DistilBERT


def padded_tokens(cfg, shape=(3, 8), lengths=(8, 5, 2)):
  tokens = tokens_for(cfg.vocab_size, shape)
  mask = np.arange(shape[1])[None] < np.asarray(lengths)[:, None]
  return np.where(mask, tokens, cfg.pad_token_id), mask


def test_distilbert_forward_equals_numpy_with_a_padding_mask():
  cfg = DistilBertConfig.tiny(**F64)
  w = hf_distilbert_tensors(cfg)
  params, fresh = distilbert_params_from_hf(w, cfg)
  assert fresh == []
  tokens, mask = padded_tokens(cfg)
  model = DistilBertClassifier(cfg)
  logits = model.apply({"params": params}, jnp.asarray(tokens))  # mask from the pad id
  assert logits.shape == (3, cfg.num_labels)
  assert_close(logits, np_distilbert(w, tokens, mask, cfg))
  explicit = model.apply({"params": params}, jnp.asarray(tokens), jnp.asarray(mask, jnp.int32))
  np.testing.assert_array_equal(explicit, logits)
  # what stands at the padded positions does not matter
  other = np.where(mask, tokens, 7)
  np.testing.assert_allclose(
    model.apply({"params": params}, jnp.asarray(other), jnp.asarray(mask)), logits, atol=1e-12
  )


def test_distilbert_loads_the_base_checkpoint_names_and_initializes_the_head(tmp_path):
  cfg = DistilBertConfig.tiny(**F64)
  w = hf_distilbert_tensors(cfg, head=False, mlm_head=True)
  path = tmp_path / "model.safetensors"
  write_safetensors(path, w)
  params, fresh = distilbert_params_from_hf(read_safetensors(path), cfg, jax.random.PRNGKey(3))
  assert fresh == [
    "pre_classifier.weight",
    "pre_classifier.bias",
    "classifier.weight",
    "classifier.bias",
  ]
  q = "distilbert.transformer.layer.1.attention.q_lin"
  kernel = params["layer_1"]["attention"]["q_lin"]["kernel"]
  assert kernel.tobytes() == np.ascontiguousarray(w[f"{q}.weight"].T).tobytes()  # transposed
  assert params["layer_1"]["attention"]["q_lin"]["bias"].tobytes() == w[f"{q}.bias"].tobytes()
  emb = params["embeddings"]["word_embeddings"]["embedding"]
  assert emb.tobytes() == w["distilbert.embeddings.word_embeddings.weight"].tobytes()
  # the fresh head, written back under its Hugging Face names, completes the reference
  full = dict(w)
  for name in ("pre_classifier", "classifier"):
    full[f"{name}.weight"] = np.asarray(params[name]["kernel"]).T
    full[f"{name}.bias"] = np.asarray(params[name]["bias"])
  assert np.asarray(params["classifier"]["kernel"]).shape == (cfg.dim, cfg.num_labels)
  tokens, mask = padded_tokens(cfg)
  logits = DistilBertClassifier(cfg).apply({"params": params}, jnp.asarray(tokens))
  assert_close(logits, np_distilbert(full, tokens, mask, cfg))


def test_distilbert_accepts_gamma_beta_layer_norm_names():
  cfg = DistilBertConfig.tiny(**F64)
  w = hf_distilbert_tensors(cfg)
  rename = lambda k: k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(".bias", ".beta")
  old = {(rename(k) if "LayerNorm" in k else k): v for k, v in w.items()}
  assert "distilbert.embeddings.LayerNorm.gamma" in old
  a, _ = distilbert_params_from_hf(w, cfg)
  b, _ = distilbert_params_from_hf(old, cfg)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_distilbert_missing_unexpected_and_misshaped_tensors_in_one_error():
  cfg = DistilBertConfig.tiny(**F64)
  w = hf_distilbert_tensors(cfg)
  del w["distilbert.transformer.layer.0.ffn.lin2.bias"]
  del w["classifier.bias"]  # a head in part: the rest counts as missing
  w["distilbert.embeddings.token_type_embeddings.weight"] = np.zeros((2, cfg.dim))
  w["distilbert.transformer.layer.1.ffn.lin1.weight"] = np.zeros((cfg.dim, cfg.hidden_dim))
  with pytest.raises(ValueError) as e:
    distilbert_params_from_hf(w, cfg)
  text = str(e.value)
  assert "missing: distilbert.transformer.layer.0.ffn.lin2.bias, classifier.bias" in text
  assert "unexpected: distilbert.embeddings.token_type_embeddings.weight" in text
  assert "distilbert.transformer.layer.1.ffn.lin1.weight: (32, 64), expected (64, 32)" in text


# ---------------------------------------------------------------- LSTM and the LM loss


def test_lstm_forward_equals_numpy():
  cfg = LSTMConfig.tiny(**F64)
  model = LSTMLanguageModel(cfg)
  tokens = tokens_for(cfg.vocab_size, (3, 6))
  params = random_params(model, tokens)
  assert set(params["lstm_0"]) == {"ii", "if", "ig", "io", "hi", "hf", "hg", "ho"}
  logits = model.apply({"params": params}, jnp.asarray(tokens))
  assert logits.shape == (3, 6, cfg.vocab_size) and logits.dtype == jnp.float64
  assert_close(logits, np_lstm_lm(params, tokens, cfg))


def test_lstm_presets():
  shakespeare, so = LSTMConfig.shakespeare(), LSTMConfig.stackoverflow()
  assert (shakespeare.vocab_size, shakespeare.embed_size) == (90, 8)
  assert tuple(shakespeare.hidden_sizes) == (256, 256) and shakespeare.projection is None
  assert (so.vocab_size, so.embed_size, tuple(so.hidden_sizes), so.projection) == (
    10004,
    96,
    (670,),
    96,
  )
  shapes = jax.eval_shape(
    lambda: LSTMLanguageModel(so).init(jax.random.PRNGKey(0), jnp.ones((1, 3), jnp.int32))
  )["params"]
  assert shapes["projection"]["kernel"].shape == (670, 96)
  assert shapes["logits"]["kernel"].shape == (96, 10004)
  assert shapes["lstm_0"]["ii"]["kernel"].shape == (96, 670)


def test_lm_loss_and_metrics_against_a_hand_computation():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 4, 5))
  y = np.array([[2, 4, 1, 0], [3, 0, 0, 0], [0, 0, 0, 0]])  # pad id 0
  logits[0, 0, 2] = 9.0  # a hit
  logits[0, 1, 3] = 9.0  # a miss (the target is 4)
  loss_fn, metrics_fn = lm_loss_and_metrics()
  ce = lambda i, t: np.log(np.exp(logits[i, t]).sum()) - logits[i, t, y[i, t]]
  expected = [(ce(0, 0) + ce(0, 1) + ce(0, 2)) / 3, ce(1, 0), 0.0]
  np.testing.assert_allclose(loss_fn(jnp.asarray(logits), jnp.asarray(y)), expected, rtol=1e-13)
  hits = lambda i, n: np.mean([np.argmax(logits[i, t]) == y[i, t] for t in range(n)])
  metrics = metrics_fn(jnp.asarray(logits), jnp.asarray(y))
  np.testing.assert_allclose(metrics["accuracy"], [hits(0, 3), hits(1, 1), 0.0], rtol=1e-13)
  np.testing.assert_allclose(metrics["log_perplexity"], expected, rtol=1e-13)
  # another pad id: 0 becomes a target, 4 is ignored
  loss4, _ = lm_loss_and_metrics(pad_id=4)
  y4 = np.where(y == 4, 0, np.where(y == 0, 4, y))
  y4[2] = 0
  got = loss4(jnp.asarray(logits), jnp.asarray(y4))
  ce4 = lambda i, t: np.log(np.exp(logits[i, t]).sum()) - logits[i, t, y4[i, t]]
  expected4 = [
    (ce4(0, 0) + ce4(0, 1) + ce4(0, 2)) / 3,
    ce4(1, 0),
    np.mean([ce4(2, t) for t in range(4)]),
  ]
  np.testing.assert_allclose(got, expected4, rtol=1e-13)


def test_from_flax_accepts_integer_tokens_for_the_lstm_and_gpt2():
  loss_fn, metrics_fn = lm_loss_and_metrics()
  tokens = tokens_for(11, (2, 5))
  for module in (LSTMLanguageModel(LSTMConfig.tiny(**F64)), GPT2(GPT2Config.tiny(**F64))):
    model = from_flax(module, tokens, loss=loss_fn, metrics=metrics_fn, task="classification")
    assert model.name == type(module).__name__ and "int64[5]" in model.identity
    params = random_params(module, tokens)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    assert jax.tree.structure(shapes) == jax.tree.structure(params)
    out = model.apply(params, jnp.asarray(tokens))
    assert out.shape[:2] == (2, 5)
    assert model.loss(out, jnp.asarray(tokens)).shape == (2,)
    assert set(model.metrics(out, jnp.asarray(tokens))) == {"accuracy", "log_perplexity"}


def test_text_classifier_starts_from_the_file_with_a_fresh_head_per_key(tmp_path):
  from fedjax_dro.models.start import text_classifier

  cfg = DistilBertConfig.tiny(vocab_size=40, num_labels=2, max_position_embeddings=8)
  w = hf_distilbert_tensors(cfg, head=False, mlm_head=True)
  path = tmp_path / "model.safetensors"
  write_safetensors(path, {k: v.astype(np.float32) for k, v in w.items()})
  sample = np.ones((2, 8), np.int32)
  model = text_classifier(sample, 2, vocab_size=40, pad_id=0, weights=str(path), size="tiny")
  plain = text_classifier(sample, 2, vocab_size=40, pad_id=0, size="tiny")
  a, b = model.init(jax.random.PRNGKey(1)), model.init(jax.random.PRNGKey(2))
  emb = w["distilbert.embeddings.word_embeddings.weight"].astype(np.float32)
  assert np.asarray(a["embeddings"]["word_embeddings"]["embedding"]).tobytes() == emb.tobytes()
  q = w["distilbert.transformer.layer.1.attention.q_lin.weight"].astype(np.float32).T
  assert np.array_equal(np.asarray(a["layer_1"]["attention"]["q_lin"]["kernel"]), q)
  # the head: the run's own fresh draw, as the plain model draws it from the same key
  fresh = plain.init(jax.random.PRNGKey(1))
  for k in ("pre_classifier", "classifier"):
    assert np.array_equal(np.asarray(a[k]["kernel"]), np.asarray(fresh[k]["kernel"]))
  assert not np.array_equal(np.asarray(a["classifier"]["kernel"]), b["classifier"]["kernel"])
  assert model.apply(a, jnp.asarray(sample)).shape == (2, 2)
  with pytest.raises(ValueError, match="vocab|word_embeddings"):
    text_classifier(sample, 2, vocab_size=41, pad_id=0, weights=str(path), size="tiny")
  with pytest.raises(ValueError, match="integer token rows"):
    text_classifier(np.ones((2, 8), np.float32), 2, vocab_size=40, pad_id=0, size="tiny")
