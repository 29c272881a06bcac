"""--step-tokens N (kern run, kern serve; load(step_tokens=N)): the most prompt tokens a step
feeds, the generated deployment's prefill rows, for every family and target (vLLM's
--max-num-batched-tokens, as far as prompt chunks go). Cached apart from the default; a
folder's own manifest.json or a given manifest is refused with it in one line; a value the
kernels cannot take is one line naming it, never a traceback."""

from __future__ import annotations

import json

import pytest

from kern import deployments
from kern.cli import parser
from kern.errors import KernError
from kern.manifest import load_verified
from tests.reliability.test_flags_every_family import KIMI, LLAMA, MOE


def _write(tmp_path, config: dict):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    return tmp_path / "ckpt"


def _rows(manifest) -> int:
    return load_verified(manifest).manifest.vars["tokens"].max


@pytest.mark.parametrize("config", [LLAMA, MOE, KIMI], ids=["llama", "qwen3_moe", "kimi_linear"])
@pytest.mark.parametrize("target", ["cpu", "sm_90a"])
def test_the_option_sizes_every_family_s_prefill_step(tmp_path, config, target):
    ckpt = _write(tmp_path, config)
    default = deployments.deployment_for(ckpt, target)
    wide = deployments.deployment_for(ckpt, target, step_tokens=8192)
    assert _rows(wide) == 8192 and _rows(default) != 8192
    assert wide != default, "a step size is cached apart from the default deployment"
    assert deployments.deployment_for(ckpt, target) == default, "the default's cache key is unchanged"


def test_the_loop_feeds_at_most_that_many_prompt_tokens_a_step(tiny):
    """A 197-token prompt through steps of 16 rows: each step's rows within it, and the tokens
    those of the default deployment's larger steps (the llama family's bits do not depend on
    where a prompt was cut)."""
    from kern.api import load

    prompt = list(range(3, 200))
    want = load(tiny, progress=False).generate(prompt, max_tokens=6, temperature=0.0).tokens
    model = load(tiny, progress=False, step_tokens=16)
    rows = []
    model.engine.observers.append(lambda program, env, inputs: rows.append(env.get("tokens", 0)))
    assert model.loop.limits.budget == 16
    assert model.generate(prompt, max_tokens=6, temperature=0.0).tokens == want
    assert max(rows) <= 16 and sum(rows) >= len(prompt)


@pytest.mark.parametrize("target,tokens,why", [
    ("sm_90a", 65537, r"\[1, 65,536\]"), ("sm_90a", 0, r"\[1, 65,536\]"), ("cpu", 0, "at least 1")])
def test_a_value_the_kernels_cannot_take_is_one_line(tmp_path, target, tokens, why):
    ckpt = _write(tmp_path, KIMI)
    with pytest.raises(KernError, match=rf"tokens {tokens}: a step's prompt rows must be an integer in {why}") as err:
        deployments.deployment_for(ckpt, target, step_tokens=tokens)
    assert "\n" not in str(err.value)


def test_a_folder_with_its_own_manifest_is_refused_in_one_line(tmp_path):
    ckpt = _write(tmp_path, LLAMA)
    (ckpt / "manifest.json").write_bytes(deployments.deployment_for(ckpt, "sm_90a").read_bytes())
    with pytest.raises(KernError) as err:
        deployments.deployment_for(ckpt, "sm_90a", step_tokens=4096)
    line = str(err.value)
    assert "\n" not in line and str(ckpt) in line and "--step-tokens 4096" in line


def test_a_given_manifest_with_the_option_is_refused_before_anything_loads(tmp_path):
    from kern.api import load

    ckpt = _write(tmp_path, LLAMA)
    manifest = deployments.deployment_for(ckpt, "cpu")
    with pytest.raises(KernError) as err:
        load(ckpt, manifest=manifest, step_tokens=4096, progress=False)
    line = str(err.value)
    assert "\n" not in line and str(manifest) in line and "--step-tokens 4096" in line


@pytest.mark.parametrize("command", ["run", "serve"])
def test_the_commands_take_the_option(command):
    assert parser().parse_args([command]).step_tokens is None
    assert parser().parse_args([command, "--step-tokens", "8192"]).step_tokens == 8192
    with pytest.raises(SystemExit):
        parser().parse_args([command, "--step-tokens", "0"])


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_step_too_wide_for_the_device_is_one_line_naming_the_option(tiny, command, capsys):
    """A step whose buffers (a logits row a prompt token, ...) outgrow the device's memory: the
    verifier's budget problem said of the option that caused it, not of a buffer the user never
    named, and before any weight is read."""
    from kern.cli import main

    argv = [command, str(tiny), "--target", "cpu", "--step-tokens", str(10**9)]
    assert main(argv + (["--prompt", "hi"] if command == "run" else ["--port", "0"])) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"kern {command}: --step-tokens 1000000000: the deployment it sizes needs ") and "give fewer" in err


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_deployment_that_fails_verification_is_one_line(tmp_path, command, capsys):
    """kern run and kern serve say a manifest's first problem in one line, as kern bench, cut and
    kernels do (kern verify lists them all)."""
    from kern.cli import main

    ckpt = _write(tmp_path, LLAMA)
    man = json.loads(deployments.deployment_for(ckpt, "cpu").read_text())
    man["buffers"][next(iter(man["buffers"]))]["dtype"] = "bf17"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(man))
    argv = [command, str(ckpt), "--manifest", str(bad), "--target", "cpu"]
    assert main(argv + (["--prompt", "hi"] if command == "run" else ["--port", "0"])) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"kern {command}: {bad}: manifest failed verification: "), err
