"""The hybrid in the engine's tools: which per-sequence state each `slot` input carries (and the
one line a manifest gets when that is ambiguous or wrong), kern kernels' rebuild of each module
by the family that owns it."""

from __future__ import annotations

import json

import pytest

from kern.manifest import load_verified
from kern.manifest.protocol import ProtocolError, derive


def test_the_slot_role_carries_the_per_sequence_state(kimi_dep):
    p = derive(load_verified(kimi_dep / "manifest.json"))
    assert p.paged_states == {"kv": 16}
    assert all([(x.buffer[2:], x.state) for x in s.slots] == [("slot", "kda")] for s in p.steppers)
    assert p.slot_buffers == {"p_slot": "kda", "d_slot": "kda"}


def two_slot_states(kimi_dep, out, name_them: bool):
    """The hybrid with its convolution windows in a per-sequence state of their own ("window",
    as large as a KDA slot, so the kernels address it by the same stride) and slot inputs of
    their own (`name_them`: each slot input names its state with domain.index_into)."""
    m = json.loads((kimi_dep / "manifest.json").read_text())
    m["states"]["window"] = {"bytes_per_seq": "kda_slot_bytes"}
    for prog, pre in (("prefill", "p"), ("decode", "d")):
        m["buffers"][f"{pre}_wslot"] = {**m["buffers"][f"{pre}_slot"]}
        if name_them:
            m["buffers"][f"{pre}_slot"]["domain"] = {"index_into": "kda"}
            m["buffers"][f"{pre}_wslot"]["domain"] = {"index_into": "window"}
        for c in m["programs"][prog]["calls"]:
            if c["op"] in ("kda_conv", "kda_conv_decode"):
                c["args"][2], c["args"][3] = {"state": "window"}, {"buf": f"{pre}_wslot"}
    out.mkdir(exist_ok=True)
    (out / "kernels").symlink_to(kimi_dep / "kernels")
    (out / "manifest.json").write_text(json.dumps(m))
    return out / "manifest.json"


def test_slot_inputs_name_their_state_where_there_are_several(kimi_dep, tmp_path):
    p = derive(load_verified(two_slot_states(kimi_dep, tmp_path / "named", True)))
    assert p.slot_buffers == {"p_slot": "kda", "p_wslot": "window", "d_slot": "kda", "d_wslot": "window"}
    from kern.manifest import ManifestError

    with pytest.raises(ManifestError) as e:  # unnamed, two slot inputs are one role twice
        load_verified(two_slot_states(kimi_dep, tmp_path / "unnamed", False))
    assert ("programs.prefill.calls[34] (op kda_conv): touches buffer 'p_wslot' of role 'slot', but program "
            "'prefill' already has 'p_slot' in that role") in str(e.value)


def test_one_unnamed_slot_input_among_two_per_sequence_states_is_refused(kimi_dep, tmp_path):
    m = json.loads((kimi_dep / "manifest.json").read_text())
    m["states"]["window"] = {"bytes_per_seq": 4096}
    m["ops"]["kda_conv"]["params"].append("window: inout state")
    for c in m["programs"]["prefill"]["calls"]:
        if c["op"] == "kda_conv":
            c["args"].append({"state": "window"})
    (tmp_path / "kernels").symlink_to(kimi_dep / "kernels")
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ProtocolError) as e:
        derive(load_verified(tmp_path / "manifest.json"))
    assert str(e.value) == ("buffers.p_slot: a slot input must name its per-sequence state (domain.index_into) "
                            "where the manifest declares 2 (kda, window)")


@pytest.mark.parametrize("domain, problem", [
    ({"index_into": "kv"}, "buffers.p_slot.domain.index_into: a slot input indexes a per-sequence state; 'kv' has "
                           "no bytes_per_seq"),
    ({"index_into": "kda", "stride": 4}, "buffers.p_slot.domain.stride: a slot input indexes slots, it has no "
                                         "stride"),
])
def test_a_slot_input_that_names_its_state_wrongly_is_refused(kimi_dep, tmp_path, domain, problem):
    from kern.manifest import ManifestError

    m = json.loads((kimi_dep / "manifest.json").read_text())
    m["buffers"]["p_slot"]["domain"] = domain
    (tmp_path / "kernels").symlink_to(kimi_dep / "kernels")
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError) as e:
        load_verified(tmp_path / "manifest.json")
    assert problem in str(e.value)


def test_kern_kernels_rebuilds_each_module_with_the_family_that_owns_it(kimi_dep, capsys):
    from kern.cli import main

    assert main(["kernels", str(kimi_dep), "--rebuild"]) == 0
    out = capsys.readouterr().out
    for family in ("llama", "qwen3_moe", "kimi_linear"):
        assert f"rebuild ({family}): reproduced" in out, out
    assert out.strip().endswith("3 of 3 modules reproduce their pinned sha256")


@pytest.mark.parametrize("slot", [-1, 10 ** 6])
def test_a_slot_outside_the_state_is_refused_before_launch(kimi_model, slot):
    import numpy as np

    from kern.errors import BoundsError

    e = kimi_model.engine
    st = e.protocol.for_rows(1, 1)
    n = e.slots["kda"]
    inputs = {st.inputs["token"]: np.array([3], np.int32), st.inputs["position"]: np.array([0], np.int32),
              st.slots[0].buffer: np.array([slot], np.int32)}
    with pytest.raises(BoundsError) as err:
        e.run(st.program, st.vars_for(1, 1, reach=1), inputs)
    assert str(err.value) == (f"program 'decode': input 'd_slot' (slot) holds slots [{slot}, {slot}], state 'kda' "
                              f"has {n}; refused before launch")
