"""The host loop: one scheduler and one step() for kern run, the Python API and the server."""

from .outputs import Delta, TokenLogprob
from .params import SamplingParams

__all__ = ["Delta", "SamplingParams", "TokenLogprob"]
