"""The hybrid in the engine's tools: which per-sequence state the `slot` role carries (and the
one line a manifest gets when that is ambiguous), the host loop's refusal until it fills that
role, kern kernels' rebuild of each module by the family that owns it."""

from __future__ import annotations

import json

import pytest

from kern.manifest import load_verified
from kern.manifest.protocol import ProtocolError, derive


def test_the_slot_role_carries_the_per_sequence_state(kimi_dep):
    p = derive(load_verified(kimi_dep / "manifest.json"))
    assert p.slot_state == "kda" and p.paged_states == {"kv": 16}
    assert all("slot" in s.inputs for s in p.steppers)


@pytest.mark.parametrize("second", [{"bytes_per_seq": 4096}, {"bytes_per_seq": "kda_slot_bytes"}])
def test_two_per_sequence_states_under_one_slot_role_are_refused(kimi_dep, tmp_path, second):
    """A lease holds a slot of each per-sequence state, not one index for all: one slot role
    cannot address two."""
    m = json.loads((kimi_dep / "manifest.json").read_text())
    m["states"]["window"] = second
    m["ops"]["kda_conv"]["params"].append("window: inout state")
    for c in m["programs"]["prefill"]["calls"]:
        if c["op"] == "kda_conv":
            c["args"].append({"state": "window"})
    (tmp_path / "kernels").symlink_to(kimi_dep / "kernels")
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ProtocolError) as e:
        derive(load_verified(tmp_path / "manifest.json"))
    assert str(e.value) == ("the slot role carries one slot, the manifest declares 2 per-sequence states (kda, "
                            "window): declare them as one")


def test_the_host_loop_refuses_the_hybrid_until_it_fills_the_slot_role(kimi_dep, kimi_ckpt):
    """Not a wrong answer: without the role filled every sequence would share slot 0's state."""
    from kern.api import Model
    from kern.errors import KernError

    with pytest.raises(KernError) as e:
        Model(kimi_dep / "manifest.json", kimi_ckpt)
    assert str(e.value) == (f"{kimi_dep / 'manifest.json'}: kern's host loop does not step models with a "
                            "per-sequence state ('kda') yet; kern test and kern bench do")


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

    from kern.runtime.errors import BoundsError

    e = kimi_model.engine
    st = e.protocol.for_rows(1, 1)
    n = e.slots["kda"]
    inputs = {st.inputs["token"]: np.array([3], np.int32), st.inputs["position"]: np.array([0], np.int32),
              st.inputs["slot"]: np.array([slot], np.int32)}
    with pytest.raises(BoundsError) as err:
        e.run(st.program, st.vars_for(1, 1, reach=1), inputs)
    assert str(err.value) == (f"program 'decode': input 'd_slot' (slot) holds slots [{slot}, {slot}], state 'kda' "
                              f"has {n}; refused before launch")
