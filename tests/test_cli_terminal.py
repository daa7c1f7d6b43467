"""The CLI as a person meets it: `pyllm chat` driven through a pseudo-terminal (readline, commands,
multi-line input), `pyllm run --chat` against the Python API, and the progress bars of bench and
perplexity, which show on a terminal only."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pexpect
import pytest
from click.testing import CliRunner

from pyllm.cli import RUN_MAX_TOKENS, main
from pyllm.llama import Llama

REPO = Path(__file__).resolve().parent.parent
PROMPT = ">>> "


@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> Llama:
    llm = Llama(str(smollm2_path), n_ctx=4096, n_threads=2)
    yield llm
    llm.close()


def spawn(tmp_path: Path, *args: str) -> pexpect.spawn:
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "TERM": "xterm", "COLUMNS": "200"}
    child = pexpect.spawn(sys.executable, ["-m", "pyllm.cli", *args], cwd=str(tmp_path), env=env,
                          encoding="utf-8", timeout=120, dimensions=(50, 200))
    return child


def send(child: pexpect.spawn, line: str) -> str:
    """Type a line and return what the terminal showed until the next prompt (without the echoed line)."""
    child.sendline(line)
    child.expect_exact(PROMPT)
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", child.before).replace("\r\n", "\n")
    return shown.split("\n", 1)[1] if "\n" in shown else ""


def test_chat_commands_in_a_terminal(smollm2, smollm2_path, tmp_path) -> None:
    child = spawn(tmp_path, "chat", str(smollm2_path), "--temp", "0", "-n", "8", "-t", "2")
    child.expect_exact(PROMPT)
    assert "pyllm chat: SmolLM2-135M-Instruct.Q4_1.gguf (llama), context 4096. /help for commands" in child.before

    shown = send(child, "/help")
    for command in ("/set NAME VALUE", "/system", "/reset", "/save FILE", "/load FILE", "/stats", "/exit", '"""'):
        assert command in shown
    # an unknown command is an error, and nothing reaches the model
    assert send(child, "/frobnicate now") == "error: unknown command /frobnicate (/help lists the commands; " \
                                              "//text sends a message that starts with a slash)\n"
    assert send(child, "/stats") == "(no reply yet)\n"

    # the sampling settings
    assert send(child, "/set temp 0.2") == "(temp = 0.2)\n"
    # readline: the up arrow brings the last line back to edit (here: 0.2 -> 0.0)
    child.send("\x1b[A")
    child.send("\x7f0\r")
    child.expect_exact(PROMPT)
    assert "(temp = 0.0)" in child.before
    assert send(child, "/set top_k 7") == "(top_k = 7)\n"
    assert send(child, "/set top-p 0.5") == "(top_p = 0.5)\n"
    assert send(child, "/set min_p 0.1") == "(min_p = 0.1)\n"
    assert send(child, "/set repeat_penalty 1.1") == "(repeat_penalty = 1.1)\n"
    assert send(child, "/set seed 5") == "(seed = 5)\n"
    assert send(child, "/set temp -1") == "error: temp takes a number >= 0 (0: greedy), not '-1'\n"
    assert send(child, "/set warmth 3").startswith("error: no setting 'warmth'; the settings: temp, top_k,")
    assert send(child, "/set") == "temp 0.0, top_k 7, top_p 0.5, min_p 0.1, repeat_penalty 1.1, seed 5, n 8\n"
    assert send(child, "/set repeat_penalty 1") == "(repeat_penalty = 1.0)\n"

    # a system prompt, then a reply: the one the Python API gives for the same messages and settings
    assert send(child, "/system You are terse.") == "(system prompt set; it applies from the next message)\n"
    assert send(child, "/system") == "system prompt: 'You are terse.'\n"
    reply = send(child, "What is the capital of France?")
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the capital of France?"}]
    api = smollm2.create_chat_completion(messages, temperature=0, top_k=7, top_p=0.5, min_p=0.1, seed=5, max_tokens=8)
    expected = api["choices"][0]["message"]["content"]
    assert reply == expected + "\n"

    # statistics in tokens, never nan
    stats = send(child, "/stats")
    n_prompt, n_reply = api["usage"]["prompt_tokens"], api["usage"]["completion_tokens"]
    assert re.fullmatch(rf"prompt {n_prompt} tok \(0 cached\) \| prefill {n_prompt} tok, [0-9.]+ tok/s, TTFT \d+ ms "
                        rf"\| decode {n_reply} tok, [0-9.]+ tok/s, TPOT [0-9.]+ ms \| KV cache "
                        rf"{n_prompt + n_reply}/4096 tok, [0-9.]+/90.5 MiB f16\n", stats), stats

    # multi-line input: a triple-quoted block and a trailing backslash
    child.sendline('"""')
    child.sendline("line one")
    child.sendline('line two"""')
    child.expect_exact(PROMPT)
    child.sendline("first \\")
    child.sendline("second")
    child.expect_exact(PROMPT)
    assert re.search(r"prompt \d+ tok \(\d+ cached\)", send(child, "/stats"))
    assert int(re.search(r"\((\d+) cached\)", send(child, "/stats")).group(1)) > n_prompt  # earlier turns reused

    saved = tmp_path / "conversation.json"
    assert send(child, f"/save {saved}") == f"(saved 7 messages to {saved})\n"
    conversation = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in conversation] == ["system", "user", "assistant", "user", "assistant", "user",
                                                 "assistant"]
    assert conversation[:3] == [*messages, {"role": "assistant", "content": expected}]
    assert conversation[3]["content"] == "line one\nline two" and conversation[5]["content"] == "first \nsecond"

    assert send(child, "/reset") == "(conversation cleared)\n"
    emptied = tmp_path / "empty.json"
    send(child, f"/save {emptied}")
    assert json.loads(emptied.read_text())["messages"] == messages[:1]   # the system prompt stays
    assert send(child, f"/load {saved}") == f"(loaded 6 messages from {saved}, with a system prompt)\n"
    again = tmp_path / "again.json"
    send(child, f"/save {again}")
    assert json.loads(again.read_text())["messages"] == conversation
    assert send(child, f"/load {tmp_path / 'missing.json'}").startswith("error: cannot read ")
    (tmp_path / "bad.json").write_text('{"messages": [{"role": "user"}]}')
    assert send(child, f"/load {tmp_path / 'bad.json'}") == \
        f"error: {tmp_path / 'bad.json'} is not a saved conversation (message 0 (user): missing 'content')\n"

    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "/set temp 0.2" in (tmp_path / ".cache" / "pyllm" / "chat_history").read_text()


def test_chat_stats_flag_prints_tokens_after_each_reply(smollm2_path, tmp_path) -> None:
    child = spawn(tmp_path, "chat", str(smollm2_path), "--temp", "0", "-n", "4", "-t", "2", "--stats")
    child.expect_exact(PROMPT)
    first = send(child, "Hi")
    second = send(child, "Hi again")
    for shown in (first, second):
        stats = shown.splitlines()[-1]
        assert re.fullmatch(r"\[prompt \d+ tok \(\d+ cached\) \| prefill \d+ tok, [0-9.]+ tok/s, TTFT \d+ ms \| "
                            r"decode 4 tok, [0-9.]+ tok/s, TPOT [0-9.]+ ms \| KV cache \d+/4096 tok, "
                            r"[0-9.]+/[0-9.]+ MiB f16\]", stats), stats
    assert "nan" not in first + second and "chunks" not in first + second
    assert re.search(r"\((\d+) cached\)", second.splitlines()[-1]).group(1) != "0"
    child.sendeof()
    child.expect(pexpect.EOF)


def test_a_base_model_gets_a_warning_and_plain_completion(gemma_path, tmp_path) -> None:
    child = spawn(tmp_path, "chat", str(gemma_path), "--temp", "0", "-n", "6", "-t", "2")
    child.expect_exact(PROMPT)
    assert ("warning: gemma-3-270m-q4_k_m.gguf has no chat template (a base model): each message is completed as "
            "plain text, up to 6 tokens, not answered as a chat.") in child.before.replace("\r\n", " ")
    assert send(child, "/system Be nice.") == "error: a base model takes no system prompt\n"
    completion = send(child, "The capital of France is")
    llm = Llama(str(gemma_path), n_ctx=4096, n_threads=2)
    expected = llm.create_completion("The capital of France is", max_tokens=6, temperature=0)["choices"][0]["text"]
    llm.close()
    assert completion == expected + "\n"
    child.sendline("/bye")
    child.expect(pexpect.EOF)


def test_run_chat_gives_the_python_apis_chat_answer(smollm2, smollm2_path) -> None:
    question = "What is the capital of France? Answer in one word."
    api = smollm2.create_chat_completion([{"role": "user", "content": question}], temperature=0,
                                         max_tokens=RUN_MAX_TOKENS)
    assert api["choices"][0]["finish_reason"] == "stop"   # it ends its turn well before -n's default
    result = CliRunner().invoke(main, ["run", str(smollm2_path), question, "--chat", "--temp", "0", "-t", "2"])
    assert result.exit_code == 0, result.output
    assert result.stdout == api["choices"][0]["message"]["content"] + "\n"

    system = [{"role": "system", "content": "Answer in French."}]
    api = smollm2.create_chat_completion([*system, {"role": "user", "content": question}], temperature=0,
                                         max_tokens=12)
    result = CliRunner().invoke(main, ["run", str(smollm2_path), "-", "--system", "Answer in French.", "--temp", "0",
                                       "-n", "12", "--json"], input=question + "\n")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"] == api["choices"][0]["message"]
    assert (out["usage"]["prompt_tokens"], out["usage"]["completion_tokens"]) == (
        api["usage"]["prompt_tokens"], api["usage"]["completion_tokens"])

    plain = CliRunner().invoke(main, ["run", str(smollm2_path), "The capital of France is", "--temp", "0", "-n", "4",
                                      "--json"])
    assert json.loads(plain.stdout)["choices"][0]["text"] == " Paris.\n\n"


def test_run_chat_on_a_base_model_warns_and_completes(gemma_path) -> None:
    result = CliRunner().invoke(main, ["run", str(gemma_path), "The capital of France is", "--chat", "--temp", "0",
                                       "-n", "4", "-t", "2"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ("warning: gemma-3-270m-q4_k_m.gguf has no chat template (a base model): PROMPT is "
                             "completed as plain text\n")
    llm = Llama(str(gemma_path), n_ctx=64, n_threads=2)
    assert result.stdout == llm.create_completion("The capital of France is", max_tokens=4,
                                                  temperature=0)["choices"][0]["text"] + "\n"
    llm.close()


def test_run_help_shows_every_default() -> None:
    text = CliRunner().invoke(main, ["run", "--help"], terminal_width=200).output
    for option, default in (("--temp", "0.8"), ("--top-k", "40"), ("--top-p", "0.95"), ("--min-p", "0.05"),
                            ("--repeat-penalty", "1.0"), ("--max-tokens", str(RUN_MAX_TOKENS)), ("--ctx-size", "4096")):
        line = next(line for line in text.splitlines() if option in line)
        assert f"[default: {default};" in line, line
    assert "(default: random)" in text and "(default: all physical cores)" in text
    assert RUN_MAX_TOKENS == 512


def test_bench_and_perplexity_show_a_bar_on_a_terminal_only(smollm2_path, tmp_path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 12)
    child = spawn(tmp_path, "perplexity", str(smollm2_path), "-f", str(text), "-c", "32", "-t", "2")
    child.expect(pexpect.EOF)
    shown = child.before.replace("\r\n", "\n")
    assert re.search(r"perplexity: 100%\|[^\n]*\| (\d+)/\1 \[.*PPL [0-9.]+\]", shown), shown
    assert "[1]" not in shown and "Final estimate: PPL = " in shown
    child = spawn(tmp_path, "perplexity", str(smollm2_path), "-f", str(text), "-c", "32", "-t", "2", "--json")
    child.expect(pexpect.EOF)
    assert "%|" not in child.before and json.loads(child.before)["n_ctx"] == 32

    child = spawn(tmp_path, "bench", str(smollm2_path), "-p", "8", "-n", "4", "-t", "1", "-r", "2")
    child.expect(pexpect.EOF)
    shown = child.before.replace("\r\n", "\n")
    assert re.search(r"bench: 100%\|[^\n]*\| 7/7 ", shown), shown   # (1 warm-up + 2 runs) x 2 tests + 1 chat run
    assert "| pp8 |" in shown and "| tg4 |" in shown
    result = CliRunner().invoke(main, ["bench", str(smollm2_path), "-p", "8", "-n", "0", "-t", "1", "-r", "1"])
    assert result.exit_code == 0 and "%|" not in result.output   # not a terminal: no bar
