"""pycoll._env: numbers from the environment, checked where they are read."""

import pytest

from pycoll import _env

pytestmark = pytest.mark.one_process


def test_unset_or_blank_gives_the_default(monkeypatch):
    monkeypatch.delenv("PYCOLL_TEST_NUMBER", raising=False)
    assert _env.number("PYCOLL_TEST_NUMBER", int, 7, lambda v: v > 0, "positive") == 7
    monkeypatch.setenv("PYCOLL_TEST_NUMBER", "  ")
    assert _env.number("PYCOLL_TEST_NUMBER", int, 7, lambda v: v > 0, "positive") == 7
    assert _env.nbytes("PYCOLL_TEST_NUMBER", "never") is None


def test_a_set_value_is_parsed_as_its_kind(monkeypatch):
    monkeypatch.setenv("PYCOLL_TEST_NUMBER", " 2.5 ")
    assert _env.number("PYCOLL_TEST_NUMBER", float, 1.0, lambda v: v > 0, "positive") == 2.5
    monkeypatch.setenv("PYCOLL_TEST_NUMBER", "4096")
    assert _env.nbytes("PYCOLL_TEST_NUMBER", "never") == 4096


@pytest.mark.parametrize("raw", ["abc", "-3", "1.5"])
def test_a_bad_value_names_the_variable_the_need_and_the_value(monkeypatch, raw):
    monkeypatch.setenv("PYCOLL_TEST_NUMBER", raw)
    with pytest.raises(ValueError) as info:
        _env.number("PYCOLL_TEST_NUMBER", int, 7, lambda v: v > 0, "a positive whole number")
    assert str(info.value) == f"PYCOLL_TEST_NUMBER must be a positive whole number, got {raw!r}"


def test_a_size_takes_digits_only(monkeypatch):
    monkeypatch.setenv("PYCOLL_TEST_NUMBER", "1M")
    with pytest.raises(
        ValueError, match=r"PYCOLL_TEST_NUMBER='1M': set it to a number of bytes \(0: never\)"
    ):
        _env.nbytes("PYCOLL_TEST_NUMBER", "never")
