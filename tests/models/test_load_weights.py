"""``load_weights``: a safetensors file under the publishers' names loads, through the mapping of
the module's family, to exactly the tensors written (bitwise, in Flax's layout); modules of other
types and pickle checkpoints are refused. And ResNet's ``features_only``: the input of ``fc``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro.models.densenet import DenseNet
from fedjax_dro.models.distilbert import DistilBertClassifier, DistilBertConfig
from fedjax_dro.models.gpt2 import GPT2, GPT2Config
from fedjax_dro.models.lstm import LSTMConfig, LSTMLanguageModel
from fedjax_dro.models.resnet import ResNet, resnet18
from fedjax_dro.models.weights import load_weights, write_safetensors
from tests.models.test_zoo_language import hf_distilbert_tensors, hf_gpt2_tensors
from tests.models.test_zoo_vision import (
  check_loaded,
  densenet_shapes,
  random_tensors,
  resnet_shapes,
)


def f32(tensors):
  return {k: np.asarray(v, np.float32) if v.dtype.kind == "f" else v for k, v in tensors.items()}


def write(tmp_path, tensors, name="model.safetensors"):
  path = tmp_path / name
  write_safetensors(path, tensors, metadata={"format": "pt"})
  return path


def test_resnet18_full_key_layout(tmp_path):
  """The real resnet18 state dict's 122 names (num_batches_tracked included), 10 classes."""
  t = f32(random_tensors(resnet_shapes((2, 2, 2, 2), False, 64, 3, 10, "imagenet")))
  module = resnet18(10)
  variables = load_weights(module, write(tmp_path, t))
  assert set(variables) == {"params", "batch_stats"}
  check_loaded(t, variables, module, np.zeros((1, 32, 32, 3), np.float32))  # bitwise, each
  k = variables["params"]["layer2_0"]["downsample_0"]["kernel"]
  assert k.dtype == np.float32 and k.shape == (1, 1, 64, 128)
  assert np.array_equal(k[0, 0], t["layer2.0.downsample.0.weight"][:, :, 0, 0].T)
  assert np.array_equal(variables["batch_stats"]["bn1"]["var"], t["bn1.running_var"])
  assert np.array_equal(variables["params"]["fc"]["kernel"], t["fc.weight"].T)


def test_group_norm_resnet_has_no_batch_stats(tmp_path):
  t = f32(random_tensors(resnet_shapes((1, 1), False, 8, 3, 4, "cifar", "group")))
  module = ResNet((1, 1), num_classes=4, num_filters=8, norm="group", groups=2, stem="cifar")
  variables = load_weights(module, write(tmp_path, t))
  assert set(variables) == {"params"}
  check_loaded(t, variables, module, np.zeros((1, 8, 8, 3), np.float32))


def test_tiny_densenet(tmp_path):
  t = f32(random_tensors(densenet_shapes(4, (2, 3, 2), 8, 2, 3, 5)))
  module = DenseNet(growth_rate=4, block_config=(2, 3, 2), num_init_features=8, bn_size=2)
  module = module.clone(num_classes=5)
  variables = load_weights(module, write(tmp_path, t))
  check_loaded(t, variables, module, np.zeros((1, 32, 32, 3), np.float32))
  assert np.array_equal(
    variables["params"]["classifier"]["kernel"], t["classifier.weight"].T
  ) and np.array_equal(variables["batch_stats"]["norm5"]["mean"], t["features.norm5.running_mean"])


def test_gpt2(tmp_path):
  cfg = GPT2Config.tiny()
  t = f32(hf_gpt2_tensors(cfg))
  variables = load_weights(GPT2(cfg), write(tmp_path, t))
  assert set(variables) == {"params"}
  p = variables["params"]
  assert np.array_equal(p["wte"]["embedding"], t["wte.weight"])
  assert np.array_equal(p["h_1"]["attn"]["c_attn"]["kernel"], t["h.1.attn.c_attn.weight"])
  assert np.array_equal(p["ln_f"]["bias"], t["ln_f.bias"])
  tokens = jnp.array([[1, 2, 3]])
  assert GPT2(cfg).apply(variables, tokens).shape == (1, 3, cfg.vocab_size)


def test_distilbert_with_and_without_a_head(tmp_path):
  cfg = DistilBertConfig.tiny()
  module = DistilBertClassifier(cfg)
  t = f32(hf_distilbert_tensors(cfg))
  p = load_weights(module, write(tmp_path, t))["params"]
  q = "distilbert.transformer.layer.1.attention.q_lin.weight"
  assert np.array_equal(p["layer_1"]["attention"]["q_lin"]["kernel"], t[q].T)
  assert np.array_equal(p["classifier"]["bias"], t["classifier.bias"])
  base = f32(hf_distilbert_tensors(cfg, head=False, mlm_head=True))
  path = write(tmp_path, base, "base.safetensors")
  with pytest.warns(UserWarning, match=r"no classification head.*pre_classifier\.weight"):
    a = load_weights(module, path, key=jax.random.PRNGKey(3))["params"]
  with pytest.warns(UserWarning):
    b = load_weights(module, path, key=jax.random.PRNGKey(4))["params"]
  e = "distilbert.embeddings.word_embeddings.weight"
  assert np.array_equal(a["embeddings"]["word_embeddings"]["embedding"], base[e])
  assert not np.array_equal(a["classifier"]["kernel"], b["classifier"]["kernel"])  # from key


def test_other_module_types_are_refused_with_the_supported_list(tmp_path):
  path = write(tmp_path, {"w": np.zeros(2, np.float32)})
  with pytest.raises(TypeError, match="LSTMLanguageModel.*ResNet, DenseNet, GPT2, Distil"):
    load_weights(LSTMLanguageModel(LSTMConfig.shakespeare()), path)


@pytest.mark.parametrize("suffix", [".pth", ".bin"])
def test_pickle_checkpoints_are_refused_unread(tmp_path, suffix):
  path = tmp_path / f"resnet18{suffix}"
  path.write_bytes(b"\x80\x04 not read")
  with pytest.raises(ValueError, match="refusing to load a .*pickle"):
    load_weights(resnet18(10), path)


def test_features_only_is_the_input_of_fc():
  t = random_tensors(resnet_shapes((1, 1), False, 8, 3, 4, "cifar"))
  module = ResNet((1, 1), num_classes=4, num_filters=8, stem="cifar")
  from fedjax_dro.models.resnet import resnet_variables_from_torchvision

  variables = resnet_variables_from_torchvision(t, module)
  x = np.random.default_rng(0).normal(size=(3, 8, 8, 3))
  feats = module.clone(features_only=True).apply(variables, x, train=False)
  assert feats.shape == (3, 16)
  logits = module.apply(variables, x, train=False)
  np.testing.assert_allclose(logits, feats @ t["fc.weight"].T + t["fc.bias"], rtol=1e-12)
  init = jax.eval_shape(lambda: module.clone(features_only=True).init(jax.random.PRNGKey(0), x[:1]))
  assert "fc" not in init["params"]
