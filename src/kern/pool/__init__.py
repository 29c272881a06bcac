"""The pool: paged states, state slots, prefix checkpoints, a host tier, one memory budget.

Pure host code: it decides and keeps books; plans say what the runtime does to memory.
"""

from kern.pool.errors import IntegrityError, PoolError, Violation
from kern.pool.handles import Checkpoint, Lease
from kern.pool.plans import Copy, FromHost, Map, MemoryPlan, ToHost, Unmap
from kern.pool.pool import Pool, check
from kern.pool.results import Evict, Granted, Match, NeverFits, Refusal, Remap, Wait
from kern.pool.states import Layout, LayoutError, StateDecl, UnitKind

__all__ = [
    "Checkpoint", "Copy", "Evict", "FromHost", "Granted", "IntegrityError", "Layout", "LayoutError",
    "Lease", "Map", "Match", "MemoryPlan", "NeverFits", "Pool", "PoolError", "Refusal", "Remap", "StateDecl",
    "ToHost", "UnitKind", "Unmap", "Violation", "Wait", "check",
]
