"""Offline stand-ins for data the package cannot ship or download.

:func:`gaussian_mixture_features` stands in for precomputed image embeddings (e.g. the
ImageNet-pretrained ResNet-18 features of CIFAR-100 that SCAFF-PD's Table 1 trains linear
classifiers on): a class-conditional Gaussian mixture with the same layout as a features file
(:class:`~fedjax_dro.data.user_files.FeatureSet`). It is *not* CIFAR-100: it has the number of
classes and the feature dimension, not the images' structure; results on it are labelled as
stand-in results wherever they are reported.
"""

from __future__ import annotations

import numpy as np

from fedjax_dro.common.checks import number
from fedjax_dro.data.user_files import FeatureSet

# The defaults of gaussian_mixture_features. SEPARATION = 3 gives a Bayes (nearest true mean)
# accuracy of about 0.67 in 512 dimensions with 100 classes; a linear classifier trained on
# TRAIN_PER_CLASS = 200 rows per class reaches less (estimation error), in the range of the
# paper's CIFAR-100 numbers (35-50% average accuracy), neither chance (1%) nor ~100%.
NUM_CLASSES, DIM, SEPARATION = 100, 512, 3.0
TRAIN_PER_CLASS, TEST_PER_CLASS = 200, 40


def gaussian_mixture_features(
  num_classes: int = NUM_CLASSES,
  dim: int = DIM,
  *,
  train_per_class: int = TRAIN_PER_CLASS,
  test_per_class: int = TEST_PER_CLASS,
  separation: float = SEPARATION,
  hardness: float = 0.0,
  seed: int = 0,
) -> FeatureSet:
  """A class-conditional Gaussian mixture in the layout of a features file.

  Class ``c`` has mean ``mu_c = a_c separation * z_c / sqrt(dim)`` with ``z_c ~ N(0, I_dim)`` (so
  ``||mu_c - mu_c'||^2 ~ (a_c^2 + a_c'^2) separation^2``), and its rows are
  ``x = mu_c + s_c N(0, I_dim)``. With ``hardness = h`` the classes differ in difficulty: class
  ``c`` of ``K`` sits at rank ``r_c = c / (K - 1)`` and has separation factor ``a_c = 1 - h r_c``
  (its mean closer to the origin, where the other classes' means crowd) and spread
  ``s_c = 1 + h r_c``; class 0 is the easiest, class ``K - 1`` the hardest. ``h = 0`` (default)
  gives equally hard, isotropic classes (and the same rows as without the setting). The rows
  come class by class, the ``train_per_class`` training rows of every class first and then the
  ``test_per_class`` held-out rows (``split`` True).

  Args:
    num_classes: number of classes (>= 2).
    dim: feature dimension (>= 1).
    train_per_class: training rows per class (>= 1).
    test_per_class: held-out rows per class (>= 1).
    separation: scale of the class means relative to the unit noise (> 0); larger is easier.
    hardness: ``h`` in ``[0, 1)``, how much the classes differ in difficulty (see above).
    seed: seed of the means and the noise.

  Returns:
    A :class:`~fedjax_dro.data.user_files.FeatureSet` (float32 features ``[N, dim]``, int32 labels,
    bool split with True on the held-out rows, ``num_classes``).
  """
  for name, value, low in (
    ("num_classes", num_classes, 2),
    ("dim", dim, 1),
    ("train_per_class", train_per_class, 1),
    ("test_per_class", test_per_class, 1),
  ):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
      raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
  if isinstance(separation, bool) or not isinstance(separation, (int, float, np.floating)):
    raise TypeError(f"separation must be a positive number, got {separation!r}")
  if not (np.isfinite(separation) and separation > 0):
    raise ValueError(f"separation must be a positive finite number, got {separation!r}")
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
  hardness = number(hardness, "hardness", minimum=0.0)
  if hardness >= 1.0:
    raise ValueError(f"hardness must be a finite number in [0, 1), got {hardness!r}")
  rng = np.random.default_rng(seed)
  means = rng.standard_normal((num_classes, dim)) * (separation / np.sqrt(dim))
  per_class = train_per_class + test_per_class
  labels = np.repeat(np.arange(num_classes, dtype=np.int32), per_class)
  noise = rng.standard_normal((labels.size, dim))
  if hardness > 0:
    rank = np.arange(num_classes) / (num_classes - 1)
    means = means * (1.0 - hardness * rank)[:, None]
    noise = noise * (1.0 + hardness * rank)[labels][:, None]
  features = (means[labels] + noise).astype(np.float32)
  split = np.tile(np.arange(per_class) >= train_per_class, num_classes)
  order = np.concatenate([np.flatnonzero(~split), np.flatnonzero(split)])
  return FeatureSet(features[order], labels[order], split[order], int(num_classes))
