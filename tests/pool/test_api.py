"""Pool's public API is a contract with its users (runtime/paging.py, api.py, the scheduler,
bench/pool.py): this table is it. Changing a name, a parameter or a result type fails here
first, so the change is made on purpose and told to them."""

from __future__ import annotations

import inspect

from kern.pool import Pool

API = {
    "__init__": "(self, budget_bytes: 'int', states: 'Sequence[StateDecl]', page_tokens: 'int', *, "
    "chunk_bytes: 'int' = 2097152, host_bytes: 'int' = 0, split: 'Mapping[str, int] | None' = None) -> 'None'",
    "match": "(self, prompt: 'Sequence[int]') -> 'Match'",
    "shared": "(self, prompt: 'Sequence[int]') -> 'int'",
    "lease": "(self, prompt: 'Sequence[int]', reserve: 'int', *, cache: 'bool' = True) -> 'Granted | Remap | Refusal'",
    "fork": "(self, parent: 'Lease', reserve: 'int') -> 'Granted | Remap | Refusal'",
    "extend": "(self, lease: 'Lease', tokens: 'Sequence[int]', ahead: 'int' = 0) -> 'Remap | Refusal | None'",
    "advance": "(self, leases: 'Sequence[Lease]', tokens: 'Sequence[int]') -> 'list[tuple[Lease, Remap | Refusal]]'",
    "checkpoint": "(self, lease: 'Lease') -> 'Checkpoint | None'",
    "free": "(self, lease: 'Lease') -> 'None'",
    "remapped": "(self, plan: 'MemoryPlan') -> 'None'",
    "park": "(self, ckpt: 'Checkpoint') -> 'MemoryPlan | Evict | NeverFits'",
    "drop": "(self, ckpt: 'Checkpoint') -> 'None'",
    "evict_one": "(self) -> 'MemoryPlan | None'",
    "clear": "(self) -> 'None'",
    "checkpoints": "(self) -> 'list[Checkpoint]'",
    "usage": "(self) -> 'dict[str, dict[str, int]]'",
    "host_traffic": "(self) -> 'dict[str, int]'",
    "check": "(self) -> 'None'",
}


def test_the_public_api_is_the_table():
    public = {n for n in dir(Pool) if not n.startswith("_")} | {"__init__"}
    assert public == set(API) | {"leases"}
    for name, want in API.items():
        assert str(inspect.signature(getattr(Pool, name))) == want, name
    assert isinstance(Pool.leases, property) and Pool.leases.fget.__annotations__["return"] == "list[Lease]"
    attributes = {n for n in vars(Pool(8 * 128, [], 4, chunk_bytes=128)) if not n.startswith("_")}
    assert attributes == {"layout", "initial_plan"}
