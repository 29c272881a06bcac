"""kern serve: load a model (the embedded default without one), warm it up, serve it."""

from __future__ import annotations

import sys

from ..manifest.problems import ManifestError
from ..runtime.devices.cuda.errors import CudaUnavailable  # imports no CUDA
from ..runtime.errors import KernError


def main(args) -> int:
    from ..api import load
    from ..run_cmd import pick_target
    from .server import serve_forever

    def make_loop():
        """On the engine thread: load, then capture every decode graph (never inside a request)."""
        target = pick_target(args.target, "serving")
        model = load(args.model, manifest=args.manifest, target=target, context=args.context,
                     max_seqs=args.max_seqs, memory=args.memory, progress=True)
        loop = model.loop
        loop.warm_up(progress=True)
        if args.trace:  # after the warm-up: only served steps
            from ..bench.trace import record

            record(model.engine, args.trace)
        print(f"[kern] serving {loop.model_name} (context {loop.context}) on http://{args.host}:{args.port}"
              f" (chat page at /, API at /v1)", file=sys.stderr)
        return loop

    try:
        serve_forever(make_loop, host=args.host, port=args.port, api_key=args.api_key)
    except (KernError, ManifestError, CudaUnavailable) as exc:
        print(f"kern serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped; uvicorn has shut down cleanly
        print("[kern] stopped", file=sys.stderr)
    except SystemExit as exc:  # uvicorn exits when it cannot bind; it has said why
        return exc.code if isinstance(exc.code, int) else 1
    return 0
