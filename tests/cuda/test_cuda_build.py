"""The pinned cubins: shipped in models/llama/cuda/cubins/, pinned with their inputs in
cubins.sha256, rebuilt byte for byte by nvcc of the recorded release, and what the generator
uses on a machine without the CUDA toolkit."""

import hashlib
import shutil

import pytest

from kern_models.llama.config import ConfigError
from kern_models.llama.cuda import build


def test_every_source_is_pinned_with_its_current_inputs_and_shipped():
    """A kernel source changed without re-pinning (python -m kern_models.llama.cuda.build OUT
    --record) would make the generator fall back to nvcc: caught here, on any machine."""
    release, pins = build.read_pins()
    assert release, "cubins.sha256 must record the nvcc release"
    assert sorted(pins) == sorted(f"{s.stem}.cubin" for s in build.sources())
    for src in build.sources():
        pin = pins[f"{src.stem}.cubin"]
        assert pin.inputs == build.input_digest(src, build.flags()), f"{src.name} changed since it was pinned"
        shipped = build.SHIPPED / f"{src.stem}.cubin"
        assert hashlib.sha256(shipped.read_bytes()).hexdigest() == pin.cubin, f"{shipped.name} differs from its pin"
    assert sorted(p.name for p in build.SHIPPED.iterdir()) == sorted(pins)


def test_cubins_rebuild_to_the_pinned_and_shipped_bytes(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    release, recorded = build.read_recorded()
    if build.nvcc_release(nvcc) != release:
        pytest.skip(f"nvcc {build.nvcc_release(nvcc)} differs from the recorded {release}")
    assert build.build(tmp_path, nvcc) == recorded
    for name in recorded:
        assert (tmp_path / name).read_bytes() == (build.SHIPPED / name).read_bytes(), name


def test_without_nvcc_the_shipped_cubins_are_copied(tmp_path, monkeypatch):
    monkeypatch.setattr(build.shutil, "which", lambda _: None)
    _, recorded = build.read_recorded()
    assert build.provide(tmp_path) == recorded
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(recorded)


@pytest.mark.parametrize("change,why", [
    ("source", "gemv.cubin: its sources or flags differ from the pinned ones in cubins.sha256, "
               "and building it needs nvcc (the CUDA toolkit) on PATH"),
    ("variant", "argmax.cubin: variant 'gemv.residual_late' changes its build flags, and building it needs nvcc"),
])
def test_without_nvcc_a_changed_kernel_is_refused_saying_why(tmp_path, monkeypatch, change, why):
    monkeypatch.setattr(build.shutil, "which", lambda _: None)
    if change == "source":
        real = build.input_digest
        monkeypatch.setattr(build, "input_digest", lambda src, f: "0" * 64 if src.stem == "gemv" else real(src, f))
    with pytest.raises(ConfigError, match=why.replace("(", r"\(").replace(")", r"\)")):
        build.provide(tmp_path, "gemv.residual_late" if change == "variant" else None)


def test_an_unknown_variant_is_refused():
    with pytest.raises(ConfigError, match="variant 'fast': the llama kernels have attention.late_trigger, "
                                          "gemv.residual_late"):
        build.flags("fast")
