"""The verifier's checks: pure functions over the manifest that yield problems.

One file per group, numbered as in docs/architecture.md ("What kern verify checks"); ALL runs them in
that order. Each problem names its place. Expressions are bounded by interval arithmetic over
the var ranges [1, max] (expr.interval): "at the var minima" is the least value an expression
can take, "at the var maxima" the greatest."""

from .buffers import buffers, memory
from .calls import calls
from .dataflow import dataflow
from .launches import launches
from .modules import modules
from .programs import programs
from .schema import schema
from .states import states
from .topology import topology
from .unused import unused
from .vars import vars_and_constants

ALL = (schema, vars_and_constants, buffers, states, memory, modules, launches, dataflow, calls, programs,
       unused, topology)
