"""Models: the :class:`Model` protocol, built-in models, adapters of Flax (linen, NNX) and
Equinox modules, and a zoo of the field's architectures as Flax linen modules (ResNet, DenseNet,
pfl-research's CIFAR-10 CNN, LSTM language models, GPT-2, DistilBERT) with loaders of their
published weights' key names."""

from fedjax_dro.common.model import Model, client_loss, num_parameters  # noqa: F401 (importable, not public)
from fedjax_dro.models.adapters import from_equinox, from_nnx
from fedjax_dro.models.builtin import (
  cnn,
  from_flax,
  linear_regression,
  logistic_regression,
  mlp,
  softmax_regression,
)
from fedjax_dro.models.cifar_cnn import cifar_cnn
from fedjax_dro.models.densenet import densenet121
from fedjax_dro.models.distilbert import distilbert
from fedjax_dro.models.gpt2 import gpt2
from fedjax_dro.models.lstm import lm_loss_and_metrics, lstm_language_model
from fedjax_dro.models.resnet import resnet18, resnet50
from fedjax_dro.models.weights import load_weights

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
  "resnet18",
  "resnet50",
  "densenet121",
  "cifar_cnn",
  "lstm_language_model",
  "lm_loss_and_metrics",
  "gpt2",
  "distilbert",
  "load_weights",
]
