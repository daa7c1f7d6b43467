"""Chat templates: turning a list of messages into the prompt text a chat model expects.

A GGUF file usually carries its chat template as ``tokenizer.chat_template``: a Jinja2
template written for Hugging Face ``apply_chat_template``. `render_chat` renders it the
way Hugging Face does:

* a sandbox that cannot modify its inputs or reach Python internals
  (`jinja2.sandbox.ImmutableSandboxedEnvironment`), with ``trim_blocks`` and
  ``lstrip_blocks`` on and the ``loopcontrols`` extension (``{% break %}``,
  ``{% continue %}``); the ``{% generation %}`` tag that training templates use renders
  its body unchanged;
* the globals ``raise_exception(message)`` (raises `ChatTemplateError`) and
  ``strftime_now(format)`` (the local time, formatted);
* a ``tojson`` filter that writes plain JSON - non-ASCII characters kept, no HTML
  escaping, keys in their given order - and takes ``indent``, ``separators``,
  ``sort_keys`` and ``ensure_ascii`` like `json.dumps`;
* the variables ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``,
  ``tools`` (None) and ``documents`` (None), plus any extra keyword arguments.

When a file has no template, a built-in one is chosen by the model family (the GGUF
``general.architecture``): see `FAMILY_TEMPLATES` and `builtin_template`. The built-ins
produce what those models' published templates produce:

* ``chatml`` (Qwen 2/3, and the default): ``<|im_start|>{role}\\n{content}<|im_end|>\\n``
  per message, ``<|im_start|>assistant\\n`` as the generation prompt, no BOS text.
* ``gemma`` (Gemma 1/2/3): ``bos_token``, then ``<start_of_turn>{role}\\n{content}<end_of_turn>\\n``
  per message with role ``assistant`` written as ``model`` and the content stripped; a
  leading system message is not a turn of its own but is put, followed by a blank line,
  in front of the first user message; the turns after it must alternate user/assistant,
  starting with user. Generation prompt: ``<start_of_turn>model\\n``.
* ``llama3``: ``bos_token``, then ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``
  per message (content stripped); generation prompt ``<|start_header_id|>assistant<|end_header_id|>\\n\\n``.
* ``llama2``: ``{bos}[INST] {user} [/INST] {assistant} {eos}`` per exchange, a leading
  system message wrapped in ``<<SYS>>\\n...\\n<</SYS>>\\n\\n`` inside the first ``[INST]``; the
  prompt always ends ready for the answer, so ``add_generation_prompt`` changes nothing.

Templates that write ``bos_token`` into the text (``gemma``, ``llama3``, ``llama2`` and
many GGUF templates) expect the tokenizer *not* to add another BOS token in front.

Every failure - malformed messages, template syntax errors, errors while rendering,
``raise_exception`` calls, and attempts to escape the sandbox - raises
`ChatTemplateError`, a `ValueError` with a one-line message.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import pickle
import re
import resource
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

__all__ = [
    "BUILTIN_TEMPLATES",
    "DEFAULT_BUILTIN",
    "FAMILY_TEMPLATES",
    "ChatTemplateError",
    "builtin_for_family",
    "builtin_template",
    "render_chat",
    "render_chat_bounded",
    "validate_messages",
]


class ChatTemplateError(ValueError):
    """Messages a template cannot render, or a template that fails or misbehaves."""


def _one_line(text: object) -> str:
    return re.sub(r"\s*\n\s*", " ", str(text)).strip()


# -- built-in templates ----------------------------------------------------------------------

_CHATML = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' ~ m['role'] ~ '\\n' ~ m['content'] ~ '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_GEMMA = (
    "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system_prefix = messages[0]['content'] ~ '\\n\\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_prefix = '' -%}"
    "{%- set turns = messages -%}"
    "{%- endif -%}"
    "{%- for m in turns -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('gemma template: after an optional system message the roles must alternate"
    " user/assistant/user/..., starting with user') -}}"
    "{%- endif -%}"
    "{{- '<start_of_turn>' ~ ('model' if m['role'] == 'assistant' else m['role']) ~ '\\n' -}}"
    "{{- (system_prefix if loop.first else '') ~ (m['content'] | trim) ~ '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

_LLAMA3 = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{{- '<|start_header_id|>' ~ m['role'] ~ '<|end_header_id|>\\n\\n' ~ (m['content'] | trim) ~ '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

_LLAMA2 = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system_text = messages[0]['content'] -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_text = none -%}"
    "{%- set turns = messages -%}"
    "{%- endif -%}"
    "{%- for m in turns -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('llama2 template: after an optional system message the roles must alternate"
    " user/assistant/user/..., starting with user') -}}"
    "{%- endif -%}"
    "{%- if loop.first and system_text is not none -%}"
    "{%- set text = '<<SYS>>\\n' ~ system_text ~ '\\n<</SYS>>\\n\\n' ~ m['content'] -%}"
    "{%- else -%}"
    "{%- set text = m['content'] -%}"
    "{%- endif -%}"
    "{%- if m['role'] == 'user' -%}"
    "{{- bos_token ~ '[INST] ' ~ (text | trim) ~ ' [/INST]' -}}"
    "{%- else -%}"
    "{{- ' ' ~ (text | trim) ~ ' ' ~ eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": _CHATML,
    "gemma": _GEMMA,
    "llama2": _LLAMA2,
    "llama3": _LLAMA3,
}

DEFAULT_BUILTIN = "chatml"

# GGUF general.architecture -> built-in template. "llama" is deliberately absent: that
# architecture covers Llama 2, Llama 3 and many fine-tunes with their own formats (SmolLM2
# is ChatML), so it gets the default; a caller that knows better passes "llama2"/"llama3".
FAMILY_TEMPLATES: dict[str, str] = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "qwen": "chatml",
    "qwen2": "chatml",
    "qwen2moe": "chatml",
    "qwen2vl": "chatml",
    "qwen3": "chatml",
    "qwen3moe": "chatml",
    "llama2": "llama2",
    "llama3": "llama3",
    "chatml": "chatml",
}


def builtin_template(name: str) -> str:
    """The Jinja source of the built-in template `name` (a key of `BUILTIN_TEMPLATES`)."""
    try:
        return BUILTIN_TEMPLATES[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(BUILTIN_TEMPLATES))
        raise ChatTemplateError(f"no built-in chat template named {name!r} (known: {known})") from None


def builtin_for_family(family: str | None) -> str:
    """The name of the built-in template for a model family; `DEFAULT_BUILTIN` if unknown."""
    if not family:
        return DEFAULT_BUILTIN
    return FAMILY_TEMPLATES.get(family.strip().lower(), DEFAULT_BUILTIN)


# -- the sandbox -----------------------------------------------------------------------------


class _Sandbox(ImmutableSandboxedEnvironment):
    """Hugging Face's environment, except that touching an unsafe attribute fails at once.

    Jinja's sandbox returns an undefined value for ``''.__class__`` that only fails when
    used further (and prints as an empty string); here the access itself raises.
    """

    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:  # type: ignore[override]
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}``: marks assistant text in training templates; renders the body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: object = "") -> NoReturn:
    raise ChatTemplateError(f"chat template error: {_one_line(message)}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _make_env() -> _Sandbox:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _make_env()


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    try:
        return _ENV.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        where = f" (line {e.lineno})" if e.lineno else ""
        raise ChatTemplateError(f"chat template syntax error{where}: {_one_line(e.message)}") from None
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {_one_line(e)}") from None


# -- rendering -------------------------------------------------------------------------------


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check the message list and return it as a new list of plain dicts.

    Each message must be a dict with a non-empty string ``role`` and a string ``content``;
    other keys (``name``, ``tool_calls``, ...) are passed through to the template.
    """
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"message {i}: must be a dict with 'role' and 'content', got {type(m).__name__}")
        if "role" not in m:
            raise ChatTemplateError(f"message {i}: missing 'role'")
        role = m["role"]
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"message {i}: 'role' must be a non-empty string, got {role!r}")
        if "content" not in m:
            raise ChatTemplateError(f"message {i} ({role}): missing 'content'")
        if not isinstance(m["content"], str):
            raise ChatTemplateError(
                f"message {i} ({role}): 'content' must be a string, got {type(m['content']).__name__}"
            )
        out.append(dict(m))
    return out


def _prepare(
    template: str | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    bos_token: str,
    eos_token: str,
    family: str | None,
    extra: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """The template source and the variables it is rendered with, checked."""
    if not isinstance(bos_token, str) or not isinstance(eos_token, str):
        raise ChatTemplateError("bos_token and eos_token must be strings (the token texts)")
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"chat template must be a string or None, got {type(template).__name__}")
    msgs = validate_messages(messages)
    source = template if template and template.strip() else builtin_template(builtin_for_family(family))
    variables: dict[str, Any] = {"tools": None, "documents": None}
    variables.update(extra)
    variables.update(
        messages=msgs,
        add_generation_prompt=bool(add_generation_prompt),
        bos_token=bos_token,
        eos_token=eos_token,
    )
    return source, variables


def _render(source: str, variables: dict[str, Any]) -> str:
    compiled = _compile(source)
    try:
        return compiled.render(variables)
    except ChatTemplateError:
        raise
    except MemoryError:
        raise ChatTemplateError("the chat template ran out of memory") from None
    except SecurityError as e:
        raise ChatTemplateError(f"chat template blocked by the sandbox: {_one_line(e)}") from None
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {_one_line(e)}") from None
    except Exception as e:  # errors raised by Python operations the template performs
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {_one_line(e)}") from None


def render_chat(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str,
    eos_token: str,
    family: str | None = None,
    **extra: Any,
) -> str:
    """Render `messages` with a chat template and return the prompt text, in this process.

    `template` is the GGUF's ``tokenizer.chat_template``; when it is None or blank the
    built-in template for `family` (the GGUF ``general.architecture``, or a built-in name
    such as ``"llama3"``) is used, ChatML for an unknown or missing family. `bos_token` and
    `eos_token` are the *texts* of those tokens. Extra keyword arguments become template
    variables (``tools``, ``date_string``, ``enable_thinking``, ...).

    A template is a program from the model file: this render has no bound on its time or memory. Code that
    renders a file's template on someone else's behalf uses `render_chat_bounded`, which gives the same text.
    """
    return _render(*_prepare(template, messages, add_generation_prompt, bos_token, eos_token, family, extra))


def render_chat_bounded(
    template: str | None,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str,
    eos_token: str,
    family: str | None = None,
    **extra: Any,
) -> str:
    """`render_chat` in a worker process that may take at most `RENDER_SECONDS` and `RENDER_MEMORY` bytes of
    memory: a template that loops for ever or builds a huge string fails with a ChatTemplateError saying so,
    and the process that asked is unharmed."""
    source, variables = _prepare(template, messages, add_generation_prompt, bos_token, eos_token, family, extra)
    return _RENDERER.render(source, variables)


# -- the bounded renderer --------------------------------------------------------------------

RENDER_SECONDS = 3.0      # a real template renders in about a millisecond
RENDER_MEMORY = 1 << 30   # the worker's address space
WORKER_START_SECONDS = 60.0  # a new worker's interpreter and imports, on a busy machine
RENDER_MAX_CHARS = 1 << 26

_HEADER = struct.Struct("<BQ")  # reply: status (0 text, 1 error), payload bytes
_READY = b"R"  # a worker's first byte: started, its limits set


class _Renderer:
    """One worker process (started on first use, started again after it is killed or dies) that renders
    templates sent to it one at a time: the request a pickle of (source, variables), the reply a status and
    UTF-8 text (never a pickle: the worker runs the model file's code, so nothing it sends is unpickled)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = 0  # the process that started the worker (a forked child starts its own)

    def _worker(self) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is None or proc.poll() is not None or self._pid != os.getpid():
            here = os.path.dirname(os.path.abspath(__file__))
            code = "import sys; sys.path.insert(0, sys.argv[1]); import chat_template; chat_template._serve()"
            proc = subprocess.Popen([sys.executable, "-c", code, here], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
            # its start (an interpreter, jinja's import) is not the template's time: RENDER_SECONDS begins after it
            try:
                ready = self._read(proc, 1, time.monotonic() + WORKER_START_SECONDS)
            except ChatTemplateError:
                ready = b""
            if ready != _READY:
                self._stop(proc)
                raise ChatTemplateError("the chat template renderer did not start")
            self._proc, self._pid = proc, os.getpid()
        return proc

    def render(self, source: str, variables: dict[str, Any]) -> str:
        request = pickle.dumps((source, variables), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            proc = self._worker()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(struct.pack("<Q", len(request)) + request)
                proc.stdin.flush()
                deadline = time.monotonic() + RENDER_SECONDS
                header = self._read(proc, _HEADER.size, deadline)
                status, size = _HEADER.unpack(header)
                if size > 4 * RENDER_MAX_CHARS + 1024:
                    raise ChatTemplateError("the chat template renderer sent a malformed reply")
                payload = self._read(proc, size, deadline).decode("utf-8", "surrogatepass")
            except ChatTemplateError:
                self._stop(proc)
                raise
            except (OSError, ValueError) as e:
                self._stop(proc)
                raise ChatTemplateError(f"the chat template renderer failed: {_one_line(e)}") from None
        if status != 0:
            raise ChatTemplateError(payload)
        return payload

    @staticmethod
    def _read(proc: subprocess.Popen[bytes], n: int, deadline: float) -> bytes:
        assert proc.stdout is not None
        fd, chunks, got = proc.stdout.fileno(), [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ChatTemplateError(f"the chat template did not finish rendering in {RENDER_SECONDS:g} s")
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                raise ChatTemplateError("the chat template renderer stopped (out of memory?)")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        if self._proc is proc:
            self._proc = None

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._stop(self._proc)


_RENDERER = _Renderer()
atexit.register(_RENDERER.close)


def _serve() -> None:
    """The worker's loop (see _Renderer): limited to RENDER_MEMORY of address space, each reply capped."""
    resource.setrlimit(resource.RLIMIT_AS, (RENDER_MEMORY, RENDER_MEMORY))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(_READY)
    stdout.flush()
    while True:
        size_bytes = stdin.read(8)
        if len(size_bytes) < 8:
            return
        source, variables = pickle.loads(stdin.read(struct.unpack("<Q", size_bytes)[0]))
        try:
            text, status = _render(source, variables), 0
            if len(text) > RENDER_MAX_CHARS:
                text, status = f"the chat template wrote {len(text)} characters (at most {RENDER_MAX_CHARS})", 1
        except ChatTemplateError as e:
            text, status = str(e), 1
        except MemoryError:
            text, status = f"the chat template needed more than {RENDER_MEMORY >> 20} MiB of memory", 1
        payload = text.encode("utf-8", "surrogatepass")
        stdout.write(_HEADER.pack(status, len(payload)) + payload)
        stdout.flush()
