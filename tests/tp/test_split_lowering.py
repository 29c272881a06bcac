"""The split sm_90a manifest lowered onto fake device memory (no GPU): each of decode's fan-in
projections pushing its part into alternate halves of every rank's part buffer and its
all-reduce summing them (or, unpushed, the projection writing the half its all-reduce reads),
the gate/up projection on narrow blocks (a variant), the logits' all-gather,
and prefill's large messages going to the device's NCCL collective."""

from __future__ import annotations

import json

from kern.manifest import load_verified
from kern.runtime.devices.cuda import device as cuda_device
from kern.runtime.devices.cuda.launch import PackedLaunch
from kern.runtime.lower import lower_program
from tests.runtime.test_cuda_lowering import _Dev, _Mem

CFG = dict(architectures=["LlamaForCausalLM"], hidden_size=1024, num_hidden_layers=2, num_attention_heads=8,
           num_key_value_heads=2, head_dim=64, intermediate_size=1024, vocab_size=256, tie_word_embeddings=True)


class _Blas:
    def plan(self, *shape):
        pass


class _RankDev(_Dev):
    def __init__(self, modules):
        super().__init__(modules)
        self.collectives = []
        self.blas = _Blas()

    def collective(self, where, vals):
        self.collectives.append((where, vals))
        return lambda s: None


def _lowered(tmp_path, program, **kw):
    from kern_models.llama.manifests import cuda as manifest_cuda, tp
    from kern_models.llama.config import shape_of
    from kern_models.llama.kernels.cuda import CUBINS

    m = tp.shard(manifest_cuda.build(shape_of(CFG), "tiny", batch_invariant=False), shape_of(CFG), 2, 1, **kw)
    digests = {n: p.cubin for n, p in CUBINS.read_pins()[1].items()}
    m["modules"]["allreduce"] = {"source": "kernels/allreduce.cubin", "sha256": ""}
    for name, mod in m["modules"].items():
        mod["sha256"] = digests[f"{name}.cubin"]
    (tmp_path / "rank1.json").write_text(json.dumps(m))
    v = load_verified(tmp_path / "rank1.json")
    bufs = {n: _Mem(0x100000 * (i + 1)) for i, n in enumerate(v.manifest.buffers)}
    dev = _RankDev(v.manifest.modules)
    prog = cuda_device.CudaProgram(dev, lower_program(v, program), bufs, {"kv": _Mem(0x70000000)},
                                   graph=v.manifest.programs[program].graph)
    return v, prog, bufs, dev


def test_decode_pushes_parts_into_alternate_halves_and_sums_them_locally(tmp_path):
    v, prog, bufs, _ = _lowered(tmp_path, "decode")
    seqs, hidden = 3, 1024
    items = prog.resolve({**v.constants, "seqs": seqs, "context": 1024, "reach": 64})
    names = [i.kernel.name for i in items]
    layer = ["norm_gemv_rope_append", "attention_decode", "gemv_push", "all_reduce_add_local", "norm_gemv_swiglu",
             "gemv_push", "all_reduce_add_local"]
    assert names == ["embed", *layer * 2, "norm_gemv_f32", "all_gather_f32", "sample_partial", "argmax_final"]
    part = bufs["ar_push.decode"].ptr
    halves = [0, 2 * seqs * hidden, 0, 2 * seqs * hidden]  # of [2, ranks, seqs, hidden]
    for p, h in zip([i for i in items if i.kernel.name == "gemv_push"], halves):
        assert p.args[2:7] == (part, bufs["ar_push.decode_peers"].ptr, 1, 2, h) and p.grid == (hidden // 16, 1, 1)
    for r, h in zip([i for i in items if i.kernel.name == "all_reduce_add_local"], halves):
        assert r.args == (part, bufs["ar_flag_peers"].ptr, bufs["ar_flags"].ptr, bufs["ar_epoch"].ptr,
                          bufs["d_x"].ptr, 1, 2, h, seqs * hidden) and r.grid == (16, 1, 1) and r.pdl
    head, gather = items[-4], items[-3]
    assert head.args[3] == bufs["lg_part.decode"].ptr and head.args[5] == 128  # vocab 256 over 2 ranks
    assert gather.args[:5] == (bufs["lg_part.decode_peers"].ptr, bufs["ar_flag_peers"].ptr, bufs["ar_flags"].ptr,
                               bufs["ar_epoch"].ptr, bufs["d_logits"].ptr)
    assert gather.args[5:] == (1, 2, seqs, 128) and gather.pdl


def test_wide_decode_parts_alternate_halves_and_the_all_reduce_reads_them(tmp_path):
    v, prog, bufs, _ = _lowered(tmp_path, "decode_wide")
    rows, hidden = 40, 1024
    items = prog.resolve({**v.constants, "wide_seqs": rows, "context": 1024, "reach": 64})
    reduces = [i for i in items if getattr(i, "kernel", None) and i.kernel.name == "all_reduce_bf16"]
    halves = [0, rows * hidden, 0, rows * hidden]
    for r, h in zip(reduces, halves, strict=True):
        assert r.args[:4] == (bufs["ar_part.decode_wide_peers"].ptr, bufs["ar_flag_peers"].ptr,
                              bufs["ar_flags"].ptr, bufs["ar_epoch"].ptr)
        assert r.args[5:] == (1, 2, h, rows * hidden) and r.grid == (16, 1, 1)


def test_prefill_sums_through_the_devices_nccl_collective(tmp_path):
    v, prog, bufs, dev = _lowered(tmp_path, "prefill")
    prog.resolve({**v.constants, "tokens": 7, "prefill_seqs": 1, "context": 1024, "reach": 1024})
    assert [vals for _, vals in dev.collectives] == [[bufs["p_attn_out"].ptr, 7 * 1024],
                                                     [bufs["p_mlp_out"].ptr, 7 * 1024]] * 2
    assert all("(op all_reduce_nccl) launch 0" in where for where, _ in dev.collectives)
