"""What every family's generator shares: the kern.generators entry point's face."""

from __future__ import annotations


class FamilyGenerator:
    """A family's generator as the engine finds it: `name`, the `architectures` it builds,
    `accepts(config)`; a family adds `generate(config, out_dir, *, target, model, context,
    **limits)` and `rebuild(source, target)`."""

    name: str
    architectures: tuple[str, ...]

    def accepts(self, config: dict) -> bool:
        return any(a in self.architectures for a in config.get("architectures") or [])
