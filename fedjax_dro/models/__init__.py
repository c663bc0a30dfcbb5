"""Models: the :class:`Model` protocol, built-in models and adapters of Flax (linen, NNX) and
Equinox modules."""

from fedjax_dro.common.model import Model, client_loss, num_parameters
from fedjax_dro.models.adapters import from_equinox, from_nnx
from fedjax_dro.models.builtin import (
  cnn,
  from_flax,
  linear_regression,
  logistic_regression,
  mlp,
  softmax_regression,
)

__all__ = [
  "Model",
  "linear_regression",
  "logistic_regression",
  "softmax_regression",
  "mlp",
  "cnn",
  "from_flax",
  "from_nnx",
  "from_equinox",
  "client_loss",
  "num_parameters",
]
