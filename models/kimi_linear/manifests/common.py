"""What the Kimi-Linear manifests share whatever the target: the checkpoint's tensors as weight
buffers, the two states' sizes, and the constants the calls name.

Tensor names are the published checkpoint's (KimiLinearForCausalLM's original layout, which
transformers also writes): a KDA layer's q/k/v and their convolutions fused into one buffer
each, a MoE layer's experts laid end to end ([w1_e; w3_e] = [gate_e; up_e], then w2_e = down_e)
as the Qwen3-MoE block reads them."""

from __future__ import annotations

from math import lcm

from kern_models.common.manifest_parts import embed_and_head, weight

from ..config import KDA, KimiShape

PAGE_TOKENS = 16


def weight_buffers(s: KimiShape, dtype: str) -> dict:
    w = lambda shape, *tensors: weight(shape, *tensors, dtype=dtype)
    # never tied: transformers' KimiLinearForCausalLM ties nothing (its _tied_weights_keys is
    # empty) whatever tie_word_embeddings says, so it reads the shipped lm_head.weight and starts
    # a missing one random; kern binds each tensor as its own and refuses a missing one by name
    head = embed_and_head(False, dtype)
    out = {"embed": head["embed"], "final_norm": w(["hidden"], "model.norm.weight"), "lm_head": head["lm_head"]}
    for l in range(s.layers):
        pre, at = f"model.layers.{l}.", f"model.layers.{l}.self_attn."
        out[f"ln1.{l}"] = w(["hidden"], pre + "input_layernorm.weight")
        out[f"ln2.{l}"] = w(["hidden"], pre + "post_attention_layernorm.weight")
        if s.mixers[l] == KDA:
            out |= {
                f"kda_qkv_w.{l}": w([{"mul": [3, "qkv"]}, "hidden"], *(at + f"{x}_proj.weight" for x in "qkv")),
                f"kda_conv_w.{l}": w([{"mul": [3, "qkv", "conv"]}], *(at + f"{x}_conv1d.weight" for x in "qkv")),
                f"kda_fa_w.{l}": w(["kda_dim", "hidden"], at + "f_a_proj.weight"),
                f"kda_fb_w.{l}": w(["qkv", "kda_dim"], at + "f_b_proj.weight"),
                f"kda_a_log.{l}": w(["kda_heads"], at + "A_log"),
                f"kda_dt_bias.{l}": w(["qkv"], at + "dt_bias"),
                f"kda_b_w.{l}": w(["kda_heads", "hidden"], at + "b_proj.weight"),
                f"kda_ga_w.{l}": w(["kda_dim", "hidden"], at + "g_a_proj.weight"),
                f"kda_gb_w.{l}": w(["qkv", "kda_dim"], at + "g_b_proj.weight"),
                f"kda_o_norm.{l}": w(["kda_dim"], at + "o_norm.weight"),
                f"o_w.{l}": w(["hidden", "qkv"], at + "o_proj.weight"),
            }
        else:
            if s.q_lora is None:
                out[f"q_w.{l}"] = w(["q_dim", "hidden"], at + "q_proj.weight")
            else:
                out |= {f"q_a_w.{l}": w(["q_lora", "hidden"], at + "q_a_proj.weight"),
                        f"q_a_norm.{l}": w(["q_lora"], at + "q_a_layernorm.weight"),
                        f"q_b_w.{l}": w(["q_dim", "q_lora"], at + "q_b_proj.weight")}
            out |= {
                f"kv_a_w.{l}": w(["latent", "hidden"], at + "kv_a_proj_with_mqa.weight"),
                f"kv_a_norm.{l}": w(["kv_lora"], at + "kv_a_layernorm.weight"),
                f"kv_b_w.{l}": w([{"mul": ["heads", {"add": ["nope", "v_dim"]}]}, "kv_lora"],
                                 at + "kv_b_proj.weight"),
                f"o_w.{l}": w(["hidden", {"mul": ["heads", "v_dim"]}], at + "o_proj.weight"),
            }
        if s.sparse[l]:
            moe = pre + "block_sparse_moe."
            out |= {
                f"router_w.{l}": w(["experts", "hidden"], moe + "gate.weight"),
                f"router_bias.{l}": w(["experts"], moe + "gate.e_score_correction_bias"),
                f"experts_gate_up.{l}": w([{"mul": ["experts", 2, "moe_inter"]}, "hidden"],
                                          *(moe + f"experts.{e}.{x}.weight" for e in range(s.experts)
                                            for x in ("w1", "w3"))),
                f"experts_down.{l}": w([{"mul": ["experts", "hidden"]}, "moe_inter"],
                                       *(moe + f"experts.{e}.w2.weight" for e in range(s.experts))),
                f"shared_gate_up.{l}": w([{"mul": [2, "shared_inter"]}, "hidden"],
                                         moe + "shared_experts.gate_proj.weight",
                                         moe + "shared_experts.up_proj.weight"),
                f"shared_down.{l}": w(["hidden", "shared_inter"], moe + "shared_experts.down_proj.weight"),
            }
        else:
            out |= {f"gate_up_w.{l}": w([{"mul": [2, "inter"]}, "hidden"], pre + "mlp.gate_proj.weight",
                                        pre + "mlp.up_proj.weight"),
                    f"down_w.{l}": w(["hidden", "inter"], pre + "mlp.down_proj.weight")}
    return out


def constants(s: KimiShape) -> dict:
    c = {
        "hidden": s.hidden, "vocab": s.vocab, "inter": s.inter, "page_tokens": PAGE_TOKENS,
        "kda_layers": len(s.kda_layers), "kda_heads": s.kda_heads, "kda_dim": s.kda_dim, "conv": s.conv,
        "qkv": {"mul": ["kda_heads", "kda_dim"]},
        "mla_layers": len(s.mla_layers), "heads": s.heads, "kv_lora": s.kv_lora, "nope": s.nope, "rope": s.rope,
        "v_dim": s.v_dim, "latent": {"add": ["kv_lora", "rope"]},
        "q_dim": {"mul": ["heads", {"add": ["nope", "rope"]}]},
        "experts": s.experts, "local_experts": s.experts, "top_k": s.top_k, "moe_inter": s.moe_inter,
        "shared_inter": s.shared * s.moe_inter,
    }
    if s.q_lora is not None:
        c["q_lora"] = s.q_lora
    return c


SLOT_ALIGN = 2 << 20  # the pool's smallest chunk (runtime/paging.py MIN_CHUNK)


def padded(raw: int) -> int:
    """A state unit's bytes rounded so that units tile the pool's chunks: a power of two up to
    SLOT_ALIGN, a multiple of it above. The pool's chunk is a common multiple of every unit;
    unrounded, the real model's MLA page (7 layers x 576 x 2 bytes x 16 tokens) and KDA slot
    (~43 MiB) have one of ~90 GB."""
    return 1 << (raw - 1).bit_length() if raw <= SLOT_ALIGN else -(-raw // SLOT_ALIGN) * SLOT_ALIGN


CHUNK_SPAN = 64 << 20  # the pool's largest chunk (runtime/paging.py MAX_CHUNK): an unpadded token's units tile it


def token_padded(raw: int, slot: int) -> int:
    """An MLA token's bytes as the pages hold them: unpadded where a page of them (PAGE_TOKENS
    tokens), the pool's smallest chunk and the slot still tile a chunk of at most CHUNK_SPAN
    (or the slot's own multiple of SLOT_ALIGN, if larger), else padded(). The 8-layer Kimi shape's
    2 x 576 bf16 = 2,304 bytes a token: pages of 36,864 tile 18 MiB with its 18 MiB slot, where
    the power of two (4,096) held 1.78x the latents; the published 27 layers' 8,064 (a common
    multiple of 126 MiB with 2 MiB) keep 8,192 (1.6%). A stride of whole 128-byte lines either
    way: the kernels' 16-byte copies stay aligned."""
    span = max(CHUNK_SPAN, lcm(SLOT_ALIGN, slot))
    if raw % 128 == 0 and lcm(raw * PAGE_TOKENS, SLOT_ALIGN, slot) <= span:
        return raw
    return padded(raw)


def state_constants(s: KimiShape, elem: int, kda_rows: int = 0) -> dict:
    """The bytes of a token of the MLA cache (`elem` bytes an element) and of a KDA slot (f32),
    each padded (the kernels address units by these strides, the used part first). kda_rows:
    rows of dim f32 a head a layer kept after every layer's state and window (sm_90a's kda_tc:
    the current chunk's k, gc and v', 3 x 16)."""
    out = {}
    slot = 1
    if s.kda_layers:
        slot = padded(len(s.kda_layers) * (s.kda_heads * s.kda_dim ** 2 + (s.conv - 1) * 3 * s.qkv
                                           + kda_rows * s.qkv) * 4)
    if s.mla_layers:
        out["kv_token_bytes"] = token_padded(len(s.mla_layers) * (s.kv_lora + s.rope) * elem, slot)
    if s.kda_layers:
        out["kda_slot_bytes"] = slot
    return out


def states(s: KimiShape) -> dict:
    """The MLA cache, paged (a token's latent and key part in every MLA layer), and the KDA
    state, one slot a sequence (every KDA layer's recurrent state and convolution window)."""
    out = {}
    if s.mla_layers:
        out["kv"] = {"bytes_per_token": "kv_token_bytes"}
    if s.kda_layers:
        out["kda"] = {"bytes_per_seq": "kda_slot_bytes"}
    return out


# The expanded form's keys a prefill step (the var `keys`: the sm_90a build's workspaces, kx 16
# KiB a key at Kimi's shape; the cpu build declares it too, so its host loop schedules as the
# device's): the context, so that one sequence's prompt always fits, and at least
# KEYS_PER_ROW times the step's rows, so that short prompts pack a step whole (the serve
# workload's 4 prompts of 512 past a cached 256: 3,072 keys for 2,048 rows). The scheduler
# keeps a step's within it (Batch.keys); below the context (kx past 32-bit indexing: 262,144
# keys at Kimi's width), the host clips the context to it.
KEYS_PER_ROW = 8


def prompt_keys(s: KimiShape, context: int, tokens: int) -> int:
    cap = ((1 << 31) - 1) // (s.heads * (s.nope + s.v_dim)) // 16 * 16
    return min(max(context, KEYS_PER_ROW * tokens), cap)
