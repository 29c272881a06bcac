"""The pinned cubins: shipped in models/llama/kernels/cuda/cubins/, pinned with their inputs in
cubins.sha256, rebuilt byte for byte by nvcc of the recorded release, and what the generator
uses on a machine without the CUDA toolkit."""

import hashlib
import shutil

import pytest

from kern_models.common import cubins
from kern_models.common.errors import ConfigError
from kern_models.llama.kernels.cuda import CUBINS


def test_every_source_is_pinned_with_its_current_inputs_and_shipped():
    """A kernel source changed without re-pinning (python -m kern_models.common.cubins llama OUT
    --record) would make the generator fall back to nvcc: caught here, on any machine."""
    release, pins = CUBINS.read_pins()
    assert release, "cubins.sha256 must record the nvcc release"
    assert sorted(pins) == sorted(f"{s.stem}.cubin" for s in CUBINS.sources())
    for src in CUBINS.sources():
        pin = pins[f"{src.stem}.cubin"]
        assert pin.inputs == CUBINS.input_digest(src), f"{src.name} changed since it was pinned"
        shipped = CUBINS.shipped / f"{src.stem}.cubin"
        assert hashlib.sha256(shipped.read_bytes()).hexdigest() == pin.cubin, f"{shipped.name} differs from its pin"
    assert sorted(p.name for p in CUBINS.shipped.iterdir()) == sorted(pins)


def test_cubins_rebuild_to_the_pinned_and_shipped_bytes(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    release, pins = CUBINS.read_pins()
    if cubins.nvcc_release(nvcc) != release:
        pytest.skip(f"nvcc {cubins.nvcc_release(nvcc)} differs from the recorded {release}")
    assert CUBINS.build(tmp_path, nvcc) == {n: p.cubin for n, p in pins.items()}
    for name in pins:
        assert (tmp_path / name).read_bytes() == (CUBINS.shipped / name).read_bytes(), name


def test_without_nvcc_the_shipped_cubins_are_copied(tmp_path, monkeypatch):
    monkeypatch.setattr(cubins.shutil, "which", lambda _: None)
    _, pins = CUBINS.read_pins()
    assert CUBINS.provide(tmp_path) == {n: p.cubin for n, p in pins.items()}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(pins)
    assert CUBINS.provide(tmp_path / "two", ["mega.cubin", "norm.cubin"]) == {
        "mega.cubin": pins["mega.cubin"].cubin, "norm.cubin": pins["norm.cubin"].cubin}


def test_without_nvcc_a_changed_kernel_is_refused_saying_why(tmp_path, monkeypatch):
    monkeypatch.setattr(cubins.shutil, "which", lambda _: None)
    real = cubins.Cubins.input_digest
    monkeypatch.setattr(cubins.Cubins, "input_digest",
                        lambda self, src, f=None: "0" * 64 if src.stem == "gemv" else real(self, src, f))
    with pytest.raises(ConfigError, match=r"gemv.cubin: its sources or flags differ from the pinned ones in "
                                          r"cubins.sha256, and building it needs nvcc \(the CUDA toolkit\) on PATH"):
        CUBINS.provide(tmp_path)


@pytest.mark.parametrize("ask,why", [
    (["flash.cubin"], "flash.cubin: no kernel source flash.cu in "),
])
def test_a_cubin_without_a_source_is_refused(tmp_path, ask, why):
    with pytest.raises(ConfigError, match=why):
        CUBINS.provide(tmp_path, ask)


def test_a_family_without_cubins_is_refused():
    with pytest.raises(ConfigError, match="family 'gpt2': no kern_models.gpt2.kernels.cuda with CUBINS"):
        cubins.of_family("gpt2")
