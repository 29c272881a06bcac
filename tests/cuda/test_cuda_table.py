"""The kernel table (models/llama/kernels/cuda/table.py) is the one place a kernel's contract is
written: every entry matches its .cu source (module, parameter names and types in order, const
exactly for inputs), every __global__ entry of the shipped sources is launched by a generated
manifest, and the test-only kernels live under tests/cuda/kernels."""

from __future__ import annotations

import json

import pytest

from kern_models.llama.manifests import cuda as manifest_cuda
from kern_models.llama.config import shape_of
from kern_models.llama.generator import generate
from kern_models.llama.kernels.cuda import table
from tests.cuda.cuda_kernel_docs import KERNEL_DIR, TEST_KERNEL_DIR, CParam, in_sources

C_TYPE = {"bf16": "bf16", "f32": "float", "i32": "int"}

CONFIGS = {  # one without and one with q/k norms: between them every op is emitted
    "llama": dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, intermediate_size=128, vocab_size=256,
                  tie_word_embeddings=True),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=128, intermediate_size=128, vocab_size=256,
                  tie_word_embeddings=True),
}


def expected(param: str) -> CParam:
    """The C parameter a table parameter ("x: in buffer<bf16>", "kv_state: inout state", "rows: i32") needs."""
    name, decl = (s.strip() for s in param.split(":"))
    if decl in ("i32", "f32"):
        return CParam(name, C_TYPE[decl], False, False)
    direction, what = decl.split()
    ctype = "char" if what == "state" else C_TYPE[what.removeprefix("buffer<").removesuffix(">")]
    return CParam(name, ctype, True, direction == "in")


@pytest.mark.parametrize("kernel", table.KERNELS, ids=lambda k: k.entry)
def test_each_table_entry_matches_its_source(kernel):
    srcs = in_sources()
    assert kernel.entry in srcs, f"{kernel.entry}: no extern \"C\" __global__ in {KERNEL_DIR}"
    module, params = srcs[kernel.entry]
    assert module == kernel.module
    assert params == tuple(expected(p) for p in kernel.params)
    assert kernel.c_kinds() == tuple(p.kind for p in params)


def test_the_check_catches_a_wrong_type_or_constness():
    assert expected("x: in buffer<bf16>") == CParam("x", "bf16", True, True)
    assert expected("y: out buffer<f32>") != CParam("y", "float", True, True)  # an output is not const
    assert expected("kv_state: inout state") == CParam("kv_state", "char", True, False)
    assert expected("eps: f32") != CParam("eps", "int", False, False)


def test_every_shipped_kernel_is_launched_by_a_generated_manifest(tmp_path):
    """The per-op manifests (invariant or not) launch every kernel of the table; with the megakernel and a
    tensor-parallel split of either build (the invariant one's pushed parts, gemv_push and
    gemm_push*, the faster one's peer all-reduces, NCCL past the peer kernel's messages in
    prefill) every __global__ of the shipped sources is launched by some generated manifest."""
    per_op, launched = set(), set()
    for cfg in CONFIGS.values():
        for batch_invariant in (True, False):  # the default build and the cuBLASLt one (what MoE and tp build on)
            m = manifest_cuda.build(shape_of(cfg), "tiny", batch_invariant=batch_invariant)
            per_op |= {la["entry"] for op in m["ops"].values() for la in op["impl"]["launches"]}
            assert set(m["modules"]) == {la["module"] for op in m["ops"].values()
                                         for la in op["impl"]["launches"] if "module" in la}
        launched |= per_op
        for target, kw in (("mega", {}), ("cuda", {"tp": 2}), ("cuda", {"tp": 2, "batch_invariant": False})):
            path = generate({**cfg, "hidden_size": 1024},
                            tmp_path / f"{cfg['architectures'][0]}-{target}-{len(kw)}", target=target, **kw)
            m = json.loads(path.read_text())
            launched |= {la["entry"] for op in m["ops"].values() for la in op["impl"]["launches"]}
    externs = {e for e in launched if e.startswith("extern:")}
    assert sorted(per_op - externs) == sorted(k.entry for k in table.KERNELS)
    assert sorted(launched - externs) == sorted(in_sources())


def test_test_only_kernels_are_not_shipped():
    shipped, test_only = in_sources(), in_sources(TEST_KERNEL_DIR)
    assert {"attention_prefill", "attention_combine", "gemv_bf16"} <= set(test_only)
    assert not set(shipped) & set(test_only)


def test_pointers_come_first():
    for entry, (_, params) in {**in_sources(), **in_sources(TEST_KERNEL_DIR)}.items():
        kinds = [p.kind for p in params]
        n_ptr = kinds.count("ptr")
        assert kinds[:n_ptr] == ["ptr"] * n_ptr, f"{entry}: pointer params must come first"


def test_grids_use_the_tiles_the_kernels_are_built_with():
    """The tile numbers in the grids are table.TILES, and every source is built with them as
    -D defines (the headers and kernels that use one refuse a build without it)."""
    from kern_models.common.cubins import COMMON_CUDA
    from kern_models.llama.kernels.cuda import CUBINS

    defines = {f for f in CUBINS.flags() if f.startswith("-D")}
    assert defines == {f"-D{k}={v}" for k, v in table.TILES.items()}
    by = table.BY_ENTRY
    assert by["norm_gemv_bf16"].grid == ({"ceil_div": ["N", table.TILES["GEMV_COLS"]]},)
    assert by["norm_gemv_swiglu"].grid == ({"ceil_div": ["N", table.TILES["GEMV_COLS"] // 2]},)
    assert by["prefill_attention"].grid[1] == {"add": [{"ceil_div": ["rows", table.TILES["PF_BM"]]}, "n_seqs"]}
    # each tile constant is refused undefined where it is used; the shared helpers name none
    family = "".join(p.read_text() for p in (*KERNEL_DIR.glob("*.cu"), *KERNEL_DIR.glob("*.cuh")))
    assert all(f"defined({k})" in family for k in table.TILES)
    assert not any(k in (COMMON_CUDA / "common.cuh").read_text() for k in table.TILES)


def test_the_arch_is_named_once():
    hits = [p.name for p in KERNEL_DIR.parents[2].rglob("*.py") if '"sm_90a"' in p.read_text()]
    assert hits == ["kernel_table.py"]  # models/common/kernel_table.py: ARCH
