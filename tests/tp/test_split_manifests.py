"""What a split deployment is, as data: one verified manifest a rank, each binding its slice of
the checkpoint's tensors, an all-reduce after every fan-in projection (which one by the size
of its largest message), and the refusals, each one line naming its place."""

from __future__ import annotations

import json
import shutil

import pytest

from kern.manifest import verify_path, verify_text
from kern.runtime.errors import KernError
from kern.world.ranks import RankedEngine, RankError, rank_manifests
from kern_models.llama.config import ConfigError
from kern_models.llama.generator import generate

LLAMA = dict(architectures=["LlamaForCausalLM"], hidden_size=256, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=4, head_dim=64, intermediate_size=512, vocab_size=256,
             max_position_embeddings=512, tie_word_embeddings=False)


def _ranks(folder, n):
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_verifies_and_binds_its_slice(tmp_path, target, tp):
    generate(LLAMA, tmp_path, target=target, tp=tp)
    ms = _ranks(tmp_path, tp)
    for r, m in enumerate(ms):
        assert verify_path(tmp_path / f"rank{r}.json").problems == []
        assert m["topology"] == {"ranks": tp, "rank": r, "groups": {"tp": [list(range(tp))]}}
        assert (m["constants"]["heads"], m["constants"]["kv_heads"], m["constants"]["inter"]) == \
            (8 // tp, 4 // tp, 512 // tp)
    # the ranks' slices tile every sharded tensor exactly once, in rank order
    for buf, key in (("qkv_w.1", "rows"), ("gate_up_w.0", "rows"), ("o_w.0", "cols"), ("down_w.1", "cols")):
        segs = [m["buffers"][buf]["bind"] for m in ms]
        for i in range(len(segs[0])):
            ranges = [s[i][key] for s in segs]
            assert ranges[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all("rows" not in s and "cols" not in s for s in ms[0]["buffers"]["embed"]["bind"])


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_the_lm_head_splits_by_vocabulary_and_its_logits_are_gathered(tmp_path, target):
    """Each rank reads its slice of the LM head's rows into its part of the logits; an all-gather
    puts every part in place on every rank before sampling. A vocabulary that does not divide
    keeps the whole head on every rank."""
    generate(LLAMA, tmp_path / "even", target=target, tp=4)
    for r, m in enumerate(_ranks(tmp_path / "even", 4)):
        assert m["constants"]["vocab_shard"] == 64
        assert m["buffers"]["lm_head"]["shape"][0] == "vocab_shard"
        assert [s["rows"] for s in m["buffers"]["lm_head"]["bind"]] == [[64 * r, 64 * (r + 1)]]
        ops = [c["op"] for c in m["programs"]["decode"]["calls"]]
        assert ops[-2:] == ["all_gather", "sample"] and ops.count("all_gather") == 1
    odd = json.loads(generate({**LLAMA, "vocab_size": 258}, tmp_path / "odd", target=target, tp=4).read_text())
    assert "vocab_shard" not in odd["constants"] and "rows" not in odd["buffers"]["lm_head"]["bind"][0]
    assert all(c["op"] != "all_gather" for p in odd["programs"].values() for c in p["calls"])


def _reduces(cfg, out, **kw):
    m = json.loads(generate(cfg, out, target="cuda", tp=2, **kw).read_text())
    return m, {p: [c["op"] for c in m["programs"][p]["calls"] if c["op"].startswith(("all_reduce", "gemv_push", "gemm_push"))]
               for p in ("prefill", "decode", "decode_wide")}


def test_the_invariant_split_pushes_every_fan_in_part_at_any_size(tmp_path):
    """The default (batch-invariant) build: every fan-in projection is its pushing twin (the
    rank's f32 part into every rank's slot, in the gemv's order whatever the rows: gemv_push in
    decode, gemm_push in prefill, gemm_push_split in the wide decode's few rows) and the
    all-reduce sums the slots in rank order from local memory; no NCCL at any message size."""
    for hidden in (256, 1024):
        m, got = _reduces({**LLAMA, "hidden_size": hidden}, tmp_path / str(hidden))
        assert got["prefill"] == ["gemm_push", "all_reduce_add_local"] * 4
        assert got["decode"] == ["gemv_push", "all_reduce_add_local"] * 4
        assert set(got["decode_wide"][::2]) <= {"gemm_push", "gemm_push_split"} and \
            got["decode_wide"][1::2] == ["all_reduce_add_local"] * 4
        for name, prog in m["programs"].items():  # the verify round's too: no fan-in left unsummed
            calls = prog["calls"]
            for i, c in enumerate(calls):
                if any(str(a.get("buf", "")).startswith(("o_w.", "down_w.")) for a in c["args"]):
                    assert c["op"] in ("gemv_push", "gemm_push", "gemm_push_split"), (name, c["op"])
                    assert calls[i + 1]["op"] == "all_reduce_add_local", (name, i)
        entries = {la.get("entry") for op in m["ops"].values() for la in op["impl"]["launches"]}
        assert not any(e.startswith("extern:") for e in entries), entries  # neither NCCL nor cuBLASLt
        push = m["ops"]["gemm_push"]["impl"]["launches"][0]
        twin = m["ops"].get("gemm_residual")  # the pushing twin launches as the projection it replaces would
        assert push["module"] == "allreduce" and push["tiles"] == {"x": [32, 64], "W": [32, 64]}
        assert twin is None and push["block"] == [384]


def test_the_faster_split_chooses_its_all_reduce_by_message_size(tmp_path):
    """batch_invariant=False (cuBLASLt): decode's messages (32 rows of fp32) go through the peer
    kernel, pushed, and the wide decode's (256 rows of bf16) up to hidden 4096; prefill's (2,048
    rows) through it at hidden 256 (1 MiB), through NCCL past 2 MiB."""
    _, small = _reduces(LLAMA, tmp_path / "small", batch_invariant=False)
    assert small == {"prefill": ["all_reduce"] * 4, "decode": ["gemv_push", "all_reduce_add_local"] * 4,
                     "decode_wide": ["all_reduce"] * 4}
    _, large = _reduces({**LLAMA, "hidden_size": 1024}, tmp_path / "large", batch_invariant=False)
    assert large == {"prefill": ["all_reduce_nccl"] * 4, "decode": ["gemv_push", "all_reduce_add_local"] * 4,
                     "decode_wide": ["all_reduce"] * 4}


def test_past_two_ranks_every_all_reduce_is_the_fixed_order_peer_kernel(tmp_path):
    """NCCL's sum is one addition an element only over two ranks (the same bits whatever its
    algorithm); over four its order moves with the message size, so the faster build's every size
    takes the peer kernel (the rank-order sum), prefill's 2,048-row messages included."""
    cfg = {**LLAMA, "hidden_size": 1024}
    generate(cfg, tmp_path, target="cuda", tp=4, batch_invariant=False)
    for m in _ranks(tmp_path, 4):
        entries = {la.get("entry") for op in m["ops"].values() for la in op["impl"]["launches"]}
        assert not any(e.startswith("extern:nccl") for e in entries), entries
        assert [c["op"] for c in m["programs"]["prefill"]["calls"] if c["op"].startswith("all_reduce")] == \
            ["all_reduce"] * 4


@pytest.mark.parametrize("cfg, tp, why", [
    (LLAMA, 3, "tp 3: num_attention_heads 8 does not split over 3 ranks; num_key_value_heads 4 does not split "
               "over 3 ranks; intermediate_size 512 does not split over 3 ranks"),
    ({**LLAMA, "num_key_value_heads": 2}, 4, "tp 4: num_key_value_heads 2 does not split over 4 ranks"),
    (LLAMA, 0, "tp 0: must be a whole number >= 1"),
])
def test_a_split_that_does_not_divide_is_one_line(tmp_path, cfg, tp, why):
    with pytest.raises(ConfigError) as e:
        generate(cfg, tmp_path, target="cpu", tp=tp)
    assert str(e.value) == why


def test_the_verifier_holds_peers_and_collectives_to_the_topology(tmp_path):
    m = json.loads(generate({**LLAMA, "hidden_size": 1024}, tmp_path, target="cuda", tp=2,
                            batch_invariant=False).read_text())
    bad = json.loads(json.dumps(m))
    bad["buffers"]["ar_flag_peers"]["dtype"] = "u32"
    problems = [(p.where, p.what) for p in verify_text(json.dumps(bad), base_dir=tmp_path).problems]
    assert ("buffers.ar_flag_peers", "a peer buffer is u64 of shape [2] (one address a rank), got u32 ['ranks']") \
        in problems
    single = json.loads(json.dumps(m))
    single["topology"] = {"ranks": 1, "rank": 0, "groups": {}}
    whats = [p.what for p in verify_text(json.dumps(single), base_dir=tmp_path).problems]
    assert "extern:nccl_all_reduce_sum_bf16 is a collective: it needs a topology of 2 or more ranks" in whats
    assert "peer buffers need a topology of 2 or more ranks" in whats


def test_rank_files_must_fit_together(tmp_path):
    generate(LLAMA, tmp_path, target="cpu", tp=2)
    assert [v.manifest.topology.rank for v in rank_manifests(tmp_path / "rank1.json")] == [0, 1]
    shutil.copyfile(tmp_path / "rank0.json", tmp_path / "rank1.json")
    with pytest.raises(RankError, match=r"rank1.json: topology says rank 0 of 2 .* needs rank 1 of 2"):
        rank_manifests(tmp_path / "rank0.json")
    (tmp_path / "rank1.json").unlink()
    with pytest.raises(RankError, match="a 2-rank deployment needs rank1.json beside rank0.json"):
        rank_manifests(tmp_path / "rank0.json")


def test_a_split_deployment_has_no_host_tier(tmp_path):
    generate(LLAMA, tmp_path, target="cpu", tp=2)
    with pytest.raises(RankError, match="no host tier|without it"):
        RankedEngine(rank_manifests(tmp_path / "rank0.json"), None, host_bytes=1 << 20)
    assert issubclass(RankError, KernError)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM"])
def test_the_split_decode_keeps_the_pdl_order(tmp_path, arch):
    """The peer all-reduces and the logits' all-gather trigger at entry and read nothing before
    their wait; what launches behind them reads only weights before its own (the next projection,
    common.cuh) or nothing (the sampling behind the all-gather waits at entry, argmax.cu)."""
    from tests.cuda.test_cuda_pdl_order import EARLY, WEIGHTS_ONLY_BEFORE_WAIT, _violations

    m = json.loads(generate({**LLAMA, "architectures": [arch]}, tmp_path, target="cuda", tp=2).read_text())
    seq = [(la["entry"], bool(la.get("pdl"))) for c in m["programs"]["decode"]["calls"]
           for la in m["ops"][c["op"]]["impl"]["launches"]]
    reduce = [("gemv_push", True), ("all_reduce_add_local", True)]
    assert all(e in seq for e in [*reduce, ("all_gather_f32", True)])
    ours = {"all_reduce_add_local", "all_gather_f32"}
    early = EARLY | ours
    weights_only = WEIGHTS_ONLY_BEFORE_WAIT | ours | {"sample_partial", "gemv_push"}
    bad = [f"{e} behind {b}" for (b, _), (e, pdl) in zip(seq, seq[1:])
           if pdl and b in early and e not in weights_only]
    assert bad == [] and [v for v in _violations(seq) if not v.startswith(tuple(weights_only))] == []
