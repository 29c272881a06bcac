"""A config that ties the LM head to the embedding (tie_word_embeddings) yet a checkpoint that
ships an lm_head.weight of its own, different from the embedding: transformers serves that
lm_head.weight (llama and Qwen3-MoE untie a pair whose values differ; Kimi-Linear ties
nothing), and 5.24 saves Kimi-Linear so. kern serves it too, in every family and for every
target. A tied checkpoint that ships only one of the two: llama and Qwen3-MoE read it for both,
as transformers does; Kimi-Linear, which transformers would give a random head (or embedding),
is refused in one line naming the tensor and the checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kern.drive.parity import compare, teacher_forced  # noqa: E402
from kern.manifest import load_verified  # noqa: E402
from kern.runtime.engine import Engine  # noqa: E402
from kern.files.errors import WeightError  # noqa: E402

FAMILIES = ("llama", "qwen3_moe", "kimi_linear")
TYING = ("llama", "qwen3_moe")  # whose transformers class ties lm_head.weight to the embedding
ARCH = {"llama": "LlamaForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "kimi_linear": "KimiLinearForCausalLM"}


class _Stepped:
    """What kern.drive steps by hand: an engine with its pool."""

    def __init__(self, manifest: Path, ckpt: Path):
        self.engine = Engine(load_verified(manifest), ckpt, paged=True)
        self.paging, self.protocol = self.engine.paging, self.engine.protocol
        self.page_tokens = self.paging.page_tokens


def _tied_but_shipped(family: str, folder: Path) -> Path:
    """The family's tiny checkpoint with its config tying the head while lm_head.weight differs
    from the embedding: Kimi-Linear as transformers 5.24 saves it with tie_word_embeddings; the
    others saved untied and their config.json then edited to tie."""
    if family == "kimi_linear":
        from kern_models.kimi_linear.random_checkpoint import make

        return make("tiny", folder, max_positions=512, tie_word_embeddings=True)
    if family == "qwen3_moe":
        from kern_models.qwen3_moe.random_checkpoint import make

        make("tiny", folder, max_positions=512)
    else:
        from tests.runtime.conftest import tiny_checkpoint

        tiny_checkpoint(folder, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    return folder


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """family -> (its tied-but-shipped checkpoint, its config), each made once."""
    from safetensors.torch import load_file

    made = {}

    def get(family: str) -> tuple[Path, dict]:
        if family not in made:
            ckpt = _tied_but_shipped(family, tmp_path_factory.mktemp(f"tied_{family}"))
            config = json.loads((ckpt / "config.json").read_text())
            assert config["tie_word_embeddings"] is True
            t = {k: v for f in ckpt.glob("*.safetensors") for k, v in load_file(f).items()}
            assert not torch.equal(t["lm_head.weight"], t["model.embed_tokens.weight"])
            made[family] = ckpt, config
        return made[family]

    return get


def _deploy(family: str, config: dict, out: Path, target: str = "cpu") -> Path:
    import importlib

    generate = importlib.import_module(f"kern_models.{family}.generator").generate
    kw = {"tokens": 64, "seqs": 4} if target == "cpu" else {}
    return generate(config, out, target=target, model="tiny", context=256, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_shipped_head_is_served_as_transformers_serves_it(family, tied, tmp_path):
    from tests.runtime.conftest import reference_logits

    ckpt, config = tied(family)
    model = _Stepped(_deploy(family, config, tmp_path / "dep"), ckpt)
    ids = np.random.default_rng(5).integers(0, config["vocab_size"], 24).tolist()
    r = compare(reference_logits(ckpt, ids), teacher_forced(model, ids))
    assert r["max_kl"] <= 1e-4 and r["agree_decisive"] == 1.0, r


def _cuda_config(family: str) -> dict:
    """A config of the family that its sm_90a generator builds (the tiny ones' head widths are
    the cpu's only), tying the head."""
    if family == "llama":
        from tests.cuda.test_cuda_manifest_limits import TINY as cfg
    elif family == "qwen3_moe":
        from kern_models.qwen3_moe.random_checkpoint import SHAPES

        cfg = {"architectures": ["Qwen3MoeForCausalLM"], **SHAPES["small"], "max_position_embeddings": 1024}
    else:
        from kern_models.kimi_linear.random_checkpoint import shape_config

        cfg = {"architectures": ["KimiLinearForCausalLM"], **shape_config("kimi-linear-48b-a3b", 4),
               "max_position_embeddings": 1024}
    return {**cfg, "tie_word_embeddings": True}


def test_the_families_that_tie_are_those_transformers_ties():
    """Which families bind a tied head with a fallback is transformers' to say: its class's
    _tied_weights_keys (KimiLinearForCausalLM's is empty)."""
    import transformers

    ties = {f: bool(getattr(transformers, ARCH[f])._tied_weights_keys) for f in FAMILIES}
    assert ties == {f: f in TYING for f in FAMILIES}


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_target_binds_the_shipped_head_first(family, target, tmp_path):
    """Tied, llama's and Qwen3-MoE's head binds lm_head.weight where the checkpoint has it, the
    embedding where not (and the embedding the reverse); Kimi-Linear's each its own, tied or
    not; the cuda manifests (generated here, run on the H200) as the cpu ones."""
    config = _cuda_config(family)
    m = json.loads(_deploy(family, config, tmp_path / target, target).read_text())
    fallback = family in TYING
    assert m["buffers"]["lm_head"]["bind"] == [{"tensor": "lm_head.weight",
                                                **({"fallback": "model.embed_tokens.weight"} if fallback else {})}]
    assert m["buffers"]["embed"]["bind"] == [{"tensor": "model.embed_tokens.weight",
                                              **({"fallback": "lm_head.weight"} if fallback else {})}]
    untied = json.loads(_deploy(family, {**config, "tie_word_embeddings": False}, tmp_path / "untied", target)
                        .read_text())
    assert untied["buffers"]["lm_head"]["bind"] == [{"tensor": "lm_head.weight"}]


def _without(ckpt: Path, out: Path, drop: str) -> Path:
    """A copy of ckpt without tensor `drop`."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(ckpt, out)
    for f in out.glob("*.safetensors"):
        save_file({k: v for k, v in load_file(f).items() if k != drop}, f, metadata={"format": "pt"})
    index = out / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"].pop(drop, None)
        index.write_text(json.dumps(data))
    return out


def _parity(family: str, config: dict, ckpt: Path, dep: Path) -> dict:
    from tests.runtime.conftest import reference_logits

    ids = np.random.default_rng(5).integers(0, config["vocab_size"], 24).tolist()
    return compare(reference_logits(ckpt, ids), teacher_forced(_Stepped(dep, ckpt), ids))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_head_equal_to_the_embedding_is_served_as_tied(family, tied, tmp_path):
    """The matching case: tied and lm_head.weight a copy of the embedding."""
    from safetensors.torch import load_file, save_file

    ckpt, config = tied(family)
    same = shutil.copytree(ckpt, tmp_path / "ckpt")
    (f,) = same.glob("*.safetensors")  # the tiny checkpoints are one file
    t = load_file(f)
    t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    save_file(t, f, metadata={"format": "pt"})
    r = _parity(family, config, same, _deploy(family, config, tmp_path / "dep"))
    assert r["max_kl"] <= 1e-4 and r["agree_decisive"] == 1.0, r


@pytest.mark.parametrize("drop", ["lm_head.weight", "model.embed_tokens.weight"])
@pytest.mark.parametrize("family", TYING)
def test_a_tied_checkpoint_shipping_one_reads_it_for_both(family, drop, tied, tmp_path):
    """llama and Qwen3-MoE: transformers ties the missing one to the one shipped, either way round."""
    ckpt, config = tied(family)
    one = _without(ckpt, tmp_path / "ckpt", drop)
    dep = _deploy(family, config, tmp_path / "dep")
    e = _Stepped(dep, one).engine
    assert np.array_equal(e.read("lm_head", e.max_env), e.read("embed", e.max_env))
    r = _parity(family, config, one, dep)
    assert r["max_kl"] <= 1e-4 and r["agree_decisive"] == 1.0, r


@pytest.mark.parametrize("drop", ["lm_head.weight", "model.embed_tokens.weight"])
def test_kimi_linear_shipping_one_is_refused_in_one_line(drop, tied, tmp_path, capsys):
    """Tied, a Kimi-Linear checkpoint without one of the two: transformers loads it with that
    tensor random (missing, never tied), which kern cannot match, so `kern run` refuses it in one
    line naming the checkpoint and the tensor."""
    import transformers
    from kern.cli import main

    full, config = tied("kimi_linear")
    ckpt = _without(full, tmp_path / "ckpt", drop)
    _, info = transformers.AutoModelForCausalLM.from_pretrained(ckpt, output_loading_info=True)
    assert set(info["missing_keys"]) == {drop}
    dep = _deploy("kimi_linear", config, tmp_path / "dep")
    capsys.readouterr()
    assert main(["run", str(ckpt), "--manifest", str(dep), "--target", "cpu", "--prompt", "w5 w6"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"kern run: checkpoint {ckpt} does not fit the manifest: ") and \
        err.rstrip().endswith(f"checkpoint has no tensor {drop!r}"), err


@pytest.mark.parametrize("family", FAMILIES)
def test_a_checkpoint_with_neither_is_refused_naming_both(family, tied, tmp_path):
    ckpt, config = tied(family)
    dep = _deploy(family, config, tmp_path / "dep")
    bare = _without(_without(ckpt, tmp_path / "a", "lm_head.weight"), tmp_path / "b", "model.embed_tokens.weight")
    with pytest.raises(WeightError) as e:
        _Stepped(dep, bare)
    if family in TYING:
        assert "no tensor 'lm_head.weight' (nor 'model.embed_tokens.weight', bound in its place)" in str(e.value)
    else:
        assert "(2 problems)" in str(e.value) and "buffers.lm_head.bind[0]: checkpoint has no tensor 'lm_head.weight'" \
            in str(e.value) and "buffers.embed.bind[0]: checkpoint has no tensor 'model.embed_tokens.weight'" in str(e.value)
