"""kern as the model inside vLLM, on the GPU (skipped without one, or without vllm importable):
`vllm serve` with the plugin and `kern serve` on one seeded random Llama-3.2-1B-shaped
checkpoint and one deployment (the default batch-invariant sm_90a build) give the same greedy
text for the same token prompts, one request at a time and all at once (vLLM batches them,
chunks the long one and shares the common prefix through its prefix cache).

    python -m pytest tests/hosts/test_vllm_gpu.py -m gpu -q

vLLM runs with its defaults (its CUDA graphs, prefix caching and chunked prefill on) but a
short context and few sequences, so that its start-up (graph capture) stays short."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("vllm", reason="vllm is not importable (pip install 'kern-engine[vllm]')")

CONTEXT = 1024
OUT_TOKENS = 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(cmd: list[str], port: int, log, env: dict | None = None, timeout: float = 400.0) -> subprocess.Popen:
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if p.poll() is not None:
            log.flush()
            raise AssertionError(f"{cmd[2]} exited ({p.returncode}): " + open(log.name).read()[-3000:])
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return p
        except OSError:
            time.sleep(1)
    p.kill()
    raise AssertionError(f"{cmd[2]} did not come up in {timeout:.0f} s: " + open(log.name).read()[-3000:])


def complete(port: int, model: str, prompt: list[int]) -> str:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": OUT_TOKENS, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    reply = json.loads(urllib.request.urlopen(req, timeout=120).read())
    return reply["choices"][0]["text"]


def texts(port: int, model: str, prompts: list[list[int]]) -> tuple[list[str], list[str]]:
    alone = [complete(port, model, p) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: complete(port, model, p), prompts))
    return alone, together


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from kern.deployments import deployment_for
    from kern_models.common.random_checkpoint import make

    folder = tmp_path_factory.mktemp("vllm")
    ckpt = make("llama-3.2-1b", folder / "ckpt", device="cuda", max_positions=CONTEXT)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["eos_token_id"] = None
    (ckpt / "config.json").write_text(json.dumps(cfg))
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    manifest = deployment_for(ckpt, "sm_90a", context=CONTEXT)
    shared = [100 + i for i in range(40)]  # a prefix vLLM's cache shares (two whole pages and more)
    prompts = [[5, 9, 13], shared + [7, 8], shared + [11], list(range(300, 300 + 700)), [42] * 17]
    return folder, ckpt, manifest, prompts


def with_kern(folder, ckpt, manifest, log_name: str, work):
    """`kern serve` on the deployment while `work(port, model)` runs; what it returns."""
    port = free_port()
    with open(folder / log_name, "w") as log:
        p = serve([sys.executable, "-m", "kern.cli", "serve", str(ckpt), "--manifest", str(manifest),
                   "--port", str(port)], port, log)
        try:
            model = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models").read())["data"][0]["id"]
            return work(port, model)
        finally:
            p.terminate()
            p.wait(60)


def with_vllm(folder, ckpt, manifest, log_name: str, work, *flags: str):
    """`vllm serve` with the plugin on the deployment (model name "kern") while `work(port)` runs."""
    port = free_port()
    with open(folder / log_name, "w") as log:
        p = serve([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt),
                   "--served-model-name", "kern", "--port", str(port), "--max-model-len", str(CONTEXT),
                   "--max-num-seqs", "16", *flags, "--hf-overrides", json.dumps({"architectures": ["KernForCausalLM"]})],
                  port, log, env={"KERN_MANIFEST": str(manifest), "HF_HUB_OFFLINE": "1"})
        try:
            return work(port)
        finally:
            p.terminate()
            p.wait(60)


@pytest.mark.gpu
@pytest.mark.slow
def test_vllm_with_kern_gives_kern_serves_greedy_text(setup):
    folder, ckpt, manifest, prompts = setup
    kern = with_kern(folder, ckpt, manifest, "kern.log", lambda port, model: texts(port, model, prompts))
    served = with_vllm(folder, ckpt, manifest, "vllm.log", lambda port: texts(port, "kern", prompts))
    assert kern[0] == kern[1], "kern serve: a prompt's text depends on its batch"
    assert served[0] == kern[0], f"vLLM+kern alone differs from kern serve:\n{served[0]}\n{kern[0]}"
    assert served[1] == kern[0], f"vLLM+kern batched differs from kern serve:\n{served[1]}\n{kern[0]}"


def preemptions(port: int) -> float:
    """vLLM's count of preempted requests so far (its Prometheus counter)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_preemptions_total"))


@pytest.mark.gpu
@pytest.mark.slow
def test_vllm_preempting_on_kern_pages_keeps_kern_serves_text(setup):
    """vLLM given too few pages for its batch preempts requests (frees their pages, recomputes them
    later) on kern's pages: 8 prompts of 200 tokens + 32 out want 8 x 15 pages of 16 tokens, and
    vLLM gets 72 (a few more than the 64 its 1,024-token context needs). Each text is still the one `kern
    serve` gives the prompt alone, and vLLM's counter says it did preempt (else this tests nothing)."""
    folder, ckpt, manifest, _ = setup
    prompts = [[1000 + 37 * i + j for j in range(200)] for i in range(8)]
    kern = with_kern(folder, ckpt, manifest, "kern_preempt.log",
                     lambda port, model: [complete(port, model, q) for q in prompts])

    def together(port):
        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(lambda q: complete(port, "kern", q), prompts)), preemptions(port)
    served, preempted = with_vllm(folder, ckpt, manifest, "vllm_preempt.log", together, "--num-gpu-blocks-override", "72")
    assert preempted > 0, "vLLM preempted nothing: the test did not reach preemption (give it fewer pages)"
    for i, (a, b) in enumerate(zip(served, kern)):
        assert a == b, f"prompt {i}: vLLM+kern under preemption differs from kern serve:\n{a}\n{b}"
