"""Camelyon17-WILDS (v1.0): tumour / no tumour in 96x96 histopathology patches, five hospitals.

Layout read (WILDS' ``camelyon17_v1.0/`` download, as ``wilds/datasets/camelyon17_dataset.py``
reads it; ``path`` may be that folder or the folder holding it)::

  camelyon17_v1.0/metadata.csv
      ,patient,node,x_coord,y_coord,tumor,slide,center,split   (first column: pandas' unnamed index)
  camelyon17_v1.0/patches/patient_{patient}_node_{node}/
      patch_patient_{patient}_node_{node}_x_{x_coord}_y_{y_coord}.png   (96x96 RGB)

``patient`` is read as a string: it is zero-padded (``"004"``) and the padding is part of the file
names. ``node``, ``x_coord``, ``y_coord`` are integers (written into the names without padding).
``tumor`` is the label (1 when the central 32x32 region holds tumour tissue), ``center`` the
hospital 0-4 (WILDS' 0-indexed numbering; the paper calls the test hospital 5), ``split`` 0 or 1.

Splits (WILDS' ``official`` scheme): hospital 1 is the OOD validation set and hospital 2 the test
set whatever their ``split`` column says (WILDS overwrites it); of the training hospitals 0, 3, 4,
``split`` 0 rows are ``train`` and ``split`` 1 rows ``id_val``. Published counts: train 302,436,
id_val 33,560, val 34,904, test 85,054 (455,954 patches).

Clients: the hospitals (``hospital_0`` ... ``hospital_4``): ``train`` and ``id_val`` have the three
training hospitals, ``val`` hospital 1, ``test`` hospital 2. A client's rows come in
``metadata.csv`` order. Groups: the hospital (``group`` = the centre index into
``("hospital_0", ..., "hospital_4")``); WILDS' own eval grouper is the slide, its reported metric
the average accuracy.

Storage: decoded, ``x`` uint8 ``[96, 96, 3]`` (27,648 bytes a patch: 455,954 patches are 12.6 GB,
11.7 GiB; WILDS' archive of the PNGs is 10.7 GB, so storing them encoded would save little and
cost a decode every read), ``y`` int32 ``tumor``.
"""

from __future__ import annotations

import os
from typing import Dict, List

import numpy as np

from fedjax_dro.data._sources import wilds_common as wc
from fedjax_dro.data._sources.base import Source, SplitSource, read_csv

FOLDER = "camelyon17_v1.0"
METADATA = "metadata.csv"
REQUIRED = ("patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split")
TRAIN_CENTERS = (0, 3, 4)
VAL_CENTER = 1
TEST_CENTER = 2
NUM_CENTERS = 5
SIZE = 96
SPLITS = ("train", "id_val", "val", "test")


def patch_path(patient: str, node: int, x: int, y: int) -> str:
  """A patch's path under the dataset folder (WILDS' ``_input_array``)."""
  return (
    f"patches/patient_{patient}_node_{node}/patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png"
  )


def _split_of(center: int, split: int) -> str:
  if center == VAL_CENTER:
    return "val"
  if center == TEST_CENTER:
    return "test"
  return "train" if split == 0 else "id_val"


def source(path: str) -> Source:
  """The Camelyon17-WILDS directory at ``path`` as a :class:`Source` (see the module docstring);
  the whole layout (columns, values, every patch file) is checked before it returns."""
  root = wc.resolve_dir(path, FOLDER, METADATA)
  meta = os.path.join(root, METADATA)
  cols = read_csv(meta, REQUIRED)
  nodes = wc.int_column(meta, cols, "node")
  xs = wc.int_column(meta, cols, "x_coord")
  ys = wc.int_column(meta, cols, "y_coord")
  tumor = wc.int_column(meta, cols, "tumor", (0, 1))
  wc.int_column(meta, cols, "slide")
  centers = wc.int_column(meta, cols, "center", range(NUM_CENTERS))
  splits = wc.int_column(meta, cols, "split", (0, 1))
  for i, patient in enumerate(cols["patient"]):
    if not patient or "/" in patient:
      raise wc.SourceError(f"{meta}: line {i + 2}: column 'patient' holds {patient!r}")
  files = [
    os.path.join(root, patch_path(p, n, x, y)) for p, n, x, y in zip(cols["patient"], nodes, xs, ys)
  ]
  wc.check_files(files, meta)

  members: Dict[str, Dict[int, List[int]]] = {s: {} for s in SPLITS}
  for i, (c, s) in enumerate(zip(centers, splits)):
    members[_split_of(c, s)].setdefault(c, []).append(i)
  clients_of = {
    "train": TRAIN_CENTERS,
    "id_val": TRAIN_CENTERS,
    "val": (VAL_CENTER,),
    "test": (TEST_CENTER,),
  }
  labels = np.asarray(tumor, np.int32)

  def load(rows):
    x = np.stack([wc.decode_rgb(files[r], wc.read_bytes(files[r]), (SIZE, SIZE)) for r in rows])
    y = labels[list(rows)]
    g = np.asarray([centers[r] for r in rows], np.int32)
    return x, y, g

  split_sources = []
  for name in SPLITS:
    row_lists = [members[name].get(c, []) for c in clients_of[name]]

    def rows(i, row_lists=row_lists):
      return wc.chunks(row_lists[i], load)

    split_sources.append(
      SplitSource(
        name=name,
        clients=tuple(f"hospital_{c}" for c in clients_of[name]),
        rows=rows,
        num_rows=tuple(len(r) for r in row_lists),
      )
    )
  info = {
    "task": "classification",
    "num_classes": 2,
    "label_names": ["normal", "tumor"],
    "metrics": ["accuracy"],
    "protocol": [
      "WILDS 'official' split scheme: hospital 1 = OOD val, hospital 2 = test whatever the CSV's "
      "split column says; hospitals 0, 3, 4 split by the column (0 = train, 1 = id_val)",
      "clients = hospitals: train and id_val hold hospital_0, hospital_3, hospital_4; val "
      "hospital_1; test hospital_2; rows in metadata.csv order",
      "patient ids kept as strings (zero-padded, part of the patch file names)",
      "inputs stored decoded: uint8 [96, 96, 3], the patches' native size (no resizing), RGB",
      "groups = hospitals (group = centre index); WILDS' eval grouper is the slide and its "
      "reported metric the average accuracy",
    ],
    "citation": wc.wilds_citation(
      {
        "title": "From detection of individual metastases to classification of lymph node status "
        "at the patient level: the CAMELYON17 challenge",
        "authors": "Bandi, Geessink, Manson, Van Dijk, Balkenhol, Hermsen, Bejnordi, Lee, Paeng, "
        "Zhong, et al.",
        "year": 2018,
        "venue": "IEEE Transactions on Medical Imaging 38(2)",
      }
    ),
  }
  return Source(
    dataset="camelyon17",
    x_shape=(SIZE, SIZE, 3),
    x_dtype="uint8",
    y_shape=(),
    y_dtype="int32",
    groups=tuple(f"hospital_{c}" for c in range(NUM_CENTERS)),
    splits=tuple(split_sources),
    info=info,
  )


# The stand-in's patients: (patient, node, slide, center); zero-padded ids as in the real data.
STANDIN_PATIENTS = (
  ("004", 4, 0, 0),
  ("009", 1, 2, 0),
  ("021", 2, 10, 1),
  ("042", 3, 23, 2),
  ("051", 2, 30, 2),
  ("062", 0, 40, 3),
  ("081", 1, 45, 4),
)


def write_standin(path: str, seed: int = 0) -> str:
  """A tiny Camelyon17-WILDS directory (7 patients over the 5 hospitals, 3 patches each, the
  training hospitals' rows split 0 and 1, hospitals 1 and 2 with both split values as in the real
  CSV) under ``path/camelyon17_v1.0``; returns ``path``."""
  from PIL import Image

  rng = np.random.default_rng(seed)
  root = os.path.join(os.fspath(path), FOLDER)
  lines = [",patient,node,x_coord,y_coord,tumor,slide,center,split"]
  index = 0
  for patient, node, slide, center in STANDIN_PATIENTS:
    folder = os.path.join(root, f"patches/patient_{patient}_node_{node}")
    os.makedirs(folder, exist_ok=True)
    for k in range(3):
      x, y = int(rng.integers(0, 400)) * 32, int(rng.integers(0, 800)) * 32
      tumor = int(rng.integers(0, 2))
      split = 1 if k == 2 else 0
      pixels = rng.integers(0, 256, size=(SIZE, SIZE, 3), dtype=np.uint8)
      Image.fromarray(pixels, "RGB").save(os.path.join(root, patch_path(patient, node, x, y)))
      lines.append(f"{index},{patient},{node},{x},{y},{tumor},{slide},{center},{split}")
      index += 1
  with open(os.path.join(root, METADATA), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return os.fspath(path)
