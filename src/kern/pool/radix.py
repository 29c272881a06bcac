"""The prefix index: a radix tree over token ids whose nodes hold checkpoints.

Edges are token tuples; a node's `depth` is the number of tokens from the root to its end.
A checkpoint sits at the node where its tokens end. Every leaf holds a checkpoint, and a node
without one has at least two children (or is the root). `dev_below` counts device-resident
checkpoints strictly below a node: eviction takes device checkpoints with none below them
(leaves first), so nothing ever strands a descendant.
"""

from __future__ import annotations

from typing import Sequence

from kern.pool.handles import Checkpoint


class Node:
    __slots__ = ("edge", "children", "parent", "depth", "ckpt", "tick", "dev_below", "serial")

    def __init__(self, edge: tuple[int, ...], parent: Node | None, depth: int, serial: int) -> None:
        self.edge = edge
        self.children: dict[int, Node] = {}
        self.parent = parent
        self.depth = depth
        self.ckpt: Checkpoint | None = None
        self.tick = 0
        self.dev_below = 0
        self.serial = serial  # creation order: breaks LRU ties deterministically

    def has_device(self) -> bool:
        return (self.ckpt is not None and self.ckpt.units is not None) or self.dev_below > 0


def common(a: Sequence[int], a0: int, b: tuple[int, ...]) -> int:
    """Length of the common prefix of a[a0:] and b (binary search over slice compares)."""
    n = min(len(b), len(a) - a0)
    if tuple(a[a0 : a0 + n]) == b[:n]:
        return n
    lo, hi = 0, n  # a[a0:a0+lo] == b[:lo], and hi mismatches
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tuple(a[a0 : a0 + mid]) == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class RadixTree:
    def __init__(self) -> None:
        self._serial = 0
        self.root = self._node((), None, 0)
        self.count = 0  # checkpoints in the tree

    def _node(self, edge: tuple[int, ...], parent: Node | None, depth: int) -> Node:
        self._serial += 1
        return Node(edge, parent, depth, self._serial)

    def walk(self, q: Sequence[int]) -> tuple[Node, Node | None, int]:
        """Follow q down the tree: (last node fully matched, child the match stops inside or
        None, tokens matched)."""
        node, pos, n = self.root, 0, len(q)
        while pos < n:
            child = node.children.get(q[pos])
            if child is None:
                return node, None, pos
            e = child.edge
            if tuple(q[pos : pos + len(e)]) == e:
                node, pos = child, pos + len(e)
                continue
            return node, child, pos + common(q, pos, e)
        return node, None, pos

    def insert(self, tokens: tuple[int, ...]) -> Node:
        """The node where `tokens` end, splitting an edge if needed."""
        node, pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                leaf = self._node(tokens[pos:], node, len(tokens))
                node.children[tokens[pos]] = leaf
                return leaf
            e = child.edge
            k = common(tokens, pos, e)
            if k == len(e):
                node, pos = child, pos + k
                continue
            mid = self._node(e[:k], node, pos + k)
            mid.dev_below = child.dev_below + (child.ckpt is not None and child.ckpt.units is not None)
            child.edge = e[k:]
            child.parent = mid
            mid.children[e[k]] = child
            node.children[e[0]] = mid
            node, pos = mid, pos + k
        return node

    def prune(self, node: Node) -> Node | None:
        """Remove `node` if it no longer earns its place (no checkpoint and < 2 children);
        returns the parent whose child set changed, if any."""
        if node is self.root or node.ckpt is not None:
            return None
        parent = node.parent
        if parent is None:  # only the root has none, and the root stays
            return None
        if not node.children:
            del parent.children[node.edge[0]]
            node.parent = None
            return parent
        if len(node.children) == 1:
            (child,) = node.children.values()
            child.edge = node.edge + child.edge
            child.parent = parent
            parent.children[node.edge[0]] = child
            node.parent = None
            node.children = {}
        return None

    def path(self, node: Node) -> tuple[int, ...]:
        parts: list[tuple[int, ...]] = []
        n: Node | None = node
        while n is not None:
            parts.append(n.edge)
            n = n.parent
        return tuple(t for e in reversed(parts) for t in e)

    def nodes(self) -> list[Node]:
        """Every node, parents before children, in child insertion order (deterministic)."""
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(list(n.children.values())))
        return out
