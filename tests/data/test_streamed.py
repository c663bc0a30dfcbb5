"""The prepared format and streamed rounds.

* Streamed rounds equal the device-resident run of the same split bitwise (final state, train
  metrics, per-client evaluations) for FedAvg (local steps, local epochs, full batches),
  SCAFFOLD, DRFA (participants drawn from its dual weights), FGDRO-KL and Ditto, for a sweep,
  and across a kill and resume; a round reads exactly its participants' minibatch rows.
* ``prepare`` killed part-way and run again writes the uninterrupted run's arrays and manifest;
  it refuses to replace a finished directory without ``overwrite``; a disk that fills leaves the
  previous prepared directory intact; a changed array fails its checksum, naming the file.
* Encoded images come back decoded, equal to the pixels written.
"""

import dataclasses
import errno
import io
import json
import os

import jax
import numpy as np
import pytest

import fedjax_dro as fd
from fedjax_dro.data import prepared as prep
from fedjax_dro.data._sources.base import Source, SplitSource
from fedjax_dro.data.streamed import load_prepared


def _leaves_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
  ds = fd.data.synthetic_classification(seed=0)
  out = tmp_path_factory.mktemp("prepared") / "synthetic"
  prep.prepare(prep.federated_source(ds), out=str(out), progress=False)
  streamed = dataclasses.replace(
    ds, train=load_prepared(str(out), "train"), test=load_prepared(str(out), "test")
  )
  resident = dataclasses.replace(
    ds, train=streamed.train.to_device(), test=streamed.test.to_device()
  )
  model = fd.models.softmax_regression(ds.train.x.shape[-1], ds.num_classes)
  return streamed, resident, model, str(out)


def test_the_resident_form_is_the_data_written(problem):
  streamed, resident, _, _ = problem
  ds = fd.data.synthetic_classification(seed=0)
  for a, b in ((resident.train, ds.train), (resident.test, ds.test)):
    _leaves_equal(a, b)


ALGORITHMS = {
  "fedavg": dict(local_steps=3, batch_size=4),
  "fedavg-epochs": dict(local_epochs=1, batch_size=16),
  "fedavg-full-batch": dict(local_steps=2, batch_size=None),
  "scaffold": dict(local_steps=3, batch_size=4),
  "drfa": dict(local_steps=3, batch_size=4),
  "fgdro_kl": dict(local_steps=3, batch_size=4),
  "ditto": dict(local_steps=3, batch_size=4),
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_streamed_rounds_equal_resident_rounds_bitwise(problem, name):
  streamed, resident, model, _ = problem
  factory = fd.algorithms.get_algorithm(name.split("-")[0]).factory
  alg = factory(model, clients_per_round=3, **ALGORITHMS[name])
  base = fd.run(alg, resident, rounds=4, seed=3, eval_every=2)
  got = fd.run(alg, streamed, rounds=4, seed=3, eval_every=2)
  _leaves_equal(got.final_state, base.final_state)
  for k, v in base.train_metrics.items():
    np.testing.assert_array_equal(got.train_metrics[k], v)
  for e_got, e_base in zip(got.evaluations, base.evaluations):
    for k, v in e_base["per_client"].items():
      np.testing.assert_array_equal(e_got["per_client"][k], v)


def test_a_round_reads_only_its_minibatch_rows(problem):
  streamed, resident, model, _ = problem
  alg = fd.algorithms.fedavg(model, clients_per_round=3, local_steps=3, batch_size=4)
  store = streamed.train.store
  before = dict(store.stats)
  fd.run(alg, streamed, rounds=5, seed=0, eval_data=resident.test, eval_every=5)
  # 5 rounds x 3 participants x 3 steps x 4 rows, in one host call per participant and round
  assert store.stats["rows"] - before["rows"] == 5 * 3 * 3 * 4
  assert store.stats["calls"] - before["calls"] <= 5 * 3


def test_a_sweep_of_streamed_rounds_equals_the_resident_sweep(problem):
  streamed, resident, model, _ = problem
  alg = fd.algorithms.fedavg(model, clients_per_round=3, local_steps=2, batch_size=4)
  grid = {"client_lr": [0.05, 0.2]}
  ref = fd.sweep(alg, resident, rounds=3, grid=grid, seeds=[0, 1])
  got = fd.sweep(alg, streamed, rounds=3, grid=grid, seeds=[0, 1])
  _leaves_equal(got.final_state, ref.final_state)


def test_a_killed_streamed_run_resumes_to_the_uninterrupted_one(problem, tmp_path, monkeypatch):
  import fedjax_dro.engine.runner as runner

  streamed, resident, model, _ = problem
  alg = fd.algorithms.scaffold(model, clients_per_round=3, local_steps=2, batch_size=4)
  full = fd.run(alg, resident, rounds=6, seed=2, eval_every=2)
  calls = {"n": 0}
  original = runner.summarize_per_client

  def crash_on_second_chunk(*args):
    calls["n"] += 1
    if calls["n"] == 2:
      raise KeyboardInterrupt("simulated kill")
    return original(*args)

  monkeypatch.setattr(runner, "summarize_per_client", crash_on_second_chunk)
  with pytest.raises(KeyboardInterrupt):
    fd.run(alg, streamed, rounds=6, seed=2, eval_every=2, checkpoint_dir=str(tmp_path))
  monkeypatch.setattr(runner, "summarize_per_client", original)
  resumed = fd.run(alg, streamed, rounds=6, seed=2, eval_every=2, checkpoint_dir=str(tmp_path))
  _leaves_equal(resumed.final_state, full.final_state)
  np.testing.assert_array_equal(
    resumed.train_metrics["train_loss"], full.train_metrics["train_loss"]
  )


def test_algorithms_that_read_every_client_are_refused_by_name(problem):
  streamed, _, model, _ = problem
  alg = fd.algorithms.ifca(model, num_clusters=2, clients_per_round=3, local_steps=1, batch_size=4)
  with pytest.raises(ValueError, match="streamed"):
    fd.run(alg, streamed, rounds=1)


# ----------------------------------------------------------------------------------------------
# prepare: resume, refusals, a full disk, checksums
# ----------------------------------------------------------------------------------------------
def _toy_source(fail_after=None, encoded=False, images=None):
  """Three clients of 5, 0 and 7 rows of [2, 3] float32 (or PNG-encoded 4x4 images), chunks of
  2 rows; the reader raises KeyboardInterrupt after ``fail_after`` chunks (a kill)."""
  rng = np.random.default_rng(0)
  counts = (5, 0, 7)
  xs = [rng.normal(size=(c, 2, 3)).astype(np.float32) for c in counts]
  ys = [rng.integers(0, 4, c).astype(np.int32) for c in counts]
  seen = {"chunks": 0}

  def rows(i):
    for start in range(0, counts[i], 2):
      if fail_after is not None and seen["chunks"] == fail_after:
        raise KeyboardInterrupt("killed")
      seen["chunks"] += 1
      stop = min(start + 2, counts[i])
      x = [images[i][j] for j in range(start, stop)] if encoded else xs[i][start:stop]
      yield x, ys[i][start:stop], (ys[i][start:stop] % 2).astype(np.int32)

  split = SplitSource("train", ("a", "b", "c"), rows, counts)
  x_shape, x_dtype = ((4, 4, 3), "uint8") if encoded else ((2, 3), "float32")
  source = Source(
    "toy",
    x_shape,
    x_dtype,
    (),
    "int32",
    ("even", "odd"),
    (split,),
    {"task": "classification"},
    "image" if encoded else None,
  )
  return source, xs, ys


def _tree(path):
  out = {}
  for root, _, files in os.walk(path):
    for f in files:
      full = os.path.join(root, f)
      out[os.path.relpath(full, path)] = open(full, "rb").read()
  return out


def test_a_killed_prepare_resumed_equals_an_uninterrupted_one(tmp_path):
  whole = prep.prepare(_toy_source()[0], out=str(tmp_path / "whole"), progress=False)
  out = str(tmp_path / "resumed")
  for fail_after in (1, 3):  # killed twice, inside client "a" and inside client "c"
    with pytest.raises(KeyboardInterrupt):
      prep.prepare(_toy_source(fail_after)[0], out=out, progress=False)
    assert not os.path.exists(out) and os.path.exists(out + ".partial")
  prep.prepare(_toy_source()[0], out=out, progress=False)
  assert not os.path.exists(out + ".partial")
  assert _tree(out) == _tree(whole)  # manifest, checksums and arrays byte for byte
  store = load_prepared(out).store
  _, xs, ys = _toy_source()
  np.testing.assert_array_equal(store.offsets, [0, 5, 5, 12])
  np.testing.assert_array_equal(np.asarray(store.x), np.concatenate(xs))
  np.testing.assert_array_equal(np.asarray(store.y), np.concatenate(ys))
  np.testing.assert_array_equal(np.asarray(store.group), np.concatenate(ys) % 2)
  manifest = json.load(open(os.path.join(out, "manifest.json")))
  assert manifest["splits"]["train"]["num_rows"] == [5, 0, 7]
  assert manifest["splits"]["train"]["y_range"] == [float(np.concatenate(ys).min()), 3.0] or (
    manifest["splits"]["train"]["y_range"][1] == float(np.concatenate(ys).max())
  )


def test_a_finished_directory_is_never_replaced_silently(tmp_path):
  out = prep.prepare(_toy_source()[0], out=str(tmp_path / "p"), progress=False)
  before = _tree(out)
  with pytest.raises(ValueError, match="finished prepared directory.*overwrite"):
    prep.prepare(_toy_source()[0], out=out, progress=False)
  prep.prepare(_toy_source()[0], out=out, progress=False, overwrite=True)
  assert _tree(out) == before


def test_a_full_disk_leaves_the_previous_directory_intact(tmp_path, monkeypatch):
  out = prep.prepare(_toy_source()[0], out=str(tmp_path / "p"), progress=False)
  before = _tree(out)
  calls = {"n": 0}
  original = prep._Appender.append

  def fill(self, rows):
    calls["n"] += 1
    if calls["n"] > 4:
      raise OSError(errno.ENOSPC, "No space left on device")
    return original(self, rows)

  monkeypatch.setattr(prep._Appender, "append", fill)
  with pytest.raises(OSError, match=r"disk filled while writing .*p\.partial/train; .*unchanged"):
    prep.prepare(_toy_source()[0], out=out, progress=False, overwrite=True)
  assert _tree(out) == before
  monkeypatch.setattr(prep._Appender, "append", original)
  prep.prepare(_toy_source()[0], out=out, progress=False, overwrite=True)  # resumes
  assert _tree(out) == before


def test_a_changed_array_fails_its_checksum_naming_the_file(tmp_path):
  out = prep.prepare(_toy_source()[0], out=str(tmp_path / "p"), progress=False)
  path = os.path.join(out, "train", "y.npy")
  data = bytearray(open(path, "rb").read())
  data[-1] ^= 1
  open(path, "wb").write(bytes(data))
  with pytest.raises(ValueError, match=r"train/y\.npy: checksum does not match"):
    load_prepared(out)
  load_prepared(out, verify=False)  # sizes only
  os.remove(os.path.join(out, "manifest.json"))
  with pytest.raises(ValueError, match="manifest.json: missing"):
    load_prepared(out)


def test_encoded_images_are_decoded_at_read_time(tmp_path):
  from PIL import Image

  rng = np.random.default_rng(1)
  pixels = [rng.integers(0, 256, (c, 4, 4, 3)).astype(np.uint8) for c in (5, 0, 7)]

  def png(a):
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()

  images = [[png(a) for a in p] for p in pixels]
  source = _toy_source(encoded=True, images=images)[0]
  out = prep.prepare(source, out=str(tmp_path / "p"), progress=False)
  store = load_prepared(out, to_float=False).store
  x, _ = store.gather(np.array([0, 2]), np.array([[4, 0], [6, 1]]))
  np.testing.assert_array_equal(x[0], pixels[0][[4, 0]])
  np.testing.assert_array_equal(x[1], pixels[2][[6, 1]])
  xf, _ = load_prepared(out).store.gather(np.array([2]), np.array([[3]]))
  np.testing.assert_array_equal(xf[0, 0], pixels[2][3].astype(np.float32) / 255.0)


def test_large_streamed_clients_are_evaluated_in_batches(problem, monkeypatch):
  import fedjax_dro.engine.programs as programs

  streamed, resident, model, _ = problem
  alg = fd.algorithms.fedavg(model, clients_per_round=3, local_steps=2, batch_size=4)
  base = fd.run(alg, resident, rounds=2, seed=1, eval_every=2)
  monkeypatch.setattr(programs, "EVAL_ROWS", 1)  # every split counts as large
  got = fd.run(alg, streamed, rounds=2, seed=1, eval_every=2)
  _leaves_equal(got.final_state, base.final_state)
  for k in ("loss", "accuracy"):
    np.testing.assert_allclose(
      got.evaluations[-1]["per_client"][k], base.evaluations[-1]["per_client"][k], rtol=1e-5
    )


def test_a_wilds_standin_prepared_trained_streamed_and_evaluated_on_a_held_out_hospital(tmp_path):
  from fedjax_dro import cli

  src, out = str(tmp_path / "c17"), str(tmp_path / "prepared")
  argv = ["prepare", "camelyon17", src, "--out", out, "--standin", "--no-progress"]
  assert cli.main(argv) == 0
  assert cli.main(argv[:-2] + ["--no-progress"]) == 2  # a finished --out is refused
  assert cli.main(argv[:5] + ["--option", "size", "--no-progress"]) == 2
  train, val = load_prepared(out, "train"), load_prepared(out, "val")
  assert train.client_names == ("hospital_0", "hospital_3", "hospital_4")
  assert val.client_names == ("hospital_1",)
  model = fd.models.cnn((96, 96, 3), 2, features=(4,), dense=None)
  alg = fd.algorithms.fgdro_cvar(model, clients_per_round=3, local_steps=2, batch_size=2)
  h = fd.run(alg, train, rounds=2, seed=0)
  got = val.evaluate(model, h.final_state.params, batch_size=2)
  x = np.asarray(val.store.x, np.float32) / 255.0
  y = np.asarray(val.store.y)
  pred = np.asarray(model.apply(h.final_state.params, x)).argmax(-1)
  assert got["summary"]["accuracy"] == pytest.approx(np.mean(pred == y), abs=1e-6)
  np.testing.assert_array_equal(got["per_client"]["rows"], [len(y)])
