"""The Kimi-Linear manifest for cuda sm_90a: bf16 activations, the KDA state in f32, the MLA
cache in bf16; norms, SwiGLU, the LM head and sampling the llama family's kernels, the experts
the Qwen3-MoE family's, KDA, MLA, the router and the plain projections this family's
(kernels/cuda/KERNELS.md).

The default build is batch-invariant (docs/determinism.md): every program computes a row as
the others do. Projections reduce in llama's gemv k order: the gemv (`linear`, `gemv_logits`)
in decode, its wgmma twins (`linear_rows`, `linear_rows_f32`) in prefill and the wide decode;
the routed experts are Qwen3-MoE's invariant block (moe_wg.cu: the gather gemvs in decode,
moe_sort's tiles on wgmma otherwise), their weighted sum added onto the shared expert's output
in choice order (moe_combine_residual); the recurrence in chunks of 16 positions fixed by
position on tensor cores, prefill and decode one routine (kda_form "tc", kda_tc.cu: a token
computed as its row of its chunk, the slot keeping the chunk's start state and its rows so far;
"tokens", a token at a time through decode's step, on request); MLA's attention on tensor cores
(mla_tc.cu), one order a (row, head) in prefill and decode. batch_invariant=False (the faster build): projections
through cuBLASLt (`linear`, `linear_f32`), the prompt's recurrence in 16-row chunks, the
experts moe.cu's gemvs and wmma tiles, MLA's attention on CUDA cores (mla.cu's mla_attend);
MLA is row-wise in either build.

The calls mirror the cpu manifest (manifests/cpu.py) one to one where they can: the same op
names over the same buffers (a projection is `linear`, or an f32 one where the cpu's f32
output feeds a gate, a beta or the router), so kern test pairs every KDA and MLA call with the
reference's and names the one that deviates. Three programs step batches: `prefill` (ragged
rows), `decode` (up to DECODE_SEQS sequences, a CUDA graph; the MoE gathers the chosen
experts' rows) and `decode_wide` (up to WIDE_SEQS, a CUDA graph; the MoE groups rows by expert
as prefill does)."""

from __future__ import annotations

from math import prod

from kern_models.common.errors import ConfigError
from kern_models.llama.kernels.cuda import table as dense_table
from kern_models.llama.manifests.cuda import SPLIT_BELOW_TILES
from kern_models.common.manifest_parts import MASK_ROWS, MAX_STEP_TOKENS, buffer, buffer_arg, context_of, program_batch, sampling_args, sampling_inputs, tokens_of, value_arg
from kern_models.qwen3_moe.kernels.cuda import table as moe_table
from kern_models.qwen3_moe.manifests.cuda import expert_problems

from ..config import KDA, KimiShape
from ..kernels.cuda import table
from .common import constants, prompt_keys, state_constants, states, weight_buffers

BF = "bf16"
# The faster build's chunk of the prompt's recurrence (kda_chunked: S and six chunk tiles in
# shared memory): the reference's chunked form's, so the same prompts cross chunks on both sides.
KDA_CHUNK = 16
DECODE_SEQS = 32   # the gather gemv kernels of the experts step at most this many rows at once
# The narrow decode program's default bound: at 16 rows the gathered experts (8 a row) read
# 128 experts' rows a layer where the grouped GEMMs of decode_wide read each touched expert once
# (the step times behind the bound: docs/hybrid.md, "On sm_90a").
NARROW_SEQS = 4
WIDE_SEQS = 256
PREFILL_SEQS = 256
ARGMAX_CHUNKS = 128
# The longest context the generator offers: the model's own max_position_embeddings, clipped to
# this. llama's 32,768 is for its rope table and decode partials, which grow with the context;
# Kimi-Linear's MLA has no rope table, and its decode partials (mla_tc.cu's split, MLA_CHUNK)
# are rows x heads x ceil(context / MLA_CHUNK) x (kv_lora + 2) f32 a decode program (at
# 262,144, 32 heads and kv_lora 512: 8.0 MiB a row, 2.0 GiB for decode_wide's 256 rows), beside
# the page tables (ceil(context / 16) int32 a row, written by the host each step: 64 KiB a row
# at 262,144); it holds issue 38's 131,072-token prompt and its 64 out (bench/kimi_long.py).
# Past it (the published model's million) is untested.
MAX_CONTEXT = 262144
# MLA's split (mla_tc.cu, the default build's attention): a row's keys cut in chunks of this
# many from key 0, each chunk's (m, l, acc) folded in order; a decode block a (row, 16 heads,
# chunk). Part of the order (another chunk: other bits), so fixed by the deployment, never by
# the batch. 2,048: issue 38's lone stream at 131,072 decodes through 64 chunks x 2 head groups =
# 128 blocks (the H200's 132 SMs, one wave), 8 streams at 32,768 through 256 (2 blocks an SM);
# a chunk's partial (16 heads x 512 f32, 32 KiB) is 1.4% of the 2.25 MiB of keys it reads, and
# the folding block reads 64 of them at 131,072 (2 MiB); 1,024 would double both and the
# partials buffer. Contexts up to 2,048 are one chunk: one block a (row, head group) as before
# the split, o_lat written at once, no partials.
MLA_CHUNK = 2048
DENSE_OPS = ("embed", "rms_norm", "add_rms_norm", "gather_last", "silu_mul", "sample", "gemv_logits")


def check_shape(s: KimiShape, batch_invariant: bool = True, kda_form: str = "chunked") -> None:
    """What these kernels support (kernels/cuda/KERNELS.md); every problem at once."""
    t, problems = table, []
    step = 16 if kda_form == "tc" else 8  # kda_tc.cu's k16 steps over the channels
    if s.kda_layers and (s.kda_dim > t.MAX_DIM or s.kda_dim % step):
        problems.append(f"linear head_dim {s.kda_dim}: the KDA kernels take a multiple of {step} up to {t.MAX_DIM}")
    if s.kda_layers and not 1 <= s.conv <= t.MAX_CONV:
        problems.append(f"short_conv_kernel_size {s.conv}: kda_conv takes 1 to {t.MAX_CONV}")
    if s.mla_layers:
        # the width a multiple of 16: mla_tc.cu's k16 steps (mla.cu's 16-byte rows need 8)
        if s.kv_lora + s.rope > t.MAX_LATENT or (s.kv_lora + s.rope) % 16 or s.kv_lora % 32 or s.kv_lora > t.MAX_LORA:
            problems.append(f"kv_lora_rank {s.kv_lora} + qk_rope_head_dim {s.rope}: the MLA kernels take a latent "
                            f"that is a multiple of 32 up to {t.MAX_LORA} and a width that is a multiple of 16 up "
                            f"to {t.MAX_LATENT}")
        if MLA_CHUNK % t.MLA_TC_BN:
            problems.append(f"MLA_CHUNK {MLA_CHUNK}: mla_tc.cu walks a chunk in tiles of {t.MLA_TC_BN} keys")
        if s.nope > t.MAX_NOPE:
            problems.append(f"qk_nope_head_dim {s.nope}: mla_absorb takes at most {t.MAX_NOPE}")
        # mla_tc.cu's up-projections: the query's nope part in k16 steps (4-byte fragments), the
        # value rows in 8-column tiles
        if batch_invariant and (s.nope % 16 or s.rope % 2 or s.v_dim % 8):
            problems.append(f"qk_nope_head_dim {s.nope}, qk_rope_head_dim {s.rope}, v_head_dim {s.v_dim}: the tensor-core "
                            "up-projections take a nope part that is a multiple of 16, an even rope part and a value "
                            "head that is a multiple of 8")
        # mla_attend_x (a prompt's rows, expanded): q K^T in k16 steps over nope + rope, 16-byte rows
        elif batch_invariant and (s.nope + s.rope > t.MLA_X_MAX_QK or s.rope % 8 or s.v_dim > t.MLA_X_MAX_V):
            problems.append(f"qk_nope_head_dim {s.nope} + qk_rope_head_dim {s.rope}, v_head_dim {s.v_dim}: the expanded "
                            f"prefill attention takes a query head of at most {t.MLA_X_MAX_QK} channels with a rope part "
                            f"that is a multiple of 8, and a value head of at most {t.MLA_X_MAX_V}")
    if any(s.sparse):
        if s.experts > t.MAX_EXPERTS or s.groups > t.MAX_GROUPS:
            problems.append(f"{s.experts} experts in {s.groups} groups: kimi_route takes at most {t.MAX_EXPERTS} "
                            f"experts in at most {t.MAX_GROUPS} groups")
        problems += expert_problems(s.hidden, s.moe_inter, s.top_k)
    if s.hidden % 8 or s.inter % 8:
        problems.append(f"hidden_size {s.hidden}, intermediate_size {s.inter}: the dense kernels need multiples of 8")
    # the invariant projections' K: the gemv's 8-byte loads, the tensor maps' 16-byte rows
    widths = {"q_lora_rank": s.q_lora or 0, "num_attention_heads x v_head_dim": s.heads * s.v_dim * bool(s.mla_layers)}
    if batch_invariant and any(n % 8 for n in widths.values()):
        problems.append(", ".join(f"{k} {n}" for k, n in widths.items() if n % 8)
                        + ": the invariant projections take a K that is a multiple of 8")
    if problems:
        raise ConfigError("cannot build the sm_90a Kimi-Linear manifest: " + "; ".join(problems))


def _ops(kda_form: str, batch_invariant: bool) -> dict:
    dense = {n: op for n, op in dense_table.ops().items() if n in DENSE_OPS}
    moe = moe_table.ops()
    # many rows' f32 projections in the gemv's k order: the router's kernel (gemm_wg over 64 rows)
    # serves the gate's and beta's projections and the wide LM head as well
    proj = {"linear_rows_f32": moe["moe_router_gemm"], "linear_rows_f32_split": moe["moe_router_gemm_split"]} \
        if batch_invariant else \
        {"linear": dense_table.EXTERN_OPS["gemm"], "linear_f32": dense_table.EXTERN_OPS["gemm_logits"]}
    # MLA's attention on tensor cores in the default build; the faster build keeps the CUDA-core
    # kernel (its manifest byte for byte) until the tensor-core one is measured on the H200
    return {**dense, **moe, **table.ops(kda_form, "tensor" if batch_invariant else "cores"), **proj}


def _size(e, const: dict) -> int:
    """A size the calls name: an int, a constant's name, or a product or sum of them."""
    if isinstance(e, int):
        return e
    if isinstance(e, str):
        return _size(const[e], const)
    (op, terms), = e.items()  # {"mul": [a, b, ..]} or {"add": [..]}
    vals = [_size(t, const) for t in terms]
    return prod(vals) if op == "mul" else sum(vals)


class _Program:
    """One program's calls: p the buffer prefix, rows the var counting its rows, seqs the one
    counting its sequences, kind prefill / decode / wide; batch_invariant: which build."""

    def __init__(self, s: KimiShape, p: str, rows: str, seqs: str, kind: str, buffers: dict, kda_form: str,
                 batch_invariant: bool):
        self.s, self.p, self.rows, self.seqs, self.kind, self.buffers = s, p, rows, seqs, kind, buffers
        self.kda_form, self.batch_invariant = kda_form, batch_invariant
        self.decode = kind != "prefill"
        self.const = constants(s)
        self.split_tiles = 0  # the most column tiles of a projection split over K (0: none)

    def proj(self, f32: bool) -> str:
        """A projection's op: cuBLASLt in the faster build; in the invariant one the gemv for
        decode's rows, its wgmma twin for prefill's and the wide decode's (the same bits a row)."""
        if not self.batch_invariant:
            return "linear_f32" if f32 else "linear"
        if self.kind == "decode":
            return "gemv_logits" if f32 else "linear"
        return "linear_rows_f32" if f32 else "linear_rows"

    def ws(self, name: str, shape: list, dtype: str = BF) -> dict:
        self.buffers.setdefault(self.p + name, buffer(shape, "workspace", dtype))
        return buffer_arg(self.p + name)

    def split(self, n, k) -> bool:
        """Whether the wide decode splits this projection's K over 8 blocks a column tile (the
        llama family's rule, SPLIT_BELOW_TILES: few tiles leave the GPU idle at a few rows), where
        K holds a unit of the k order (256) for each of the 8 partials."""
        if self.kind != "wide" or not self.batch_invariant:
            return False
        tiles = -(-_size(n, self.const) // dense_table.TILES["WG_BN"])
        if tiles >= SPLIT_BELOW_TILES or _size(k, self.const) < dense_table.GEMM_SPLIT * 256:
            return False
        self.split_tiles = max(self.split_tiles, tiles)
        return True

    def lin(self, x: str, w: str, y: str, n, k, f32: bool = False) -> dict:
        op, scratch = self.proj(f32), []
        if self.split(n, k):  # the wide decode's few rows: the same bits in 8 blocks a tile
            op, scratch = op + "_split", [buffer_arg(self.p + "gpart"), buffer_arg(self.p + "gsem")]
        return {"op": op, "args": [buffer_arg(self.p + x), buffer_arg(w), buffer_arg(self.p + y), *scratch,
                                   value_arg(self.rows), value_arg(n), value_arg(k)]}

    def kda(self, l: int) -> list[dict]:
        s, p, R = self.s, self.p, self.rows
        geo = [value_arg(s.kda_layers.index(l)), value_arg("kda_layers"), value_arg("kda_heads"), value_arg("kda_dim"), value_arg("conv"), value_arg("kda_slot_bytes")]
        kda = {"state": "kda"}
        for name, width, dtype in (("mix", {"mul": [3, "qkv"]}, BF), ("low", "kda_dim", BF), ("g", "qkv", "f32"),
                                   ("beta", "kda_heads", "f32"), ("gate", "qkv", BF), ("core", "qkv", BF),
                                   ("normed", "qkv", BF)):
            self.ws(name, [R, width], dtype)
        if self.decode:
            conv = {"op": "kda_conv_decode", "args": [buffer_arg(p + "mix"), buffer_arg(f"kda_conv_w.{l}"), kda, buffer_arg(p + "slot"),
                                                      buffer_arg(p + "pos"), value_arg(R), *geo]}
            rec = {"op": "kda_step", "args": [buffer_arg(p + "mix"), buffer_arg(p + "g"), buffer_arg(p + "beta"), kda, buffer_arg(p + "slot"),
                                              buffer_arg(p + "pos"), buffer_arg(p + "core"), value_arg(R), *geo]}
        else:
            where = [buffer_arg(p + "slot"), buffer_arg(p + "cu_seqlens"), buffer_arg(p + "pos")]
            conv = {"op": "kda_conv", "args": [buffer_arg(p + "mix"), buffer_arg(f"kda_conv_w.{l}"), kda, *where, value_arg(self.seqs), *geo]}
            if self.kda_form == "tc":  # kda_tc_prep's scores and left operands of every prompt row, [rows, heads, 2 C + 2 dim]
                pre = self.ws("kda_pre", [R, "kda_heads", {"add": [2 * table.KDA_TC_C, {"mul": [2, "kda_dim"]}]}], "f32")
                rec = {"op": "kda_chunked", "args": [buffer_arg(p + "mix"), buffer_arg(p + "g"), buffer_arg(p + "beta"), kda, *where, pre,
                                                     buffer_arg(p + "core"), value_arg(R), value_arg(self.seqs), *geo]}
            else:
                rec = {"op": "kda_chunked", "args": [buffer_arg(p + "mix"), buffer_arg(p + "g"), buffer_arg(p + "beta"), kda, *where,
                                                     buffer_arg(p + "core"), value_arg(self.seqs), *geo]
                       + ([value_arg(KDA_CHUNK)] if self.kda_form == "chunked" else [])}
        return [
            self.lin("h", f"kda_qkv_w.{l}", "mix", {"mul": [3, "qkv"]}, "hidden"), conv,
            self.lin("h", f"kda_fa_w.{l}", "low", "kda_dim", "hidden"),
            self.lin("low", f"kda_fb_w.{l}", "g", "qkv", "kda_dim", f32=True),
            {"op": "kda_gate", "args": [buffer_arg(p + "g"), buffer_arg(f"kda_a_log.{l}"), buffer_arg(f"kda_dt_bias.{l}"), value_arg(R), value_arg("kda_heads"),
                                        value_arg("kda_dim")]},
            self.lin("h", f"kda_b_w.{l}", "beta", "kda_heads", "hidden", f32=True), rec,
            self.lin("h", f"kda_ga_w.{l}", "low", "kda_dim", "hidden"),
            self.lin("low", f"kda_gb_w.{l}", "gate", "qkv", "kda_dim"),
            {"op": "kda_out_norm", "args": [buffer_arg(p + "core"), buffer_arg(p + "gate"), buffer_arg(f"kda_o_norm.{l}"), buffer_arg(p + "normed"), value_arg(R),
                                            value_arg("kda_heads"), value_arg("kda_dim"), value_arg(s.eps)]},
            self.lin("normed", f"o_w.{l}", "attn_out", "hidden", "qkv"),
        ]

    def mla(self, l: int) -> list[dict]:
        s, p, R = self.s, self.p, self.rows
        k, kv, pages = s.mla_layers.index(l), {"state": "kv"}, {"ceil_div": ["context", "page_tokens"]}
        for name, width in (("q", "q_dim"), ("ckv", "latent"), ("attn", {"mul": ["heads", "v_dim"]})):
            self.ws(name, [R, width])
        q_lat, o_lat = (self.ws(n, [R, "heads", "kv_lora"], "f32") for n in ("q_lat", "o_lat"))
        if s.q_lora is None:
            q = [self.lin("h", f"q_w.{l}", "q", "q_dim", "hidden")]
        else:
            self.ws("q_low", [R, "q_lora"])
            self.ws("q_normed", [R, "q_lora"])
            q = [self.lin("h", f"q_a_w.{l}", "q_low", "q_lora", "hidden"),
                 {"op": "rms_norm", "args": [buffer_arg(p + "q_low"), buffer_arg(f"q_a_norm.{l}"), buffer_arg(p + "q_normed"), value_arg(R), value_arg("q_lora"),
                                             value_arg(s.eps)]},
                 self.lin("q_normed", f"q_b_w.{l}", "q", "q_dim", "q_lora")]
        where = [buffer_arg(p + "page_table")] + ([] if self.decode else [buffer_arg(p + "cu_seqlens")]) + [buffer_arg(p + "pos")]
        counts = [value_arg(pages), value_arg(R)] + ([] if self.decode else [value_arg(self.seqs)])
        geo = [value_arg("kv_lora"), value_arg("rope"), value_arg("page_tokens"), value_arg("kv_token_bytes")]
        scratch, split = [], []
        if self.batch_invariant:  # mla_tc.cu's split: the chunk, and decode's partials
            split = [value_arg(MLA_CHUNK)]
            if self.decode:
                splits = {"ceil_div": ["context", MLA_CHUNK]}
                scratch = [self.ws("mla_part_o", [R, "heads", splits, "kv_lora"], "f32"),
                           self.ws("mla_part_ml", [R, "heads", splits, 2], "f32")]
                self.buffers.setdefault(p + "mla_sem", buffer([R, "heads"], "carry", "i32"))
                scratch.append(buffer_arg(p + "mla_sem"))
                split.append(value_arg({"ceil_div": ["reach", MLA_CHUNK]}))
        append = {"op": "mla_append_decode" if self.decode else "mla_append",
                  "args": [buffer_arg(p + "ckv"), buffer_arg(f"kv_a_norm.{l}"), kv, *where, *counts, value_arg(k), value_arg("mla_layers"), *geo,
                           value_arg(s.eps)]}
        heads = [value_arg("heads"), value_arg("nope"), value_arg("rope"), value_arg("kv_lora")]
        if self.batch_invariant and not self.decode:
            return [*q, self.lin("h", f"kv_a_w.{l}", "ckv", "latent", "hidden"), append, *self.mla_prompt(l, k, kv, q_lat, o_lat, heads, geo),
                    self.lin("attn", f"o_w.{l}", "attn_out", "hidden", {"mul": ["heads", "v_dim"]})]
        return [
            *q, self.lin("h", f"kv_a_w.{l}", "ckv", "latent", "hidden"), append,
            {"op": "mla_attention_decode" if self.decode else "mla_attention",
             "args": [buffer_arg(p + "q"), kv, *where, buffer_arg(f"kv_b_w.{l}"), buffer_arg(p + "attn"), q_lat, o_lat, *scratch, *counts,
                      value_arg(k), value_arg("mla_layers"), *heads, value_arg("page_tokens"), value_arg("kv_token_bytes"), *split,
                      value_arg("v_dim")]},
            self.lin("attn", f"o_w.{l}", "attn_out", "hidden", {"mul": ["heads", "v_dim"]}),
        ]

    def mla_prompt(self, l: int, k: int, kv: dict, q_lat: dict, o_lat: dict, heads: list, geo: list) -> list[dict]:
        """The default build's prefill MLA, a token's form fixed by its role (docs/hybrid.md): the
        keys the step's prompt rows attend over numbered and their latents gathered (mla_gather),
        expanded through kv_b by the invariant GEMM (a key a row: its bits whatever step expands
        it) into kx, then mla_attention: the absorbed form for the generated rows, mla_attend_x
        over kx for the prompt rows. The keys var bounds the workspaces: the host sets it each
        step and keeps it within its maximum (Batch.keys)."""
        p, R, G = self.p, self.rows, self.seqs
        pages = {"ceil_div": ["context", "page_tokens"]}
        koff = self.ws("mla_koff", [{"add": [G, 1]}], "i32")
        lat = self.ws("mla_lat", ["keys", "kv_lora"])
        kx = self.ws("mla_kx", ["keys", {"mul": ["heads", {"add": ["nope", "v_dim"]}]}])
        rows = [buffer_arg(p + "cu_seqlens"), buffer_arg(p + "pos"), buffer_arg(p + "prompt_len")]
        return [
            {"op": "mla_gather", "args": [*rows, kv, buffer_arg(p + "page_table"), koff, lat, value_arg(pages), value_arg(G),
                                          value_arg("keys"), value_arg(k), value_arg("mla_layers"), *geo]},
            {"op": "linear_rows", "args": [lat, buffer_arg(f"kv_b_w.{l}"), kx, value_arg("keys"),
                                           value_arg({"mul": ["heads", {"add": ["nope", "v_dim"]}]}), value_arg("kv_lora")]},
            {"op": "mla_attention",
             "args": [buffer_arg(p + "q"), kv, buffer_arg(p + "page_table"), *rows, buffer_arg(f"kv_b_w.{l}"), buffer_arg(p + "attn"),
                      q_lat, o_lat, koff, kx, value_arg(pages), value_arg(R), value_arg(G), value_arg("keys"), value_arg(k),
                      value_arg("mla_layers"), *heads, value_arg("page_tokens"), value_arg("kv_token_bytes"), value_arg(MLA_CHUNK),
                      value_arg("v_dim")]},
        ]

    def mlp(self, l: int) -> list[dict]:
        s, p, R = self.s, self.p, self.rows
        if not s.sparse[l]:
            self.ws("gate_up", [R, {"mul": [2, "inter"]}])
            self.ws("act", [R, "inter"])
            return [self.lin("h", f"gate_up_w.{l}", "gate_up", {"mul": [2, "inter"]}, "hidden"),
                    {"op": "silu_mul", "args": [buffer_arg(p + "gate_up"), buffer_arg(p + "act"), value_arg(R), value_arg("inter")]},
                    self.lin("act", f"down_w.{l}", "mlp_out", "hidden", "inter")]
        router, ids, w = self.ws("router", [R, "experts"], "f32"), self.ws("topk_ids", [R, "top_k"], "i32"), \
            self.ws("topk_w", [R, "top_k"], "f32")
        self.ws("shared_gu", [R, {"mul": [2, "shared_inter"]}])
        self.ws("shared_act", [R, "shared_inter"])
        gate_up, down = buffer_arg(f"experts_gate_up.{l}"), buffer_arg(f"experts_down.{l}")
        logits = {"op": "gemv_logits", "args": [buffer_arg(p + "h"), buffer_arg(f"router_w.{l}"), router, value_arg(R), value_arg("experts"),
                                                value_arg("hidden")]} if self.kind == "decode" else \
            self.lin("h", f"router_w.{l}", "router", "experts", "hidden", f32=True)
        route = {"op": "kimi_route", "args": [router, buffer_arg(f"router_bias.{l}"), ids, w, value_arg(R), value_arg("experts"), value_arg("top_k"),
                                              value_arg(s.scaling), value_arg(int(s.norm_topk)), value_arg(s.groups), value_arg(s.topk_groups)]}
        shared = [self.lin("h", f"shared_gate_up.{l}", "shared_gu", {"mul": [2, "shared_inter"]}, "hidden"),
                  {"op": "silu_mul", "args": [buffer_arg(p + "shared_gu"), buffer_arg(p + "shared_act"), value_arg(R), value_arg("shared_inter")]}]
        shared.append(self.lin("shared_act", f"shared_down.{l}", "shared_out", "hidden", "shared_inter"))
        self.ws("shared_out", [R, "hidden"])
        add = {"op": "add", "args": [buffer_arg(p + "mlp_out"), buffer_arg(p + "shared_out"), value_arg(R), value_arg("hidden")]}
        if self.batch_invariant:
            return [logits, route, *self.routed(l, ids, w), *shared, add]
        if self.kind == "decode":  # the chosen experts' rows only, their weighted sum added onto zeros
            act = self.ws("moe_act", [R, "top_k", "moe_inter"])
            return [logits, route,
                    {"op": "moe_gemv_gate_up", "args": [buffer_arg(p + "h"), ids, gate_up, act, value_arg(R), value_arg("top_k"),
                                                        value_arg("moe_inter"), value_arg("hidden"), value_arg(0), value_arg("local_experts")]},
                    {"op": "zero", "args": [buffer_arg(p + "mlp_out"), value_arg(R), value_arg("hidden")]},
                    {"op": "moe_gemv_down_residual", "args": [act, ids, w, down, buffer_arg(p + "mlp_out"), value_arg(R), value_arg("top_k"),
                                                              value_arg("hidden"), value_arg("moe_inter")]},
                    *shared, add]
        pairs = {"mul": [R, "top_k"]}
        sort, tiles = self.sort(ids)
        sorted_, pos, tile_buf = (buffer_arg(p + n) for n in ("moe_sorted", "moe_pos", "moe_tiles"))
        act, y = self.ws("moe_act", [pairs, "moe_inter"]), self.ws("moe_y", [pairs, "hidden"], "f32")
        return [
            logits, route, sort,
            {"op": "moe_group_gate_up", "args": [buffer_arg(p + "h"), sorted_, tile_buf, gate_up, act, value_arg("top_k"),
                                                 value_arg("moe_inter"), value_arg("hidden"), value_arg(0), value_arg("local_experts"), value_arg(tiles)]},
            {"op": "moe_group_down", "args": [act, tile_buf, down, y, value_arg("hidden"), value_arg("moe_inter"), value_arg(0),
                                              value_arg("local_experts"), value_arg(tiles)]},
            {"op": "moe_combine", "args": [y, pos, w, buffer_arg(p + "mlp_out"), value_arg(R), value_arg("top_k"), value_arg("hidden")]},
            *shared, add,
        ]

    def sort(self, ids: dict) -> tuple[dict, dict]:
        """moe_sort's call (the (row, choice) pairs by expert into moe_sorted, their places into
        moe_pos, tiles of one expert into moe_tiles) and the bound on the tiles' count."""
        pairs = {"mul": [self.rows, "top_k"]}
        tiles = {"add": [{"ceil_div": [pairs, moe_table.TILES["MOE_BM"]]}, "experts"]}
        sorted_, pos = self.ws("moe_sorted", [pairs], "i32"), self.ws("moe_pos", [pairs], "i32")
        tile_buf = self.ws("moe_tiles", [{"add": [1, {"mul": [3, tiles]}]}], "i32")
        return {"op": "moe_sort", "args": [ids, sorted_, pos, tile_buf, value_arg(pairs), value_arg("experts")]}, tiles

    def routed(self, l: int, ids: dict, w: dict) -> list[dict]:
        """The invariant build's routed experts (Qwen3-MoE's moe_wg.cu): every (row, choice)'s
        output in f32 by pair, in the gemv's k order whichever kernel computes it (decode's gather
        gemvs read only the chosen experts' rows; prefill and the wide decode run moe_sort's tiles
        on wgmma), then each row's weighted sum in choice order into mlp_out (added onto zeros:
        the routed output alone, where the cpu reference's combine writes it)."""
        p, R = self.p, self.rows
        pairs, held = {"mul": [R, "top_k"]}, [value_arg(0), value_arg("local_experts")]
        gate_up, down, h = buffer_arg(f"experts_gate_up.{l}"), buffer_arg(f"experts_down.{l}"), buffer_arg(p + "h")
        act, y = self.ws("moe_act", [pairs, "moe_inter"]), self.ws("moe_y", [pairs, "hidden"], "f32")
        sizes = [value_arg("hidden"), value_arg("moe_inter")]
        if self.kind == "decode":
            calls = [{"op": "moe_gather_gate_up", "args": [h, ids, gate_up, act, value_arg(R), value_arg("top_k"),
                                                           *sizes[::-1], *held]},
                     {"op": "moe_gather_down", "args": [act, ids, down, y, value_arg(R), value_arg("top_k"), *sizes,
                                                        *held]}]
        else:
            sort, tiles = self.sort(ids)
            sorted_, tile_buf = buffer_arg(p + "moe_sorted"), buffer_arg(p + "moe_tiles")
            calls = [sort,
                     {"op": "moe_wg_gate_up", "args": [h, sorted_, tile_buf, gate_up, act, value_arg("top_k"),
                                                       *sizes[::-1], *held, value_arg(tiles)]},
                     {"op": "moe_wg_down", "args": [act, sorted_, tile_buf, down, y, *sizes, *held, value_arg(tiles)]}]
        out = buffer_arg(p + "mlp_out")
        return [*calls, {"op": "zero", "args": [out, value_arg(R), value_arg("hidden")]},
                {"op": "moe_combine_residual", "args": [y, ids, w, out, value_arg(R), value_arg("top_k"),
                                                        value_arg("hidden"), *held]}]

    def calls(self) -> list[dict]:
        s, p, R, G = self.s, self.p, self.rows, self.seqs
        calls = [{"op": "embed", "args": [buffer_arg(p + "ids"), buffer_arg("embed"), buffer_arg(p + "x"), value_arg(R), value_arg("hidden")]}]
        for l in range(s.layers):
            calls.append({"op": "rms_norm", "args": [buffer_arg(p + "x"), buffer_arg("ln1.0"), buffer_arg(p + "h"), value_arg(R), value_arg("hidden"), value_arg(s.eps)]}
                         if l == 0 else
                         {"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "mlp_out"), buffer_arg(f"ln1.{l}"), buffer_arg(p + "h"), value_arg(R),
                                                         value_arg("hidden"), value_arg(s.eps)]})
            calls += self.kda(l) if s.mixers[l] == KDA else self.mla(l)
            calls.append({"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "attn_out"), buffer_arg(f"ln2.{l}"), buffer_arg(p + "h"),
                                                         value_arg(R), value_arg("hidden"), value_arg(s.eps)]})
            calls += self.mlp(l)
        calls.append({"op": "add_rms_norm", "args": [buffer_arg(p + "x"), buffer_arg(p + "mlp_out"), buffer_arg("final_norm"), buffer_arg(p + "h"), value_arg(R),
                                                     value_arg("hidden"), value_arg(s.eps)]})
        last = p + "h"
        if not self.decode:
            calls.append({"op": "gather_last", "args": [buffer_arg(p + "h"), buffer_arg(p + "cu_seqlens"), buffer_arg(p + "last"), value_arg(G),
                                                        value_arg("hidden")]})
            last = p + "last"
        # the gemv over decode's rows and prefill's last rows; the wide decode's many rows in a GEMM
        head = {"op": self.proj(True) if self.kind == "wide" else "gemv_logits",
                "args": [buffer_arg(last), buffer_arg("lm_head"), buffer_arg(p + "logits"), value_arg(G), value_arg("vocab"),
                         value_arg("hidden")]}
        sample = {"op": "sample", "args": [buffer_arg(p + "logits"), *sampling_args(p), buffer_arg(p + "argmax_val"),
                                           buffer_arg(p + "argmax_idx"), buffer_arg(p + "next"), value_arg("vocab"), value_arg(G), value_arg(ARGMAX_CHUNKS)]}
        return calls + [head, sample]

    def io_buffers(self) -> None:
        s, p, R, G = self.s, self.p, self.rows, self.seqs
        pages = {"ceil_div": ["context", "page_tokens"]}
        self.buffers.update({
            p + "ids": buffer([R], "input", "i32", fill="token", domain={"range": [0, "vocab"]}),
            p + "pos": buffer([R], "input", "i32", fill="position",
                           domain={"range": [0, "reach" if self.decode else "context"]}),
            p + "x": buffer([R, "hidden"], dtype=BF), p + "h": buffer([R, "hidden"], dtype=BF),
            p + "attn_out": buffer([R, "hidden"], dtype=BF), p + "mlp_out": buffer([R, "hidden"], dtype=BF),
            p + "logits": buffer([G, "vocab"], "output", "f32", fill="logits"),
            p + "argmax_val": buffer([G, ARGMAX_CHUNKS], dtype="f32"),
            p + "argmax_idx": buffer([G, ARGMAX_CHUNKS], dtype="i32"),
            p + "next": buffer([G], "output", "i32", fill="tokens"),
            **sampling_inputs(p, G),
        })
        if s.kda_layers:
            self.buffers[p + "slot"] = buffer([G], "input", "i32", fill="slot")
        if s.mla_layers:
            self.buffers[p + "page_table"] = buffer([G, pages], "input", "i32",
                                                 domain={"index_into": "kv", "stride": "page_tokens"})
        if not self.decode:
            self.buffers[p + "cu_seqlens"] = buffer([{"add": [G, 1]}], "input", "i32", fill="cu_seqlens",
                                                 domain={"range": [0, {"add": [R, 1]}]})
            self.buffers[p + "last"] = buffer([G, "hidden"], dtype=BF)
            if s.mla_layers and self.batch_invariant:  # a prompt token attends in the expanded form, a generated one absorbed
                self.buffers[p + "prompt_len"] = buffer([G], "input", "i32", fill="prompt_len")


def build(s: KimiShape, model: str, *, tokens: int = 2048, seqs: int = NARROW_SEQS, prefill_seqs: int = PREFILL_SEQS,
          wide_seqs: int = WIDE_SEQS, context: int | None = None, kda_form: str | None = None,
          batch_invariant: bool = True) -> dict:
    """batch_invariant (the default): every program computes a row as the others do, so a
    request's bytes do not depend on its batch, its chunking or a cache hit (docs/determinism.md);
    False: the faster build (cuBLASLt, moe.cu's expert kernels). kda_form: the recurrence, "tc"
    (kda_tc.cu: chunks of 16 positions on tensor cores, decode a row of its chunk; a token's bits
    whatever cut its prompt; the invariant build's default), "tokens" (a token at a time through
    decode's step, kda_tokens: the same contract, slower) or "chunked" (kda_chunked's 16-row
    chunks from each call's first row, its bits depend on the cut; the faster build's default,
    refused by the invariant build)."""
    kda_form = kda_form or ("tc" if batch_invariant else "chunked")
    if kda_form not in table.KDA_FORMS:
        raise ConfigError(f"kda_form {kda_form!r}: the sm_90a recurrence's prompt form is one of "
                          f"{', '.join(table.KDA_FORMS)}")
    if batch_invariant and kda_form == "chunked":
        raise ConfigError(f"kda_form {kda_form!r}: its bits depend on where a prompt was cut, so the batch-invariant "
                          "build takes 'tc' or 'tokens' (the faster build, batch_invariant=False, takes any)")
    check_shape(s, batch_invariant, kda_form)
    if seqs > DECODE_SEQS:
        raise ConfigError(f"seqs {seqs}: the gathered-experts decode program steps at most {DECODE_SEQS} sequences "
                          f"(larger batches step through decode_wide, up to {WIDE_SEQS})")
    context = context_of(s, context, MAX_CONTEXT)
    tokens = tokens_of(tokens, MAX_STEP_TOKENS)
    buffers: dict = weight_buffers(s, BF)
    programs: dict = {}
    for prog, p, rows, groups, kind in (("prefill", "p_", "tokens", "prefill_seqs", "prefill"),
                                        ("decode", "d_", "seqs", "seqs", "decode"),
                                        ("decode_wide", "w_", "wide_seqs", "wide_seqs", "wide")):
        pr = _Program(s, p, rows, groups, kind, buffers, kda_form, batch_invariant)
        pr.io_buffers()
        programs[prog] = {"calls": pr.calls(), "graph": kind != "prefill",
                          "batch": program_batch(groups, rows, kind != "prefill")}
        if pr.split_tiles:  # the split projections' scratch and counters, for the widest of them
            tiles = {"mul": [{"ceil_div": [rows, 64]}, pr.split_tiles]}
            buffers[p + "gpart"] = buffer([{"mul": [tiles, dense_table.GEMM_SPLIT * dense_table.TILES["WG_SPLIT_PART"]]}],
                                          "workspace", "f32")
            buffers[p + "gsem"] = buffer([tiles], "carry", "i32")
        if kind == "prefill" and s.mla_layers and batch_invariant:
            programs[prog]["batch"]["keys"] = "keys"  # the expanded form's keys a step (Batch.keys)
    used = {c["op"] for prog in programs.values() for c in prog["calls"]}
    ops = {n: op for n, op in _ops(kda_form, batch_invariant).items() if n in used}
    modules = sorted({ln["module"] for op in ops.values() for ln in op["impl"]["launches"] if "module" in ln})
    # kda_tc keeps, beside each KDA layer's state at its chunk's start, the chunk's rows so far
    sizes = state_constants(s, 2, table.KDA_TC_ROWS * table.KDA_TC_C if kda_form == "tc" else 0)
    return {
        "schema_version": 1, "model": model, "target": {"device": "cuda", "arch": table.ARCH},
        "constants": {**constants(s), **sizes},
        "vars": {"tokens": {"max": tokens}, "prefill_seqs": {"max": prefill_seqs}, "seqs": {"max": seqs},
                 "wide_seqs": {"max": wide_seqs}, "context": {"max": context}, "reach": {"max": context},
                 **({"keys": {"max": prompt_keys(s, context, tokens)}} if s.mla_layers and batch_invariant else {}),
                 MASK_ROWS: {"max": max(seqs, prefill_seqs, wide_seqs)}},
        "buffers": buffers,
        # Declared by their sizes' values, not the constants' names the cpu manifest uses: the
        # bf16 cache and the f32 state computed from bf16 inputs differ from the reference's in
        # every byte, so kern test carries them on each side rather than comparing their bytes.
        "states": {n: {k: sizes[e] for k, e in st.items()} for n, st in states(s).items()},
        "modules": {name: {"source": f"kernels/{name}.cubin", "sha256": ""} for name in modules},
        "ops": ops, "programs": programs,
    }
