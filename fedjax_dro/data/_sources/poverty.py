"""PovertyMap-WILDS (v1.1): an asset-wealth index from 8-band satellite tiles, African countries.

Layout read (WILDS' ``poverty_v1.1/`` download, as ``wilds/datasets/poverty_dataset.py`` reads
it; ``path`` may be that folder or the folder holding it)::

  poverty_v1.1/dhs_metadata.csv   columns read: country (one of WILDS' 23 DHS_COUNTRIES, e.g.
                                  ``democratic_republic_of_congo``), urban (``True`` / ``False``;
                                  ``1`` / ``0`` accepted), wealthpooled (the label); others
                                  (cluster, lat, lon, year, ...) ignored
  poverty_v1.1/images/landsat_poverty_img_{idx}.npz   key ``x``: [8, 224, 224] channel-first,
                                  already mean/std normalised (idx = the row's 0-based index in
                                  the CSV); bands BLUE GREEN RED SWIR1 SWIR2 TEMP1 NIR NIGHTLIGHTS

Splits: WILDS' ``official`` (= ``countries``) scheme of fold ``fold`` (option, default ``"A"``,
WILDS' ``_SURVEY_NAMES_2009_17A``): the fold's test countries are ``test``, its val countries
``val`` (OOD), the rest in-distribution. Of those, exactly as WILDS' ``subsample_idxs`` does,
the ascending row indices are shuffled by ``np.random.default_rng(ord(fold) + 541433)``; the first
``n_eval`` are split in half into ``id_val`` and ``id_test``, the rest is ``train``. WILDS takes
``n_eval = 2000``; here ``n_eval = min(2000, n_in_distribution // 5)``, which is 2000 on the real
data (11,797 in-distribution rows in fold A) and leaves a stand-in a training set. Published fold
A counts: train 9,797, id_val 1,000, id_test 1,000, val 3,909, test 3,963 (19,669 tiles).

Fold A (from WILDS' code): train countries cameroon, democratic_republic_of_congo, ghana, kenya,
lesotho, malawi, mozambique, nigeria, senegal, togo, uganda, zambia, zimbabwe (13); val benin,
burkina_faso, guinea, sierra_leone, tanzania; test angola, cote_d_ivoire, ethiopia, mali, rwanda.

Clients: countries. ``train``, ``id_val`` and ``id_test`` have the fold's training countries,
``val`` and ``test`` their countries, each in the fold's (alphabetical) order, a country without
rows in the split left out; a client's rows come in CSV order. ``groups`` = ``("rural",
"urban")`` by ``urban`` (WILDS' eval grouper); metrics: Pearson r overall and the worst over
rural / urban (WILDS also reports MSE).

Storage: decoded, channel-last: ``x`` ``[224, 224, 8]`` (the tiles' ``[8, 224, 224]`` transposed)
of ``dtype`` (option): float32, 1,605,632 bytes a tile, 19,669 tiles = 31.6 GB (29.4 GiB); or
``dtype="float16"``, 15.8 GB (14.7 GiB). ``y`` float32 ``wealthpooled``, shape ``()``. The tile size
is read from the first tile (224 on the real data; the stand-in's tiles are smaller) and every tile
must match it.
"""

from __future__ import annotations

import os
import types
import zipfile
import zlib
from typing import List

import numpy as np

from fedjax_dro.data._sources import wilds_common as wc
from fedjax_dro.data._sources.base import Source, SourceError, SplitSource, read_csv

FOLDER = "poverty_v1.1"
METADATA = "dhs_metadata.csv"
REQUIRED = ("country", "urban", "wealthpooled")
BANDS = ("BLUE", "GREEN", "RED", "SWIR1", "SWIR2", "TEMP1", "NIR", "NIGHTLIGHTS")
DHS_COUNTRIES = (
  "angola", "benin", "burkina_faso", "cameroon", "cote_d_ivoire",
  "democratic_republic_of_congo", "ethiopia", "ghana", "guinea", "kenya",
  "lesotho", "malawi", "mali", "mozambique", "nigeria", "rwanda", "senegal",
  "sierra_leone", "tanzania", "togo", "uganda", "zambia", "zimbabwe",
)  # fmt: skip
# WILDS' _SURVEY_NAMES_2009_17{A..E}: (val countries, test countries); train = the rest.
FOLDS = types.MappingProxyType(
  {
    "A": (
      ("benin", "burkina_faso", "guinea", "sierra_leone", "tanzania"),
      ("angola", "cote_d_ivoire", "ethiopia", "mali", "rwanda"),
    ),
    "B": (
      ("cameroon", "ghana", "malawi", "zimbabwe"),
      ("benin", "burkina_faso", "guinea", "sierra_leone", "tanzania"),
    ),
    "C": (
      ("democratic_republic_of_congo", "mozambique", "nigeria", "togo", "uganda"),
      ("cameroon", "ghana", "malawi", "zimbabwe"),
    ),
    "D": (
      ("kenya", "lesotho", "senegal", "zambia"),
      ("democratic_republic_of_congo", "mozambique", "nigeria", "togo", "uganda"),
    ),
    "E": (
      ("angola", "cote_d_ivoire", "ethiopia", "mali", "rwanda"),
      ("kenya", "lesotho", "senegal", "zambia"),
    ),
  }
)
SPLITS = ("train", "id_val", "id_test", "val", "test")
NUM_EVAL = 2000  # WILDS' in-distribution eval rows (id_val + id_test)
SUBSAMPLE_SEED = 541433  # WILDS' subsample_idxs adds this to the seed ord(fold)
URBAN = types.MappingProxyType({"true": 1, "false": 0, "1": 1, "0": 0, "1.0": 1, "0.0": 0})


def fold_countries(fold: str) -> dict:
  """The fold's countries per split role: ``{"train": ..., "val": ..., "test": ...}``."""
  val, test = FOLDS[fold]
  train = tuple(c for c in DHS_COUNTRIES if c not in val and c not in test)
  return {"train": train, "val": val, "test": test}


def wilds_split(countries: List[str], fold: str) -> np.ndarray:
  """Each row's split name (WILDS' fold logic, see the module docstring)."""
  roles = fold_countries(fold)
  out = np.empty(len(countries), dtype=object)
  role = np.asarray(
    ["test" if c in roles["test"] else "val" if c in roles["val"] else "id" for c in countries]
  )
  out[role == "test"] = "test"
  out[role == "val"] = "val"
  idxs = np.arange(len(countries))[role == "id"]
  n_eval = min(NUM_EVAL, len(idxs) // 5)
  rng = np.random.default_rng(ord(fold) + SUBSAMPLE_SEED)
  shuffled = idxs.copy()
  rng.shuffle(shuffled)
  out[shuffled[n_eval:]] = "train"
  out[shuffled[: n_eval // 2]] = "id_val"
  out[shuffled[n_eval // 2 : n_eval]] = "id_test"
  return out


def tile_path(root: str, idx: int) -> str:
  return os.path.join(root, "images", f"landsat_poverty_img_{idx}.npz")


def read_tile(file: str, size=None) -> np.ndarray:
  """A tile's ``x`` ``[8, s, s]`` (a one-line :class:`SourceError` naming ``file`` when it is not
  a readable npz, lacks ``x``, or has another shape)."""
  try:
    with np.load(file, allow_pickle=False) as npz:
      if "x" not in npz.files:
        raise SourceError(f"{file}: no array 'x' (arrays: {npz.files})")
      x = npz["x"]
  except SourceError:
    raise
  except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
    raise SourceError(f"{file}: cannot be read as .npz ({type(e).__name__}: {e})") from None
  if x.ndim != 3 or x.shape[0] != len(BANDS) or x.shape[1] != x.shape[2]:
    raise SourceError(f"{file}: 'x' has shape {x.shape}, expected (8, size, size)")
  if size is not None and x.shape[1] != size:
    raise SourceError(f"{file}: 'x' has shape {x.shape}, expected (8, {size}, {size})")
  if not np.issubdtype(x.dtype, np.floating):
    raise SourceError(f"{file}: 'x' has dtype {x.dtype}, expected a float")
  return x


def source(path: str, fold: str = "A", dtype: str = "float32") -> Source:
  """The PovertyMap-WILDS directory at ``path`` as a :class:`Source` (see the module docstring);
  the metadata and the presence of every tile are checked before it returns (the tiles' contents
  as their rows are read)."""
  if fold not in FOLDS:
    raise ValueError(f"fold must be one of {sorted(FOLDS)}, got {fold!r}")
  if dtype not in ("float32", "float16"):
    raise ValueError(f"dtype must be 'float32' or 'float16', got {dtype!r}")
  root = wc.resolve_dir(path, FOLDER, METADATA)
  meta = os.path.join(root, METADATA)
  cols = read_csv(meta, REQUIRED)
  countries = wc.choice_column(meta, cols, "country", DHS_COUNTRIES)
  urban = []
  for i, text in enumerate(cols["urban"]):
    if text.strip().lower() not in URBAN:
      raise SourceError(
        f"{meta}: line {i + 2}: column 'urban' holds {text!r}, expected True/False or 1/0"
      )
    urban.append(URBAN[text.strip().lower()])
  wealth = np.asarray(wc.float_column(meta, cols, "wealthpooled"), np.float32)
  if not countries:
    raise SourceError(f"{meta}: no rows")
  files = [tile_path(root, i) for i in range(len(countries))]
  wc.check_files(files, meta)
  size = read_tile(files[0]).shape[1]

  split = wilds_split(countries, fold)
  roles = fold_countries(fold)
  split_countries = {
    "train": roles["train"],
    "id_val": roles["train"],
    "id_test": roles["train"],
    "val": roles["val"],
    "test": roles["test"],
  }
  groups = np.asarray(urban, np.int32)

  def load(rows):
    x = np.stack([np.transpose(read_tile(files[r], size), (1, 2, 0)).astype(dtype) for r in rows])
    return x, wealth[list(rows)], groups[list(rows)]

  split_sources = []
  for name in SPLITS:
    row_lists = [
      [i for i in range(len(countries)) if split[i] == name and countries[i] == c]
      for c in split_countries[name]
    ]
    kept = [(c, r) for c, r in zip(split_countries[name], row_lists) if r]

    def rows(i, kept=kept):
      return wc.chunks(kept[i][1], load)

    split_sources.append(
      SplitSource(
        name=name,
        clients=tuple(c for c, _ in kept),
        rows=rows,
        num_rows=tuple(len(r) for _, r in kept),
      )
    )
  info = {
    "task": "regression",
    "metrics": ["pearson_r", "worst_group_pearson_r"],
    "label_names": ["wealthpooled"],
    "bands": list(BANDS),
    "protocol": [
      f"WILDS 'official' (countries) scheme, fold {fold}: OOD val countries {list(roles['val'])}, "
      f"OOD test countries {list(roles['test'])}, training countries {list(roles['train'])}",
      "in-distribution rows shuffled as WILDS' subsample_idxs (np.random.default_rng(ord(fold) "
      "+ 541433) on the ascending indices): first n_eval halved into id_val / id_test, the rest "
      "train; n_eval = min(2000, in-distribution rows // 5) (WILDS: 2000; equal on the real data)",
      "clients = countries: train / id_val / id_test the fold's training countries, val / test "
      "their countries; a country without rows in a split left out; rows in CSV order",
      f"inputs stored decoded {dtype}, channel-last [{size}, {size}, 8] (the npz tiles' "
      "[8, size, size] transposed); already normalised by WILDS, nightlights band kept (no_nl "
      "False)",
      "groups = rural / urban from the urban column (WILDS' eval grouper); metrics Pearson r "
      "overall and worst over the two groups (WILDS also reports MSE)",
    ],
    "citation": wc.wilds_citation(
      {
        "title": "Using publicly available satellite imagery and deep learning to understand "
        "economic well-being in Africa",
        "authors": "Yeh, Perez, Driscoll, Azzari, Tang, Lobell, Ermon, Burke",
        "year": 2020,
        "venue": "Nature Communications 11",
      }
    ),
  }
  return Source(
    dataset="poverty",
    x_shape=(size, size, len(BANDS)),
    x_dtype=dtype,
    y_shape=(),
    y_dtype="float32",
    groups=("rural", "urban"),
    splits=tuple(split_sources),
    info=info,
  )


# The stand-in's rows per country: (country, rows); fold A's train (6 countries), val (2) and
# test (2) countries.
STANDIN_COUNTRIES = (
  ("kenya", 4),
  ("malawi", 3),
  ("nigeria", 4),
  ("democratic_republic_of_congo", 3),
  ("angola", 2),
  ("benin", 2),
  ("ghana", 3),
  ("tanzania", 2),
  ("zambia", 3),
  ("rwanda", 2),
)
STANDIN_SIZE = 8


def write_standin(path: str, seed: int = 0) -> str:
  """A tiny PovertyMap-WILDS directory (28 tiles of 8x8x8 float32 over 10 of fold A's
  countries, rows interleaved across countries as in the real CSV) under ``path/poverty_v1.1``;
  returns ``path``."""
  rng = np.random.default_rng(seed)
  root = os.path.join(os.fspath(path), FOLDER)
  os.makedirs(os.path.join(root, "images"), exist_ok=True)
  order = [c for c, n in STANDIN_COUNTRIES for _ in range(n)]
  order = [order[i] for i in rng.permutation(len(order))]
  lines = ["country,cluster,lat,lon,wealthpooled,year,urban,nl_mean,nl_median,households"]
  for i, country in enumerate(order):
    urban = bool(rng.integers(0, 2))
    wealth = float(np.round(rng.normal(), 6))
    lat, lon = float(np.round(rng.uniform(-20, 10), 6)), float(np.round(rng.uniform(-10, 40), 6))
    lines.append(
      f"{country},{i + 1},{lat},{lon},{wealth},{2009 + i % 8},{urban},{abs(wealth):.3f},0.0,"
      f"{int(rng.integers(5, 30))}"
    )
    x = rng.normal(size=(len(BANDS), STANDIN_SIZE, STANDIN_SIZE)).astype(np.float32)
    np.savez_compressed(tile_path(root, i), x=x)
  with open(os.path.join(root, METADATA), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return os.fspath(path)
