"""One HTTP request in flight: its n sequences in the loop, their Deltas in an inbox a step at a time,
streamed as server-sent events or gathered into one body.

A client that goes away is noticed two ways, since either alone has proved unreliable under
Starlette: a watcher awaits the ASGI `http.disconnect` message, and a failed send or a
cancelled response task closes the generator. Both end in the same `finally`, which aborts
every sequence not yet finished (the engine process frees its lease before its next step)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from ..generation.outputs import Delta
from . import replies
from .driver import Accepted, Driver, Refused
from .metrics import Metrics
from .schemas import Job, RequestError
from .tools import CallIds, ToolStream


class _Gone:
    """The client disconnected."""


GONE = _Gone()


class ClientGone(Exception):
    pass


class Inbox:
    """A request's items as the driver hands them over, a step's list at a time; `take` returns
    everything that came since the last take (an asyncio.Queue costs more a put, and a stream
    that fell behind wants it all in one write anyway)."""

    def __init__(self):
        self.items: list = []
        self._waiter: asyncio.Future | None = None

    def put(self, items: list) -> None:
        self.items += items
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list:
        while not self.items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        items, self.items = self.items, []
        return items


class Flight:
    def __init__(self, driver: Driver, metrics: Metrics, job: Job, request_id: str, arrival: float):
        self.driver, self.metrics, self.job, self.arrival = driver, metrics, job, arrival
        self.ids = [f"{request_id}-{i}" for i in range(job.choices)]
        self.index = {rid: i for i, rid in enumerate(self.ids)}
        self.open = set(self.ids)  # sequences the loop may still be running
        self.inbox = Inbox()
        self._early: list[Delta] = []  # Deltas that came before every choice was accepted
        self._last_token: dict[str, float] = {}
        self._watcher: asyncio.Task | None = None
        self.gone = False  # the client disconnected

    async def start(self, receive) -> None:
        """Submit the n sequences and wait for the loop to accept them all; a refusal aborts the
        rest and raises RequestError. `receive`: the ASGI receive, watched for a disconnect."""
        sink = self.inbox.put
        for i, rid in enumerate(self.ids):
            self.driver.submit(rid, self.job.choice_prompt(i), self.job.choice_params(i), sink)
        self._watcher = asyncio.create_task(self._watch(receive))
        pending, refused = set(self.ids), None
        try:
            while pending:
                for item in await self.inbox.take():
                    if isinstance(item, (Accepted, Refused)) and item.request_id in pending:
                        pending.discard(item.request_id)
                        if isinstance(item, Refused):
                            self.open.discard(item.request_id)
                            refused = refused or item
                    elif item is GONE:
                        raise ClientGone
                    else:  # Deltas, or an accepted sequence's Refused (the engine failed): batches() has them
                        self._early.append(item)
        except BaseException:
            self.close()
            raise
        if refused is not None:
            self.close()
            if refused.engine_failed:
                raise RequestError(refused.message, status=503, kind="server_error", code=refused.code)
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
        self.inbox.put([GONE])

    def close(self) -> None:
        """Abort what is still running and stop watching (idempotent)."""
        for rid in self.open:
            self.driver.abort(rid)
        self.open.clear()
        if self._watcher is not None:
            self._watcher.cancel()

    async def batches(self) -> AsyncIterator[list[tuple[int, Delta]]]:
        """(choice index, Delta) pairs, a step's worth at a time (several steps' when the
        consumer fell behind: one write catches up), until every choice has finished."""
        items, self._early = self._early, []
        while self.open:
            items = items or await self.inbox.take()
            batch = []
            for item in items:
                if type(item) is Delta:
                    if item.finish_reason is not None:
                        self.open.discard(item.request_id)
                    batch.append((self.index[item.request_id], item))
                elif item is GONE:
                    raise ClientGone
                elif isinstance(item, Refused):
                    raise RequestError(item.message, status=503, kind="server_error", code=item.code)
            items = []
            self._observe(batch)
            yield batch
        if self.gone:
            raise ClientGone

    def _observe(self, batch: list[tuple[int, Delta]]) -> None:
        m, now, made = self.metrics, time.perf_counter(), 0
        for _, d in batch:
            if d.token_ids:
                made += len(d.token_ids)
                last = self._last_token.get(d.request_id)
                if last is None:
                    m.ttft.observe(now - self.arrival)
                else:
                    m.itl.observe(now - last)
                self._last_token[d.request_id] = now
            if d.finish_reason is not None:
                m.prompt_tokens.inc(d.prompt_tokens)
        if made:
            m.output_tokens.inc(made)


async def gather(flight: Flight, head: replies.Head, decode) -> dict:
    """The whole response body of a stream=false request."""
    choices = [replies.Choice() for _ in flight.ids]
    try:
        async for batch in flight.batches():
            for i, d in batch:
                choices[i].add(d)
    finally:
        flight.close()
    job = flight.job
    return replies.body(head, choices, decode, job.logprobs, job.n, job.echo, job.tools)


async def stream(flight: Flight, head: replies.Head, decode) -> AsyncIterator[bytes]:
    """Server-sent events, one write a step: a role chunk per choice (chat), text chunks with
    finish_reason null, each choice's last chunk with its finish_reason, the usage chunk when
    asked, [DONE]."""
    job = flight.job
    choices = [replies.Choice() for _ in flight.ids]
    offsets = [0] * len(choices)
    usage = job.include_usage
    text_chunk = replies.TextChunks(head, usage)
    calls = [ToolStream(job.tools, CallIds(head.id, i)) for i in range(len(choices))] if job.tools else None
    tail = []
    try:
        if head.chat:
            yield b"".join(replies.sse(replies.chunk(head, i, role=True, text="", with_usage=usage))
                           for i in range(job.choices))
        elif job.echo:  # each choice's text starts with its prompt's
            yield b"".join(text_chunk(i, job.echo[i // job.n]) for i in range(job.choices))
        async for batch in flight.batches():
            out = []
            for i, d in batch:
                if calls is not None:
                    out += _tool_chunks(head, i, d, calls[i], job, decode, usage)
                    if d.finish_reason is not None:
                        choices[i].add(d)
                    continue
                if d.text or d.logprobs:
                    if job.logprobs:
                        lp = (replies.chat_logprobs(decode, d.logprobs) if head.chat
                              else replies.completion_logprobs(decode, d.logprobs, offsets[i]))
                        out.append(replies.sse(replies.chunk(head, i, text=d.text, logprobs=lp, with_usage=usage)))
                    else:
                        out.append(text_chunk(i, d.text))
                    offsets[i] += len(d.text)
                if d.finish_reason is not None:
                    choices[i].add(d)
                    out.append(replies.sse(replies.chunk(head, i, finish=d.finish_reason,
                                                         text=None if head.chat else "", with_usage=usage)))
            if out:
                yield b"".join(out)
        if usage:
            tail.append(replies.sse(replies.usage_chunk(head, choices, job.n)))
    except ClientGone:
        return
    except RequestError as e:
        tail.append(replies.sse(e.body()))
    finally:
        flight.close()
    yield b"".join([*tail, replies.DONE])


def _tool_chunks(head: replies.Head, i: int, d: Delta, calls: ToolStream, job: Job, decode, usage: bool) -> list[bytes]:
    """A chat choice's chunks under tools: content while the text cannot be a call, the calls as
    `tool_calls` deltas (a named function's arguments as they come, the others' whole at the
    end), the last chunk's finish_reason "tool_calls" where the model called."""
    text, deltas = calls.push(d.text)
    out, called = [], bool(deltas)
    lp = replies.chat_logprobs(decode, d.logprobs) if job.logprobs and d.logprobs else None
    if text or deltas or lp:
        out.append(replies.sse(replies.chunk(head, i, text=text or None, calls=deltas, logprobs=lp,
                                             with_usage=usage)))
    if d.finish_reason is not None:
        text, deltas = calls.finish()
        if text or deltas:
            out.append(replies.sse(replies.chunk(head, i, text=text or None, calls=deltas, with_usage=usage)))
        called = bool(deltas) or called
        finish = "tool_calls" if called and d.finish_reason == "stop" and job.tools.mode != "named" else d.finish_reason
        out.append(replies.sse(replies.chunk(head, i, finish=finish, with_usage=usage)))
    return out
