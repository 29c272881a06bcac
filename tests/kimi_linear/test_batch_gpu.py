"""bench/kimi_gpu.py's batch-invariance check as a test, at the real width on sm_90a's default
(batch-invariant) build: Kimi-Linear-48B-A3B's widths (hidden 2304, KDA 32 heads of 128, MLA 32
heads with kv_lora 512 + rope 64, 256 experts of 1024 in 8 groups, top 8, a shared expert,
vocabulary 163,840) at 2 layers: a KDA layer with the dense MLP and an MLA layer with the MoE
(the published pattern puts its first MLA layer at depth 4; here it comes second, so every
mixer and MLP kernel runs at its real width in a 5.4 GB checkpoint). Seeded random weights,
sharpened (kern_models.kimi_linear.random_checkpoint), made on the GPU in a child process.

Sequence 0 (32 prompt tokens, then STEPS greedy decode steps) alone (the `decode` program: the
gemvs, the gathered experts' gemvs, the gemv LM head) and beside 3 others (`decode`), 15 and 63
(`decode_wide`: the wgmma twins, moe_sort's tiles, the LM head on moe_router_gemm), the program
the protocol picks for that many rows as the bench's decode does (kern.drive.raw_pages.greedy,
a lease a sequence, its slots and pages filled as the host loop fills them), after a prefill of
other prompts left their state in the slots and pages: its tokens and its logits' bytes at every
step the same. The tiny shape's twin on the cpu: test_batch_greedy.py.

    python -m pytest -q tests/kimi_linear/test_batch_gpu.py   (on the H200; ~2 minutes)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

PROMPT, STEPS = 32, 24
MAKE = r"""
import sys, torch
from kern_models.kimi_linear.random_checkpoint import model_of, save
torch.set_default_dtype(torch.bfloat16)
save(model_of("kimi-linear-48b-a3b", layers=2, device="cuda", max_positions=4096,
              layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"]), sys.argv[1])
"""


class Stepped:
    """The deployment's engine with its pool (what kern.drive steps)."""

    def __init__(self, manifest, ckpt):
        from kern.manifest import load_verified
        from kern.runtime.engine import Engine

        self.engine = Engine(load_verified(manifest), ckpt, paged=True, state_budget=4 << 30)
        self.paging, self.protocol = self.engine.paging, self.engine.protocol
        self.page_tokens = self.paging.page_tokens


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from kern_models.kimi_linear.generator import generate

    tmp = tmp_path_factory.mktemp("kimi_real")
    subprocess.run([sys.executable, "-c", MAKE, str(tmp / "ckpt")], check=True, timeout=600)
    cfg = json.loads((tmp / "ckpt" / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_experts"], cfg["vocab_size"]) == (2304, 256, 163840)
    man = generate(cfg, tmp / "deploy", target="cuda", model="kimi-linear-random", context=1024)
    model = Stepped(man, tmp / "ckpt")
    prompts = np.random.default_rng(1).integers(0, cfg["vocab_size"], (64, PROMPT)).astype(np.int32)
    return model, prompts


def _dirty(model) -> None:
    """Other sequences' state left in the slots and pages the next leases get (the bench's
    prefill profile, 4 prompts of 512, runs before its decode)."""
    from kern.drive.raw_pages import give_many, lease_inputs, lease_many

    seqs, length = 4, 512
    leases = lease_many(model, seqs, length)
    try:
        st = model.protocol.for_rows(seqs, None)
        ids = np.random.default_rng(2).integers(0, model.engine.consts["vocab"], seqs * length).astype(np.int32)
        model.engine.run(st.program, st.vars_for(seqs, seqs * length), {
            st.inputs["token"]: ids, st.inputs["position"]: np.tile(np.arange(length, dtype=np.int32), seqs),
            st.inputs["cu_seqlens"]: np.arange(0, length * (seqs + 1), length, dtype=np.int32),
            **lease_inputs(model, st, leases)})
    finally:
        give_many(model, leases)


@pytest.fixture(scope="module")
def alone(real):
    from kern.drive.raw_pages import greedy

    model, prompts = real
    _dirty(model)
    g = greedy(model, prompts[:1], STEPS, rows=(0,))
    assert g.program == "decode"
    return g


@pytest.mark.parametrize("n,program", [(4, "decode"), (16, "decode_wide"), (64, "decode_wide")])
def test_sequence_0_beside_others_gets_its_bytes_alone(real, alone, n, program):
    from kern.drive.raw_pages import greedy

    model, prompts = real
    _dirty(model)
    g = greedy(model, prompts[:n], STEPS, rows=(0,))
    assert g.program == program
    mine, theirs = alone.logits[0], g.logits[0]
    differ = [s for s in range(1 + STEPS) if mine[s].tobytes() != theirs[s].tobytes()]
    first = differ[0] if differ else None
    assert not differ, (
        f"seq 0 beside {n - 1} others ({program}): logits differ from alone at steps {differ} (0: prefill); at step "
        f"{first}: max |diff| {float(np.abs(mine[first] - theirs[first]).max()):.3g}, argmax {int(mine[first].argmax())} "
        f"vs {int(theirs[first].argmax())}; tokens alone {alone.tokens[:, 0].tolist()}, beside "
        f"{g.tokens[:, 0].tolist()}")
    assert g.tokens[:, 0].tolist() == alone.tokens[:, 0].tolist()
