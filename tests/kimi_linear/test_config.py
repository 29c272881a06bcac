"""What the Kimi-Linear generator reads from a config.json (the published one's layout and the
one transformers writes), each config it refuses in one line naming the field, and the router
kernel's choices against transformers' KimiLinearTopkRouter."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kern_models.common.errors import ConfigError
from kern_models.kimi_linear.config import KDA, MLA, shape_of
from kern_models.kimi_linear.random_checkpoint import EXPERT_CALM, SHAPES, factors, shape_config

BASE = {"architectures": ["KimiLinearForCausalLM"], **shape_config("tiny")}
# the published config.json's own names (Kimi-Linear-48B-A3B-Instruct), before transformers renames them
PUBLISHED = {
    "architectures": ["KimiLinearForCausalLM"], "hidden_size": 2304, "intermediate_size": 9216,
    "moe_intermediate_size": 1024, "num_hidden_layers": 27, "num_attention_heads": 32, "num_key_value_heads": 32,
    "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "first_k_dense_replace": 1,
    "moe_router_activation_func": "sigmoid", "moe_renormalize": True, "routed_scaling_factor": 2.446,
    "num_expert_group": 1, "topk_group": 1, "vocab_size": 163840, "model_max_length": 1048576,
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128, "num_heads": 32,
                           "short_conv_kernel_size": 4,
                           "kda_layers": [l for l in range(1, 28) if l not in (4, 8, 12, 16, 20, 24, 27)]},
}


def test_the_published_config_reads_as_kimi_linear_48b():
    s = shape_of(PUBLISHED)
    assert s.mla_layers == [3, 7, 11, 15, 19, 23, 26] and len(s.kda_layers) == 20
    assert s.sparse == (False,) + (True,) * 26
    assert (s.kda_heads, s.kda_dim, s.conv, s.kv_lora, s.rope, s.experts, s.top_k, s.shared, s.max_pos) == \
        (32, 128, 4, 512, 64, 256, 8, 1, 1048576)
    ours = shape_of({"architectures": ["KimiLinearForCausalLM"], **shape_config("kimi-linear-48b-a3b"),
                     "max_position_embeddings": 1048576})
    assert ours == s  # the random checkpoints' shape is the published one


def test_the_real_width_calms_its_experts_and_the_tiny_shape_keeps_its_factors():
    """The tiny shape's sharpening factors are the ones CI's weights were made with, bit for bit;
    at the real width the experts take EXPERT_CALM past the width scaling (random_checkpoint's
    comment says why)."""
    tiny, real = (SimpleNamespace(**shape_config(name)) for name in ("tiny", "kimi-linear-48b-a3b"))
    assert factors(tiny) == (20.0, 1.0, 40.0)
    router, expert, head = factors(real)
    assert (router, head) == pytest.approx((20.0 / 6, 40.0 / 6))
    assert expert == pytest.approx((32 / 1024) ** 0.5 * EXPERT_CALM) and EXPERT_CALM < 1


def test_the_random_checkpoint_says_its_layers_in_the_published_fields_too(kimi_config):
    """vLLM's KimiLinearConfig reads the published fields alone (linear_attn_config,
    first_k_dense_replace, mla_use_nope), never transformers' layer_types: read that way, the
    random checkpoint is the same model."""
    published = {k: v for k, v in kimi_config.items()
                 if k not in ("layer_types", "mlp_layer_types", "linear_head_dim", "linear_num_heads",
                              "linear_conv_kernel_dim")}
    assert shape_of(published) == shape_of(kimi_config)
    assert kimi_config["mla_use_nope"] is True and kimi_config["first_k_dense_replace"] == 1


@pytest.mark.parametrize("spec", [{}, {"layer_types": None, "mlp_layer_types": None, "num_hidden_layers": 9}])
def test_layer_kinds_follow_transformers(spec):
    """As given, and transformers' defaults (full attention every 4th layer from 4, dense below
    first_k_dense_replace) when a config names none."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.KimiLinearConfig(**{**shape_config("tiny"), **spec})
    s = shape_of({**cfg.to_dict(), "architectures": ["KimiLinearForCausalLM"]})
    assert s.mixers == tuple(cfg.layer_types) and s.sparse == tuple(t == "sparse" for t in cfg.mlp_layer_types)


@pytest.mark.parametrize("change,message", [
    ({"architectures": ["Qwen3MoeForCausalLM"]},
     "config.json architectures ['Qwen3MoeForCausalLM']: this generator builds KimiLinearForCausalLM"),
    ({"layer_types": [KDA, MLA]}, "config.json layer_types must give each of the 4 layers 'linear_attention' or "
                                  "'full_attention', got ['linear_attention', 'full_attention']"),
    ({"mlp_layer_types": ["dense", "moe", "sparse", "sparse"]}, "config.json mlp_layer_types must give each of the "
     "4 layers 'dense' or 'sparse', got ['dense', 'moe', 'sparse', 'sparse']"),
    ({"layer_types": None, "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [5]}},
     "config.json linear_attn_config.full_attn_layers: 5 is not a layer in 1..4"),
    ({"num_key_value_heads": 2}, "config.json num_key_value_heads 2 must equal num_attention_heads 4 (MLA)"),
    ({"num_experts_per_tok": 9}, "config.json experts 8, top k 9, groups 2, topk_group 1: top k must not exceed the "
     "experts, which split evenly into groups, and topk_group must not exceed the groups"),
    ({"moe_router_activation_func": "softmax"},
     "config.json moe_router_activation_func 'softmax': only sigmoid is supported"),
    ({"kv_lora_rank": None}, "config.json lacks kv_lora_rank"),
    ({"hidden_act": "gelu"}, "config.json hidden_act 'gelu': only silu is supported"),
    ({"linear_attn_config": [1]}, "config.json linear_attn_config must be an object, got [1]"),
])
def test_a_config_it_cannot_build_is_one_line_naming_the_field(change, message):
    with pytest.raises(ConfigError) as e:
        shape_of({**BASE, **change})
    assert str(e.value) == message


@pytest.mark.parametrize("form", ["blocked", "Tokens", ""])
def test_an_unknown_prompt_form_of_the_recurrence_is_one_line_naming_it(form, tmp_path):
    from kern_models.kimi_linear.generator import generate

    with pytest.raises(ConfigError) as e:
        generate({**BASE}, tmp_path, target="cpu", kda_form=form)
    assert str(e.value) == f"kda_form {form!r}: the cpu recurrence's prompt form is one of tokens, chunked"


@pytest.mark.parametrize("target", ["cuda", "sm_90a"])
def test_the_gpu_build_s_prompt_forms_and_the_refused_ones_in_one_line(target, tmp_path):
    """sm_90a's prompt recurrence, under the ops kda_chunked and kda_step that kern test pairs
    with the reference's: chunks fixed by position on tensor cores (kda_tc_prep, every row's scores
    at once, then kda_tc_head and kda_tc; decode kda_tc_decode),
    the default build's default; decode's step a token at a time (kda_tokens, decode kda_step), on
    request in either build; or the chunked kernel, the faster build's default, which the
    batch-invariant build refuses (its bits depend on where a prompt was cut). kda_tc's slot
    keeps the chunk's rows: 3 x 16 rows of dim f32 a head a layer more."""
    import json

    from kern_models.kimi_linear.generator import generate

    slots = {}
    tc = "kda_tc_prep+kda_tc_head+kda_tc"  # the rows' scores; the first chunk's rows a sequence continues; the rest
    for options, entry, step in (({}, tc, "kda_tc_decode"), ({"batch_invariant": False}, "kda_chunked", "kda_step"),
                                 ({"kda_form": "tokens"}, "kda_tokens", "kda_step"),
                                 ({"batch_invariant": False, "kda_form": "tokens"}, "kda_tokens", "kda_step"),
                                 ({"batch_invariant": False, "kda_form": "tc"}, tc, "kda_tc_decode")):
        m = json.loads(generate({**BASE}, tmp_path / entry / str(len(options)), target=target, **options).read_text())
        assert "+".join(la["entry"] for la in m["ops"]["kda_chunked"]["impl"]["launches"]) == entry, options
        assert [la["entry"] for la in m["ops"]["kda_step"]["impl"]["launches"]] == [step], options
        slots[entry] = m["constants"]["kda_slot_bytes"]
    assert slots[tc] > slots["kda_tokens"] == slots["kda_chunked"]
    for options, message in (({"kda_form": "blocked"},
                              "kda_form 'blocked': the sm_90a recurrence's prompt form is one of chunked, tokens, tc"),
                             ({"kda_form": "chunked"},
                              "kda_form 'chunked': its bits depend on where a prompt was cut, so the batch-invariant "
                              "build takes 'tc' or 'tokens' (the faster build, batch_invariant=False, takes any)")):
        with pytest.raises(ConfigError) as e:
            generate({**BASE}, tmp_path / "x", target=target, **options)
        assert str(e.value) == message


def _kernels():
    path = Path(__file__).resolve().parents[2] / "models" / "kimi_linear" / "kernels" / "cpu" / "kernels.py"
    spec = importlib.util.spec_from_file_location("kimi_cpu_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("groups,topk_groups", [(1, 1), (4, 2)])
def test_the_router_chooses_as_transformers_does(groups, topk_groups):
    """Selection by sigmoid score + bias inside the best groups, weights from the unbiased
    scores, renormalized and scaled; the bias is large enough to change choices."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearTopkRouter

    cfg = transformers.KimiLinearConfig(**{**shape_config("tiny"), "n_group": groups, "topk_group": topk_groups,
                                           "num_experts_per_tok": 3})
    rng = np.random.default_rng(0)
    router = KimiLinearTopkRouter(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.tensor(rng.normal(0, 0.5, (8, 64)), dtype=torch.float32))
        router.e_score_correction_bias.copy_(torch.tensor(rng.normal(0, 0.2, 8), dtype=torch.float32))
    x = rng.normal(0, 1, (32, 64)).astype(np.float32)
    with torch.no_grad():
        logits, w_ref, ids_ref = (t.numpy() for t in router(torch.tensor(x)))
    ids, w = np.zeros((32, 3), np.int32), np.zeros((32, 3), np.float32)
    _kernels().route(logits, router.e_score_correction_bias.numpy(), ids, w, 2.446, 1, groups, topk_groups)
    order = np.argsort(ids_ref, axis=1)
    assert (np.sort(ids, axis=1) == np.take_along_axis(ids_ref, order, axis=1)).all()
    np.testing.assert_allclose(np.take_along_axis(w, np.argsort(ids, axis=1), axis=1),
                               np.take_along_axis(w_ref, order, axis=1), rtol=1e-6)
    unbiased = np.zeros_like(ids)
    _kernels().route(logits, np.zeros(8, np.float32), unbiased, w, 2.446, 1, groups, topk_groups)
    assert (np.sort(unbiased, axis=1) != np.sort(ids, axis=1)).any()  # the bias steered some choices


def test_ties_go_to_the_lowest_expert():
    ids, w = np.zeros((1, 2), np.int32), np.zeros((1, 2), np.float32)
    _kernels().route(np.zeros((1, 8), np.float32), np.zeros(8, np.float32), ids, w, 1.0, 1, 1, 1)
    assert ids.tolist() == [[0, 1]] and w.tolist() == [[0.5, 0.5]]
