"""``fedjax-dro features``: a ResNet-18 under torchvision's full key layout, read from a
safetensors file, embeds a tiny CIFAR-100 stand-in (the real binary format) into a features file
that ``load_features`` and scaffpd-table1's ``TableData`` read, equal to the module applied
directly (inference mode) to the ImageNet-normalized images; bad inputs are one line naming the
flag, an existing --out is kept without --overwrite."""

import sys

import numpy as np
import pytest

from fedjax_dro import cli
from fedjax_dro.data import load_cifar100, load_features
from fedjax_dro.data.user_cifar import write_cifar100_bin
from fedjax_dro.models.resnet import resnet18, resnet_variables_from_torchvision
from fedjax_dro.models.weights import write_safetensors
from tests.models.test_zoo_vision import random_tensors, resnet_shapes

CLASSES = 100
N_TRAIN, N_TEST = 300, 12  # three classes: 100 training and 4 test images each (TableData
# partitions the training rows over 20 clients with >= 10 each)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  root = tmp_path_factory.mktemp("features")
  rng = np.random.default_rng(0)
  x_train = rng.integers(0, 256, (N_TRAIN, 32, 32, 3), dtype=np.uint8)
  x_test = rng.integers(0, 256, (N_TEST, 32, 32, 3), dtype=np.uint8)
  y_train, y_test = np.arange(N_TRAIN) % 3 * 7, np.arange(N_TEST) % 3 * 7
  write_cifar100_bin(root / "cifar", x_train, y_train, x_test, y_test)
  shapes = resnet_shapes((2, 2, 2, 2), False, 64, 3, CLASSES, "imagenet")
  tensors = {k: np.asarray(v, np.float32) for k, v in random_tensors(shapes, seed=1).items()}
  tensors = {k: v.astype(np.int64) if k.endswith("tracked") else v for k, v in tensors.items()}
  write_safetensors(root / "resnet18.safetensors", tensors)
  return root, tensors


def features_argv(root, out, *extra):
  return [
    "features",
    "--model",
    "resnet18",
    "--data-dir",
    str(root / "cifar"),
    "--dataset",
    "cifar100",
    "--out",
    str(out),
    "--no-progress",
    *extra,
  ]


@pytest.fixture(scope="module")
def written(files):
  root, _ = files
  out = root / "feats.npz"
  argv = features_argv(root, out, "--weights", str(root / "resnet18.safetensors"))
  assert cli.main(argv + ["--batch-size", "64"]) == 0  # 5 batches, one across train and test
  return out


def test_features_file_equals_the_module_applied_directly(files, written, capsys):
  root, tensors = files
  fs = load_features(written)
  data = load_cifar100(root / "cifar")
  assert fs.features.shape == (N_TRAIN + N_TEST, 512) and fs.features.dtype == np.float32
  np.testing.assert_array_equal(fs.labels, np.concatenate([data.y_train, data.y_test]))
  np.testing.assert_array_equal(fs.split, [False] * N_TRAIN + [True] * N_TEST)
  mean = np.array([0.485, 0.456, 0.406], np.float32)
  std = np.array([0.229, 0.224, 0.225], np.float32)
  x = (np.concatenate([data.x_train, data.x_test]) - mean) / std
  variables = resnet_variables_from_torchvision(tensors, resnet18(CLASSES))
  want = resnet18(CLASSES, features_only=True).apply(variables, x, train=False)
  want = np.asarray(want)
  assert want.dtype == np.float32 and want.shape == (N_TRAIN + N_TEST, 512)
  np.testing.assert_allclose(fs.features, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  logits = resnet18(CLASSES).apply(variables, x[:2], train=False)  # the input of fc
  fc = fs.features[:2] @ tensors["fc.weight"].T + tensors["fc.bias"]
  np.testing.assert_allclose(fc, logits, rtol=1e-4, atol=1e-4 * np.abs(logits).max())
  assert not list(root.glob(".feats.tmp-*"))  # the temporary file was renamed


def test_scaffpd_table1_reads_the_file(written):
  from fedjax_dro.reproduce.scaffpd_table1_data import TableData

  data = TableData(str(written), quick=True, alphas=(1000.0,), seeds=(0,))
  assert data.dim == 512 and data.num_classes == 15
  assert data.train.size == N_TRAIN and data.held.size == N_TEST
  assert data.description == {"name": "feats", "stand_in": False, "source": "feats.npz"}


def test_existing_out_is_kept_without_overwrite_and_random_weights_resize(
  files, capsys, monkeypatch
):
  root, _ = files
  out = root / "random.npz"
  out.write_bytes(b"keep me")
  argv = features_argv(root, out, "--random-weights", "--image-size", "24", "--batch-size", "100")
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and err.startswith("error: --out:") and "--overwrite" in err
  assert out.read_bytes() == b"keep me"
  monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the progress bar's path
  assert cli.main([a for a in argv if a != "--no-progress"] + ["--overwrite"]) == 0
  said, bar = capsys.readouterr()
  assert "features:" in bar and "batch" in bar  # tqdm's
  assert "312 images" in said and "4 batches of 100" in said and "resized to 24x24" in said
  assert "RANDOM weights" in said
  fs = load_features(out)
  assert fs.features.shape == (N_TRAIN + N_TEST, 512) and np.all(np.isfinite(fs.features))


@pytest.mark.parametrize(
  "extra,flag",
  [
    ([], "--weights"),  # no weights and no --random-weights
    (["--random-weights", "--model", "vgg16"], "--model"),
    (["--weights", "resnet18.pth"], "--weights"),
    (["--weights", "missing.safetensors"], "--weights"),
    (["--random-weights", "--dataset", "imagenet"], "--dataset"),
    (["--random-weights", "--data-dir", "nowhere"], "--data-dir"),
  ],
)
def test_bad_inputs_are_one_line_naming_the_flag(files, tmp_path, capsys, extra, flag):
  root, _ = files
  (tmp_path / "resnet18.pth").write_bytes(b"\x80\x04 never unpickled")
  argv = features_argv(root, tmp_path / "f.npz", *extra)
  for i, word in enumerate(argv):
    if word in ("resnet18.pth", "missing.safetensors", "nowhere"):
      argv[i] = str(tmp_path / word)
  if "--dataset" in extra:
    argv[argv.index("cifar100")] = "x"
    del argv[argv.index("x") - 1 : argv.index("x") + 1]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and err.startswith(f"error: {flag}:"), err
  if "resnet18.pth" in " ".join(argv):
    assert "pickle" in err
  assert not (tmp_path / "f.npz").exists()


def test_weights_of_another_model_name_every_problem_under_weights(files, tmp_path, capsys):
  root, tensors = files
  path = tmp_path / "bad.safetensors"
  write_safetensors(path, {k: v for k, v in tensors.items() if k != "layer4.1.conv2.weight"})
  argv = features_argv(root, tmp_path / "f.npz", "--weights", str(path), "--model", "resnet50")
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and err.startswith("error: --weights:") and "missing" in err


def test_tinyimagenet_npz_form_and_the_interrupt_line(tmp_path, capsys):
  rng = np.random.default_rng(2)
  arrays = {
    "x_train": rng.integers(0, 256, (5, 64, 64, 3), dtype=np.uint8),
    "y_train": np.array([0, 1, 2, 3, 4]),
    "x_test": rng.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8),
    "y_test": np.array([4, 0]),
  }
  np.savez(tmp_path / "tiny.npz", **arrays)
  out = tmp_path / "tiny_feats.npz"
  argv = ["features", "--random-weights", "--data-dir", str(tmp_path / "tiny.npz")]
  argv += ["--dataset", "tinyimagenet", "--out", str(out), "--no-progress"]
  assert cli.main(argv) == 0
  assert "7 images of tinyimagenet (5 train, 2 test; 64x64" in capsys.readouterr().out
  fs = load_features(out)
  assert fs.features.shape == (7, 512)
  np.testing.assert_array_equal(fs.labels, [0, 1, 2, 3, 4, 4, 0])
  np.testing.assert_array_equal(fs.split, [False] * 5 + [True] * 2)
  args = cli.build_parser().parse_args(argv)
  assert cli.interrupted_message(args).startswith("interrupted: features stopped; nothing was")
