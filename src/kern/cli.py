"""The kern command: run | test | bench | serve | verify | cut | kernels.

Imports stay inside each subcommand so `kern verify` starts fast."""

from __future__ import annotations

import argparse
import math
import os
import sys


def _verify(args: argparse.Namespace) -> int:
    """`PATH: ok, N programs, M calls, K launches`, or `PATH: manifest failed verification:` and
    one line per problem; exit 1 when any path fails. --json: a list, one object per path."""
    import json

    from kern.manifest.verify import verify_path

    results = []
    for path in args.paths:
        r = verify_path(path)
        if r.verified is not None:
            v = r.verified
            res = {"path": path, "ok": True, "programs": len(v.manifest.programs), "calls": v.ncalls,
                   "launches": v.launches}
            lines = [f"{path}: ok, {res['programs']} programs, {v.ncalls} calls, {v.launches} launches"]
        else:
            res = {"path": path, "ok": False, "problems": [{"where": p.where, "what": p.what} for p in r.problems]}
            lines = [f"{path}: manifest failed verification:", *(f"  {p}" for p in r.problems)]
        results.append(res)
        if not args.json:
            print("\n".join(lines))
    if args.json:
        print(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results) else 1


def _verb(module: str):
    """The verb's `main(args)` in `module`, imported only when that verb runs (so `kern verify`
    and `kern --help` start fast)."""
    def fn(args: argparse.Namespace) -> int:
        from importlib import import_module

        return import_module(module).main(args)

    return fn


def _whole(lowest: int):
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


def _non_negative_real(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return x


def _text(text: str) -> str:
    """Text that is valid UTF-8 (argv bytes that are not arrive as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text (a stray byte at character {exc.start})") from None
    return text


_positive = _whole(1)
_non_negative = _whole(0)  # seed 0 is a seed like any other; a negative one is refused, not wrapped


def _memory(text: str) -> int:
    """A byte count: a whole number of MiB, or with a unit: 512M, 2G."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = units.get(t[-1:], None)
    try:
        n = float(t[:-1] if scale else t) * (scale or 1 << 20)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 512M or 2G, got {text!r}") from None
    if n < 1 << 20:
        raise argparse.ArgumentTypeError(f"must be at least 1M, got {text!r}")
    return int(n)


def loop_options(p: argparse.ArgumentParser) -> None:
    """The host loop's options, shared by kern run and kern serve."""
    p.add_argument("--context", type=_positive, default=None,
                   help="positions a sequence may reach (default: the model's own, where --memory holds it)")
    p.add_argument("--max-seqs", type=_positive, default=None,
                   help="sequences running at once (default: the manifest's decode bound)")
    p.add_argument("--memory", type=_memory, default=None,
                   help="state (KV cache) budget, e.g. 512M or 8G (default: 512M)")
    p.add_argument("--tp", type=_positive, default=1,
                   help="tensor-parallel ranks: the model split over N devices, one thread a rank (default 1)")
    p.add_argument("--ep", type=_positive, default=1,
                   help="expert-parallel ranks: a mixture of experts' experts split over N devices, one thread "
                        "a rank (default 1)")


def parser() -> argparse.ArgumentParser:
    from kern import __version__

    ap = argparse.ArgumentParser(prog="kern", description="An LLM inference engine: a model is a manifest.")
    ap.add_argument("--version", action="version", version=f"kern {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser("verify", help="check manifests (every problem, each naming its place)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="manifest.json or a folder holding one")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=_verify)

    p = sub.add_parser("run", help="generate text with a model (default: the embedded model)")
    p.add_argument("model", nargs="?", metavar="MODEL_DIR",
                   help="a deployment folder (manifest.json) or a Hugging Face checkpoint folder")
    p.add_argument("--manifest", help="manifest to use with a checkpoint folder")
    p.add_argument("--prompt", type=_text, default="What is the capital of France?")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=_positive, default=64)
    p.add_argument("--temperature", type=_non_negative_real, default=0.0, help="0 (the default) is greedy")
    p.add_argument("--seed", type=_non_negative, default=0, help="sampling seed, a whole number >= 0")
    p.add_argument("--target", choices=("cpu", "cuda"), default=None,
                   help="cpu or cuda (default: cuda when a GPU and the CUDA kernels are usable)")
    p.add_argument("--run-ahead", type=_positive, default=None,
                   help="greedy decode steps a host wait (default: 8 on CUDA, one graph launch for all "
                        "of them; 1 on the CPU)")
    p.add_argument("--mega", action="store_true",
                   help="decode with the one-kernel deployment: a step is one persistent cooperative launch "
                        "(CUDA sm_90a; docs/megakernel.md)")
    loop_options(p)
    p.set_defaults(fn=_verb("kern.run_cmd"))

    p = sub.add_parser("test", help="judge a candidate manifest against a reference, span by span")
    p.add_argument("--reference", required=True, metavar="A")
    p.add_argument("--candidate", required=True, metavar="B")
    p.add_argument("--weights", default=None, metavar="CHECKPOINT_DIR")
    p.add_argument("--seed", type=_non_negative, default=0, help="workload seed, a whole number >= 0")
    p.add_argument("--json", action="store_true")
    p.add_argument("--seqs", type=_positive, default=None, help="sequences in the workload (default 6)")
    p.add_argument("--decode-steps", type=_non_negative, default=None,
                   help="decode steps per sequence (default 10; 0 judges prefill only)")
    p.add_argument("--max-prompt", type=_positive, default=None, help="cap on prompt lengths (a smaller workload)")
    p.add_argument("--kl-limit", type=_non_negative_real, default=None,
                   help="KL(A||B) limit in nats (default 0.01; a larger measured floor raises it)")
    p.add_argument("--time-cap", type=_non_negative_real, default=None,
                   help="seconds after which thin evidence stops growing the workload (default 60; 0: never grow)")
    p.set_defaults(fn=_verb("kern.harness.cli"))

    p = sub.add_parser("bench", help="price every call of a manifest on a workload of real shapes")
    p.add_argument("manifest", metavar="MANIFEST", help="manifest.json or a folder holding one")
    p.add_argument("--workload", required=True, metavar="TOML", help="samples, seed and [[sweep]] shapes")
    p.add_argument("--weights", default=None, metavar="CHECKPOINT_DIR", help="default: the embedded model")
    p.add_argument("--isolate", action="store_true", help="also time each distinct call alone, cold and warm")
    p.add_argument("--compare", default=None, metavar="B", help="a second manifest, priced span by span")
    p.add_argument("--samples", type=_positive, default=None, help="override the workload's samples")
    p.add_argument("--memory", type=_memory, default=None,
                   help="state (KV cache) budget, e.g. 2G (default: what the workload's largest shape needs)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the results as JSON ('-': stdout)")
    p.add_argument("--chart", default=None, metavar="OUT", help="where the step's time goes (.png or .svg; "
                   "needs matplotlib)")
    p.set_defaults(fn=_verb("kern.bench.cli"))

    p = sub.add_parser("cut", help="slice a manifest into pipeline stages")
    p.add_argument("manifest", metavar="MANIFEST", help="manifest.json or a folder holding one")
    p.add_argument("--stages", type=_positive, required=True, metavar="N")
    p.add_argument("--out", default=None, metavar="DIR", help="default: <manifest folder>.stages<N>")
    p.add_argument("--times", default=None, metavar="BENCH_JSON",
                   help="balance by kern bench times instead of weight bytes")
    p.set_defaults(fn=_verb("kern.cut_cmd"))

    p = sub.add_parser("kernels", help="list a manifest's modules; --rebuild checks their sha256 from source")
    p.add_argument("manifest", metavar="MANIFEST", help="manifest.json or a folder holding one")
    p.add_argument("--rebuild", action="store_true", help="rebuild from source with the generator's build")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=_verb("kern.kernels_cmd"))

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with a chat page (default: the embedded model)")
    p.add_argument("model", nargs="?", metavar="MODEL_DIR",
                   help="a deployment folder (manifest.json) or a Hugging Face checkpoint folder")
    p.add_argument("--manifest", help="manifest to use with a checkpoint folder")
    p.add_argument("--target", default=None, help="cpu or cuda (default: cuda when a GPU is present)")
    loop_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write every served step's shape to FILE (JSON lines): a kern bench --workload")
    p.set_defaults(fn=_verb("kern.serve.command"))

    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`kern run ... | head -c 5`): stop quietly. Point
        # stdout at /dev/null so that the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
