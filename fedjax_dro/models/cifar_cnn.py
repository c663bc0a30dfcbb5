"""pfl-research's CIFAR-10 CNN as a Flax linen module.

The ``simple_cnn`` of F. Granqvist et al., "pfl-research: simulation framework for accelerating
research in Private Federated Learning", 2024 (arXiv:2404.06430), the model of its
CIFAR-10 benchmarks (``benchmarks/model/{tf2,pytorch}/cnn.py``): a 3x3 convolution with 32
filters and ReLU, a 3x3 convolution with 64 filters and ReLU (both unpadded), a 2x2 max pool,
dropout 0.25, flatten, a dense layer of 128 units with ReLU, dropout 0.5 and the output layer;
Glorot-uniform weights and zero biases as there. The same network is Keras' ``mnist_cnn`` example.

NHWC inputs, flattened in (H, W, C) order as the TF2 version flattens (the PyTorch version flattens
NCHW: the same function up to a permutation of the hidden layer's input rows). ``train=True``
applies the dropouts, drawing from the ``"dropout"`` rng stream.
"""

from __future__ import annotations

import flax.linen as nn

glorot = nn.initializers.xavier_uniform()


class CifarCNN(nn.Module):
  """Attributes: ``num_classes`` (10), ``dropout`` (0.25, after the convolutions) and
  ``dense_dropout`` (0.5, after the hidden dense layer)."""

  num_classes: int = 10
  dropout: float = 0.25
  dense_dropout: float = 0.5

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.relu(nn.Conv(32, (3, 3), padding="VALID", kernel_init=glorot, name="conv1")(x))
    x = nn.relu(nn.Conv(64, (3, 3), padding="VALID", kernel_init=glorot, name="conv2")(x))
    x = nn.max_pool(x, (2, 2), strides=(2, 2))
    x = nn.Dropout(self.dropout, deterministic=not train)(x)
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(128, kernel_init=glorot, name="dense1")(x))
    x = nn.Dropout(self.dense_dropout, deterministic=not train)(x)
    return nn.Dense(self.num_classes, kernel_init=glorot, name="dense2")(x)


def cifar_cnn(num_classes: int = 10, **kwargs) -> CifarCNN:
  """pfl-research's CIFAR-10 CNN (:class:`CifarCNN`)."""
  return CifarCNN(num_classes=num_classes, **kwargs)
