"""The prefix index: checkpoints filed in a radix tree by their tokens, prefix lookup, and
the least-recently-used order eviction follows.

LRU runs on a tick counter, not a clock: a match or a new checkpoint touches the path from
its node to the root. Eviction candidates sit in two lazy heaps keyed (tick, node serial), so
ties go to the oldest node; an entry whose node was touched since, or no longer qualifies,
is skipped when it reaches the top.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Sequence

from kern.pool.errors import PoolError
from kern.pool.handles import Checkpoint
from kern.pool.radix import Node, RadixTree
from kern.pool.results import Match

NO_MATCH = Match(0, None)


class PrefixIndex:
    def __init__(self) -> None:
        self.tree = RadixTree()
        self.nodes: dict[int, Node] = {}  # checkpoint id -> the node it is filed at
        self.tick = 0
        self.ids = 0
        self.dev_heap: list[tuple[int, int, Node]] = []  # device checkpoints with none below
        self.host_heap: list[tuple[int, int, Node]] = []  # parked copies that may go

    def node_of(self, ckpt: Checkpoint, where: str) -> Node:
        """The node of one of this index's live checkpoints; PoolError for any other."""
        n = self.nodes.get(ckpt.id) if isinstance(ckpt, Checkpoint) else None
        if n is None or n.ckpt is not ckpt:
            raise PoolError(f"{where}: {ckpt!r} is not a live checkpoint of this pool")
        return n

    def match(self, prompt: Sequence[int], whole_only: bool) -> Match:
        """The longest cached prefix of `prompt[:-1]` (pure). `whole_only`: only a whole
        checkpoint will do (a per-sequence state holds exactly its checkpoint's tokens)."""
        q = tuple(prompt[:-1])
        node, inside, pos = self.tree.walk(q)
        if whole_only:
            n: Node | None = node
            while n is not None and n.ckpt is None:
                n = n.parent
            if n is None or n.depth == 0:
                return NO_MATCH
            return Match(n.depth, n.ckpt)
        if pos == 0:
            return NO_MATCH
        return Match(pos, _pick(inside if inside is not None else node))

    # -- filing ---------------------------------------------------------------------------
    def file(self, tokens: tuple[int, ...], units: tuple[tuple[int, ...], ...], node: Node) -> Checkpoint:
        """A new checkpoint at `node` (the node where `tokens` end, from `tree.insert`)."""
        self.ids += 1
        ckpt = Checkpoint(self.ids, tokens, units)
        node.ckpt = ckpt
        self.nodes[ckpt.id] = node
        self.tree.count += 1
        return ckpt

    def forget(self, ckpt: Checkpoint) -> None:
        """Take a checkpoint out of the tree, pruning the nodes that no longer earn a place."""
        node = self.nodes.pop(ckpt.id)
        node.ckpt = None
        self.tree.count -= 1
        n = self.tree.prune(node)
        while n is not None:
            self.push(n)  # it may have become a leaf
            n = self.tree.prune(n)

    def device_changed(self, node: Node, d: int) -> None:
        """The checkpoint at `node` gained (+1) or lost (-1) its device units."""
        n = node.parent
        while n is not None:
            n.dev_below += d
            if n.dev_below == 0 and n.ckpt is not None:
                self.push(n)
            n = n.parent

    def checkpoints(self) -> list[Checkpoint]:
        return [n.ckpt for n in self.tree.nodes() if n.ckpt is not None]

    # -- recency and eviction candidates --------------------------------------------------
    def touch(self, node: Node) -> None:
        self.tick += 1
        n: Node | None = node
        while n is not None:
            if n.ckpt is not None:
                n.tick = self.tick
                self.push(n)
            n = n.parent

    def push(self, n: Node) -> None:
        c = n.ckpt
        if c is None:
            return
        if c.units is not None and n.dev_below == 0:
            heappush(self.dev_heap, (n.tick, n.serial, n))
        if c.host is not None and (c.units is not None or not n.children):
            heappush(self.host_heap, (n.tick, n.serial, n))

    def pop_device(self) -> Checkpoint | None:
        """The least recently used device checkpoint with no device checkpoint below it."""
        while self.dev_heap:
            tick, _, n = heappop(self.dev_heap)
            c = n.ckpt
            if c is not None and n.tick == tick and c.units is not None and n.dev_below == 0:
                return c
        return None

    def pop_host(self) -> Checkpoint | None:
        """The least recently used parked copy whose dropping strands nothing: its checkpoint
        is still on the device, or it is a leaf."""
        while self.host_heap:
            tick, _, n = heappop(self.host_heap)
            c = n.ckpt
            if c is not None and n.tick == tick and c.host is not None and (c.units is not None or not n.children):
                return c
        return None


def _pick(n: Node) -> Checkpoint:
    """A checkpoint at or below n: on the device if any is, else parked (every leaf holds one)."""
    want_device = n.has_device()
    while True:
        c = n.ckpt
        if c is not None and (c.units is not None or not want_device):
            return c
        for child in n.children.values():
            if not want_device or child.has_device():
                n = child
                break
