"""A loaded model's speculator (`kern.load(..., speculate=...)`, `--speculate`): the n-gram
proposer, or a draft deployment opened beside the target with its own pool. Refuses, in one
line naming why, a deployment that cannot verify rounds."""

from __future__ import annotations

from pathlib import Path

from .deployments import deployment_for
from .generation.draft import DraftProposer, check_pair
from .generation.speculative import NgramProposer, Speculate, SpeculateError, Speculator
from .manifest import load_verified
from .manifest.protocol import verify_problem
from .world.stepping import open_engine

# The draft's state memory: its own pool beside the target's (a draft is the smaller model; its
# sequences are the target's, at the same lengths).
DRAFT_MEMORY = 256 << 20


def speculator_for(speculate: str | Speculate, model) -> Speculator:
    """`model`: an api.Model (its protocol, pool, engine, checkpoint and loop)."""
    spec = Speculate.parse(speculate) if isinstance(speculate, str) else speculate
    name = model.verified.manifest.model
    if model.protocol.verify is None:
        t = model.verified.manifest.target
        where = f"{t.arch or t.device} deployment"  # a family may verify on one target and not another
        raise SpeculateError(f"--speculate {spec}: the {where} of {name} declares no verify program (a ragged "
                             "program with an `accepted` output, docs/speculative.md), so it cannot speculate")
    if (why := verify_problem(model.protocol.verify)) is not None:
        raise SpeculateError(f"--speculate {spec}: {why}")
    slots = [k.name for k in model.paging.pool.layout.kinds if not k.paged]
    if slots:
        raise SpeculateError(f"--speculate {spec}: {name} keeps per-sequence state ({', '.join(slots)}); rounds that "
                             "roll such a state back to the last accepted position are not built yet")
    if spec.kind == "ngram":
        return Speculator(spec, NgramProposer())
    return Speculator(spec, _draft(spec, model))


def _draft(spec: Speculate, model) -> DraftProposer:
    folder = spec.draft
    if not folder.is_dir():
        raise SpeculateError(f"--speculate {spec}: the draft {folder} is not a folder")
    target = model.verified.manifest.target.device
    verified = load_verified(deployment_for(folder, target))
    engine = open_engine(verified, folder, state_budget=DRAFT_MEMORY, paged=True)
    if engine.paging.state is None:
        raise SpeculateError(f"--speculate {spec}: the draft's deployment has no paged state")
    check_pair(model.engine.domain(model.loop.runner.ragged.inputs["token"]),
               engine.domain(engine.protocol.for_rows(1, None).inputs["token"]),
               _tokenizer(model.checkpoint), _tokenizer(folder))
    context = min(model.context, engine.protocol.max_positions or model.context)
    return DraftProposer(engine, engine.paging, context)


def _tokenizer(folder: Path) -> bytes | None:
    p = Path(folder) / "tokenizer.json"
    return p.read_bytes() if p.is_file() else None
