"""Bad input is a listed problem naming its place: never a traceback."""

from __future__ import annotations

import json

import pytest

from kern.manifest.verify import verify_path, verify_text

from .conftest import problems, where_what


def only(text) -> tuple[str, str]:
    found = problems(text)
    assert len(found) == 1, found
    return found[0].where, found[0].what


def test_not_json():
    assert only("hello") == ("manifest", "not valid JSON: Expecting value at line 1 column 1")


def test_not_utf8():
    where, what = only(b"\xff\xfe{}")
    assert where == "manifest" and what.startswith("not UTF-8 text")


def test_truncated(m):
    text = json.dumps(m, indent=1)
    where, what = only(text[: len(text) // 2])
    assert where == "manifest" and what.startswith("truncated JSON")


def test_top_level_not_an_object():
    assert only("[1, 2]") == ("manifest", "expected a JSON object at the top level, got list")


def test_empty_object_names_every_missing_field_and_what_else_is_wrong():
    found = {(p.where, p.what) for p in problems("{}")}
    assert found == {*((f, "missing required field") for f in ("schema_version", "model", "target")),
                     ("programs", "no programs")}


def test_json_nested_too_deeply():
    assert only("[" * 100_000) == ("manifest", "not a manifest: JSON nested too deeply to read")


def test_expression_nested_too_deeply(m):
    deep = '{"mul": [' * 400 + "1" + ", 1]}" * 400
    text = json.dumps(m).replace('"constants": {', '"constants": {"deep": ' + deep + ", ", 1)
    assert only(text) == ("constants.deep", "nested too deeply to read")


def test_integer_with_too_many_digits():
    where, what = only('{"schema_version": 1' + "0" * 5000 + "}")
    assert where == "manifest" and what.startswith("not valid JSON: Exceeds the limit")


def test_every_schema_problem_at_once(m):
    m["vars"]["tokens"]["max"] = 1.5
    m["buffers"]["d_x"]["dtype"] = "f64"
    m["buffers"]["d_h"]["shape"] = [{"pow": [2, 3]}]
    m["programs"]["decode"]["calls"][0]["args"][0] = {"bufr": "d_ids"}
    m["topology"] = {"ranks": "two"}
    found = {p.where: p.what for p in problems(m)}
    assert "valid integer, got 1.5" in found["vars.tokens.max"]
    assert "'bf16'" in found["buffers.d_x.dtype"]
    assert "expected an expression" in found["buffers.d_h.shape[0]"]
    assert "expected a call argument" in found["programs.decode.calls[0].args[0]"]
    assert "valid integer" in found["topology.ranks"]


def test_numbers_overflow_at_the_var_bounds(m):
    m["vars"]["context"]["max"] = 2**62
    found = {p.where: p.what for p in problems(m)}
    # rope: context x head_dim x 4 bytes; page tables: seqs x ceil(context / 16) x 4 bytes
    assert found["buffers.rope"] == f"{2**62 * 16 * 4} bytes at the var maxima overflows a 64-bit size"
    assert "overflows a 64-bit size" in found["buffers.d_page_table"]


def test_ceil_div_by_a_divisor_that_can_be_zero(m):
    m["buffers"]["d_x"]["shape"][1] = {"ceil_div": ["hidden", {"add": ["seqs", -1]}]}
    found = problems(m)
    assert ("buffers.d_x.shape[1]", "ceil_div by a divisor that can be 0") in [(p.where, p.what) for p in found]


def test_constant_cycle_is_named_once_per_member(m):
    m["constants"]["a"] = {"add": ["b", 1]}
    m["constants"]["b"] = {"mul": ["c", 2]}
    m["constants"]["c"] = "a"
    found = {p.where: p.what for p in problems(m)}
    for n in "abc":
        assert "cycle" in found[f"constants.{n}"]


def test_unreadable_path(tmp_path):
    r = verify_path(tmp_path / "missing.json")
    assert r.verified is None and r.problems[0].what.startswith("cannot read")


def test_folder_means_its_manifest(tmp_path, m):
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    assert verify_path(tmp_path).verified is not None


@pytest.mark.parametrize("text", ["", " ", "null", "1", '"x"', "{", '{"schema_version": 1,}', "\x00"])
def test_garbage_never_raises(text):
    r = verify_text(text)
    assert r.verified is None and r.problems


def test_constants_that_square_each_other_stop_at_a_bound(m):
    m["constants"]["c0"] = 2**60
    for i in range(1, 64):
        m["constants"][f"c{i}"] = {"mul": [f"c{i - 1}", f"c{i - 1}"]}
    m["buffers"]["d_x"]["shape"][1] = {"add": ["hidden", {"mul": [0, "c63"]}]}
    found = {p.where: p.what for p in problems(m)}
    assert found["constants.c2"].startswith("a product exceeds 2**128")
    assert found["constants.c3"] == "depends on constant 'c2', which does not resolve"


# ---- a schema error breaks only its entry: the rest is checked, and nothing is blamed on it ----

def test_a_buffer_that_does_not_parse_is_not_missing_where_calls_pass_it(m):
    m["buffers"]["d_x"]["colour"] = "red"
    m["vars"]["tokens"]["max"] = 0
    assert where_what(m) == [("buffers.d_x.colour", "unknown field"), ("vars.tokens.max", "must be >= 1, got 0")]


def test_an_op_that_does_not_parse_is_not_missing_where_calls_invoke_it(m):
    m["ops"]["rms_norm"]["impl"]["launches"][0]["grid"] = "x"
    found = where_what(m)
    assert [w for w, _ in found] == ["ops.rms_norm.impl.launches[0].grid"]


def test_a_call_that_does_not_parse_leaves_its_program_checked_around_it(m):
    calls = m["programs"]["decode"]["calls"]
    calls[2]["args"][0] = {"bufr": "d_h"}  # what this call writes is not "read before written" later
    calls[4]["args"] = calls[4]["args"][:1]
    found = where_what(m)
    assert found[0] == ("programs.decode.calls[2].args[0]", "expected a call argument: {buf: name}, {state: name} or "
                        "{value: v}")
    assert [w for w, _ in found[1:]] == [f"programs.decode.calls[4] (op {calls[4]['op']})"]


def test_a_var_that_does_not_parse_silences_the_expressions_naming_it(m):
    m["vars"]["context"]["max"] = "lots"
    assert where_what(m) == [("vars.context.max", "Input should be a valid integer, got 'lots'")]


def test_a_target_that_does_not_parse_silences_device_checks(m):
    m["target"] = {"device": "tpu"}
    m["ops"]["rms_norm"]["impl"]["launches"][0]["pdl"] = True  # needs cuda: unknown here
    assert [w for w, _ in where_what(m)] == ["target.device"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_numbers_that_are_not_finite_are_refused_naming_the_field(m, literal):
    text = json.dumps(m).replace('"max": 32', f'"max": {literal}', 1)
    [(where, what)] = where_what(text)
    assert where == "vars.seqs.max" and what.endswith("is not a number a manifest can hold (numbers are finite)")


def test_depth_is_decided_before_typed_validation(m):
    """48 levels in all pass; one more is refused, whatever pydantic's own limit."""
    from kern.manifest.limits import MAX_DEPTH

    def text(levels: int) -> str:  # the manifest is level 1, constants 2, the expression from 3
        deep = '{"add": [' * levels + "1" + ", 1]}" * levels
        return json.dumps(m).replace('"constants": {', '"constants": {"deep": ' + deep + ", ", 1)

    fits = (MAX_DEPTH - 2) // 2  # each expression level is an object and its list
    assert ("constants.deep", "declared and unused (no expression names it)") in where_what(text(fits))
    assert where_what(text(fits + 1)) == [("constants.deep", "nested too deeply to read")]
