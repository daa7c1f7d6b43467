"""Pictures of benchmark results: speed against context depth, prompt length and concurrent clients.

Draws llama-bench-style records (`pyllm bench --json`, `llama-bench -o json`) and `bench/serve_load.py --json`
summaries, one line per engine (pyllm, llama.cpp) on shared axes. matplotlib is an optional dependency
(`pip install 'pyllm[plot]'`), imported here only, and only when a picture is asked for; the Agg backend draws
without a display.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "--plot needs matplotlib: pip install 'pyllm[plot]'"

# one colour and marker per engine, the same in every panel
ENGINE_STYLE = {"pyllm": {"color": "tab:blue", "marker": "o"}, "llama.cpp": {"color": "tab:orange", "marker": "s"}}
OTHER_STYLES = [{"color": c, "marker": m} for c, m in (("tab:green", "^"), ("tab:red", "D"), ("tab:purple", "v"))]
LINESTYLES = ["-", "--", ":", "-."]  # told apart within an engine: one per test size or thread count

TTFT_NOTE = ("TTFT: the pp test's prefill of a p-token prompt on an empty cache, whose last row's logits give the "
             "first token (tokenization and sampling excluded).")
ERROR_NOTE = "Bars: \u00b11 standard deviation over repetitions."
SERVE_NOTE = "Serving: medians over rounds; bars: the range over rounds."

Record = Mapping[str, Any]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raise PlotUnavailable (its message the one-line install hint) when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable(INSTALL_HINT) from None


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU's model name and its widest x86 SIMD extension, from /proc/cpuinfo's text ('' where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ""
    text = cpuinfo
    name, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not name:
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
    return ", ".join(part for part in (name, simd) if part)


def threads_phrase(counts: Sequence[int]) -> str:
    """'1 thread', '2 threads', '1, 2 threads': a title's thread counts."""
    ordered = sorted(set(counts))
    return f"{', '.join(map(str, ordered))} thread{'' if ordered == [1] else 's'}"


# ---- series: records grouped into lines ---------------------------------------------------------------------------

def _style(engine: str, index: int) -> dict:
    return ENGINE_STYLE.get(engine) or OTHER_STYLES[index % len(OTHER_STYLES)]


def _label(engine: str, key: tuple, varying: Sequence[bool], names: Sequence[str]) -> str:
    """The engine's name, and the parts of the series key that differ between its series (e.g. 'tg32, t=2')."""
    parts = [name.format(value) for value, varies, name in zip(key, varying, names, strict=True) if varies]
    return engine + (f" ({', '.join(parts)})" if parts else "")


def _series(records: Sequence[Record], key: Callable[[Record], tuple], x: Callable[[Record], float],
            samples: Callable[[Record], list[float]]) -> dict[tuple, list[tuple[float, float, float]]]:
    """Lines: key -> [(x, mean, standard deviation)] sorted by x; the samples of records with the same key and x
    (repeated rounds) pooled."""
    pooled: dict[tuple, dict[float, list[float]]] = {}
    for record in records:
        pooled.setdefault(key(record), {}).setdefault(x(record), []).extend(samples(record))
    return {k: [(xv, statistics.fmean(s), statistics.stdev(s) if len(s) > 1 else 0.0)
                for xv, s in sorted(points.items()) if s]
            for k, points in pooled.items()}


def _samples_ns(record: Record) -> list[float]:
    return [float(ns) for ns in record.get("samples_ns") or [record["avg_ns"]]]


def _tg_rate(record: Record) -> list[float]:
    return [record["n_gen"] / (ns / 1e9) for ns in _samples_ns(record)]


def _tg_ms_per_token(record: Record) -> list[float]:
    return [ns / 1e6 / record["n_gen"] for ns in _samples_ns(record)]


def _pp_rate(record: Record) -> list[float]:
    return [record["n_prompt"] / (ns / 1e9) for ns in _samples_ns(record)]


def _pp_ms(record: Record) -> list[float]:
    return [ns / 1e6 for ns in _samples_ns(record)]


def _model_name(record: Record) -> str:
    return Path(str(record.get("model_filename", ""))).name


def _draw(ax: Axes, by_engine: Mapping[str, Sequence[Record]], select: Callable[[Record], bool],
          key: Callable[[Record], tuple], key_names: Sequence[str], x: Callable[[Record], float],
          y: Callable[[Record], list[float]]) -> int:
    """One line per engine and series key on ax, with error bars; returns the number of lines drawn."""
    drawn = 0
    for index, (engine, records) in enumerate(by_engine.items()):
        chosen = [r for r in records if select(r)]
        lines = _series(chosen, key, x, y)
        keys = sorted(lines)
        varying = [len({k[i] for k in keys}) > 1 for i in range(len(key_names))]
        for line_index, k in enumerate(keys):
            points = lines[k]
            xs, means, errors = zip(*points, strict=True)
            style = _style(engine, index)
            ax.plot(xs, means, label=_label(engine, k, varying, key_names), color=style["color"],
                    marker=style["marker"], linestyle=LINESTYLES[line_index % len(LINESTYLES)])
            if any(errors):
                ax.errorbar(xs, means, yerr=errors, fmt="none", ecolor=style["color"], capsize=3, alpha=0.7,
                            label="_nolegend_")
            drawn += 1
    return drawn


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str, drawn: int, empty: str, xticks: Sequence[float],
            log_y: bool = False) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel + (" (log scale)" if log_y else ""))
    ax.grid(True, alpha=0.3)
    if not drawn:
        ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", va="center", color="gray")
        return
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)  # speeds compared from zero, so a ratio looks like one
    if xticks:
        ax.set_xticks(sorted(set(xticks)))
        ax.tick_params(axis="x", labelrotation=45 if len(set(xticks)) > 6 else 0)
    ax.legend(fontsize=8)


# ---- panels ------------------------------------------------------------------------------------------------------

THREADS = "t={}"  # llama-bench's -t


def _decode_speed_panel(ax: Axes, by_engine: Mapping[str, Sequence[Record]]) -> None:
    drawn = _draw(ax, by_engine, lambda r: r["n_gen"] > 0 and r["n_prompt"] == 0,
                  lambda r: (_model_name(r), r["n_gen"], r["n_threads"]), ["{}", "tg{}", THREADS],
                  lambda r: r.get("n_depth", 0), _tg_rate)
    depths = [r.get("n_depth", 0) for rs in by_engine.values() for r in rs if r["n_gen"] > 0]
    _finish(ax, "Decode speed against context depth", "context depth (tokens already in the cache)",
            "decode tokens/s", drawn, "no tg tests", depths)


def _tpot_panel(ax: Axes, by_engine: Mapping[str, Sequence[Record]]) -> None:
    drawn = _draw(ax, by_engine, lambda r: r["n_gen"] > 0 and r["n_prompt"] == 0,
                  lambda r: (_model_name(r), r["n_gen"], r["n_threads"]), ["{}", "tg{}", THREADS],
                  lambda r: r.get("n_depth", 0), _tg_ms_per_token)
    depths = [r.get("n_depth", 0) for rs in by_engine.values() for r in rs if r["n_gen"] > 0]
    _finish(ax, "Time per output token (TPOT) against context depth", "context depth (tokens already in the cache)",
            "TPOT (ms/token)", drawn, "no tg tests", depths)


def _prefill_speed_panel(ax: Axes, by_engine: Mapping[str, Sequence[Record]]) -> None:
    """The longest prompt's speed only: one line an engine (the shorter ones are in the TTFT panel)."""
    pp = [r for rs in by_engine.values() for r in rs if r["n_prompt"] > 0 and r["n_gen"] == 0]
    longest = max((r["n_prompt"] for r in pp), default=0)
    drawn = _draw(ax, by_engine, lambda r: r["n_prompt"] == longest and r["n_gen"] == 0,
                  lambda r: (_model_name(r), r["n_threads"]), ["{}", THREADS],
                  lambda r: r.get("n_depth", 0), _pp_rate)
    _finish(ax, f"Prompt processing (pp{longest}) speed against context depth",
            "context depth (tokens already in the cache)", "prompt tokens/s", drawn, "no pp tests",
            [r.get("n_depth", 0) for r in pp])


def _ttft_panel(ax: Axes, by_engine: Mapping[str, Sequence[Record]]) -> None:
    pp = [r for rs in by_engine.values() for r in rs if r["n_prompt"] > 0 and r["n_gen"] == 0]
    depth = min((r.get("n_depth", 0) for r in pp), default=0)  # an empty cache where measured
    drawn = _draw(ax, by_engine, lambda r: r["n_prompt"] > 0 and r["n_gen"] == 0 and r.get("n_depth", 0) == depth,
                  lambda r: (_model_name(r), r["n_threads"]), ["{}", THREADS], lambda r: r["n_prompt"], _pp_ms)
    where = "empty cache" if depth == 0 else f"after {depth} tokens"
    _finish(ax, f"Time to first token against prompt length ({where})", "prompt length (tokens)", "TTFT (ms)",
            drawn, "no pp tests", [r["n_prompt"] for r in pp])


def _serve_panel(ax: Axes, rows: Sequence[Record], field: str, title: str, ylabel: str,
                 log_when_spread: bool = False) -> None:
    """One line per server: field (a median over rounds) against clients, and where the rows carry each round's
    value (field + "_rounds"), their range as a bar."""
    by_server: dict[str, dict[int, Record]] = {}
    for row in rows:
        by_server.setdefault(row["server"], {})[int(row["clients"])] = row
    for index, (server, points) in enumerate(by_server.items()):
        clients = sorted(points)
        medians = [float(points[c][field]) for c in clients]
        style = _style(server, index)
        ax.plot(clients, medians, label=server, color=style["color"], marker=style["marker"])
        rounds = [points[c].get(f"{field}_rounds") or [m] for c, m in zip(clients, medians, strict=True)]
        below = [m - min(r) for m, r in zip(medians, rounds, strict=True)]
        above = [max(r) - m for m, r in zip(medians, rounds, strict=True)]
        if any(below) or any(above):
            ax.errorbar(clients, medians, yerr=[below, above], fmt="none", ecolor=style["color"], capsize=3,
                        alpha=0.7, label="_nolegend_")
    values = [v for row in rows for v in (row.get(f"{field}_rounds") or [row[field]])]
    # a latency that spans more than tenfold (a cold run's prefills beside cached ones) on a log scale, so the
    # widest round does not flatten every median against the axis
    spread = min(values) > 0 and max(values) / min(values) > 10
    _finish(ax, title, "concurrent clients", ylabel, len(by_server), "no serve_load results",
            [int(row["clients"]) for row in rows], log_y=log_when_spread and spread)


def benchmark_figure(bench: Mapping[str, Sequence[Record]] | None = None, serve_load: Sequence[Record] | None = None,
                     title: str = "", notes: Sequence[str] = ()) -> Figure:
    """The figure: with bench records (engine name -> llama-bench-style records), decode tok/s and TPOT against
    depth, prompt processing tok/s against depth and TTFT against prompt length; with serve_load rows
    (`serve_load.py --json`'s "results"), output throughput and TTFT p99 against concurrent clients."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed, and none is opened
    from matplotlib.figure import Figure

    bench = {engine: records for engine, records in (bench or {}).items() if records}
    serve_rows = list(serve_load or [])
    if not bench and not serve_rows:
        raise ValueError("nothing to draw: no bench records and no serve_load results")
    n_rows = (2 if bench else 0) + (1 if serve_rows else 0)
    figure = Figure(figsize=(12, 4.2 * n_rows + 0.9), layout="constrained")
    axes = figure.subplots(n_rows, 2, squeeze=False)
    row = 0
    if bench:
        _decode_speed_panel(axes[0][0], bench)
        _tpot_panel(axes[0][1], bench)
        _ttft_panel(axes[1][0], bench)
        _prefill_speed_panel(axes[1][1], bench)
        row = 2
    if serve_rows:
        _serve_panel(axes[row][0], serve_rows, "output_tok_s", "Serving: output throughput against concurrent clients",
                     "output tokens/s (all clients)")
        _serve_panel(axes[row][1], serve_rows, "ttft_p99_ms", "Serving: TTFT p99 against concurrent clients",
                     "TTFT p99 (ms)", log_when_spread=True)
    if title:
        figure.suptitle(title, fontsize=12)
    footer = ([TTFT_NOTE, ERROR_NOTE] if bench else []) + ([SERVE_NOTE] if serve_rows else []) + list(notes)
    if footer:
        figure.supxlabel("\n".join(footer), fontsize=8, color="dimgray")
    return figure


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Write the figure as a PNG and return its path: 100 dpi, reduced to a 256-colour palette (a few lines of a
    few colours lose nothing to it, and the file is a third the size: small enough to commit)."""
    from io import BytesIO

    from PIL import Image  # matplotlib's own dependency

    path = Path(path)
    rendered = BytesIO()
    figure.savefig(rendered, dpi=100, format="png")
    rendered.seek(0)
    with Image.open(rendered) as image:
        image.convert("RGB").quantize(colors=256).save(path, format="PNG", optimize=True)
    return path
