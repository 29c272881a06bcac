"""Sessions that sleep to host memory: with more conversations than the state memory holds,
each idle conversation's cached prefix parks in host memory when memory runs short, and its
second turn wakes it instead of recomputing the prefix. /metrics counts both."""

from __future__ import annotations

import re
from functools import partial

import openai

from kern.serve.server import start

from . import engines
from .conftest import API_KEY, CONTEXT, get, wait_idle, words

DEVICE = 2 << 20  # one 2 MiB chunk of state memory: a few thousand tokens of the tiny model
FIRST, ANSWER = 120, 6  # a first turn's prompt and answer, in tokens


def two_turns(checkpoint, host_bytes: int) -> tuple[list[int], str, int]:
    """Every conversation's first turn, then every second turn (its history plus a question):
    the second turns' cached tokens, /metrics, and how many conversations there were."""
    server = start(partial(engines.model_loop, checkpoint, CONTEXT, 4, state_budget=DEVICE, host_bytes=host_bytes),
                   api_key=API_KEY)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
        model = server.driver.info.model_name
        # twice the conversations the state memory holds: the first ones' prefixes must leave it
        n = 2 * server.driver.query(engines.capacity) // (FIRST + ANSWER) + 1
        history = []
        for i in range(n):  # each conversation starts on its own word: no prefix shared between them
            prompt = words(FIRST, start=10 + i)
            r = client.completions.create(model=model, prompt=prompt, max_tokens=ANSWER, temperature=0)
            history.append(prompt + r.choices[0].text)
        cached = []
        for h in history:
            r = client.completions.create(model=model, prompt=h + " w5 w6", max_tokens=2, temperature=0)
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
        wait_idle(server)
        server.driver.query(engines.check_pool)
        return cached, get(server, "/metrics")[1], n
    finally:
        server.close()


def metric(text: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_second_turns_wake_from_host_memory_when_the_device_holds_fewer_conversations(checkpoint):
    cached, metrics, n = two_turns(checkpoint, host_bytes=64 << 20)
    assert n > 20
    # every second turn reuses at least its first turn's prompt, less the page it ends inside
    assert min(cached) >= FIRST - 16, cached
    assert metric(metrics, "kern_host_parked_tokens_total") >= FIRST * (n // 2)
    # most second turns found their prefix parked, not on the device: woken, not recomputed
    assert metric(metrics, "kern_host_woken_tokens_total") >= FIRST * (n // 2)


def test_without_host_memory_the_first_conversations_are_recomputed(checkpoint):
    """The same conversations with --host-memory 0: what the test above shows is the host tier's
    doing, since here the early conversations' prefixes are gone by their second turn."""
    cached, metrics, n = two_turns(checkpoint, host_bytes=0)
    # least recently used first: each second turn finds its prefix evicted by the ones before it
    assert sum(c == 0 for c in cached) >= n // 2, cached
    assert metric(metrics, "kern_host_parked_tokens_total") == 0
    assert metric(metrics, "kern_host_woken_tokens_total") == 0


def test_host_memory_sizes_and_none():
    from kern.cli import parser

    assert parser().parse_args(["serve"]).host_bytes is None  # the default: sized to the machine at load
    assert parser().parse_args(["serve", "--host-memory", "4G"]).host_bytes == 4 << 30
    assert parser().parse_args(["serve", "--host-memory", "0"]).host_bytes == 0


def test_host_memory_on_a_split_deployment_is_refused_in_one_line():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "kern.cli", "serve", "--host-memory", "1G", "--tp", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip() == ("kern serve: --host-memory: a split or pipelined deployment (--tp, --ep or --pp "
                                "above 1) has no host tier; leave it out or give 0")
