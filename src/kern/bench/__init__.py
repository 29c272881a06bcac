"""kern bench: workloads of real shapes, per-call attribution, isolate, compare, report."""
