"""Greedy decoding below the host loop (kern.drive.raw_pages.greedy, what bench/kimi_gpu.py's
decode step runs): a batch of sequences, each on a lease of its own, prefilled together from
position 0 and decoded together. Sequence 0's tokens and logits must be the ones it gets alone.

They were not on the H200 (2026-12-04: seq 0 at batch 16 and 64 differed from batch 1) nor here:
the bench filled the `slot` role from `st.inputs`, where the protocol has not carried it since
the slot inputs moved to `st.slots` (one a per-sequence state), so no slot input was written and
every row stepped slot 0's recurrence and convolution window (the last sequence's state wins;
prefill's first token is right, every decode token after it reads another sequence's state).
The host loop (generation/runner.py) and raw pages' step_rows filled it right all along."""

from __future__ import annotations

import numpy as np
import pytest

from kern.drive.raw_pages import greedy, lease_inputs, lease_many, give_many

from .conftest import Stepped

BATCH, PROMPT, STEPS = 16, 32, 12


@pytest.fixture(scope="module")
def wide(kimi_family, tmp_path_factory) -> Stepped:
    """The tiny model's cpu deployment with room for BATCH prompts of PROMPT tokens in one step."""
    from kern_models.kimi_linear.generator import generate

    ckpt, config, _ = kimi_family
    dep = tmp_path_factory.mktemp("kimi_wide")
    generate(config, dep, target="cpu", model="tiny-kimi", tokens=BATCH * PROMPT, seqs=BATCH, context=256)
    return Stepped(dep / "manifest.json", ckpt)


def _dirty(model) -> None:
    """Leave other sequences' state in the slots and pages a later lease gets (as the bench's
    prefill profile does before its decode): a prefill of BATCH other prompts, leases freed."""
    leases = lease_many(model, BATCH, PROMPT)
    try:
        st = model.protocol.for_rows(BATCH, None)
        ids = np.random.default_rng(2).integers(3, 256, BATCH * PROMPT).astype(np.int32)
        model.engine.run(st.program, st.vars_for(BATCH, BATCH * PROMPT), {
            st.inputs["token"]: ids, st.inputs["position"]: np.tile(np.arange(PROMPT, dtype=np.int32), BATCH),
            st.inputs["cu_seqlens"]: np.arange(0, PROMPT * (BATCH + 1), PROMPT, dtype=np.int32),
            **lease_inputs(model, st, leases)})
    finally:
        give_many(model, leases)


def test_sequence_0_beside_15_others_gets_its_tokens_and_logits_alone(wide):
    prompts = np.random.default_rng(1).integers(3, 256, (BATCH, PROMPT))
    _dirty(wide)
    alone = greedy(wide, prompts[:1], STEPS, rows=(0,))
    _dirty(wide)
    beside = greedy(wide, prompts, STEPS, rows=(0,))
    assert alone.tokens.shape == (1 + STEPS, 1) and beside.tokens.shape == (1 + STEPS, BATCH)
    assert beside.tokens[:, 0].tolist() == alone.tokens[:, 0].tolist()
    assert beside.logits[0].tobytes() == alone.logits[0].tobytes()
    # and every other sequence its own: each decoded alone gets the tokens it got in the batch
    for s in (1, BATCH - 1):
        assert greedy(wide, prompts[s:s + 1], STEPS).tokens[:, 0].tolist() == beside.tokens[:, s].tolist()


def test_lease_inputs_give_each_row_its_lease_s_slot_and_pages(wide):
    leases = lease_many(wide, 3, 40)
    try:
        for st in wide.protocol.steppers:
            assert "slot" not in st.inputs and st.slots  # the role is carried by st.slots
            got = lease_inputs(wide, st, leases)
            for si in st.slots:
                assert got[si.buffer].tolist() == [lease.slot(si.state) for lease in leases]
            assert len({lease.slot("kda") for lease in leases}) == 3
            for pt in st.page_tables:
                for i, lease in enumerate(leases):
                    pages = lease.page_table(pt.state)
                    assert got[pt.buffer][i, :len(pages)].tolist() == pages
    finally:
        give_many(wide, leases)
