"""kern serve --speculate: rounds inside continuous batching give each request the text the
plain server gives it, and /metrics reports the rounds."""

from __future__ import annotations

import re

import pytest

from .conftest import chat_text, flagged_server, get, words


@pytest.fixture(scope="module")
def spec_server(checkpoint):
    yield from flagged_server(checkpoint, speculate="ngram:6")


def _chat(server, model, content: str) -> str:
    return chat_text(server, model, content, 40)


def test_a_speculating_server_answers_as_the_plain_one_and_counts_its_rounds(server, spec_server, model_name):
    # prompts that repeat spans of themselves, so that prompt lookup has something to propose
    prompts = [" ".join([words(12, 10 + 7 * i)] * 3) for i in range(4)]
    plain = [_chat(server, model_name, p) for p in prompts]
    assert [_chat(spec_server, model_name, p) for p in prompts] == plain
    status, text = get(spec_server, "/metrics")
    assert status == 200
    got = {m: float(v) for m, v in re.findall(r"^(kern_speculative_\w+) (\S+)$", text, re.M)}
    assert set(got) == {"kern_speculative_acceptance_rate", "kern_speculative_tokens_per_round",
                        "kern_speculative_rounds"}
    assert got["kern_speculative_rounds"] > 0 and 0 <= got["kern_speculative_acceptance_rate"] <= 1
    assert got["kern_speculative_tokens_per_round"] >= 1
