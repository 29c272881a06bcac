"""bench/kimi_long.py, the long-context comparison (issue 38, item 3), on the CPU: the state
memory a sequence holds as kern's manifest and vLLM's KV cache spec make it, kern's default
context and pool for the real shape at 8 layers on an H200, vLLM's start-up lines read, and a
tiny kern serve holding what the arithmetic says for prompts of thousands of tokens."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.benchmarks import scripts

BENCH = scripts.BENCH
kimi_long = scripts.load("kimi_long")  # a script, not a package; its sibling scripts' helpers loaded with it

MIB = 2 << 19


def test_a_sequence_holds_its_mla_pages_and_one_kda_slot_as_the_tiny_manifest_sizes_them(kimi_config, kimi_dep):
    mem = kimi_long.kern_memory(kimi_dep / "manifest.json")
    # one MLA layer's latent (32) and key part (16) in f32 on the cpu: 192 bytes a token, padded to 256;
    # three KDA layers' state [4, 16, 16] and windows [3, 3 x 64] in f32: 19,200 bytes, padded to 32 KiB
    assert kimi_long.raw_state(kimi_config, elem=4) == {"token_bytes": 192, "slot_bytes": 19200}
    assert mem == {"page_tokens": 16, "chunk_bytes": 2 * MIB, "token_bytes": {"kv": 256}, "slot_bytes": {"kda": 32768}}
    # 100 tokens fill 7 pages of 16
    assert kimi_long.kern_seq_bytes(mem, 100) == 7 * 16 * 256 + 32768
    assert kimi_long.kern_seq_bytes(mem, 112) == kimi_long.kern_seq_bytes(mem, 100)
    assert kimi_long.kern_seq_bytes(mem, 113) == kimi_long.kern_seq_bytes(mem, 100) + 16 * 256


def test_kern_serves_the_131k_case_by_default_on_an_h200_at_8_layers(tmp_path):
    from kern_models.kimi_linear.generator import generate

    def plan(positions):
        man = generate(kimi_long.real_config(8, positions), tmp_path / str(positions), target="cuda", model="k")
        return kimi_long.kern_memory(man), kimi_long.kern_plan(man)

    mem, p = plan(kimi_long.POSITIONS)
    # two MLA layers of 576 bf16 channels: 2,304 bytes a token, unpadded (pages of 36,864 bytes and the
    # 18 MiB slot tile 18 MiB; padded to 4,096 they held 1.78x the latents); six KDA layers' state
    # and windows in f32: 13,467,648 bytes, and kda_tc's rows kept inside a chunk (32 heads x 48 x 128
    # f32 a layer, 4,718,592 bytes): 18,186,240, padded to 18 MiB
    assert kimi_long.raw_state(kimi_long.real_config(8)) == {"token_bytes": 2304, "slot_bytes": 13467648}
    assert kimi_long.raw_state(kimi_long.real_config(8), kda_rows=kimi_long.kda_rows("cuda")) == \
        {"token_bytes": 2304, "slot_bytes": 18186240}
    assert mem["token_bytes"] == {"kv": 2304} and mem["slot_bytes"] == {"kda": 18 * MIB}
    assert p["deployment_context"] == p["default_context"] == 132096 and p["note"] is None
    assert p["fits"] == {32832: True, 131136: True}
    # the budget is ~97 GiB after ~26 GiB of weights: memory is not what bounds the context
    assert 90 << 30 < p["budget_bytes"] < 100 << 30 and 25 << 30 < p["weights_bytes"] < 27 << 30
    assert p["sequences_at_once"][131136] > 100
    # the bench's own checkpoint says 4,096 positions (bench/kimi_gpu.py's ckpt step): kern's default
    # context is the model's own, so that checkpoint serves neither case
    assert plan(4096)[1]["default_context"] == 4096
    # past the deployment's bound the model's own context is clipped to it
    assert plan(1 << 20)[1]["deployment_context"] == 262144


def test_vllm_holds_a_kda_state_a_block_of_each_kda_group_and_mla_blocks_grown_to_one_state():
    cfg = kimi_long.real_config(8)
    mem = kimi_long.vllm_memory(cfg)
    # a KDA layer: windows 3 x 12,288 in bf16 (73,728 bytes) and the recurrence 32 x 128 x 128 in f32
    assert mem["kda_layer_bytes"] == 73728 + 2097152
    # the attention block grows until a page of 1,152-byte tokens holds that: 16 x ceil(2,170,880 / 18,432)
    assert mem["block_tokens"] == 1888 and mem["layer_page_bytes"] == 1888 * 1152
    # 2 MLA and 6 KDA layers: groups of 2, one MLA group and three KDA groups
    assert (mem["group_layers"], mem["mla_groups"], mem["kda_groups"]) == (2, 1, 3)
    # 131,136 tokens: 70 blocks of 1,888, plus a block of each KDA group, each block 2 layers' pages
    assert kimi_long.vllm_seq_bytes(mem, 131136) == (70 + 3) * 2 * 1888 * 1152
    # the block its log names wins over the rule's (a backend that aligns to 64 tokens, say)
    assert kimi_long.vllm_memory(cfg, block=1920)["block_bytes"] == 2 * 1920 * 1152
    # without padding both hold 2,304 bytes a token; vLLM's windows are bf16 where kern's are f32
    assert mem["raw_token_bytes"] == 2304 and mem["raw_slot_bytes"] == 6 * 2170880


def test_vllms_start_up_lines_give_its_pool_and_its_own_bytes_a_sequence():
    log = "\n".join([
        "(EngineCore pid=1) INFO 12-05 10:00:00 [interface.py:606] Setting attention block size to 1888 tokens to "
        "ensure that attention page size is >= mamba page size.",
        "INFO 12-05 10:00:00 [interface.py:640] Padding mamba page size by 0.19% to ensure that mamba page size and "
        "attention page size are exactly equal.",
        "(EngineCore pid=1) INFO 12-05 10:00:30 [gpu_model_runner.py:4879] Model loading took 25.91 GiB memory and "
        "30.1 seconds",
        "(EngineCore pid=1) INFO 12-05 10:01:10 [gpu_worker.py:721] Available KV cache memory: 96.50 GiB",
        "(EngineCore pid=1) INFO 12-05 10:01:10 [kv_cache_utils.py:2481] GPU KV cache size: 42,016,384 tokens, "
        "Maximum concurrency for 132,096 tokens per request: 318.07x"])
    got = kimi_long.vllm_log(log)
    assert got == {"available_kv_gib": 96.5, "kv_cache_tokens": 42016384, "max_concurrency": 318.07,
                   "max_concurrency_tokens": 132096, "block_tokens": 1888, "mamba_padding_pct": 0.19,
                   "model_gib": 25.91, "bytes_a_max_len_seq": round(96.5 * 2**30 / 318.07)}
    assert kimi_long.vllm_log("no such lines") == {}


def test_the_kda_blocks_a_vllm_sequence_holds_follow_from_its_concurrency_line():
    mem = kimi_long.vllm_memory(kimi_long.real_config(8))
    blocks = 23820  # 96.5 GiB of 4,349,952-byte blocks
    for kda_blocks in (1, 2):  # without prefix caching's mamba "align" mode, and with it
        per_request = 70 + 3 * kda_blocks  # 132,096 tokens in 1,888-token blocks, and the three KDA groups'
        log = {"available_kv_gib": 96.5, "max_concurrency": round(blocks / per_request, 2)}
        assert kimi_long.vllm_mamba_blocks(mem, log, 132096) == kda_blocks
    assert kimi_long.vllm_mamba_blocks(mem, {}, 132096) == 1


def test_cases_are_streams_by_prompt_tokens():
    assert kimi_long.cases("8x32768,1x131072") == [(8, 32768), (1, 131072)]
    for bad in ("8", "x32768", "0x5", "8x"):
        with pytest.raises(ValueError, match="STREAMSxPROMPT"):
            kimi_long.cases(bad)


def test_the_table_puts_kern_beside_vllm_with_kern_ahead_above_one():
    def result(ttft, tok_s, tpot, measured):
        serve = {"completed": 8, "requests": 8, "ttft_ms": {"p50": ttft}, "output_throughput": tok_s}
        return {"startup_s": 1, "positions": 132096, "notes": [], "cases": [
            {"case": "8x32768", "serve": serve, "decode_tok_s": round(8e3 / tpot, 1),
             "state": {"measured_bytes_a_seq": measured, "computed_bytes_a_seq": measured, "raw_bytes_a_seq": 1}}]}

    summary, text = kimi_long.table({"kern": result(1000, 400, 10, 200), "vllm": result(2000, 100, 20, 300)})
    vs = summary["rows"][-1]
    assert vs == {"case": "8x32768", "server": "kern/vllm", "output_tok_s": 4.0, "decode_tok_s": 2.0,
                  "ttft_vllm_over_kern": 2.0, "bytes_vllm_over_kern": 1.5}
    assert "kern vs vLLM: output tok/s 4.0x" in text


def test_a_tiny_kern_serve_serves_prompts_of_thousands_of_tokens_and_holds_what_the_arithmetic_says(
        kimi_ckpt, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(BENCH / "kimi_long.py"), str(kimi_ckpt), "--server", "kern",
                           "--target", "cpu", "--long-ckpt", str(tmp_path / "long"), "--positions", "8192",
                           "--cases", "2x1500,1x3000", "--output", "16", "--warm-prompt", "256", "--port", "0",
                           "--out", str(out), "--up-s", "60", "--case-s", "60", "--deadline-s", "100"],
                          capture_output=True, text=True, timeout=120)
    assert "LONG OK (kern)" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    r = json.loads((out / "long_kern.json").read_text())
    assert json.loads((tmp_path / "long" / "config.json").read_text())["model_max_length"] == 8192
    mem = r["memory"]["kern"]
    for case, (n, length) in zip(r["cases"], [(2, 1500), (1, 3000)]):
        assert case["serve"]["completed"] == n and case["serve"]["output_tokens"] == 16 * n
        st = case["state"]
        assert st["computed_bytes_a_seq"] == kimi_long.kern_seq_bytes(mem, length + 16)
        # each finished sequence left its checkpoint cached: the pages of its prompt and every token
        # out but the last (whose state was never written), and its slot; and the snapshot of its
        # prompt's end, where a next turn resumes (a prompt token's MLA form is not a generated
        # one's): a second slot and a copy of the page the prompt ends inside
        assert st["cached_after"]["units"] == {"kv": n * (-(-(length + 15) // 16) + (length % 16 > 0)), "kda": 2 * n}
        # the most the running sequences leased at once: never past what a sequence holds at its end
        assert 0 < st["measured_bytes_a_seq"] <= st["computed_bytes_a_seq"]
