"""The sm_90a manifest's limits, on the CPU: the prefill program takes a server's batch (up to
256 sequences, each may be one decode row), the graph-captured decode program stays at 32, and
the context bound is the model's own unless given."""

from __future__ import annotations

import pytest

from kern.manifest import load_verified
from kern.manifest.protocol import derive
from kern_models.llama.config import ConfigError, shape_of
from kern_models.llama.generator import GENERATOR

TINY = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, intermediate_size=128, vocab_size=256, tie_word_embeddings=True,
            max_position_embeddings=40000)


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm90")
    return load_verified(GENERATOR.generate(TINY, out, target="cuda", model="tiny"))


def test_large_decode_batches_step_through_the_wide_decode_program(sm90):
    """Up to 8 sequences a step take the gemv decode program (past that the GEMMs are faster);
    9 to 256 the wide one (GEMMs, one row a sequence), not the ragged prefill program."""
    proto = derive(sm90)
    assert proto.for_rows(8, 1).program == "decode"
    assert proto.for_rows(9, 1).program == "decode_wide"
    st = proto.for_rows(256, 1)
    assert st.program == "decode_wide" and st.vars_for(256, 256, reach=64)["wide_seqs"] == 256
    assert proto.for_rows(256, None).program == "prefill"


def test_the_prefill_grids_resolve_over_256_sequences(sm90):
    """The launches whose grids run over rows and sequences: one block a sequence
    (gather_last), a query head and 64 rows (attention_rows), 128 rows (the projections), its logits
    rows (argmax)."""
    from kern.manifest.expr import evaluate

    m = sm90.manifest
    env = {**sm90.constants, **{n: v.max for n, v in m.vars.items()}, "tokens": 256, "prefill_seqs": 256}
    grids = {}
    for call in m.programs["prefill"].calls:
        for la in m.ops[call.op].impl.launches:
            if la.module:
                names = [p.split(":")[0] for p in m.ops[call.op].params]
                vals = {n: evaluate(a.value, env) for n, a in zip(names, call.args)
                        if hasattr(a, "value") and not isinstance(a.value, float)}
                grids[la.entry] = tuple(evaluate(g, {**env, **vals}) for g in la.grid)
    assert grids["gather_last"] == (256,)
    assert grids["attention_rows"] == (4, 256 // 64 + 256)  # a block a query head and 64 rows of a sequence
    assert grids["gemm_residual"] == (1, 256 // 128)  # hidden 64: one block of 128 W rows beside 128 rows
    assert grids["sample_partial"] == (128, 256) and grids["argmax_final"] == (256,)


def test_context_defaults_to_the_model_clipped_to_the_kernels(sm90, tmp_path):
    from kern_models.llama.manifests.cuda import MAX_CONTEXT

    assert sm90.manifest.vars["context"].max == MAX_CONTEXT == 32768  # the model has 40000
    small = load_verified(GENERATOR.generate(TINY, tmp_path, target="cuda", model="tiny", context=1000))
    assert small.manifest.vars["context"].max == small.manifest.vars["reach"].max == 1000


@pytest.mark.parametrize("target,context,msg", [
    ("cuda", 40000, r"context 40000: must be an integer in \[1, 32768\] \(max_position_embeddings 40000, "
                    r"the kernels 32768\)"),
    ("cuda", 0, r"context 0: must be an integer in \[1, 32768\]"),
    ("cpu", 50000, r"context 50000: must be an integer in \[1, 40000\] \(max_position_embeddings 40000\)"),
    ("cpu", "4096", r"context '4096': must be an integer"),
])
def test_a_context_the_model_or_kernels_cannot_serve_is_refused(tmp_path, target, context, msg):
    with pytest.raises(ConfigError, match=msg):
        GENERATOR.generate(TINY, tmp_path, target=target, model="tiny", context=context)


def test_the_cpu_manifest_takes_the_model_context(tmp_path):
    m = load_verified(GENERATOR.generate(TINY, tmp_path, target="cpu", model="tiny"))
    assert m.manifest.vars["context"].max == shape_of(TINY).max_pos == 40000


def test_decode_beyond_32_sequences_is_refused():
    from kern_models.llama.manifests import cuda as manifest_cuda

    with pytest.raises(ConfigError, match="seqs 64: the graph-captured decode program steps at most 32"):
        manifest_cuda.build(shape_of(TINY), "tiny", seqs=64)


def test_the_wide_decode_splits_k_only_for_its_narrow_projections():
    """Llama-3.2-1B's shape: qkv (24 column tiles of 128), o and down (16) split K over 8 blocks
    a tile (gemm.cu's *_split, the same bits); gate/up (128 tiles of 64 pairs) and the LM head
    fill the GPU whole; the scratch is sized for the widest split one (qkv)."""
    from kern_models.llama.manifests import cuda

    s = shape_of(dict(TINY, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                      intermediate_size=8192, vocab_size=128256))
    m = cuda.build(s, "1b-shape")
    layer = [c["op"] for c in m["programs"]["decode_wide"]["calls"][1:6]]
    assert layer == ["norm_gemm_rope_append_split", "attention_decode", "gemm_residual_split", "norm_gemm_swiglu",
                     "gemm_residual_split"]
    assert m["programs"]["decode_wide"]["calls"][-2]["op"] == "norm_gemm_logits"
    assert m["buffers"]["w_gpart"]["shape"] == [{"mul": [{"mul": [{"ceil_div": ["wide_seqs", 64]}, 24]}, 8 * 8192]}]


@pytest.mark.parametrize("heads,kv_heads,most,groups", [(32, 4, 4, 2), (32, 8, 4, 1), (9, 3, 4, 1), (16, 8, 4, 1),
                                                        (12, 2, 4, 2), (14, 2, 4, 7), (8, 8, 4, 1), (32, 4, 1, 8),
                                                        (9, 3, 1, 3), (12, 2, 2, 3)])
def test_decode_attention_splits_a_large_group_of_query_heads_over_blocks(heads, kv_heads, most, groups):
    """At most `most` query heads a decode attention block (a block's serial chain grows with its
    heads): the fewest blocks a kv head whose share of its heads is a whole number at most that."""
    from kern_models.llama.manifests.cuda import head_groups

    s = shape_of({**TINY, "num_attention_heads": heads, "num_key_value_heads": kv_heads})
    assert head_groups(s, most) == groups


def test_the_decode_attention_grid_takes_the_head_groups(tmp_path):
    """A group of 8 query heads a kv head (Qwen3-30B-A3B's): the gemv decode program launches a
    block a query head (8 a kv head), the wide one a block of the whole group (1 a kv head), and the split
    counters have room for each (one a query head at most)."""
    import json

    cfg = {**TINY, "num_attention_heads": 16, "num_key_value_heads": 2}
    m = json.loads(GENERATOR.generate(cfg, tmp_path, target="cuda", model="tiny").read_text())
    op = m["ops"]["attention_decode"]
    assert op["impl"]["launches"][0]["grid"][1] == {"mul": ["n_kv_heads", "head_groups"]}
    for prog, p, groups in (("decode", "d_", 8), ("decode_wide", "w_", 1)):
        (call,) = [c for c in m["programs"][prog]["calls"] if c["op"] == "attention_decode"]
        assert call["args"][op["params"].index("head_groups: i32")] == {"value": groups}
        assert m["buffers"][p + "sem"]["shape"] == [m["programs"][prog]["batch"]["groups"], "heads"]
