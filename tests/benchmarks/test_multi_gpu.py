"""Issue 41's two-GPU benches on the CPU: bench/multi_gpu.py's flags and step commands, its
ep_bench step on the cpu ranks (the all-to-all named and priced from kern bench),
bench/multi_gpu_summary.py's rows and ratios from canned bench/serve.py lines, and what
bench/multi_gpu_serve.sh's collect phase brings back (a device call returns 8 files at most)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.benchmarks import scripts

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    return scripts.load(name, f"bench_{name}")  # with shared.py, which multi_gpu.py imports by bare name


@pytest.fixture(scope="module")
def mg():
    return _load("multi_gpu")


@pytest.fixture(scope="module")
def summ():
    return _load("multi_gpu_summary")


# ---- multi_gpu.py: flags and the commands of a --device run --------------------------------


def test_the_defaults_are_issue_41s_runs(mg):
    a = mg.parser().parse_args(["--device"])
    assert a.steps.split(",") == ["tests", "tp", "ep", "ep_bench", "pp"]
    assert (a.moe_shape, a.pp_shape, a.streams, a.moe_batch, a.bench_rows) == (
        "qwen3-30b-a3b", "llama-3.1-8b", 128, "1,16,64", "1,16,64")
    assert (a.moe_ckpt, a.pp_ckpt, a.no_install, a.target) == (None, None, False, "cuda")
    assert mg.timeout_of("ep_bench", a) == a.ep_bench_timeout == 200 and mg.timeout_of("tp", a) == 170


def test_an_unknown_step_or_no_mode_is_refused(mg):
    for argv, says in ((["--device", "--steps", "tests,serve"], "--steps: unknown serve (steps: tests, tp, ep, "
                                                                 "ep_bench, pp)"),
                       ([], "give --device, --step or --make-ckpt"),
                       (["--step", "tp"], "invalid choice: 'tp'")):
        done = subprocess.run([sys.executable, str(BENCH / "multi_gpu.py"), *argv], capture_output=True, text=True)
        assert done.returncode == 2 and says in done.stderr, (argv, done.stderr)


def test_each_step_runs_in_its_own_process_with_the_shared_checkpoints(mg, tmp_path):
    a = mg.parser().parse_args(["--device", "--moe-ckpt", "/ck/moe", "--pp-ckpt", "/ck/8b", "--moe-layers", "24",
                                "--bench-rows", "1,64", "--target", "cpu"])
    tests = mg.step_command("tests", a, tmp_path)
    assert tests[1:4] == ["-m", "pytest", "tests/tp"] and "tests/qwen3_moe/test_cuda.py" in tests
    tp = mg.step_command("tp", a, tmp_path)
    assert tp[1].endswith("bench/tp.py") and tp[tp.index("--out") + 1] == str(tmp_path / "tp.json")
    for step in ("ep", "ep_bench", "pp"):
        cmd = mg.step_command(step, a, tmp_path)
        flags = dict(zip(cmd[2::2], cmd[3::2]))
        assert cmd[1].endswith("bench/multi_gpu.py") and flags["--step"] == step
        assert (flags["--moe-ckpt"], flags["--pp-ckpt"], flags["--moe-layers"], flags["--bench-rows"],
                flags["--target"]) == ("/ck/moe", "/ck/8b", "24", "1,64", "cpu")
        assert mg.parser().parse_args(cmd[2:]).step == step  # what the child parses
    a = mg.parser().parse_args(["--device"])
    assert "--moe-ckpt" not in mg.step_command("ep", a, tmp_path)  # a temporary checkpoint of its own
    with pytest.raises(ValueError, match="unknown step 'serve'"):
        mg.step_command("serve", a, tmp_path)


# ---- the all-to-all's share, from kern bench -------------------------------------------------


def _scenario(ops: dict[str, float], step_us: float) -> dict:
    total = sum(ops.values())
    return {"ops": [{"op": o, "calls": 1, "us": us, "share": us / total, "bytes": 0} for o, us in ops.items()],
            "step": {"untraced_us": {"p50": step_us}}}


def test_the_all_to_all_is_what_the_split_adds_to_the_step(mg):
    ep1 = {"attention_decode", "moe_wg_gate_up", "moe_wg_down", "moe_combine_residual", "norm_gemv"}
    rank = _scenario({"attention_decode": 300.0, "moe_wg_gate_up": 200.0, "moe_wg_down": 100.0,
                      "moe_combine_push": 60.0, "all_reduce_add_local": 140.0, "norm_gemv": 200.0}, 1050.0)
    got = mg.all_to_all(ep1, rank)
    assert got == {"ops": ["all_reduce_add_local", "moe_combine_push"], "us": 200.0, "share": 0.2,
                   "of_step": round(200 / 1050, 4)}
    assert mg.all_to_all(ep1 | {"moe_combine_push", "all_reduce_add_local"}, rank)["ops"] == []


def test_ep_bench_prices_the_all_to_all_on_the_cpu_ranks(mg, tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    a = mg.parser().parse_args(["--step", "ep_bench", "--target", "cpu", "--moe-shape", "tiny", "--moe-layers", "3",
                                "--moe-ckpt", str(tmp_path / "ckpt"), "--bench-rows", "1,2", "--bench-samples", "2"])
    rows = mg.ep_bench_step(a)
    scen = [r for r in rows if "all_to_all_ops" in r]
    assert [(r["groups"], r["program"]) for r in scen] == [(1, "decode"), (2, "decode")]
    for r in scen:
        assert r["all_to_all_ops"] == ["ep_combine", "ep_dispatch"]  # the cpu ranks' two all-to-alls
        assert len(r["all_to_all_us"]) == len(r["ep2_step_us"]) == 2
        assert all(0 < s < 1 for s in r["all_to_all_share"]) and r["ep1_step_us"] > 0
    doc = json.loads((tmp_path / "out" / "ep_bench.json").read_text())
    assert doc["ep1"]["kern_bench"] == 1 and len(doc["ep2"]) == 2 and len(doc["ep2"][0]["ranks"]) == 2
    assert [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")] == rows


# ---- the summary: rows and ratios from canned lines -----------------------------------------


def _line(label: str, c: int, tok_s: float, ttft: float, itl: float, failed: int = 0) -> str:
    ms = lambda p50: {"mean": p50, "p50": p50, "p99": 2 * p50}  # noqa: E731
    return json.dumps({"label": label, "concurrency": c, "requests": 256, "completed": 256 - failed, "failed": failed,
                       "failures": ["HTTP 500: x"] * failed, "output_throughput": tok_s, "ttft_ms": ms(ttft),
                       "tpot_ms": ms(itl), "itl_ms": ms(itl)})


@pytest.fixture
def served(tmp_path) -> Path:
    lines = {"kern_tp2": [_line("kern_tp2", 32, 6500.0, 80.0, 4.0), _line("kern_tp2", 128, 13000.0, 150.0, 8.0)],
             "vllm_tp2": [_line("vllm_tp2", 32, 5000.0, 100.0, 5.0), _line("vllm_tp2", 128, 12000.0, 200.0, 9.0)],
             "kern_ep2": ["not json", _line("kern_ep2", 32, 3000.0, 90.0, 6.0),
                          _line("kern_ep2", 128, 9000.0, 200.0, 9.0, failed=3)],
             "vllm_ep2": [_line("vllm_ep2", 32, 2500.0, 120.0, 4.0), _line("vllm_ep2", 128, 10000.0, 300.0, 8.0)],
             "kern_pp2": [_line("kern_pp2", 128, 7000.0, 300.0, 12.0)],
             "kern_pp1": [_line("kern_pp1", 128, 10000.0, 150.0, 9.0)]}
    for label, ls in lines.items():
        (tmp_path / f"{label}.jsonl").write_text("\n".join(ls) + "\n")
    (tmp_path / "kern_tp2_startup.json").write_text(json.dumps({"label": "kern_tp2", "startup_s": 31.5}))
    (tmp_path / "mg_ep_bench").mkdir()
    (tmp_path / "mg_ep_bench" / "summary.json").write_text(json.dumps({"steps": {"ep_bench": {"rows": [
        {"step": "ep_bench", "groups": 1, "context": 160, "all_to_all_ops": ["all_reduce_add_local"],
         "all_to_all_us": [120.0, 118.0], "all_to_all_share": [0.08, 0.079], "ep2_step_us": [1500.0, 1501.0],
         "ep1_step_us": 2400.0}], "last_line": "ep_bench: ..."}}, "notes": []}))
    return tmp_path


def test_the_ratios_pair_each_server_with_its_peer(summ, served):
    doc = summ.summary(served)
    tp = doc["ratios"]["tp"]
    assert tp["32"]["out_tok_s"] == 1.3 and tp["32"]["met"] is True and tp["32"]["target"] == 1.3
    assert tp["128"]["out_tok_s"] == round(13000 / 12000, 3) and tp["128"]["met"] is False
    assert (tp["32"]["ttft_p50"], tp["32"]["itl_p50"]) == (0.8, 0.8)
    assert tp["32"]["kern_tp2"] == {"out_tok_s": 6500.0, "ttft_p50_ms": 80.0, "itl_p50_ms": 4.0}
    assert list(doc["ratios"]["ep"]) == ["32"]  # 128: kern's failed requests keep it out of the ratios
    assert doc["ratios"]["ep"]["32"]["out_tok_s"] == 1.2 and "target" not in doc["ratios"]["ep"]["32"]
    assert doc["ratios"]["pp"] == {"128": {"out_tok_s": 0.7, "ttft_p50": 2.0, "itl_p50": round(12 / 9, 3),
                                           "kern_pp2": {"out_tok_s": 7000.0, "ttft_p50_ms": 300.0, "itl_p50_ms": 12.0},
                                           "kern_pp1": {"out_tok_s": 10000.0, "ttft_p50_ms": 150.0,
                                                        "itl_p50_ms": 9.0}}}
    assert doc["startup_s"] == {"kern_tp2": 31.5}
    assert doc["steps"]["ep_bench"]["rows"][0]["all_to_all_share"] == [0.08, 0.079]


def test_a_line_a_server_and_concurrency_and_the_summary_file(summ, served):
    done = subprocess.run([sys.executable, str(BENCH / "multi_gpu_summary.py"), str(served)], capture_output=True,
                          text=True, check=True)
    rows = [json.loads(ln) for ln in (served / "serve_rows.jsonl").read_text().splitlines()]
    assert [(r["server"], r["concurrency"]) for r in rows] == [
        ("kern_tp2", 32), ("kern_tp2", 128), ("vllm_tp2", 32), ("vllm_tp2", 128), ("kern_ep2", 32), ("kern_ep2", 128),
        ("vllm_ep2", 32), ("vllm_ep2", 128), ("kern_pp2", 128), ("kern_pp1", 128)]
    assert {k for r in rows for k in r} >= {"case", "out_tok_s", "ttft_p50_ms", "itl_p50_ms", "failed"}
    assert rows[5]["failed"] == 3 and rows[5]["failures"] == ["HTTP 500: x"] * 2
    assert json.loads((served / "summary.json").read_text())["ratios"]["tp"]["32"]["met"] is True
    out = done.stdout.splitlines()
    assert "tp c=32: 1.3x output tok/s, TTFT p50 0.8x, ITL p50 0.8x" in "\n".join(out)
    assert any(ln.startswith("tp c=128") and "NOT met" in ln for ln in out)
    assert any(ln.startswith("ep_bench 1 x 1 @ 160: all-to-all (all_reduce_add_local)") for ln in out)
    last = subprocess.run([sys.executable, str(BENCH / "multi_gpu_summary.py"), "--last", str(served / "kern_ep2.jsonl")],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert last == "9000.0 output tok/s, TTFT p50 200.0 ms, ITL p50 9.0 ms, 253 done, 3 failed"


def test_an_empty_folder_sums_up_to_nothing(summ, tmp_path):
    doc = summ.summary(tmp_path)
    assert (doc["rows"], doc["ratios"], doc["startup_s"], doc["steps"]) == ([], {}, {}, {})


# ---- the shell recipe: its vLLM flags and what a collect call brings back --------------------


SCRIPT = BENCH / "multi_gpu_serve.sh"


def test_the_recipe_parses_and_asks_vllm_for_its_own_flags():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    # vLLM 0.26's ParallelConfig flags (vllm/engine/arg_utils.py), not guessed ones
    assert "vllm_tp2 $((PORT + 2)) $C8 --tensor-parallel-size 2\n" in text
    assert "vllm_ep2 $((PORT + 3)) $CM --tensor-parallel-size 2 --enable-expert-parallel" in text
    assert "kern_tp2 $C8 $CONC --tp 2" in text and "kern_ep2 $CM $CONC --ep 2" in text
    assert "kern_pp2 $C8 $PP_CONC --pp 2" in text and "kern_pp1 $C8 $PP_CONC\n" in text


def test_a_collect_call_brings_back_four_files_holding_everything(tmp_path):
    bg, out = tmp_path / "bg", tmp_path / "out"
    (bg / "mg_ep").mkdir(parents=True)
    out.mkdir()
    for i in range(20):  # more files than a call returns
        (bg / f"server{i}_serve.log").write_text(f"log {i}\n")
    (bg / "kern_tp2.jsonl").write_text(_line("kern_tp2", 32, 6500.0, 80.0, 4.0) + "\n")
    (bg / "vllm_tp2.jsonl").write_text(_line("vllm_tp2", 32, 5000.0, 100.0, 5.0) + "\n")
    (bg / "mg_ep" / "ep.log").write_text("ep\n")
    (bg / "vllm_tp2.pid").write_text("123\n")
    (bg / "progress.log").write_text("[1 s] pipeline: ...\n")
    (bg / "done").touch()
    env = {**os.environ, "PHASE": "collect", "WAIT_S": "3", "X2_BG": str(bg), "OUT": str(out)}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=BENCH.parent, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "the pipeline is done" in done.stdout and "tp c=32: 1.3x output tok/s" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["progress.log", "summary.json", "summary.txt", "x2.tgz"]
    with tarfile.open(out / "x2.tgz") as t:
        names = {n.removeprefix("./") for n in t.getnames()}
    assert {f"server{i}_serve.log" for i in range(20)} | {"mg_ep/ep.log", "serve_rows.jsonl", "summary.json"} <= names
    assert "vllm_tp2.pid" not in names
    assert json.loads((out / "summary.json").read_text())["ratios"]["tp"]["32"]["out_tok_s"] == 1.3


def test_a_collect_call_does_not_wait_on_a_pipeline_that_is_gone(tmp_path):
    bg, out = tmp_path / "bg", tmp_path / "out"
    bg.mkdir()
    out.mkdir()
    (bg / "pid").write_text("999999999\n")  # no such process, no done mark
    env = {**os.environ, "PHASE": "collect", "WAIT_S": "300", "X2_BG": str(bg), "OUT": str(out)}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=BENCH.parent, env=env, capture_output=True, text=True,
                          timeout=60)
    assert "the pipeline is not running" in done.stdout and "not done" in done.stdout
    assert (out / "x2.tgz").is_file()


def _free_ports() -> int:
    """A port base whose base, base + 2 and base + 3 are free here."""
    import random
    import socket

    for _ in range(50):
        base = random.randrange(20000, 60000)
        try:
            for port in (base, base + 2, base + 3):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    pytest.skip("no free ports")


def test_a_dry_run_serves_each_pair_and_sums_it_up(tmp_path):
    """The pipeline end to end on the cpu (DRY=1): the tiny checkpoints, kern serve --tp 2, and
    the vLLM block with kern serve standing in for vLLM's server (VLLM=fake: started together,
    each measured once both are up, both stopped); then a collect call's files."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    bg, out = tmp_path / "bg", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "DRY": "1", "VLLM": "fake", "STEPS": "ckpt,serve_tp,vllm", "CONC": "2", "REQUESTS": "4",
           "PORT": str(_free_ports()), "X2_BG": str(bg), "X2_CK": str(tmp_path / "ck"), "PHASE": "all"}
    done = subprocess.run(["bash", str(SCRIPT)], cwd=BENCH.parent, env=env, capture_output=True, text=True,
                          timeout=300)
    progress = (bg / "progress.log").read_text()
    assert done.returncode == 0 and (bg / "done").is_file(), progress + done.stderr[-2000:]
    for label in ("kern_tp2", "vllm_tp2", "vllm_ep2"):
        assert f"{label} up in" in progress and f"{label} c=2: " in progress, progress
    assert "serve_ep" not in progress and "kern_ep2" not in progress  # not in STEPS
    env = {**os.environ, "PHASE": "collect", "WAIT_S": "5", "X2_BG": str(bg), "OUT": str(out)}
    subprocess.run(["bash", str(SCRIPT)], cwd=BENCH.parent, env=env, capture_output=True, text=True, check=True)
    doc = json.loads((out / "summary.json").read_text())
    assert list(doc["ratios"]) == ["tp"] and doc["ratios"]["tp"]["2"]["out_tok_s"] > 0
    assert {r["server"] for r in doc["rows"]} == {"kern_tp2", "vllm_tp2", "vllm_ep2"}
    assert set(doc["startup_s"]) == {"kern_tp2", "vllm_tp2", "vllm_ep2"}
