"""`pyllm bench -d` (tests run at a context depth, as llama-bench's -d) and `--plot` (the benchmark figure).

The depth tests count tokens with a spy on the model and a fake clock that advances by the tokens evaluated, so
what they assert is what was in the cache and what was timed, never how fast anything ran. The figure tests build
it from synthetic records and read its axes back.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as Q
from test_model import write_tiny_model

from pyllm import bench as benchmarks
from pyllm import plot
from pyllm.cli import main
from pyllm.gguf import GGUFFile
from pyllm.model import Model


class TokenClock:
    """A spy on a model's prefill and decode, and a clock that advances by one 'nanosecond' per token evaluated: a
    sample of ns is then the number of tokens evaluated inside the timed window."""

    def __init__(self, model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0
        self.calls: list[tuple[str, int, int, np.ndarray | None]] = []  # (kind, cache length before, tokens, logits)
        real_prefill, real_decode = model.prefill, model.decode

        def prefill(tokens, cache, logits="last"):
            before = cache.n_used
            out = real_prefill(tokens, cache, logits)
            self.now += len(tokens)
            self.calls.append(("prefill", before, len(tokens), out))
            return out

        def decode(steps):
            before = steps[0][1].n_used
            out = real_decode(steps)
            self.now += len(steps)
            self.calls.append(("decode", before, len(steps), out))
            return out

        monkeypatch.setattr(model, "prefill", prefill)
        monkeypatch.setattr(model, "decode", decode)
        monkeypatch.setattr(benchmarks, "time", SimpleNamespace(perf_counter_ns=lambda: self.now))


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Model]:
    folder = tmp_path_factory.mktemp("bench")
    return {arch: Model(GGUFFile(write_tiny_model(folder / f"{arch}.gguf", arch, Q.F32)), n_threads=1)
            for arch in ("llama", "gemma3")}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_pp_test_at_depth_d_starts_from_d_tokens_and_times_only_its_prompt(tiny_models, arch, monkeypatch) -> None:
    model = tiny_models[arch]
    # gemma3: a prompt as long as the sliding layers' ring, so each run overwrites the depth's window and the
    # depth has to be prefilled again (the truncate path cannot keep it)
    n_depth, n_prompt = (24, 8) if arch == "llama" else (520, model.config.sliding_window + 512)
    clock = TokenClock(model, monkeypatch)
    record = benchmarks.bench_prompt(model, "m.gguf", n_prompt, 1, repetitions=2, n_depth=n_depth)

    assert record.n_depth == n_depth and record.n_prompt == n_prompt and record.n_gen == 0
    assert record.samples_ns == [n_prompt, n_prompt]  # the depth's tokens were evaluated outside the timed window
    tests = [call for call in clock.calls if call[2] == n_prompt]
    assert [before for _, before, _, _ in tests] == [n_depth] * 3  # warm-up and 2 runs, each after d tokens
    depth_fills = [call for call in clock.calls if call[2] == n_depth]
    assert all(before == 0 for _, before, _, _ in depth_fills)
    assert len(depth_fills) == (1 if arch == "llama" else 3)
    # what was in the cache was the depth's tokens: each run's logits equal a fresh cache's after the same tokens
    depth_tokens = benchmarks._prompt_tokens(model, n_depth, seed=7)
    fresh = model.new_cache(n_depth + n_prompt)
    model.prefill(depth_tokens, fresh)
    want = model.prefill(benchmarks._prompt_tokens(model, n_prompt), fresh)
    for _, _, _, logits in tests:
        np.testing.assert_array_equal(logits.view(np.uint32), want.view(np.uint32))


def test_a_tg_test_at_depth_d_decodes_positions_d_onwards(tiny_models, monkeypatch) -> None:
    clock = TokenClock(tiny_models["llama"], monkeypatch)
    record = benchmarks.bench_generation(tiny_models["llama"], "m.gguf", 4, 1, repetitions=2, n_depth=16)
    assert record.n_depth == 16 and record.samples_ns == [4, 4]
    decodes = [before for kind, before, _, _ in clock.calls if kind == "decode"]
    assert decodes == [16, 17, 18, 19] * 3
    clock.calls.clear()
    assert benchmarks.bench_generation(tiny_models["llama"], "m.gguf", 3, 1, repetitions=1).n_depth == 0
    assert [before for kind, before, _, _ in clock.calls if kind == "decode"] == [0, 1, 2] * 2


def test_test_titles_follow_llama_bench() -> None:
    assert [benchmarks.test_title(*t) for t in ((512, 0, 0), (0, 128, 0), (512, 0, 1024), (0, 32, 256))] == \
        ["pp512", "tg128", "pp512 @ d1024", "tg32 @ d256"]


# ---- the figure -------------------------------------------------------------------------------------------------

def _record(n_prompt: int, n_gen: int, n_depth: int, ms: float, threads: int = 2, model: str = "m.gguf") -> dict:
    samples = [int(ms * 1e6), int(ms * 1.1e6)]
    n = n_prompt + n_gen
    return {"model_filename": model, "n_threads": threads, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth,
            "samples_ns": samples, "avg_ns": sum(samples) // 2, "samples_ts": [n / (s / 1e9) for s in samples]}


DEPTHS = [0, 256, 1024]


def _records(scale: float) -> list[dict]:
    """pp64 and pp128 and tg32 at each depth, slower with depth; scale: how much slower than the first engine."""
    out = []
    for d in DEPTHS:
        out += [_record(p, 0, d, scale * (p + d / 8)) for p in (64, 128)]
        out.append(_record(0, 32, d, scale * 32 * (10 + d / 100)))
    return out


def _panels(figure) -> dict[str, object]:
    return {ax.get_title(): ax for ax in figure.axes}


def _lines(ax) -> dict[str, object]:
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_the_figure_draws_both_engines_against_depth_prompt_length_and_clients() -> None:
    serve = [{"server": s, "clients": c, "output_tok_s": 50.0 * c / k, "ttft_p99_ms": 100.0 * c * k}
             for s, k in (("pyllm", 1), ("llama.cpp", 2)) for c in (1, 2, 4)]
    for row in serve[:3]:  # pyllm's rounds: the bars span them
        row["output_tok_s_rounds"] = [0.5 * row["output_tok_s"], row["output_tok_s"], 1.5 * row["output_tok_s"]]
    figure = plot.benchmark_figure({"pyllm": _records(1.0), "llama.cpp": _records(1.5)}, serve, title="t")
    panels = _panels(figure)
    assert sorted(panels) == sorted([
        "Decode speed against context depth", "Time per output token (TPOT) against context depth",
        "Time to first token against prompt length (empty cache)",
        "Prompt processing (pp128) speed against context depth",
        "Serving: output throughput against concurrent clients", "Serving: TTFT p99 against concurrent clients"])

    decode = _lines(panels["Decode speed against context depth"])
    assert sorted(decode) == ["llama.cpp", "pyllm"]
    assert list(decode["pyllm"].get_xdata()) == DEPTHS
    # tok/s: the mean over the samples of 32 tokens / time
    want = [np.mean([32 / (ns / 1e9) for ns in _record(0, 32, d, 32 * (10 + d / 100))["samples_ns"]]) for d in DEPTHS]
    np.testing.assert_allclose(decode["pyllm"].get_ydata(), want)

    tpot = _lines(panels["Time per output token (TPOT) against context depth"])
    assert list(tpot["llama.cpp"].get_xdata()) == DEPTHS
    np.testing.assert_allclose(tpot["llama.cpp"].get_ydata(), [1.5 * 1.05 * (10 + d / 100) for d in DEPTHS])
    assert "TPOT (ms/token)" == panels["Time per output token (TPOT) against context depth"].get_ylabel()

    ttft = _lines(panels["Time to first token against prompt length (empty cache)"])
    assert sorted(ttft) == ["llama.cpp", "pyllm"]
    assert list(ttft["pyllm"].get_xdata()) == [64, 128]   # the depth-0 pp records only
    np.testing.assert_allclose(ttft["pyllm"].get_ydata(), [1.05 * 64, 1.05 * 128])

    prefill = _lines(panels["Prompt processing (pp128) speed against context depth"])  # the longest prompt's
    assert sorted(prefill) == ["llama.cpp", "pyllm"] and list(prefill["pyllm"].get_xdata()) == DEPTHS
    np.testing.assert_allclose(prefill["pyllm"].get_ydata(),
                               [np.mean([128 / (ns / 1e9) for ns in _record(128, 0, d, 128 + d / 8)["samples_ns"]])
                                for d in DEPTHS])

    throughput = _lines(panels["Serving: output throughput against concurrent clients"])
    assert list(throughput["llama.cpp"].get_xdata()) == [1, 2, 4]
    assert list(throughput["llama.cpp"].get_ydata()) == [25.0, 50.0, 100.0]
    assert list(_lines(panels["Serving: TTFT p99 against concurrent clients"])["pyllm"].get_ydata()) == [100, 200, 400]
    bars = panels["Serving: output throughput against concurrent clients"].containers
    assert len(bars) == 1  # llama.cpp's rows carry no rounds
    assert [tuple(segment[:, 1]) for segment in bars[0].lines[2][0].get_segments()] == [(25, 75), (50, 150), (100, 300)]
    ttft_p99 = panels["Serving: TTFT p99 against concurrent clients"]
    assert not ttft_p99.containers and ttft_p99.get_yscale() == "linear"  # 100-800 ms: within tenfold
    serve[0]["ttft_p99_ms_rounds"] = [50.0, 100.0, 6000.0]  # a cold first round
    spread = _panels(plot.benchmark_figure(serve_load=serve))["Serving: TTFT p99 against concurrent clients"]
    assert spread.get_yscale() == "log" and spread.get_ylabel() == "TTFT p99 (ms) (log scale)"
    assert figure.get_suptitle() == "t"


def test_the_figure_without_llama_cpp_or_serving_has_one_line_a_series() -> None:
    records = _records(1.0) + [_record(0, 32, d, 300.0, threads=1) for d in DEPTHS]
    panels = _panels(plot.benchmark_figure({"pyllm": records, "llama.cpp": []}))
    assert len(panels) == 4 and not any(title.startswith("Serving") for title in panels)
    assert sorted(_lines(panels["Decode speed against context depth"])) == ["pyllm (t=1)", "pyllm (t=2)"]
    serve_only = _panels(plot.benchmark_figure(serve_load=[{"server": "pyllm", "clients": 1, "output_tok_s": 9.0,
                                                            "ttft_p99_ms": 5.0}]))
    assert sorted(serve_only) == ["Serving: TTFT p99 against concurrent clients",
                                  "Serving: output throughput against concurrent clients"]
    with pytest.raises(ValueError, match="nothing to draw"):
        plot.benchmark_figure({"pyllm": []})


def test_repeated_rounds_are_pooled_into_one_point_per_depth() -> None:
    rounds = [_record(0, 32, d, 320.0) for d in DEPTHS] + [_record(0, 32, d, 640.0) for d in DEPTHS]
    line = _lines(_panels(plot.benchmark_figure({"pyllm": rounds}))["Decode speed against context depth"])["pyllm"]
    assert list(line.get_xdata()) == DEPTHS
    pooled = [32 / (ns / 1e9) for r in rounds[:1] + rounds[3:4] for ns in r["samples_ns"]]
    np.testing.assert_allclose(line.get_ydata(), [np.mean(pooled)] * 3)


# ---- the command ------------------------------------------------------------------------------------------------

def test_bench_at_depths_prints_n_depth_and_draws_a_png(smollm2_path, tmp_path) -> None:
    theirs = tmp_path / "llama-bench.json"
    theirs.write_text(json.dumps([_record(8, 0, 0, 20.0), _record(0, 4, 0, 40.0), _record(8, 0, 16, 25.0),
                                  _record(0, 4, 16, 45.0)]))
    serve = tmp_path / "serve.json"
    serve.write_text(json.dumps({"settings": {}, "results": [
        {"server": "pyllm", "clients": c, "output_tok_s": 10.0 * c, "ttft_p99_ms": 50.0 * c} for c in (1, 2)]}))
    out = tmp_path / "bench.png"
    result = CliRunner().invoke(main, [
        "bench", str(smollm2_path), "-p", "8", "-n", "4", "-d", "0,16", "-t", "1", "-r", "1", "--json",
        "--plot", str(out), "--compare", str(theirs), "--serve-load", str(serve)])
    assert result.exit_code == 0, result.output
    records, _ = json.JSONDecoder().raw_decode(result.output)  # the JSON, then (on stderr) what was written
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in records] == [(8, 0, 0), (0, 4, 0), (8, 0, 16),
                                                                             (0, 4, 16)]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {out}" in result.output


@pytest.mark.parametrize(("extra", "message"), [
    (["-d", "-5"], "values must be >= 0"),
    (["-d", "one"], "is not a comma-separated list of integers"),
    (["--plot", "{tmp}/picture.jpg"], "picture.jpg is not a .png file name"),
    (["--plot", "{tmp}/no/such/folder/a.png"], "does not exist"),
    (["--plot", "{tmp}/a.png", "--compare", "{tmp}/bad.json"], "is not readable JSON"),
    (["--plot", "{tmp}/a.png", "--compare", "{tmp}/serve.json"], "holds no llama-bench records"),
    (["--plot", "{tmp}/a.png", "--serve-load", "{tmp}/records.json"], "is not `bench/serve_load.py --json` output"),
    (["--compare", "{tmp}/records.json"], "are drawn by --plot"),
])
def test_bad_arguments_stop_before_measuring_with_one_line(smollm2_path, tmp_path, extra, message) -> None:
    (tmp_path / "bad.json").write_text("[{")
    (tmp_path / "serve.json").write_text(json.dumps({"results": [{"server": "pyllm", "clients": 1,
                                                                  "output_tok_s": 1.0, "ttft_p99_ms": 1.0}]}))
    (tmp_path / "records.json").write_text(json.dumps([_record(8, 0, 0, 1.0)]))
    result = CliRunner().invoke(main, ["bench", str(smollm2_path), "-r", "1",
                                       *(a.format(tmp=tmp_path) for a in extra)])
    assert result.exit_code in (1, 2)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert "| model |" not in result.output and not (tmp_path / "a.png").exists()


def test_without_matplotlib_plot_says_how_to_install_it(smollm2_path, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError
    result = CliRunner().invoke(main, ["bench", str(smollm2_path), "--plot", str(tmp_path / "a.png")])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: --plot needs matplotlib: pip install 'pyllm[plot]'"


def test_plot_is_imported_only_when_a_picture_is_asked_for() -> None:
    import subprocess

    code = "import sys, pyllm.cli, pyllm.bench; print('matplotlib' in sys.modules, 'pyllm.plot' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_titles_count_threads_in_words() -> None:
    assert [plot.threads_phrase(c) for c in ([1], [2], [2, 1, 2])] == ["1 thread", "2 threads", "1, 2 threads"]


def test_cpu_description_names_the_cpu_and_its_widest_simd() -> None:
    def cpuinfo(flags: str) -> str:
        return f"processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\n"

    assert plot.cpu_description(cpuinfo("avx avx2 fma avx512f avx512bw")) == "AMD EPYC 9R14, AVX-512"
    assert plot.cpu_description(cpuinfo("avx avx2 fma")) == "AMD EPYC 9R14, AVX2"
    assert plot.cpu_description(cpuinfo("neon")) == "AMD EPYC 9R14"
    assert plot.cpu_description("") == ""
