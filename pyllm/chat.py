"""`pyllm chat`: the interactive loop.

Input is read a message at a time: one line, lines joined by a trailing backslash, or a block
between triple quotes (as Ollama reads it). On a terminal, readline gives line editing, arrow-key
history (kept in ~/.cache/pyllm/chat_history) and tab completion of the slash commands. A line
that starts with "/" is a command, never a message. Replies stream through the engine; each
reply's statistics come from its Request (tokens, not text chunks).

A model whose file carries no chat template (a base model) is not given a made-up chat: each
message is completed as plain text, on its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .llama import Llama
    from .serve.engine import Request

# A base model's completion has no end-of-turn to stop at: at most this many tokens unless -n says otherwise.
BASE_MODEL_MAX_TOKENS = 256
HISTORY_FILE = Path.home() / ".cache" / "pyllm" / "chat_history"

HELP = """\
/help                      this list
/set                       show the sampling settings
/set NAME VALUE            change one: temp, top_k, top_p, min_p, repeat_penalty, seed (a number >= 0 or none),
                           n (most tokens per reply, or none)
/system [TEXT]             set the system prompt (without TEXT: show it; /system none: remove it)
/reset                     forget the conversation (the system prompt stays)
/save FILE, /load FILE     write the conversation to FILE as JSON, or read one back
/stats [on|off]            the last reply's statistics; on/off: print them after every reply
/exit                      quit (also /quit, /bye, Ctrl-D); Ctrl-C stops a reply
Multi-line input: end a line with \\ to go on, or put the text between \"\"\" and \"\"\".
A message that starts with a slash: write two (//etc/hosts is sent as /etc/hosts)."""

COMMANDS = ("/help", "/set", "/system", "/reset", "/save", "/load", "/stats", "/exit", "/quit", "/bye")


def has_chat_template(llm: Llama) -> bool:
    template = llm.metadata.get("tokenizer.chat_template")
    return isinstance(template, str) and bool(template.strip())


@dataclass
class Settings:
    """The sampling settings a chat starts with and /set changes."""
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None

    def set(self, name: str, value: str) -> str:
        """Change one setting from its text; returns the change as words, raises ValueError with the reason."""
        key = _SETTING_NAMES.get(name.lower().replace("-", "_"))
        if key is None:
            raise ValueError(f"no setting {name!r}; the settings: {', '.join(_SHOWN_NAMES.values())}")
        parse, check, rule = _SETTING_RULES[key]
        try:
            parsed = parse(value)
        except ValueError:
            raise ValueError(f"{_SHOWN_NAMES[key]} takes {rule}, not {value!r}") from None
        if not check(parsed):
            raise ValueError(f"{_SHOWN_NAMES[key]} takes {rule}, not {value!r}")
        setattr(self, key, parsed)
        return f"{_SHOWN_NAMES[key]} = {_show(parsed)}"

    def describe(self) -> str:
        return ", ".join(f"{_SHOWN_NAMES[f.name]} {_show(getattr(self, f.name))}" for f in fields(self))

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments of create_completion / create_chat_completion."""
        return asdict(self)


def _show(value: object) -> str:
    return "none" if value is None else str(value)


def _optional_int(text: str) -> int | None:
    return None if text.lower() in ("none", "-1") else int(text)


_SETTING_NAMES = {"temp": "temperature", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                  "min_p": "min_p", "repeat_penalty": "repeat_penalty", "seed": "seed", "n": "max_tokens",
                  "max_tokens": "max_tokens", "num_predict": "max_tokens"}
_SHOWN_NAMES = {"temperature": "temp", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                "repeat_penalty": "repeat_penalty", "seed": "seed", "max_tokens": "n"}
# setting -> (parse, check, what it takes)
_SETTING_RULES: dict[str, tuple[Callable[[str], Any], Callable[[Any], bool], str]] = {
    "temperature": (float, lambda v: v >= 0, "a number >= 0 (0: greedy)"),
    "top_k": (int, lambda v: v >= 0, "an integer >= 0 (0: off)"),
    "top_p": (float, lambda v: 0 <= v <= 1, "a number from 0 to 1"),
    "min_p": (float, lambda v: 0 <= v <= 1, "a number from 0 to 1"),
    "repeat_penalty": (float, lambda v: v > 0, "a number > 0 (1: off)"),
    "seed": (_optional_int, lambda v: v is None or v >= 0, "an integer >= 0 or none"),
    "max_tokens": (_optional_int, lambda v: v is None or v >= 1, "an integer >= 1 or none"),
}


@dataclass(frozen=True)
class ReplyStats:
    """One reply's numbers, from its Request. Prefill: the prompt tokens not found in the prefix cache, up to
    the first token; decode: the steps after it (the one that sampled the end-of-turn token included)."""
    prompt_tokens: int
    cached_tokens: int
    reply_tokens: int
    ttft_s: float | None       # None when no token came
    decode_steps: int
    decode_s: float
    kv_used: int
    n_ctx: int
    kv_bytes: tuple[int, int, str] | None = None  # bytes the used slots take, of a full cache's, and its types


    @classmethod
    def of(cls, request: Request, ended_at: float, n_ctx: int,
           kv_bytes: Callable[[int], tuple[int, int, str]] | None = None) -> ReplyStats:
        n = request.n_generated
        first = request.first_token_at
        stopped_at_end = request.finish_reason == "stop"
        return cls(prompt_tokens=len(request.prompt), cached_tokens=request.n_cached, reply_tokens=n,
                   ttft_s=None if first is None else first - request.submitted_at,
                   decode_steps=max(0, n - 1 + stopped_at_end) if first is not None else 0,
                   decode_s=0.0 if first is None else ended_at - first,
                   kv_used=min(n_ctx, len(request.prompt) + n), n_ctx=n_ctx,
                   kv_bytes=None if kv_bytes is None else kv_bytes(min(n_ctx, len(request.prompt) + n)))

    def line(self) -> str:
        new = self.prompt_tokens - self.cached_tokens
        parts = [f"prompt {self.prompt_tokens} tok ({self.cached_tokens} cached)"]
        if self.ttft_s is not None:
            rate = f", {new / self.ttft_s:.1f} tok/s" if new and self.ttft_s > 0 else ""
            parts.append(f"prefill {new} tok{rate}, TTFT {1e3 * self.ttft_s:.0f} ms")
        if self.decode_steps and self.decode_s > 0:
            parts.append(f"decode {self.reply_tokens} tok, {self.decode_steps / self.decode_s:.1f} tok/s, "
                         f"TPOT {1e3 * self.decode_s / self.decode_steps:.1f} ms")
        else:
            parts.append(f"decode {self.reply_tokens} tok")
        memory = ""
        if self.kv_bytes is not None:
            used, full, types = self.kv_bytes
            memory = f", {used / 2**20:.1f}/{full / 2**20:.1f} MiB {types}"
        parts.append(f"KV cache {self.kv_used}/{self.n_ctx} tok{memory}")
        return " | ".join(parts)


class ChatSession:
    """A conversation with one model, driven by `run()` (the loop) or `handle(text)` (one input)."""

    def __init__(self, llm: Llama, settings: Settings, *, system: str | None = None, stats: bool = False,
                 out: Callable[..., None], model_name: str) -> None:
        self.llm = llm
        self.settings = settings
        self.chat = has_chat_template(llm)
        self.system = system
        self.turns: list[dict[str, str]] = []
        self.show_stats = stats
        self.last_stats: ReplyStats | None = None
        self._echo = out   # click.echo's signature: (text, nl=True, err=False)
        self.model_name = model_name

    # ---- output -------------------------------------------------------------------

    def say(self, text: str) -> None:
        """A note for the person (stderr)."""
        self._echo(text, err=True)

    def error(self, text: str) -> None:
        self._echo(f"error: {text}", err=True)

    # ---- the loop -----------------------------------------------------------------

    def greet(self) -> None:
        self.say(f"pyllm chat: {self.model_name} ({self.llm.metadata.get('general.architecture')}), context "
                 f"{self.llm.n_ctx()}. /help for commands, /exit or Ctrl-D to quit.")
        if not self.chat:
            limit = self.settings.max_tokens or BASE_MODEL_MAX_TOKENS
            self.say(f"warning: {self.model_name} has no chat template (a base model): each message is completed "
                     f"as plain text, up to {limit} tokens, not answered as a chat.")
        if self.system and not self.chat:
            self.error("a base model takes no system prompt; --system is ignored")
            self.system = None

    def run(self, read: Callable[[str], str]) -> None:
        """Read messages with read(prompt) (input() or readline's) until /exit or end of input."""
        self.greet()
        while True:
            try:
                text = read_message(read)
            except KeyboardInterrupt:
                self._echo("")
                continue
            if text is None:
                self._echo("")
                return
            if not self.handle(text):
                return

    def handle(self, text: str) -> bool:
        """One input: a command or a message. False when the chat should end."""
        stripped = text.strip()
        if not stripped:
            return True
        if stripped.startswith("/") and not stripped.startswith("//"):
            return self.command(stripped)
        self.reply(stripped[1:] if stripped.startswith("//") else stripped)
        return True

    # ---- commands -----------------------------------------------------------------

    def command(self, line: str) -> bool:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        name = name.lower()
        if name in ("/exit", "/quit", "/bye"):
            return False
        handlers: dict[str, Callable[[str], None]] = {
            "/help": lambda _: self.say(HELP), "/?": lambda _: self.say(HELP), "/set": self._set,
            "/system": self._system, "/reset": self._reset, "/clear": self._reset, "/save": self._save,
            "/load": self._load, "/stats": self._stats}
        handler = handlers.get(name)
        if handler is None:
            self.error(f"unknown command {name} (/help lists the commands; //text sends a message that "
                       f"starts with a slash)")
        else:
            handler(arg)
        return True

    def _set(self, arg: str) -> None:
        if not arg:
            self.say(self.settings.describe())
            return
        name, _, value = arg.partition(" ")
        if not value.strip():
            self.error(f"/set {name} needs a value (/set {name} VALUE)")
            return
        try:
            self.say(f"({self.settings.set(name, value.strip())})")
        except ValueError as exc:
            self.error(str(exc))

    def _system(self, arg: str) -> None:
        if not self.chat:
            self.error("a base model takes no system prompt")
        elif not arg:
            self.say(f"system prompt: {self.system!r}" if self.system else "(no system prompt)")
        elif arg.lower() == "none":
            self.system = None
            self.say("(system prompt removed)")
        else:
            self.system = arg
            self.say("(system prompt set; it applies from the next message)")

    def _reset(self, _: str) -> None:
        self.turns = []
        self.llm.reset()
        self.say("(conversation cleared)")

    def messages(self) -> list[dict[str, str]]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.turns

    def _save(self, arg: str) -> None:
        if not arg:
            self.error("/save needs a file name")
            return
        path = Path(arg).expanduser()
        try:
            path.write_text(json.dumps({"model": self.model_name, "messages": self.messages()}, indent=2,
                                       ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            self.error(f"cannot write {path}: {exc.strerror or exc}")
            return
        self.say(f"(saved {len(self.messages())} messages to {path})")

    def _load(self, arg: str) -> None:
        if not arg:
            self.error("/load needs a file name")
            return
        from .text.chat_template import validate_messages

        path = Path(arg).expanduser()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            messages = data["messages"] if isinstance(data, dict) else data
            if not isinstance(messages, list):
                raise ValueError("no list of messages")
            messages = [{"role": m["role"], "content": m["content"]} for m in validate_messages(messages)]
            if any(m["role"] not in ("system", "user", "assistant") for m in messages):
                raise ValueError("roles must be system, user or assistant")
        except OSError as exc:
            self.error(f"cannot read {path}: {exc.strerror or exc}")
            return
        except (ValueError, KeyError, TypeError) as exc:   # ChatTemplateError is a ValueError
            self.error(f"{path} is not a saved conversation ({exc})")
            return
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
        if system is not None and not self.chat:
            self.error("a base model takes no system prompt; the conversation's is left out")
            system = None
        self.system = system
        self.turns = [m for m in messages if m["role"] != "system"]
        self.llm.reset()
        self.say(f"(loaded {len(self.turns)} messages from {path}"
                 + (", with a system prompt)" if system else ")"))

    def _stats(self, arg: str) -> None:
        if arg in ("on", "off"):
            self.show_stats = arg == "on"
            self.say(f"(statistics after each reply: {arg})")
        elif arg:
            self.error("/stats takes on, off or nothing")
        elif self.last_stats is None:
            self.say("(no reply yet)")
        else:
            self.say(self.last_stats.line())

    # ---- replies ------------------------------------------------------------------

    def reply(self, text: str) -> None:
        sampling = self.settings.sampling()
        try:
            if self.chat:
                self.turns.append({"role": "user", "content": text})
                stream = self.llm.create_chat_completion(self.messages(), stream=True, **sampling)
            else:
                sampling["max_tokens"] = sampling["max_tokens"] or BASE_MODEL_MAX_TOKENS
                stream = self.llm.create_completion(text, stream=True, **sampling)
        except ValueError as exc:   # the conversation no longer fits the context, a template error, ...
            from .model import ContextFullError

            if self.chat:
                self.turns.pop()
            self.error(f"{exc} (/reset starts over)" if isinstance(exc, ContextFullError) else str(exc))
            return
        pieces: list[str] = []
        try:
            for chunk in stream:
                choice = chunk["choices"][0]
                piece = choice["delta"].get("content", "") if self.chat else choice["text"]
                if piece:
                    pieces.append(piece)
                    self._echo(piece, nl=False)
        except KeyboardInterrupt:
            stream.close()
            self._echo(" [stopped]", nl=False)
        except ValueError as exc:   # the engine's error for this request
            self._echo("")
            if self.chat:
                self.turns.pop()
            self.error(str(exc))
            return
        ended_at = time.perf_counter()
        self._echo("")
        if self.chat:
            self.turns.append({"role": "assistant", "content": "".join(pieces)})
        else:
            self.turns += [{"role": "user", "content": text}, {"role": "assistant", "content": "".join(pieces)}]
        self.last_stats = ReplyStats.of(stream.request, ended_at, self.llm.n_ctx(), self.llm.kv_cache_bytes)
        if self.show_stats:
            self.say(f"[{self.last_stats.line()}]")


def read_message(read: Callable[[str], str]) -> str | None:
    """One message from read(prompt): a line; lines whose ends are backslashes joined to the next; or the lines
    between \"\"\" and \"\"\". None at the end of input."""
    try:
        line = read(">>> ")
        if line.lstrip().startswith('"""'):
            rest = line.lstrip()[3:]
            if rest.rstrip().endswith('"""'):
                return rest.rstrip()[:-3]
            lines = [rest] if rest else []
            while not (line := read("... ")).rstrip().endswith('"""'):
                lines.append(line)
            lines.append(line.rstrip()[:-3])
            return "\n".join(lines)
        lines = []
        while line.endswith("\\"):
            lines.append(line[:-1])
            line = read("... ")
        return "\n".join([*lines, line])
    except EOFError:
        return None


def terminal_reader() -> Callable[[str], str]:
    """input() with readline's editing, history (kept in HISTORY_FILE) and command completion."""
    import atexit
    try:
        import readline
    except ImportError:   # Windows without pyreadline
        return input
    try:
        readline.read_history_file(HISTORY_FILE)
    except OSError:
        pass
    readline.set_history_length(1000)

    def save_history() -> None:
        try:
            HISTORY_FILE.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(HISTORY_FILE)
        except OSError:
            pass

    atexit.register(save_history)

    def complete(text: str, state: int) -> str | None:
        matches = [c + " " for c in COMMANDS if c.startswith(text)] if text.startswith("/") else []
        return matches[state] if state < len(matches) else None

    readline.set_completer(complete)
    readline.set_completer_delims(" \t\n")
    if "libedit" in (readline.__doc__ or ""):   # macOS's readline
        readline.parse_and_bind("bind ^I rl_complete")
    else:
        readline.parse_and_bind("tab: complete")
    return input
