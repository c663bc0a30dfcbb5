"""The WILDS image readers (Camelyon17, iWildCam, PovertyMap) against their stand-ins.

Expectations are re-derived here from the stand-ins' files with the csv module, Pillow and NumPy
(not with the readers' helpers); each hostile file gets its own test.
"""

import csv
import filecmp
import json
import os

import numpy as np
import pytest
from PIL import Image

from fedjax_dro.data._sources import camelyon17, iwildcam, poverty
from fedjax_dro.data._sources.base import SourceError


def _csv(file):
  with open(file, newline="") as f:
    rows = list(csv.reader(f))
  return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


def _read_all(split):
  """Per client: (x list, y, group) concatenated over the chunks, checking chunk sizes."""
  out = []
  for i in range(len(split.clients)):
    xs, ys, gs = [], [], []
    for x, y, g in split.rows(i):
      assert 1 <= len(y) <= 256 and len(x) == len(y) == len(g)
      assert g.dtype == np.int32
      xs.extend(list(x))
      ys.extend(y.tolist())
      gs.extend(g.tolist())
    out.append((xs, ys, gs))
  return out


def _rewrite_csv(file, edit):
  header, rows = _csv(file)
  header, rows = edit(header, rows)
  with open(file, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(header)
    for r in rows:
      w.writerow([r.get(h, "") for h in header])


def _truncate(file):
  with open(file, "rb") as f:
    data = f.read()
  with open(file, "wb") as f:
    f.write(data[: len(data) // 2])


def _consume(src):
  for split in src.splits:
    for i in range(len(split.clients)):
      for _ in split.rows(i):
        pass


# ---------------------------------------------------------------------------------------------
# Camelyon17


@pytest.fixture
def cam(tmp_path):
  return camelyon17.write_standin(str(tmp_path), seed=3)


def test_camelyon_matches_standin(cam):
  root = os.path.join(cam, "camelyon17_v1.0")
  header, rows = _csv(os.path.join(root, "metadata.csv"))
  assert header[0] == ""  # pandas' unnamed index column, as in the real file
  assert {r["patient"] for r in rows} >= {"004", "009", "042"}  # zero-padded ids
  assert {r["center"] for r in rows} == {"0", "1", "2", "3", "4"}
  assert {r["split"] for r in rows if r["center"] in "034"} == {"0", "1"}
  assert {r["split"] for r in rows if r["center"] in "12"} == {"0", "1"}

  def split_of(r):
    if r["center"] == "1":
      return "val"
    if r["center"] == "2":
      return "test"
    return "train" if r["split"] == "0" else "id_val"

  expected_clients = {
    "train": ["0", "3", "4"],
    "id_val": ["0", "3", "4"],
    "val": ["1"],
    "test": ["2"],
  }
  src = camelyon17.source(cam)
  assert src.dataset == "camelyon17"
  assert (src.x_shape, src.x_dtype, src.y_shape, src.y_dtype) == ((96, 96, 3), "uint8", (), "int32")
  assert src.groups == tuple(f"hospital_{c}" for c in range(5))
  assert src.encoding is None
  assert [s.name for s in src.splits] == ["train", "id_val", "val", "test"]
  for split in src.splits:
    centers = expected_clients[split.name]
    assert split.clients == tuple(f"hospital_{c}" for c in centers)
    got = _read_all(split)
    for c, (xs, ys, gs) in zip(centers, got):
      mine = [r for r in rows if r["center"] == c and split_of(r) == split.name]
      assert len(mine) > 0
      assert ys == [int(r["tumor"]) for r in mine]
      assert gs == [int(c)] * len(mine)
      for x, r in zip(xs, mine):
        p, n = r["patient"], r["node"]
        file = os.path.join(
          root,
          "patches",
          f"patient_{p}_node_{n}",
          f"patch_patient_{p}_node_{n}_x_{r['x_coord']}_y_{r['y_coord']}.png",
        )
        np.testing.assert_array_equal(x, np.asarray(Image.open(file).convert("RGB")))
    assert split.num_rows == tuple(len(g[1]) for g in got)
  assert sum(sum(s.num_rows) for s in src.splits) == len(rows)
  assert src.info["num_classes"] == 2 and src.info["metrics"] == ["accuracy"]
  json.dumps(src.info)
  # The dataset folder itself is accepted too.
  assert camelyon17.source(root).splits[0].num_rows == src.splits[0].num_rows


def test_camelyon_standin_deterministic(tmp_path):
  a = camelyon17.write_standin(str(tmp_path / "a"), seed=1)
  b = camelyon17.write_standin(str(tmp_path / "b"), seed=1)
  c = camelyon17.write_standin(str(tmp_path / "c"), seed=2)
  meta = "camelyon17_v1.0/metadata.csv"
  assert filecmp.cmp(os.path.join(a, meta), os.path.join(b, meta), shallow=False)
  assert not filecmp.cmp(os.path.join(a, meta), os.path.join(c, meta), shallow=False)


def test_camelyon_truncated_png(cam):
  root = os.path.join(cam, "camelyon17_v1.0")
  _, rows = _csv(os.path.join(root, "metadata.csv"))
  r = rows[0]
  p, n = r["patient"], r["node"]
  name = f"patch_patient_{p}_node_{n}_x_{r['x_coord']}_y_{r['y_coord']}.png"
  file = os.path.join(root, f"patches/patient_{p}_node_{n}", name)
  _truncate(file)
  src = camelyon17.source(cam)  # the layout is fine; the PNG fails when its row is read
  with pytest.raises(SourceError) as e:
    _consume(src)
  assert file in str(e.value) and "\n" not in str(e.value)


def test_camelyon_missing_column(cam):
  meta = os.path.join(cam, "camelyon17_v1.0", "metadata.csv")
  _rewrite_csv(meta, lambda h, rows: ([c for c in h if c != "tumor"], rows))
  with pytest.raises(SourceError, match="missing required column 'tumor'") as e:
    camelyon17.source(cam)
  assert meta in str(e.value)


def test_camelyon_unknown_split(cam):
  meta = os.path.join(cam, "camelyon17_v1.0", "metadata.csv")

  def edit(h, rows):
    rows[4]["split"] = "2"
    return h, rows

  _rewrite_csv(meta, edit)
  with pytest.raises(SourceError, match="line 6: column 'split' holds 2") as e:
    camelyon17.source(cam)
  assert meta in str(e.value)


def test_camelyon_missing_patch(cam):
  root = os.path.join(cam, "camelyon17_v1.0")
  folder = sorted(os.listdir(os.path.join(root, "patches")))[0]
  victim = os.path.join(
    root, "patches", folder, sorted(os.listdir(os.path.join(root, "patches", folder)))[0]
  )
  os.remove(victim)
  with pytest.raises(SourceError, match="file not found") as e:
    camelyon17.source(cam)
  assert victim in str(e.value)


# ---------------------------------------------------------------------------------------------
# iWildCam


@pytest.fixture
def cam_traps(tmp_path):
  return iwildcam.write_standin(str(tmp_path), seed=5)


def test_iwildcam_standin_quirks(cam_traps):
  root = os.path.join(cam_traps, "iwildcam_v2.0")
  header, rows = _csv(os.path.join(root, "metadata.csv"))
  assert header[0] == ""
  assert {r["split"] for r in rows} == {"train", "val", "test", "id_val", "id_test"}
  sizes = {Image.open(os.path.join(root, "train", r["filename"])).size for r in rows}
  assert len(sizes) >= 3  # JPEGs of several sizes
  assert all(Image.open(os.path.join(root, "train", r["filename"])).format == "JPEG" for r in rows)
  labels = {s: {r["y"] for r in rows if r["split"] == s} for s in ("train", "val", "test")}
  all_labels = {r["y"] for r in rows}
  assert all(labels[s] < all_labels for s in labels)  # every split lacks some label


@pytest.mark.parametrize("k", [None, 2])
def test_iwildcam_matches_standin(cam_traps, k):
  root = os.path.join(cam_traps, "iwildcam_v2.0")
  _, rows = _csv(os.path.join(root, "metadata.csv"))
  src = iwildcam.source(cam_traps, clients=k)
  assert src.dataset == "iwildcam" and src.encoding == "image"
  assert (src.x_shape, src.x_dtype, src.y_shape, src.y_dtype) == (
    (448, 448, 3),
    "uint8",
    (),
    "int32",
  )
  n_loc = max(int(r["location_remapped"]) for r in rows) + 1
  assert src.groups == tuple(f"location_{i}" for i in range(n_loc))
  assert src.info["num_classes"] == max(int(r["y"]) for r in rows) + 1 == 6
  assert src.info["metrics"][0] == "macro_f1"
  json.dumps(src.info)
  assert [s.name for s in src.splits] == ["train", "id_val", "id_test", "val", "test"]
  # Expected clients: per location sorted by id, or the stand-in's locations dealt into 2 by
  # descending count (train: location 0 has 3 rows, 2 has 3, 1 has 2 -> {0, 1}, {2}).
  if k is None:
    expect = {
      "train": [[0], [1], [2]],
      "id_val": [[0], [2]],
      "id_test": [[0], [1]],
      "val": [[3]],
      "test": [[4]],
    }
  else:
    expect = {
      "train": [[0, 1], [2]],
      "id_val": [[0], [2]],
      "id_test": [[0], [1]],
      "val": [[3]],
      "test": [[4]],
    }
  for split in src.splits:
    locs = expect[split.name]
    if k is None:
      assert split.clients == tuple(f"location_{ls[0]}" for ls in locs)
    else:
      assert split.clients == tuple(f"client_{c}" for c in range(len(locs)))
    got = _read_all(split)
    assert len(got) == len(locs)
    for ls, (xs, ys, gs) in zip(locs, got):
      mine = [r for r in rows if r["split"] == split.name and int(r["location_remapped"]) in ls]
      assert ys == [int(r["y"]) for r in mine]
      assert gs == [int(r["location_remapped"]) for r in mine]
      for x, r in zip(xs, mine):
        with open(os.path.join(root, "train", r["filename"]), "rb") as f:
          assert x == f.read()  # the JPEG file's own bytes
    assert split.num_rows == tuple(len(g[1]) for g in got)
  present = src.info["labels_present"]
  assert present["val"] == sorted({int(r["y"]) for r in rows if r["split"] == "val"})


def test_iwildcam_image_size_option(cam_traps):
  src = iwildcam.source(os.path.join(cam_traps, "iwildcam_v2.0"), image_size=64)
  assert src.x_shape == (64, 64, 3)


def test_iwildcam_truncated_jpeg(cam_traps):
  root = os.path.join(cam_traps, "iwildcam_v2.0")
  _, rows = _csv(os.path.join(root, "metadata.csv"))
  file = os.path.join(root, "train", rows[-1]["filename"])
  _truncate(file)
  src = iwildcam.source(cam_traps)
  with pytest.raises(SourceError) as e:
    _consume(src)
  assert file in str(e.value) and "\n" not in str(e.value)


def test_iwildcam_unknown_split(cam_traps):
  meta = os.path.join(cam_traps, "iwildcam_v2.0", "metadata.csv")

  def edit(h, rows):
    rows[5]["split"] = "vall"
    return h, rows

  _rewrite_csv(meta, edit)
  with pytest.raises(SourceError, match="line 7: unknown split 'vall'") as e:
    iwildcam.source(cam_traps)
  assert meta in str(e.value)


def test_iwildcam_missing_column(cam_traps):
  meta = os.path.join(cam_traps, "iwildcam_v2.0", "metadata.csv")
  _rewrite_csv(meta, lambda h, rows: ([c for c in h if c != "location_remapped"], rows))
  with pytest.raises(SourceError, match="missing required column 'location_remapped'") as e:
    iwildcam.source(cam_traps)
  assert meta in str(e.value)


def test_iwildcam_missing_image(cam_traps):
  root = os.path.join(cam_traps, "iwildcam_v2.0")
  _, rows = _csv(os.path.join(root, "metadata.csv"))
  file = os.path.join(root, "train", rows[3]["filename"])
  os.remove(file)
  with pytest.raises(SourceError, match="file not found") as e:
    iwildcam.source(cam_traps)
  assert file in str(e.value)


# ---------------------------------------------------------------------------------------------
# PovertyMap

FOLD_A_VAL = ["benin", "burkina_faso", "guinea", "sierra_leone", "tanzania"]
FOLD_A_TEST = ["angola", "cote_d_ivoire", "ethiopia", "mali", "rwanda"]
FOLD_A_TRAIN = [
  "cameroon", "democratic_republic_of_congo", "ghana", "kenya", "lesotho", "malawi",
  "mozambique", "nigeria", "senegal", "togo", "uganda", "zambia", "zimbabwe",
]  # fmt: skip


def _wilds_fold_a(countries, num_eval):
  """WILDS' poverty split logic for fold A (split_by_countries + subsample_idxs), written out."""
  idx = np.arange(len(countries))
  c = np.asarray(countries)
  is_test = np.isin(c, FOLD_A_TEST)
  is_val = np.isin(c, FOLD_A_VAL)
  idxs_id = idx[~is_test & ~is_val]
  shuffled = idxs_id.copy()
  np.random.default_rng(ord("A") + 541433).shuffle(shuffled)
  split = {}
  for i in idx[is_test]:
    split[int(i)] = "test"
  for i in idx[is_val]:
    split[int(i)] = "val"
  for i in shuffled[num_eval:]:
    split[int(i)] = "train"
  for i in shuffled[: num_eval // 2]:
    split[int(i)] = "id_val"
  for i in shuffled[num_eval // 2 : num_eval]:
    split[int(i)] = "id_test"
  return split


@pytest.fixture
def pov(tmp_path):
  return poverty.write_standin(str(tmp_path), seed=7)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_poverty_matches_standin(pov, dtype):
  root = os.path.join(pov, "poverty_v1.1")
  _, rows = _csv(os.path.join(root, "dhs_metadata.csv"))
  countries = [r["country"] for r in rows]
  assert set(countries) <= set(FOLD_A_TRAIN + FOLD_A_VAL + FOLD_A_TEST)
  n_id = sum(c in FOLD_A_TRAIN for c in countries)
  split = _wilds_fold_a(countries, min(2000, n_id // 5))
  src = poverty.source(pov, dtype=dtype)
  assert src.dataset == "poverty" and src.encoding is None
  assert (src.x_shape, src.x_dtype, src.y_shape, src.y_dtype) == ((8, 8, 8), dtype, (), "float32")
  assert src.groups == ("rural", "urban")
  assert src.info["task"] == "regression"
  assert src.info["metrics"] == ["pearson_r", "worst_group_pearson_r"]
  json.dumps(src.info)
  order = {"train": FOLD_A_TRAIN, "id_val": FOLD_A_TRAIN, "id_test": FOLD_A_TRAIN}
  order.update(val=FOLD_A_VAL, test=FOLD_A_TEST)
  assert [s.name for s in src.splits] == ["train", "id_val", "id_test", "val", "test"]
  total = 0
  for s in src.splits:
    members = {
      c: [i for i in range(len(rows)) if split[i] == s.name and countries[i] == c]
      for c in order[s.name]
    }
    expected_clients = [c for c in order[s.name] if members[c]]
    assert list(s.clients) == expected_clients and expected_clients
    got = _read_all(s)
    for c, (xs, ys, gs) in zip(expected_clients, got):
      idx = members[c]
      np.testing.assert_array_equal(ys, np.float32([float(rows[i]["wealthpooled"]) for i in idx]))
      assert gs == [1 if rows[i]["urban"] == "True" else 0 for i in idx]
      for x, i in zip(xs, idx):
        with np.load(os.path.join(root, "images", f"landsat_poverty_img_{i}.npz")) as z:
          tile = z["x"]
        assert tile.shape == (8, 8, 8)
        assert x.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(x, np.moveaxis(tile, 0, -1).astype(dtype))
    assert s.num_rows == tuple(len(members[c]) for c in expected_clients)
    total += sum(s.num_rows)
  assert total == len(rows)


def test_poverty_truncated_npz(pov):
  root = os.path.join(pov, "poverty_v1.1")
  file = os.path.join(root, "images", "landsat_poverty_img_5.npz")
  _truncate(file)
  src = poverty.source(pov)
  with pytest.raises(SourceError) as e:
    _consume(src)
  assert file in str(e.value) and "\n" not in str(e.value)


def test_poverty_missing_column(pov):
  meta = os.path.join(pov, "poverty_v1.1", "dhs_metadata.csv")
  _rewrite_csv(meta, lambda h, rows: ([c for c in h if c != "wealthpooled"], rows))
  with pytest.raises(SourceError, match="missing required column 'wealthpooled'") as e:
    poverty.source(pov)
  assert meta in str(e.value)


def test_poverty_unknown_country(pov):
  meta = os.path.join(pov, "poverty_v1.1", "dhs_metadata.csv")

  def edit(h, rows):
    rows[2]["country"] = "atlantis"
    return h, rows

  _rewrite_csv(meta, edit)
  with pytest.raises(SourceError, match="line 4: unknown country value 'atlantis'") as e:
    poverty.source(pov)
  assert meta in str(e.value)


def test_poverty_missing_tile(pov):
  file = os.path.join(pov, "poverty_v1.1", "images", "landsat_poverty_img_9.npz")
  os.remove(file)
  with pytest.raises(SourceError, match="file not found") as e:
    poverty.source(pov)
  assert file in str(e.value)
