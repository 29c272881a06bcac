"""Argument packing and parameter-layout checks: pure host code, no GPU."""

import struct

import numpy as np
import pytest

from kern.runtime.devices.cuda.params import (
    ParamKind, expected_layout, layout_problems, pack_args, parse_kinds)

P, I, F, L = ParamKind.POINTER, ParamKind.I32, ParamKind.F32, ParamKind.I64


def read(addr: int, n: int) -> bytes:
    import ctypes
    return ctypes.string_at(addr, n)


def value_bytes(packed, i: int) -> bytes:
    """The bytes the kernel sees for parameter i: the start of its 8-byte slot."""
    return packed.slots[i : i + 1].tobytes()[: packed.kinds[i].size]


def test_parse_kinds_names_and_rejects_unknown():
    assert parse_kinds(["ptr", "i32", "f32", "i64", "pointer"]) == (P, I, F, L, P)
    with pytest.raises(ValueError, match="param 1: unknown kind 'u8'"):
        parse_kinds(["ptr", "u8"])


def test_expected_layout_aligns_each_param_to_its_size():
    assert expected_layout([P, I, F, P, I, L]) == [(0, 8), (8, 4), (12, 4), (16, 8), (24, 4), (32, 8)]
    assert expected_layout([I, P]) == [(0, 4), (8, 8)]
    assert expected_layout([]) == []


def test_pack_args_puts_each_value_where_its_pointer_points():
    kinds = (P, P, I, F, L, I)
    values = (0xDEADBEEF00, 2**64 - 1, -7, 1.5, -(2**40), 2**31 - 1)
    packed = pack_args(kinds, values, "k")
    ptrs = np.frombuffer(read(packed.address, 8 * len(kinds)), dtype=np.uint64)
    got = [read(int(p), k.size) for p, k in zip(ptrs, kinds)]
    assert got[0] == struct.pack("<Q", 0xDEADBEEF00)
    assert got[1] == struct.pack("<Q", 2**64 - 1)
    assert got[2] == struct.pack("<i", -7)
    assert got[3] == struct.pack("<f", 1.5)
    assert got[4] == struct.pack("<q", -(2**40))
    assert got[5] == struct.pack("<i", 2**31 - 1)
    assert [value_bytes(packed, i) for i in range(len(kinds))] == got


def test_pack_args_accepts_numpy_scalars_and_rounds_f32():
    packed = pack_args((I, F), (np.int64(3), np.float64(0.1)))
    assert value_bytes(packed, 0) == struct.pack("<i", 3)
    assert value_bytes(packed, 1) == struct.pack("<f", np.float32(0.1))


@pytest.mark.parametrize("kinds,values,err,msg", [
    ((P, I), (1,), ValueError, "takes 2 args, got 1"),
    ((I,), (2**31,), ValueError, "arg 0: 2147483648 does not fit i32"),
    ((P,), (-1,), ValueError, "arg 0: -1 does not fit ptr"),
    ((P, I), (0, 1.0), TypeError, "arg 1: i32 expects an int"),
    ((F,), ("x",), TypeError, "arg 0: f32 expects a number"),
    ((I,), (True,), TypeError, "arg 0: i32 expects an int"),
])
def test_pack_args_rejects_bad_values_naming_kernel_and_position(kinds, values, err, msg):
    with pytest.raises(err, match=msg):
        pack_args(kinds, values, "rope")


def test_pack_args_empty():
    assert pack_args((), ()).address == 0


def test_layout_problems_accepts_matching_layout():
    kinds = (P, P, I, I, F)
    assert layout_problems("rms_norm", kinds, expected_layout(kinds)) == []


def test_layout_problems_names_kernel_count_and_position():
    kinds = (P, P, I, F)
    cubin = [(0, 8), (8, 8), (16, 4), (20, 4), (24, 4)]  # one more param; param 1 is fine
    problems = layout_problems("rope", kinds, cubin)
    assert problems[0] == "kernel 'rope': declared 4 params, cubin has 5"
    assert len(problems) == 1
    cubin = [(0, 8), (8, 4), (16, 8)]  # declared ptr, i32, f32: param 2 differs
    problems = layout_problems("embed", (P, I, F), cubin)
    assert problems == ["kernel 'embed' param 2: declared f32 (4 bytes at offset 12), "
                        "cubin has 8 bytes at offset 16"]


def test_layout_problems_catches_i32_declared_as_i64():
    problems = layout_problems("k", (P, L), [(0, 8), (8, 4)])
    assert problems == ["kernel 'k' param 1: declared i64 (8 bytes at offset 8), "
                        "cubin has 4 bytes at offset 8"]
