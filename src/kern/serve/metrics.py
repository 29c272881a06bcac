"""Prometheus metrics of one server: its own registry (two servers in one process never clash)."""

from __future__ import annotations

from bisect import bisect_left
from math import inf

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from ..generation.outputs import LoopStats

# Seconds: from a millisecond-scale step on a GPU to a loaded CPU's seconds.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class Histogram:
    """A Prometheus histogram observed once per generated token: a bisect and two additions
    (prometheus_client's takes a lock and walks the buckets in Python, several microseconds a
    token). Observed and collected on the event loop only, so it needs no lock."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry):
        self.name, self.documentation, self.bounds = name, documentation, list(buckets)
        self.counts = [0] * (len(buckets) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def collect(self):
        cumulative, total = [], 0
        for bound, n in zip([*self.bounds, inf], self.counts):
            total += n
            cumulative.append((floatToGoString(bound), total))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=cumulative, sum_value=self.sum)


class Total:
    """A Prometheus counter whose total the engine process keeps (set from each step's stats:
    the API process only shows it)."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry):
        self.name, self.documentation, self.value = name, documentation, 0
        registry.register(self)

    def collect(self):
        yield CounterMetricFamily(self.name, self.documentation, value=self.value)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("kern_requests", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("kern_prompt_tokens", "Prompt tokens of finished sequences", registry=r)
        self.output_tokens = Counter("kern_output_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("kern_time_to_first_token_seconds", "Arrival to the first generated token",
                              TTFT_BUCKETS, r)
        self.itl = Histogram("kern_inter_token_latency_seconds", "Time between a sequence's tokens", ITL_BUCKETS, r)
        self.waiting = Gauge("kern_queue_depth", "Sequences waiting for a lease", registry=r)
        self.running = Gauge("kern_running_sequences", "Sequences holding a lease", registry=r)
        self.hit_rate = Gauge("kern_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache, "
                              "over all prompt tokens so far", registry=r)
        self.pages_used = Gauge("kern_pool_pages_used", "Pool pages in use (leased or cached)", registry=r)
        self.pages_total = Gauge("kern_pool_pages_total", "Pool pages in all", registry=r)
        self.pool_use = Gauge("kern_pool_use", "Fraction of the pool's pages in use", registry=r)
        # every state's pages or slots, and the one budget of chunks they are drawn from
        self.units_held = Gauge("kern_pool_units_held", "Pages or slots of a state in use (leased or cached)",
                                ["state", "unit"], registry=r)
        self.units_cached = Gauge("kern_pool_units_cached", "Pages or slots of a state held only by cached "
                                  "prefixes (held less cached: what running sequences lease)", ["state", "unit"],
                                  registry=r)
        self.units_mapped = Gauge("kern_pool_units_mapped", "Pages or slots of a state its mapped chunks hold",
                                  ["state", "unit"], registry=r)
        self.chunks = Gauge("kern_pool_chunks", "Chunks of the one state budget mapped to each state "
                            "(state=\"unmapped\": to none)", ["state"], registry=r)
        self.spec_acceptance = Gauge("kern_speculative_acceptance_rate", "Proposed tokens kept by speculative "
                                     "rounds, over all proposed so far (0 without --speculate)", registry=r)
        self.spec_tokens = Gauge("kern_speculative_tokens_per_round", "Tokens a sequence's speculative round made, "
                                 "on average so far (plain decoding makes 1 a step)", registry=r)
        self.spec_rounds = Gauge("kern_speculative_rounds", "Sequences' speculative rounds so far", registry=r)
        self.chunks_total = Gauge("kern_pool_chunks_total", "Chunks in the one state budget every paged and "
                                  "per-sequence state draws on", registry=r)
        self.parked = Total("kern_host_parked_tokens", "Tokens of idle conversations' cached prefixes parked in "
                            "host memory to give device memory back (kern serve --host-memory)", r)
        self.woken = Total("kern_host_woken_tokens", "Prompt tokens woken from host memory into a request "
                           "instead of recomputed", r)

    def observe_stats(self, s: LoopStats) -> None:
        """From a LoopStats (called on the event loop after each step)."""
        self.waiting.set(s.waiting)
        self.running.set(s.running)
        self.hit_rate.set(s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0)
        self.pages_used.set(s.pool_pages_used)
        self.pages_total.set(s.pool_pages_total)
        self.pool_use.set(s.pool_pages_used / s.pool_pages_total if s.pool_pages_total else 0.0)
        for state, unit, held, mapped, chunks, cached in s.pool_states:
            self.units_held.labels(state, unit).set(held)
            self.units_cached.labels(state, unit).set(cached)
            self.units_mapped.labels(state, unit).set(mapped)
            self.chunks.labels(state).set(chunks)
        self.parked.value, self.woken.value = s.parked_tokens, s.woken_tokens
        self.spec_acceptance.set(s.spec_accepted / s.spec_proposed if s.spec_proposed else 0.0)
        self.spec_tokens.set(s.spec_tokens / s.spec_rounds if s.spec_rounds else 0.0)
        self.spec_rounds.set(s.spec_rounds)
        if s.pool_states:
            self.chunks.labels("unmapped").set(s.pool_chunks_free)
            self.chunks_total.set(s.pool_chunks)

    def render(self) -> bytes:
        return generate_latest(self.registry)
