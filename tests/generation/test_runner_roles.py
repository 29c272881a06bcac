"""What the runner writes into a step's role inputs, read off a recording engine: each paged
state's page table and each per-sequence state's slot from the row's own units (a lease holds a
slot of each per-sequence state, at indices of their own), and `seq_len` (the positions a row
holds after the step), advanced step by step in a run-ahead; and `prompt_len`, each request's
prompt length, which makes a prompt token fed alone a prefill row and keys the prefix cache by
role."""

from __future__ import annotations

import numpy as np

from kern.generation.runner import Feed, Runner, Units
from kern.manifest.protocol import PageTable, ServingProtocol, SlotInput, Stepper


def stepper(program: str, rows: int | None, roles: bool = False) -> Stepper:
    p = program[0]
    return Stepper(program=program, groups_var=None, groups_max=4, rows=rows, rows_var=None if rows else "tokens",
                   rows_max=4 if rows else 16,
                   inputs={"token": f"{p}_ids", "position": f"{p}_pos", "seq_len": f"{p}_len",
                           **({"prompt_len": f"{p}_prompt"} if roles and not rows else {})},
                   outputs={"tokens": f"{p}_out"},
                   page_tables=(PageTable(f"{p}_kv", "kv", 4), PageTable(f"{p}_kv2", "kv2", 4)),
                   slots=(SlotInput(f"{p}_rec", "rec"), SlotInput(f"{p}_win", "win")))


class Recording:
    """An engine that keeps every step's inputs and answers token 7 for every row."""

    def __init__(self):
        self.steps: list[dict[str, np.ndarray]] = []
        self.shapes = {f"{p}_{t}": (4, 8) for p in "dp" for t in ("kv", "kv2")}

    def runs_steps_natively(self, program):
        return False

    def run(self, program, vars, inputs=None, wait=True):
        self.steps.append(dict(inputs))
        return {"rows": len(next(iter(inputs.values())))}

    def read(self, buffer, env):
        return np.full(env["rows"], 7, np.int32)

    def run_steps(self, program, vars, inputs, steps, feedback, collect, each=None):
        outs = []
        for j, changed in enumerate([{}] + steps):
            env = self.run(program, vars, {**inputs, **changed})
            outs.append({"d_out": self.read("d_out", env)})
        return outs


class Scratch:
    def page_table(self, state):
        return [0]

    def slot(self, state):
        return 0


def runner(roles: bool = False) -> tuple[Runner, Recording]:
    eng = Recording()
    proto = ServingProtocol((stepper("decode", 1), stepper("prefill", None, roles)), (), {"kv": 4, "kv2": 4})
    return Runner(eng, proto, Scratch()), eng


def test_each_slot_input_takes_its_own_state_s_slot_and_seq_len_the_positions_held():
    r, eng = runner()
    a = Units({"kv": [3, 4], "kv2": [9, 8]}, {"rec": 5, "win": 2})
    b = Units({"kv": [1], "kv2": [6]}, {"rec": 0, "win": 7})
    r.run([Feed([1, 2, 3], 4, a), Feed([5], 0, b)], logits=False)
    (step,) = eng.steps
    assert step["p_rec"].tolist() == [5, 0] and step["p_win"].tolist() == [2, 7]
    assert step["p_kv"][:, :2].tolist() == [[3, 4], [1, 0]] and step["p_kv2"][:, :2].tolist() == [[9, 8], [6, 0]]
    assert step["p_len"].tolist() == [7, 1]


def test_a_run_ahead_advances_seq_len_with_the_position():
    r, eng = runner()
    a = Units({"kv": [3, 4], "kv2": [9, 8]}, {"rec": 5, "win": 2})
    r.run_ahead([Feed([1], 5, a)], 3)
    assert [s["d_len"].tolist() for s in eng.steps] == [[6], [7], [8]]
    assert [s["d_pos"].tolist() for s in eng.steps] == [[5], [6], [7]]
    assert all(s["d_rec"].tolist() == [5] and s["d_win"].tolist() == [2] for s in eng.steps)


def test_where_the_prefill_program_reads_prompt_len_a_prompt_token_fed_alone_is_a_prefill_row():
    """A deployment whose prompt and generated tokens take different forms (its prefill reads
    prompt_len, kimi_linear's cpu build): a one-token feed below its prompt's end goes through
    the prefill program with its prompt length; at or past it, through decode."""
    a = Units({"kv": [3], "kv2": [9]}, {"rec": 5, "win": 2})
    r, eng = runner(roles=True)
    assert r.roles
    r.run([Feed([1], 4, a, prompt=5)], logits=False)  # the prompt's last token, fed alone
    r.run([Feed([2], 5, a, prompt=5)], logits=False)  # the first generated token
    first, second = eng.steps
    assert first["p_pos"].tolist() == [4] and first["p_prompt"].tolist() == [5]
    assert second["d_pos"].tolist() == [5] and "p_pos" not in second
    r, eng = runner()  # prompt_len read nowhere: every one-token feed is a decode row
    assert not r.roles
    r.run([Feed([1], 4, a, prompt=5)], logits=False)
    assert "d_pos" in eng.steps[0]


def test_a_generated_token_is_keyed_apart_from_the_same_id_in_a_prompt():
    from kern.generation.params import SamplingParams
    from kern.generation.sequence import GENERATED, SequenceState

    s = SequenceState("a", [5, 6, 7], SamplingParams(max_tokens=4), None, 0, out=[8, 9], roles=True)
    assert s.keys(0, 5) == [5, 6, 7, 8 | GENERATED, 9 | GENERATED]
    assert s.keys(2, 2) == [7, 8 | GENERATED] and s.key(9) == 9 | GENERATED
    plain = SequenceState("b", [5, 6, 7], SamplingParams(max_tokens=4), None, 0, out=[8, 9])
    assert plain.keys(0, 5) == [5, 6, 7, 8, 9] and plain.key(9) == 9


def test_a_prompt_token_left_alone_is_scheduled_as_a_prefill_row():
    from kern.generation.scheduler import Row, Running, schedule

    run = [Running("d", 1), Running("p", 1, prompt=True)]
    # one group for steps with prefill: the decode row fills it, the prompt token waits
    assert schedule(run, budget=8, chunk_max=8, decode_groups=4, mixed_groups=1) == [Row("d", 1)]
    assert schedule(run, budget=8, chunk_max=8, decode_groups=4, mixed_groups=2) == [Row("d", 1), Row("p", 1)]
