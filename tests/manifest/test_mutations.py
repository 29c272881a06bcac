"""Properties: verify never raises, and names a problem for every mutation that breaks an
invariant; a manifest that verifies never crashes the engine with anything but a KernError
naming its place.

Hypothesis mutates the tiny generated manifest one way at a time: delete, rename or retype a
field; swap two call arguments; change a shape; point a call at a missing buffer; truncate the
text. Each mutation knows whether it must break the manifest (an oracle from the manifest's own
data); every mutation, breaking or not, must verify without an exception or an internal error.

The last tests load and step every mutation that verifies, on a tiny random checkpoint: it runs,
or it stops with a KernError whose message names a place (a call, a buffer, a state, a module)."""

from __future__ import annotations

import copy
import json
import random
import re
import resource
from pathlib import Path

import numpy as np
import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kern.manifest.types import parse_param
from kern.manifest.verify import verify_text

NAME_MAPS = {("constants",), ("vars",), ("buffers",), ("states",), ("modules",), ("ops",), ("programs",),
             ("topology", "groups")}
OPTIONAL = {"fill", "domain", "batch", "once", "graph", "arch", "topology"}
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def walk(node, path=()):
    """Every (path, value) in a JSON tree, the root excluded."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield path + (k,), v
            yield from walk(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield path + (i,), v
            yield from walk(v, path + (i,))


def parent(d, path):
    for k in path[:-1]:
        d = d[k]
    return d


def verify(d_or_text):
    text = d_or_text if isinstance(d_or_text, str) else json.dumps(d_or_text)
    r = verify_text(text)  # must not raise
    assert not [p for p in r.problems if "internal error" in p.what], r.problems
    return r.problems


def outcome(breaks: bool, found, what: str) -> None:
    if breaks:
        assert found, f"{what}: the manifest still verified"


@given(data=st.data())
@SETTINGS
def test_delete_a_field(tiny_dict, data):
    paths = [p for p, _ in walk(tiny_dict)]
    path = data.draw(st.sampled_from(paths))
    d = copy.deepcopy(tiny_dict)
    holder = parent(d, path)
    del holder[path[-1]]
    if isinstance(path[-1], int):  # a list item: only call args and op params have a fixed count
        breaks = path[-2] in ("args", "params") and "launches" not in path
    elif path[:-1] in NAME_MAPS:  # every declared name is used: deleting one dangles or orphans
        breaks = True
    else:
        breaks = path[-1] not in OPTIONAL
    outcome(breaks, verify(d), f"delete {path}")


@given(data=st.data())
@SETTINGS
def test_rename_a_field(tiny_dict, data):
    paths = [p for p, _ in walk(tiny_dict) if isinstance(p[-1], str)]
    path = data.draw(st.sampled_from(paths))
    d = copy.deepcopy(tiny_dict)
    holder = parent(d, path)
    holder[path[-1] + "_x"] = holder.pop(path[-1])
    breaks = path[:-1] != ("programs",)  # programs are not referred to by name; all else is
    outcome(breaks, verify(d), f"rename {path}")


def retyped(v):
    """A value of another JSON type, wrong wherever v stood."""
    if isinstance(v, bool):
        return "true"
    if isinstance(v, int):
        return {"zz": 1}
    if isinstance(v, float):
        return [v]
    if isinstance(v, str):
        return []
    if isinstance(v, list):
        return "x"
    return [1]


@given(data=st.data())
@SETTINGS
def test_retype_a_field(tiny_dict, data):
    paths = [p for p, _ in walk(tiny_dict)]
    path = data.draw(st.sampled_from(paths))
    d = copy.deepcopy(tiny_dict)
    holder = parent(d, path)
    holder[path[-1]] = retyped(holder[path[-1]])
    outcome(True, verify(d), f"retype {path}")


def fits(param_text: str, arg: dict, buffers: dict) -> bool:
    """Whether a call argument satisfies a param, as the verifier must judge it."""
    p = parse_param(param_text)
    if p.kind == "buffer":
        b = buffers.get(arg.get("buf"))
        return b is not None and b["dtype"] == p.dtype and not (p.writes and b["kind"] in ("input", "weight"))
    if p.kind == "state":
        return "state" in arg
    return "value" in arg and (p.dtype == "f32" or not isinstance(arg["value"], float))


@given(data=st.data())
@SETTINGS
def test_swap_call_arguments(tiny_dict, data):
    sites = [(pn, ci) for pn, prog in tiny_dict["programs"].items() for ci, c in enumerate(prog["calls"])
             if len(c["args"]) >= 2]
    pn, ci = data.draw(st.sampled_from(sites))
    d = copy.deepcopy(tiny_dict)
    call = d["programs"][pn]["calls"][ci]
    i, j = data.draw(st.lists(st.integers(0, len(call["args"]) - 1), min_size=2, max_size=2, unique=True))
    args = call["args"]
    args[i], args[j] = args[j], args[i]
    params = d["ops"][call["op"]]["params"]
    breaks = not (fits(params[i], args[i], d["buffers"]) and fits(params[j], args[j], d["buffers"]))
    outcome(breaks, verify(d), f"swap {pn}.calls[{ci}] args {i} and {j}")


@given(data=st.data())
@SETTINGS
def test_change_a_shape(tiny_dict, data):
    name = data.draw(st.sampled_from(sorted(tiny_dict["buffers"])))
    d = copy.deepcopy(tiny_dict)
    shape = d["buffers"][name]["shape"]
    i = data.draw(st.integers(0, len(shape) - 1))
    new = data.draw(st.one_of(st.integers(-5, 0), st.just(2**62), st.integers(1, 10**6),
                              st.sampled_from(sorted(d["vars"]) + sorted(d["constants"]))))
    shape[i] = new
    breaks = isinstance(new, int) and (new < 1 or new == 2**62)
    outcome(breaks, verify(d), f"shape of {name}[{i}] = {new!r}")


@given(data=st.data())
@SETTINGS
def test_point_a_call_at_a_missing_buffer(tiny_dict, data):
    sites = [(pn, ci, ai) for pn, prog in tiny_dict["programs"].items() for ci, c in enumerate(prog["calls"])
             for ai, a in enumerate(c["args"]) if "buf" in a]
    pn, ci, ai = data.draw(st.sampled_from(sites))
    d = copy.deepcopy(tiny_dict)
    d["programs"][pn]["calls"][ci]["args"][ai]["buf"] = "no_such_buffer"
    found = verify(d)
    assert f"programs.{pn}.calls[{ci}] (op {d['programs'][pn]['calls'][ci]['op']}) arg {ai}" in [p.where for p in found]


@given(data=st.data())
@SETTINGS
def test_truncate_the_text(tiny_dict, data):
    text = json.dumps(tiny_dict, indent=1)
    cut = data.draw(st.integers(0, len(text.rstrip()) - 1))
    found = verify(text[:cut])
    assert len(found) == 1 and found[0].where == "manifest"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.sampled_from(["tokens", "seqs", "context", "hidden", "d_x", "kv", "kernels", "linear", "x", ""]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["mul", "add", "ceil_div", "buf", "state", "value", "offset", "shape", "max", "x"]),
        inner, max_size=3),
    max_leaves=12)


@given(data=st.data())
@SETTINGS
def test_replace_anything_with_any_json(tiny_dict, data):
    """No oracle here: whatever stands anywhere, verify answers with problems, never a crash."""
    paths = [p for p, _ in walk(tiny_dict)]
    d = copy.deepcopy(tiny_dict)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        try:
            parent(d, path)[path[-1]] = data.draw(JSON)
        except (KeyError, IndexError, TypeError):  # an earlier replacement removed this place
            pass
    verify(d)


NAMES = ["tokens", "seqs", "context", "hidden", "page_tokens", "nope", "heads"]
EXPR = st.recursive(
    st.integers(-3, 2**66) | st.sampled_from(NAMES),
    lambda inner: st.builds(lambda xs: {"mul": xs}, st.lists(inner, min_size=2, max_size=3))
    | st.builds(lambda xs: {"add": xs}, st.lists(inner, min_size=2, max_size=3))
    | st.builds(lambda a, b: {"ceil_div": [a, b]}, inner, inner),
    max_leaves=6)
LITERALS = {"kind": ["input", "output", "weight", "workspace", "carry", "peer", "pointers"],
            "dtype": ["bf16", "f32", "i32", "u64"], "fill": ["token", "position", "tokens", "logits", "slot"],
            "op": ["linear", "embed", "sample", "rope", "rms_norm"], "device": ["cpu", "cuda"]}


def expression_sites(tree):
    """Paths where an expression stands, in a valid manifest."""
    for path, v in walk(tree):
        keys = [k for k in path if isinstance(k, str)]
        if keys[-1:] in (["shape"], ["value"], ["range"], ["mul"], ["add"], ["ceil_div"]) and isinstance(path[-1], int):
            yield path
        elif keys[-1] in ("value", "stride", "groups", "rows", "bytes_per_token", "bytes_per_seq", "bytes",
                          "shared_mem") and not isinstance(v, (dict, list, float)):
            yield path
        elif len(path) == 2 and path[0] == "constants":
            yield path


@given(data=st.data())
@SETTINGS
def test_well_typed_nonsense(tiny_dict, data):
    """Schema-valid mutations reach every check: any expression anywhere one stands, any literal
    where a kind, dtype, role, op or device stands, any var bound, any view. Never a crash."""
    sites = list(expression_sites(tiny_dict))
    literal_sites = [p for p, v in walk(tiny_dict) if isinstance(p[-1], str) and p[-1] in LITERALS]
    d = copy.deepcopy(tiny_dict)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["expr", "literal", "var", "view"]))
        if kind == "expr":
            path = data.draw(st.sampled_from(sites))
            parent(d, path)[path[-1]] = data.draw(EXPR)
        elif kind == "literal":
            path = data.draw(st.sampled_from(literal_sites))
            parent(d, path)[path[-1]] = data.draw(st.sampled_from(LITERALS[path[-1]]))
        elif kind == "var":
            d["vars"][data.draw(st.sampled_from(sorted(d["vars"])))]["max"] = data.draw(st.integers(-2, 2**64))
        else:
            pn = data.draw(st.sampled_from(sorted(d["programs"])))
            call = data.draw(st.sampled_from(d["programs"][pn]["calls"]))
            bufs = [a for a in call["args"] if "buf" in a]
            if bufs:
                a = data.draw(st.sampled_from(bufs))
                a["offset"] = data.draw(EXPR)
                if data.draw(st.booleans()):
                    a["shape"] = data.draw(st.lists(EXPR, min_size=1, max_size=2))
    verify(d)


# ---- a manifest that verifies runs, or stops with a KernError naming its place -----------------

PLACE = re.compile(r"\b(programs|buffers|states|modules|ops|vars|constants)\.[\w.\[\]]+|program '|module '")


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny_deployment(request, tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint folder, manifest path) of one of the runtime tests' tiny random models, on the cpu."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from kern.deployments import deployment_for
    from tests.runtime.conftest import tiny_checkpoint

    ckpt = tiny_checkpoint(tmp_path_factory.mktemp(f"tiny-{request.param}"), request.param)
    return ckpt, deployment_for(ckpt, "cpu")


def step_every_program(v, ckpt: Path) -> None:
    """Load the manifest and step each program that steps a batch once, on a few rows, through
    the serving protocol (roles, never names)."""
    from kern.runtime.engine import Engine

    eng = Engine(v, ckpt)
    for st in eng.protocol.steppers:
        n = 1 if st.rows == 1 else min(3, st.rows_max)
        vars_ = st.vars_for(1, n, reach=n if st.reach_var else None)
        env = eng.env(st.program, vars_)
        fill = {"token": [1] * n, "position": list(range(n)), "cu_seqlens": [0, n], "slot": [0], "seq_len": [n],
                "temperature": [0.0], "rng": [0], "mask": [-1], "mask_row": [1]}  # a mask allowing every token
        inputs = {buf: np.resize(np.array(fill[role], np.float32 if role == "temperature" else np.int32),
                                 eng.shape(buf, env)) for role, buf in st.inputs.items()}
        inputs.update({pt.buffer: np.zeros(eng.shape(pt.buffer, env), np.int32) for pt in st.page_tables})
        env = eng.run(st.program, vars_, inputs)
        for buf in st.outputs.values():
            eng.read(buf, env)


def runs_or_names_its_place(man: Path, d: dict, ckpt: Path) -> str:
    """"unverified", "ran" or the KernError's message; any other exception fails the test. The
    address space is capped a few GiB above what the process holds, so a load that would take
    more memory than a test machine has fails as it would on a small one."""
    from kern.runtime.errors import KernError

    r = verify_text(json.dumps(d), str(man), man.parent)
    if r.verified is None:
        return "unverified"
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    held = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    cap = held + (3 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        step_every_program(r.verified, ckpt)
        return "ran"
    except KernError as exc:
        assert PLACE.search(str(exc)), f"KernError names no place: {exc}"
        return str(exc)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def mutate(d: dict, rng: random.Random) -> str:
    """One seeded mutation: a number changed (off by one, doubled, zero, huge), a name swapped for
    another of the same field, or an entry deleted. Returns what it did."""
    leaves = [(p, v) for p, v in walk(d) if not isinstance(v, (dict, list))]
    kind = rng.choice(["int", "int", "name", "delete"])
    if kind == "int":
        p, v = rng.choice([(p, v) for p, v in leaves if type(v) is int])
        new = rng.choice([v + 1, v - 1, v * 2, v // 2, 0, 1, v * 1000, 2**20, 2**31 - 1, v + 64])
    elif kind == "name":
        names_ = [(p, v) for p, v in leaves if type(v) is str and p[-1] not in ("sha256", "source")]
        p, v = rng.choice(names_)
        new = rng.choice([x for q, x in names_ if q[-1] == p[-1] and x != v] or [v + "_x"])
    else:
        p = rng.choice([p for p, _ in walk(d)])
        del parent(d, p)[p[-1]]
        return f"delete {p}"
    parent(d, p)[p[-1]] = new
    return f"{p}: {v!r} -> {new!r}"


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="caps memory through /proc and RLIMIT_AS")
def test_a_verified_mutation_runs_or_raises_a_kern_error_naming_its_place(tiny_deployment):
    ckpt, man = tiny_deployment
    base = json.loads(man.read_text())
    outcomes = {"unverified": 0, "ran": 0, "refused": 0}
    for seed in range(150):
        d = copy.deepcopy(base)
        what = mutate(d, random.Random(seed))
        try:
            out = runs_or_names_its_place(man, d, ckpt)
        except Exception as exc:
            raise AssertionError(f"seed {seed}, {what}: the engine crashed with {type(exc).__name__}") from exc
        outcomes[out if out in outcomes else "refused"] += 1
    # the mutations reach the engine both ways: some run, some are refused there
    assert outcomes["ran"] >= 15 and outcomes["refused"] >= 15, outcomes


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="caps memory through /proc and RLIMIT_AS")
@pytest.mark.parametrize("case, change, place", [
    ("a var's max that sizes more buffer memory than the machine has",
     lambda d: d["vars"]["seqs"].update(max=2**24), "the device cannot allocate"),
    ("a kernel entry the module does not have",
     lambda d: d["ops"]["rms_norm"]["impl"]["launches"][0].update(entry="no_such_kernel"),
     "(op rms_norm) launch 0: module 'kernels' has no function 'no_such_kernel'"),
    ("a layer index past the layers the state holds",
     lambda d: next(c for c in d["programs"]["decode"]["calls"] if c["op"] == "kv_append_decode")["args"][4]
     .update(value=5), "(op kv_append_decode) launch 0: kernels.kv_append_decode failed"),
])
def test_crashes_found_before_are_kern_errors_naming_the_place(tiny_deployment, case, change, place):
    ckpt, man = tiny_deployment
    d = json.loads(man.read_text())
    change(d)
    out = runs_or_names_its_place(man, d, ckpt)
    assert place in out, f"{case}: {out}"
