"""The by-writer digits stand-in (``digits_by_writer``) and the LEAF FEMNIST digits reader
(``load_femnist_digits``) on small LEAF JSON files written here."""

import json
import os

import numpy as np
import pytest

from fedjax_dro.data import load_femnist_digits
from fedjax_dro.data.femnist_digits import (
  STYLE_GROUPS,
  digits_by_writer,
  resize_images,
  writer_style_groups,
)


@pytest.fixture(scope="module")
def writers():
  return digits_by_writer(24, examples_per_writer=20, seed=3)


def test_shapes_labels_and_names(writers):
  ds = writers
  assert ds.train.x.shape == (24, 15, 16, 16) and ds.test.x.shape == (24, 5, 16, 16)
  assert ds.task == "classification" and ds.num_classes == 10
  for split in (ds.train, ds.test):
    x, y = np.asarray(split.x), np.asarray(split.y)
    assert x.dtype == np.float32 and x.min() >= 0.0 and x.max() <= 1.0
    assert y.min() >= 0 and y.max() <= 9
  groups = writer_style_groups(ds)
  assert np.bincount(groups).tolist() == [6] * len(STYLE_GROUPS)  # 24 writers over 4 groups
  assert ds.client_names[0].startswith("writer000/style")


def test_deterministic_from_the_seed(writers):
  again = digits_by_writer(24, examples_per_writer=20, seed=3)
  other = digits_by_writer(24, examples_per_writer=20, seed=4)
  np.testing.assert_array_equal(np.asarray(again.train.x), np.asarray(writers.train.x))
  np.testing.assert_array_equal(np.asarray(again.test.y), np.asarray(writers.test.y))
  assert not np.array_equal(np.asarray(other.train.x), np.asarray(writers.train.x))


def _ink_stats(ds):
  """Per writer: mean ink per image, mean height of the inked rows, mean slant (the column
  centre of the top half minus that of the bottom half)."""
  x = np.asarray(ds.train.x)
  ink = x.sum((2, 3)).mean(1)
  rows_on = (x > 0.3).any(3)  # [n, m, rows]
  height = rows_on.sum(2).mean(1)
  cols = np.arange(x.shape[3])
  half = x.shape[2] // 2

  def centre(part):
    mass = part.sum((2, 3)) + 1e-9
    return (part.sum(2) * cols).sum(2) / mass

  slant = (centre(x[:, :, :half]) - centre(x[:, :, half:])).mean(1)
  return ink, height, slant


def test_style_groups_differ_measurably():
  ds = digits_by_writer(40, examples_per_writer=30, seed=0)
  g = writer_style_groups(ds)
  ink, height, slant = _ink_stats(ds)
  by = lambda v: np.array([v[g == k].mean() for k in range(len(STYLE_GROUPS))])
  ink_g, height_g, slant_g = by(ink), by(height), by(slant)
  # group 0 writes small and thin, groups 1 and 3 thick: every writer of group 0 inks less than
  # every writer of groups 1 and 3
  assert ink[g == 0].max() < min(ink[g == 1].min(), ink[g == 3].min())
  assert height_g[0] < height_g[1] - 2.0  # small (scale 0.72) against large (1.12), in rows
  # group 1 leans right, group 2 left: the top of the digits sits right of the bottom
  assert slant_g[1] > 0.5 and slant_g[2] < -0.3 and slant_g[1] - slant_g[2] > 1.0
  assert ink_g.argmin() == 0 and ink_g.argmax() in (1, 3)


def test_quirks_change_ones_and_sevens_only(monkeypatch):
  from fedjax_dro.data import femnist_digits as W

  monkeypatch.setitem(W.WRITER_JITTER, "quirk_flip", 0.0)  # every writer has its group's quirks
  quirky = digits_by_writer(8, examples_per_writer=60, seed=1)
  plain_groups = tuple({**g, "serif_one": False, "crossed_seven": False} for g in STYLE_GROUPS)
  monkeypatch.setattr(W, "STYLE_GROUPS", plain_groups)
  plain = digits_by_writer(8, examples_per_writer=60, seed=1)  # the same draws, no quirks
  g = writer_style_groups(quirky)
  xq, xp, y = np.asarray(quirky.train.x), np.asarray(plain.train.x), np.asarray(quirky.train.y)
  for w in range(8):
    style = STYLE_GROUPS[g[w]]
    for d in range(10):
      rows = y[w] == d
      quirk = (d == 1 and style["serif_one"]) or (d == 7 and style["crossed_seven"])
      if not quirk:  # every other digit is drawn exactly alike
        np.testing.assert_array_equal(xq[w, rows], xp[w, rows])
      elif rows.any():  # the flag and serif / the bar add ink to every such digit
        added = xq[w, rows].sum((1, 2)) - xp[w, rows].sum((1, 2))
        assert added.min() > 1.0, (w, d, added)


def test_resize_keeps_constant_images_and_range():
  x = np.full((2, 8, 8), 0.5, np.float32)
  np.testing.assert_allclose(resize_images(x, 16), 0.5)
  r = resize_images(np.random.default_rng(0).random((3, 8, 8)), 13)
  assert r.shape == (3, 13, 13) and r.min() >= 0.0 and r.max() <= 1.0


def test_style_mixing_makes_a_continuum_between_groups():
  """Mixing spreads the writers' heights over the gap between the small and the large group:
  writers of group 0 that mixed in a larger style's size write measurably larger than without
  mixing; with style_mixing=0 the data are unchanged."""
  plain = digits_by_writer(40, examples_per_writer=30, seed=0)
  same = digits_by_writer(40, examples_per_writer=30, seed=0, style_mixing=0.0)
  np.testing.assert_array_equal(np.asarray(plain.train.x), np.asarray(same.train.x))
  mixed = digits_by_writer(40, examples_per_writer=30, seed=0, style_mixing=1.0)
  g = writer_style_groups(plain)
  h0, h1 = _ink_stats(plain)[1], _ink_stats(mixed)[1]
  assert h1[g == 0].mean() > h0[g == 0].mean() + 0.5  # group 0 (the smallest) grows on average
  assert np.std(h1[g == 0]) > 1.5 * np.std(h0[g == 0])  # and spreads out


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(num_writers=0), "num_writers"),
    (dict(examples_per_writer=1), "examples_per_writer"),
    (dict(examples_per_writer=5000), "examples_per_writer"),
    (dict(image_size=4), "image_size"),
    (dict(test_fraction=0.0), "test_fraction"),
    (dict(test_fraction=0.01), "test_fraction"),
    (dict(test_fraction="a"), "test_fraction"),
    (dict(seed=1.5), "seed"),
    (dict(style_mixing=1.5), "style_mixing"),
    (dict(style_mixing=True), "style_mixing"),
  ],
)
def test_bad_inputs_are_named(kwargs, match):
  with pytest.raises((ValueError, TypeError), match=match):
    digits_by_writer(**kwargs)


# ---------------------------------------------------------------------------------------------
# LEAF FEMNIST


def _leaf_file(path, writers, rng, side=28, light=True):
  """A LEAF JSON file: ``writers`` is ``{name: labels}``; images are random, dark ink on light
  background (as LEAF stores FEMNIST) when ``light``."""
  doc = {"users": [], "num_samples": [], "user_data": {}}
  for name, labels in writers.items():
    x = rng.random((len(labels), side * side)) * 0.3
    if light:
      x = 1.0 - x
    doc["users"].append(name)
    doc["num_samples"].append(len(labels))
    doc["user_data"][name] = {"x": x.round(3).tolist(), "y": [int(v) for v in labels]}
  with open(path, "w") as f:
    json.dump(doc, f)


def _split_leaf(tmp_path):
  rng = np.random.default_rng(0)
  for part in ("train", "test"):
    os.makedirs(tmp_path / part)
  train = {
    "f0001": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 40, 61],  # 10 digits, 3 letters
    "f0002": [3, 3, 12, 13, 14, 5],  # 3 digits: dropped with min_rows=4
    "f0003": [9, 8, 7, 6, 10, 20, 0],  # 5 digits
  }
  test = {"f0001": [1, 35, 2], "f0002": [1], "f0003": [36, 4]}
  _leaf_file(tmp_path / "train" / "a.json", train, rng)
  _leaf_file(tmp_path / "test" / "a.json", test, rng)
  return tmp_path


def test_leaf_split_layout_keeps_digits_and_writers_with_enough_rows(tmp_path):
  ds = load_femnist_digits(_split_leaf(tmp_path), min_rows=4)
  assert ds.client_names == ["f0001", "f0003"]
  nex = np.asarray(ds.train.num_examples).tolist()
  assert nex == [10, 5] and np.asarray(ds.test.num_examples).tolist() == [2, 1]
  y = np.asarray(ds.train.y)
  assert sorted(y[0, :10].tolist()) == list(range(10)) and sorted(y[1, :5].tolist()) == [
    0,
    6,
    7,
    8,
    9,
  ]
  assert np.asarray(ds.test.y)[1, 0] == 4
  x = np.asarray(ds.train.x)
  assert x.shape[2:] == (16, 16)
  # LEAF's light background is inverted: ink (here 0.7-1 on the light side) becomes <= 0.3
  assert x[0, :10].max() <= 0.31 and x[0, :10].min() >= 0.0


def test_leaf_cap_and_image_size(tmp_path):
  ds = load_femnist_digits(_split_leaf(tmp_path), min_rows=2, max_writers=2, image_size=14)
  assert ds.client_names == ["f0001", "f0002"] and ds.train.x.shape[2:] == (14, 14)


def test_leaf_single_folder_is_split_per_writer(tmp_path):
  rng = np.random.default_rng(1)
  _leaf_file(tmp_path / "all.json", {"u1": list(range(10)) * 2 + [50], "u2": [1] * 3}, rng)
  ds = load_femnist_digits(tmp_path, min_rows=5, test_fraction=0.25, seed=0)
  assert ds.client_names == ["u1"]  # u2: 3 digits, 1 to test, 2 < min_rows left
  assert int(ds.train.num_examples[0]) == 15 and int(ds.test.num_examples[0]) == 5
  again = load_femnist_digits(tmp_path, min_rows=5, test_fraction=0.25, seed=0)
  np.testing.assert_array_equal(np.asarray(again.test.y), np.asarray(ds.test.y))


def test_leaf_bad_inputs(tmp_path):
  with pytest.raises(FileNotFoundError, match="leaf_dir"):
    load_femnist_digits(tmp_path / "missing")
  rng = np.random.default_rng(2)
  _leaf_file(tmp_path / "letters.json", {"u1": [10, 11, 12, 40], "u2": [61, 35]}, rng)
  with pytest.raises(ValueError, match="digit rows"):
    load_femnist_digits(tmp_path)
  with pytest.raises(ValueError, match="max_writers"):
    load_femnist_digits(tmp_path, max_writers=0)
  with pytest.raises(ValueError, match="min_rows"):
    load_femnist_digits(tmp_path, min_rows=0)
  empty = tmp_path / "empty"
  os.makedirs(empty)
  with pytest.raises(ValueError, match="no \\*.json"):
    load_femnist_digits(empty)
  _leaf_file(tmp_path / "odd.json", {"u3": [1] * 12}, rng, side=5)
  bad = tmp_path / "odd_only"
  os.makedirs(bad)
  os.replace(tmp_path / "odd.json", bad / "odd.json")
  doc = json.load(open(bad / "odd.json"))
  doc["user_data"]["u3"]["x"] = [row[:24] for row in doc["user_data"]["u3"]["x"]]
  json.dump(doc, open(bad / "odd.json", "w"))
  with pytest.raises(ValueError, match="not a square image"):
    load_femnist_digits(bad)
