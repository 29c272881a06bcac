"""The root of every error kern reports to a user: one clear line that names the problem and its
place, never a traceback. At the bottom of the house: it imports nothing, and every layer
(manifest/, pool/, runtime/, generation/, judge/, bench/, serve/, commands/) derives its
user-facing errors from it, so a command catches KernError and nothing else."""


class KernError(Exception):
    """Base of the errors kern reports to a user as one clear message (never a traceback)."""
