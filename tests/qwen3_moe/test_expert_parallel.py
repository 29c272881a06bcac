"""Expert parallel on the cpu: the experts split over the ranks of an `ep` group (threads of one
process, kern.world.ranks), rows dispatched to their experts' ranks and combined back by the
all-to-all collectives over peer buffers; the logits and tokens equal the single device's bit
for bit. `--ep` on kern run and kern.load; the refusals, one line each."""

from __future__ import annotations


import numpy as np
import pytest

from kern.errors import BoundsError
from tests.reliability.conftest import kern, make_tiny
from kern.drive.parity import teacher_forced


@pytest.fixture(scope="module", params=[2, 4])
def split(request, moe_config, moe_ckpt, tmp_path_factory):
    from kern.api import Model
    from kern_models.qwen3_moe.generator import generate

    out = tmp_path_factory.mktemp(f"ep{request.param}")
    return Model(generate(moe_config, out, target="cpu", model="tiny-moe", tokens=64, seqs=4, context=256,
                          ep=request.param), moe_ckpt)


def test_split_ranks_give_the_single_device_logits_bit_for_bit(moe_model, split):
    ids = np.random.default_rng(0).integers(0, 256, 40).tolist()
    assert np.array_equal(teacher_forced(moe_model, ids), teacher_forced(split, ids))


def test_split_ranks_give_the_single_device_tokens_in_a_batch(moe_model, split):
    from kern.generation import SamplingParams

    prompts = [np.random.default_rng(s).integers(0, 256, 3 + 9 * s).tolist() for s in range(3)]
    params = SamplingParams(max_tokens=8)
    assert [g.tokens for g in moe_model.generate_batch(prompts, params)] == \
        [g.tokens for g in split.generate_batch(prompts, params)]


def test_each_rank_binds_only_its_experts_and_declares_the_all_to_alls(split):
    ranks = split.engine.ranks
    n = len(ranks)
    for r, e in enumerate(ranks):
        m = e.m
        assert m.topology.groups == {"ep": [list(range(n))]} and m.constants["local_experts"] == 8 // n
        binds = [s.tensor for s in m.buffers["experts_down.0"].bind]
        assert binds == [f"model.layers.0.mlp.experts.{x}.down_proj.weight" for x in range(r * 8 // n, (r + 1) * 8 // n)]
        ops = [c.op for c in m.programs["decode"].calls]
        assert ops.count("ep_dispatch") == ops.count("ep_combine") == 2  # the two sparse layers
        assert {"d_recv_peers", "d_gathered_peers"} <= {k for k, b in m.buffers.items() if b.kind == "peer"}


@pytest.fixture()
def tiny_moe_dir(moe_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("KERN_CACHE", str(tmp_path / "cache"))
    return moe_ckpt


def test_kern_run_ep_2_gives_the_unsplit_text(capsys, tiny_moe_dir):
    args = ["run", str(tiny_moe_dir), "--target", "cpu", "--prompt", "w1 w2 w3", "--max-tokens", "8"]
    one = kern(capsys, *args)
    two = kern(capsys, *args, "--ep", "2")
    assert one.code == two.code == 0, two.err
    assert two.out == one.out and two.out.strip()
    assert "on cpu x 2 (expert parallel)" in two.err


@pytest.mark.parametrize("flags,message", [
    (["--ep", "3"], "generator 'qwen3_moe' cannot build a cpu deployment: ep 3: num_experts 8 does not split "
                    "over 3 ranks"),
    (["--tp", "2"], "generator 'qwen3_moe' cannot build a cpu deployment: --tp 2: qwen3_moe splits its experts "
                    "(--ep), not its heads: there is no tensor-parallel build of a mixture of experts"),
    (["--no-batch-invariance"], "generator 'qwen3_moe' cannot build a cpu deployment: --no-batch-invariance: "
                                "qwen3_moe has one cpu build, batch-invariant: there is no faster build to trade it "
                                "for (docs/determinism.md)"),
])
def test_a_split_the_model_cannot_take_is_one_line(capsys, tiny_moe_dir, flags, message):
    r = kern(capsys, "run", str(tiny_moe_dir), "--target", "cpu", *flags)
    assert r.code == 1 and "Traceback" not in r.err
    (line,) = r.err.strip().splitlines()
    assert line.startswith("kern run: ") and line.endswith(message), line


def test_a_dense_model_refuses_ep_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KERN_CACHE", str(tmp_path / "cache"))
    r = kern(capsys, "run", str(make_tiny(tmp_path / "tiny")), "--target", "cpu", "--ep", "2")
    (line,) = r.err.strip().splitlines()
    assert r.code == 1 and line.endswith("generator 'llama' cannot build a cpu deployment: --ep 2: llama "
                                         "(LlamaForCausalLM) has no experts to split (expert parallel is for "
                                         "mixtures of experts)"), line


@pytest.mark.parametrize("verb", ["run", "serve"])
def test_ep_below_one_is_refused_by_the_parser(capsys, verb):
    r = kern(capsys, verb, "/nonexistent", "--ep", "0")
    assert r.code == 2 and "argument --ep: must be at least 1, got 0" in r.err.splitlines()[-1]


def test_load_takes_ep(tiny_moe_dir):
    from kern.api import load

    with pytest.raises(BoundsError, match="ep must be a positive integer, got 0"):
        load(tiny_moe_dir, ep=0)
    m = load(tiny_moe_dir, target="cpu", ep=2, progress=False)
    assert m.verified.manifest.topology.groups == {"ep": [[0, 1]]}
    assert m.generate("w1 w2", max_tokens=4).tokens


def test_a_shipped_manifest_is_not_split_by_ep(tmp_path, moe_dep, moe_ckpt):
    import shutil

    from kern.deployments import deployment_for
    from kern.errors import KernError

    folder = tmp_path / "both"
    shutil.copytree(moe_ckpt, folder)
    shutil.copy(moe_dep / "manifest.json", folder / "manifest.json")
    with pytest.raises(KernError, match=r"ships its own manifest.json; --ep 2 splits generated deployments"):
        deployment_for(folder, "cpu", ep=2)
