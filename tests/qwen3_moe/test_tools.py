"""The tools on the Qwen3-MoE family, unchanged: kern verify, kern test (a planted router bug and
a swapped expert each FAIL naming their span; the deployment against itself PASSes), kern bench
(every expert op timed), kern cut (stages chained back bit for bit), the prefix cache, and
kern serve on the cpu."""

from __future__ import annotations

from functools import partial

import pytest

from kern.cli import main
from kern.judge.judge import Options, judge
from tests.judge.planted import variant

SMALL = Options(seed=0, seqs=3, decode_steps=2, max_prompt=40)


def test_kern_verify_accepts_the_deployment(moe_dep, capsys):
    assert main(["verify", str(moe_dep)]) == 0
    assert capsys.readouterr().out.startswith(f"{moe_dep}: ok, 4 programs, ")  # prefill, decode, verify_round, rope


def router_skips_the_best_expert(base, out):
    """route's top k starts at the second-best expert."""
    return variant(base, out, of="moe", patch=([('kind="stable")[:, :k]', 'kind="stable")[:, 1:k + 1]')],
                                               ["moe_route"]))


def experts_swapped(base, out, layer: int = 0):
    """Layer 0's experts 0 and 1 bound to each other's tensors (the first layer: every later
    position reads its rows through attention)."""
    def edit(m):
        bind = m["buffers"][f"experts_gate_up.{layer}"]["bind"]
        bind[0:2], bind[2:4] = bind[2:4], bind[0:2]
        bind = m["buffers"][f"experts_down.{layer}"]["bind"]
        bind[0], bind[1] = bind[1], bind[0]
    return variant(base, out, edit)


@pytest.mark.parametrize("bug,span", [(router_skips_the_best_expert, "moe_route -> moe_route"),
                                      (experts_swapped, "moe_experts -> moe_experts")])
def test_kern_test_fails_a_planted_moe_bug_naming_its_span(bug, span, moe_dep, moe_ckpt, tmp_path):
    r = judge(moe_dep, bug(moe_dep, tmp_path / "b"), moe_ckpt, SMALL)
    print("\n".join(r.lines + [r.verdict.line]))
    assert r.verdict.status == "FAIL" and r.verdict.code == 1, r.verdict.line
    assert "failing span " in r.verdict.line and span in r.verdict.line, r.verdict.line


def test_kern_test_passes_the_deployment_against_itself(moe_dep, moe_ckpt):
    r = judge(moe_dep, moe_dep, moe_ckpt, SMALL)
    assert (r.verdict.status, r.verdict.kind) == ("PASS", "bit-identical"), r.verdict.line


def test_kern_bench_times_every_expert_op(moe_dep, moe_ckpt):
    from kern.bench.run import bench
    from kern.bench.workload import parse

    wl = parse("samples = 2\n[[sweep]]\ngroups = [2]\nrows = [1]\ncontext = [20]\n"
               "[[sweep]]\ngroups = [1]\nrows = [16]\ncontext = [0]\n", "wl.toml")
    doc = bench(moe_dep, moe_ckpt, wl, progress=False)
    for sc in doc["scenarios"]:
        ops = {o["op"]: o for o in sc["ops"]}
        assert {"moe_route", "moe_experts", "moe_combine"} <= set(ops), sorted(ops)
        assert ops["moe_experts"]["calls"] == 2 and ops["moe_experts"]["us"] > 0  # two sparse layers


def test_kern_cut_stages_chain_back_bit_for_bit(moe_dep, moe_ckpt, tmp_path):
    from kern.judge.pipeline import judge_pipeline

    assert main(["cut", str(moe_dep), "--stages", "2", "--out", str(tmp_path / "cut")]) == 0
    r = judge_pipeline(moe_dep, tmp_path / "cut", moe_ckpt, SMALL)
    assert (r.verdict.status, r.verdict.kind) == ("PASS", "bit-identical"), r.verdict.line


def test_a_cached_prefix_gives_the_cold_tokens(moe_model):
    system = " ".join(f"w{i}" for i in range(40, 80)) + " "
    moe_model.generate(system + "w5 w6", max_tokens=6)
    warm = moe_model.generate(system + "w7 w8", max_tokens=6)
    assert warm.cached_tokens >= 32
    moe_model.paging.pool.clear()
    cold = moe_model.generate(system + "w7 w8", max_tokens=6)
    assert cold.cached_tokens == 0 and warm.tokens == cold.tokens
    moe_model.paging.pool.check()


def test_kern_serve_answers_on_the_cpu_with_the_api_s_text(moe_ckpt, moe_model, tmp_path, monkeypatch):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from kern.serve.server import start
    from tests.serve import engines

    monkeypatch.setenv("KERN_CACHE", str(tmp_path / "cache"))
    running = start(partial(engines.model_loop, moe_ckpt, 256, 4), api_key="k")
    try:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="k", max_retries=0, timeout=120)
        r = client.completions.create(model=running.driver.info.model_name, prompt="w1 w2 w3", max_tokens=5,
                                      temperature=0)
    finally:
        running.close()
    assert r.usage.completion_tokens == 5
    assert r.choices[0].text == moe_model.generate("w1 w2 w3", max_tokens=5).text
