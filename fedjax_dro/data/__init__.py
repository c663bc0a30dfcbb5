"""Federated data: padded stacked arrays, constructors, partitioners, and datasets by role.

* the structure: ``federated`` (the padded stacked arrays and their constructors), ``host``
  (host-resident data), ``partition`` (label partitioners);
* built-in datasets (generated or shipped with the package): ``synthetic``, ``digits`` (the 8x8
  handwritten digits, FGDRO's image setting), ``femnist_digits`` (the digits by writer, a
  FEMNIST-like federation), ``heart_disease`` (four hospitals), ``standins`` (labelled stand-ins
  of users' files), and ``registry`` (the datasets by name);
* datasets larger than memory: ``prepared`` (the on-disk format, ``prepare`` and the readers of
  natural-split datasets: WILDS, the Pile, LEAF Shakespeare, TFF's FedCIFAR-100 and
  StackOverflow) and ``load_prepared`` (a prepared split streamed into rounds, ``streamed``);
* readers of the user's files: ``user_arrays`` (npz, LEAF JSON), ``user_cifar`` (CIFAR binary),
  ``user_files`` (features files, TinyImageNet, and their shared types), each with the writer of
  its format for tests and stand-ins.

Metrics live in :mod:`fedjax_dro.core.metrics`.
"""

from fedjax_dro.core.metrics import class_weighted_accuracy
from fedjax_dro.data import prepared
from fedjax_dro.data.digits import digits_dirichlet_with_extras, load_digits
from fedjax_dro.data.federated import (
  FederatedData,
  FederatedDataset,
  from_arrays,
  from_client_arrays,
  train_test_split,
  validate_data,
)
from fedjax_dro.data.femnist_digits import digits_by_writer, load_femnist_digits
from fedjax_dro.data.partition import dirichlet_partition
from fedjax_dro.data.registry import get_dataset, list_datasets, register_dataset
from fedjax_dro.data.streamed import load_prepared
from fedjax_dro.data.synthetic import synthetic_classification, synthetic_ridge, synthetic_shift
from fedjax_dro.data.user_arrays import load_leaf_json, load_npz
from fedjax_dro.data.user_cifar import load_cifar10, load_cifar100
from fedjax_dro.data.user_files import load_features, load_tiny_imagenet, write_features

__all__ = [
  "digits_dirichlet_with_extras",
  "digits_by_writer",
  "class_weighted_accuracy",
  "FederatedData",
  "FederatedDataset",
  "from_arrays",
  "from_client_arrays",
  "train_test_split",
  "validate_data",
  "dirichlet_partition",
  "synthetic_classification",
  "synthetic_ridge",
  "synthetic_shift",
  "get_dataset",
  "list_datasets",
  "register_dataset",
  "load_npz",
  "load_leaf_json",
  "load_digits",
  "load_femnist_digits",
  "load_features",
  "write_features",
  "load_cifar10",
  "load_cifar100",
  "load_tiny_imagenet",
  "prepared",
  "load_prepared",
]
