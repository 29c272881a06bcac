"""The cuda lowering, argument resolution and graph buckets, checked on the CPU (no GPU):
the sm_90a manifest of a tiny llama, lowered onto fake device memory."""

from __future__ import annotations

import json
from math import prod

import numpy as np
import pytest

from kern.manifest import load_verified
from kern.manifest.expr import evaluate
from kern.runtime.devices.cuda import device as cuda_device
from kern.runtime.errors import DeviceError
from kern.runtime.devices.cuda.launch import Kernel, PackedLaunch
from kern.runtime.devices.cuda.tensormap import TensorMaps
from kern.runtime.devices.cuda.params import parse_kinds
from kern.runtime.lower import lower_program


def _cuda_manifest(cfg: dict, out, model: str, **limits):
    """The generator's sm_90a manifest without building cubins (no nvcc needed): modules are
    pinned to the recorded digests, which is all the lowering reads (it never loads a cubin)."""
    from kern_models.llama.manifests import cuda as manifest_cuda
    from kern_models.llama.config import shape_of
    from kern_models.llama.kernels.cuda import CUBINS

    m = manifest_cuda.build(shape_of(cfg), model, **limits)
    digests = {n: p.cubin for n, p in CUBINS.read_pins()[1].items()}
    for name, mod in m["modules"].items():
        mod["sha256"] = digests[f"{name}.cubin"]
    (out / "manifest.json").write_text(json.dumps(m))
    return load_verified(out / "manifest.json")


class _Mem:
    def __init__(self, ptr: int, nbytes: int = 1 << 20):
        self.ptr, self.nbytes = ptr, nbytes


class _Maps(TensorMaps):
    """Tensor maps as the cuda device makes them (tensormap.py), recorded, at fake addresses."""

    def __init__(self):
        super().__init__()
        self.made: dict[tuple, int] = {}

    def address(self, ptr, rows, cols, dtype, box, where):
        return self.made.setdefault((ptr, rows, cols, dtype, box), 0xF000000 + 128 * len(self.made))


class _Module:
    def kernel(self, entry, kinds):
        return Kernel("fake", entry, None, parse_kinds(kinds))


class _Dev:
    def __init__(self, modules):
        self.modules = {n: _Module() for n in modules}
        self.stream = None
        self.tensor_maps = _Maps()


TINY = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, intermediate_size=128, vocab_size=256, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def sm90(tmp_path_factory):
    return _cuda_manifest(TINY, tmp_path_factory.mktemp("sm90"), "tiny")


@pytest.fixture(scope="module")
def sm90_cublas(tmp_path_factory):
    """The build that is not batch-invariant (cuBLASLt, flash prefill attention): what the MoE
    and tensor-parallel manifests build on."""
    return _cuda_manifest(TINY, tmp_path_factory.mktemp("sm90_cublas"), "tiny", batch_invariant=False)


def _program(v, name):
    bufs = {n: _Mem(0x100000 * (i + 1)) for i, n in enumerate(v.manifest.buffers)}
    prog = cuda_device.CudaProgram(_Dev(v.manifest.modules), lower_program(v, name), bufs, {"kv": _Mem(0x7000000)},
                                   graph=v.manifest.programs[name].graph)
    return prog, bufs


def test_the_sm90_manifest_verifies_and_decode_is_a_graph(sm90):
    m = sm90.manifest
    assert m.target.device == "cuda" and m.target.arch == "sm_90a"
    assert m.programs["decode"].graph and not m.programs["prefill"].graph


def test_fused_qkv_views_become_pointer_offsets(sm90_cublas):
    sm90 = sm90_cublas
    prog, bufs = _program(sm90, "prefill")
    env = {**sm90.constants, "tokens": 5, "prefill_seqs": 2, "context": sm90.manifest.vars["context"].max,
           "reach": sm90.manifest.vars["reach"].max}
    items = prog.resolve(env)
    rope = next(i for i in items if isinstance(i, PackedLaunch) and i.kernel.name == "rope")
    q, k = rope.args[0], rope.args[1]
    assert q == bufs["p_qkv"].ptr
    assert k == q + sm90.constants["q_dim"] * 2  # bf16 elements
    assert rope.grid == (5, 4 + 2, 1) and rope.block == (32, 1, 1)  # rows x (q + kv heads), head_dim/2


def test_prefill_and_wide_decode_are_decode_layers_of_gemm_twins(sm90):
    """The default (invariant) build: prefill and the wide decode run decode's fused layer with
    the gemv kernels' gemm twins (gemm.cu on wgmma; a normed one is rms_prep then the GEMM; the
    wide decode's split over K) and no library call; prefill's attention is attention_rows
    (decode's split order), its LM head takes each sequence's last row of x."""
    env = {**sm90.constants, "tokens": 9, "prefill_seqs": 2, "seqs": 2, "wide_seqs": 12, "context": 512,
           "reach": 512}
    layer = ["rms_prep", "norm_gemm_rope_append", "attention_rows", "gemm_residual", "rms_prep", "norm_gemm_swiglu",
             "gemm_residual"]
    items = _program(sm90, "prefill")[0].resolve(env)
    assert all(isinstance(i, PackedLaunch) for i in items)
    assert [i.kernel.name for i in items] == ["embed", *layer * 2, "gather_last", "rms_prep", "norm_gemm_f32",
                                              "sample_partial", "argmax_final"]
    assert items[2].grid == (-(-sm90.constants["qkv_dim"] // 128), 1, 1)  # 128 W rows and 128 rows a block
    assert items[2].shared_mem > 48 << 10  # dynamic shared memory past the default: the function opts in
    wide = _program(sm90, "decode_wide")[0].resolve(env)
    layer = [n + "_split" if "gemm" in n else n for n in layer]
    layer[2] = "attention_decode"  # and the projections split over K: 8 blocks a tile, one a partial
    assert [i.kernel.name for i in wide] == ["embed", *layer * 2, "rms_prep", "norm_gemm_f32", "sample_partial",
                                             "argmax_final"]
    assert wide[2].grid == (-(-sm90.constants["qkv_dim"] // 128), 1, 8)


def test_the_gemm_twins_read_x_and_w_through_tensor_maps(sm90):
    """gemm.cu's entries take a tensor map of x (rms_prep's xn) and of W, each made once over the
    whole buffer from the view's offset (rows of the last dimension's length, boxes of 32 rows of
    64 elements); rms_prep, which writes xn, gets xn's address."""
    prog, bufs = _program(sm90, "prefill")
    items = prog.resolve({**sm90.constants, "tokens": 9, "prefill_seqs": 2, "context": 512, "reach": 512})
    maps = prog.dev.tensor_maps.made
    prep, qkv = items[1], items[2]
    assert (prep.kernel.name, qkv.kernel.name) == ("rms_prep", "norm_gemm_rope_append")
    xn, w = qkv.args[0], qkv.args[2]
    by_addr = {a: k for k, a in maps.items()}
    hidden = sm90.constants["hidden"]
    assert by_addr[xn] == (bufs["p_xn"].ptr, (1 << 20) // 2 // hidden, hidden, "bf16", (32, 64))
    assert by_addr[w][0] == bufs["qkv_w.0"].ptr and by_addr[w][2:] == (hidden, "bf16", (32, 64))
    assert prep.args[2] == bufs["p_xn"].ptr  # rms_prep writes xn through its address


def test_prefill_projections_are_library_calls_and_decode_ones_are_fused_gemvs(sm90, sm90_cublas):
    pre, _ = _program(sm90_cublas, "prefill")
    dec, _ = _program(sm90, "decode")
    env = {**sm90.constants, "tokens": 9, "prefill_seqs": 2, "seqs": 2, "context": 512, "reach": 512}
    pre_items = pre.resolve(env)
    assert sum(1 for i in pre_items if not isinstance(i, PackedLaunch)) == 4 * 2  # qkv, o, gate_up, down per layer
    dec_items = dec.resolve(env)
    assert all(isinstance(i, PackedLaunch) for i in dec_items)
    names = [i.kernel.name for i in dec_items]
    # a layer: norm+qkv+rope+kv append, attention (splits merged inside), o+residual,
    # norm+gate/up+SwiGLU, down+residual
    layer = ["norm_gemv_rope_append", "attention_decode", "gemv_residual", "norm_gemv_swiglu", "gemv_residual"]
    assert names == ["embed", *layer * 2, "norm_gemv_f32", "sample_partial", "argmax_final"]
    qkv = dec_items[1]
    assert qkv.args[10] == 2 and qkv.args[18:20] == (sm90.constants["qkv_dim"], 64)  # rows; N, K
    assert qkv.grid == (-(-sm90.constants["qkv_dim"] // 16), 1, 1)
    # every launch after the first may start before the previous one ends (PDL)
    assert [i.pdl for i in dec_items] == [False] + [True] * (len(dec_items) - 1)


def test_sampling_runs_in_two_stages_over_the_vocabulary(sm90):
    dec, bufs = _program(sm90, "decode")
    items = dec.resolve({**sm90.constants, "seqs": 5, "context": 512, "reach": 512})
    partial, final = items[-2], items[-1]
    assert partial.kernel.name == "sample_partial" and partial.grid == (128, 5, 1)
    assert final.kernel.name == "argmax_final" and final.args[2] == bufs["d_next"].ptr


def test_each_shape_bucket_resolves_once(sm90):
    dec, _ = _program(sm90, "decode")
    a = dec.resolve({**sm90.constants, "seqs": 1, "context": 512, "reach": 512})
    b = dec.resolve({**sm90.constants, "seqs": 16, "context": 512, "reach": 512})
    assert [i.grid for i in a] != [i.grid for i in b]


def test_prefill_attention_grid_resolves_a_compound_expression_over_vars(sm90_cublas):
    sm90 = sm90_cublas
    pre, bufs = _program(sm90, "prefill")
    items = pre.resolve({**sm90.constants, "tokens": 130, "prefill_seqs": 3, "context": 512, "reach": 512})
    attn = [i for i in items if isinstance(i, PackedLaunch) and i.kernel.name == "prefill_attention"]
    assert len(attn) == 2  # one per layer
    assert attn[0].grid == (4, -(-130 // 64) + 3, 1) and attn[0].block == (128, 1, 1)
    assert attn[0].args[5] == bufs["p_attn"].ptr and attn[0].args[6:8] == (130, 3)


def test_pooled_states_live_in_virtual_ranges_over_one_set_of_chunks(monkeypatch):
    """The cuda device gives each pooled state a VirtualPool of the pool's chunk size, all of
    them over one PhysicalChunks (the budget once, not once a state), and hands each plan's
    unmaps and maps to the state's range (checked against stand-ins for the driver's VMM)."""
    from kern.runtime.devices.cuda import vmm

    calls = []

    class FakeChunks:
        def __init__(self, device, chunk_bytes, n_chunks):
            calls.append(("chunks", chunk_bytes, n_chunks))
            self.chunk_bytes, self.n_chunks = chunk_bytes, n_chunks

        def release(self):
            calls.append(("release chunks",))

    class FakePool:
        def __init__(self, device, n_slots, chunks):
            calls.append(("range", n_slots, id(chunks)))
            self.base = 0x7F0000000000 + len(calls)

        def apply(self, unmap=(), map=()):
            calls.append(("apply", self.base, list(unmap), list(map)))

        def release(self):
            calls.append(("release range", self.base))

    monkeypatch.setattr(vmm, "PhysicalChunks", FakeChunks)
    monkeypatch.setattr(vmm, "VirtualPool", FakePool)
    dev = object.__new__(cuda_device.CudaDevice)
    dev.dev = None
    pages, slots = dev.alloc_state(6 << 21, chunk_bytes=2 << 21), dev.alloc_state(6 << 21, chunk_bytes=2 << 21)
    shared = id(dev.physical)
    assert calls == [("chunks", 2 << 21, 3), ("range", 3, shared), ("range", 3, shared)]
    dev.remap(pages, [1], [])
    dev.remap(slots, [], [(1, 0)])
    assert calls[3:] == [("apply", pages.ptr, [1], []), ("apply", slots.ptr, [], [(1, 0)])]
    with pytest.raises(DeviceError, match="this device's states share 3 chunks of 4194304 bytes"):
        dev.alloc_state(8 << 21, chunk_bytes=2 << 21)


def test_cuda_buffers_start_zeroed(monkeypatch):
    """Kernels may keep counters in a buffer that every launch leaves at zero (decode
    attention's split counters), so a fresh buffer must be zeros, as on the cpu device."""
    from kern.runtime.devices.cuda import memory

    done = []
    monkeypatch.setattr(memory, "alloc", lambda n, label="": memory.DeviceBuffer(0x5000, n, label))
    monkeypatch.setattr(memory, "memset", lambda dst, byte, n, stream=None: done.append((dst, byte, n)))
    dev = object.__new__(cuda_device.CudaDevice)
    buf = dev.alloc("i32", 6)
    assert done == [(0x5000, 0, 24)] and buf.nbytes == 24


@pytest.mark.parametrize("qk_norm", [False, True])
def test_decode_layers_fuse_the_norms_at_any_width(tmp_path, qk_norm):
    """Every RMSNorm runs inside the projection after it, also for long rows; only q/k norms
    (Qwen3) keep rope in a launch of its own."""
    cfg = dict(architectures=["Qwen3ForCausalLM" if qk_norm else "LlamaForCausalLM"], hidden_size=2048,
               num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
               intermediate_size=256, vocab_size=256, max_position_embeddings=512, rms_norm_eps=1e-5,
               rope_theta=10000.0, tie_word_embeddings=True)
    v = _cuda_manifest(cfg, tmp_path, "wide")
    head = ["norm_gemv", "qk_norm_rope_append"] if qk_norm else ["norm_gemv_rope_append"]
    assert [c.op for c in v.manifest.programs["decode"].calls] == [
        "embed", *head, "attention_decode", "gemv_residual", "norm_gemv_swiglu", "gemv_residual",
        "norm_gemv_logits", "sample"]


def test_decode_attention_split_is_a_generator_choice(tmp_path):
    """The decode attention grid covers the context bound in splits of decode_split tokens (grid
    y: a block a query head, the gemv decode program's grouping: 2 kv heads x 2 heads each)."""
    cfg = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, head_dim=64, intermediate_size=128, vocab_size=256,
               tie_word_embeddings=True)
    for split, z in ((64, 8), (256, 2)):
        out = tmp_path / str(split)
        out.mkdir()
        v = _cuda_manifest(cfg, out, "tiny", context=512, decode_split=split)
        prog, _ = _program(v, "decode")
        items = prog.resolve({**v.constants, "seqs": 2, "context": 512, "reach": 512})
        att = next(i for i in items if i.kernel.name == "attention_decode")
        assert att.grid == (2, 4, z) and att.args[-2] == split  # split_tokens, then q_stride
        # a step that reaches 100 positions launches the splits that hold them, not the bound's
        items = prog.resolve({**v.constants, "seqs": 2, "context": 512, "reach": 128})
        att = next(i for i in items if i.kernel.name == "attention_decode")
        assert att.grid == (2, 4, -(-128 // split))


def test_a_shape_the_kernels_cannot_run_is_refused_naming_every_problem(tmp_path):
    from kern_models.llama.config import ConfigError

    cfg = dict(architectures=["LlamaForCausalLM"], hidden_size=1000, num_hidden_layers=1, num_attention_heads=10,
               num_key_value_heads=1, intermediate_size=1001, vocab_size=256, tie_word_embeddings=True)
    with pytest.raises(ConfigError) as e:
        _cuda_manifest(cfg, tmp_path, "odd", decode_split=0)
    msg = str(e.value)
    for part in ("head_dim 100", "10 query heads over 1 kv heads", "intermediate_size 1001",
                 "decode_split 0"):
        assert part in msg, part
    assert "hidden_size" not in msg  # 1000 is a multiple of 8


class _Staged(cuda_device.memory.StagedBuffer):
    """An input as the cuda device holds it (a pinned mirror), its uploads recorded, not made."""

    def __init__(self, ptr: int, nbytes: int, log: list):
        super().__init__(cuda_device.memory.DeviceBuffer(ptr, nbytes), None)
        self.log = log

    def upload(self, stream, nbytes=None):
        self.log.append((self.device.ptr, nbytes))


def test_each_step_uploads_only_the_input_bytes_its_views_reach(sm90):
    """A program copies its inputs up from their mirrors itself; at batch 1 that is one row of
    the page table, not the table of the largest batch; and the token masks' rows the step's
    mask var says (1 where no row is masked: one row of words, not the bound's)."""
    m = sm90.manifest
    log: list = []
    env_max = {**sm90.constants, **{n: v.max for n, v in m.vars.items()}}
    bufs = {}
    for i, (n, b) in enumerate(m.buffers.items()):
        nbytes = 4 * prod(evaluate(d, env_max) for d in b.shape)  # inputs are i32
        bufs[n] = _Staged(0x100000 * (i + 1), nbytes, log) if b.kind == "input" else _Mem(0x100000 * (i + 1))
    prog = cuda_device.CudaProgram(_Dev(m.modules), lower_program(sm90, "decode"), bufs, {"kv": _Mem(0x7000000)},
                                   graph=True)
    pages = -(-m.vars["context"].max // sm90.constants["page_tokens"])
    words = -(-sm90.constants["vocab"] // 32)
    for seqs, masked in ((1, 1), (m.vars["seqs"].max, 4)):
        log.clear()
        prog._upload({**env_max, "seqs": seqs, "mask_rows": masked})
        got = {n: size for n, b in bufs.items() if isinstance(b, _Staged) for p, size in log if p == b.ptr}
        assert got == {"d_ids": 4 * seqs, "d_pos": 4 * seqs, "d_cu_seqlens": 4 * (seqs + 1),
                       "d_page_table": 4 * seqs * pages, "d_temperature": 4 * seqs, "d_rng": 8 * seqs,
                       "d_mask": 4 * words * masked, "d_mask_row": 4 * seqs}


class _Mirror:
    """A pinned host mirror, as plain host memory."""

    def __init__(self, nbytes: int):
        self.array = np.zeros(nbytes, np.uint8)


@pytest.mark.parametrize("dtype,offset", [("i32", 0), ("i32", 3), ("bf16", 5), ("u8", 7)])
def test_an_offset_write_and_read_land_where_the_cpu_device_puts_them(monkeypatch, dtype, offset):
    """Device.write / read at an element offset (bytes, for a state): the cuda device's staged
    mirror and its device copies address the same elements as the cpu device's arrays."""
    from kern.runtime.devices.cpu import CpuDevice
    from kern.runtime.dtypes import NP

    values = np.arange(1, 5).astype(NP[dtype])
    cpu = CpuDevice()
    ref = cpu.alloc(dtype, 16)
    cpu.write(ref, values, offset)
    want = ref.view(np.uint8)

    dev = object.__new__(cuda_device.CudaDevice)
    dev.stream = None
    memory = cuda_device.memory
    staged = memory.StagedBuffer(memory.DeviceBuffer(0x9000, want.nbytes), _Mirror(want.nbytes))
    dev.write(staged, values, offset)
    assert staged.host.array.tobytes() == want.tobytes()
    got = dev.read(staged, dtype, (4,), offset)
    assert got.tobytes() == values.tobytes() == cpu.read(ref, dtype, (4,), offset).tobytes()

    copies = []
    monkeypatch.setattr(memory, "copy_to_device", lambda dst, src, stream=None: copies.append((dst, src.nbytes)))
    dev.write(memory.DeviceBuffer(0x9000, want.nbytes), values, offset)
    assert copies == [(0x9000 + offset * values.itemsize, values.nbytes)]


def test_a_tiled_view_that_moves_with_a_var_is_refused_naming_its_launch_and_buffer():
    """A tensor map is made once, at load: a tiled view whose offset depends on a var cannot have one."""
    from types import SimpleNamespace

    from kern.runtime.lower import View

    moving = View("p_x", "bf16", "layer_offset", (16, 64), (32, 64))
    launch = SimpleNamespace(where="programs.prefill.calls[3] (op gemm) launch 0", args=(moving,))
    with pytest.raises(DeviceError, match=r"calls\[3\].*buffer 'p_x': read in tiles, so its view's offset"):
        _Maps().for_launches([launch], {"p_x": _Mem(0x100000)})
