"""Models: the :class:`Model` protocol, built-in models and adapters of Flax (linen, NNX) and
Equinox modules."""

from fedjax_dro.common.model import (
  Model,
  client_loss,
  client_loss_and_grad,
  model_identity,
  num_parameters,
  per_client_eval,
)
from fedjax_dro.models.adapters import from_equinox, from_nnx
from fedjax_dro.models.builtin import (
  cnn,
  conv_form,
  from_flax,
  head_form,
  linear_regression,
  logistic_regression,
  mlp,
  softmax_regression,
)

__all__ = [
  "Model",
  "client_loss",
  "client_loss_and_grad",
  "per_client_eval",
  "num_parameters",
  "model_identity",
  "linear_regression",
  "logistic_regression",
  "softmax_regression",
  "mlp",
  "cnn",
  "conv_form",
  "head_form",
  "from_flax",
  "from_nnx",
  "from_equinox",
]
