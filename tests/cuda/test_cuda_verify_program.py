"""The sm_90a verify program, on any machine: the llama family's invariant build declares one (a
ragged CUDA-graph program whose rows take the wide decode's projections and attention_rows, the
LM head and the draw over every row, then the accept kernel), within the bounds kern test's
rounds need; builds whose programs are not batch-invariant (batch_invariant=False: the tensor-parallel,
megakernel and MoE manifests build on it) declare none, and --speculate on them is refused in
one line naming the target and the model. The rounds themselves on the H200:
tests/generation/test_speculative_gpu.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from kern.generation.speculative import SpeculateError
from kern.manifest import load_verified
from kern.manifest.protocol import derive, verify_problem
from kern.speculation import speculator_for
from kern_models.llama.generator import generate
from kern_models.llama.manifests.cuda import VERIFY_ROWS, VERIFY_SEQS

TINY = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, intermediate_size=128, vocab_size=256, tie_word_embeddings=True,
            max_position_embeddings=1024)


def _ops(m, program: str) -> list[str]:
    return [c.op for c in m.programs[program].calls]


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    return load_verified(generate(TINY, tmp_path_factory.mktemp("sm90"), target="cuda", model="tiny"))


def test_the_invariant_build_declares_a_verify_program(sm90):
    st = derive(sm90).verify
    assert st is not None and st.program == "verify_round" and verify_problem(st) is None
    assert (st.groups_max, st.rows_max) == (VERIFY_SEQS, VERIFY_ROWS)
    assert sm90.manifest.programs["verify_round"].graph  # one graph a (sequences, rows) pair
    # kern test's rounds: 3 rows for each of up to 32 sequences (the cpu reference's bounds)
    assert VERIFY_SEQS >= 32 and VERIFY_ROWS >= 3 * 32


def test_a_verify_row_takes_a_decode_rows_kernels(sm90):
    """Every projection of the verify program is one the decode program runs (the gemv kernels:
    a round's few rows read each weight once; the same bits as the wide decode's gemm twins),
    attention is attention_rows (decode's split order), no row is gathered: the LM head, the
    draw and then accept over every row."""
    m = sm90.manifest
    ops = _ops(m, "verify_round")
    decode = set(_ops(m, "decode"))
    assert {o for o in ops if "gemv" in o or "gemm" in o} <= decode
    assert "attention_rows" in ops and "gather_last" not in ops and "attention_decode" not in ops
    assert ops[-3:] == [_ops(m, "decode")[-2], "sample", "accept"]
    accept = m.programs["verify_round"].calls[-1]
    assert [a.buf for a in accept.args[:4]] == ["v_ids", "v_cu_seqlens", "v_next", "v_accepted"]


def test_the_verify_programs_buffers_are_the_cpu_references_names(sm90, tmp_path):
    """kern test judges the verify program span by span against the cpu one: the buffers that
    both have are named alike (the roles' buffers among them)."""
    cpu = derive(load_verified(generate(TINY, tmp_path, target="cpu", model="tiny"))).verify
    cuda = derive(sm90).verify
    assert cuda.inputs == cpu.inputs and cuda.outputs == cpu.outputs
    assert [p.buffer for p in cuda.page_tables] == [p.buffer for p in cpu.page_tables]


def _refusal(verified) -> str:
    model = SimpleNamespace(verified=verified, protocol=derive(verified))
    with pytest.raises(SpeculateError) as e:
        speculator_for("ngram:4", model)
    return str(e.value)


def test_a_build_that_is_not_invariant_declares_none_and_is_refused_in_one_line(tmp_path):
    v = load_verified(generate(TINY, tmp_path, target="cuda", model="tiny", batch_invariant=False))
    assert derive(v).verify is None and "verify_round" not in v.manifest.programs
    why = _refusal(v)
    assert "sm_90a deployment of tiny declares no verify program" in why and "\n" not in why


def test_the_moe_family_verifies_rounds_on_sm90a_and_refuses_them_without_invariance(tmp_path):
    """Qwen3-MoE's sm_90a default is the invariant build: its verify program runs the MoE block
    like its other programs; its --no-batch-invariance build declares none and is refused."""
    from kern_models.qwen3_moe.generator import generate as moe_generate
    from tests.qwen3_moe.test_cuda import PUBLISHED

    v = load_verified(moe_generate(PUBLISHED, tmp_path / "inv", target="cuda", model="qwen3-moe"))
    assert derive(v).verify is not None
    assert "moe_route_sort" in {c.op for c in v.manifest.programs["verify_round"].calls}  # decode's routing
    v = load_verified(moe_generate(PUBLISHED, tmp_path / "fast", target="cuda", model="qwen3-moe", batch_invariant=False))
    assert derive(v).verify is None
    why = _refusal(v)
    assert "sm_90a deployment of qwen3-moe declares no verify program" in why and "\n" not in why


def test_the_example_deployment_verifies_rounds():
    """The committed sm_90a example (the embedded model) carries the verify program."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "smollm2-135m-instruct-sm90a" / "manifest.json"
    m = json.loads(path.read_text())
    assert "verify_round" in m["programs"] and "accept" in m["modules"]


def test_a_last_row_buffer_the_cpu_reference_also_names_holds_what_the_cpu_gathers(sm90, tmp_path):
    """kern test pairs the buffers two builds share by name: where sm_90a's LM head normalises
    the residual itself, its gathered last rows (of x) must not take the name of the cpu's
    gathered last rows (of the normed h)."""
    cpu = load_verified(generate(TINY, tmp_path, target="cpu", model="tiny")).manifest

    def gathered(m) -> dict[str, str]:  # gather_last's output -> its input, every program
        return {c.args[2].buf: c.args[0].buf for pr in m.programs.values() for c in pr.calls
                if c.op == "gather_last"}
    ours, theirs = gathered(sm90.manifest), gathered(cpu)
    assert ours and theirs
    for out, src in ours.items():
        assert out not in theirs or theirs[out] == src, (out, src, theirs[out])
