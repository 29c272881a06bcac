"""The hybrid through the host loop (kern.api.Model, the loop kern run and kern serve drive): each
sequence on its own slot, a recurrence that is never cached past the tokens it holds, prefix
reuse that carries the slot's state (a chat's next turn, a shared system prompt from a
snapshot), preemption and parking that resume to the same tokens. Every answer is checked
against the model stepped by hand (kern.drive's raw pages, one sequence, no cache)."""

from __future__ import annotations

import numpy as np
import pytest

from kern.api import Model
from kern.drive.raw_pages import raw
from kern.generation.params import SamplingParams


def greedy(stepped, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after `ids`, the model stepped by hand: prefill in chunks of the prefill
    program's most rows, then one row a step."""
    rp = raw(stepped)
    pages = rp.take(-(-(len(ids) + n) // stepped.page_tokens))
    rows = stepped.protocol.max_chunk
    for at in range(0, len(ids), rows):
        tok, _ = rp.step_rows(ids[at:at + rows], at, pages, ragged=True)
    out = [tok]
    for i in range(n - 1):
        tok, _ = rp.step_rows([tok], len(ids) + i, pages)
        out.append(tok)
    rp.give(pages)
    return out


def serve(model: Model, requests: dict[str, tuple[list[int], SamplingParams]], each_step=None):
    """Every request through the loop, all added at once: {id: (tokens, cached prompt tokens)}."""
    loop = model.loop
    for rid, (ids, params) in requests.items():
        loop.add(rid, ids, params)
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    cached: dict[str, int] = {}
    while loop.has_work():
        for d in loop.step():
            out[d.request_id] += d.token_ids
            cached[d.request_id] = d.cached_tokens
        if each_step is not None:
            each_step(loop)
    return {rid: (out[rid], cached[rid]) for rid in requests}


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 200 + 1 for i in range(n)]


@pytest.fixture
def model(kimi_dep, kimi_ckpt):
    return Model(kimi_dep / "manifest.json", kimi_ckpt)


def test_sequences_that_run_together_each_keep_their_own_recurrence(model, kimi_model):
    reqs = {f"r{i}": (prompt(i, 5 + 9 * i), SamplingParams(max_tokens=8)) for i in range(4)}
    got = serve(model, reqs)
    for rid, (ids, p) in reqs.items():
        assert got[rid][0] == greedy(kimi_model, ids, 8), rid
    model.loop.paging.pool.check()


def test_a_run_ahead_past_a_stop_leaves_no_stepped_slot_in_the_cache(kimi_dep, kimi_ckpt, kimi_model):
    """Runs of 4 decode steps with one host wait: a request that stops at the second step of a
    run had its slot stepped twice more. Cached, the next turn would resume from that state;
    it resumes from the snapshot of the prompt's end instead (taken where decode runs ahead)."""
    model = Model(kimi_dep / "manifest.json", kimi_ckpt, run_ahead=4)
    p = prompt(1, 20)
    ref = greedy(kimi_model, p, 8)
    j = next(j for j in (2, 3) if ref[j] not in ref[:j])  # the first run makes ref[1..4]
    first = serve(model, {"a": (p, SamplingParams(max_tokens=8, stop_token_ids=(ref[j],)))})
    assert first["a"][0] == ref[:j + 1]
    turn = p + ref[:j + 1] + prompt(2, 5)
    second = serve(model, {"b": (turn, SamplingParams(max_tokens=6))})
    assert second["b"] == (greedy(kimi_model, turn, 6), len(p))


def test_a_chat_s_next_turn_skips_its_prompt_and_recomputes_the_reply(model, kimi_model):
    """A prompt token attends in the expanded form, a generated one absorbed (the cpu build's
    MLA reads prompt_len), so the reply's cached pages hold generated tokens' bits: the next
    turn, whose prompt holds the reply, resumes from the snapshot of the first prompt's end and
    computes the reply again as prompt tokens, as a cold server would: the same tokens."""
    assert model.loop.roles
    p = prompt(3, 30)
    reply, _ = serve(model, {"t1": (p, SamplingParams(max_tokens=6))})["t1"]
    turn = p + reply + prompt(4, 7)
    got, cached = serve(model, {"t2": (turn, SamplingParams(max_tokens=6))})["t2"]
    assert cached == len(p)
    assert got == greedy(kimi_model, turn, 6)


def test_a_shared_system_prompt_reuses_its_recurrence_from_a_snapshot(model, kimi_model):
    """The first request caches its whole prompt; the second shares only the system prompt
    with it, which no whole checkpoint holds: it recomputes it and snapshots its slot there;
    the third starts from that snapshot."""
    system = prompt(5, 40)
    cached = []
    for i, rid in enumerate(("a", "b", "c")):
        ids = system + [201 + i] + prompt(10 + i, 6)
        got, c = serve(model, {rid: (ids, SamplingParams(max_tokens=5))})[rid]
        assert got == greedy(kimi_model, ids, 5), rid
        cached.append(c)
    assert cached == [0, 0, len(system)]
    model.loop.paging.pool.check()


@pytest.mark.parametrize("park", [False, True], ids=["on the device", "parked in host memory"])
def test_a_preempted_sequence_resumes_with_the_same_tokens(kimi_dep, kimi_ckpt, kimi_model, park):
    model = Model(kimi_dep / "manifest.json", kimi_ckpt, host_bytes=64 << 20)
    reqs = {"x": (prompt(6, 23), SamplingParams(max_tokens=12)), "y": (prompt(7, 11), SamplingParams(max_tokens=12))}
    pool = model.loop.paging.pool
    done, resumed = [], []

    def preempt_once(loop):
        y = next((s for s in loop.running if s.id == "y"), None)
        if done and y is not None and not resumed:
            resumed.append(y.written)
        if done or y is None or len(y.out) < 4:
            return
        written = y.written
        loop.preempt("y")  # its lease becomes a checkpoint of the tokens whose state it holds
        (ckpt,) = [c for c in pool.checkpoints() if len(c.tokens) == written]
        if park:
            left = ckpt.units
            loop.paging.execute(pool.park(ckpt))
            assert not ckpt.on_device and ckpt.parked
            for kind, units in zip(pool.layout.kinds, left):  # the memory it left is someone else's now
                for u in units:
                    junk = np.full(kind.unit_bytes, 0x3F, np.uint8)
                    loop.engine.write_state(kind.name, pool.layout.offset(kind, u), junk)
        done.append(written)

    got = serve(model, reqs, preempt_once)
    assert done, "y was never preempted"
    assert resumed[0] > done[0]  # it resumed from its checkpoint, not from its first token
    for rid, (ids, p) in reqs.items():
        assert got[rid][0] == greedy(kimi_model, ids, 12), rid
    pool.check()


def test_several_per_sequence_states_are_leased_together(kimi_dep, kimi_ckpt, kimi_model, tmp_path):
    """The convolution windows in a state of their own, with slot inputs of their own: the same
    tokens as the model with one per-sequence state."""
    from tests.kimi_linear.test_protocol import two_slot_states

    model = Model(two_slot_states(kimi_dep, tmp_path / "dep", True), kimi_ckpt)
    assert [k.name for k in model.loop.paging.pool.layout.kinds] == ["kv", "kda", "window"]
    reqs = {f"r{i}": (prompt(20 + i, 9 + 5 * i), SamplingParams(max_tokens=6)) for i in range(3)}
    got = serve(model, reqs)
    for rid, (ids, p) in reqs.items():
        assert got[rid][0] == greedy(kimi_model, ids, 6), rid


def test_kern_run_generates_on_the_hybrid(kimi_dep, kimi_ckpt, kimi_model, capsys):
    from kern.cli import main
    from kern.tokenizer import Tokenizer

    tok = Tokenizer(kimi_ckpt)
    assert main(["run", str(kimi_ckpt), "--manifest", str(kimi_dep / "manifest.json"), "--prompt", "w5 w6 w7 w8",
                 "--max-tokens", "8"]) == 0
    ref = greedy(kimi_model, tok.encode("w5 w6 w7 w8"), 8)
    assert capsys.readouterr().out.strip() == tok.decode(ref).strip()


def test_a_step_s_prompt_keys_are_counted_from_its_rows_and_bounded(kimi_model):
    """The prefill program's `keys` var (Batch.keys: the sm_90a build sizes its expanded-key
    workspaces by it) is set by the engine from the step's own rows: each sequence with a prompt
    row attends over positions up to its last prompt row. A step past the var's bound is refused
    before launch, in one line; the loop's scheduler never builds one (test_scheduler.py)."""
    from kern.errors import BoundsError

    eng = kimi_model.engine
    st = eng.protocol.for_rows(1, None)
    assert st.keys_var == "keys" and st.keys_max >= eng.m.vars["context"].max

    def step(seqs):  # [(first position, rows, prompt_len)]
        cu = np.cumsum([0] + [n for _, n, _ in seqs]).astype(np.int32)
        pos = np.concatenate([np.arange(p, p + n) for p, n, _ in seqs]).astype(np.int32)
        inputs = {st.inputs["cu_seqlens"]: cu, st.inputs["position"]: pos,
                  st.inputs["prompt_len"]: np.asarray([pl for *_, pl in seqs], np.int32)}
        return eng.checked(st.program, st.vars_for(len(seqs), int(cu[-1])), inputs).env["keys"]

    # 40 prompt rows from 10 (keys 0 .. 49); a prompt's last 3 rows and 2 generated (keys 0 .. 99); generated alone
    assert step([(10, 40, 200), (97, 5, 100), (120, 1, 100)]) == 50 + 100
    assert step([(120, 1, 100)]) == 1  # none: the var's least
    n = -(-st.keys_max // 200) + 1  # sequences of 200 prompt keys each, past the bound
    with pytest.raises(BoundsError, match=rf"attend over {200 * n} keys, above the var bound keys <= {st.keys_max}"):
        step([(199, 1, 1000)] * n)


def test_warm_up_runs_decode_rows_never_prompt_rows(kimi_dep, kimi_ckpt):
    """warm_up's scratch rows are generated tokens: with prompt_len a role (the hybrid's MLA
    takes prompt and generated rows in different forms) they take the decode program, never the
    ragged prefill, whose prompt rows at the top reach bucket plus a batch's padding rows at
    position 0 counted context + n - 1 keys, past the keys var's bound (kern serve refused its
    own warm-up at a 132096-position checkpoint). CPU has no graphs: the runner is told it has."""
    model = Model(kimi_dep / "manifest.json", kimi_ckpt, run_ahead=4)
    loop, runner = model.loop, model.loop.runner
    runner.graphs = True
    ran = []
    model.loop.engine.observers.append(lambda program, env, inputs: ran.append(program))
    assert loop.warm_up(sizes=[1, 2], progress=False) > 0
    assert ran and runner.ragged.program not in ran
    assert set(ran) <= {d.program for d in runner.decoders}
