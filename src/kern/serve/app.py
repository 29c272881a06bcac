"""The HTTP routes: OpenAI's /v1 API over the engine process, /health, /metrics and the chat page."""

from __future__ import annotations

import asyncio
import hmac
import itertools
import time
import uuid
from contextlib import asynccontextmanager
from functools import partial
from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from . import replies
from .driver import Driver
from .metrics import Metrics
from ..errors import KernError
from .schemas import RequestError, parse, parse_body
from .tokenize import detokenize, tokenize
from .sse import ClientGone, Flight, gather, stream

_STATUS_WORDS = {404: "no such route", 405: "method not allowed on this route"}


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _parse(raw: bytes, **kw):
    return parse(parse_body(raw), **kw)


def make_app(driver: Driver, tokenizer, *, model_name: str, context: int, vocab: int,
             api_key: str | None = None, metrics: Metrics | None = None, aliases: tuple[str, ...] = ()) -> FastAPI:
    """The app over a started Driver, which it reads on its event loop while it serves.
    `vocab`: token ids a prompt may hold. `aliases`: other names a request may give the model
    (the path as the server was started with it: vLLM's convention for the model id)."""
    metrics = metrics or Metrics()

    @asynccontextmanager
    async def lifespan(app):
        driver.attach(asyncio.get_running_loop())
        try:
            yield
        finally:
            driver.detach()

    app = FastAPI(title="kern", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    counter = itertools.count()
    created = int(time.time())  # /v1/models: when this server started serving the model
    page = files(__package__).joinpath("page", "index.html").read_text()
    decode_cache: dict[int, str] = {}

    def decode(t: int) -> str:
        s = decode_cache.get(t)
        if s is None:
            s = decode_cache[t] = tokenizer.decode([t])
        return s

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        words = _STATUS_WORDS.get(exc.status_code, "request refused")
        return _error(RequestError(f"{request.method} {request.url.path}: {words}", status=exc.status_code))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return _error(RequestError(f"internal error: {type(exc).__name__}", status=500, kind="server_error"))

    def _authorized(request: Request) -> bool:
        if api_key is None:
            return True
        got = request.headers.get("authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {api_key}".encode())

    async def _complete(request: Request, chat: bool) -> Response:
        endpoint = "chat" if chat else "completions"
        arrival = time.perf_counter()
        try:
            if not _authorized(request):
                raise RequestError("missing or wrong API key (send the header Authorization: Bearer <key>)",
                                   status=401, code="invalid_api_key")
            if driver.failure is not None:
                raise RequestError(driver.failure, status=503, kind="server_error", code="engine_failed")
            if driver.closing is not None:
                raise RequestError(driver.closing, status=503, kind="server_error", code="shutting_down")
            try:
                raw = await request.body()
            except ClientDisconnect:  # gone before its body arrived: nothing to answer
                raise ClientGone from None
            # parsing and tokenizing a long prompt takes a while: off the event loop, which keeps
            # answering /health and streaming the other requests meanwhile
            job = await asyncio.get_running_loop().run_in_executor(None, partial(
                _parse, raw, chat=chat, tokenizer=tokenizer, vocab=vocab, context=context, model_name=model_name,
                aliases=aliases))
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{next(counter)}-{uuid.uuid4().hex[:12]}"
            flight = Flight(driver, metrics, job, rid, arrival)
            await flight.start(request.receive)
            head = replies.Head(rid, int(time.time()), model_name, chat)
            if job.stream:
                metrics.requests.labels(endpoint, "200").inc()
                return StreamingResponse(stream(flight, head, decode), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            out = await gather(flight, head, decode)
        except RequestError as e:
            metrics.requests.labels(endpoint, str(e.status)).inc()
            return _error(e)
        except ClientGone:
            metrics.requests.labels(endpoint, "499").inc()
            return Response(status_code=499)
        metrics.requests.labels(endpoint, "200").inc()
        return JSONResponse(out)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _complete(request, True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _complete(request, False)

    async def _tokens(request: Request, fn) -> Response:
        """/tokenize and /detokenize: parsed and run off the event loop (a long text takes a while)."""
        try:
            if not _authorized(request):
                raise RequestError("missing or wrong API key (send the header Authorization: Bearer <key>)",
                                   status=401, code="invalid_api_key")
            body = parse_body(await request.body())
            out = await asyncio.get_running_loop().run_in_executor(None, partial(_tokenized, fn, body))
        except RequestError as e:
            return _error(e)
        return JSONResponse(out)

    def _tokenized(fn, body: dict) -> dict:
        kw = dict(tokenizer=tokenizer, vocab=vocab, model_name=model_name, aliases=aliases)
        try:
            return fn(body, context=context, **kw) if fn is tokenize else fn(body, **kw)
        except KernError as e:
            if isinstance(e, RequestError):
                raise
            raise RequestError(str(e), param="messages") from None

    def _tokens_route(fn):
        async def route(request: Request):
            return await _tokens(request, fn)
        return route

    for path, fn in (("/tokenize", tokenize), ("/detokenize", detokenize)):
        app.post(path)(_tokens_route(fn))

    @app.get("/v1/models")
    async def models(request: Request):
        if not _authorized(request):
            return _error(RequestError("missing or wrong API key", status=401, code="invalid_api_key"))
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "kern",
                                            "max_model_len": context}]}

    @app.get("/health")
    async def health():
        if driver.failure is not None:
            return JSONResponse({"status": "failed", "message": driver.failure}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/")
    async def chat_page():
        return HTMLResponse(page)

    return app
