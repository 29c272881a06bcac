"""The pool: paged states, state slots, prefix checkpoints, a host tier, one memory budget.

Pure host code: it decides and keeps books; plans say what the runtime does to memory.
"""

from kern.pool.executor import CpuExecutor, Executor, ExecutorError
from kern.pool.integrity import IntegrityError, Problem, check
from kern.pool.lease import Checkpoint, Lease
from kern.pool.plans import Copy, FromHost, Map, Plan, ToHost, Unmap
from kern.pool.pool import Pool, PoolError
from kern.pool.results import Evict, Granted, Match, NeverFits, Refusal, Remap, Wait
from kern.pool.states import Layout, LayoutError, StateDecl, UnitKind

__all__ = [
    "Checkpoint", "Copy", "CpuExecutor", "Evict", "Executor", "ExecutorError", "FromHost",
    "Granted", "IntegrityError", "Layout", "LayoutError", "Lease", "Map", "Match", "NeverFits",
    "Plan", "Pool", "PoolError", "Problem", "Refusal", "Remap", "StateDecl", "ToHost", "UnitKind",
    "Unmap", "Wait", "check",
]
