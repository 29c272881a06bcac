"""Manifest v1 as typed models.

Pydantic v2 was chosen over msgspec because a malformed manifest must list *every* problem
at once with its place (pydantic's ValidationError carries all errors with locations;
msgspec stops at the first), and because it generates the JSON Schema we commit. Its parse
cost is measured in bench/verify.py.

Validation is strict: JSON `true` is not the integer 1, `"3"` is not 3, `3.0` is not an
integer, and `"yes"` is not a bool. Pairs (ranges, ceil_div) are fixed-length lists, because
strict validation of a Python tuple wants a tuple and JSON has only arrays.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

SCHEMA_VERSION = 1


T = TypeVar("T")
Pair = Annotated[list[T], Field(min_length=2, max_length=2)]
"""[lo, hi] (JSON has no tuples)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# ---- expressions: a closed set (literal, name, mul, ceil_div, add) --------------------------


class Mul(_Strict):
    mul: list[Expr] = Field(min_length=2)


class Add(_Strict):
    add: list[Expr] = Field(min_length=2)


class CeilDiv(_Strict):
    ceil_div: Annotated[list[Expr], Field(min_length=2, max_length=2)]
    """[a, b]: a divided by b, rounded up."""


def _expr_tag(v: object) -> str | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return "int"
    if isinstance(v, str):
        return "name"
    if isinstance(v, dict) and len(v) == 1:
        key = next(iter(v))
        return key if key in ("mul", "add", "ceil_div") else None
    if isinstance(v, (Mul, Add, CeilDiv)):
        return {Mul: "mul", Add: "add", CeilDiv: "ceil_div"}[type(v)]
    return None


Expr = Annotated[
    Union[
        Annotated[int, Tag("int")],
        Annotated[str, Tag("name")],
        Annotated[Mul, Tag("mul")],
        Annotated[Add, Tag("add")],
        Annotated[CeilDiv, Tag("ceil_div")],
    ],
    Discriminator(
        _expr_tag,
        custom_error_type="expression",
        custom_error_message="expected an expression: an integer, a name, or one of "
        "{mul: [...]}, {add: [...]}, {ceil_div: [a, b]}",
    ),
]
"""An integer expression over constants, vars and (inside launches) scalar params."""

Mul.model_rebuild()
Add.model_rebuild()
CeilDiv.model_rebuild()

DType = Literal["bf16", "f16", "f32", "i8", "u8", "i32", "u32", "i64", "u64"]
DTYPE_BYTES: dict[str, int] = {
    "bf16": 2, "f16": 2, "f32": 4, "i8": 1, "u8": 1, "i32": 4, "u32": 4, "i64": 8, "u64": 8,
}
INPUT_ROLES = ("token", "position", "slot", "seq_len", "cu_seqlens", "temperature", "rng", "mask", "mask_row",
               "prompt_len")
OUTPUT_ROLES = ("tokens", "logits", "accepted")
Role = Literal["token", "position", "slot", "seq_len", "cu_seqlens", "temperature", "rng", "mask", "mask_row",
               "prompt_len", "tokens", "logits", "accepted"]
BufferKind = Literal["input", "output", "weight", "workspace", "carry", "peer", "pointers"]


class Target(_Strict):
    device: Literal["cpu", "cuda"]
    arch: str | None = None
    """For cuda: the compute architecture the modules were built for, e.g. sm_90a."""


class Var(_Strict):
    max: int
    """Upper bound of the var for one step. The minimum is 1."""


class BindSegment(_Strict):
    tensor: str
    fallback: str | None = None
    """Bound instead of `tensor` when the checkpoint has no tensor of that name (a tied LM head:
    the checkpoint's own lm_head when it ships one, else the embedding, as transformers loads it)."""
    rows: Pair[int] | None = None
    """Half-open row range [lo, hi) of the checkpoint tensor (its first axis)."""
    cols: Pair[int] | None = None
    """Half-open column range [lo, hi) of the checkpoint tensor (its last axis)."""


class Domain(_Strict):
    range: Pair[Expr] | None = None
    """Values lie in [lo, hi)."""
    index_into: str | None = None
    """The values are page indices into this paged state."""
    stride: Expr | None = None
    """Tokens per page of the paged state indexed (with index_into)."""


class Buffer(_Strict):
    kind: BufferKind
    dtype: DType
    shape: list[Expr]
    bind: list[BindSegment] | None = None
    """Weights: checkpoint tensors laid end to end, cast to dtype."""
    fill: Role | None = None
    """The serving role of an input or output buffer."""
    domain: Domain | None = None
    of: str | None = None
    """Peer buffers: the exported buffer whose other-rank addresses this holds."""
    entries: list[str] | None = None
    """Pointers buffers: the buffers whose device addresses fill the table, in order."""


class PageAxis(_Strict):
    axis: str
    size: Expr


class HostLayout(_Strict):
    """How a host that allocates a paged state (an inference server kern runs inside) must lay
    out one page: its element dtype and its axes, outermost first; exactly one axis is `token`
    (its size is the page's tokens). Sizes times the dtype's bytes make bytes_per_token a token."""

    dtype: DType
    page: list[PageAxis] = Field(min_length=1)


class State(_Strict):
    bytes_per_token: Expr | None = None
    bytes_per_seq: Expr | None = None
    bytes: Expr | None = None
    host: HostLayout | None = None
    """A paged state a host may allocate itself: the page layout its memory must have."""


class Module(_Strict):
    source: str
    """Path relative to the manifest, https://..., or hf:org/repo/path[@rev]."""
    sha256: str


class ValueArg(_Strict):
    value: Union[int, float, str, Mul, Add, CeilDiv]
    """A literal number or an integer expression (over vars and constants)."""


class Launch(_Strict):
    entry: str
    """A function of the module, or extern:<library call> (no module, no geometry)."""
    module: str | None = None
    grid: list[Expr] = Field(default_factory=lambda: [1])
    block: list[Expr] = Field(default_factory=lambda: [1])
    shared_mem: Expr = 0
    cooperative: bool = False
    pdl: bool = False
    args: list[Union[str, ValueArg]] | None = None
    """Param names or literal values, in the kernel's order. Default: all params in order."""
    writes: list[str] | None = None
    """The params this launch writes. Default: every out/inout param it is passed."""
    tiles: dict[str, list[int]] | None = None
    """Buffer params this launch reads in boxes of [rows, elements] through the GPU's tensor memory
    access unit: on cuda the kernel gets the address of a tensor map of the view, not the view's."""


class Impl(_Strict):
    launches: list[Launch] = Field(min_length=1)


class Op(_Strict):
    params: list[str]
    """Typed params: "name: in buffer<bf16>", "name: inout state", "name: i32"."""
    impl: Impl


class BufArg(_Strict):
    buf: str
    offset: Expr | None = None
    """Element offset of a view into the buffer."""
    shape: list[Expr] | None = None
    """Shape of the view (default: the buffer's shape, less the offset's leading rows)."""


class StateArg(_Strict):
    state: str


def _arg_tag(v: object) -> str | None:
    if isinstance(v, dict):
        for key in ("buf", "state", "value"):
            if key in v:
                return key
        return None
    return {BufArg: "buf", StateArg: "state", ValueArg: "value"}.get(type(v))


Arg = Annotated[
    Union[
        Annotated[BufArg, Tag("buf")],
        Annotated[StateArg, Tag("state")],
        Annotated[ValueArg, Tag("value")],
    ],
    Discriminator(
        _arg_tag,
        custom_error_type="call_arg",
        custom_error_message="expected a call argument: {buf: name}, {state: name} or {value: v}",
    ),
]


class Call(_Strict):
    op: str
    args: list[Arg]


class Batch(_Strict):
    groups: Expr
    """How many sequences one call steps."""
    rows: Expr
    """How many rows (tokens) one call steps in all."""
    reach: str | None = None
    """A var the host sets each step to the positions its rows reach (the largest position + 1,
    rounded up to a power of two): launches sized by the context a step really has (decode
    attention's splits), one graph a bucket. Unset, it stays at its maximum."""
    keys: str | None = None
    """A var the host sets each step to the prompt keys its rows attend over: for each sequence
    with a prompt row in the step (role prompt_len), the positions up to its last prompt row,
    summed. Launches and workspaces sized by it (a model that expands a prompt's keys before
    attending, as MLA's non-absorbed form does); the scheduler keeps each step within its
    maximum, and a deployment's context is at most that maximum (one prompt always fits)."""


class Program(_Strict):
    calls: list[Call]
    batch: Batch | None = None
    graph: bool = False
    once: bool = False


class Topology(_Strict):
    ranks: int = 1
    rank: int = 0
    groups: dict[str, list[list[int]]] = Field(default_factory=dict)


class Manifest(_Strict):
    schema_version: Literal[1]
    model: str
    target: Target
    constants: dict[str, Expr] = Field(default_factory=dict)
    vars: dict[str, Var] = Field(default_factory=dict)
    buffers: dict[str, Buffer] = Field(default_factory=dict)
    states: dict[str, State] = Field(default_factory=dict)
    modules: dict[str, Module] = Field(default_factory=dict)
    ops: dict[str, Op] = Field(default_factory=dict)
    programs: dict[str, Program] = Field(default_factory=dict)
    topology: Topology = Field(default_factory=Topology)

    def calls(self):
        """Every call with its place, e.g. ("programs.decode.calls[12] (op rms_norm)", call)."""
        for pname, prog in self.programs.items():
            for i, call in enumerate(prog.calls):
                yield f"programs.{pname}.calls[{i}] (op {call.op})", call
