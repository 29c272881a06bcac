"""The wheels a clean `pip install '.[vllm]'` needs on the GPU image, offline, beyond the image's own
packages and vLLM's peer wheel set (bench/vllm_kern_gpu.sh's CLEAN=1 installs vLLM's wheels into a
fresh venv over the image, then resolves the clone's `[vllm]` extra as a user's pip would, which
also re-checks vLLM's own requirements against what is installed).

Run here, from the repository root, with the image's package list taken on the device (`python3 -m
pip list --format=freeze > $OUT/image_freeze.txt`, seconds) and a Python 3.12 (`--python`):

    python3 bench/vllm_deps.py --freeze image_freeze.txt --peer-wheels DIR --python python3.12

It makes a Python 3.12 venv holding a stand-in of every image package at its version (metadata
only: no requirements, as the image's own are consistent) and the peer wheels, asks pip for a dry
run of `.[vllm]` with vLLM pinned to the peer set's version (`--report`), downloads what pip would
install beyond them into .vdeps/ and splits it into parts vd1, vd2, ... of 50 MB (each one call's
carry: `mkdir -p /tmp/vd && cp vdN/* /tmp/vd/`). Prints the wheels and their total size."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def stand_in(site: Path, name: str, version: str) -> None:
    """An installed distribution as pip reads one: a dist-info with a name and a version."""
    d = site / f"{norm(name).replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (d / "INSTALLER").write_text("pip\n")
    (d / "RECORD").write_text("")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--freeze", required=True, help="the image's `pip list --format=freeze`")
    ap.add_argument("--peer-wheels", required=True, help="vLLM's peer wheel set, untarred")
    ap.add_argument("--python", default="python3.12", help="a Python 3.12 interpreter")
    ap.add_argument("--out", default=".vdeps")
    args = ap.parse_args()
    for given, what in ((args.freeze, "--freeze: no such file"), (args.peer_wheels, "--peer-wheels: no such folder")):
        if not Path(given).exists():
            print(f"bench/vllm_deps.py: {what}: {given}", file=sys.stderr)
            return 2
    image = {}
    for line in Path(args.freeze).read_text().splitlines():
        if "==" in line:
            name, version = line.strip().split("==", 1)
            image[norm(name)] = (name, version)
    peers = sorted(Path(args.peer_wheels).glob("*.whl"))
    vllm = [w for w in peers if norm(w.name.split("-")[0]) == "vllm"]
    if not vllm:
        print(f"bench/vllm_deps.py: no vllm wheel in {args.peer_wheels}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([args.python, "-m", "venv", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        site = Path(subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                                   capture_output=True, text=True).stdout.strip())
        for name, version in image.values():
            if norm(name) not in ("pip",):
                stand_in(site, name, version)
        # the peer set over the image, as the device's clean venv gets it (without their requirements)
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        *[str(w) for w in peers if norm(w.name.split("-")[0]) != "llguidance"]], check=True)
        pin = Path(tmp) / "pin.txt"
        pin.write_text(f"vllm=={vllm[0].name.split('-')[1]}\n")
        report = Path(tmp) / "report.json"
        subprocess.run([py, "-m", "pip", "install", "-q", "--dry-run", "--report", str(report), "-c", str(pin),
                        ".[vllm]"], check=True)
        need = [(i["metadata"]["name"], i["metadata"]["version"], i["download_info"]["url"])
                for i in json.loads(report.read_text())["install"] if norm(i["metadata"]["name"]) != "kern-engine"]
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for name, version, url in need:
        print(f"{name}=={version}")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp",
                    *[a for p in ("manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
                                  "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                                  "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64",
                                  "manylinux_2_5_x86_64", "manylinux1_x86_64") for a in ("--platform", p)],
                    "-d", str(out), *[f"{n}=={v}" for n, v, _ in need]], check=True)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"{len(need)} wheels, {size / 2**20:.0f} MiB in {out}")
    # parts of 50 MB, each a call's carry beside the ~14 MB tree (a call carries 64 MiB)
    for old in Path(".").glob("vd[0-9]*"):
        shutil.rmtree(old)
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "vd.tar"
        subprocess.run(["tar", "cf", str(tar), "-C", str(out), "."], check=True)
        subprocess.run(["split", "-b", "50m", str(tar), f"{tmp}/p_"], check=True)
        parts = sorted(Path(tmp).glob("p_*"))
        exclude = Path(".git/info/exclude")
        known = exclude.read_text().split() if exclude.exists() else []
        for i, part in enumerate(parts, 1):
            (Path(f"vd{i}")).mkdir()
            shutil.move(str(part), f"vd{i}/{part.name}")
            if f"/vd{i}/" not in known:
                with exclude.open("a") as f:
                    f.write(f"/vd{i}/\n")
    print(f"parts vd1 .. vd{len(parts)}: one call each, `mkdir -p /tmp/vd && cp vdN/* /tmp/vd/`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
