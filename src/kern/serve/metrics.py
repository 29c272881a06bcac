"""Prometheus metrics of one server: its own registry (two servers in one process never clash)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Seconds: from a millisecond-scale step on a GPU to a loaded CPU's seconds.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("kern_requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("kern_prompt_tokens", "Prompt tokens of finished sequences", registry=r)
        self.output_tokens = Counter("kern_output_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("kern_time_to_first_token_seconds", "Arrival to the first generated token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("kern_inter_token_latency_seconds", "Time between a sequence's tokens",
                             buckets=ITL_BUCKETS, registry=r)
        self.waiting = Gauge("kern_queue_depth", "Sequences waiting for a lease", registry=r)
        self.running = Gauge("kern_running_sequences", "Sequences holding a lease", registry=r)
        self.hit_rate = Gauge("kern_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache, "
                              "over all prompt tokens so far", registry=r)
        self.pages_used = Gauge("kern_pool_pages_used", "Pool pages in use (leased or cached)", registry=r)
        self.pages_total = Gauge("kern_pool_pages_total", "Pool pages in all", registry=r)
        self.pool_use = Gauge("kern_pool_use", "Fraction of the pool's pages in use", registry=r)

    def observe_stats(self, s) -> None:
        """From a LoopStats (called on the engine thread after each step)."""
        self.waiting.set(s.waiting)
        self.running.set(s.running)
        self.hit_rate.set(s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0)
        self.pages_used.set(s.pool_pages_used)
        self.pages_total.set(s.pool_pages_total)
        self.pool_use.set(s.pool_pages_used / s.pool_pages_total if s.pool_pages_total else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
