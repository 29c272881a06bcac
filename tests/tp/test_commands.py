"""--tp on the commands and the API: a split run says so and gives the unsplit run's text; a
split that does not divide the model, and a count below 1, are one line each."""

from __future__ import annotations

import pytest

from kern.errors import BoundsError
from tests.reliability.conftest import kern, make_tiny


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("KERN_CACHE", str(tmp_path / "cache"))
    return make_tiny(tmp_path / "tiny")


def test_kern_run_tp_2_gives_the_unsplit_text(capsys, tiny):
    args = ["run", str(tiny), "--target", "cpu", "--prompt", "w1 w2 w3", "--max-tokens", "8"]
    one = kern(capsys, *args)
    two = kern(capsys, *args, "--tp", "2")
    assert one.code == two.code == 0
    assert two.out == one.out and two.out.strip()
    assert "on cpu x 2 (tensor parallel)" in two.err


def test_kern_run_tp_that_does_not_divide_is_one_line(capsys, tiny):
    r = kern(capsys, "run", str(tiny), "--target", "cpu", "--tp", "3")
    assert r.code == 1 and "Traceback" not in r.err
    (line,) = r.err.strip().splitlines()
    assert line.startswith("kern run: ") and line.endswith(
        "config.json: generator 'llama' cannot build a cpu deployment: tp 3: num_attention_heads 4 does not split "
        "over 3 ranks; num_key_value_heads 2 does not split over 3 ranks; intermediate_size 128 does not split "
        "over 3 ranks")


@pytest.mark.parametrize("verb", ["run", "serve"])
def test_tp_below_one_is_refused_by_the_parser(capsys, verb):
    r = kern(capsys, verb, "/nonexistent", "--tp", "0")
    assert r.code == 2 and "argument --tp: must be at least 1, got 0" in r.err.splitlines()[-1]


def test_load_refuses_tp_below_one(tiny):
    from kern.api import load

    with pytest.raises(BoundsError, match="tp must be a positive integer, got 0"):
        load(tiny, tp=0)
