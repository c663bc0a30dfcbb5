"""``common.checks``: one message form per mistake, naming the argument and the value."""

import math

import numpy as np
import pytest

from fedjax_dro.common.checks import choice, flag, integer, number


def test_integer_accepts_integer_types_and_returns_int():
  assert integer(3, "k") == 3 and type(integer(np.int64(3), "k")) is int
  assert integer(None, "k", optional=True) is None
  assert integer(0, "seed", minimum=0) == 0
  assert integer(5, "k", maximum=5) == 5


@pytest.mark.parametrize(
  "value, kwargs, message",
  [
    (0, {}, "k must be an integer >= 1, got 0"),
    (True, {}, "k must be an integer >= 1, got True"),
    (np.bool_(True), {}, "k must be an integer >= 1, got "),
    (2.0, {}, "k must be an integer >= 1, got 2.0"),
    ("2", {}, "k must be an integer >= 1, got '2'"),
    (None, {}, "k must be an integer >= 1, got None"),
    (6, {"maximum": 5}, r"k must be an integer in \[1, 5\], got 6"),
    (0, {"optional": True, "none": "all"}, r"k must be an integer >= 1 or None \(all\), got 0"),
  ],
)
def test_integer_refuses_with_one_message_form(value, kwargs, message):
  with pytest.raises(ValueError, match=message):
    integer(value, "k", **kwargs)


def test_number_accepts_reals_and_returns_float():
  assert number(1, "x") == 1.0 and type(number(np.float32(0.5), "x")) is float
  assert number(0.0, "x", minimum=0.0) == 0.0
  assert number(None, "x", optional=True) is None


@pytest.mark.parametrize(
  "value, kwargs, message",
  [
    (math.nan, {}, "x must be a finite number, got nan"),
    (math.inf, {"minimum": 0.0}, "x must be a finite number >= 0.0, got inf"),
    (0.0, {"minimum": 0.0, "strict": True}, "x must be a finite number > 0.0, got 0.0"),
    (2.0, {"maximum": 1.0}, "x must be a finite number <= 1.0, got 2.0"),
    (False, {}, "x must be a finite number, got False"),
    ("1", {}, "x must be a finite number, got '1'"),
    (-1, {"minimum": 0, "optional": True, "none": "default"}, r">= 0 or None \(default\), got -1"),
  ],
)
def test_number_refuses_with_one_message_form(value, kwargs, message):
  with pytest.raises(ValueError, match=message):
    number(value, "x", **kwargs)


def test_choice_and_flag():
  assert choice("a", "mode", ("a", "b")) == "a"
  with pytest.raises(ValueError, match=r"mode must be one of \('a', 'b'\), got 'c'"):
    choice("c", "mode", ("a", "b"))
  with pytest.raises(ValueError, match=r"mode must be one of \('a', 'b'\), got \['a'\]"):
    choice(["a"], "mode", ("a", "b"))  # unhashable: still the same message
  assert flag(True, "prox") is True and flag(np.bool_(False), "prox") is False
  for bad in (1, 0, "yes", None):
    with pytest.raises(TypeError, match="prox must be a bool"):
      flag(bad, "prox")
