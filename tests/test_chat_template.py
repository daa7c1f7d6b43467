"""Chat templates: the model files' own templates, the built-ins, the sandbox and the error paths."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from pyllm.gguf import GGUFFile
from pyllm.text.chat_template import (
    BUILTIN_TEMPLATES,
    ChatTemplateError,
    builtin_for_family,
    builtin_template,
    render_chat,
    validate_messages,
)

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]

SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


# CONVERSATION in ChatML, with the generation prompt
CHATML_CONVERSATION = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\nBye<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def _tokens(f: GGUFFile) -> tuple[str, str]:
    vocab = f.get("tokenizer.ggml.tokens")
    return vocab[f.get("tokenizer.ggml.bos_token_id")], vocab[f.get("tokenizer.ggml.eos_token_id")]


def _render(template: str | None, messages: list[dict[str, str]], **kwargs: object) -> str:
    kwargs.setdefault("bos_token", "<s>")
    kwargs.setdefault("eos_token", "</s>")
    return render_chat(template, messages, **kwargs)  # type: ignore[arg-type]


# -- the model files ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_template(smollm2_path: Path) -> str:
    with GGUFFile(smollm2_path) as f:
        template = f.get("tokenizer.chat_template")
    assert isinstance(template, str) and "<|im_start|>" in template
    return template


def test_smollm2_template_renders_chatml(smollm2_path: Path, smollm2_template: str) -> None:
    with GGUFFile(smollm2_path) as f:
        bos, eos = _tokens(f)
    text = render_chat(smollm2_template, CONVERSATION, bos_token=bos, eos_token=eos, family="llama")
    assert text == CHATML_CONVERSATION


def test_smollm2_template_adds_its_default_system_prompt(smollm2_template: str) -> None:
    # The template inserts its own system message when the conversation has none.
    text = _render(smollm2_template, [{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert text == f"<|im_start|>system\n{SMOLLM2_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_smollm2_generation_prompt_switch(smollm2_template: str) -> None:
    with_prompt = _render(smollm2_template, CONVERSATION, add_generation_prompt=True)
    without = _render(smollm2_template, CONVERSATION, add_generation_prompt=False)
    assert with_prompt == without + "<|im_start|>assistant\n"


def test_gemma_file_has_no_template_so_the_builtin_is_used(gemma_path: Path) -> None:
    with GGUFFile(gemma_path) as f:
        assert f.get("tokenizer.chat_template") is None
        family = f.get("general.architecture")
        bos, eos = _tokens(f)
    assert family == "gemma3"
    assert (bos, eos) == ("<bos>", "<eos>")
    text = render_chat(None, CONVERSATION, bos_token=bos, eos_token=eos, family=family)
    assert text == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


# -- built-ins ---------------------------------------------------------------------------


def test_gemma_builtin_without_system_and_without_prompt() -> None:
    messages = [{"role": "user", "content": "  Hi there \n"}, {"role": "assistant", "content": "Hello!"}]
    text = _render(None, messages, family="gemma", bos_token="<bos>", add_generation_prompt=False)
    assert text == "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"


def test_gemma_builtin_requires_alternating_roles() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="alternate"):
        _render(None, messages, family="gemma3")
    with pytest.raises(ChatTemplateError, match="alternate"):
        _render(None, [{"role": "assistant", "content": "a"}], family="gemma2")


def test_chatml_builtin() -> None:
    text = _render(None, CONVERSATION, family="qwen2")
    assert text == CHATML_CONVERSATION
    assert _render(None, CONVERSATION[:2], family="qwen3", add_generation_prompt=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_llama3_builtin() -> None:
    text = _render(None, CONVERSATION, family="llama3", bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    assert text == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    without = _render(None, CONVERSATION, family="llama3", bos_token="<|begin_of_text|>", add_generation_prompt=False)
    assert text == without + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def test_llama2_builtin() -> None:
    text = _render(None, CONVERSATION, family="llama2")
    assert text == "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]"
    assert _render(None, [{"role": "user", "content": "Hi"}], family="llama2") == "<s>[INST] Hi [/INST]"


def test_family_selection() -> None:
    assert builtin_for_family("gemma3") == "gemma"
    assert builtin_for_family("GEMMA") == "gemma"
    assert builtin_for_family("qwen3") == "chatml"
    assert builtin_for_family("llama") == "chatml"  # ambiguous architecture: the default
    assert builtin_for_family("no-such-arch") == "chatml"
    assert builtin_for_family(None) == "chatml"
    assert _render(None, CONVERSATION, family="mystery") == _render(None, CONVERSATION, family="qwen2")
    assert _render("   ", CONVERSATION, family="gemma3") == _render(None, CONVERSATION, family="gemma3")


def test_builtin_template_lookup() -> None:
    assert set(BUILTIN_TEMPLATES) == {"chatml", "gemma", "llama2", "llama3"}
    for name in BUILTIN_TEMPLATES:
        text = _render(builtin_template(name), CONVERSATION, family="gemma3")
        assert text == _render(None, CONVERSATION, family=name)
    with pytest.raises(ChatTemplateError, match="nope"):
        builtin_template("nope")


def test_builtins_accept_an_empty_conversation() -> None:
    assert _render(None, [], family="chatml") == "<|im_start|>assistant\n"
    assert _render(None, [], family="gemma", bos_token="<bos>") == "<bos><start_of_turn>model\n"


# -- the Hugging Face environment --------------------------------------------------------


def test_raise_exception_becomes_chat_template_error() -> None:
    template = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        _render(template, CONVERSATION)
    assert _render(template, CONVERSATION[1:]) == ""


def test_tojson_is_plain_json() -> None:
    data = {"b": "é<&>'", "a": [1, 2]}
    assert _render("{{ data | tojson }}", [], data=data) == json.dumps(data, ensure_ascii=False)
    assert _render("{{ data | tojson(indent=2) }}", [], data=data) == json.dumps(data, ensure_ascii=False, indent=2)
    assert _render("{{ data | tojson(sort_keys=true) }}", [], data=data).startswith('{"a"')


def test_hf_globals_and_variables() -> None:
    year = str(datetime.now().year)
    template = (
        "{{ strftime_now('%Y') }}|{{ tools }}|{{ bos_token }}{{ eos_token }}|{{ add_generation_prompt }}|{{ extra }}"
        "|{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
        "|{% generation %}{{ messages[-1].content }}{% endgeneration %}"
    )
    text = _render(template, CONVERSATION, add_generation_prompt=False, extra="x", bos_token="B", eos_token="E")
    assert text in (f"{year}|None|BE|False|x|system|Bye", f"{int(year) + 1}|None|BE|False|x|system|Bye")


def test_trim_and_lstrip_blocks_like_hf() -> None:
    template = "{% for m in messages %}\n    {% if true %}{{ m.content }}\n    {% endif %}\n{% endfor %}\n"
    assert _render(template, CONVERSATION[:2]) == "You are terse.\nHi\n"


# -- the sandbox and template errors -------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__ }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{% set _ = messages.append({'role': 'x'}) %}",
        "{{ messages[0].update({'role': 'x'}) }}",
        "{{ raise_exception.__globals__ }}",
    ],
)
def test_sandbox_blocks_unsafe_access(template: str) -> None:
    with pytest.raises(ChatTemplateError, match="sandbox") as info:
        _render(template, CONVERSATION)
    assert "\n" not in str(info.value)


def test_template_cannot_change_the_callers_messages() -> None:
    messages = [dict(m) for m in CONVERSATION]
    with pytest.raises(ChatTemplateError):
        _render("{% set _ = messages[0].pop('role') %}", messages)
    assert messages == CONVERSATION


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("{% for m in messages %}{{ m.content }}", "syntax error"),
        ("{{ messages[0]['content'] ", "syntax error"),
        ("{% if %}x{% endif %}", "syntax error"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ undefined_thing.attr }}", "undefined"),
        ("{{ range(10 ** 9) | list }}", "range"),
    ],
)
def test_template_errors_are_one_line(template: str, fragment: str) -> None:
    with pytest.raises(ChatTemplateError, match=fragment) as info:
        _render(template, CONVERSATION)
    assert "\n" not in str(info.value)


# -- message validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ({"role": "user", "content": "hi"}, "list"),
        ("hello", "list"),
        (None, "list"),
        ([{"role": "user", "content": "hi"}, "oops"], "message 1: must be a dict"),
        ([{"content": "hi"}], "message 0: missing 'role'"),
        ([{"role": "", "content": "hi"}], "message 0: 'role' must be a non-empty string"),
        ([{"role": 3, "content": "hi"}], "message 0: 'role' must be"),
        ([{"role": "user", "content": "a"}, {"role": "user"}], r"message 1 \(user\): missing 'content'"),
        ([{"role": "user", "content": None}], r"message 0 \(user\): 'content' must be a string, got NoneType"),
        ([{"role": "user", "content": ["a"]}], "'content' must be a string, got list"),
    ],
)
def test_bad_messages_rejected(messages: object, fragment: str) -> None:
    with pytest.raises(ChatTemplateError, match=fragment):
        _render(None, messages)  # type: ignore[arg-type]


def test_valid_messages_pass_through_with_extra_keys() -> None:
    messages = ({"role": "user", "content": "hi", "name": "bob"},)
    assert validate_messages(messages) == [{"role": "user", "content": "hi", "name": "bob"}]
    assert _render("{{ messages[0].name }}", list(messages)) == "bob"


def test_bad_special_tokens_and_template_type() -> None:
    with pytest.raises(ChatTemplateError, match="bos_token"):
        render_chat(None, CONVERSATION, bos_token=None, eos_token="")  # type: ignore[arg-type]
    with pytest.raises(ChatTemplateError, match="string or None"):
        render_chat(b"{{ 1 }}", CONVERSATION, bos_token="", eos_token="")  # type: ignore[arg-type]
