"""FedCIFAR-100 (TensorFlow Federated's federated CIFAR-100), read from TFF's HDF5 files.

Layout (``tff.simulation.datasets.cifar100.load_data`` before TFF moved to SQLite in 2021,
archive ``fed_cifar100.tar.bz2``; the later SQLite file holds the same rows)::

  <dir>/fed_cifar100_train.h5   examples/<client_id>/{coarse_label, image, label}
  <dir>/fed_cifar100_test.h5    examples/<client_id>/{coarse_label, image, label}

``image`` is ``[k, 32, 32, 3]`` uint8, ``label`` ``[k]`` int64 (the fine label, 0-99, CIFAR-100's
alphabetical class order), ``coarse_label`` ``[k]`` int64 (0-19).

Clients: TFF's client ids, "0" ... "499" in the train file and "0" ... "99" in the test file, in
TFF's order (``sorted`` as strings: "0", "1", "10", "100", ...). The test clients are *other*
clients than the train clients with the same ids: TFF partitioned CIFAR-100's 50,000 training
images over 500 train clients and its 10,000 test images over 100 test clients (100 images each,
drawn with a Pachinko allocation: per client a Dirichlet(0.1) over the 20 coarse labels and a
Dirichlet(10) over each coarse label's 5 fine labels), so train client "7" and test client "7"
share nothing but the name.

Splits: ``train`` (500 clients, 50,000 rows) and ``test`` (100 clients, 10,000 rows), TFF's own.
(TFF's HDF5-era docstring said "500,000" and "100,000" examples, later corrected to 50,000
and 10,000: CIFAR-100's sizes, 100 rows a client.)

Rows: ``x`` the image, uint8 ``[32, 32, 3]``; ``y`` the fine label, int32; ``group`` 0 of the
single group ``("all",)``.
"""

from __future__ import annotations

import os
from types import MappingProxyType
from typing import Iterator

import numpy as np

from fedjax_dro.data._sources import hdf5_clients as h5c
from fedjax_dro.data._sources.base import Chunk, Source, SourceError, SplitSource

NAME = "fedcifar100"
FILES = MappingProxyType({"train": "fed_cifar100_train.h5", "test": "fed_cifar100_test.h5"})
CHUNK = 256
NUM_CLASSES = 100
NUM_COARSE = 20

LABEL_NAMES = tuple(
  "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus "
  "butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch "
  "crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo "
  "keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse "
  "mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy "
  "porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper "
  "snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television "
  "tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm".split()
)

SPECS = MappingProxyType(
  {
    "image": (((32, 32, 3),), h5c.is_uint8, "uint8"),
    "label": (((), (1,)), h5c.is_int, "an integer type"),
    "coarse_label": (((), (1,)), h5c.is_int, "an integer type"),
  }
)

PROTOCOL = (
  "clients: TFF's client ids in TFF's order (sorted as strings); the test file's 100 clients are "
  "other clients than the train file's 500 (TFF partitioned CIFAR-100's train and test images "
  "separately), so client-level generalization is measured on unseen clients",
  "splits: TFF's train and test files as they are, no re-splitting",
  "y: the fine label (100 classes), the label TFF's and FedJAX's CIFAR-100 tasks predict; the "
  "coarse label is only checked",
  "groups: the single group 'all' (the coarse labels are classes, not groups of a population; "
  "the clients are the DRO domains)",
  "x: the raw uint8 image; normalization and TFF's 24x24 crop are left to the model's input "
  "pipeline",
)

CITATION = (
  "@techreport{krizhevsky2009cifar, title={Learning multiple layers of features from tiny "
  "images}, author={Krizhevsky, Alex}, year={2009}}; @inproceedings{reddi2021adaptive, "
  "title={Adaptive Federated Optimization}, author={Reddi, Sashank J. and Charles, Zachary and "
  "Zaheer, Manzil and Garrett, Zachary and Rush, Keith and Kone{\\v{c}}n{\\'y}, Jakub and Kumar, "
  "Sanjiv and McMahan, H. Brendan}, booktitle={ICLR}, year={2021}}"
)


def _split(name: str, path: str) -> SplitSource:
  with h5c.open_file(path) as f:
    ids = h5c.client_ids(f, path)
    lengths = h5c.check_clients(f, path, ids, SPECS)

  def rows(i: int) -> Iterator[Chunk]:
    data = h5c.read_client(path, ids[i], ("image", "label"))
    image = np.asarray(data["image"], np.uint8)
    label = np.asarray(data["label"]).reshape(-1)
    if image.shape[0] != lengths[i] or label.shape[0] != lengths[i]:
      raise SourceError(f"{path}: client {ids[i]!r} changed length since it was checked")
    if label.size and (label.min() < 0 or label.max() >= NUM_CLASSES):
      raise SourceError(
        f"{path}: client {ids[i]!r}: 'label' holds {int(label.min())}..{int(label.max())}, "
        f"expected fine labels 0..{NUM_CLASSES - 1}"
      )
    label = label.astype(np.int32)
    for s in range(0, lengths[i], CHUNK):
      e = min(s + CHUNK, lengths[i])
      yield image[s:e], label[s:e], np.zeros(e - s, np.int32)

  return SplitSource(name, ids, rows, lengths)


def source(path: str) -> Source:
  """FedCIFAR-100 from the directory holding TFF's ``fed_cifar100_{train,test}.h5`` (or one of
  those files: its directory is read; see the module docstring), validated before it returns."""
  if os.path.isfile(path) and os.path.basename(path) in FILES.values():
    path = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(path):
    raise SourceError(f"{path}: not a directory (expected the one holding {FILES['train']})")
  splits = tuple(_split(name, h5c.find_file(path, filename)) for name, filename in FILES.items())
  return Source(
    dataset=NAME,
    x_shape=(32, 32, 3),
    x_dtype="uint8",
    y_shape=(),
    y_dtype="int32",
    groups=("all",),
    splits=splits,
    info={
      "task": "classification",
      "num_classes": NUM_CLASSES,
      "metrics": ["accuracy"],
      "label_names": list(LABEL_NAMES),
      "protocol": list(PROTOCOL),
      "citation": CITATION,
    },
  )


def write_standin(path: str, seed: int = 0) -> str:
  """A tiny FedCIFAR-100 in TFF's exact HDF5 layout (``examples/<id>/{coarse_label, image,
  label}``, int64 labels, uint8 images): 12 train clients "0".."11" (so TFF's string order,
  "0", "1", "10", "11", "2", ..., differs from the numeric one) and 3 test clients "0".."2", with
  2 to 5 random images each, deterministic in ``seed``; returns ``path``."""
  h5py = h5c.require_h5py()
  os.makedirs(path, exist_ok=True)
  rng = np.random.default_rng(seed)
  for split, num_clients in (("train", 12), ("test", 3)):
    with h5py.File(os.path.join(path, FILES[split]), "w") as f:
      examples = f.create_group(h5c.EXAMPLES_GROUP)
      for c in range(num_clients):
        k = int(rng.integers(2, 6))
        coarse = rng.integers(0, NUM_COARSE, size=k)
        fine = rng.integers(0, NUM_CLASSES, size=k)
        group = examples.create_group(str(c))
        group.create_dataset("coarse_label", data=coarse.astype(np.int64))
        group.create_dataset("image", data=rng.integers(0, 256, (k, 32, 32, 3), dtype=np.uint8))
        group.create_dataset("label", data=fine.astype(np.int64))
  return path
