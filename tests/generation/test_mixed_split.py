"""A mixed step (decode rows beside prompt chunks) where decode graphs exist runs its decode rows
through the decode programs and only the chunks through the ragged one (runner.Runner.run),
for every family: the hybrid's per-sequence recurrence and the experts included. Forced here
on the CPU (the cpu device has no graphs, and there a mixed step runs whole through the ragged
program: on the CPU the split measured no faster, docs/host-loop.md). Each family's cpu build
is batch-invariant, a row's bits the same through either program, so every sequence gets the
tokens it gets alone; a prompt's last token fed alone (a one-token chunk) goes through decode
too, from the state its earlier chunks left, unless the family's prompt tokens take another
form than decode's (kimi_linear's cpu build: its prefill reads prompt_len), where it rides the
ragged run with the chunks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kern.api import Model  # noqa: E402
from kern.generation import SamplingParams  # noqa: E402
from kern.generation.runner import buckets  # noqa: E402

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module", params=["qwen3_moe", "kimi_linear"])
def family(request, tmp_path_factory):
    from tests.conftest import tiny_family

    ckpt, _, dep = tiny_family(request.param, f"tiny-{request.param}", tmp_path_factory)
    return ckpt, dep / "manifest.json"


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(4)
    # with a budget of 18 the first step feeds 3 rows and 15 of the 16: the rest is a one-token tail
    return [rng.integers(1, 200, n).tolist() for n in (3, 16, 9, 30, 1, 22)]


def _loop(family, budget: int):
    ckpt, manifest = family
    loop = Model(manifest, ckpt, state_budget=64 << 20, run_ahead=1).loop
    loop.limits = replace(loop.limits, budget=budget)
    return loop


def _serve(loop, requests):
    out: dict[str, list[int]] = {}
    step = 0
    while loop.has_work() or step <= max(requests):
        for rid, ids in requests.get(step, []):
            loop.add(rid, ids, GREEDY)
        for d in loop.step():
            out.setdefault(d.request_id, []).extend(d.token_ids)
        step += 1
    return out


def test_decode_rows_of_mixed_steps_take_the_decode_program_and_keep_their_tokens(family):
    alone = {}
    for i, p in enumerate(_prompts()):
        alone[i] = _serve(_loop(family, 256), {0: [(f"a{i}", p)]})[f"a{i}"]
    loop = _loop(family, budget=18)  # chunks cut beside the decode rows, some to one token
    runner = loop.runner
    runner.graphs, runner.decode_max, runner.sizes = True, 2, buckets(2)
    runs: list[list[tuple[str, int]]] = []  # each step's (program, rows) runs
    real_run, real_step = runner.engine.run, loop.step

    def run(program, vars, inputs=None, wait=True):
        runs[-1].append((program, vars))
        return real_run(program, vars, inputs, wait)

    tails = 0  # steps where a prompt's last token is a one-token row, beside other rows

    def step(*a, **k):
        nonlocal tails
        runs.append([])
        tails += any(s.pending == 1 and not s.out for s in loop.running) and len(loop.running) > 1
        return real_step(*a, **k)

    runner.engine.run, loop.step = run, step
    prompts = _prompts()
    try:
        got = _serve(loop, {0: [(f"c{i}", p) for i, p in enumerate(prompts[:3])],
                            2: [(f"c{i}", p) for i, p in enumerate(prompts[3:], 3)]})
    finally:
        runner.engine.run, loop.step = real_run, real_step
    assert {i: got[f"c{i}"] for i in range(len(prompts))} == alone
    dec, rag = runner.decode.program, runner.ragged.program
    mixed = [s for s in runs if {p for p, _ in s} == {dec, rag}]
    assert len(mixed) >= 3 and tails >= 1
    for s in mixed:  # the decode slices first, then one ragged run of the chunks alone
        assert [p for p, _ in s] == [dec] * (len(s) - 1) + [rag]
        rows, groups = s[-1][1][runner.ragged.rows_var], s[-1][1][runner.ragged.groups_var]
        assert rows >= (1 if runner.roles else 2) * groups
