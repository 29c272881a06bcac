"""kern: an LLM inference engine where a model is a manifest."""

__version__ = "0.1.0"


def load(*args, **kwargs):
    """Load a model (see kern.api.load)."""
    from .api import load as _load

    return _load(*args, **kwargs)


def __getattr__(name: str):
    """kern.MegaModel (kern.mega), imported on first use like kern.load."""
    if name == "MegaModel":
        from .mega import MegaModel

        return MegaModel
    raise AttributeError(f"module 'kern' has no attribute {name!r}")
