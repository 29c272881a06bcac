"""The states a host allocates, and the check of its memory against them (pure).

A manifest's paged state may declare a host layout (`states.<name>.host`): the dtype and the
axes of one page. A host that owns the memory (vLLM's KV cache) must hand over one tensor a
state, shaped [pages, *page axes], C-contiguous, of that dtype; its block table then indexes
those pages, as kern's own page tables do. Anything else is refused in one line naming both
layouts: kern's kernels read and write the host's pages in place, so a different order of the
same bytes would give wrong attention, not an error."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..manifest.expr import evaluate
from ..manifest.schema import DTYPE_BYTES
from ..manifest.verify import Verified
from .batch import HostError


@dataclass(frozen=True, slots=True)
class PageLayout:
    """One host-allocated paged state: its page's axes (name, size), outermost first."""

    state: str
    dtype: str
    axes: tuple[tuple[str, int], ...]

    @property
    def page_tokens(self) -> int:
        return dict(self.axes)["token"]

    @property
    def page_shape(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.axes)

    @property
    def page_bytes(self) -> int:
        return prod(self.page_shape) * DTYPE_BYTES[self.dtype]

    @property
    def token_elems(self) -> int:
        """Elements one token takes in a page (all axes but `token`)."""
        return prod(n for a, n in self.axes if a != "token")

    def describe(self) -> str:
        return "[pages]" + "".join(f"[{a} {n}]" for a, n in self.axes) + f" {self.dtype}"


@dataclass(frozen=True, slots=True)
class HostTensor:
    """What a host's memory for a state is, as kern sees it: shape, strides (elements), dtype
    (kern's dtype names), and where it is."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    address: int = 0

    def describe(self) -> str:
        strided = self.strides != _contiguous(self.shape)
        return ("".join(f"[{n}]" for n in self.shape) + f" {self.dtype}"
                + (f" strides {list(self.strides)}" if strided else ""))


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def host_layouts(v: Verified) -> dict[str, PageLayout]:
    """Every state of the manifest as a host must allocate it. A manifest with a state no host
    can hold (per-sequence or fixed-size, or paged without a host layout) is refused."""
    consts = v.constants
    out = {}
    for name, st in v.manifest.states.items():
        if st.bytes_per_token is None:
            raise HostError(f"states.{name} is not paged (bytes_per_seq or bytes): a host plugin serves deployments "
                            "whose states are all paged")
        if st.host is None:
            raise HostError(f"states.{name} declares no host layout (states.{name}.host): the deployment cannot run "
                            "inside a host that allocates its memory; regenerate it with a generator that declares one")
        out[name] = PageLayout(name, st.host.dtype, tuple((a.axis, evaluate(a.size, consts)) for a in st.host.page))
    return out


def check(layout: PageLayout, t: HostTensor) -> int:
    """The number of pages the host's tensor holds, if it has the layout; else HostError."""
    want = layout.page_shape
    fits = (t.dtype == layout.dtype and len(t.shape) == len(want) + 1 and tuple(t.shape[1:]) == want
            and t.strides == _contiguous(t.shape) and t.shape[0] >= 1)
    if not fits:
        raise HostError(f"the host's memory for state {layout.state!r} ({t.name}) is {t.describe()}; the deployment's "
                        f"pages are {layout.describe()}: refused (kern's kernels would read it in the wrong order)")
    return t.shape[0]
