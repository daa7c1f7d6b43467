"""An OpenAI-compatible HTTP server over one model (`pyllm serve`).

    POST /v1/completions, /v1/chat/completions   (stream: true -> server-sent events ending in [DONE])
    GET  /v1/models, /health, /metrics           (metrics in the Prometheus text format)
    POST /v1/embeddings                          (pooled as the model file declares, normalized)
    POST /tokenize, /detokenize                  (llama-server's shapes)

Both completion endpoints take OpenAI's `response_format` (text, json_object, json_schema) and llama-server's
`grammar` (GBNF text): the output is then constrained to it, streamed or not. Chat completions take `tools` and
`tool_choice` (pyllm.tools): calls come back as `message.tool_calls`, and the history may hold them and the
`role: "tool"` results.

Requests run on the Llama's engine: up to --parallel sequences decode together in one batch, the
rest queue (and beyond the queue get 503). Answers do not depend on what else is running.

The event loop only moves bytes: a request's body (at most `max_body_bytes`, else 413) is parsed,
checked, tokenized and its chat template rendered in a worker thread, so a large or hostile request
never stalls the other clients or /health. Every bad request gets a 4xx with an OpenAI-style JSON
error naming the field, and nothing a request does gets a plain-text 500:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

Without an API key, requests must name this machine in their Host header (an IP address, localhost, or
one of `allowed_hosts`) and browsers' cross-origin requests are refused, so a web page cannot drive
the server through DNS rebinding or a form post.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import params as check
from ..llama import CompletionStream, Llama
from ..params import ParamError
from .engine import EngineClosedError, EngineFailedError, QueueFullError, RequestFailedError
from .metrics import Metrics

_Body = TypeVar("_Body", bound=BaseModel)
log = logging.getLogger("pyllm.server")

DEFAULT_MAX_BODY_BYTES = 8 << 20
SWITCH_INTERVAL_SECONDS = 0.0005
HEADER_SECONDS = 10.0  # a client's time to send a request's headers (slow-header clients hold a socket each)
BODY_SECONDS = 60.0    # and its body


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def _error_body(message: str, kind: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error_response(status: int, message: str, code: str | None, kind: str = "invalid_request_error",
                    param: str | None = None) -> JSONResponse:
    return JSONResponse(_error_body(message, kind, param, code), status_code=status)


# ---- request bodies: their JSON types, strictly (no "10" for 10, no true for 1.0); values are checked by Llama


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _Sampling(_Strict):
    """The fields both endpoints take. Unset ones get the Python API's defaults (llama.cpp's, where OpenAI's
    differ)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    n: int = 1
    user: str | None = None
    # constrained output: checked by the same layer as the Python API's (params.constraint)
    response_format: dict[str, Any] | None = None
    grammar: str | None = None  # llama-server's field: GBNF text
    # tool calls, on chat completions only (checked by pyllm.tools), in the tools or the older functions API
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None

    def sampling_kwargs(self) -> dict[str, Any]:
        names = ("temperature", "top_p", "top_k", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
                 "frequency_penalty", "logit_bias", "seed", "stop", "n")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def refuse_unsupported(self, chat: bool) -> None:
        if not chat and self.tools:
            raise APIError(400, "tools: tool calls are for /v1/chat/completions", "tools")
        if not chat and self.tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice: tool calls are for /v1/chat/completions", "tool_choice")
        if not chat and (self.functions or self.function_call is not None):
            raise APIError(400, "functions: function calls are for /v1/chat/completions",
                           "functions" if self.functions else "function_call")


class CompletionBody(_Sampling):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: None = None


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    function_call: FunctionCall | None = None  # the older API's: an assistant's earlier call
    tool_call_id: str | None = None           # which call a tool message answers
    name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The message as the chat template takes it: parts joined, the developer role as system."""
        content = self.content if isinstance(self.content, str) or self.content is None \
            else "".join(part.text for part in self.content)
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.function_call is not None:
            out["function_call"] = self.function_call.model_dump()
        for key in ("tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class ChatBody(_Sampling):
    messages: list[Message]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None


class TokenizeBody(_Strict):
    content: str
    add_special: bool = False
    parse_special: bool = True


class DetokenizeBody(_Strict):
    tokens: list[int]


class EmbeddingBody(_Strict):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


def parse(raw: bytes, model: type[_Body]) -> _Body:
    """The JSON body as `model` (whatever the Content-Type says, as llama-server does), or a 400 naming the field."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise APIError(400, "the body is not valid JSON: it nests too deeply") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object, not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise APIError(400, f"{param}: {first['msg']}" if param else first["msg"], param) from None
    except RecursionError:
        raise APIError(400, "the body nests too deeply") from None


# ---- the gate: what every request passes before the app ---------------------------------------------------


def _host_name(host: str) -> str:
    """The name of a `host[:port]` or `[ipv6][:port]`, lower case, without a trailing dot."""
    name = host.rsplit("]", 1)[0].lstrip("[") if host.startswith("[") else host.rsplit(":", 1)[0]
    return name.lower().rstrip(".")


def _names_this_machine(name: str, allowed: frozenset[str]) -> bool:
    return name in allowed or name == "localhost" or name.endswith(".localhost")


def _host_allowed(host: str, allowed: frozenset[str]) -> bool:
    """Whether a Host header (or an Origin's host) names this machine: an IP literal, localhost, or an allowed
    name. A name that resolves here only through someone's DNS is what a rebinding attack uses."""
    if "*" in allowed:
        return True
    name = _host_name(host)
    if _names_this_machine(name, allowed):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _origin_allowed(origin: str, host: str, allowed: frozenset[str]) -> bool:
    """Whether a browser's Origin may drive the server: the server's own origin, a page on this machine's loopback
    (a local app), or an allowed name; not any page on the web (whose requests to 127.0.0.1 pass the Host check)."""
    origin_host = origin.split("://", 1)[-1]
    if origin_host == host or "*" in allowed:
        return True
    name = _host_name(origin_host)
    if _names_this_machine(name, allowed):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class _Gate:
    """ASGI middleware, in this order: the API key (every path but /health), or without one the Host and Origin
    checks; the body size limit (the body read here, at most max_body_bytes, then replayed to the app); a log
    line per request; the count of answers by status. Plain ASGI, not an @app.middleware function: Starlette runs
    those through a task and a stream of their own that every chunk of a streamed answer then crosses."""

    def __init__(self, app, api_key: str | None, metrics: Metrics, max_body_bytes: int,
                 allowed_hosts: frozenset[str]) -> None:
        self.app, self.metrics, self.max_body_bytes, self.allowed_hosts = app, metrics, max_body_bytes, allowed_hosts
        self.authorization = None if api_key is None else f"Bearer {api_key}".encode()

    def _refusal(self, scope) -> JSONResponse | None:
        headers = dict(scope["headers"])
        if self.authorization is not None:
            if scope["path"] != "/health" and headers.get(b"authorization", b"") != self.authorization:
                return _error_response(401, "Invalid or missing API key: send 'Authorization: Bearer KEY'",
                                       "invalid_api_key")
            return None
        host = headers.get(b"host", b"").decode("latin-1")
        if host and not _host_allowed(host, self.allowed_hosts):
            return _error_response(403, f"the Host header {host!r} does not name this server; without an API key "
                                        "only its addresses and localhost are answered (see --allowed-hosts)",
                                   "forbidden_host")
        origin = headers.get(b"origin", b"").decode("latin-1")
        if origin and not _origin_allowed(origin, host, self.allowed_hosts):
            return _error_response(403, f"cross-origin requests from {origin!r} are refused without an API key",
                                   "forbidden_origin")
        return None

    async def _read_body(self, receive) -> bytes | None:
        """The whole body, or None once it passes the limit (TimeoutError after BODY_SECONDS)."""
        async with asyncio.timeout(BODY_SECONDS):
            return await self._read_body_parts(receive)

    async def _read_body_parts(self, receive) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(chunks)
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                return None
            chunks.append(body)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets if the app fails before answering
        info: dict[str, Any] = {}
        scope["pyllm"] = info  # the handlers leave the engine's request here, for the log line

        async def counting_send(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is None:
                length = dict(scope["headers"]).get(b"content-length", b"0")
                try:
                    body = None if not length.isdigit() or int(length) > self.max_body_bytes else \
                        await self._read_body(receive)
                except TimeoutError:
                    refusal = _error_response(408, f"the request body did not arrive within {BODY_SECONDS:g} s",
                                              "request_timeout")
                if refusal is None and body is None:
                    refusal = _error_response(413, f"the request body is larger than {self.max_body_bytes} bytes "
                                                   "(see --max-body)", "request_too_large")
            if refusal is not None:
                await refusal(scope, receive, counting_send)
                return
            await self.app(scope, _replay(body, receive), counting_send)
        finally:
            self.metrics.http_requests.inc(label=str(status))
            _log_request(scope, status, info, time.perf_counter() - started)


def _replay(body: bytes, receive):
    """A receive that gives the app the body already read, then what the client sends next (its disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed


def _log_request(scope, status: int, info: dict[str, Any], seconds: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    line = f"{scope['method']} {scope['path']} {status}"
    request, timings = info.get("request"), info.get("timings")
    if request is not None:
        line += f" prompt={len(request.prompt)} cached={request.n_cached} generated={request.n_generated}"
        if request.first_token_at is not None:
            line += f" ttft={1e3 * (request.first_token_at - request.submitted_at):.0f}ms"
    elif timings is not None:
        line += (f" prompt={timings['prompt_n'] + timings['cache_n']} cached={timings['cache_n']} "
                 f"generated={timings['predicted_n']} ttft={timings['prompt_ms']:.0f}ms")
    log.info("%s %.0fms", line, 1e3 * seconds)


def header_timeout_protocol(seconds: float = HEADER_SECONDS) -> type:
    """uvicorn's httptools protocol, except that a connection is closed when a request's headers have not all
    arrived `seconds` after the connection opened or the request's first byte (uvicorn has no such limit: a client
    sending a header byte a minute would hold its socket for ever). Passed to uvicorn.Config(http=...)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_timer()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_header_timer()

        def on_headers_complete(self) -> None:
            self._disarm_header_timer()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(seconds, self._headers_too_slow)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol


def shutdown_ending_requests(server, engine, then: Callable[[], None] | None = None) -> None:
    """Make a uvicorn.Server end the engine's requests when it shuts down (SIGTERM, Ctrl-C), before it waits for
    the open connections: each running or waiting request then ends at once (a 503, or an error event in its
    stream) rather than holding the shutdown until the graceful timeout cancels it mid-answer. `then` runs once
    the engine has stopped (uvicorn raises the signal again when it returns, so code after server.run may not)."""
    shutdown = server.shutdown

    async def shutdown_after_the_engine(sockets=None) -> None:
        await asyncio.to_thread(engine.close)
        if then is not None:
            await asyncio.to_thread(then)
        await shutdown(sockets)

    server.shutdown = shutdown_after_the_engine


# ---- the app ------------------------------------------------------------------------------------------


class _Handlers:
    """The endpoints of one app: each parses, checks and starts its request in a worker thread (`run`), the
    event loop only passing bytes."""

    def __init__(self, llm: Llama, model_name: str, other_names: tuple[str, ...]) -> None:
        self.llm, self.model_name, self.names = llm, model_name, (model_name, "default", *other_names)
        self.engine = llm.engine
        self.started = int(time.time())

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.names:
            raise APIError(404, f"the model {name!r} does not exist; this server has {self.model_name!r}", "model",
                           "model_not_found")

    async def run(self, request: Request, call: Callable[[bytes], Any]) -> Any:
        """call(body) in a worker thread, the engine's and the API's refusals as HTTP errors."""
        raw = await request.body()
        try:
            return await run_in_threadpool(call, raw)
        except ParamError as exc:
            raise APIError(400, str(exc), exc.param, exc.code) from None
        except QueueFullError as exc:
            raise APIError(503, f"server busy: {exc}", None, "server_busy", "server_error") from None
        except EngineFailedError as exc:
            raise APIError(503, str(exc), None, "engine_failed", "server_error") from None
        except EngineClosedError as exc:
            raise APIError(503, str(exc), None, "shutting_down", "server_error") from None
        except RequestFailedError as exc:
            raise APIError(500, str(exc), None, "request_failed", "server_error") from None

    @staticmethod
    def respond(request: Request, result: dict[str, Any] | CompletionStream, include_usage: bool) -> Response:
        if isinstance(result, dict):
            request.scope["pyllm"]["timings"] = result.get("timings")
            return JSONResponse(result)
        request.scope["pyllm"]["request"] = result.request
        return _EventStream(result, include_usage)

    def start_completion(self, raw: bytes) -> tuple[dict[str, Any] | CompletionStream, bool]:
        body = parse(raw, CompletionBody)
        self.check_model(body.model)
        body.refuse_unsupported(chat=False)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "prompt: one prompt per request (a string, or a list of one string)", "prompt")
            prompt = prompt[0]
        result = self.llm.create_completion(prompt, max_tokens=body.max_tokens, logprobs=body.logprobs,
                                            echo=body.echo, stream=body.stream, model=self.model_name,
                                            context_shift=False, grammar=check.constraint(body.grammar,
                                                                                          body.response_format),
                                            **body.sampling_kwargs())
        return result, bool((body.stream_options or {}).get("include_usage"))

    def start_chat(self, raw: bytes) -> tuple[dict[str, Any] | CompletionStream, bool]:
        body = parse(raw, ChatBody)
        self.check_model(body.model)
        body.refuse_unsupported(chat=True)
        if not body.messages:
            raise APIError(400, "messages: give at least one message", "messages")
        result = self.llm.create_chat_completion(
            [m.as_dict() for m in body.messages], max_tokens=body.max_completion_tokens or body.max_tokens,
            stream=body.stream, logprobs=body.logprobs, top_logprobs=body.top_logprobs, model=self.model_name,
            context_shift=False, response_format=body.response_format, grammar=body.grammar, tools=body.tools,
            tool_choice=body.tool_choice, functions=body.functions, function_call=body.function_call,
            **body.sampling_kwargs())
        return result, bool((body.stream_options or {}).get("include_usage"))

    def embeddings(self, raw: bytes) -> dict[str, Any]:
        body = parse(raw, EmbeddingBody)
        self.check_model(body.model)
        if body.dimensions is not None:
            raise APIError(400, "dimensions: this model's embeddings have one size; leave dimensions out", "dimensions")
        result = self.llm.create_embedding(body.input, model=self.model_name)
        if body.encoding_format == "base64":  # OpenAI's: the float32 values' little-endian bytes
            for item in result["data"]:
                item["embedding"] = base64.b64encode(np.asarray(item["embedding"], "<f4").tobytes()).decode()
        return result

    def tokenize(self, raw: bytes) -> dict[str, Any]:
        body = parse(raw, TokenizeBody)
        content = check.utf8("content", body.content)
        return {"tokens": self.llm.tokenize(content, add_bos=body.add_special, special=body.parse_special)}

    def detokenize(self, raw: bytes) -> dict[str, Any]:
        body = parse(raw, DetokenizeBody)
        return {"content": self.llm.detokenize(body.tokens).decode("utf-8", "replace")}

    # ---- the routes ----

    async def completions(self, request: Request) -> Response:
        return self.respond(request, *await self.run(request, self.start_completion))

    async def chat_completions(self, request: Request) -> Response:
        return self.respond(request, *await self.run(request, self.start_chat))

    async def embeddings_route(self, request: Request) -> dict[str, Any]:
        return await self.run(request, self.embeddings)

    async def tokenize_route(self, request: Request) -> dict[str, Any]:
        return await self.run(request, self.tokenize)

    async def detokenize_route(self, request: Request) -> dict[str, Any]:
        return await self.run(request, self.detokenize)

    async def models(self) -> dict[str, Any]:
        llm = self.llm
        meta = {"n_ctx": llm.n_ctx(), "n_vocab": llm.n_vocab(), "n_parallel": llm.n_parallel,
                "architecture": llm.metadata.get("general.architecture")}
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.started,
                                            "owned_by": "pyllm", "meta": meta}]}

    async def health(self) -> Response:
        engine = self.engine
        if not engine.healthy:
            reason = str(engine.error) if engine.error is not None else "the engine is shut down"
            return JSONResponse({"status": "error", "error": reason}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(self) -> Response:
        return PlainTextResponse(self.engine.metrics.render(), media_type="text/plain; version=0.0.4")


async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    return _error_response(exc.status, exc.message, exc.code, exc.kind, exc.param)


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return _error_response(exc.status_code, str(exc.detail), None)


async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error")
    return _error_response(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error", "server_error")


def create_app(llm: Llama, *, model_name: str, api_key: str | None = None, other_names: tuple[str, ...] = (),
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, allowed_hosts: tuple[str, ...] = ()) -> FastAPI:
    """The server's ASGI app over `llm` (whose engine sets the parallelism), answering to `model_name` (the id
    /v1/models lists and responses carry), "default" and `other_names` (e.g. the catalogue name it was started by).
    Bodies over max_body_bytes get 413; allowed_hosts: Host names answered without an API key besides this
    machine's addresses and localhost ("*": any)."""
    app = FastAPI(title="pyllm", docs_url=None, redoc_url=None, openapi_url=None)
    # The event loop waits for the GIL while a worker thread tokenizes a large body; at Python's default 5 ms per
    # hand-over a request that needs several (a /health probe) took 20-200 ms on a busy machine.
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    handlers = _Handlers(llm, model_name, other_names)
    app.add_middleware(_Gate, api_key=api_key, metrics=handlers.engine.metrics, max_body_bytes=max_body_bytes,
                       allowed_hosts=frozenset(h.lower() for h in allowed_hosts))
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.post("/v1/completions")(handlers.completions)
    app.post("/v1/chat/completions")(handlers.chat_completions)
    app.post("/v1/embeddings")(handlers.embeddings_route)
    app.post("/embeddings")(handlers.embeddings_route)
    app.post("/tokenize")(handlers.tokenize_route)
    app.post("/detokenize")(handlers.detokenize_route)
    app.get("/v1/models")(handlers.models)
    app.get("/health")(handlers.health)
    app.get("/metrics")(handlers.metrics)
    return app


class _EventStream(Response):
    """A streamed completion as server-sent events: a chunk each, the usage chunk if asked, then [DONE].

    Sent by hand rather than through StreamingResponse: a token's chunks go from the stream to the ASGI `send`
    in one call, with no async generator and no task group between them (what the event loop spends a token
    comes out of the two cores the model runs on). The event loop takes the chunks as they are ready
    (stream.poll), woken by the engine's thread after each of the request's events (Request.on_event): no
    thread of its own and no worker-thread call a token. However the response ends (finished, or the client
    gone: its disconnect arrives through `receive`) the generation is cancelled: the engine frees the sequence
    at its next step."""

    def __init__(self, stream: CompletionStream, include_usage: bool) -> None:
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                            (b"x-accel-buffering", b"no")]
        self.stream, self.include_usage = stream, include_usage

    async def __call__(self, scope, receive, send) -> None:
        stream = self.stream
        loop = asyncio.get_running_loop()
        arrived = asyncio.Event()

        def wake() -> None:  # on the engine's thread
            try:
                loop.call_soon_threadsafe(arrived.set)
            except RuntimeError:  # the loop has closed (the server stopped): nobody is reading
                stream.cancel()

        async def watch_for_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            stream.cancel()  # the engine ends the request at its next step, and poll() then ends

        stream.set_listener(wake)
        watcher = loop.create_task(watch_for_disconnect())
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            last: dict[str, Any] | None = None
            while True:
                try:
                    chunks = stream.poll()
                except Exception as exc:  # noqa: BLE001 - reported in the stream; the status line is already sent
                    await self._send_events(send, [_error_body(str(exc), "server_error", None, None)])
                    break
                if chunks is None:
                    if self.include_usage and last is not None:
                        request = stream.request
                        n_prompt = len(request.prompt)  # once: the choices share it
                        n_generated = sum(r.n_generated for r in stream.requests)
                        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_generated,
                                 "total_tokens": n_prompt + n_generated,
                                 "prompt_tokens_details": {"cached_tokens": request.n_cached}}
                        await self._send_events(send, [{**last, "choices": [], "usage": usage}])
                    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
                    break
                if not chunks:
                    await arrived.wait()
                    arrived.clear()
                    continue
                last = chunks[-1]
                await self._send_events(send, chunks)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            stream.cancel()

    @staticmethod
    async def _send_events(send, chunks: list[dict[str, Any]]) -> None:
        body = "".join("data: " + json.dumps(chunk) + "\n\n" for chunk in chunks).encode()
        await send({"type": "http.response.body", "body": body, "more_body": True})
