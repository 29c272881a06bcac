"""The per-token shortcuts write exactly what the plain code writes: a pre-serialised text chunk
is byte for byte the chunk dict's JSON, and the lean histogram exposes what Prometheus's does."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Histogram as PromHistogram

from kern.serve import replies
from kern.serve.metrics import ITL_BUCKETS, Histogram

TEXTS = ["", " w5", 'a "quoted" word', "back\\slash", "new\nline\ttab", "\x00\x01\x1f", "é 中文 🙂",
         "\u2028\u2029", "</script>"]


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("with_usage", [False, True], ids=["", "include_usage"])
@pytest.mark.parametrize("text", TEXTS)
def test_a_text_chunk_is_the_chunk_dicts_json(chat, with_usage, text):
    head = replies.Head('chatcmpl-7-"odd"\\id', 1764460800, "org/mo\u00efdel", chat)
    chunks = replies.TextChunks(head, with_usage)
    for index in (0, 3, 0):  # a template per choice, reused
        plain = replies.sse(replies.chunk(head, index, text=text, with_usage=with_usage))
        assert chunks(index, text) == plain
        assert json.loads(plain[len(b"data: "):])["choices"][0]["index"] == index


def test_the_lean_histogram_exposes_what_prometheus_does():
    values = [0.0, 0.001, 0.0010001, 0.004, 0.1, 0.1, 3.0, 10.0, 11.0, 1e9]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    h = Histogram("kern_x_seconds", "x", ITL_BUCKETS, ours)
    p = PromHistogram("kern_x_seconds", "x", buckets=ITL_BUCKETS, registry=theirs)
    for v in values:
        h.observe(v)
        p.observe(v)

    def samples(registry) -> set[str]:
        return {ln for ln in generate_latest(registry).decode().splitlines()
                if ln.startswith("kern_x_seconds") and "_created" not in ln}

    assert samples(ours) == samples(theirs)
