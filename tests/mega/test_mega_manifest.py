"""The one-kernel manifest without a GPU: what the generator writes (one cooperative call a
decode step, the weights table in mega.cu's order, the generation program found by its roles),
the kernel's signature against the manifest's op, and the configs it refuses, each in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kern.manifest import load_verified
from kern.manifest.verify import verify_path
from kern.mega import generation_program
from kern.runtime.errors import KernError
from kern_models.llama.config import ConfigError, shape_of
from kern_models.llama.generator import generate
from kern_models.llama.kernels.cuda import CUBINS
from kern_models.llama.manifests import mega

TINY = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, intermediate_size=128, vocab_size=256, max_position_embeddings=512,
            tie_word_embeddings=True)
SOURCE = CUBINS.folder / "mega.cu"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    return generate(TINY, tmp_path_factory.mktemp("mega"), target="mega", model="tiny")


def test_the_deployment_verifies_and_decodes_in_one_cooperative_launch(deployment):
    assert verify_path(deployment).verified is not None
    m = json.loads(deployment.read_text())
    (call,) = m["programs"]["decode"]["calls"]
    (launch,) = m["ops"][call["op"]]["impl"]["launches"]
    assert launch["cooperative"] and launch["grid"] == [mega.SMS] and launch["block"] == [mega.THREADS]
    assert "bar" not in launch["writes"]  # the barrier word is zero between launches: kern test must not poison it
    # prefill is the per-op manifest's cuBLASLt one (the megakernel's decode has its own bits: the
    # batch-invariant per-op programs would not make its requests' bytes their own)
    assert m["programs"]["prefill"] == json.loads(generate(TINY, deployment.parent.parent / "percall", target="cuda",
                                                           model="tiny", batch_invariant=False).read_text())["programs"]["prefill"]


def test_the_weights_table_lists_every_layer_in_the_kernels_order(deployment):
    m = json.loads(deployment.read_text())
    table = m["buffers"]["mega_weights"]
    assert table["kind"] == "pointers" and table["dtype"] == "u64"
    assert table["entries"] == ["ln1.0", "qkv_w.0", "o_w.0", "ln2.0", "gate_up_w.0", "down_w.0",
                                "ln1.1", "qkv_w.1", "o_w.1", "ln2.1", "gate_up_w.1", "down_w.1",
                                "embed", "final_norm", "lm_head"]
    text = SOURCE.read_text()
    assert f"#define PER_LAYER {len(mega.LAYER_WEIGHTS)}" in text and f"#define GLOBALS {len(mega.GLOBAL_WEIGHTS)}" in text
    assert f"#define PER_LAYER_QK {len(mega.LAYER_WEIGHTS) + len(mega.QK_WEIGHTS)}" in text


def test_qwen3_adds_its_q_k_norms_to_the_table_and_a_phase_a_layer(tmp_path):
    m = json.loads(generate({**TINY, "architectures": ["Qwen3ForCausalLM"]}, tmp_path, target="mega",
                            model="tiny", phases=True).read_text())
    assert m["buffers"]["mega_weights"]["entries"][:8] == ["ln1.0", "qkv_w.0", "o_w.0", "ln2.0", "gate_up_w.0",
                                                          "down_w.0", "q_norm.0", "k_norm.0"]
    assert len(m["programs"]["decode"]["calls"]) == mega.n_phases(2, qk_norm=True) == 1 + 6 * 2 + 2


def test_the_kernel_signature_is_the_ops_params():
    text = re.sub(r"//[^\n]*", "", SOURCE.read_text())
    sig = re.search(r'extern "C" __global__ void __launch_bounds__\([^)]*\)\s*mega_decode\(([^)]*)\)', text).group(1)
    names = [p.split()[-1].lstrip("*") for p in sig.split(",")]
    assert names == [p.split(":")[0] for p in mega.PARAMS]
    kinds = ["ptr" if "*" in p else {"int": "i32", "float": "f32"}[p.split()[0]] for p in sig.split(",")]
    assert kinds == ["ptr" if "buffer" in p or "state" in p else p.split(":")[1].strip() for p in mega.PARAMS]
    for name, value in (("MEGA_THREADS", "(32 * GEMV_WARPS)"), ("MEGA_MAX_ROWS", mega.MAX_ROWS),
                        ("MEGA_MAX_SEQS", mega.MAX_SEQS)):
        assert f"#define {name} {value}" in text


def test_the_launch_gives_the_shared_memory_mega_cu_asks(deployment):
    text = SOURCE.read_text()
    d = dict(re.findall(r"#define (MEGA_NT|MEGA_STAGE|MEGA_SMEM_BYTES) (.*)", text))
    gemv = (CUBINS.folder / "gemv.cuh").read_text()
    g = dict(re.findall(r"#define (GEMV_KU|GEMV_UNIT|GEMV_XLD|GEMV_MAX_NT) ([^/\n]*?)\s*(?://|\n)", gemv))
    assert d["MEGA_STAGE"] == "(MEGA_NT * 8 * GEMV_XLD * 2)"
    assert d["MEGA_SMEM_BYTES"] == "(GEMV_WARPS * (MEGA_STAGE + MEGA_NT * 4 * 32 * 4) + GEMV_WARPS * 8 * GEMV_MAX_NT * 4)"
    assert (g["GEMV_UNIT"], g["GEMV_XLD"]) == ("(32 * GEMV_KU)", "(GEMV_UNIT + 32)")
    warps, nt, xld = mega.THREADS // 32, int(d["MEGA_NT"]), 32 * int(g["GEMV_KU"]) + 32
    assert mega.SMEM_BYTES == warps * (nt * 8 * xld * 2 + nt * 4 * 32 * 4) + warps * 8 * int(g["GEMV_MAX_NT"]) * 4
    (launch,) = json.loads(deployment.read_text())["ops"]["mega_step"]["impl"]["launches"]
    assert launch["shared_mem"] == mega.SMEM_BYTES <= 227 << 10


def test_the_debug_mode_is_one_launch_a_phase(tmp_path):
    m = json.loads(generate(TINY, tmp_path, target="mega", model="tiny", phases=True).read_text())
    calls = m["programs"]["decode"]["calls"]
    assert len(calls) == mega.n_phases(2) == 1 + 5 * 2 + 2
    assert [(c["args"][-3]["value"], c["args"][-2]["value"]) for c in calls] == [(i, i + 1) for i in range(len(calls))]


def test_the_generation_program_is_found_by_its_roles(deployment):
    g = generation_program(load_verified(deployment))
    assert (g.rows_var, g.groups_var, g.new_var) == ("gen_rows", "gen_seqs", "new_tokens")
    assert g.page_table and g.logits


def test_a_manifest_without_a_generation_program_is_one_line(tmp_path):
    v = load_verified(generate(TINY, tmp_path, target="cuda", model="tiny"))
    with pytest.raises(KernError, match="no program runs whole generations"):
        generation_program(v)


@pytest.mark.parametrize("change, why", [
    (dict(head_dim=256), "head_dim 256"),
    (dict(num_attention_heads=16, num_key_value_heads=1), "16 query heads a kv head"),
])
def test_configs_the_kernel_cannot_run_are_refused_in_one_line(tmp_path, change, why):
    with pytest.raises(ConfigError, match=why) as e:
        generate({**TINY, **change}, tmp_path, target="mega", model="tiny")
    assert "\n" not in str(e.value)


def test_more_sequences_than_the_kernel_steps_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="at most 32 sequences"):
        mega.build(shape_of(TINY), "tiny", seqs=33)
