"""An OpenAI-compatible HTTP server over one model (`pyllm serve`).

    POST /v1/completions, /v1/chat/completions   (stream: true -> server-sent events ending in [DONE])
    GET  /v1/models, /health, /metrics           (metrics in the Prometheus text format)
    POST /tokenize, /detokenize                  (llama-server's shapes)

Requests run on the Llama's engine: up to --parallel sequences decode together in one batch, the
rest queue (and beyond the queue get 503). Answers do not depend on what else is running. Every bad
request gets a 4xx with an OpenAI-style JSON error naming the field:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine import EngineClosedError, QueueFullError
from .llama import CompletionStream, Llama
from .metrics import Metrics
from .model import ContextFullError
from .sampling import SamplingError, SamplingParams

_Body = TypeVar("_Body", bound=BaseModel)


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def _error_body(message: str, kind: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# ---- request bodies ---------------------------------------------------------------------------------


_DEFAULTS = SamplingParams()


class _Sampling(BaseModel):
    """The sampling fields both endpoints take, with the Python API's defaults (llama.cpp's, where OpenAI's
    differ)."""
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float = _DEFAULTS.temperature
    top_p: float = _DEFAULTS.top_p
    top_k: int = _DEFAULTS.top_k
    min_p: float = _DEFAULTS.min_p
    typical_p: float = _DEFAULTS.typical_p
    repeat_penalty: float = _DEFAULTS.repeat_penalty
    presence_penalty: float = _DEFAULTS.presence_penalty
    frequency_penalty: float = _DEFAULTS.frequency_penalty
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    user: str | None = None


class CompletionBody(_Sampling):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: None = None


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None


class ChatBody(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class TokenizeBody(BaseModel):
    content: str
    add_special: bool = False
    parse_special: bool = True


class DetokenizeBody(BaseModel):
    tokens: list[int]


# ---- the app ------------------------------------------------------------------------------------------


async def parse(request: Request, model: type[_Body]) -> _Body:
    """The JSON body as `model` (whatever the Content-Type says, as llama-server does), or a 400 naming the field."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise APIError(400, f"the body must be a JSON object, not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise APIError(400, f"{param}: {first['msg']}" if param else first["msg"], param) from exc


class _Gate:
    """ASGI middleware: the API key check (every path but /health) and the count of answers by status. Plain
    ASGI, not an @app.middleware function: Starlette runs those through a task and a stream of their own that
    every chunk of a streamed answer then crosses, which cost the event loop more than the answer itself."""

    def __init__(self, app, api_key: str | None, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics
        self.authorization = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.authorization is not None and scope["path"] != "/health":
            given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
            if given != self.authorization:
                response = JSONResponse(_error_body("Invalid or missing API key: send 'Authorization: Bearer KEY'",
                                                    "invalid_request_error", None, "invalid_api_key"),
                                        status_code=401)
                self.metrics.http_requests.inc(label="401")
                await response(scope, receive, send)
                return
        status = 500  # what the client gets if the app fails before answering

        async def counting_send(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.http_requests.inc(label=str(status))


def create_app(llm: Llama, *, model_name: str, api_key: str | None = None,
               other_names: tuple[str, ...] = ()) -> FastAPI:
    """The server's ASGI app over `llm` (whose engine sets the parallelism), answering to `model_name` (the id
    /v1/models lists and responses carry), "default" and `other_names` (e.g. the catalogue name it was started by)."""
    app = FastAPI(title="pyllm", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = llm.engine.metrics
    started = int(time.time())
    app.add_middleware(_Gate, api_key=api_key, metrics=metrics)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(_error_body(exc.message, exc.kind, exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(_error_body(str(exc.detail), "invalid_request_error", None, None),
                            status_code=exc.status_code)

    def check_model(name: str | None) -> None:
        if name is not None and name not in (model_name, "default", *other_names):
            raise APIError(404, f"the model {name!r} does not exist; this server has {model_name!r}", "model",
                           "model_not_found")

    def budget(n_prompt: int, max_tokens: int | None, param: str) -> int:
        """The number of tokens to generate, checked against the context."""
        if n_prompt == 0:
            raise APIError(400, "the prompt is empty", param)
        if n_prompt >= llm.n_ctx:
            raise APIError(400, f"the prompt has {n_prompt} tokens; the context holds {llm.n_ctx}", param,
                           "context_length_exceeded")
        room = llm.n_ctx - n_prompt
        if max_tokens is None or max_tokens == 0:
            return room
        if max_tokens > room:
            raise APIError(400, f"max_tokens {max_tokens} + {n_prompt} prompt tokens exceed the context of "
                                f"{llm.n_ctx}", "max_tokens", "context_length_exceeded")
        return max_tokens

    def sampling_kwargs(body: _Sampling) -> dict[str, Any]:
        return {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k, "min_p": body.min_p,
                "typical_p": body.typical_p, "repeat_penalty": body.repeat_penalty,
                "presence_penalty": body.presence_penalty, "frequency_penalty": body.frequency_penalty,
                "logit_bias": body.logit_bias, "seed": body.seed, "stop": body.stop, "model": model_name}

    async def run(call) -> dict[str, Any] | CompletionStream:
        """Start a completion in a worker thread, turning the engine's refusals into HTTP errors."""
        try:
            return await run_in_threadpool(call)
        except QueueFullError as exc:
            raise APIError(503, f"server busy: {exc}", None, "server_busy", "server_error") from exc
        except EngineClosedError as exc:
            raise APIError(503, str(exc), None, "shutting_down", "server_error") from exc
        except SamplingError as exc:
            raise APIError(400, str(exc), str(exc).split()[0]) from exc
        except ContextFullError as exc:
            raise APIError(400, str(exc), None, "context_length_exceeded") from exc

    def respond(result: dict[str, Any] | CompletionStream, include_usage: bool, n_prompt: int):
        if isinstance(result, dict):
            return JSONResponse(result)
        return _EventStream(result, include_usage, n_prompt)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request, CompletionBody)
        check_model(body.model)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "prompt: one prompt per request (a string, or a list of one string)", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, list) and any(not 0 <= t < llm.n_vocab() for t in prompt):
            raise APIError(400, f"prompt: token ids must be in [0, {llm.n_vocab()})", "prompt")
        tokens = (llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True) if isinstance(prompt, str)
                  else list(prompt))
        max_tokens = budget(len(tokens), body.max_tokens, "prompt")
        result = await run(lambda: llm.create_completion(tokens, max_tokens=max_tokens, logprobs=body.logprobs,
                                                         echo=body.echo, stream=body.stream,
                                                         **sampling_kwargs(body)))
        return respond(result, bool((body.stream_options or {}).get("include_usage")), len(tokens))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse(request, ChatBody)
        check_model(body.model)
        messages = [{"role": "system" if m.role == "developer" else m.role,
                     "content": m.content if isinstance(m.content, str) or m.content is None
                     else "".join(part.text for part in m.content)} for m in body.messages]
        try:
            tokens = llm.tokenize_chat(messages)
        except ValueError as exc:
            raise APIError(400, f"messages: {exc}", "messages") from exc
        max_tokens = budget(len(tokens), body.max_completion_tokens or body.max_tokens, "messages")
        result = await run(lambda: llm.create_chat_completion(
            messages, max_tokens=max_tokens, stream=body.stream, logprobs=body.logprobs,
            top_logprobs=body.top_logprobs, **sampling_kwargs(body)))
        return respond(result, bool((body.stream_options or {}).get("include_usage")), len(tokens))

    @app.get("/v1/models")
    async def models():
        meta = {"n_ctx": llm.n_ctx, "n_vocab": llm.n_vocab(), "n_parallel": llm.n_parallel,
                "architecture": llm.metadata.get("general.architecture")}
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": started,
                                            "owned_by": "pyllm", "meta": meta}]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await parse(request, TokenizeBody)
        return {"tokens": llm.tokenize(body.content.encode("utf-8"), add_bos=body.add_special,
                                       special=body.parse_special)}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await parse(request, DetokenizeBody)
        if any(not 0 <= t < llm.n_vocab() for t in body.tokens):
            raise APIError(400, f"tokens: ids must be in [0, {llm.n_vocab()})", "tokens")
        return {"content": llm.detokenize(body.tokens).decode("utf-8", "replace")}

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

    def __init__(self, stream: CompletionStream, include_usage: bool, n_prompt: int) -> None:
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                            (b"x-accel-buffering", b"no")]
        self.stream, self.include_usage, self.n_prompt = stream, include_usage, n_prompt

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

        stream.request.on_event = wake
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
                        usage = {"prompt_tokens": self.n_prompt, "completion_tokens": request.n_generated,
                                 "total_tokens": self.n_prompt + request.n_generated,
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
