"""Perplexity by llama-perplexity's protocol, checked against a direct computation from `Llama.logits`.

The reference here scores each chunk with its own numpy log-softmax over full-chunk logits, so it
shares no scoring code with pyllm/perplexity.py (which scores the second half in separate batches).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from pyllm.cli import main
from pyllm.llama import Llama
from pyllm.perplexity import PerplexityError, PerplexityResult, perplexity

TEXT = (
    "The river ran slowly through the valley, and the people who lived along its banks had learned long ago "
    "to follow its moods. In spring it rose with the melting snow and covered the low fields with a thin sheet "
    "of brown water; in late summer it shrank to a chain of quiet pools where children caught small fish with "
    "their hands. The old miller kept a record of the river's height on the wall of his mill, a column of "
    "notches and dates that went back three generations.\n"
    "Every morning the baker opened her shop before the sun was up. She said that bread, like weather, could "
    "not be hurried, and she would not sell a loaf that had not rested properly. Travellers who passed through "
    "the town often remarked that they had never tasted anything like it."
)
SHORT = TEXT[:200]  # 2 chunks of 16 tokens for both vocabularies


def reference_ppl(llm: Llama, text: str, n_ctx: int, replace_bos: bool = True) -> tuple[float, int, int]:
    """(ppl, n_chunks, n_scored), straight from the protocol's description."""
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    n_chunks = len(tokens) // n_ctx
    nlls = []
    for c in range(n_chunks):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if replace_bos and llm.tokenizer.add_bos:
            chunk[0] = llm.tokenizer.bos_id
        logits = llm.logits(chunk).astype(np.float64)
        for pos in range(n_ctx // 2, n_ctx - 1):
            row = logits[pos]
            log_probs = row - row.max() - np.log(np.sum(np.exp(row - row.max())))
            nlls.append(-log_probs[chunk[pos + 1]])
    return math.exp(float(np.mean(nlls))), n_chunks, len(nlls)


@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> Llama:
    return Llama(str(smollm2_path), n_ctx=64, n_threads=2)


@pytest.fixture(scope="module")
def progress_and_result(smollm2: Llama) -> tuple[list, PerplexityResult]:
    seen: list = []
    result = perplexity(smollm2, TEXT, 64, progress=lambda i, n, ppl: seen.append((i, n, ppl)))
    return seen, result


def test_perplexity_matches_direct_computation(smollm2: Llama, progress_and_result) -> None:
    assert not smollm2.tokenizer.add_bos  # SmolLM2's vocab adds no BOS: chunks are scored as they are
    seen, result = progress_and_result
    ppl, n_chunks, n_scored = reference_ppl(smollm2, TEXT, 64)
    assert (result.n_chunks, result.n_ctx, result.n_scored) == (n_chunks, 64, n_scored) == (2, 64, 2 * 31)
    assert result.ppl == pytest.approx(ppl, rel=1e-4)
    assert result.ppl == pytest.approx(math.exp(result.nll / result.n_scored), rel=1e-12)
    assert 1 < result.ppl < 1000
    assert [(i, n) for i, n, _ in seen] == [(1, 2), (2, 2)]
    assert [p for _, _, p in seen] == result.running_ppl and result.running_ppl[-1] == result.ppl
    assert len(result.chunk_ppl) == 2
    # the total is the geometric mean of the chunks (equal counts per chunk)
    assert result.ppl == pytest.approx(math.sqrt(result.chunk_ppl[0] * result.chunk_ppl[1]), rel=1e-9)
    assert result.ppl_err > 0


def test_first_token_of_each_chunk_becomes_bos(gemma_path) -> None:
    llm = Llama(str(gemma_path), n_ctx=16, n_threads=2)
    assert llm.tokenizer.add_bos
    result = perplexity(llm, SHORT, 16)
    ppl, n_chunks, _ = reference_ppl(llm, SHORT, 16)
    assert result.n_chunks == n_chunks == len(llm.tokenize(SHORT.encode())) // 16 == 2
    assert result.ppl == pytest.approx(ppl, rel=1e-4)
    # ... and that replacement matters, so the check above can tell
    without, _, _ = reference_ppl(llm, SHORT, 16, replace_bos=False)
    assert abs(without / ppl - 1) > 1e-3


def test_cli_json_matches_api(progress_and_result, smollm2_path, tmp_path) -> None:
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT + "\n")  # one trailing newline is dropped, as llama.cpp's -f does
    result = CliRunner().invoke(main, ["perplexity", str(smollm2_path), "-f", str(text_file), "-c", "64",
                                       "-t", "2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == {"ppl", "n_chunks", "n_ctx"}
    assert out["n_chunks"] == 2 and out["n_ctx"] == 64
    assert out["ppl"] == pytest.approx(progress_and_result[1].ppl, rel=1e-9)


def test_cli_text_output(smollm2_path, tmp_path) -> None:
    text_file = tmp_path / "text.txt"
    text_file.write_text(SHORT)
    result = CliRunner().invoke(main, ["perplexity", str(smollm2_path), "-f", str(text_file), "-c", "16"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Final estimate: PPL = ") and " +/- " in result.stdout
    assert result.stderr.startswith("[1]") and ",[2]" in result.stderr


def test_too_short_text_is_an_error(smollm2: Llama, smollm2_path, tmp_path) -> None:
    with pytest.raises(PerplexityError, match=r"you need at least 256 tokens .* context of 128.* only 157 tokens"):
        perplexity(smollm2, TEXT, 128)
    text_file = tmp_path / "short.txt"
    text_file.write_text("Too short.")
    result = CliRunner().invoke(main, ["perplexity", str(smollm2_path), "-f", str(text_file), "-c", "64"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: you need at least 128 tokens to evaluate perplexity with a context of 64; "
        "the text tokenizes to only 3 tokens"]


@pytest.mark.parametrize("args", [["-c", "4"], ["-c", "100000"], ["-f", "/nonexistent/text.txt"]])
def test_bad_arguments_are_errors(smollm2_path, tmp_path, args) -> None:
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT)
    result = CliRunner().invoke(main, ["perplexity", str(smollm2_path), "-f", str(text_file), *args])
    assert result.exit_code in (1, 2)
    assert "Error:" in result.output and "Traceback" not in result.output
