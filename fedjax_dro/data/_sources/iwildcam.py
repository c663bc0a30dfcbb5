"""iWildCam-WILDS (v2.0): the animal species in camera-trap photos, the camera traps as domains.

Layout read (WILDS' ``iwildcam_v2.0/`` download, as ``wilds/datasets/iwildcam_dataset.py`` reads
it; ``path`` may be that folder or the folder holding it)::

  iwildcam_v2.0/metadata.csv   columns read: split, filename, y, location_remapped,
                               sequence_remapped, datetime (``%Y-%m-%d %H:%M:%S.%f``); others
                               (pandas' unnamed index, location, sequence, category_id, image_id)
                               are ignored
  iwildcam_v2.0/train/{filename}   every image, whatever its split, is under train/ (JPEG, sizes
                                   vary)

``split`` is one of ``train``, ``val`` (OOD locations), ``test`` (OOD locations), ``id_val``,
``id_test`` (held-out images of the training locations). As WILDS does, the label count is
``max(y) + 1`` with every label ``0..max(y)`` present somewhere (182 on the real data), and the
location ids ``0..max`` are all present (323 on the real data). Published counts: train 129,809,
id_val 7,314, id_test 8,154, val 14,961, test 42,791 (203,029 images).

Clients: the camera locations of each split (option ``clients=None``: one client per location in
the split, named ``location_{id}``, sorted by id), or, with ``clients=k``, each split's locations
grouped into ``min(k, locations in the split)`` clients ``client_0 ... client_{k-1}`` by this rule:
the split's locations sorted by descending row count (ties: ascending id) and dealt round-robin
(the j-th goes to client ``j % k``). A client's rows come in ``metadata.csv`` order. ``group`` =
the location id, indexing ``groups`` = ``("location_0", ..., "location_{max}")``.

Storage: encoded (``encoding="image"``): each row's ``x`` is its JPEG file's own bytes, decoded
with Pillow and resized to ``image_size`` x ``image_size`` RGB (option, default 448 as WILDS'
``target_resolution``) at read time; ``x_shape`` is ``(image_size, image_size, 3)`` uint8. Decoded,
203,029 x 448 x 448 x 3 bytes would be 122.2 GB (113.9 GiB); WILDS' archive of the JPEGs is
12.0 GB. ``y`` int32. While its rows are read every JPEG is decoded (at reduced scale via Pillow's
JPEG draft mode) so a truncated or corrupt file fails ``prepare``, not training (``verify=False``
skips this).
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Dict, List, Optional

import numpy as np

from fedjax_dro.data._sources import wilds_common as wc
from fedjax_dro.data._sources.base import Source, SourceError, SplitSource, read_csv

FOLDER = "iwildcam_v2.0"
METADATA = "metadata.csv"
REQUIRED = ("split", "filename", "y", "location_remapped", "sequence_remapped", "datetime")
SPLITS = ("train", "id_val", "id_test", "val", "test")
DATETIME = "%Y-%m-%d %H:%M:%S.%f"


def _group_locations(counts: Dict[int, int], k: Optional[int]) -> List[List[int]]:
  """The clients' location lists: one per location (sorted by id) or dealt into ``k``."""
  ids = sorted(counts)
  if k is None:
    return [[loc] for loc in ids]
  order = sorted(ids, key=lambda loc: (-counts[loc], loc))
  n = min(k, len(order))
  return [sorted(order[c::n]) for c in range(n)]


def source(
  path: str, image_size: int = 448, clients: Optional[int] = None, verify: bool = True
) -> Source:
  """The iWildCam-WILDS directory at ``path`` as a :class:`Source` (see the module docstring);
  the whole layout (columns, split names, labels, dates, every image file) is checked before it
  returns."""
  if clients is not None and (isinstance(clients, bool) or int(clients) != clients or clients < 1):
    raise ValueError(f"clients must be None or a positive integer, got {clients!r}")
  if int(image_size) != image_size or image_size < 1:
    raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
  root = wc.resolve_dir(path, FOLDER, METADATA)
  meta = os.path.join(root, METADATA)
  cols = read_csv(meta, REQUIRED)
  split = wc.choice_column(meta, cols, "split", SPLITS)
  labels = wc.int_column(meta, cols, "y")
  locations = wc.int_column(meta, cols, "location_remapped")
  sequences = wc.int_column(meta, cols, "sequence_remapped")
  for name, values in (("y", labels), ("location_remapped", locations)):
    if values and min(values) < 0:
      line = values.index(min(values)) + 2
      raise SourceError(f"{meta}: line {line}: column {name!r} holds {min(values)}, expected >= 0")
  for i, text in enumerate(cols["datetime"]):
    try:
      datetime.strptime(text, DATETIME)
    except ValueError:
      raise SourceError(
        f"{meta}: line {i + 2}: column 'datetime' holds {text!r}, expected {DATETIME}"
      ) from None
  if not labels:
    raise SourceError(f"{meta}: no rows")
  num_classes = max(labels) + 1
  for name, values in (
    ("y", labels),
    ("location_remapped", locations),
    ("sequence_remapped", sequences),
  ):
    missing = sorted(set(range(max(values) + 1)) - set(values))
    if missing:  # WILDS asserts these ids are contiguous
      raise SourceError(
        f"{meta}: column {name!r} skips {missing[0]} (WILDS expects every id 0..{max(values)})"
      )
  num_locations = max(locations) + 1
  for i, name in enumerate(cols["filename"]):
    if not name or name.startswith("/") or ".." in name.split("/"):
      raise SourceError(f"{meta}: line {i + 2}: column 'filename' holds {name!r}")
  files = [os.path.join(root, "train", name) for name in cols["filename"]]
  wc.check_files(files, meta)

  y_all = np.asarray(labels, np.int32)
  draft = (image_size, image_size) if verify else None

  def load(rows):
    xs = []
    for r in rows:
      data = wc.read_bytes(files[r])
      if verify:
        wc.decode_rgb(files[r], data, draft=draft)
      xs.append(data)
    return xs, y_all[list(rows)], np.asarray([locations[r] for r in rows], np.int32)

  split_sources = []
  present = {}
  for name in SPLITS:
    members = [i for i, s in enumerate(split) if s == name]
    counts: Dict[int, int] = {}
    for i in members:
      counts[locations[i]] = counts.get(locations[i], 0) + 1
    groups = _group_locations(counts, clients)
    slot = {loc: c for c, locs in enumerate(groups) for loc in locs}
    row_lists: List[List[int]] = [[] for _ in groups]
    for i in members:
      row_lists[slot[locations[i]]].append(i)
    names = (
      tuple(f"location_{locs[0]}" for locs in groups)
      if clients is None
      else tuple(f"client_{c}" for c in range(len(groups)))
    )
    present[name] = sorted(set(labels[i] for i in members))

    def rows(i, row_lists=row_lists):
      return wc.chunks(row_lists[i], load)

    split_sources.append(SplitSource(name, names, rows, num_rows=tuple(len(r) for r in row_lists)))
  rule = (
    "clients = one per camera location in the split (location_{id}, sorted by id)"
    if clients is None
    else f"clients = each split's locations grouped into min({clients}, locations) clients: sorted "
    f"by descending row count (ties: ascending id), dealt round-robin (j-th -> client j % k)"
  )
  info = {
    "task": "classification",
    "num_classes": num_classes,
    "metrics": ["macro_f1", "accuracy"],
    "protocol": [
      "WILDS 'official' splits from the CSV's split column: train, id_val, id_test (training "
      "locations), val and test (OOD locations)",
      rule,
      "rows in metadata.csv order within a client; group = location id",
      f"num_classes = max(y) + 1 = {num_classes} as WILDS computes it (182 on the real v2.0 data)",
      "macro_f1 = sklearn's macro F1 over the labels present in the evaluated split (WILDS' "
      "F1(average='macro') passes labels=unique(y_true)); accuracy also reported",
      f"inputs stored encoded (the JPEG files' bytes; 203,029 x 448x448x3 decoded would be "
      f"122.2 GB), decoded with Pillow to RGB and resized to {image_size}x{image_size} at read "
      "time (WILDS' target_resolution 448x448, aspect ratio not kept)",
      "every JPEG decoded once at prepare time (Pillow draft mode) to catch corrupt files"
      if verify
      else "JPEGs not verified at prepare time (verify=False)",
    ],
    "labels_present": {name: present[name] for name in SPLITS},
    "citation": wc.wilds_citation(
      {
        "title": "The iWildCam 2020 Competition Dataset",
        "authors": "Beery, Cole, Gjoka",
        "year": 2020,
        "arxiv": "2004.10340",
      }
    ),
  }
  return Source(
    dataset="iwildcam",
    x_shape=(int(image_size), int(image_size), 3),
    x_dtype="uint8",
    y_shape=(),
    y_dtype="int32",
    groups=tuple(f"location_{i}" for i in range(num_locations)),
    splits=tuple(split_sources),
    info=info,
    encoding="image",
  )


# The stand-in's rows: (split, location, label, (width, height)). Locations 0-2 are training
# locations (train / id_val / id_test), 3 is OOD val, 4 OOD test; label 5 is only in val, label 4
# absent from val, label 0 absent from test.
STANDIN_ROWS = (
  ("train", 0, 0, (40, 30)),
  ("train", 0, 1, (32, 32)),
  ("train", 0, 2, (48, 36)),
  ("train", 1, 0, (40, 30)),
  ("train", 1, 3, (24, 40)),
  ("train", 2, 4, (40, 30)),
  ("train", 2, 0, (32, 24)),
  ("train", 2, 1, (40, 30)),
  ("id_val", 0, 1, (40, 30)),
  ("id_val", 2, 4, (32, 32)),
  ("id_test", 1, 3, (40, 30)),
  ("id_test", 0, 0, (48, 36)),
  ("val", 3, 5, (40, 30)),
  ("val", 3, 1, (32, 24)),
  ("val", 3, 0, (40, 30)),
  ("test", 4, 2, (24, 40)),
  ("test", 4, 3, (40, 30)),
  ("test", 4, 4, (40, 30)),
)


def write_standin(path: str, seed: int = 0) -> str:
  """A tiny iWildCam-WILDS directory (18 JPEGs of several sizes over 5 locations and all five
  split strings, the header and columns of the real ``metadata.csv``) under
  ``path/iwildcam_v2.0``; returns ``path``."""
  from PIL import Image

  rng = np.random.default_rng(seed)
  root = os.path.join(os.fspath(path), FOLDER)
  os.makedirs(os.path.join(root, "train"), exist_ok=True)
  lines = [
    ",split,location_remapped,location,sequence_remapped,sequence,y,category_id,datetime,"
    "filename,image_id"
  ]
  for i, (split, loc, y, (w, h)) in enumerate(STANDIN_ROWS):
    image_id = "-".join(
      "".join(f"{b:02x}" for b in rng.integers(0, 256, size=n, dtype=np.uint8))
      for n in (4, 2, 2, 2, 6)
    )
    filename = f"{image_id}.jpg"
    pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").save(os.path.join(root, "train", filename), quality=90)
    stamp = (
      f"2013-0{1 + i % 9}-{10 + i:02d} {i % 24:02d}:{(7 * i) % 60:02d}:{(13 * i) % 60:02d}.000"
    )
    lines.append(
      f"{i},{split},{loc},{100 + 7 * loc},{i},seq{i:04d},{y},{[0, 3, 7, 9, 11, 14][y]},{stamp},"
      f"{filename},{image_id}"
    )
  with open(os.path.join(root, METADATA), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return os.fspath(path)
