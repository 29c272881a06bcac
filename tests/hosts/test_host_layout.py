"""A host's memory against the manifest's host states (kern.hosts.layout), and what the
verifier says of a host layout (checks/states.py). vLLM's tensors are faked at their real shapes:
the kern backend's [pages, *page axes] and FlashAttention's [2, pages, block, kv_heads, head_dim]."""

from __future__ import annotations

import json

import pytest

from kern.hosts.batch import HostError
from kern.hosts.layout import HostTensor, check, host_layouts
from kern.manifest.verify import verify_text


def contiguous(shape):
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def tensor(shape, dtype="bf16", name="kern_states.0"):
    return HostTensor(name, tuple(shape), contiguous(shape), dtype, 0x7F0000000000)


def test_the_1b_deployment_declares_its_kv_page(verified_1b):
    (layout,) = host_layouts(verified_1b).values()
    assert layout.state == "kv" and layout.dtype == "bf16"
    assert layout.axes == (("layer", 16), ("kv", 2), ("kv_head", 8), ("token", 16), ("dim", 64))
    assert layout.page_tokens == 16
    assert layout.page_bytes == 16 * 16 * 2 * 8 * 64 * 2  # page_tokens * bytes_per_token


def test_the_moe_deployment_declares_the_same_kind_of_page_and_a_hosts_protocol(tmp_path):
    """The Qwen3-MoE family's sm_90a default (Qwen3-30B-A3B's shape) is a host's deployment as
    the dense one is: its attention's KV page declared for the host, its programs the roles the
    plugin maps vLLM's batches onto. (Inside vLLM it has not run yet: docs/vllm.md.)"""
    from kern.hosts.batch import check_protocol
    from kern.manifest.protocol import derive
    from kern.manifest.verify import load_verified
    from kern_models.qwen3_moe.generator import generate
    from tests.qwen3_moe.test_cuda import PUBLISHED

    v = load_verified(generate(PUBLISHED, tmp_path, target="sm_90a", model="qwen3-moe", context=4096))
    (layout,) = host_layouts(v).values()
    layers, kv_heads, head_dim = (PUBLISHED[k] for k in ("num_hidden_layers", "num_key_value_heads", "head_dim"))
    assert layout.axes == (("layer", layers), ("kv", 2), ("kv_head", kv_heads), ("token", 16), ("dim", head_dim))
    check_protocol(derive(v))


def test_the_kern_backends_cache_is_accepted_with_its_pages(verified_1b):
    (layout,) = host_layouts(verified_1b).values()
    assert check(layout, tensor((30_000, 16, 2, 8, 16, 64))) == 30_000


@pytest.mark.parametrize("shape, dtype, why", [
    ((2, 30_000, 16, 8, 64), "bf16", "FlashAttention's layout, one tensor a layer"),
    ((30_000, 16, 2, 8, 16, 64), "f16", "the right shape in fp16"),
    ((30_000, 16, 8, 2, 16, 64), "bf16", "k/v and heads swapped"),
    ((30_000, 16, 2, 8, 32, 64), "bf16", "blocks of 32 tokens"),
])
def test_any_other_layout_is_refused_in_one_line_naming_both(verified_1b, shape, dtype, why):
    (layout,) = host_layouts(verified_1b).values()
    with pytest.raises(HostError) as e:
        check(layout, tensor(shape, dtype))
    msg = str(e.value)
    assert "\n" not in msg, why
    assert "[pages][layer 16][kv 2][kv_head 8][token 16][dim 64] bf16" in msg  # the deployment's
    assert "".join(f"[{n}]" for n in shape) + f" {dtype}" in msg  # vLLM's
    assert "'kv'" in msg and "kern_states.0" in msg


def test_a_strided_view_is_refused(verified_1b):
    (layout,) = host_layouts(verified_1b).values()
    shape = (100, 16, 2, 8, 16, 64)
    strides = list(contiguous(shape))
    strides[0] += 64  # pages padded apart
    with pytest.raises(HostError, match=r"strides \["):
        check(layout, HostTensor("kern_states.0", shape, tuple(strides), "bf16"))


def test_a_state_without_a_host_layout_is_refused(manifest_1b):
    from kern.manifest.verify import Verified

    del manifest_1b["states"]["kv"]["host"]
    r = verify_text(json.dumps(manifest_1b))
    assert isinstance(r.verified, Verified), r.problems
    with pytest.raises(HostError, match=r"states.kv declares no host layout"):
        host_layouts(r.verified)


def problems_at(m: dict) -> list[tuple[str, str]]:
    return [(p.where, p.what) for p in verify_text(json.dumps(m)).problems]


def test_the_verifier_checks_the_page_against_bytes_per_token(manifest_1b):
    manifest_1b["states"]["kv"]["host"]["page"][4]["size"] = 128  # dim 128: twice the bytes
    assert any(w == "states.kv.host" and "65536 bytes of bf16; bytes_per_token is 32768" in t
               for w, t in problems_at(manifest_1b))


def test_the_verifier_wants_one_token_axis_of_the_page_tables_stride(manifest_1b):
    page = manifest_1b["states"]["kv"]["host"]["page"]
    page[3]["size"] = 32
    page[0]["size"] = 8  # bytes_per_token still holds: only the token axis is wrong
    assert any(w == "states.kv.host" and "strides 16" in t for w, t in problems_at(manifest_1b))
    page[3]["axis"] = "dim"
    assert any(w == "states.kv.host.page" and "exactly one axis named 'token'" in t for w, t in problems_at(manifest_1b))


def test_the_verifier_wants_constant_sizes_and_a_paged_state(manifest_1b):
    manifest_1b["states"]["kv"]["host"]["page"][0]["size"] = "tokens"  # a var
    assert any(w == "states.kv.host.page[0] (layer)" and "constant" in t for w, t in problems_at(manifest_1b))
