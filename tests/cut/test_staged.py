"""Pipeline stages across devices on the cpu (kern.world.staged): kern cut's stages, each on a
CpuDevice of its own and a thread of its own, give the one device's logits and tokens bit for
bit; a decode step's micro-batches are in flight in several stages at once; what cannot be
pipelined is refused in one line."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kern.api import Model
from kern.generation import SamplingParams

pytest.importorskip("torch")

PROMPTS = [[int(i) for i in np.random.default_rng(s).integers(0, 256, 3 + 9 * s)] for s in range(6)]


@pytest.fixture(scope="module")
def models(tiny_a, tiny_ckpt):
    return {n: Model(tiny_a, tiny_ckpt, **({"pp": n} if n > 1 else {})) for n in (1, 2, 3)}


def test_each_stage_runs_on_its_own_device_with_its_own_weights(models):
    e = models[2].engine
    assert len(e.stages) == 2 and e.stages[0].device is not e.stages[1].device
    weights = [{b for b, x in s.m.buffers.items() if x.kind == "weight"} for s in e.stages]
    assert weights[0] and weights[1] and not weights[0] & weights[1]


@pytest.mark.parametrize("n", [2, 3])
def test_stages_give_the_one_device_tokens_bit_for_bit(models, n):
    """Six sequences, four at a time (the deployment's bound), decode in micro-batches."""
    params = SamplingParams(max_tokens=10)
    one = [g.tokens for g in models[1].generate_batch(PROMPTS, params)]
    assert [g.tokens for g in models[n].generate_batch(PROMPTS, params)] == one


def _decode_step_logits(m, seqs: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each of `seqs` prompts prefilled alone, then one decode step of all of them (micro-batched
    where pipelined): the step's tokens, its logits read whole, and two rows read alone."""
    from kern.drive.raw_pages import raw

    prompts = [p[:20] for p in PROMPTS[:seqs]]
    pages = [raw(m).take(2) for _ in range(seqs)]
    try:
        for p, pg in zip(prompts, pages):
            raw(m).step_rows(p, 0, pg, ragged=True)
        tokens, logits = raw(m).step_many([p[:1] for p in prompts], [len(p) for p in prompts], pages)
        st = m.protocol.for_rows(seqs, 1)
        env = m.engine.env(st.program, st.vars_for(seqs, 1, reach=max(map(len, prompts)) + 1))
        return tokens, logits, m.engine.read_rows(st.outputs["logits"], env, [3, 1])
    finally:
        for pg in pages:
            raw(m).give(pg)


def test_a_micro_batched_steps_outputs_are_gathered_bit_for_bit(models):
    one, two = _decode_step_logits(models[1]), _decode_step_logits(models[2])
    assert [x.tobytes() for x in one] == [x.tobytes() for x in two]
    assert one[2].tobytes() == one[1][[3, 1]].tobytes()


def test_teacher_forced_logits_are_the_one_devices_bytes(models):
    from kern.drive.parity import teacher_forced

    ids = [int(i) for i in np.random.default_rng(0).integers(0, 256, 40)]
    assert teacher_forced(models[1], ids).tobytes() == teacher_forced(models[2], ids).tobytes()


def test_a_decode_steps_micro_batches_are_in_flight_in_both_stages_at_once(models):
    """Stage 1 holds its first micro-batch until stage 0 has started its second: a pipeline that
    ran the stages one after another would wait here until the timeout."""
    e = models[2].engine
    started = threading.Event()
    seen = {"stage0": 0, "overlap": None}

    def stage0(program, env, inputs):
        if program == "decode":
            seen["stage0"] += 1
            if seen["stage0"] == 2:
                started.set()

    def stage1(program, env, inputs):
        if program == "decode" and seen["overlap"] is None:
            seen["overlap"] = started.wait(timeout=20)

    e.stages[0].observers.append(stage0)
    e.stages[1].observers.append(stage1)
    try:
        _decode_step_logits(models[2])  # one decode step of four sequences: two micro-batches
    finally:
        e.stages[0].observers.pop()
        e.stages[1].observers.pop()
    assert seen["overlap"] is True and e.micro_batches == 2


def test_a_bad_step_is_refused_once_before_any_stage_runs(models):
    from kern.errors import BoundsError

    m = models[2]
    st = m.protocol.for_rows(1, 1)
    with pytest.raises(BoundsError, match=r"input 'd_ids' holds values in \[9999, 9999\], outside its domain"):
        m.engine.run(st.program, st.vars_for(1, 1, reach=8), {st.inputs["token"]: [9999], st.inputs["position"]: [0]})


def test_more_stages_than_weights_is_one_line(tiny_a, tiny_ckpt):
    from kern.world.staged import StageError

    with pytest.raises(StageError, match=r"^--pp 1000: 1000 stages need at least 1000 weights to own; "
                                         r"the manifest binds \d+$"):
        Model(tiny_a, tiny_ckpt, pp=1000)


def test_a_family_whose_stages_would_keep_different_states_is_one_line(tmp_path):
    """Kimi-Linear's KDA layers keep a per-sequence state, its MLA layer the paged cache: a stage
    of KDA layers only would plan a pool of its own."""
    from kern_models.kimi_linear.generator import generate
    from kern_models.kimi_linear.random_checkpoint import make

    import json

    from kern.world.staged import StageError

    ckpt = make("tiny", tmp_path / "ck", max_positions=512)
    dep = tmp_path / "dep"
    generate(json.loads((ckpt / "config.json").read_text()), dep, target="cpu", model="k", tokens=64, seqs=4,
             context=256)
    with pytest.raises(StageError, match=r"^--pp 2: stage \d keeps states .* the stages share one pool, so a "
                                         r"stage keeps every state or none; this deployment does not pipeline yet$"):
        Model(dep, ckpt, pp=2)


def test_pp_with_tp_is_refused_by_load(tiny_a):
    from kern.api import load
    from kern.errors import KernError

    with pytest.raises(KernError, match=r"^--pp 2 with --tp 2: pipeline stages of a split deployment are not "
                                        r"supported yet; give one of them$"):
        load(tiny_a, pp=2, tp=2)


def test_kern_run_pp_2_gives_the_one_device_text(capsys, tmp_path, monkeypatch):
    from tests.reliability.conftest import kern, make_tiny

    monkeypatch.setenv("KERN_CACHE", str(tmp_path / "cache"))
    tiny = make_tiny(tmp_path / "tiny")
    args = ["run", str(tiny), "--target", "cpu", "--prompt", "w1 w2 w3", "--max-tokens", "8"]
    one = kern(capsys, *args)
    two = kern(capsys, *args, "--pp", "2")
    assert one.code == two.code == 0
    assert two.out == one.out and two.out.strip()
    assert "on cpu x 2 (pipeline stages)" in two.err


@pytest.mark.parametrize("flags, line", [
    (["--pp", "2", "--tp", "2"], "kern serve: --pp 2 with --tp 2: pipeline stages of a split deployment are not "
                                 "supported yet; give one of them"),
    (["--pp", "2", "--host-memory", "1G"], "kern serve: --host-memory: a split or pipelined deployment (--tp, --ep "
                                           "or --pp above 1) has no host tier; leave it out or give 0"),
])
def test_kern_serve_refuses_what_pp_cannot_honour_in_one_line(capsys, flags, line):
    from tests.reliability.conftest import kern

    r = kern(capsys, "serve", "/nonexistent", *flags)
    assert r.code == 1 and r.err.strip() == line


def test_a_micro_batch_takes_its_groups_of_each_input_and_rebased_cu_seqlens():
    """The cuda decode programs take cu_seqlens (0, 1, .., n): a micro-batch's starts at 0."""
    from kern.world.staged import micro_inputs

    step = {"ids": np.array([7, 8, 9, 10, 11]), "cu": np.arange(6, dtype=np.int32),
            "table": np.arange(10).reshape(5, 2)}
    got = micro_inputs(step, 2, 4, "cu")
    assert got["ids"].tolist() == [9, 10] and got["cu"].tolist() == [0, 1, 2]
    assert got["table"].tolist() == [[4, 5], [6, 7]]


def test_a_steps_outputs_stay_readable_after_another_programs_step(models):
    """The loop may launch a prefill before it reads the decode step's logits (their buffers are
    apart): a micro-batched step's gathered outputs outlive the next program's step."""
    from kern.drive.raw_pages import raw

    got = []
    for m in (models[1], models[2]):
        prompts = [p[:20] for p in PROMPTS[:4]]
        pages = [raw(m).take(2) for _ in range(5)]
        try:
            for p, pg in zip(prompts, pages):
                raw(m).step_rows(p, 0, pg, ragged=True)
            raw(m).step_many([p[:1] for p in prompts], [len(p) for p in prompts], pages[:4])
            st = m.protocol.for_rows(4, 1)
            env = m.engine.env(st.program, st.vars_for(4, 1, reach=21))
            raw(m).step_rows(PROMPTS[5][:9], 0, pages[4], ragged=True)  # another program's step
            got.append(m.engine.read(st.outputs["logits"], env))
        finally:
            for pg in pages:
                raw(m).give(pg)
    assert got[0].tobytes() == got[1].tobytes()


def _run_steps(m, steps: int = 5, seqs: int = 4, observe=None):
    """run_steps as the loop's run-ahead drives it: `steps` decode steps of `seqs` sequences,
    each step's tokens fed back; every step's tokens and logits."""
    from kern.drive.raw_pages import raw

    prompts = [p[:20] for p in PROMPTS[:seqs]]
    pages = [raw(m).take(2) for _ in range(seqs)]
    try:
        first = [raw(m).step_rows(p, 0, pg, ragged=True)[0] for p, pg in zip(prompts, pages)]
        st = m.protocol.for_rows(seqs, 1)
        table = np.zeros((seqs, m.engine.shapes[st.page_tables[0].buffer][1]), np.int32)
        for i, pg in enumerate(pages):
            table[i, :len(pg)] = pg
        pos = np.array([len(p) for p in prompts], np.int32)
        inputs = {st.inputs["token"]: np.array(first, np.int32), st.inputs["position"]: pos,
                  st.page_tables[0].buffer: table}
        later = [{st.inputs["position"]: pos + j} for j in range(1, steps)]
        return m.engine.run_steps(st.program, st.vars_for(seqs, 1, reach=int(pos.max()) + steps), inputs, later,
                                  {st.outputs["tokens"]: st.inputs["token"]}, [st.outputs["logits"]])
    finally:
        for pg in pages:
            raw(m).give(pg)


def test_run_steps_feeds_each_micro_batch_back_and_gives_the_one_devices_bytes(models):
    one, two, three = (_run_steps(models[n]) for n in (1, 2, 3))
    assert len(one) == 5
    for a, b, c in zip(one, two, three):
        assert sorted(a) == sorted(b) == sorted(c)
        assert all(a[k].tobytes() == b[k].tobytes() == c[k].tobytes() for k in a)


def test_run_steps_starts_the_next_step_while_the_last_stage_finishes_this_one(models):
    """Stage 1 holds the last micro-batch of step 0 until stage 0 has started step 1's first:
    micro-batch 0 of step 1 needs only micro-batch 0 of step 0 sampled."""
    e = models[2].engine
    started = threading.Event()
    calls = {0: 0, 1: 0}
    seen = {}

    def stage0(program, env, inputs):
        if program == "decode":
            calls[0] += 1
            if calls[0] == e.micro_batches + 1:
                started.set()

    def stage1(program, env, inputs):
        if program == "decode":
            calls[1] += 1
            if calls[1] == e.micro_batches:
                seen["overlap"] = started.wait(timeout=20)

    e.stages[0].observers.append(stage0)
    e.stages[1].observers.append(stage1)
    try:
        _run_steps(models[2], steps=2)
    finally:
        e.stages[0].observers.pop()
        e.stages[1].observers.pop()
    assert seen == {"overlap": True}


def test_the_loop_running_ahead_through_the_stages_gives_the_one_devices_tokens(models, tiny_a, tiny_ckpt):
    """As on cuda, where the loop runs 8 steps a host wait: run_steps through the stages."""
    ahead = Model(tiny_a, tiny_ckpt, pp=2, run_ahead=4)
    runs = []
    plain = ahead.engine.run_steps
    ahead.engine.run_steps = lambda *a, **kw: runs.append(len(a[3]) + 1) or plain(*a, **kw)
    params = SamplingParams(max_tokens=12)
    assert [g.tokens for g in ahead.generate_batch(PROMPTS, params)] == \
        [g.tokens for g in models[1].generate_batch(PROMPTS, params)]
    assert runs and max(runs) == 4


def test_the_megakernel_deployment_does_not_pipeline_in_one_line():
    """--mega with --pp: its decode is one cooperative launch over a pointer table."""
    from pathlib import Path

    from kern.manifest.verify import load_verified
    from kern.world.staged import StageError, cut_stages

    mega = Path(__file__).resolve().parents[2] / "examples" / "smollm2-135m-instruct-sm90a-mega"
    with pytest.raises(StageError, match=r"^--pp 2: kern cut takes a single-rank manifest without peer or pointers "
                                         r"buffers \(.*\)$"):
        cut_stages(load_verified(mega), 2)


def test_the_sm90a_deployment_cuts_into_stages_a_gpu_can_run():
    """No GPU needed to cut: the sm_90a example's two stages verify in memory, and its decode
    programs' inputs are laid out by sequence (cu_seqlens rebased), so they micro-batch."""
    from pathlib import Path

    from kern.manifest.protocol import derive
    from kern.manifest.verify import load_verified
    from kern.world.staged import cut_stages

    v = load_verified(Path(__file__).resolve().parents[2] / "examples" / "smollm2-135m-instruct-sm90a")
    stages, plan = cut_stages(v, 2)
    assert [sorted(s.manifest.states) for s in stages] == [sorted(v.manifest.states)] * 2
    for st in derive(v).steppers:
        if st.rows == 1 and st.groups_var:
            shapes = {b: list(v.manifest.buffers[b].shape[:1]) for r, b in st.inputs.items() if r != "cu_seqlens"}
            assert all(s == [st.groups_var] for r, s in shapes.items() if r not in (st.inputs.get("mask"),)), shapes


def test_a_stage_failing_mid_flow_raises_its_own_error(models):
    """A token outside the vocabulary in the second of run_steps' steps is refused by the stage
    that checks it when its turn comes; that error, not the others' giving up, reaches the caller."""
    from kern.drive.raw_pages import raw
    from kern.errors import BoundsError

    m = models[2]
    pages = [raw(m).take(2) for _ in range(2)]
    try:
        st = m.protocol.for_rows(2, 1)
        table = np.zeros((2, m.engine.shapes[st.page_tables[0].buffer][1]), np.int32)
        table[:, :2] = pages
        pos = np.array([3, 4], np.int32)
        with pytest.raises(BoundsError, match=r"input 'd_ids' holds values in \[99999, 99999\], outside its domain"):
            m.engine.run_steps(st.program, st.vars_for(2, 1, reach=8),
                               {st.inputs["token"]: np.array([1, 2], np.int32), st.inputs["position"]: pos,
                                st.page_tables[0].buffer: table},
                               [{st.inputs["token"]: np.array([1, 99999], np.int32)}], {}, [st.outputs["tokens"]])
    finally:
        for pg in pages:
            raw(m).give(pg)
