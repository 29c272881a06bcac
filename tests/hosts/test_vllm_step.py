"""The plugin's torch side on the CPU (kern.hosts.vllm.model.step and compute_logits), with
vllm's modules faked (fake_vllm.py) and kern's launches replaced by a fake that reads the
role buffers the step filled, as the programs would: each sequence's logits row records the
token, position and page its last row was given. vLLM's metadata is faked at its real shapes
and dtypes (torch: input_ids i32, positions i64, query_start_loc i32, block table i32)."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kern.manifest.expr import evaluate  # noqa: E402
from kern.manifest.protocol import derive  # noqa: E402

from . import fake_vllm  # noqa: E402
from .test_host_batch import BLOCK, fake_vllm_batch  # noqa: E402

WIDTH = 8  # the fake logits' width


class FakeLaunches:
    """Stands for the programs: logits[k] = (token, position, page, rows) of group k's last row."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def enqueue(self, program, env, stream):
        t = self.model.views[program]
        self.calls.append((program, dict(env)))
        st = next(s for s in self.model.protocol.steppers if s.program == program)
        groups = env[st.groups_var] if st.groups_var else st.groups_max
        cu = t["cu_seqlens"][:groups + 1]
        table = t[st.page_tables[0].buffer]
        for k in range(groups):
            last = int(cu[k + 1]) - 1
            pos = int(t["position"][last])
            t["logits"][k, :4] = torch.tensor([float(t["token"][last]), float(pos),
                                               float(table[k, pos // BLOCK]), float(cu[k + 1] - cu[k])])


@pytest.fixture
def model(monkeypatch, verified_1b):
    fake_vllm.install(monkeypatch)
    fake_vllm.CONFIG.compilation_config.static_forward_context.clear()
    from torch import nn

    from kern.hosts.layout import host_layouts
    from kern.hosts.vllm import model as plugin
    from kern.hosts.vllm.backend import KernStateLayer

    monkeypatch.setattr(plugin.torch.cuda, "current_stream", lambda: NS(cuda_stream=0))
    monkeypatch.setattr(plugin.torch.cuda, "is_current_stream_capturing", lambda: False)
    m = plugin.KernForCausalLM.__new__(plugin.KernForCausalLM)
    nn.Module.__init__(m)
    m.v, m.protocol = verified_1b, derive(verified_1b)
    m.layout = host_layouts(verified_1b)["kv"]
    m.state = KernStateLayer(m.layout, 0)
    m.max_seqs, m.max_rows = 600, 4096  # vLLM's max_num_seqs, max_num_batched_tokens
    m.logits = torch.zeros((m.max_seqs, WIDTH))
    m.hidden = torch.full((m.max_rows + 1, 1), -1.0)
    m.arange = torch.arange(m.max_rows + 1, dtype=torch.int32)
    env = {**verified_1b.constants, **{n: var.max for n, var in verified_1b.manifest.vars.items()}}
    bufs = verified_1b.manifest.buffers
    m.views = {}
    for st in m.protocol.steppers:
        named = {**st.inputs, st.page_tables[0].buffer: st.page_tables[0].buffer}
        views = {role: torch.zeros(tuple(evaluate(d, env) for d in bufs[b].shape), dtype=torch.int32)
                 for role, b in named.items() if bufs[b].dtype == "i32"}
        views["logits"] = torch.zeros((st.groups_max, WIDTH))
        m.views[st.program] = views
    m.engine = NS(env=lambda program, vars: vars, programs={st.program: st.program for st in m.protocol.steppers})
    m.enqueuer = FakeLaunches(m)
    m.trace = None
    return m


def common(qsl_cpu, qsl_gpu, b, max_seq_len):
    return NS(query_start_loc_cpu=torch.from_numpy(qsl_cpu), query_start_loc=torch.from_numpy(qsl_gpu),
              num_reqs=len(qsl_cpu) - 1, max_seq_len=max_seq_len, block_table_tensor=torch.from_numpy(b.block_table),
              seq_lens=torch.from_numpy(b.seq_lens))


def sample(model, c, n_rows):
    """What vLLM's runner does after the forward: hidden[logits_indices] -> compute_logits."""
    qsl = c.query_start_loc
    return model.compute_logits(model.hidden[:n_rows][(qsl[1:] - 1).long()])


@pytest.mark.parametrize("computed, scheduled", [
    ([0, 100, 37, 500], [300, 1, 1, 64]),  # a mixed step: one ragged call
    ([100 + i for i in range(12)], [1] * 12),  # a decode step: the wide program
    ([0] * 6, [400] * 6),  # 2,400 rows: past the ragged program's 2,048, split over two calls
])
def test_each_sequence_gets_the_logits_of_its_last_row(model, computed, scheduled):
    qsl, b = fake_vllm_batch(computed, scheduled, padded_rows=5)
    ids, pos = torch.from_numpy(b.input_ids), torch.from_numpy(b.positions)
    c = common(qsl, qsl, b, int(b.seq_lens.max()))
    model.step(c, ids, pos)
    out = sample(model, c, len(ids))
    for s in range(len(scheduled)):
        last = int(qsl[s + 1]) - 1
        p = int(b.positions[last])
        assert out[s, :3].tolist() == [b.input_ids[last], p, b.block_table[s, p // BLOCK]]
    assert len(model.enqueuer.calls) == (2 if sum(scheduled) > 2048 else 1)


def test_prompt_rows_have_no_logits(model):
    qsl, b = fake_vllm_batch([0], [20])
    c = common(qsl, qsl, b, 20)
    model.step(c, torch.from_numpy(b.input_ids), torch.from_numpy(b.positions))
    out = model.compute_logits(model.hidden[:20])  # prompt logprobs ask for every row
    assert torch.isnan(out[:19]).all() and not torch.isnan(out[19]).any()


def test_a_replayed_decode_graph_gives_padded_rows_position_zero(model):
    """A full graph is captured with 8 one-row requests; replayed with 5 live ones, vLLM's
    query_start_loc repeats 5 and its block table's padded rows are zero; the stale positions
    of the padded rows must not reach the programs."""
    qsl_live, b = fake_vllm_batch([50, 60, 70, 80, 90, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1])
    b.block_table[5:] = 0
    b.positions[5:] = 1000  # stale
    qsl_gpu = np.array([0, 1, 2, 3, 4, 5, 5, 5, 5], np.int32)
    c = common(np.arange(9, dtype=np.int32), qsl_gpu, b, 1024)  # planned at capture: 8 rows
    model.step(c, torch.from_numpy(b.input_ids), torch.from_numpy(b.positions))
    (program, env), = model.enqueuer.calls
    assert program == "decode" and env == {"seqs": 8, "reach": 1024, "mask_rows": 1}
    t = model.views["decode"]
    assert t["position"][:8].tolist() == [50, 60, 70, 80, 90, 0, 0, 0]
    assert t["cu_seqlens"][:9].tolist() == list(range(9))
    out = sample(model, c, 8)
    assert out[:5, 1].tolist() == [50, 60, 70, 80, 90]


def test_the_spec_makes_vllm_count_kern_pages(model):
    spec = model.state.get_kv_cache_spec(None)
    assert spec.block_size == 16 and spec.page_size_bytes == model.layout.page_bytes
    backend = model.state.get_attn_backend()
    assert backend.get_kv_cache_shape(1000, 16, spec.num_kv_heads, spec.head_size) == (1000, 16, 2, 8, 16, 64)
    assert "kern_states.0" in fake_vllm.CONFIG.compilation_config.static_forward_context


def test_kern_trace_records_the_steps_vllm_fed_as_a_kern_bench_workload(model, tmp_path):
    """KERN_TRACE: every call the plugin ran, as `kern serve --trace` writes it, so `kern bench
    --workload` prices the steps vLLM fed kern (docs/vllm.md). A step past the ragged program's
    rows is two calls; a graph capture is left out (vLLM replays it without the model)."""
    from kern.bench.trace import is_trace, open_trace, parse

    path = tmp_path / "vllm.trace"
    model.trace = open_trace(path, "m", "KERN_TRACE")
    steps = [([0, 100, 37], [300, 1, 1]), ([0] * 6, [400] * 6), ([100 + i for i in range(12)], [1] * 12)]
    for computed, scheduled in steps:
        qsl, b = fake_vllm_batch(computed, scheduled)
        model.step(common(qsl, qsl, b, int(b.seq_lens.max())), torch.from_numpy(b.input_ids),
                   torch.from_numpy(b.positions))
    text = path.read_text()
    lines = [json.loads(ln) for ln in text.splitlines()]
    assert is_trace(text) and lines[0] == {"kern_trace": 1, "model": "m"}
    assert [ln["program"] for ln in lines[1:]] == [c[0] for c in model.enqueuer.calls]  # one line a call: 1 + 2 + 1
    assert lines[1]["rows"] == [300, 1, 1] and lines[1]["start"] == [0, 100, 37]
    assert sum(sum(ln["rows"]) for ln in lines[2:4]) == 2400 and lines[-1]["start"] == [100 + i for i in range(12)]
    wl = parse(text, str(path))
    assert sum(sh.weight for sh in wl.shapes) == 4 and (12, 1, 128) in {(sh.groups, sh.rows, sh.context) for sh in wl.shapes}


def test_a_trace_path_that_cannot_be_written_is_one_line(tmp_path):
    from kern.bench.trace import open_trace
    from kern.errors import KernError

    with pytest.raises(KernError, match=r"^KERN_TRACE .*missing/x: cannot write"):
        open_trace(tmp_path / "missing" / "x", "m", "KERN_TRACE")
