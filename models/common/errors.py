"""The one error a generator raises for input it cannot build, and the one line every family
says when it is given an option it cannot honour."""

from __future__ import annotations


class ConfigError(ValueError):
    """config.json (or a generator option) describes something a generator does not build;
    names the field."""


# The generator options a user sets by a command's flag, by the flag's name: a refusal names
# what the user typed.
FLAGS = {"batch_invariant": "--no-batch-invariance", "tp": "--tp", "ep": "--ep"}


def refuse(family: str, option: str, value, why: str) -> ConfigError:
    """The error for an option this family cannot honour: one line naming the family, the flag
    as the user gave it and why (never a silent drop: every flag means the same for every family)."""
    flag = FLAGS.get(option, option)
    given = flag if option == "batch_invariant" else f"{flag} {value}"
    return ConfigError(f"{given}: {family} {why}")


def check_batch_invariant(batch_invariant: bool, family: str, target: str, has_faster: bool) -> bool:
    """A generator's `batch_invariant` option, checked: True unless the caller asked for the
    faster build (False). has_faster: this family has a build on this target whose bytes may
    depend on the batch (beside an invariant one, or as its only one); where its only build is
    batch-invariant, asking for the faster one is refused, not ignored."""
    if not isinstance(batch_invariant, bool):
        raise ConfigError(f"batch_invariant {batch_invariant!r}: must be true or false")
    if not batch_invariant and not has_faster:
        raise refuse(family, "batch_invariant", False, f"has one {target} build, batch-invariant: there is no faster "
                     "build to trade it for (docs/determinism.md)")
    return batch_invariant
