"""One HTTP request in flight: its n sequences in the loop, their Deltas on an asyncio queue,
streamed as server-sent events or gathered into one body.

A client that goes away is noticed two ways, since either alone has proved unreliable under
Starlette: a watcher awaits the ASGI `http.disconnect` message, and a failed send or a
cancelled response task closes the generator. Both end in the same `finally`, which aborts
every sequence not yet finished (the engine thread frees its lease before the next step)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from ..generation.outputs import Delta
from . import replies
from .driver import Accepted, Driver, Refused, Sink
from .metrics import Metrics
from .schemas import Job, RequestError


class _Gone:
    """The client disconnected."""


GONE = _Gone()


class ClientGone(Exception):
    pass


class Flight:
    def __init__(self, driver: Driver, metrics: Metrics, job: Job, request_id: str, arrival: float):
        self.driver, self.metrics, self.job, self.arrival = driver, metrics, job, arrival
        self.ids = [f"{request_id}-{i}" for i in range(job.n)]
        self.index = {rid: i for i, rid in enumerate(self.ids)}
        self.open = set(self.ids)  # sequences the loop may still be running
        self.queue: asyncio.Queue = asyncio.Queue()
        self._early: list[Delta] = []  # Deltas that came before every choice was accepted
        self._last_token: dict[str, float] = {}
        self._watcher: asyncio.Task | None = None
        self.gone = False  # the client disconnected

    async def start(self, receive) -> None:
        """Submit the n sequences and wait for the loop to accept them all; a refusal aborts the
        rest and raises RequestError. `receive`: the ASGI receive, watched for a disconnect."""
        sink = Sink(asyncio.get_running_loop(), self.queue.put_nowait)
        for i, rid in enumerate(self.ids):
            self.driver.submit(rid, self.job.prompt_ids, self.job.choice_params(i), sink)
        self._watcher = asyncio.create_task(self._watch(receive))
        pending, refused = len(self.ids), None
        try:
            while pending:
                item = await self.queue.get()
                if isinstance(item, (Accepted, Refused)):
                    pending -= 1
                    if isinstance(item, Refused):
                        self.open.discard(item.request_id)
                        refused = refused or item
                elif item is GONE:
                    raise ClientGone
                else:
                    self._early.append(item)
        except BaseException:
            self.close()
            raise
        if refused is not None:
            self.close()
            if refused.engine_failed:
                raise RequestError(refused.message, status=503, kind="server_error", code="engine_failed")
            raise RequestError(refused.message, param="messages" if self.job.chat else "prompt",
                               code="cannot_run")

    async def _watch(self, receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        # Abort here rather than in the consumer: a streamed response whose headers never went
        # out never starts its generator, so no `finally` of it would run.
        for rid in self.open:
            self.driver.abort(rid)
        self.open.clear()
        self.gone = True
        self.queue.put_nowait(GONE)

    def close(self) -> None:
        """Abort what is still running and stop watching (idempotent)."""
        for rid in self.open:
            self.driver.abort(rid)
        self.open.clear()
        if self._watcher is not None:
            self._watcher.cancel()

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        """(choice index, Delta) until every choice has finished."""
        pending = list(self._early)
        self._early.clear()
        while self.open:
            item = pending.pop(0) if pending else await self.queue.get()
            if item is GONE:
                raise ClientGone
            if isinstance(item, Refused):
                raise RequestError(item.message, status=503, kind="server_error", code="engine_failed")
            if not isinstance(item, Delta):
                continue
            self._observe(item)
            if item.finish_reason is not None:
                self.open.discard(item.request_id)
            yield self.index[item.request_id], item
        if self.gone:
            raise ClientGone

    def _observe(self, d: Delta) -> None:
        m = self.metrics
        if d.token_ids:
            now = time.perf_counter()
            last = self._last_token.get(d.request_id)
            if last is None:
                m.ttft.observe(now - self.arrival)
            else:
                m.itl.observe(now - last)
            self._last_token[d.request_id] = now
            m.output_tokens.inc(len(d.token_ids))
        if d.finish_reason is not None:
            m.prompt_tokens.inc(d.prompt_tokens)


async def gather(flight: Flight, head: replies.Head, decode) -> dict:
    """The whole response body of a stream=false request."""
    choices = [replies.Choice() for _ in flight.ids]
    try:
        async for i, d in flight.deltas():
            choices[i].add(d)
    finally:
        flight.close()
    return replies.body(head, choices, decode, flight.job.logprobs)


async def stream(flight: Flight, head: replies.Head, decode) -> AsyncIterator[bytes]:
    """Server-sent events: a role chunk per choice (chat), text chunks with finish_reason null,
    each choice's last chunk with its finish_reason, the usage chunk when asked, [DONE]."""
    job = flight.job
    choices = [replies.Choice() for _ in flight.ids]
    offsets = [0] * len(choices)
    usage = job.include_usage
    try:
        if head.chat:
            for i in range(job.n):
                yield replies.sse(replies.chunk(head, i, role=True, text="", with_usage=usage))
        async for i, d in flight.deltas():
            choices[i].add(d)
            if d.text or d.logprobs:
                lp = None
                if job.logprobs:
                    lp = (replies.chat_logprobs(decode, d.logprobs) if head.chat
                          else replies.completion_logprobs(decode, d.logprobs, offsets[i]))
                offsets[i] += len(d.text)
                yield replies.sse(replies.chunk(head, i, text=d.text, logprobs=lp, with_usage=usage))
            if d.finish_reason is not None:
                yield replies.sse(replies.chunk(head, i, finish=d.finish_reason, text=None if head.chat else "",
                                                with_usage=usage))
        if usage:
            yield replies.sse(replies.usage_chunk(head, choices))
    except ClientGone:
        return
    except RequestError as e:
        yield replies.sse(e.body())
    finally:
        flight.close()
    yield replies.DONE
