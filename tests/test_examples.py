"""The committed example deployments are what the generator makes today (a lock file check)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kern.manifest import verify_path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("suffix", ["cpu", "sm90a", "sm90a-mega"])
def test_examples_match_a_fresh_generation(suffix, tmp_path):
    from kern_models.examples import SLUG, TARGETS, write

    committed = EXAMPLES / f"{SLUG}-{suffix}"
    write(tmp_path, {suffix: TARGETS[suffix]})
    assert _files(tmp_path / committed.name) == _files(committed), \
        "examples are stale: run `python -m kern_models.examples`"
    r = verify_path(committed)
    assert r.verified is not None, r.problems
