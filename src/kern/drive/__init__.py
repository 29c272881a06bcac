"""Driving a program by hand, below the host loop, for kern test, kern bench, the benchmarks and
the tests: engine_io.py (run a call range of a program, read and write buffers and states by
name), script.py (a seeded script of prompts, chunked prefill and decode steps within a
manifest's Bounds), raw_pages.py (lease pages and step one sequence through a model) and
parity.py (logits compared: KL, decisive argmax agreement; teacher-forced logits)."""
