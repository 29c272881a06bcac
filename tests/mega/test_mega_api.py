"""kern.MegaModel's host side without a GPU: a device that keeps buffers in host memory and
records each program it is asked to run stands in for CUDA, so what MegaModel sends (vars,
packed prompts, positions, cu_seqlens, page tables) is checked by the real engine against the
manifest's shapes and domains, and read back here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kern.mega import MegaModel
from kern.runtime.devices.cpu import CpuDevice
from kern.errors import BoundsError
from kern_models.llama.generator import generate

from tests.reliability.conftest import write_safetensors

CONFIG = dict(architectures=["LlamaForCausalLM"], hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, intermediate_size=256, vocab_size=256, max_position_embeddings=256,
              tie_word_embeddings=True)


class Recording(CpuDevice):
    """Host buffers, no kernels: each run is recorded with the inputs as the device holds them."""

    def __init__(self):
        super().__init__()
        self.runs: list[tuple[int, dict]] = []

    def load_module(self, name: str, data: bytes) -> None:
        pass

    def lower(self, launches, buffers, states, graph: bool = False):
        dev = self

        class Program:
            runs_steps_natively = False

            def run(self, env, wait=True):
                dev.runs.append((len(launches), dict(env)))

        return Program()


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(0)
    h, i, hd = 128, 256, 64
    w = lambda *shape: rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16
    tensors = {"model.embed_tokens.weight": w(256, h), "model.norm.weight": w(h)}
    for l in range(2):
        p = f"model.layers.{l}."
        tensors.update({p + "input_layernorm.weight": w(h), p + "post_attention_layernorm.weight": w(h),
                        p + "self_attn.q_proj.weight": w(2 * hd, h), p + "self_attn.k_proj.weight": w(hd, h),
                        p + "self_attn.v_proj.weight": w(hd, h), p + "self_attn.o_proj.weight": w(h, 2 * hd),
                        p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
                        p + "mlp.down_proj.weight": w(h, i)})
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    write_safetensors(ckpt / "model.safetensors", {k: v.astype(np.uint16) for k, v in tensors.items()})
    (ckpt / "config.json").write_text(json.dumps(CONFIG))
    manifest = generate(CONFIG, tmp_path / "mega", target="mega", model="tiny")
    m = MegaModel(manifest, ckpt, sequences=3, context=64, device=Recording())
    m.engine.device.runs.clear()  # the rope table's once program, at load
    return m


def test_generate_batch_is_one_run_of_packed_prompts(model):
    eng = model.engine
    out = model.generate_batch([[5, 6, 7], [9], [1, 2]], 4)
    (launches, env), = eng.device.runs
    assert launches == 1 and model.launches_per_generation == 1
    g = model.gen
    assert (env[g.rows_var], env[g.groups_var], env[g.new_var]) == (6, 3, 4)
    assert eng.read(g.token, env).tolist() == [5, 6, 7, 9, 1, 2]
    assert eng.read(g.position, env).tolist() == [0, 1, 2, 0, 0, 1]
    assert eng.read(g.cu_seqlens, env).tolist() == [0, 3, 4, 6]
    table = eng.read(g.page_table, env)
    assert table[:, :4].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # 4 pages of 16 a sequence
    assert out == [[0] * 4] * 3  # what the (recording) device left in the tokens output


def test_the_weights_table_holds_each_weights_address(model):
    eng = model.engine
    table = eng.buffers["mega_weights"]
    entries = eng.m.buffers["mega_weights"].entries
    assert table.tolist() == [eng.device.address(eng.buffers[e]) for e in entries]


def test_decode_step_runs_the_one_row_decode_program(model):
    model.decode_step(7, 5, seq=2)
    (launches, env), = model.engine.device.runs
    st = model.decode
    assert launches == 1 and env[st.groups_var] == 1
    assert model.engine.read(st.inputs["position"], env).tolist() == [5]
    assert model.engine.read(st.page_tables[0].buffer, env)[0, :4].tolist() == [8, 9, 10, 11]


@pytest.mark.parametrize("call, says", [
    (lambda m: m.generate_batch([[1]] * 4, 2), "4 sequences at 64 positions each: the state holds 3"),
    (lambda m: m.generate([1] * 60, 8), "generate: max_tokens is 8, but the prompt's 60 tokens leave room for at "
     "most 4 in this model's context of 64 positions"),
    (lambda m: m.generate_batch([[1], []], 2), "generate: every prompt needs at least one token"),
    (lambda m: m.decode_step(1, 64), "decode_step: position 64 is outside the context [0, 64)"),
    (lambda m: m.generate([300], 2), "input 'g_ids' holds values in [300, 300], outside its domain [0, 256)"),
])
def test_what_the_state_or_the_manifest_cannot_hold_is_one_line(model, call, says):
    with pytest.raises(BoundsError) as e:
        call(model)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert model.engine.device.runs == []
