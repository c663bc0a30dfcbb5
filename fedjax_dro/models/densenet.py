"""DenseNet-121 as a Flax linen module, with torchvision's structure and weight names.

G. Huang, Z. Liu, L. van der Maaten and K. Q. Weinberger, "Densely Connected Convolutional
Networks", CVPR 2017 (arXiv:1608.06993). torchvision's DenseNet-BC: a 7x7/2 convolution, BatchNorm,
ReLU and 3x3/2 max pool stem; dense blocks of (6, 12, 24, 16) layers, each layer BN-ReLU-1x1 conv
(``bn_size * growth_rate`` channels)-BN-ReLU-3x3 conv (``growth_rate`` channels) whose output is
concatenated to its input; transitions BN-ReLU-1x1 conv (compression 0.5)-2x2 average pool; a final
BatchNorm, ReLU, global average pool and the classifier.

Written as Flax's ImageNet example writes its ResNet: NHWC inputs, a ``train`` flag (and a
``mask [m]`` of the rows BatchNorm's training statistics count, as ``models.from_flax`` passes
it), BatchNorm's running averages in ``batch_stats`` (momentum 0.9, eps 1e-5 as torchvision; Flax's running
variance averages the biased batch variance, PyTorch's the unbiased one). Submodules are named
after torchvision's (``conv0``, ``denseblock1`` / ``denselayer1`` / ``norm1``, ``transition1``,
``norm5``, ``classifier``): :func:`densenet_variables_from_torchvision` loads torchvision's state
dict or timm's ``densenet121.tv_in1k`` safetensors.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Dict, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_dro.models.resnet import conv_init, in_channels_of, rows, variables_from_torch


def _bn(train: bool, name: str, mask=None):
  """BatchNorm ``name`` as a function of its input; its training statistics are those of the
  rows where ``mask [m]`` is True (None: all rows)."""
  bn = nn.BatchNorm(
    use_running_average=not train, momentum=0.9, epsilon=1e-5, use_fast_variance=False, name=name
  )
  return lambda y: bn(y, mask=rows(mask, y))


class DenseLayer(nn.Module):
  """BN-ReLU-1x1 conv-BN-ReLU-3x3 conv; returns the input with the ``growth_rate`` new channels
  concatenated (torchvision's ``_DenseLayer`` with ``drop_rate`` 0)."""

  growth_rate: int
  bn_size: int

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    conv = partial(nn.Conv, use_bias=False, kernel_init=conv_init)
    y = nn.relu(_bn(train, "norm1", mask)(x))
    y = conv(self.bn_size * self.growth_rate, (1, 1), name="conv1")(y)
    y = nn.relu(_bn(train, "norm2", mask)(y))
    y = conv(self.growth_rate, (3, 3), padding=((1, 1), (1, 1)), name="conv2")(y)
    return jnp.concatenate([x, y], axis=-1)


class DenseBlock(nn.Module):
  """``num_layers`` dense layers (``denselayer1``, ``denselayer2``...)."""

  num_layers: int
  growth_rate: int
  bn_size: int

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    for i in range(self.num_layers):
      x = DenseLayer(self.growth_rate, self.bn_size, name=f"denselayer{i + 1}")(
        x, train=train, mask=mask
      )
    return x


class Transition(nn.Module):
  """BN-ReLU-1x1 conv to ``features`` channels-2x2/2 average pool."""

  features: int

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    x = nn.relu(_bn(train, "norm", mask)(x))
    x = nn.Conv(self.features, (1, 1), use_bias=False, kernel_init=conv_init, name="conv")(x)
    return nn.avg_pool(x, (2, 2), strides=(2, 2))


class DenseNet(nn.Module):
  """A DenseNet-BC on NHWC images with any number of channels; the defaults are DenseNet-121's
  (7,978,856 parameters with 1000 classes). A tiny configuration for tests:
  ``DenseNet(growth_rate=4, block_config=(2, 2), num_init_features=8, bn_size=2)``.

  Attributes:
    growth_rate: channels each dense layer adds (32).
    block_config: layers per dense block ((6, 12, 24, 16)).
    num_init_features: channels of the stem's convolution (64).
    bn_size: the bottleneck's width as a multiple of ``growth_rate`` (4).
    compression: a transition's output channels as a fraction of its input's (0.5).
    num_classes: outputs of ``classifier``.
  """

  growth_rate: int = 32
  block_config: Sequence[int] = (6, 12, 24, 16)
  num_init_features: int = 64
  bn_size: int = 4
  compression: float = 0.5
  num_classes: int = 1000

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    x = nn.Conv(
      self.num_init_features,
      (7, 7),
      (2, 2),
      padding=((3, 3), (3, 3)),
      use_bias=False,
      kernel_init=conv_init,
      name="conv0",
    )(x)
    x = nn.relu(_bn(train, "norm0", mask)(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    features = self.num_init_features
    for i, num_layers in enumerate(self.block_config):
      x = DenseBlock(num_layers, self.growth_rate, self.bn_size, name=f"denseblock{i + 1}")(
        x, train=train, mask=mask
      )
      features += num_layers * self.growth_rate
      if i != len(self.block_config) - 1:
        features = int(features * self.compression)
        x = Transition(features, name=f"transition{i + 1}")(x, train=train, mask=mask)
    x = nn.relu(_bn(train, "norm5", mask)(x))  # torchvision's name, whatever the block count
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes, bias_init=nn.initializers.zeros, name="classifier")(x)


def densenet121(num_classes: int = 1000, **kwargs) -> DenseNet:
  """DenseNet-121 (growth 32, blocks (6, 12, 24, 16), bn_size 4, compression 0.5)."""
  return DenseNet(num_classes=num_classes, **kwargs)


def densenet_variables_from_torchvision(
  tensors: Dict[str, Any], module: DenseNet, in_channels: int | None = None
) -> Dict[str, Any]:
  """``{"params": ..., "batch_stats": ...}`` of ``module`` (a :class:`DenseNet`) from
  torchvision's ``densenet121`` state dict (``features.conv0.weight``, ``features.norm0.*``,
  ``features.denseblock{b}.denselayer{l}.norm1/conv1/norm2/conv2.*``,
  ``features.transition{t}.norm/conv.*``, ``features.norm5.*``, ``classifier.weight/bias``; timm's
  ``densenet121.tv_in1k`` uses the same names), as NumPy arrays: convolutions OIHW -> HWIO,
  ``classifier.weight`` transposed, running statistics into ``batch_stats``,
  ``num_batches_tracked`` ignored. ``in_channels``: the images' channels (by default
  ``features.conv0.weight``'s second dimension, else 3). Every missing, unexpected or mis-shaped
  tensor is named in one ValueError.

  The old torchvision checkpoints' names (``denselayer1.norm.1``) are not read: torchvision renames
  them when it loads them, and timm's files use the new names."""
  in_channels = in_channels or in_channels_of(tensors, "features.conv0.weight")
  sample = jax.ShapeDtypeStruct((1, 64, 64, in_channels), jnp.float32)
  prefix = lambda first: "" if first == "classifier" else "features."
  return variables_from_torch(tensors, module, sample, prefix)
