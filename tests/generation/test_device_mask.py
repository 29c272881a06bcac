"""A grammar's token mask applied by the sample op (roles `mask` and `mask_row`), not on the host:
the op's semantics against the host's sampling.mask, the protocol's mask var, what the runner
writes, and the loop drawing a constrained row with no logits read back (the cpu op is the
reference of cuda/argmax.cu; tests/generation/test_constraints_gpu.py runs the same on the GPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kern.generation import SamplingParams
from kern.generation.constraints import json_schema_grammar, unpack
from kern.generation.loop import draw_key
from kern.generation.runner import Feed, Runner, Units
from kern.generation.sampling import sample as host_sample
from kern.manifest.protocol import PageTable, ServingProtocol, ProtocolError, Stepper
from kern_models.llama.kernels.cpu.kernels import sample as op_sample

from .conftest import make_loop
from .test_constraints import SCHEMAS, byte_tokenizer  # noqa: F401  (fixture)
from .test_loop import _run, _tokens

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")


def _pack(allowed: np.ndarray) -> np.ndarray:
    """bool [rows, vocab] as llguidance's int32 words (bit t % 32 of word t // 32)."""
    rows, vocab = allowed.shape
    bits = np.zeros((rows, -(-vocab // 32) * 32), np.uint8)
    bits[:, :vocab] = allowed
    return np.packbits(bits, axis=1, bitorder="little").view("<i4")


def _op(logits, allowed, temps=None, keys=None, masked=None) -> list[int]:
    """The cpu sample op over these rows, row r masked by allowed[r] (where masked[r], default all)."""
    n = len(logits)
    temps = np.zeros(n, np.float32) if temps is None else np.asarray(temps, np.float32)
    keys = np.zeros((n, 2), np.int32) if keys is None else keys
    rows = np.arange(1, n + 1, dtype=np.int32) if masked is None else np.where(masked, np.arange(1, n + 1), 0)
    out = np.empty(n, np.int32)
    op_sample(np.asarray(logits, np.float32), temps, keys, _pack(allowed), rows.astype(np.int32), out)
    return out.tolist()


def _hard_rows(n=64, vocab=200, seed=0):
    """Logits with ties, NaN, -inf and +inf, and masks of every density (a few rows allow none)."""
    rng = np.random.default_rng(seed)
    z = rng.integers(-3, 4, (n, vocab)).astype(np.float32)  # small integers: ties everywhere
    z[rng.random(z.shape) < 0.05] = np.nan
    z[rng.random(z.shape) < 0.05] = -np.inf
    z[rng.random(z.shape) < 0.005] = np.inf
    allowed = rng.random(z.shape) < rng.choice([0.002, 0.02, 0.3, 1.0], (n, 1))
    dead = rng.choice(n, 8, replace=False)  # rows whose allowed tokens all sit at -inf or NaN
    z[dead] = np.where(allowed[dead], rng.choice([-np.inf, np.nan], (8, vocab)), z[dead])
    return z, allowed


def test_a_masked_greedy_draw_is_the_host_paths_token_bit_for_bit():
    z, allowed = _hard_rows()
    greedy = [SamplingParams()] * len(z)
    live = allowed.any(axis=1)
    want = host_sample(z, greedy, [None] * len(z), [[]] * len(z), [[]] * len(z), allowed)[0]
    got = _op(z, allowed)
    assert [g for g, ok in zip(got, live) if ok] == [w for w, ok in zip(want, live) if ok]
    assert all(allowed[r, t] for r, t in enumerate(got) if live[r])
    assert [g for g, ok in zip(got, live) if not ok] == [0] * int((~live).sum())  # none allowed: token 0


def test_a_row_with_no_live_allowed_logit_draws_among_them_greedy_lowest_sampled_evenly():
    vocab, n = 64, 4000
    z = np.zeros((n, vocab), np.float32)
    z[:, :40] = 5.0  # forbidden, and live
    allowed = np.zeros((n, vocab), bool)
    allowed[:, [41, 50, 60]] = True
    z[:, [41, 50, 60]] = [-np.inf, np.nan, -np.inf]
    assert set(_op(z[:3], allowed[:3])) == {41}
    keys = np.array([draw_key(5, i) for i in range(n)], "<u8").view("<i4").reshape(n, 2)
    counts = np.bincount(_op(z, allowed, np.full(n, 0.8), keys), minlength=vocab)
    # the -inf ones before the NaN one (the host makes NaN -inf and -inf the lowest float64)
    assert counts.sum() == counts[[41, 60]].sum() and counts[[41, 60]].min() > n / 2 - 150
    z[:, [41, 60]] = np.nan  # every allowed logit NaN: among them all
    counts = np.bincount(_op(z, allowed, np.full(n, 0.8), keys), minlength=vocab)
    assert counts.sum() == counts[[41, 50, 60]].sum() and counts[[41, 50, 60]].min() > n / 3 - 150
    assert _op(z[:1], allowed[:1]) == [41] and _op(z[:1], np.zeros((1, vocab), bool)) == [0]


def test_a_mask_allowing_every_token_draws_what_the_unmasked_op_draws_for_the_key():
    """The same keyed Gumbel noise as an unconstrained device draw: a grammar that allows the
    token drawn changes nothing, greedy or sampled."""
    rng = np.random.default_rng(3)
    n, vocab = 200, 300
    z = (rng.standard_normal((n, vocab)) * 3).astype(np.float32)
    keys = np.array([draw_key(9, i) for i in range(n)], "<u8").view("<i4").reshape(n, 2)
    temps = np.where(np.arange(n) % 2, 0.9, 0.0)
    everything = np.ones((n, vocab), bool)
    assert _op(z, everything, temps, keys) == _op(z, everything, temps, keys, masked=np.zeros(n, bool))
    # and a mask that keeps the unmasked draw's token keeps the token
    free = _op(z, everything, temps, keys, masked=np.zeros(n, bool))
    some = rng.random((n, vocab)) < 0.3
    some[np.arange(n), free] = True
    got = _op(z, some, temps, keys)
    assert got == free


def test_the_mask_var_takes_power_of_two_buckets_of_the_masked_rows():
    st = Stepper("decode", None, 8, 1, None, 8, {"mask": "d_mask", "mask_row": "d_mask_row"}, {}, (),
                 mask_var="mask_rows", mask_max=8)
    assert [st.mask_bucket(k) for k in (0, 1, 2, 3, 5, 8)] == [1, 1, 2, 4, 8, 8]
    assert st.vars_for(4, 4)["mask_rows"] == 1 and st.vars_for(4, 4, masked=3)["mask_rows"] == 4
    with pytest.raises(ProtocolError, match="9 masked rows"):
        st.vars_for(8, 8, masked=9)


def test_the_generated_manifests_declare_the_mask_inputs_of_every_program(tiny_llama):
    _, manifest = tiny_llama
    from kern.manifest.verify import load_verified
    from kern.manifest.protocol import derive

    proto = derive(load_verified(manifest))
    for st in proto.every:
        assert {"mask", "mask_row"} <= st.inputs.keys() and st.mask_var == "mask_rows", st.program


class _Recording:
    def __init__(self):
        self.steps: list[tuple[dict, dict]] = []
        self.shapes = {f"{p}_{b}": (8, w) for p in "dp" for b, w in (("pt", 4), ("mask", 3))}

    def runs_steps_natively(self, program):
        return False

    def run(self, program, vars, inputs=None, wait=True):
        self.steps.append((dict(vars), dict(inputs)))
        return {"n": len(next(v for k, v in inputs.items() if k.endswith("_mask_row")))}

    def read(self, buffer, env):
        return np.full(env["n"], 7, np.int32)


def test_the_runner_packs_the_masked_rows_words_and_numbers_them_from_one():
    def stepper(p: str, rows: int | None) -> Stepper:
        return Stepper(p, "seqs", 8, rows, None if rows else "tokens", 8 if rows else 32,
                       {"token": f"{p}_ids", "position": f"{p}_pos", "mask": f"{p}_mask", "mask_row": f"{p}_mask_row"},
                       {"tokens": f"{p}_next"}, (PageTable(f"{p}_pt", "kv", 4),), mask_var="mask_rows", mask_max=8)
    eng = _Recording()
    scratch = type("S", (), {"page_table": lambda self, s: [0], "slot": lambda self, s: 0})()
    r = Runner(eng, ServingProtocol((stepper("d", 1), stepper("p", None)), (), {"kv": 4}), scratch)
    assert r.masks
    u = Units({"kv": [1]}, {})
    w1, w2 = np.array([1, 2, 3], np.int32), np.array([4, 5, 6], np.int32)
    r.run([Feed([1], 0, u), Feed([2], 0, u, mask=w1), Feed([3], 0, u), Feed([4], 0, u, mask=w2),
           Feed([5], 0, u, mask=w1)], logits=False)
    vars_, ins = eng.steps[-1]
    assert ins["d_mask_row"].tolist() == [0, 1, 0, 2, 3] and vars_["mask_rows"] == 4
    assert ins["d_mask"].tolist() == [[1, 2, 3], [4, 5, 6], [1, 2, 3], [0, 0, 0]]
    r.run([Feed([1], 0, u)], logits=False)  # a step without masks: every row reads 0, no words go up
    vars_, ins = eng.steps[-1]
    assert ins["d_mask_row"].tolist() == [0] and "d_mask" not in ins and vars_["mask_rows"] == 1


# ---- the loop on the tiny llama with a byte tokenizer ---------------------------------------------

def _loop(tiny_llama, byte_tokenizer, **kw):
    loop = make_loop(tiny_llama, **kw)
    loop.tokenizer = byte_tokenizer
    loop.eos = {0}
    return loop


def _count_reads(loop) -> list[int]:
    """Wrap the engine's read_rows (the host's copy of some rows' logits): the rows read, a list."""
    rows: list[int] = []
    real = loop.engine.read_rows

    def counted(buffer, env, which):
        rows.extend(which)
        return real(buffer, env, which)
    loop.engine.read_rows = counted
    return rows


def test_constrained_greedy_rows_draw_on_the_device_the_host_paths_tokens_with_no_logits_read(
        tiny_llama, byte_tokenizer):
    reqs = [(f"g{i}", [5 + i, 6, 7], SamplingParams(max_tokens=64, grammar=json_schema_grammar(s)))
            for i, s in enumerate(SCHEMAS)]
    free = [("f", [9, 9, 1], SamplingParams(max_tokens=12, ignore_eos=True))]
    runs = {}
    for device in (True, False):
        loop = _loop(tiny_llama, byte_tokenizer)
        assert loop.runner.masks
        loop.runner.masks = device  # False: the host path (the row's logits read back, sampling.mask)
        reads = _count_reads(loop)
        got = _run(loop, {0: reqs[:3] + free, 1: reqs[3:]})
        runs[device] = {rid: _tokens(d) for rid, d in got.items()}
        assert (len(reads) == 0) == device, len(reads)
        for (rid, _, _), schema in zip(reqs, SCHEMAS):
            assert got[rid][-1].finish_reason == "stop"
            jsonschema.validate(json.loads("".join(d.text for d in got[rid])), schema)
    assert runs[True] == runs[False]


def test_a_seeded_constrained_row_draws_on_the_device_the_same_tokens_alone_batched_and_run_ahead(
        tiny_llama, byte_tokenizer):
    """A sampled constrained row draws with the unconstrained rows' keyed noise: the same tokens
    whatever shares its steps; run-ahead of the rows beside it never takes it along."""
    p = SamplingParams(max_tokens=40, temperature=0.9, seed=4, grammar=json_schema_grammar(SCHEMAS[3]))
    loop = _loop(tiny_llama, byte_tokenizer)
    reads = _count_reads(loop)
    alone = _tokens(_run(loop, {0: [("s", [1, 2, 3], p)]})["s"])
    loop = _loop(tiny_llama, byte_tokenizer)
    from dataclasses import replace
    loop.limits = replace(loop.limits, run_ahead=4)
    others = [(f"o{i}", [4, i], SamplingParams(max_tokens=20, temperature=0.7, seed=i, ignore_eos=True))
              for i in range(3)]
    got = _run(loop, {0: others, 2: [("s", [1, 2, 3], p)]})
    assert _tokens(got["s"]) == alone and not reads
    jsonschema.validate(json.loads("".join(d.text for d in got["s"])), SCHEMAS[3])


def test_a_constrained_row_that_asks_for_logprobs_still_draws_on_the_host(tiny_llama, byte_tokenizer):
    loop = _loop(tiny_llama, byte_tokenizer)
    reads = _count_reads(loop)
    p = SamplingParams(max_tokens=30, logprobs=2, grammar=json_schema_grammar(SCHEMAS[2]))
    got = _run(loop, {0: [("l", [3, 4], p)]})["l"]
    assert reads and all(d.logprobs for d in got[:-1] if d.token_ids)
    assert json.loads("".join(d.text for d in got)) in SCHEMAS[2]["enum"]


def test_unpack_reads_the_words_the_runner_uploads():
    allowed = np.random.default_rng(1).random((3, 70)) < 0.4
    assert np.array_equal(unpack(_pack(allowed), 70), allowed)
