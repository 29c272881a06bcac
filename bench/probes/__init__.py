"""One-off kernel probes, each run from the repository root as `python3 -m bench.probes.<name>`
(bench/README.md)."""
