"""Sampling parameters are checked at the door: each bad value is refused with one line naming
the field and its domain."""

from __future__ import annotations

import pytest

from kern.generation import SamplingParams
from kern.errors import BoundsError

BAD = [
    (dict(max_tokens=0), "max_tokens must be an integer >= 1, got 0"),
    (dict(max_tokens=2.5), "max_tokens must be an integer >= 1"),
    (dict(temperature=-0.1), "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
    (dict(top_p=2), r"top_p must be in \(0, 1\], got 2"),
    (dict(top_k=-1), "top_k must be an integer >= 0"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0"),
    (dict(frequency_penalty=3.0), r"frequency_penalty must be in \[-2, 2\]"),
    (dict(presence_penalty=-2.5), r"presence_penalty must be in \[-2, 2\]"),
    (dict(seed=-1), "seed must be None or an integer >= 0"),
    (dict(stop=("",)), "stop must be a tuple of non-empty strings"),
    (dict(stop="\n"), "stop must be a tuple of non-empty strings"),
    (dict(stop_token_ids=(-3,)), "stop_token_ids must be a tuple of token ids >= 0"),
    (dict(ignore_eos=1), "ignore_eos must be a bool"),
    (dict(logprobs=21), r"logprobs must be None or an integer in \[0, 20\]"),
]


@pytest.mark.parametrize("kw,message", BAD, ids=[next(iter(kw)) + "=" + repr(next(iter(kw.values()))) for kw, _ in BAD])
def test_a_bad_value_is_refused_naming_the_field(kw, message):
    with pytest.raises(BoundsError, match=message):
        SamplingParams(**kw).check()


def test_the_defaults_and_usual_values_pass():
    SamplingParams().check()
    SamplingParams(max_tokens=1, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1,
                   frequency_penalty=0.5, presence_penalty=-0.5, seed=7, stop=("\n\n",), stop_token_ids=(2,),
                   ignore_eos=True, logprobs=5).check()


def test_greedy_rows_read_no_logits_unless_something_needs_them():
    assert not SamplingParams().needs_logits
    assert SamplingParams(temperature=0.8).needs_logits
    assert SamplingParams(logprobs=0).needs_logits
    assert SamplingParams(presence_penalty=0.5).needs_logits
    assert SamplingParams(temperature=0.8, top_k=1).greedy
