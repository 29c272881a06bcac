"""Where a serving process spends its host time: `kern serve` under one cProfile per thread
(the engine thread that steps the loop, the event loop that speaks HTTP), stats written when
the server stops (SIGTERM).

    python bench/profile_serve.py OUT_DIR -- serve CKPT --target cuda --port 8100 ...

Drive it with bench/serve.py, then stop it; OUT_DIR gets one <thread>.txt each (top functions
by own time and by cumulative time). A profiler slows the threads it watches: read shares, not
absolute speeds."""

from __future__ import annotations

import cProfile
import io
import pstats
import signal
import sys
import threading
from pathlib import Path

PROFILES: dict[str, cProfile.Profile] = {}


def _start_in_thread(frame, event, arg):  # the first profile event of a new thread
    sys.setprofile(None)
    p = cProfile.Profile()
    PROFILES[threading.current_thread().name] = p
    p.enable()


def _dump(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, p in list(PROFILES.items()):
        p.disable()
        buf = io.StringIO()
        st = pstats.Stats(p, stream=buf)
        buf.write(f"== {name}: by own time\n")
        st.sort_stats("tottime").print_stats(30)
        buf.write(f"== {name}: by cumulative time\n")
        st.sort_stats("cumulative").print_stats(30)
        (out / f"{name.replace('/', '_')}.txt").write_text(buf.getvalue())


def main() -> int:
    out = Path(sys.argv[1])
    argv = sys.argv[sys.argv.index("--") + 1:]
    threading.setprofile(_start_in_thread)
    main_prof = cProfile.Profile()
    PROFILES["main"] = main_prof
    signal.signal(signal.SIGTERM, lambda *_: (_dump(out), sys.exit(0)))
    from kern.cli import main as kern_main

    main_prof.enable()
    try:
        return kern_main(argv)
    finally:
        _dump(out)


if __name__ == "__main__":
    sys.exit(main())
