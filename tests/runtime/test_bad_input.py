"""Bad input gets a clear error naming the problem and the place, before anything launches."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from kern.api import Model
from kern.manifest import load_verified
from kern.runtime.engine import Engine
from kern.errors import BoundsError
from kern.files.errors import ModuleError, WeightError


def _copy(tiny, tmp_path):
    ckpt, manifest = tiny
    c = tmp_path / "ckpt"
    shutil.copytree(ckpt, c)
    d = tmp_path / "deploy"
    shutil.copytree(manifest.parent, d)
    return c, d / "manifest.json"


def test_missing_and_misshaped_tensors_are_listed_together(tiny, tmp_path):
    ckpt, manifest = _copy(tiny, tmp_path)
    f = ckpt / "model.safetensors"
    t = load_file(f)
    del t["model.layers.1.mlp.down_proj.weight"]
    t["model.layers.0.self_attn.k_proj.weight"] = t["model.layers.0.self_attn.k_proj.weight"][:, :10].copy()
    save_file(t, f)
    with pytest.raises(WeightError) as e:
        Engine(load_verified(manifest), ckpt)
    msg = str(e.value)
    assert "buffers.down_w.1.bind[0]: checkpoint has no tensor 'model.layers.1.mlp.down_proj.weight'" in msg
    assert "buffers.qkv_w.0.bind[1]: tensor 'model.layers.0.self_attn.k_proj.weight' is [" in msg
    assert ", 10], the buffer needs [*, 64]" in msg


def test_module_with_wrong_bytes_is_refused_naming_both_hashes(tiny, tmp_path):
    ckpt, manifest = _copy(tiny, tmp_path)
    kernels = manifest.parent / "kernels" / "llama_cpu.py"
    pinned = hashlib.sha256(kernels.read_bytes()).hexdigest()
    kernels.write_text(kernels.read_text() + "\n# tampered\n")
    got = hashlib.sha256(kernels.read_bytes()).hexdigest()
    with pytest.raises(ModuleError) as e:
        Engine(load_verified(manifest), ckpt)
    assert "module 'kernels'" in str(e.value) and pinned in str(e.value) and got in str(e.value)


@pytest.fixture()
def model(tiny):
    return Model(tiny[1], tiny[0])


def test_prompt_longer_than_the_context_bound(model):
    bound = model.engine.m.vars["context"].max
    with pytest.raises(BoundsError, match=f"this model's context is {bound} positions"):
        model.generate(list(range(10)) * (bound // 10 + 1), max_tokens=4)


def test_step_outside_var_bounds_is_refused_before_launch(model):
    st = model.protocol.for_rows(1, None)
    with pytest.raises(BoundsError, match="var tokens = 100000 is outside its bounds"):
        model.engine.run(st.program, {"tokens": 100000, "seqs": 1}, {})


def test_token_outside_the_vocabulary_domain_is_refused(model):
    st = model.protocol.for_rows(1, 1)
    (pt,) = st.page_tables
    with pytest.raises(BoundsError, match=r"holds values in \[999, 999\], outside its domain \[0, 256\)"):
        model.engine.run(st.program, st.vars_for(1, 1), {
            st.inputs["token"]: np.array([999], np.int32), st.inputs["position"]: np.array([0], np.int32),
            pt.buffer: np.zeros((1, model.engine.shapes[pt.buffer][1]), np.int32)})


def test_page_table_outside_the_state_is_refused(model):
    st = model.protocol.for_rows(1, 1)
    (pt,) = st.page_tables
    table = np.zeros((1, model.engine.shapes[pt.buffer][1]), np.int32)
    table[0, 0] = model.engine.pages[pt.state]
    with pytest.raises(BoundsError, match="page table"):
        model.engine.run(st.program, st.vars_for(1, 1), {
            st.inputs["token"]: np.array([1], np.int32), st.inputs["position"]: np.array([0], np.int32),
            pt.buffer: table})


def test_kern_run_reports_a_bad_folder_without_a_traceback(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    r = subprocess.run([sys.executable, "-m", "kern.cli", "run", str(tmp_path), "--prompt", "hi"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "no installed generator builds architectures ['GPT2LMHeadModel']" in r.stderr


def test_a_config_the_generator_cannot_build_is_a_clear_error(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "kern.cli", "run", str(tmp_path), "--prompt", "hi", "--target", "cpu"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "cannot build a cpu deployment" in r.stderr and "rope type 'yarn'" in r.stderr
