"""The root of every error kern reports to a user: one clear line that names the problem and its
place, never a traceback. At the bottom of the house: it imports nothing, and every room
(manifest/, pool/, files/, runtime/, world/, generation/, judge/, bench/, serve/, cut/,
commands/) derives its user-facing errors from it, so a command catches KernError and nothing
else. BoundsError, beside it, is what every room raises for input outside a bound."""


class KernError(Exception):
    """Base of the errors kern reports to a user as one clear message (never a traceback)."""


class BoundsError(KernError):
    """A request or a step outside what the model takes (a var bound, an input's domain, the
    context, a sampling knob's range), refused before anything runs."""
