"""What every family's generator shares: the kern.generators entry point's face."""

from __future__ import annotations


class FamilyGenerator:
    """A family's generator as the engine finds it: `name`, the `architectures` it builds,
    `accepts(config)`; a family adds `generate(config, out_dir, *, target, model, context, tp,
    ep, batch_invariant, **limits)` (the options the engine passes, each a typed keyword every
    family takes: a split or build it cannot make is refused by name, never dropped; `limits`:
    the family's own, its manifest builders') and `rebuild(source, target)`."""

    name: str
    architectures: tuple[str, ...]

    def accepts(self, config: dict) -> bool:
        return any(a in self.architectures for a in config.get("architectures") or [])
