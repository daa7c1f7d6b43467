"""Tool calls in chat completions, OpenAI's shape over the `<tool_call>` JSON blocks Qwen2.5 (and Hermes-style
templates) write:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`tools` is OpenAI's list of {"type": "function", "function": {"name", "description", "parameters"}}; a chat
template that renders `tools` gets them as they are, and for one that does not (SmolLM2's) a system message in
the same convention is put in front. `tool_choice`: "none" (the tools are not shown), "auto" (the model decides;
its `<tool_call>` blocks become `tool_calls`), "required" or {"type": "function", "function": {"name": ...}}
(the output is constrained to one call whose arguments match the function's parameter schema).

The history may hold assistant messages with `tool_calls` (arguments as a JSON string, as OpenAI sends them: the
templates want the parsed object) and `role: "tool"` messages with the results.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .params import ParamError, ParamTypeError

__all__ = ["ToolSetup", "history_for_template", "instructions", "parse_tool_calls", "setup_tools"]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
TOOL_CALL_OPEN = "<tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolSetup:
    """What a chat request with tools needs: the checked tools, the grammar that forces a call (None under
    auto), and the names a call may use."""
    tools: list[dict[str, Any]]
    grammar: Any
    names: frozenset[str]


def _check_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list) or not tools:
        raise ParamTypeError("tools must be a non-empty list of {\"type\": \"function\", \"function\": {...}}", "tools")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" \
                or not isinstance(tool.get("function"), Mapping):
            raise ParamError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", "tools")
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ParamError(f"tools[{i}].function.name must be 1 to 64 letters, digits, '_', '-' or '.'", "tools")
        if name in seen:
            raise ParamError(f"tools[{i}]: the function {name!r} is given twice", "tools")
        seen.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping):
            raise ParamError(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        out.append({"type": "function", "function": {**fn, "parameters": dict(params)}})
    return out


def _chosen(tool_choice: Any, tools: list[dict[str, Any]]) -> tuple[str, str | None]:
    """tool_choice -> (mode, the named function or None)."""
    if tool_choice is None:
        return "auto", None
    if tool_choice in ("auto", "none", "required"):
        return tool_choice, None
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function" \
            and isinstance(tool_choice.get("function"), Mapping):
        name = tool_choice["function"].get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise ParamError(f"tool_choice names the function {name!r}, which is not among the tools", "tool_choice")
        return "named", name
    raise ParamError("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": "
                     "{\"name\": ...}}", "tool_choice")


def _call_grammar(tools: list[dict[str, Any]]) -> Any:
    """One `<tool_call>` block whose JSON names one of `tools` and gives arguments valid under its parameters."""
    from .grammar import compile_gbnf, schema_to_gbnf

    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                               "arguments": t["function"]["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    text = schema_to_gbnf(calls[0] if len(calls) == 1 else {"anyOf": calls}, param="tools")
    # the converter never names another rule `root`, so only its definition is renamed
    body = re.sub(r"^root ::= ", "tool-call-json ::= ", text, count=1)
    return compile_gbnf('root ::= "<tool_call>\\n" tool-call-json "\\n</tool_call>"\n' + body, "tools")


def setup_tools(tools: Any, tool_choice: Any) -> ToolSetup | None:
    """Check `tools` and `tool_choice` (ParamErrors naming them); None when there is nothing to do."""
    if tools is None:
        if tool_choice not in (None, "none", "auto"):
            raise ParamError("tool_choice needs tools", "tool_choice")
        return None
    checked = _check_tools(tools)
    mode, name = _chosen(tool_choice, checked)
    if mode == "none":
        return None
    names = frozenset(t["function"]["name"] for t in checked)
    if mode == "auto":
        return ToolSetup(checked, None, names)
    forced = [t for t in checked if mode == "required" or t["function"]["name"] == name]
    return ToolSetup(checked, _call_grammar(forced), frozenset(t["function"]["name"] for t in forced))


def instructions(tools: list[dict[str, Any]]) -> str:
    """A system message for templates that do not render `tools`: the functions and the call format."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("You can call these functions (JSON signatures):\n<tools>\n" + listed + "\n</tools>\n\nTo call one, "
            "reply with only a JSON object in <tool_call></tool_call> tags:\n<tool_call>\n"
            '{"name": <function name>, "arguments": <arguments as a JSON object>}\n</tool_call>')


def history_for_template(messages: Any, template_renders_tools: bool) -> Any:
    """The messages as chat templates want them: an assistant's tool_calls with their arguments parsed and its
    missing content as ""; for a template that knows nothing of tools, the calls and the results written out as
    `<tool_call>` / `<tool_response>` text. Anything else is left for the template checks to report."""
    if not isinstance(messages, list):
        return messages
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            out.append(m)
            continue
        m = dict(m)
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls:
            parsed = []
            for j, call in enumerate(calls if isinstance(calls, list) else []):
                fn = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise ParamError(f"messages[{i}].tool_calls[{j}] must have a function with a name", "messages")
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise ParamError(f"messages[{i}].tool_calls[{j}].function.arguments is not JSON",
                                         "messages") from None
                parsed.append({**call, "function": {**fn, "arguments": args}})
            if m.get("content") is None:
                m["content"] = ""
            if template_renders_tools:
                m["tool_calls"] = parsed
            else:
                blocks = [json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                     ensure_ascii=False) for c in parsed]
                m["content"] = "\n".join([m["content"]] * bool(m["content"]) +
                                         [f"<tool_call>\n{b}\n</tool_call>" for b in blocks])
                del m["tool_calls"]
        elif m.get("role") == "tool" and not template_renders_tools and isinstance(m.get("content"), str):
            m["content"] = f"<tool_response>\n{m['content']}\n</tool_response>"
        out.append(m)
    return out


def parse_tool_calls(text: str, names: frozenset[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """The `<tool_call>` blocks of a reply as OpenAI tool_calls, and the text around them (None if empty). A block
    that is not a JSON call of a known function stays in the text: the caller gets what the model wrote."""
    calls, kept, last = [], [], 0
    for match in _CALL.finditer(text):
        try:
            value = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(value, dict) or value.get("name") not in names:
            continue
        args = value.get("arguments", {})
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": value["name"], "arguments": args}})
        kept.append(text[last:match.start()])
        last = match.end()
    if not calls:
        return text, []
    kept.append(text[last:])
    content = "".join(kept).strip()
    return content or None, calls


# ---- OpenAI's older functions API, carried on the tools machinery ----

def tools_from_functions(functions: Any, function_call: Any, tools: Any, tool_choice: Any) -> tuple[Any, Any]:
    """(tools, tool_choice) for a request in the older shape: `functions` (a list of function definitions) and
    `function_call` ("none", "auto" or {"name": ...}); ParamError for a request that mixes the two APIs."""
    if functions is None and function_call is None:
        return tools, tool_choice
    if tools is not None or tool_choice is not None:
        raise ParamError("give tools/tool_choice or the older functions/function_call, not both", "functions")
    if functions is None:
        raise ParamError("function_call needs functions", "function_call")
    if not isinstance(functions, list):
        raise ParamError("functions must be a list of function definitions", "functions")
    if function_call is None or function_call in ("none", "auto"):
        choice = function_call
    elif isinstance(function_call, Mapping) and set(function_call) == {"name"} and isinstance(function_call["name"],
                                                                                                str):
        choice = {"type": "function", "function": {"name": function_call["name"]}}
    else:
        raise ParamError('function_call must be "none", "auto" or {"name": a function\'s name}', "function_call")
    return [{"type": "function", "function": f} for f in functions], choice


def history_from_functions(messages: Any) -> Any:
    """The older API's turns as tool turns: an assistant's function_call as a tool call, a "function" message
    (its name and content) as the tool's result."""
    if not isinstance(messages, list):
        return messages
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, Mapping) and m.get("role") == "assistant" and m.get("function_call") is not None:
            call = m["function_call"]
            if not isinstance(call, Mapping):
                raise ParamError(f"messages[{i}].function_call must be an object", "messages")
            m = {k: v for k, v in m.items() if k != "function_call"}
            m["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": dict(call)}]
        elif isinstance(m, Mapping) and m.get("role") == "function":
            m = {"role": "tool", "name": m.get("name"), "content": m.get("content"), "tool_call_id": f"call_{i}"}
        out.append(m)
    return out


def as_function_call(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A reply's first tool call in the older shape: {"name", "arguments"}."""
    fn = calls[0]["function"]
    return {"name": fn["name"], "arguments": fn["arguments"]}
