"""Declarations a model makes about itself, shared by the models and the round mechanics."""

from __future__ import annotations

from typing import NamedTuple


class DenseLayer(NamedTuple):
  """A dense layer ``h = x W + b`` of a model, as :attr:`Model.dense_layers` declares it.

  Attributes:
    path: the kernel's keys in the parameter tree (``("Dense_0", "kernel")``).
    d_in: rows of the kernel (the input width).
    d_out: columns of the kernel (the output width).
  """

  path: tuple
  d_in: int
  d_out: int
