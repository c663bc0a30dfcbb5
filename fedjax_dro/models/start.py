"""The zoo's image models as the command line builds them (``fedjax-dro run --model resnet18
[--weights FILE]``): a :class:`~fedjax_dro.common.model.Model` for a federation of images, started
from published weights when a file is given.

Started from a file, every layer but the classification head takes the file's tensors (and its
running statistics, under ``batch_stats``); the head, sized for the dataset's classes, is drawn
fresh from the run's key, as WILDS' and timm's fine-tuning protocols replace it. The file's own
head fixes the number of classes the file is read with, so a file fine-tuned on another label
set loads the same way.
"""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dro.common.model import Model

IMAGE_MODELS = ("resnet18", "resnet50", "densenet121", "cifar_cnn")
"""The zoo's image models ``--model`` names."""

_HEADS = {"resnet18": "fc", "resnet50": "fc", "densenet121": "classifier"}


def _module(name: str, num_classes: int, side: int):
  from fedjax_dro.models.cifar_cnn import cifar_cnn
  from fedjax_dro.models.densenet import densenet121
  from fedjax_dro.models.resnet import resnet18, resnet50

  if name in ("resnet18", "resnet50"):
    # small images (CIFAR-sized and below) take the CIFAR stem unless weights say otherwise
    stem = "cifar" if side <= 64 else "imagenet"
    return {"resnet18": resnet18, "resnet50": resnet50}[name](num_classes, stem=stem)
  if name == "densenet121":
    return densenet121(num_classes)
  return cifar_cnn(num_classes)


class _OneChannel(nn.Module):
  """``inner`` applied to grayscale images ``[m, H, W]`` given one channel axis."""

  inner: nn.Module

  @nn.compact
  def __call__(self, x, train: bool = False, mask=None):
    kwargs = {"mask": mask} if mask is not None else {}
    return self.inner(x[..., None], train=train, **kwargs)


def image_model(name: str, sample_x, num_classes: int, weights: Optional[str] = None) -> Model:
  """The zoo model ``name`` (:data:`IMAGE_MODELS`) for images like ``sample_x [m, H, W, C]``
  with ``num_classes`` outputs, adapted with :func:`~fedjax_dro.models.from_flax`; with
  ``weights`` (a ``.safetensors`` file with the publishers' names, :func:`~fedjax_dro.models.
  load_weights`) every run starts from the file's tensors, the head drawn fresh.

  Raises:
    ValueError: an unknown name, inputs that are not images, weights for a model without a
      published checkpoint (``cifar_cnn``), or a file that does not fit (named by
      :func:`~fedjax_dro.models.load_weights`; a file of 3 input channels for images of another
      number is refused).
  """
  from fedjax_dro.models.builtin import from_flax
  from fedjax_dro.models.weights import load_weights, read_safetensors

  if name not in IMAGE_MODELS:
    raise ValueError(f"--model must be one of {', '.join(IMAGE_MODELS)}, got {name!r}")
  sample = np.asarray(sample_x)
  if sample.ndim == 3 and weights is None:  # grayscale [m, H, W]: one channel
    side = int(max(sample.shape[1:3]))
    return from_flax(_OneChannel(_module(name, num_classes, side)), sample[:2], name=name)
  grayscale = sample.ndim == 3
  if grayscale:  # with weights: refused below, naming the file's input channels
    sample = sample[..., None]
  if sample.ndim != 4:
    raise ValueError(
      f"--model {name} takes images [H, W, C]; this dataset's examples have shape "
      f"{list(sample.shape[1:])}"
    )
  side = int(max(sample.shape[1:3]))
  if weights is None:
    return from_flax(_module(name, num_classes, side), sample[:2], name=name)
  if name not in _HEADS:
    raise ValueError(f"--weights: {name} has no published weights to load (only {list(_HEADS)})")
  head = _HEADS[name]
  tensors = read_safetensors(weights)
  classes = tensors.get(f"{head}.weight")
  file_classes = int(classes.shape[0]) if classes is not None else num_classes
  in_channels = tensors.get("conv1.weight", tensors.get("features.conv0.weight"))
  if in_channels is not None and (grayscale or in_channels.shape[1] != sample.shape[-1]):
    have = "grayscale [H, W]" if grayscale else f"of {sample.shape[-1]} channels"
    raise ValueError(
      f"--weights: {weights} holds a first convolution of {in_channels.shape[1]} input channels; "
      f"this dataset's images are {have}"
    )
  module = _module(name, num_classes, side)
  if name.startswith("resnet"):  # published ResNets use the ImageNet stem
    module = module.clone(stem="imagenet")
  pretrained = load_weights(module.clone(num_classes=file_classes), weights)
  model = from_flax(module, sample[:2], name=f"{name} (from {weights})")
  fresh_init = model.init

  def init(key):
    fresh = fresh_init(key)  # the head drawn from the run's key, the rest from the file
    params = {
      k: (v if k == head else jax.tree.map(np.asarray, pretrained["params"][k]))
      for k, v in fresh["params"].items()
    }
    out = {**fresh, "params": params}
    if "batch_stats" in fresh:
      out["batch_stats"] = jax.tree.map(np.asarray, pretrained["batch_stats"])
    return jax.tree.map(lambda a, f: jnp.asarray(a, dtype=f.dtype), out, fresh)

  return model._replace(init=init, identity=f"{model.identity}; weights={weights}")


def text_classifier(
  sample_x,
  num_labels: int,
  *,
  vocab_size: int,
  pad_id: int,
  weights: Optional[str] = None,
  size: str = "base",
) -> Model:
  """DistilBERT (:func:`~fedjax_dro.models.distilbert`, ``size`` ``"base"`` or ``"tiny"``) for
  token rows like ``sample_x [m, T]`` (int), ``num_labels`` classes, the attention mask
  ``tokens != pad_id``; with ``weights`` (a ``.safetensors`` file with Hugging Face's names,
  ``distilbert-base-uncased``'s ``model.safetensors``) every run starts from the file's tensors,
  and a head the file lacks (the base checkpoint has none) is drawn fresh from the run's key, as
  WILDS fine-tunes it.

  Raises:
    ValueError: rows that are not ``[m, T]`` integers, or a file that does not fit the model
      (every missing, unexpected and mis-shaped tensor named; the file's vocabulary must be the
      tokenizer's ``vocab_size``).
  """
  from fedjax_dro.models.builtin import from_flax
  from fedjax_dro.models.distilbert import distilbert, distilbert_params_from_hf
  from fedjax_dro.models.weights import read_safetensors, refuse_pickle_formats

  sample = np.asarray(sample_x)
  if sample.ndim != 2 or not np.issubdtype(sample.dtype, np.integer):
    raise ValueError(
      f"text_classifier takes integer token rows [m, T]; got {sample.dtype} of shape "
      f"{list(sample.shape)}"
    )
  positions = max(512, int(sample.shape[1])) if size == "base" else int(sample.shape[1])
  module = distilbert(
    size,
    vocab_size=int(vocab_size),
    num_labels=int(num_labels),
    pad_token_id=int(pad_id),
    max_position_embeddings=positions,
  )
  model = from_flax(module, sample[:2], name=f"DistilBERT-{size}")
  if weights is None:
    return model
  refuse_pickle_formats(weights)
  try:
    pretrained, fresh_names = distilbert_params_from_hf(read_safetensors(weights), module.config)
  except ValueError as e:
    raise ValueError(f"weights {weights}: {e}") from None
  head = {name.split(".")[0] for name in fresh_names}  # pre_classifier, classifier
  fresh_init = model.init

  def init(key):  # no batch statistics: the parameters themselves
    fresh = fresh_init(key)
    params = {k: (v if k in head else pretrained[k]) for k, v in fresh.items()}
    return jax.tree.map(lambda a, f: jnp.asarray(a, dtype=f.dtype), params, fresh)

  return model._replace(init=init, identity=f"{model.identity}; weights={weights}")
