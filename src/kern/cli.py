"""The kern command: verify | run | test | bench | cut | kernels | serve, one module each in
kern.commands (HELP, add_arguments(parser), main(args) -> exit code). A command module imports
only the standard library and its flag types at the top, the rest inside main, so `kern
verify` and `kern --help` start fast."""

from __future__ import annotations

import argparse
import os
import sys
from importlib import import_module

COMMANDS = ("verify", "run", "test", "bench", "cut", "kernels", "serve")


def parser() -> argparse.ArgumentParser:
    from kern import __version__

    ap = argparse.ArgumentParser(prog="kern", description="An LLM inference engine: a model is a manifest.")
    ap.add_argument("--version", action="version", version=f"kern {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name in COMMANDS:
        command = import_module(f"kern.commands.{name}")
        p = sub.add_parser(name, help=command.HELP)
        command.add_arguments(p)
        p.set_defaults(fn=command.main)
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
