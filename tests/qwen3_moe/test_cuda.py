"""The Qwen3-MoE sm_90a deployment: on any machine, the manifest at the published shape verifies
and its programs take the kernels they should (narrow decode gathers the chosen experts, wide
decode and prefill group by expert), and the kernel table matches moe.cu; on an H100/H200
(`gpu`), kern test judges it against the cpu reference and it PASSes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from kern_models.qwen3_moe.kernels.cuda import CUBINS, table
from kern_models.qwen3_moe.random_checkpoint import SHAPES
from tests.cuda.cuda_kernel_docs import table_mismatches

PUBLISHED = {"architectures": ["Qwen3MoeForCausalLM"], **SHAPES["qwen3-30b-a3b"], "num_hidden_layers": 3,
             "mlp_only_layers": [1], "max_position_embeddings": 4096}


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> dict:
    from kern_models.qwen3_moe.generator import generate

    path = generate(PUBLISHED, tmp_path_factory.mktemp("sm90a"), target="cuda")
    return json.loads(path.read_text()) | {"_path": str(path)}


def test_the_published_shape_verifies(published, capsys):
    from kern.cli import main

    assert main(["verify", published["_path"]]) == 0
    assert ": ok, 5 programs, " in capsys.readouterr().out  # with the verify program (speculative rounds)


def test_every_layer_sparse_verifies_without_the_dense_mlp_module(tmp_path, capsys):
    """The real checkpoint has no dense layer: the dense MLP's module goes with its ops (the
    verifier refuses a module no launch names; the H200 run at 8 layers found it)."""
    from kern.cli import main
    from kern_models.qwen3_moe.generator import generate

    path = generate(PUBLISHED | {"mlp_only_layers": []}, tmp_path, target="cuda")
    assert main(["verify", str(path)]) == 0, capsys.readouterr().out
    assert "mlp" not in json.loads(path.read_text())["modules"]


def _ops(m: dict, program: str) -> list[str]:
    return [c["op"] for c in m["programs"][program]["calls"]]


def test_narrow_decode_reads_only_the_chosen_experts_and_wide_steps_group_by_expert(published):
    decode = _ops(published, "decode")
    assert "moe_gather_gate_up" not in decode and decode.count("norm_gemv_swiglu") == 1  # layer 1 stays dense
    for prog, router, routing in (("decode", "gemv_logits", "moe_route_sort"), ("prefill", "moe_router_gemm", "moe_sort"),
                                  ("decode_wide", "moe_router_gemm_split", "moe_route_sort")):
        ops = _ops(published, prog)  # the wide decode's few rows: the router's K over 8 blocks
        assert [ops.count(o) for o in (routing, "moe_wg_gate_up", "moe_wg_down", router)] == [2] * 4, prog
        # decode routes and sorts in one launch; prefill's many rows route a block a row, then sort
        assert ops.count("moe_route") == (2 if routing == "moe_sort" else 0), prog
    for prog in ("prefill", "decode", "decode_wide"):  # every program adds a row's MoE output into x alike
        ops = _ops(published, prog)
        assert ops.count("moe_combine_residual") == ops.count("rms_norm") == 2, prog
        assert not any(o.startswith("gemm") and o != "gemm_residual" and not o.startswith("gemm_residual")
                       or o in ("moe_group_gate_up", "moe_combine") for o in ops), prog  # no cuBLASLt, no wmma
    assert {k: published["constants"][k] for k in ("experts", "top_k", "moe_inter")} == \
        {"experts": 128, "top_k": 8, "moe_inter": 768}


def test_the_faster_build_keeps_cublaslt_and_the_wmma_tiles(tmp_path):
    """batch_invariant=False (--no-batch-invariance): the dense chain's many-row programs through
    cuBLASLt, the MoE block's tiles moe.cu's; narrow decode is the default build's."""
    from kern_models.qwen3_moe.generator import generate

    m = json.loads(generate(PUBLISHED, tmp_path, target="cuda", batch_invariant=False).read_text())
    for prog in ("prefill", "decode_wide"):
        ops = _ops(m, prog)
        assert [ops.count(o) for o in ("moe_sort", "moe_group_gate_up", "moe_group_down", "moe_combine")] == [2] * 4
        assert "gemm" in ops and "moe_combine_residual" not in ops
    assert _ops(m, "decode").count("moe_wg_gate_up") == 2  # its narrow decode is the default's


def test_the_kernel_table_matches_moe_cu_and_moe_wg_cu():
    assert table_mismatches(CUBINS.folder, table.KERNELS) == []


def test_the_narrow_gate_up_holds_every_pair_the_decode_program_can_step():
    """moe_gemv_gate_up and moe_gather_* stage a launch's rows * top_k pairs in shared memory
    (MOE_GEMV_MAX_PAIRS of them) to find each chosen expert's pairs: the most sequences the graph-captured decode
    program steps (this family's, and Kimi-Linear's that launches it too), times the most choices
    a router makes, must fit."""
    import re

    from kern_models.kimi_linear.manifests.cuda import DECODE_SEQS as KIMI_SEQS
    from kern_models.llama.manifests.cuda import DECODE_SEQS

    src = (CUBINS.folder / "moe_pairs.cuh").read_text()
    assert int(re.search(r"#define MOE_GEMV_MAX_PAIRS (\d+)", src).group(1)) == table.GEMV_MAX_PAIRS
    assert int(re.search(r"#define MOE_MAX_EXPERTS (\d+)", src).group(1)) == table.MAX_EXPERTS
    assert max(DECODE_SEQS, KIMI_SEQS) * table.MAX_TOP_K <= table.GEMV_MAX_PAIRS


@pytest.mark.parametrize("name", ["moe", "moe_wg"])
def test_the_pin_is_of_this_tree_s_sources(name):
    """Each cubin's pin names the digest of its inputs (flags, its .cu, the family's, the shared
    and llama's headers): a change to any of them (common.cuh, llama's gemv.cuh included) needs
    `python -m kern_models.common.cubins qwen3_moe OUT --record`, or a machine without nvcc
    cannot generate the sm_90a deployment."""
    _, pins = CUBINS.read_pins()
    assert pins[f"{name}.cubin"].inputs == CUBINS.input_digest(CUBINS.folder / f"{name}.cu"), \
        f"{name}.cubin's inputs changed since it was pinned: re-record it"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("name", ["moe", "moe_wg"])
def test_the_pinned_cubin_is_what_nvcc_builds(name):
    import hashlib

    _, pins = CUBINS.read_pins()
    assert hashlib.sha256(CUBINS.rebuild(f"{name}.cubin")).hexdigest() == pins[f"{name}.cubin"].cubin == \
        hashlib.sha256((CUBINS.shipped / f"{name}.cubin").read_bytes()).hexdigest()


@pytest.mark.gpu
def test_sm90a_passes_kern_test_against_the_cpu_reference(tmp_path):
    from kern.judge.judge import Options, judge
    from kern_models.qwen3_moe.generator import generate
    from kern_models.qwen3_moe.random_checkpoint import make

    ckpt = make("small", tmp_path / "ckpt", max_positions=1024)
    cfg = json.loads((ckpt / "config.json").read_text())
    a = generate(cfg, tmp_path / "cpu", target="cpu", context=512).parent
    b = generate(cfg, tmp_path / "sm90a", target="cuda", context=512).parent
    r = judge(a, b, ckpt, Options(seed=0, seqs=3, decode_steps=4, max_prompt=96))
    print("\n".join(r.lines + [r.verdict.line]))
    assert r.verdict.status == "PASS", r.verdict.line


def test_the_expert_parallel_sm90a_ranks_verify_and_combine_by_all_reduce(tmp_path, capsys):
    from kern.cli import main
    from kern_models.qwen3_moe.generator import generate

    generate(PUBLISHED, tmp_path, target="cuda", ep=2)
    assert main(["verify", str(tmp_path / "rank0.json"), str(tmp_path / "rank1.json")]) == 0
    for r in (0, 1):
        m = json.loads((tmp_path / f"rank{r}.json").read_text())
        at = {n: [p.split(":")[0] for p in op["params"]].index("first") for n, op in m["ops"].items()
              if n.startswith("moe_") and any(p.startswith("first:") for p in op["params"])}
        firsts = {c["args"][at[c["op"]]]["value"] for p in m["programs"].values() for c in p["calls"] if c["op"] in at}
        assert {"moe_wg_gate_up", "moe_wg_down", "moe_combine_push"} <= set(at)
        assert firsts == {64 * r} and m["constants"]["local_experts"] == 64
        for prog in ("prefill", "decode", "decode_wide"):  # each rank's held choices pushed, added in rank order
            assert _ops(m, prog).count("moe_combine_push") == _ops(m, prog).count("all_reduce_add_local") == 2
            assert "moe_combine_residual" not in _ops(m, prog)
        assert "allreduce" in m["modules"] and m["topology"]["groups"] == {"ep": [[0, 1]]}


@pytest.mark.gpu
def test_ep2_on_two_gpus_gives_the_one_gpu_logits(tmp_path):
    from kern.api import Model
    from kern.runtime.devices.cuda.driver import call, open_device
    from kern_models.qwen3_moe.generator import generate
    from kern_models.qwen3_moe.random_checkpoint import make
    from kern.drive.parity import compare, teacher_forced

    open_device(0)
    if call("cuDeviceGetCount") < 2:
        pytest.skip("expert parallelism across GPUs needs two")
    ckpt = make("small", tmp_path / "ckpt", max_positions=1024)
    cfg = json.loads((ckpt / "config.json").read_text())
    one = Model(generate(cfg, tmp_path / "ep1", target="cuda", context=512), ckpt, state_budget=256 << 20)
    two = Model(generate(cfg, tmp_path / "ep2", target="cuda", context=512, ep=2), ckpt, state_budget=256 << 20)
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 512, 48)]
    c = compare(teacher_forced(one, ids), teacher_forced(two, ids))
    assert c["mean_kl"] < 1e-4 and c["agree_decisive"] == 1.0, c
    assert one.generate(ids[:20], max_tokens=8).tokens == two.generate(ids[:20], max_tokens=8).tokens


def test_the_moe_kernels_keep_the_dense_chain_s_pdl_order(published):
    """The invariant block's kernels after the router launch with the PDL attribute and wait at
    entry (LATE), the rest of the MoE kernels without it; the dense kernels around them keep the
    order common.cuh asks for."""
    from tests.cuda.test_cuda_pdl_order import _violations
    from kern_models.common.kernel_table import Pdl
    from kern_models.qwen3_moe.kernels.cuda.table import KERNELS

    late = {k.entry for k in KERNELS if k.pdl is Pdl.LATE}
    assert late == {"moe_route_sort", "moe_wg_gate_up", "moe_wg_down", "moe_combine_residual"}
    assert not any(k.pdl is Pdl.EARLY for k in KERNELS)  # nothing of theirs may start the next at entry
    for name, prog in published["programs"].items():
        seq = [(la["entry"], bool(la.get("pdl"))) for c in prog["calls"]
               for la in published["ops"][c["op"]]["impl"]["launches"]]
        assert {entry for entry, pdl in seq if entry.startswith("moe_") and pdl} <= late, name
        assert _violations(seq) == [], name
