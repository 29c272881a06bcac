"""The pieces every family's manifests are written with, whatever the family and the target:
a buffer, a weight bound to checkpoint tensors, a call's arguments (a buffer by name, a literal
value), the embedding and LM head as a checkpoint binds them, the sampling inputs and the
context bound."""

from __future__ import annotations

from .errors import ConfigError



def buffer(shape, kind="workspace", dtype="f32", **kw) -> dict:
    """A manifest buffer: its kind, dtype and shape (expressions), and any other field."""
    return {"kind": kind, "dtype": dtype, "shape": shape, **kw}


def weight(shape, *tensors, dtype="f32") -> dict:
    """A weight buffer bound to checkpoint tensors, laid end to end in the order given."""
    return buffer(shape, "weight", dtype, bind=[{"tensor": t} for t in tensors])


def buffer_arg(name: str) -> dict:
    """A call's argument naming a buffer."""
    return {"buf": name}


def value_arg(x) -> dict:
    """A call's argument holding a literal value (or an expression over vars)."""
    return {"value": x}


EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def embed_and_head(tied: bool, dtype: str) -> dict:
    """The embedding and the LM head as weight buffers, bound as transformers loads them.
    `tied`: transformers ties the pair on load, which it does where config.json's
    tie_word_embeddings is true and the family's transformers class names lm_head.weight tied to
    the embedding (its _tied_weights_keys: llama's and Qwen3-MoE's do; KimiLinearForCausalLM's
    names nothing, so a Kimi-Linear checkpoint is never tied, whatever its config says).
    Tied, each binds its own tensor when the checkpoint ships it and the other's where it does
    not, as transformers' tie_weights does: a pair that differs (transformers 5.24 saves
    Kimi-Linear with a tying config and its own head) stays untied and is served as shipped, a
    checkpoint that ships one of the two reads it for both. Untied, each binds only its own: a
    checkpoint without it is refused naming it, where transformers would start it random."""
    def w(tensor, other):
        return buffer(["vocab", "hidden"], "weight", dtype,
                      bind=[{"tensor": tensor, **({"fallback": other} if tied else {})}])

    return {"embed": w(EMBED, HEAD), "lm_head": w(HEAD, EMBED)}


# The var counting the rows of a step's token masks (a grammar's, one a constrained row): the
# host sets it to the rows it fills (bucketed), so a step without one copies up a single row.
MASK_ROWS = "mask_rows"


def program_batch(groups, rows, stepping: bool) -> dict:
    """A program's batch: a stepping program (decode, its graphs) takes one row a sequence, its
    reach bucketed; a prefill program takes ragged rows."""
    return {"groups": groups, "rows": 1, "reach": "reach"} if stepping else {"groups": groups, "rows": rows}


def sampling_inputs(p: str, groups) -> dict:
    """Each sequence's temperature (0: greedy), the 64-bit key of its draw, as two i32, and its
    token mask: `mask` the step's masked rows' bitmasks (bit t % 32 of word t // 32 allows token
    t, llguidance's layout), `mask_row` each sequence's row of them + 1 (0: unmasked)."""
    return {p + "temperature": buffer([groups], "input", "f32", fill="temperature"),
            p + "rng": buffer([groups, 2], "input", "i32", fill="rng"),
            p + "mask": buffer([MASK_ROWS, {"ceil_div": ["vocab", 32]}], "input", "i32", fill="mask"),
            p + "mask_row": buffer([groups], "input", "i32", fill="mask_row",
                                   domain={"range": [0, {"add": [MASK_ROWS, 1]}]})}


def sampling_args(p: str) -> list[dict]:
    """The sample op's inputs after the logits: temperature, key, mask, mask_row."""
    return [buffer_arg(p + "temperature"), buffer_arg(p + "rng"), buffer_arg(p + "mask"), buffer_arg(p + "mask_row")]


def context_of(s, context: int | None, limit: int | None = None) -> int:
    """The context bound of a manifest: the model's max_position_embeddings (`s.max_pos`,
    clipped to the kernels' limit) unless given; a given one must be within both."""
    top = min(s.max_pos, limit) if limit else s.max_pos
    if context is None:
        return top
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= top:
        why = f"max_position_embeddings {s.max_pos}" + (f", the kernels {limit}" if limit else "")
        raise ConfigError(f"context {context!r}: must be an integer in [1, {top}] ({why})")
    return context


# The most rows a CUDA step may have: workspaces hold a step's rows times a row's widest
# intermediate (Kimi-Linear's 8 experts x 2,048 gate/up columns, Llama-3.1-8B's 28,672), indexed
# in 32 bits: 65,536 rows keep them under 2^31 at every shipped shape.
MAX_STEP_TOKENS = 65536


def tokens_of(tokens, limit: int | None = None) -> int:
    """A manifest's prompt rows a step (its `tokens` var: kern's --step-tokens), checked."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1 or (limit and tokens > limit):
        top = f"[1, {limit:,}] (the kernels' 32-bit workspace offsets)" if limit else "at least 1"
        raise ConfigError(f"tokens {tokens!r}: a step's prompt rows must be an integer in {top}")
    return tokens
