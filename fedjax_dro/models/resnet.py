"""ResNet-18 and ResNet-50 as Flax linen modules, with torchvision's structure and weight names.

K. He, X. Zhang, S. Ren and J. Sun, "Deep Residual Learning for Image Recognition", CVPR 2016
(arXiv:1512.03385). ResNet-18 stacks basic blocks (two 3x3 convolutions), ResNet-50 bottleneck
blocks (1x1, 3x3, 1x1 with 4x expansion) whose stride sits on the 3x3 convolution, as torchvision's
"v1.5" does. Group normalization (``norm="group"``) is that of Y. Wu and K. He, "Group
Normalization", ECCV 2018 (arXiv:1803.08494).

Written as Flax's ImageNet example writes its ResNet: NHWC inputs, a ``train`` flag, and BatchNorm's
running averages in the ``batch_stats`` collection (``mutable=["batch_stats"]`` when training); a
``mask [m]`` keyword restricts BatchNorm's training statistics to the rows where it is True (as
``models.from_flax`` passes it).
BatchNorm uses torchvision's momentum and epsilon (a running average ``0.9 * old + 0.1 * batch``,
eps 1e-5); one difference remains: Flax's running variance averages the batch's biased variance,
PyTorch's the unbiased one (``n / (n - 1)`` times it), which matters for training only.

Submodules are named after torchvision's (``conv1``, ``bn1``, ``layer1_0``, ``downsample_0``...):
:func:`resnet_variables_from_torchvision` loads a torchvision state dict (or timm's
``resnet50.tv_in1k`` safetensors, which use the same names).
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any, Callable, Dict, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# torchvision initializes convolutions with kaiming_normal_(mode="fan_out", nonlinearity="relu").
conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


def rows(mask, y):
  """The row mask ``[m]`` broadcast against ``y [m, ...]`` (None: every row)."""
  return None if mask is None else mask.reshape((-1,) + (1,) * (y.ndim - 1))


def _norm(norm: str, groups: int, train: bool, name: str, mask=None):
  """The norm layer ``name`` as a function of its input; BatchNorm's training statistics are
  those of the rows where ``mask [m]`` is True (None: all rows)."""
  if norm == "batch":
    bn = nn.BatchNorm(
      use_running_average=not train, momentum=0.9, epsilon=1e-5, use_fast_variance=False, name=name
    )
    return lambda y: bn(y, mask=rows(mask, y))
  if norm == "group":
    return nn.GroupNorm(num_groups=groups, epsilon=1e-5, use_fast_variance=False, name=name)
  raise ValueError(f'norm must be "batch" or "group", got {norm!r}')


class BasicBlock(nn.Module):
  """Two 3x3 convolutions and a shortcut (a strided 1x1 convolution and a norm when the shape
  changes); ``expansion`` 1."""

  filters: int
  strides: int = 1
  norm: str = "batch"
  groups: int = 32
  expansion = 1

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    conv = partial(nn.Conv, use_bias=False, kernel_init=conv_init)
    norm = partial(_norm, self.norm, self.groups, train, mask=mask)
    s = (self.strides, self.strides)
    y = conv(self.filters, (3, 3), s, padding=((1, 1), (1, 1)), name="conv1")(x)
    y = nn.relu(norm("bn1")(y))
    y = conv(self.filters, (3, 3), padding=((1, 1), (1, 1)), name="conv2")(y)
    y = norm("bn2")(y)
    residual = x
    if self.strides != 1 or x.shape[-1] != self.filters * self.expansion:
      residual = conv(self.filters * self.expansion, (1, 1), s, name="downsample_0")(x)
      residual = norm("downsample_1")(residual)
    return nn.relu(y + residual)


class Bottleneck(nn.Module):
  """1x1 (``filters``), 3x3 (``filters``, strided: torchvision's v1.5), 1x1 (``4 * filters``)
  convolutions and a shortcut; ``expansion`` 4."""

  filters: int
  strides: int = 1
  norm: str = "batch"
  groups: int = 32
  expansion = 4

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    conv = partial(nn.Conv, use_bias=False, kernel_init=conv_init)
    norm = partial(_norm, self.norm, self.groups, train, mask=mask)
    s = (self.strides, self.strides)
    y = nn.relu(norm("bn1")(conv(self.filters, (1, 1), name="conv1")(x)))
    y = conv(self.filters, (3, 3), s, padding=((1, 1), (1, 1)), name="conv2")(y)
    y = nn.relu(norm("bn2")(y))
    y = norm("bn3")(conv(self.filters * self.expansion, (1, 1), name="conv3")(y))
    residual = x
    if self.strides != 1 or x.shape[-1] != self.filters * self.expansion:
      residual = conv(self.filters * self.expansion, (1, 1), s, name="downsample_0")(x)
      residual = norm("downsample_1")(residual)
    return nn.relu(y + residual)


class ResNet(nn.Module):
  """A ResNet on NHWC images with any number of channels.

  Attributes:
    stage_sizes: blocks per stage (``layer1``, ``layer2``...); stages after the first halve the
      resolution and double the width.
    block_cls: :class:`BasicBlock` or :class:`Bottleneck`.
    num_classes: outputs of the final dense layer (``fc``).
    num_filters: width of the stem and the first stage (64 in the paper).
    norm: ``"batch"`` (BatchNorm, running statistics in ``batch_stats``) or ``"group"``
      (GroupNorm with ``groups`` groups).
    groups: GroupNorm's number of groups (32 as in Wu & He); it must divide every width.
    stem: ``"imagenet"`` (7x7/2 convolution, norm, ReLU, 3x3/2 max pool with padding 1) or
      ``"cifar"`` (3x3/1 convolution, norm, ReLU, no pooling).
    features_only: return the penultimate features (the global average pool, ``fc``'s input:
      512-d for ResNet-18, 2048-d for ResNet-50) instead of the logits; ``fc`` is then not
      created, and the variables of the full module apply unchanged (``fc``'s are ignored):
      ``module.clone(features_only=True).apply(variables, x, train=False)``.
  """

  stage_sizes: Sequence[int]
  block_cls: Any = BasicBlock
  num_classes: int = 1000
  num_filters: int = 64
  norm: str = "batch"
  groups: int = 32
  stem: str = "imagenet"
  features_only: bool = False

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    conv = partial(nn.Conv, use_bias=False, kernel_init=conv_init)
    if self.stem == "imagenet":
      x = conv(self.num_filters, (7, 7), (2, 2), padding=((3, 3), (3, 3)), name="conv1")(x)
      x = nn.relu(_norm(self.norm, self.groups, train, "bn1", mask)(x))
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    elif self.stem == "cifar":
      x = conv(self.num_filters, (3, 3), padding=((1, 1), (1, 1)), name="conv1")(x)
      x = nn.relu(_norm(self.norm, self.groups, train, "bn1", mask)(x))
    else:
      raise ValueError(f'stem must be "imagenet" or "cifar", got {self.stem!r}')
    for i, size in enumerate(self.stage_sizes):
      for j in range(size):
        strides = 2 if i > 0 and j == 0 else 1
        x = self.block_cls(
          self.num_filters * 2**i,
          strides=strides,
          norm=self.norm,
          groups=self.groups,
          name=f"layer{i + 1}_{j}",
        )(x, train=train, mask=mask)
    x = jnp.mean(x, axis=(1, 2))
    if self.features_only:
      return x
    return nn.Dense(self.num_classes, name="fc")(x)


def resnet18(num_classes: int = 1000, **kwargs) -> ResNet:
  """ResNet-18 (basic blocks, stages (2, 2, 2, 2)); ``kwargs``: :class:`ResNet`'s ``norm``,
  ``groups``, ``stem``, ``num_filters``, ``features_only``. 11,689,512 parameters with 1000 classes."""
  return ResNet(stage_sizes=(2, 2, 2, 2), block_cls=BasicBlock, num_classes=num_classes, **kwargs)


def resnet50(num_classes: int = 1000, **kwargs) -> ResNet:
  """ResNet-50 (bottleneck blocks, stages (3, 4, 6, 3)); ``kwargs`` as :func:`resnet18`'s.
  25,557,032 parameters with 1000 classes."""
  return ResNet(stage_sizes=(3, 4, 6, 3), block_cls=Bottleneck, num_classes=num_classes, **kwargs)


# Loading torchvision weights ----------------------------------------------------------------------

_LEAF_NAMES = {
  ("params", "kernel"): "weight",
  ("params", "bias"): "bias",
  ("params", "scale"): "weight",
  ("batch_stats", "mean"): "running_mean",
  ("batch_stats", "var"): "running_var",
}


def _torch_key(collection: str, path: Sequence[str], prefix: Callable[[str], str]) -> str:
  modules = [re.sub(r"_(\d+)$", r".\1", p) for p in path[:-1]]
  return prefix(modules[0]) + ".".join(modules + [_LEAF_NAMES[collection, path[-1]]])


def _from_torch(value: np.ndarray, leaf: str, ndim: int) -> np.ndarray:
  """A torch tensor in Flax's layout: conv OIHW -> HWIO, Linear [out, in] -> [in, out]."""
  if leaf == "kernel" and ndim == 4:
    return np.ascontiguousarray(np.transpose(value, (2, 3, 1, 0)))
  if leaf == "kernel" and ndim == 2:
    return np.ascontiguousarray(value.T)
  return value


def _to_torch_shape(shape: Sequence[int], leaf: str) -> tuple:
  if leaf == "kernel" and len(shape) == 4:
    return (shape[3], shape[2], shape[0], shape[1])
  if leaf == "kernel" and len(shape) == 2:
    return (shape[1], shape[0])
  return tuple(shape)


def variables_from_torch(
  tensors: Dict[str, Any],
  module: nn.Module,
  sample_input: Any,
  prefix: Callable[[str], str] = lambda first: "",
) -> Dict[str, Any]:
  """``module``'s variables (``{"params": ..., "batch_stats": ...}``) from the tensors of a PyTorch
  state dict whose names are the module's paths joined by dots (``layer1_0`` -> ``layer1.0``,
  preceded by ``prefix(first module name)``). Every missing, unexpected or mis-shaped tensor is
  named in one ValueError; ``num_batches_tracked`` of a BatchNorm is accepted and ignored."""
  init = lambda x: module.init(jax.random.PRNGKey(0), x, train=False)
  shapes = jax.eval_shape(init, sample_input)  # shapes only: no weights are computed
  expected = {}  # torch key -> (collection, path, flax shape)
  bn_modules = set()
  for collection, tree in shapes.items():
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      names = tuple(str(k.key) for k in path)
      key = _torch_key(collection, names, prefix)
      expected[key] = (collection, names, tuple(leaf.shape))
      if collection == "batch_stats":
        bn_modules.add(key.rsplit(".", 1)[0])
  missing = sorted(k for k in expected if k not in tensors)
  unexpected, misshaped = [], []
  out: Dict[str, Any] = {}
  for key in sorted(tensors):
    if key not in expected:
      module_key, _, leaf = key.rpartition(".")
      if not (leaf == "num_batches_tracked" and module_key in bn_modules):
        unexpected.append(key)
      continue
    collection, names, shape = expected[key]
    value = np.asarray(tensors[key])
    want = _to_torch_shape(shape, names[-1])
    if value.shape != want:
      misshaped.append(f"{key} (shape {value.shape}, expected {want})")
      continue
    node = out.setdefault(collection, {})
    for name in names[:-1]:
      node = node.setdefault(name, {})
    node[names[-1]] = _from_torch(value, names[-1], value.ndim)
  problems = []
  if missing:
    problems.append("missing: " + ", ".join(missing))
  if unexpected:
    problems.append("unexpected: " + ", ".join(unexpected))
  if misshaped:
    problems.append("mis-shaped: " + ", ".join(misshaped))
  if problems:
    raise ValueError(
      f"the tensors do not fit {type(module).__name__}'s variables; " + "; ".join(problems)
    )
  return out


def in_channels_of(tensors: Dict[str, Any], key: str) -> int:
  shape = np.shape(tensors[key]) if key in tensors else ()
  return int(shape[1]) if len(shape) == 4 else 3


def resnet_variables_from_torchvision(
  tensors: Dict[str, Any], module: ResNet, in_channels: int | None = None
) -> Dict[str, Any]:
  """``{"params": ..., "batch_stats": ...}`` of ``module`` (a :class:`ResNet`) from torchvision's
  ``resnet18`` / ``resnet50`` state dict (``conv1.weight``, ``bn1.running_mean``,
  ``layer1.0.conv1.weight``, ``layer2.0.downsample.0.weight``, ``fc.weight``...; timm's
  ``resnet50.tv_in1k`` safetensors use the same names), as NumPy arrays: convolutions OIHW ->
  HWIO, ``fc.weight`` transposed, running statistics into ``batch_stats``,
  ``num_batches_tracked`` ignored. ``in_channels``: the images' channels (by default
  ``conv1.weight``'s second dimension, else 3). Every missing, unexpected or mis-shaped tensor is
  named in one ValueError."""
  in_channels = in_channels or in_channels_of(tensors, "conv1.weight")
  sample = jax.ShapeDtypeStruct((1, 64, 64, in_channels), jnp.float32)
  return variables_from_torch(tensors, module, sample)
