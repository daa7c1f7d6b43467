"""pyllm.tools without a model: the grammar a required or named tool_choice forces, the <tool_call> blocks read
back as OpenAI tool_calls, the history as templates want it, and the refusals by name."""

from __future__ import annotations

import json

import pytest

from pyllm.params import ParamError
from pyllm.text.chat_template import render_chat
from pyllm.tools import history_for_template, parse_tool_calls, setup_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
PING = {"type": "function", "function": {"name": "ping"}}  # no parameters: an empty object


def _block(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def test_required_and_named_choices_force_a_valid_call() -> None:
    required = setup_tools([WEATHER, ADD, PING], "required")
    assert required.grammar.fullmatch(_block("add", '{"a": 1, "b": -2}'))
    assert required.grammar.fullmatch(_block("get_weather", '{"city": "Paris", "unit": "celsius"}'))
    assert required.grammar.fullmatch(_block("ping", "{}"))
    assert not required.grammar.fullmatch(_block("add", '{"a": 1}'))                  # b is required
    assert not required.grammar.fullmatch(_block("add", '{"a": 1.5, "b": 2}'))         # not an integer
    assert not required.grammar.fullmatch(_block("get_weather", '{"city": "Paris", "unit": "kelvin"}'))
    assert not required.grammar.fullmatch(_block("nope", "{}"))
    assert not required.grammar.fullmatch("Sure! " + _block("ping", "{}"))
    named = setup_tools([WEATHER, ADD], {"type": "function", "function": {"name": "add"}})
    assert named.names == {"add"} and named.grammar.fullmatch(_block("add", '{"a": 1, "b": 2}'))
    assert not named.grammar.fullmatch(_block("get_weather", '{"city": "Paris"}'))
    auto = setup_tools([WEATHER], "auto")
    assert auto.grammar is None and auto.names == {"get_weather"}
    assert setup_tools([WEATHER], "none") is None and setup_tools(None, None) is None


def test_tool_call_blocks_become_openai_tool_calls() -> None:
    names = frozenset({"get_weather", "add"})
    text = "Let me check.\n" + _block("get_weather", '{"city": "Paris"}') + "\n" + _block("add", '{"a": 1, "b": 2}')
    content, calls = parse_tool_calls(text, names)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "add"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]
    assert parse_tool_calls(_block("add", '{"a": 1, "b": 2}'), names)[0] is None
    for text in ["no call here", _block("unknown", "{}"), "<tool_call>\n{not json}\n</tool_call>",
                 '<tool_call>\n{"name": "add", "argu']:             # cut off by max_tokens: the text as it is
        assert parse_tool_calls(text, names) == (text, [])


def test_the_history_as_templates_want_it() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    history = [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    rendered = history_for_template(history, template_renders_tools=True)
    assert rendered[1]["content"] == "" and rendered[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": 2}
    assert history[1]["content"] is None                                 # the caller's messages are not changed
    template = ("{% for m in messages %}{{ m.role }}:{{ m.content }}{% for c in m.tool_calls or [] %}"
                "[{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %};{% endfor %}")
    assert render_chat(template, rendered, bos_token="", eos_token="") == \
        'user:1+2?;assistant:[add {"a": 1, "b": 2}];tool:3;'
    plain = history_for_template(history, template_renders_tools=False)
    assert plain[1] == {"role": "assistant", "content": _block("add", '{"a": 1, "b": 2}')}
    assert plain[2]["content"] == "<tool_response>\n3\n</tool_response>"
    bad = [{"role": "assistant", "content": None, "tool_calls": [{**call, "function": {"name": "add",
                                                                                         "arguments": "{oops"}}]}]
    with pytest.raises(ParamError, match="arguments is not JSON") as info:
        history_for_template(bad, True)
    assert info.value.param == "messages"


@pytest.mark.parametrize(("tools", "choice", "param"), [
    ([], "auto", "tools"),
    ("get_weather", "auto", "tools"),
    ([{"type": "retrieval"}], "auto", "tools"),
    ([{"type": "function", "function": {"name": "two words"}}], "auto", "tools"),
    ([WEATHER, WEATHER], "auto", "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}], "required",
     "tools"),
    ([WEATHER], "sometimes", "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "add"}}, "tool_choice"),
    (None, "required", "tool_choice"),
])
def test_bad_tools_are_refused_by_name(tools, choice, param) -> None:
    with pytest.raises(ParamError) as info:
        setup_tools(tools, choice)
    assert info.value.param == param, str(info.value)
