"""kern serve: load a model (the embedded default without one), warm it up, serve it."""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial

from .args import host_memory, loop_options, model_arguments, port

HELP = "an OpenAI-compatible HTTP server with a chat page (default: the embedded model)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    model_arguments(p)
    p.add_argument("--target", choices=("cpu", "cuda"), default=None,
                   help="cpu or cuda (default: cuda when a GPU and the CUDA kernels are usable)")
    loop_options(p)
    p.add_argument("--host-memory", dest="host_bytes", type=host_memory, default=None, metavar="SIZE",
                   help="host memory idle conversations' cached prefixes park in when the state memory runs "
                        "short, to wake into their next turn without recomputing, e.g. 4G; 0: none, they are "
                        "dropped (default: twice the state memory, at most a quarter of this machine's; none "
                        "with --tp, --ep or --pp above 1)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=port, default=8000, help="TCP port to listen on (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write every served step's shape to FILE (JSON lines): a kern bench --workload")


def build_loop(model, manifest, target, context, max_seqs, state_budget, trace: str | None, tp: int = 1, ep: int = 1,
               batch_invariant: bool = True, host_bytes: int | None = None, weights: str | None = None,
               speculate: str | None = None, pp: int = 1, step_tokens: int | None = None):
    """In the engine process: load, then capture every decode graph (never inside a request);
    with `trace`, record the served steps to that file."""
    from ..api import load
    from ..runtime.target import pick_target

    model = load(model, manifest=manifest, weights=weights, target=pick_target(target, "serving"), context=context,
                 max_seqs=max_seqs, state_budget=state_budget, progress=True, tp=tp, ep=ep, pp=pp,
                 batch_invariant=batch_invariant, host_bytes=host_bytes, speculate=speculate, step_tokens=step_tokens)
    loop = model.loop  # decoding batches run ahead as kern run's (8 steps: docs/perf.md, 2026-12-01)
    t0 = time.monotonic()
    if loop.warm_up(progress=True):
        mem = model.engine.device.memory()
        free = f"; {mem[0] / 2**30:.1f} GiB of the device left free" if mem else ""
        print(f"[kern] decode graphs captured in {time.monotonic() - t0:.1f} s{free}", file=sys.stderr)
    if loop.tokenizer is not None and loop.reads_logits:
        # llguidance's view of the vocabulary, built now rather than by the first structured
        # request with every stream waiting (~0.6 s for 49k tokens)
        loop.grammars.prepare()
    if trace:  # after the warm-up: only served steps
        from ..bench.trace import record

        record(model.engine, trace)
    return loop


def main(args) -> int:
    from ..errors import KernError
    from ..serve.server import serve_forever
    from .say import failed

    if args.host_bytes and max(args.tp, args.ep, args.pp) > 1:  # one rank's pages cannot stand for the others'
        print("kern serve: --host-memory: a split or pipelined deployment (--tp, --ep or --pp above 1) has no "
              "host tier; leave it out or give 0", file=sys.stderr)
        return 1
    if args.pp > 1 and max(args.tp, args.ep) > 1:
        print(f"kern serve: --pp {args.pp} with --{'tp' if args.tp > 1 else 'ep'} {max(args.tp, args.ep)}: pipeline "
              "stages of a split deployment are not supported yet; give one of them", file=sys.stderr)
        return 1
    make_loop = partial(build_loop, args.model, args.manifest, args.target, args.context, args.max_seqs,
                        args.state_budget, args.trace, args.tp, args.ep, args.batch_invariant, args.host_bytes, args.weights,
                        args.speculate, args.pp, args.step_tokens)
    try:
        # the model id a request gives: the served name, or the path exactly as given here
        serve_forever(make_loop, host=args.host, port=args.port, api_key=args.api_key,
                      aliases=(args.model,) if args.model else ())
    except KernError as exc:  # a manifest that fails verification: its first problem, one line
        return failed("serve", exc)
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped; uvicorn has shut down cleanly
        print("[kern] stopped", file=sys.stderr)
    except SystemExit as exc:  # SIGTERM exits 0 (a socket that cannot bind is a KernError, before the load)
        return exc.code if isinstance(exc.code, int) else 1
    return 0
