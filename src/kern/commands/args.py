"""The flag types every command shares (each refusal names the flag's value) and the host
loop's options (kern run, kern serve)."""

from __future__ import annotations

import argparse
import math

MAX_MEMORY = 1 << 40  # --memory: a state budget past any device's memory (the pool's bookkeeping grows with it)

def whole(lowest: int):
    """An argparse type: a whole number >= lowest (the message names the flag's value)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if n < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {n}")
        return n
    return parse


def non_negative_real(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return x


def utf8(text: str) -> str:
    """Text that is valid UTF-8 (argv bytes that are not arrive as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text (a stray byte at character {exc.start})") from None
    return text


def port(text: str) -> int:
    n = whole(0)(text)
    if n > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is at most 65535, got {n}")
    return n


positive = whole(1)
non_negative = whole(0)  # seed 0 is a seed like any other; a negative one is refused, not wrapped


def memory(text: str) -> int:
    """A byte count: a whole number of MiB, or with a unit: 512M, 2G."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = units.get(t[-1:], None)
    try:
        n = float(t[:-1] if scale else t) * (scale or 1 << 20)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 512M or 2G, got {text!r}") from None
    if not math.isfinite(n):  # inf, nan, 1e400G
        raise argparse.ArgumentTypeError(f"expected a finite size such as 512M or 2G, got {text!r}")
    if n > MAX_MEMORY:
        raise argparse.ArgumentTypeError(f"must be at most 1024G (more than any device holds), got {text!r}")
    if n < 1 << 20:
        raise argparse.ArgumentTypeError(f"must be at least 1M, got {text!r}")
    return int(n)


def host_memory(text: str) -> int:
    """--host-memory: a size like --memory's, or 0 for none."""
    return 0 if text.strip() == "0" else memory(text)


def speculate(text: str) -> str:
    """A --speculate value, checked here (its draft folder is checked at load)."""
    from ..generation.speculative import Speculate, SpeculateError

    try:
        Speculate.parse(text)
    except SpeculateError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--speculate {text!r}: ")) from None
    return text


def model_arguments(p: argparse.ArgumentParser) -> None:
    """The model a command loads (kern run, kern serve): a folder, or the embedded default."""
    p.add_argument("model", nargs="?", metavar="MODEL_DIR",
                   help="a local Hugging Face checkpoint folder, or a deployment folder (manifest.json and its "
                        "kernels) whose weights --weights gives (default: the embedded model)")
    p.add_argument("--manifest", help="manifest to use with a checkpoint folder")
    p.add_argument("--weights", default=None, metavar="CHECKPOINT_DIR",
                   help="the checkpoint folder a deployment folder's manifest binds (default: the embedded model)")


def loop_options(p: argparse.ArgumentParser) -> None:
    """The host loop's options, shared by kern run and kern serve."""
    p.add_argument("--context", type=positive, default=None,
                   help="positions a sequence may reach (default: the model's own, where --memory holds it)")
    p.add_argument("--max-seqs", type=positive, default=None,
                   help="sequences running at once (default: what the memory holds, up to the manifest's bound)")
    p.add_argument("--memory", dest="state_budget", type=memory, default=None,
                   help="state (KV cache) budget, e.g. 512M or 8G (default: on a GPU 90%% of its memory less "
                        "what the weights take, on the cpu 512M)")
    p.add_argument("--step-tokens", type=positive, default=None, metavar="N",
                   help="prompt tokens a step feeds at most: a generated deployment's prefill rows (default: the "
                        "model family's, 2048 on cuda). More reads the weights once for more prompt tokens; "
                        "fewer keeps a step short for the sequences decoding beside it")
    p.add_argument("--tp", type=positive, default=1,
                   help="tensor-parallel ranks: the model split over N devices, one thread a rank (default 1)")
    p.add_argument("--no-batch-invariance", dest="batch_invariant", action="store_false",
                   help="cuda: prefill and many-row decode through cuBLASLt, faster, but a request's tokens "
                        "then depend on what else is in its batch (docs/determinism.md says what it costs "
                        "either way); refused, in one line naming the family, where its only build is "
                        "batch-invariant (every cpu build, --mega)")
    p.add_argument("--speculate", type=speculate, default=None, metavar="ngram[:K]|draft:DIR[:K]",
                   help="speculative decoding: decode steps become rounds of up to K proposed tokens (default 8) "
                        "verified in one step, the tokens exactly those without it; ngram looks them up in the "
                        "sequence's own tokens, draft:DIR runs a smaller model of the same tokenizer "
                        "(docs/speculative.md)")
    p.add_argument("--pp", type=positive, default=1,
                   help="pipeline stages: the model cut into N stages (kern cut) on N devices, one thread a "
                        "stage, a decode step's sequences in micro-batches in flight (default 1; not with --tp "
                        "or --ep above 1)")
    p.add_argument("--ep", type=positive, default=1,
                   help="expert-parallel ranks: a mixture of experts' experts split over N devices, one thread "
                        "a rank (default 1)")

