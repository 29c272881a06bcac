"""What the llama family's manifests share, whatever the target: buffer and argument helpers,
the checkpoint's tensors as weight buffers, the sampling inputs and the context bound."""

from __future__ import annotations

from ..config import ConfigError, Shape

PAGE_TOKENS = 16


def buf(shape, kind="workspace", dtype="f32", **kw):
    return {"kind": kind, "dtype": dtype, "shape": shape, **kw}


def _w(shape, *tensors):
    return buf(shape, "weight", bind=[{"tensor": t} for t in tensors])


EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def embed_and_head(tied: bool, dtype: str) -> dict:
    """The embedding and the LM head as weight buffers. Tied (tie_word_embeddings), each binds its
    own tensor when the checkpoint ships it and the other's where it does not, as transformers
    loads such a checkpoint: a config that ties yet an lm_head.weight that differs from the
    embedding (transformers 5.24 saves Kimi-Linear so) is served with that lm_head.weight, which
    transformers keeps untied; a tied checkpoint that ships only the embedding reads it twice."""
    def w(tensor, other):
        return buf(["vocab", "hidden"], "weight", dtype,
                   bind=[{"tensor": tensor, **({"fallback": other} if tied else {})}])

    return {"embed": w(EMBED, HEAD), "lm_head": w(HEAD, EMBED)}


def weight_buffers(s: Shape, dtype: str) -> dict:
    """Every checkpoint tensor as a weight buffer of dtype: q/k/v fused into one, gate/up into
    one, the embedding and the LM head as embed_and_head binds them."""
    def w(shape, *tensors):
        return {**_w(shape, *tensors), "dtype": dtype}

    head = embed_and_head(s.tied, dtype)
    out = {"embed": head["embed"], "final_norm": w(["hidden"], "model.norm.weight"), "lm_head": head["lm_head"]}
    for l in range(s.layers):
        pre = f"model.layers.{l}."
        out[f"ln1.{l}"] = w(["hidden"], pre + "input_layernorm.weight")
        out[f"ln2.{l}"] = w(["hidden"], pre + "post_attention_layernorm.weight")
        out[f"qkv_w.{l}"] = w(["qkv_dim", "hidden"], *(pre + f"self_attn.{p}_proj.weight" for p in "qkv"))
        out[f"o_w.{l}"] = w(["hidden", "q_dim"], pre + "self_attn.o_proj.weight")
        out[f"gate_up_w.{l}"] = w([{"mul": [2, "inter"]}, "hidden"], pre + "mlp.gate_proj.weight",
                                  pre + "mlp.up_proj.weight")
        out[f"down_w.{l}"] = w(["hidden", "inter"], pre + "mlp.down_proj.weight")
        if s.qk_norm:
            out[f"q_norm.{l}"] = w(["head_dim"], pre + "self_attn.q_norm.weight")
            out[f"k_norm.{l}"] = w(["head_dim"], pre + "self_attn.k_norm.weight")
    return out


def b(name):
    return {"buf": name}


def v(x):
    return {"value": x}


# The var counting the rows of a step's token masks (a grammar's, one a constrained row): the
# host sets it to the rows it fills (bucketed), so a step without one copies up a single row.
MASK_ROWS = "mask_rows"


def sampling_inputs(p: str, groups) -> dict:
    """Each sequence's temperature (0: greedy), the 64-bit key of its draw, as two i32, and its
    token mask: `mask` the step's masked rows' bitmasks (bit t % 32 of word t // 32 allows token
    t, llguidance's layout), `mask_row` each sequence's row of them + 1 (0: unmasked)."""
    return {p + "temperature": buf([groups], "input", "f32", fill="temperature"),
            p + "rng": buf([groups, 2], "input", "i32", fill="rng"),
            p + "mask": buf([MASK_ROWS, {"ceil_div": ["vocab", 32]}], "input", "i32", fill="mask"),
            p + "mask_row": buf([groups], "input", "i32", fill="mask_row",
                                domain={"range": [0, {"add": [MASK_ROWS, 1]}]})}


def sampling_args(p: str) -> list[dict]:
    """The sample op's inputs after the logits: temperature, key, mask, mask_row."""
    return [b(p + "temperature"), b(p + "rng"), b(p + "mask"), b(p + "mask_row")]


def context_of(s: Shape, context: int | None, limit: int | None = None) -> int:
    """The context bound of a manifest: the model's max_position_embeddings (clipped to the
    kernels' limit) unless given; a given one must be within both."""
    top = min(s.max_pos, limit) if limit else s.max_pos
    if context is None:
        return top
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= top:
        why = f"max_position_embeddings {s.max_pos}" + (f", the kernels {limit}" if limit else "")
        raise ConfigError(f"context {context!r}: must be an integer in [1, {top}] ({why})")
    return context
