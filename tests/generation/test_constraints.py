"""Constrained decoding in the loop (generation/constraints.py): a grammar's mask applied to the
logits before the draw, a step's constrained rows masked together, logit_bias added first.

The loop tests run the tiny random llama with a byte-level tokenizer (its 256 tokens are the 256
bytes), so a random model's tokens, masked, must still spell documents that validate."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kern.generation import SamplingParams
from kern.generation.constraints import Grammars, _vocabulary, json_schema_grammar, unpack
from kern.generation.sampling import penalize, sample

from .conftest import make_loop
from .test_loop import _run, _tokens

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")


def test_bit_b_of_word_w_is_token_32w_plus_b():
    words = np.zeros((2, 3), np.int32)
    words[0, 0] = 1 << 5  # token 5
    words[0, 2] = np.int32(-2**31)  # bit 31 of word 2: token 95, past the width of 70
    words[1, 1] = 0b11  # tokens 32 and 33
    got = unpack(words, 70)
    assert got.shape == (2, 70)
    assert np.flatnonzero(got[0]).tolist() == [5] and np.flatnonzero(got[1]).tolist() == [32, 33]


def _z(rows=3, v=40, seed=0):
    return np.random.default_rng(seed).normal(size=(rows, v)).astype(np.float32) * 4


def test_a_masked_row_draws_only_allowed_tokens_greedy_or_sampled():
    z = _z()
    allowed = np.zeros(z.shape, bool)
    allowed[:, [3, 17, 29]] = True
    greedy = sample(z, [SamplingParams()] * 3, [None] * 3, [[]] * 3, [[]] * 3, allowed)[0]
    assert greedy == [[3, 17, 29][int(np.argmax(z[i, [3, 17, 29]]))] for i in range(3)]
    for seed in range(30):
        rng = [np.random.Generator(np.random.PCG64(seed + k)) for k in range(3)]
        toks = sample(z, [SamplingParams(temperature=2.0, top_p=0.9)] * 3, rng, [[]] * 3, [[]] * 3, allowed)[0]
        assert set(toks) <= {3, 17, 29}


def test_a_row_whose_allowed_tokens_all_sit_at_minus_infinity_still_draws_one_of_them():
    z = _z(1)
    z[0, [4, 9]] = np.nan  # the only allowed tokens: NaN counts as -inf
    allowed = np.zeros(z.shape, bool)
    allowed[0, [4, 9]] = True
    assert sample(z, [SamplingParams()], [None], [[]], [[]], allowed)[0][0] in (4, 9)


def test_logit_bias_is_added_before_the_penalties_and_a_token_past_the_width_is_ignored():
    z = _z(1)
    p = SamplingParams(logit_bias=((2, 100.0), (5, -100.0), (10_000, 50.0)))
    got = penalize(z, [p], [[]], [[]])
    want = z[0].astype(np.float64)
    want[2] += 100
    want[5] -= 100
    assert np.array_equal(got[0], want)
    assert sample(z, [p], [None], [[]], [[]])[0] == [2]


# ---- through the loop, on the tiny llama with a byte tokenizer -----------------------------------

@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from kern.tokenizer import Tokenizer as KernTokenizer

    tok = Tokenizer(models.BPE(vocab={c: b for b, c in enumerate(_byte_chars())}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    folder = tmp_path_factory.mktemp("bytes")
    tok.save(str(folder / "tokenizer.json"))
    return KernTokenizer(folder)


def _byte_chars() -> list[str]:
    """The character byte-level tokenizers spell byte b with (GPT-2's table): token b is byte b."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                      "b": {"enum": ["x", "yz"]}}, "required": ["a", "b"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"enum": ["red", "green", "blue"]},
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}}, "required": ["s"],
     "additionalProperties": False},
    {"$defs": {"d": {"type": "integer", "minimum": 10, "maximum": 20}}, "type": "array",
     "items": {"$ref": "#/$defs/d"}, "maxItems": 2},
]


def _loop(tiny_llama, byte_tokenizer):
    loop = make_loop(tiny_llama)
    loop.tokenizer = byte_tokenizer
    loop.eos = {0}  # byte 0 (NUL, never in a JSON text) ends a document: the grammar allows it once complete
    return loop


def _text(deltas) -> str:
    return "".join(d.text for d in deltas)


def test_a_random_model_masked_spells_documents_that_validate_beside_free_rows(tiny_llama, byte_tokenizer):
    loop = _loop(tiny_llama, byte_tokenizer)
    reqs = [(f"g{i}", [5 + i, 6, 7], SamplingParams(max_tokens=64, temperature=1.0, seed=i,
                                                      grammar=json_schema_grammar(s)))
            for i, s in enumerate(SCHEMAS)]
    free = [(f"f{i}", [9, 9, i], SamplingParams(max_tokens=12, ignore_eos=True)) for i in range(2)]
    got = _run(loop, {0: reqs[:3] + free, 2: reqs[3:]})
    for (rid, _, _), schema in zip(reqs, SCHEMAS):
        assert got[rid][-1].finish_reason == "stop", _text(got[rid])
        jsonschema.validate(json.loads(_text(got[rid])), schema)
    assert all(len(_tokens(got[f"f{i}"])) == 12 for i in range(2))


def test_a_seeded_constrained_request_gets_the_same_tokens_alone_and_batched(tiny_llama, byte_tokenizer):
    p = SamplingParams(max_tokens=40, temperature=1.0, seed=3, grammar=json_schema_grammar(SCHEMAS[0]))
    alone = _tokens(_run(_loop(tiny_llama, byte_tokenizer), {0: [("s", [1, 2, 3], p)]})["s"])
    others = [(f"o{i}", [4, i], SamplingParams(max_tokens=30, temperature=0.8, seed=i,
                                               grammar=json_schema_grammar(SCHEMAS[1 + i % 4]))) for i in range(4)]
    got = _run(_loop(tiny_llama, byte_tokenizer), {0: others[:2], 1: [("s", [1, 2, 3], p)], 3: others[2:]})
    assert _tokens(got["s"]) == alone


def test_several_end_tokens_each_end_a_document(tiny_llama, byte_tokenizer):
    """Llama 3's tokenizers end a sequence on several tokens (128001, 128008, 128009): llguidance
    gets all of them, and a complete document may end on any (where llguidance takes a list: the
    version kern pins does; the next test is the older one's)."""
    import llguidance

    try:
        llguidance.LLTokenizer(byte_tokenizer.tok.to_str(), n_vocab=256, eos_token=[0])
    except TypeError:
        pytest.skip("this llguidance takes one end token")
    g = Grammars(byte_tokenizer, 256, {0, 10})
    m = g.matcher(json_schema_grammar({"type": "integer"}))
    assert m.consume_tokens([ord("7")])
    assert g.allowed([m])[0][[0, 10]].all()


def test_an_llguidance_that_takes_one_end_token_gets_the_lowest():
    """llguidance 1.6's LLTokenizer takes one end token and raises TypeError for a list; kern ran in
    a vLLM environment that held it (the GPU image's peer wheel set; vLLM 0.26 itself declares
    >=1.7,<1.8) and this crashed `kern serve` there at start-up."""
    got = []

    class OneEnd:
        def __init__(self, text, n_vocab=None, eos_token=None):
            if not isinstance(eos_token, int):
                raise TypeError("argument 'eos_token': 'list' object cannot be interpreted as an integer")
            got.append((text, n_vocab, eos_token))

    _vocabulary(type("llg", (), {"LLTokenizer": OneEnd}), "{}", 300, [128001, 128008, 128009])
    assert got == [("{}", 300, 128001)]


def test_plain_requests_never_touch_the_constraint_machinery(tiny_llama, byte_tokenizer):
    """Unconstrained rows cost nothing new: their tokens stay the device's (no host draw), and
    the llguidance side is never built."""
    loop = _loop(tiny_llama, byte_tokenizer)
    plain = SamplingParams(max_tokens=4, ignore_eos=True)
    _run(loop, {0: [("p", [1, 2], plain), ("q", [3], SamplingParams(max_tokens=4, temperature=0.7, seed=1))]})
    assert loop._grammars is None
    assert not plain.shaped and not plain.needs_logits
    biased = SamplingParams(max_tokens=4, logit_bias=((7, 5.0),))
    assert biased.needs_logits and not biased.device_samples  # a bias, like a grammar, draws on the host


def test_the_host_copies_only_the_logits_of_the_rows_it_draws(tiny_llama):
    """A step with one host-drawn row among device-drawn ones reads that row's logits alone
    (Engine.read_rows): on a GPU the other rows' vocabularies never cross to the host."""
    runner = make_loop(tiny_llama).runner
    feeds = [runner.scratch_feed(p) for p in (0, 3, 5)]
    tokens, every = runner.run(feeds, True)
    again, some = runner.run(feeds, [2])
    assert np.array_equal(again, tokens) and np.array_equal(some[2], every[2])
    assert runner.run(feeds, [])[1] is None
