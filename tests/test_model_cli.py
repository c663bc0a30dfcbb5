"""``fedjax-dro run --model NAME [--weights FILE]``: a zoo image model in place of the dataset's
default, started from a safetensors file under torchvision's names with a fresh head; the
refusals name the flag."""

import jax
import numpy as np
import pytest

from fedjax_dro import cli, models
from fedjax_dro.data import FederatedDataset, from_client_arrays
from fedjax_dro.data.registry import _DATASETS, DatasetEntry, register_dataset
from fedjax_dro.models.start import image_model
from fedjax_dro.models.weights import write_safetensors
from tests.models.test_zoo_vision import random_tensors, resnet_shapes

CLASSES = 3


def _rgb(seed=0):
  rng = np.random.default_rng(seed)
  xs = [rng.normal(size=(4 + i, 8, 8, 3)).astype(np.float32) for i in range(4)]
  ys = [rng.integers(0, CLASSES, size=len(x)) for x in xs]
  train = from_client_arrays(xs, ys)
  return FederatedDataset(train=train, test=train, task="classification", num_classes=CLASSES)


@pytest.fixture
def rgb_dataset():
  register_dataset(
    "rgb-test",
    DatasetEntry(lambda seed: _rgb(seed), lambda ds: models.softmax_regression(192, CLASSES), ""),
  )
  yield "rgb-test"
  _DATASETS.pop("rgb-test")


@pytest.fixture(scope="module")
def resnet18_file(tmp_path_factory):
  """A ResNet-18 file with torchvision's 122 names and shapes (1000 classes), random values."""
  tensors = random_tensors(resnet_shapes((2, 2, 2, 2), False, 64, 3, 1000, "imagenet"))
  tensors = {k: np.asarray(v, np.float32) if v.dtype.kind == "f" else v for k, v in tensors.items()}
  path = tmp_path_factory.mktemp("weights") / "resnet18.safetensors"
  write_safetensors(path, tensors, metadata={"format": "pt"})
  return path, tensors


def test_a_run_starts_from_the_file_with_a_fresh_head(resnet18_file):
  path, tensors = resnet18_file
  model = image_model("resnet18", np.zeros((2, 8, 8, 3), np.float32), CLASSES, str(path))
  assert model.state_keys == ("batch_stats",)
  one, two = model.init(jax.random.PRNGKey(0)), model.init(jax.random.PRNGKey(1))
  conv = np.asarray(one["params"]["conv1"]["kernel"])  # HWIO from OIHW
  np.testing.assert_array_equal(conv, tensors["conv1.weight"].transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(
    np.asarray(one["batch_stats"]["layer4_1"]["bn2"]["var"]), tensors["layer4.1.bn2.running_var"]
  )
  head = np.asarray(one["params"]["fc"]["kernel"])
  assert head.shape == (512, CLASSES)  # sized for the dataset, drawn from the run's key
  assert not np.array_equal(head, np.asarray(two["params"]["fc"]["kernel"]))
  np.testing.assert_array_equal(conv, np.asarray(two["params"]["conv1"]["kernel"]))


def test_the_refusals_name_the_flag(resnet18_file, rgb_dataset, capsys):
  path, _ = resnet18_file

  def error(*argv):
    rc = cli.main(["run", "--rounds", "1", "--no-progress", *argv])
    assert rc != 0
    return capsys.readouterr().err

  assert "--weights: give the --model" in error("--dataset", rgb_dataset, "--weights", str(path))
  assert "3 input channels" in error(
    "--dataset", "digits-dirichlet", "--model", "resnet18", "--weights", str(path)
  )
  assert "cifar_cnn has no published weights" in error(
    "--dataset", rgb_dataset, "--model", "cifar_cnn", "--weights", str(path)
  )
  assert "--model must be one of" in error("--dataset", rgb_dataset, "--model", "vgg16")
  assert "not a classification dataset" in error(
    "--dataset", "synthetic-shift", "--model", "resnet18"
  )


def test_a_zoo_model_with_dropout_runs_from_the_command_line(tmp_path, capsys):
  rc = cli.main(
    [
      "run",
      "--dataset",
      "digits-dirichlet",
      "--model",
      "cifar_cnn",
      "--rounds",
      "2",
      "--local-steps",
      "2",
      "--batch-size",
      "8",
      "--clients-per-round",
      "5",
      "--no-progress",
      "--out",
      str(tmp_path / "out"),
    ]
  )
  assert rc == 0
  assert "model cifar_cnn" in capsys.readouterr().out
  assert (tmp_path / "out" / "summary.json").exists()


@pytest.mark.slow  # ~20 s on two cores: a full-width ResNet-18 compiled
def test_the_pretrained_resnet18_runs_from_the_command_line(resnet18_file, rgb_dataset, tmp_path):
  path, _ = resnet18_file
  argv = ["run", "--dataset", rgb_dataset, "--model", "resnet18", "--weights", str(path)]
  argv += ["--rounds", "1", "--local-steps", "1", "--batch-size", "2", "--no-progress"]
  assert cli.main(argv + ["--out", str(tmp_path / "out")]) == 0
