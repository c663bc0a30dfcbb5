"""The vision zoo (ResNet-18/50, DenseNet-121, pfl-research's CIFAR-10 CNN) against NumPy
implementations written here from the same weights (float64, 1e-10 relative): inference with
running statistics, training-mode BatchNorm (batch statistics and the updated running averages),
dropout; full-size parameter counts equal torchvision's; torchvision-named tensors load into
exactly those values, and a bad state dict names every problem in one error."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dro.models.cifar_cnn import CifarCNN, cifar_cnn
from fedjax_dro.models.densenet import DenseNet, densenet121, densenet_variables_from_torchvision
from fedjax_dro.models.resnet import (
  BasicBlock,
  Bottleneck,
  ResNet,
  resnet18,
  resnet50,
  resnet_variables_from_torchvision,
)

EPS = 1e-5

# NumPy reference (NHWC activations, torch-layout weights) -----------------------------------------


def conv(x, w, stride=1, pad=0, bias=None):
  """Cross-correlation of NHWC ``x`` with OIHW ``w``: a sum over the kernel's offsets of each
  offset's strided patch times that offset's [out, in] matrix."""
  n, h, wd, _ = x.shape
  o, _, kh, kw = w.shape
  xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
  out = np.zeros((n, ho, wo, o))
  for a in range(kh):
    for b in range(kw):
      patch = xp[:, a : a + stride * (ho - 1) + 1 : stride, b : b + stride * (wo - 1) + 1 : stride]
      out += np.einsum("nhwc,oc->nhwo", patch, w[:, :, a, b])
  return out if bias is None else out + bias


def maxpool(x, k, stride, pad=0):
  """torch's MaxPool2d: padding with -inf."""
  xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=-np.inf)
  ho, wo = (xp.shape[1] - k) // stride + 1, (xp.shape[2] - k) // stride + 1
  out = np.full((x.shape[0], ho, wo, x.shape[3]), -np.inf)
  for i in range(ho):
    for j in range(wo):
      win = xp[:, i * stride : i * stride + k, j * stride : j * stride + k]
      out[:, i, j] = win.max(axis=(1, 2))
  return out


def avgpool2(x):
  n, h, w, c = x.shape
  return x[:, : h // 2 * 2, : w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def relu(x):
  return np.maximum(x, 0.0)


def batchnorm(x, t, key, train, new):
  """Eval: running statistics. Train: the batch's mean and biased variance, and the running
  averages 0.9 * old + 0.1 * batch written into ``new``."""
  if train:
    mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
    new[key + ".running_mean"] = 0.9 * t[key + ".running_mean"] + 0.1 * mean
    new[key + ".running_var"] = 0.9 * t[key + ".running_var"] + 0.1 * var
  else:
    mean, var = t[key + ".running_mean"], t[key + ".running_var"]
  return (x - mean) / np.sqrt(var + EPS) * t[key + ".weight"] + t[key + ".bias"]


def groupnorm(x, t, key, groups):
  n, h, w, c = x.shape
  xr = x.reshape(n, h, w, groups, c // groups)
  mean = xr.mean(axis=(1, 2, 4), keepdims=True)
  var = xr.var(axis=(1, 2, 4), keepdims=True)
  y = ((xr - mean) / np.sqrt(var + EPS)).reshape(x.shape)
  return y * t[key + ".weight"] + t[key + ".bias"]


def ref_resnet(t, x, stage_sizes, bottleneck, stem, norm, groups, train=False):
  new = {}

  def nrm(y, key):
    return batchnorm(y, t, key, train, new) if norm == "batch" else groupnorm(y, t, key, groups)

  if stem == "imagenet":
    x = maxpool(relu(nrm(conv(x, t["conv1.weight"], 2, 3), "bn1")), 3, 2, 1)
  else:
    x = relu(nrm(conv(x, t["conv1.weight"], 1, 1), "bn1"))
  for i, size in enumerate(stage_sizes):
    for j in range(size):
      p, s = f"layer{i + 1}.{j}", 2 if i > 0 and j == 0 else 1
      if bottleneck:
        y = relu(nrm(conv(x, t[p + ".conv1.weight"]), p + ".bn1"))
        y = relu(nrm(conv(y, t[p + ".conv2.weight"], s, 1), p + ".bn2"))
        y = nrm(conv(y, t[p + ".conv3.weight"]), p + ".bn3")
      else:
        y = relu(nrm(conv(x, t[p + ".conv1.weight"], s, 1), p + ".bn1"))
        y = nrm(conv(y, t[p + ".conv2.weight"], 1, 1), p + ".bn2")
      r = x
      if p + ".downsample.0.weight" in t:
        r = nrm(conv(x, t[p + ".downsample.0.weight"], s), p + ".downsample.1")
      x = relu(y + r)
  return x.mean(axis=(1, 2)) @ t["fc.weight"].T + t["fc.bias"], new


def ref_densenet(t, x, block_config, train=False):
  new = {}
  f = "features."
  x = conv(x, t[f + "conv0.weight"], 2, 3)
  x = maxpool(relu(batchnorm(x, t, f + "norm0", train, new)), 3, 2, 1)
  for b, layers in enumerate(block_config):
    for m in range(layers):
      p = f"{f}denseblock{b + 1}.denselayer{m + 1}."
      y = conv(relu(batchnorm(x, t, p + "norm1", train, new)), t[p + "conv1.weight"])
      y = conv(relu(batchnorm(y, t, p + "norm2", train, new)), t[p + "conv2.weight"], 1, 1)
      x = np.concatenate([x, y], axis=-1)
    if b != len(block_config) - 1:
      p = f"{f}transition{b + 1}."
      x = avgpool2(conv(relu(batchnorm(x, t, p + "norm", train, new)), t[p + "conv.weight"]))
  x = relu(batchnorm(x, t, f + "norm5", train, new)).mean(axis=(1, 2))
  return x @ t["classifier.weight"].T + t["classifier.bias"], new


# torchvision's state-dict names and shapes ---------------------------------------------------------


def _norm_shapes(shapes, key, c, norm="batch"):
  shapes[key + ".weight"] = shapes[key + ".bias"] = (c,)
  if norm == "batch":
    shapes[key + ".running_mean"] = shapes[key + ".running_var"] = (c,)
    shapes[key + ".num_batches_tracked"] = ()


def resnet_shapes(stage_sizes, bottleneck, width, in_ch, classes, stem, norm="batch"):
  """torchvision's ``ResNet.state_dict()`` names and shapes (``_make_layer``'s logic)."""
  s = {"conv1.weight": (width, in_ch) + ((7, 7) if stem == "imagenet" else (3, 3))}
  _norm_shapes(s, "bn1", width, norm)
  inplanes, expansion = width, 4 if bottleneck else 1
  for i, size in enumerate(stage_sizes):
    planes = width * 2**i
    for j in range(size):
      p, stride = f"layer{i + 1}.{j}", 2 if i > 0 and j == 0 else 1
      if bottleneck:
        convs = [(planes, inplanes, 1, 1), (planes, planes, 3, 3), (planes * 4, planes, 1, 1)]
      else:
        convs = [(planes, inplanes, 3, 3), (planes, planes, 3, 3)]
      for k, shape in enumerate(convs):
        s[f"{p}.conv{k + 1}.weight"] = shape
        _norm_shapes(s, f"{p}.bn{k + 1}", shape[0], norm)
      if j == 0 and (stride != 1 or inplanes != planes * expansion):
        s[p + ".downsample.0.weight"] = (planes * expansion, inplanes, 1, 1)
        _norm_shapes(s, p + ".downsample.1", planes * expansion, norm)
      inplanes = planes * expansion
  s["fc.weight"], s["fc.bias"] = (classes, inplanes), (classes,)
  return s


def densenet_shapes(growth, block_config, init, bn_size, in_ch, classes):
  """torchvision's ``DenseNet.state_dict()`` names and shapes."""
  s = {"features.conv0.weight": (init, in_ch, 7, 7)}
  _norm_shapes(s, "features.norm0", init)
  c = init
  for b, layers in enumerate(block_config):
    for m in range(layers):
      p = f"features.denseblock{b + 1}.denselayer{m + 1}."
      _norm_shapes(s, p + "norm1", c)
      s[p + "conv1.weight"] = (bn_size * growth, c, 1, 1)
      _norm_shapes(s, p + "norm2", bn_size * growth)
      s[p + "conv2.weight"] = (growth, bn_size * growth, 3, 3)
      c += growth
    if b != len(block_config) - 1:
      p = f"features.transition{b + 1}."
      _norm_shapes(s, p + "norm", c)
      s[p + "conv.weight"] = (c // 2, c, 1, 1)
      c //= 2
  _norm_shapes(s, "features.norm5", c)
  s["classifier.weight"], s["classifier.bias"] = (classes, c), (classes,)
  return s


def random_tensors(shapes, seed=0):
  """Weights at scales that keep activations O(1), BatchNorm statistics away from the batch's."""
  rng = np.random.default_rng(seed)
  t = {}
  for key, shape in shapes.items():
    leaf = key.rsplit(".", 1)[1]
    if leaf == "num_batches_tracked":
      t[key] = np.array(7, np.int64)
    elif leaf == "running_var" or (leaf == "weight" and len(shape) == 1):
      t[key] = rng.uniform(0.5, 1.5, shape)
    elif leaf in ("running_mean", "bias"):
      t[key] = 0.1 * rng.normal(size=shape)
    else:
      t[key] = rng.normal(size=shape) * np.sqrt(2.0 / np.prod(shape[1:]))
  return t


def torch_to_flax_path(key):
  """``layer1.0.downsample.1.running_mean`` -> ("batch_stats", "layer1_0", "downsample_1",
  "mean"): written independently of the loader."""
  parts = key.split(".")
  if parts[0] == "features":
    parts = parts[1:]
  mods, leaf = [], parts[-1]
  for p in parts[:-1]:
    if p.isdigit():
      mods[-1] += "_" + p
    else:
      mods.append(p)
  collection = "batch_stats" if leaf.startswith("running") else "params"
  name = {"running_mean": "mean", "running_var": "var", "bias": "bias"}.get(leaf)
  if name is None:  # weight: a kernel (conv, linear) or a norm's scale
    name = "scale" if re.fullmatch(r"(bn|norm|downsample_1)\w*", mods[-1]) else "kernel"
  return (collection, *mods, name)


def leaf_at(tree, path):
  for p in path:
    tree = tree[p]
  return tree


def check_loaded(t, variables, module, x):
  """Every tensor (but num_batches_tracked) sits bitwise at its Flax path in Flax's layout; the
  structure and shapes are those of ``module.init``."""
  for key, value in t.items():
    if key.endswith("num_batches_tracked"):
      continue
    got = np.asarray(leaf_at(variables, torch_to_flax_path(key)))
    want = value.transpose(2, 3, 1, 0) if value.ndim == 4 else value.T
    assert got.dtype == value.dtype and np.array_equal(got, want), key
  init = jax.eval_shape(lambda x: module.init(jax.random.PRNGKey(0), x), x)
  assert jax.tree.structure(init) == jax.tree.structure(variables)
  assert [a.shape for a in jax.tree.leaves(init)] == [a.shape for a in jax.tree.leaves(variables)]


def assert_close(got, want):
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == np.float64 and got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


def check_against_reference(module, load, t, x, reference):
  """Inference against ``reference(train)``; for BatchNorm models also a training pass: the
  outputs and the updated ``batch_stats`` (the reference's new running averages, loaded)."""
  variables = load(t, module)
  check_loaded(t, variables, module, x)
  want, _ = reference(False)
  assert_close(module.apply(variables, x, train=False), want)
  if "batch_stats" in variables:
    got, state = module.apply(variables, x, train=True, mutable=["batch_stats"])
    want, new = reference(True)
    assert_close(got, want)
    assert set(new) == {k for k in t if k.rsplit(".", 1)[1].startswith("running")}
    want_stats = load({**t, **new}, module)["batch_stats"]
    jax.tree.map(assert_close, state["batch_stats"], want_stats)


# ResNet --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_ch", [3, 8])
@pytest.mark.parametrize("norm", ["batch", "group"])
@pytest.mark.parametrize("stem", ["imagenet", "cifar"])
def test_resnet18_equals_numpy(stem, norm, in_ch):
  """ResNet-18's blocks at width 8 (GroupNorm: 4 groups) on 2 x 16 x 16 x in_ch."""
  module = resnet18(10, num_filters=8, norm=norm, groups=4, stem=stem)
  t = random_tensors(resnet_shapes((2, 2, 2, 2), False, 8, in_ch, 10, stem, norm))
  x = np.random.default_rng(1).normal(size=(2, 16, 16, in_ch))
  ref = lambda train: ref_resnet(t, x, (2, 2, 2, 2), False, stem, norm, 4, train)
  check_against_reference(module, resnet_variables_from_torchvision, t, x, ref)


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_bottleneck_resnet_equals_numpy(norm):
  """ResNet-50's bottleneck blocks (stride on the 3x3) at width 4, stages (2, 2, 1)."""
  module = ResNet((2, 2, 1), Bottleneck, num_classes=5, num_filters=4, norm=norm, groups=2)
  t = random_tensors(resnet_shapes((2, 2, 1), True, 4, 3, 5, "imagenet", norm), seed=2)
  x = np.random.default_rng(3).normal(size=(2, 16, 16, 3))
  ref = lambda train: ref_resnet(t, x, (2, 2, 1), True, "imagenet", norm, 2, train)
  check_against_reference(module, resnet_variables_from_torchvision, t, x, ref)


def test_full_width_resnet18_real_names_equal_numpy():
  """The real resnet18 state dict's 122 names and shapes (1000 classes), on 1 x 16 x 16 x 3."""
  shapes = resnet_shapes((2, 2, 2, 2), False, 64, 3, 1000, "imagenet")
  assert len(shapes) == 122
  t = random_tensors(shapes, seed=4)
  x = np.random.default_rng(5).normal(size=(1, 16, 16, 3))
  module = resnet18()
  variables = resnet_variables_from_torchvision(t, module)
  check_loaded(t, variables, module, x)
  want, _ = ref_resnet(t, x, (2, 2, 2, 2), False, "imagenet", "batch", 32)
  assert_close(module.apply(variables, x), want)


def test_resnet_in_channels_default_and_group_norm_loading():
  t = random_tensors(resnet_shapes((1, 1), False, 8, 5, 3, "cifar", "group"))
  module = ResNet((1, 1), BasicBlock, num_classes=3, num_filters=8, norm="group", groups=2)
  module = module.clone(stem="cifar")
  variables = resnet_variables_from_torchvision(t, module)  # 5 channels read off conv1.weight
  assert set(variables) == {"params"}
  check_loaded(t, variables, module, np.zeros((1, 8, 8, 5)))


# DenseNet ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_ch", [3, 2])
def test_tiny_densenet_equals_numpy(in_ch):
  """Growth 4, blocks (2, 3, 2), 8 initial features, bn_size 2 on 2 x 32 x 32 x in_ch."""
  blocks = (2, 3, 2)
  module = DenseNet(growth_rate=4, block_config=blocks, num_init_features=8, bn_size=2)
  module = module.clone(num_classes=6)
  t = random_tensors(densenet_shapes(4, blocks, 8, 2, in_ch, 6), seed=6)
  x = np.random.default_rng(7).normal(size=(2, 32, 32, in_ch))
  ref = lambda train: ref_densenet(t, x, blocks, train)
  check_against_reference(module, densenet_variables_from_torchvision, t, x, ref)


# Parameter counts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "make, count, torch_shapes",
  [
    (resnet18, 11_689_512, resnet_shapes((2, 2, 2, 2), False, 64, 3, 1000, "imagenet")),
    (resnet50, 25_557_032, resnet_shapes((3, 4, 6, 3), True, 64, 3, 1000, "imagenet")),
    (densenet121, 7_978_856, densenet_shapes(32, (6, 12, 24, 16), 64, 4, 3, 1000)),
  ],
)
def test_full_size_parameter_counts_equal_torchvision(make, count, torch_shapes):
  """Counted on shapes only (jax.eval_shape); the state dicts' non-buffer tensors count as much,
  and zeros with those names and shapes load into a tree of init's structure."""
  module, x = make(), jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32)
  shapes = jax.eval_shape(lambda x: module.init(jax.random.PRNGKey(0), x), x)
  assert sum(a.size for a in jax.tree.leaves(shapes["params"])) == count
  buffers = ("running_mean", "running_var", "num_batches_tracked")
  assert sum(int(np.prod(s)) for k, s in torch_shapes.items() if not k.endswith(buffers)) == count
  stats = sum(a.size for a in jax.tree.leaves(shapes["batch_stats"]))
  assert stats == sum(int(np.prod(s)) for k, s in torch_shapes.items() if "running" in k)
  zeros = {k: np.zeros(s, np.float32) for k, s in torch_shapes.items()}
  load = densenet_variables_from_torchvision if make is densenet121 else None
  load = load or resnet_variables_from_torchvision
  loaded = load(zeros, module)
  assert jax.tree.structure(loaded) == jax.tree.structure(shapes)
  assert [a.shape for a in jax.tree.leaves(loaded)] == [a.shape for a in jax.tree.leaves(shapes)]


# Loader errors -------------------------------------------------------------------------------------


def test_resnet_loader_names_every_problem_in_one_error():
  module = resnet18(10, num_filters=8)
  t = random_tensors(resnet_shapes((2, 2, 2, 2), False, 8, 3, 10, "imagenet"))
  del t["layer1.0.conv1.weight"]
  t["layer5.0.conv1.weight"] = np.zeros((8, 8, 3, 3))
  t["fc.bias"] = np.zeros(11)
  with pytest.raises(ValueError) as err:
    resnet_variables_from_torchvision(t, module)
  msg = str(err.value)
  for name in ["missing: layer1.0.conv1.weight", "unexpected: layer5.0.conv1.weight", "fc.bias"]:
    assert name in msg
  assert "(11,)" in msg and "(10,)" in msg


def test_densenet_loader_names_every_problem_in_one_error():
  module = DenseNet(growth_rate=4, block_config=(2, 2), num_init_features=8, bn_size=2)
  t = random_tensors(densenet_shapes(4, (2, 2), 8, 2, 3, 1000))
  del t["features.norm5.running_var"]
  t["features.norm6.weight"] = np.zeros(3)
  t["features.transition1.conv.weight"] = np.zeros((8, 16, 3, 3))
  with pytest.raises(ValueError) as err:
    densenet_variables_from_torchvision(t, module)
  msg = str(err.value)
  for name in [
    "features.norm5.running_var",
    "features.norm6.weight",
    "features.transition1.conv.weight",
  ]:
    assert name in msg


# pfl-research's CIFAR-10 CNN -----------------------------------------------------------------------


def ref_cifar_cnn(p, x, masks=None):
  """``masks``: the two dropouts' keep masks (train mode), else eval."""
  x = relu(conv(x, p["conv1"]["kernel"].transpose(3, 2, 0, 1), bias=p["conv1"]["bias"]))
  x = relu(conv(x, p["conv2"]["kernel"].transpose(3, 2, 0, 1), bias=p["conv2"]["bias"]))
  x = maxpool(x, 2, 2)
  if masks is not None:
    x = np.where(masks[0], x / 0.75, 0.0)
  x = relu(x.reshape(x.shape[0], -1) @ p["dense1"]["kernel"] + p["dense1"]["bias"])
  if masks is not None:
    x = np.where(masks[1], x / 0.5, 0.0)
  return x @ p["dense2"]["kernel"] + p["dense2"]["bias"]


def test_cifar_cnn_equals_numpy_in_eval_and_with_dropout():
  module = cifar_cnn()
  assert isinstance(module, CifarCNN) and (module.dropout, module.dense_dropout) == (0.25, 0.5)
  x = np.random.default_rng(8).normal(size=(2, 12, 12, 3))
  variables = module.init(jax.random.PRNGKey(0), x)
  variables = jax.tree.map(lambda a: np.asarray(a, np.float64), variables)
  p = variables["params"]
  eval_out = module.apply(variables, x)
  assert_close(eval_out, ref_cifar_cnn(p, x))
  train_out, state = module.apply(
    variables, x, train=True, rngs={"dropout": jax.random.PRNGKey(1)}, capture_intermediates=True
  )
  assert not np.allclose(train_out, eval_out)
  inter = state["intermediates"]
  # The kept units are the dropouts' non-zero outputs (a zero input contributes zero either way).
  masks = [np.asarray(inter[f"Dropout_{i}"]["__call__"][0]) != 0 for i in range(2)]
  assert masks[0].mean() < 0.85 and masks[1].mean() < 0.6
  assert_close(train_out, ref_cifar_cnn(p, x, masks))
  other = module.apply(variables, x, train=True, rngs={"dropout": jax.random.PRNGKey(2)})
  assert not np.allclose(other, train_out)
