"""What `kern verify` promises on bad input, one row per promise.

Every row plants problems in the tiny generated manifest and runs `kern verify` in a fresh
process, its address space capped at 2 GiB and its time at 60 s: it must answer exit code 1, one
line per problem naming the place, every planted problem reported, and no traceback."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.manifest.conftest import tiny_manifest

MEMORY_CAP = 2 << 30


def _schema_error_among_others(d: dict) -> dict:
    d["buffers"]["d_x"]["dtype"] = "f64"  # a schema error ...
    d["vars"]["tokens"]["max"] = 0  # ... and four problems the checks find past it
    d["modules"]["kernels"]["sha256"] = "x"
    d["programs"]["decode"]["calls"][0]["op"] = "nope"
    d["topology"] = {"ranks": 3, "rank": 5}
    return d


def _every_schema_entry_broken_alone(d: dict) -> dict:
    d["buffers"]["d_h"]["colour"] = "red"
    d["programs"]["decode"]["calls"][3]["args"][0] = {"bufr": "d_h"}
    d["states"]["kv"]["bytes_per_token"] = "2"  # a name that resolves to nothing ...
    d["vars"]["context"]["max"] = 1.5
    return d


def _set(path: tuple, value) -> callable:
    def change(d: dict) -> dict:
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        return d
    return change


def _raw(old: str, new: str) -> callable:
    """A change made on the JSON text: what json.dumps cannot write (NaN, 1e999, deep nesting)."""
    return lambda d: json.dumps(d).replace(old, new, 1)


DEEP = '{"mul": [' * 60 + "2" + ", 1]}" * 60

CASES = [
    # (what the row promises, the change, every (place, phrase) that must be reported)
    ("five problems at once, one of them a schema error", _schema_error_among_others,
     [("buffers.d_x.dtype", "'f64'"), ("vars.tokens.max", "must be >= 1"), ("modules.kernels.sha256", "64 lowercase"),
      ("programs.decode.calls[0] (op nope)", "no op named 'nope'"), ("topology.rank", "must lie in [0, 3)")]),
    ("schema errors break only their entry, each named", _every_schema_entry_broken_alone,
     [("buffers.d_h.colour", "unknown field"), ("programs.decode.calls[3].args[0]", "expected a call argument"),
      ("states.kv.bytes_per_token", "unknown name '2'"), ("vars.context.max", "valid integer")]),
    ("a rank count of two billion is refused at once",
     _set(("topology",), {"ranks": 2_000_000_000, "groups": {"tp": [[0]]}}),
     [("topology.ranks", "must lie in [1, 4096]")]),
    ("a rank list of ten thousand is judged by counting", _set(("topology",), {"ranks": 4096, "groups": {
        "tp": [list(range(10_000))]}}), [("topology.groups.tp", "lie outside [0, 4096)")]),
    ("a group short of the ranks is judged by counting", _set(("topology",), {"ranks": 4096, "groups": {
        "tp": [[0, 1]]}}), [("topology.groups.tp", "2 placed, the topology has 4096")]),
    ("a var max past 32 bits is refused", _set(("vars", "seqs", "max"), 2**62),
     [("vars.seqs.max", "must be <= 2147483647")]),
    ("buffers past the target's memory are refused, naming the largest", _set(("constants", "vocab"), 2**31 - 1),
     [("buffers.v_logits", "over the cpu budget")]),  # the verify program's logits, a row each: the largest
    ("NaN is refused naming the field", _raw('"max": 32', '"max": NaN'), [("vars.seqs.max", "NaN is not a number")]),
    ("Infinity is refused naming the field", _raw('"max": 32', '"max": Infinity'),
     [("vars.seqs.max", "Infinity is not a number")]),
    ("a float literal past the double range is Infinity, refused", _raw('"max": 32', '"max": 1e999'),
     [("vars.seqs.max", "Infinity is not a number")]),
    ("an expression nested too deeply is named where it starts",
     _raw('"constants": {', f'"constants": {{"deep": {DEEP}, '),
     [("constants.deep", "nested too deeply to read")]),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    return tiny_manifest(tmp_path_factory.mktemp("tiny"))


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


@pytest.mark.parametrize("promise, change, expected", CASES, ids=[c[0] for c in CASES])
def test_kern_verify_names_every_problem(base, tmp_path, promise, change, expected):
    out = change(json.loads(json.dumps(base)))
    path = tmp_path / "manifest.json"
    path.write_text(out if isinstance(out, str) else json.dumps(out))
    r = subprocess.run([sys.executable, "-m", "kern.cli", "verify", str(path)], capture_output=True, text=True,
                       timeout=60, preexec_fn=_cap_memory)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"{path}: manifest failed verification:"
    for where, phrase in expected:
        assert [ln for ln in lines[1:] if ln.startswith(f"  {where}: ") and phrase in ln], \
            f"{promise}: no line at {where!r} with {phrase!r}:\n{r.stdout}"


def test_kern_verify_checks_the_pins_of_module_files_beside_the_manifest(tmp_path):
    """The fast loop an agent iterates against says what `kern run` would refuse: a kernel file
    changed after its sha256 was pinned."""
    import shutil

    folder = Path(shutil.copytree(Path(__file__).parents[2] / "examples" / "smollm2-135m-instruct-cpu",
                                  tmp_path / "deployment"))

    def verify() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kern.cli", "verify", str(folder)], capture_output=True,
                              text=True, timeout=60)

    assert verify().returncode == 0
    (module,) = json.loads((folder / "manifest.json").read_text())["modules"].items()
    name, source = module[0], module[1]["source"]
    with open(folder / source, "a") as f:
        f.write("# an edit after pinning\n")
    r = verify()
    assert r.returncode == 1 and "Traceback" not in r.stderr
    says = f"  modules.{name}.sha256: the file {source} hashes to"
    assert [ln for ln in r.stdout.splitlines() if ln.startswith(says)], r.stdout
