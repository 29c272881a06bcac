"""Constrained decoding on the GPU (random weights at SmolLM2's shape, sm_90a; a byte tokenizer
for the 256 lowest ids): rows under a grammar draw on the device under their llguidance masks
(the sample op's mask inputs), no logits copied off it (Engine.read_rows never called), the
greedy ones the very tokens the host path (their logits read back, sampling.mask) draws, while
the rows beside them keep their own draws. Their documents validate, and the free rows get the
tokens they get alone.

    python -m pytest -q tests/generation/test_constraints_gpu.py   (on the H200)

Not yet run on a GPU: written where no GPU was lent (the same drivers pass on the cpu in
test_constraints.py and test_device_mask.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kern.generation import SamplingParams
from kern.generation.constraints import json_schema_grammar

from .test_constraints import SCHEMAS, byte_tokenizer  # noqa: F401  (fixture)
from .test_device_mask import _count_reads
from .test_loop import _run, _tokens
from .test_loop_gpu import _model, deployment  # noqa: F401  (fixture)

pytestmark = pytest.mark.gpu
jsonschema = pytest.importorskip("jsonschema")

FREE = SamplingParams(max_tokens=16, ignore_eos=True)


def test_documents_under_grammars_validate_and_free_rows_keep_their_tokens(deployment, byte_tokenizer):
    model = _model(deployment, run_ahead=1)
    loop = model.loop
    loop.tokenizer = byte_tokenizer
    loop.eos = {0}  # byte 0 ends a document; ids past the tokenizer's 256 are never allowed by a grammar
    vocab = model.engine.consts["vocab"]
    prompts = [np.random.default_rng(i).integers(0, vocab, 20).tolist() for i in range(6)]
    alone = {i: _tokens(_run(loop, {0: [(f"a{i}", prompts[i], FREE)]})[f"a{i}"]) for i in range(6)}
    model.paging.pool.clear()
    constrained = [(f"g{i}", [1 + i, 2, 3], SamplingParams(max_tokens=64, temperature=1.0 if i % 2 else 0.0,
                                                          seed=i, grammar=json_schema_grammar(s)))
                   for i, s in enumerate(SCHEMAS)]
    free = [(f"f{i}", prompts[i], FREE) for i in range(6)]
    got = _run(loop, {0: free[:3] + constrained[:2], 1: constrained[2:] + free[3:]})
    for (rid, _, _), schema in zip(constrained, SCHEMAS):
        assert got[rid][-1].finish_reason == "stop"
        jsonschema.validate(json.loads("".join(d.text for d in got[rid])), schema)
    # the free rows were decoded beside constrained ones in the same programs (12 rows: the gemv
    # decode's batch); batch-invariant programs give them their alone tokens
    assert {i: _tokens(got[f"f{i}"]) for i in range(6)} == alone
    model.paging.pool.check()


def test_constrained_greedy_rows_draw_on_the_device_the_host_paths_tokens_and_read_no_logits(deployment,
                                                                                            byte_tokenizer):
    reqs = [(f"g{i}", [1 + i, 2, 3], SamplingParams(max_tokens=48, grammar=json_schema_grammar(s)))
            for i, s in enumerate(SCHEMAS)]
    seeded = [(f"s{i}", [7, i], SamplingParams(max_tokens=48, temperature=0.9, seed=i,
                                              grammar=json_schema_grammar(SCHEMAS[i])))
              for i in range(2)]
    free = [(f"f{i}", [9, 9, i], FREE) for i in range(3)]
    runs = {}
    for device in (True, False):
        model = _model(deployment, run_ahead=4)
        loop = model.loop
        loop.tokenizer, loop.eos = byte_tokenizer, {0}
        assert loop.runner.masks
        loop.runner.masks = device  # False: the host path, each constrained row's logits read back
        reads = _count_reads(loop)
        got = _run(loop, {0: reqs[:3] + free, 1: reqs[3:] + (seeded if device else [])})
        runs[device] = {rid: _tokens(d) for rid, d in got.items() if rid.startswith("g")}
        assert (not reads) == device, len(reads)
        for rid, schema in [(r, s) for (r, _, _), s in zip(reqs, SCHEMAS)] + (
                [(f"s{i}", SCHEMAS[i]) for i in range(2)] if device else []):
            assert got[rid][-1].finish_reason == "stop"
            jsonschema.validate(json.loads("".join(d.text for d in got[rid])), schema)
        if device:  # a seeded constrained row draws the same tokens alone
            for i, (rid, ids, p) in enumerate(seeded):
                model.paging.pool.clear()
                assert _tokens(_run(loop, {0: [(f"a{i}", ids, p)]})[f"a{i}"]) == _tokens(got[rid])
            assert not reads
        model.paging.pool.check()
    assert runs[True] == runs[False]
