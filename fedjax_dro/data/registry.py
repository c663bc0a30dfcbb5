"""Named datasets with their default models (``fedjax-dro list``)."""

from __future__ import annotations

import functools
from typing import Callable, Dict, NamedTuple

from fedjax_dro import models
from fedjax_dro.common.checks import known
from fedjax_dro.data import synthetic
from fedjax_dro.data.digits import digits_dirichlet
from fedjax_dro.data.federated import FederatedDataset
from fedjax_dro.data.heart_disease import heart_disease


class DatasetEntry(NamedTuple):
  load: Callable[..., FederatedDataset]  # (seed, **kwargs) -> FederatedDataset
  default_model: Callable[[FederatedDataset], models.Model]
  description: str


def _linear(l2):
  return lambda ds: models.linear_regression(ds.train.x.shape[-1], l2=l2, fit_intercept=False)


def _digits_cnn(ds):
  """The FGDRO reproduction's two-layer CNN (8 and 16 channels, linear head)."""
  return models.cnn(
    ds.train.x.shape[2:], ds.num_classes, features=(8, 16), dense=None, conv="patches"
  )


def _softmax(ds):
  return models.softmax_regression(ds.train.x.shape[-1], ds.num_classes)


_DATASETS: Dict[str, DatasetEntry] = {
  "synthetic-ridge": DatasetEntry(
    synthetic.synthetic_ridge,
    _linear(1e-6),
    "Karula Sec. 5.1 ridge regression: 30 clients, d=50, 3 parameter groups, group feature "
    "means 0 / 0.2 / 0.4, noise 3",
  ),
  "synthetic-ridge-equal-means": DatasetEntry(
    functools.partial(synthetic.synthetic_ridge, **synthetic.EQUAL_MEANS_SETTING),
    _linear(1e-6),
    "synthetic-ridge with zero-mean group features (standard deviations 1 / 1.5 / 0.75), noise 1",
  ),
  "synthetic-shift": DatasetEntry(
    synthetic.synthetic_shift,
    _linear(0.0),
    "SCAFF-PD Sec. 6.1 regression with concept shift: N=5, d=10, m=100",
  ),
  "heart-disease": DatasetEntry(
    heart_disease,
    lambda ds: models.logistic_regression(13),
    "UCI heart disease, 4 hospitals, 13 features, 740 rows (ships with the package)",
  ),
  "synthetic-classification": DatasetEntry(
    synthetic.synthetic_classification,
    _softmax,
    "Gaussian-mixture classification, Dirichlet(0.5) label skew, 20 clients",
  ),
  "digits-dirichlet": DatasetEntry(
    digits_dirichlet,
    _digits_cnn,
    "UCI handwritten digits 8x8 (ships with the package), classes 5-9 cut to 20%, "
    "Dirichlet(0.3) over 100 clients (FGDRO App. G setting)",
  ),
}


def register_dataset(name: str, entry: DatasetEntry) -> None:
  _DATASETS[name] = entry


def get_dataset(name: str) -> DatasetEntry:
  return known(name, _DATASETS, "dataset")


def list_datasets() -> Dict[str, DatasetEntry]:
  return dict(sorted(_DATASETS.items()))
