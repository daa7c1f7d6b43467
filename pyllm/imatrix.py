"""Reads llama.cpp's importance matrices (llama-imatrix's output) for `pyllm quantize --imatrix`.

Two formats. The GGUF one holds, for each weight matrix NAME, an F32 tensor NAME.in_sum2 (the sums of the squared
activations each column met, one row an expert) and NAME.counts (how many activations each expert's row summed), with
the keys imatrix.datasets, imatrix.chunk_count and imatrix.chunk_size. The legacy .dat one is a count of entries, then
for each: name length (i32), name, ncall (i32), nval (i32), nval floats already averaged and multiplied by ncall;
optionally the chunk count (i32) and a dataset name (i32 length, bytes). Either way a matrix's importance is its sums
divided by its counts, as llama-quantize computes it (a row no activation reached weighs 1).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .gguf import GGUF_MAGIC, GGUFError, GGUFFile
from .strings import StringArray

__all__ = ["Imatrix", "ImatrixError", "load_imatrix"]


class ImatrixError(ValueError):
    """A file that is not a readable importance matrix (the message starts with its path)."""


@dataclass
class Imatrix:
    """Tensor name -> per-column importance (n floats, or n per expert); the datasets and chunk count it was made
    from."""

    entries: dict[str, np.ndarray] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0


def load_imatrix(path: str | os.PathLike[str]) -> Imatrix:
    path = Path(path)
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ImatrixError(f"{path}: cannot read the imatrix: {exc.strerror or exc}") from None
    return _load_gguf(path) if magic == GGUF_MAGIC else _load_legacy(path)


def _load_gguf(path: Path) -> Imatrix:
    try:
        f = GGUFFile(path)
    except GGUFError as exc:
        raise ImatrixError(str(exc)) from None
    with f:
        if not all(k in f.metadata for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")):
            raise ImatrixError(f"{path}: missing imatrix metadata (imatrix.datasets, chunk_count, chunk_size)")
        datasets = f.metadata["imatrix.datasets"]
        result = Imatrix(datasets=list(datasets) if isinstance(datasets, StringArray) else [],
                         chunk_count=int(f.metadata["imatrix.chunk_count"]))
        sums, counts = {}, {}
        for name, info in f.tensors.items():
            for suffix, into in ((".in_sum2", sums), (".counts", counts)):
                if name.endswith(suffix) and len(name) > len(suffix):
                    if info.type != 0:
                        raise ImatrixError(f"{path}: {name} must be F32")
                    into[name[: -len(suffix)]] = np.array(f.array(name), dtype=np.float32).reshape(-1)
        if not sums and not counts:
            raise ImatrixError(f"{path}: no importance data in the file")
        for name in sorted(set(sums) | set(counts)):
            if name not in sums or name not in counts:
                raise ImatrixError(f"{path}: mismatched sums and counts for {name}")
            raw_counts = counts[name].astype(np.float64)  # rounded half away from zero, as llama.cpp's lround
            s, c = sums[name], np.sign(raw_counts) * np.floor(np.abs(raw_counts) + 0.5)
            if c.size == 0 or s.size % c.size:
                raise ImatrixError(f"{path}: {name} has {s.size} sums for {c.size} counts")
            per_expert = s.reshape(c.size, -1)
            count = c.astype(np.float32)[:, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                result.entries[name] = np.where(count > 0, per_expert / np.where(count > 0, count, 1), np.float32(1)
                                                ).astype(np.float32).reshape(-1)
        return result


def _load_legacy(path: Path) -> Imatrix:
    data = path.read_bytes()
    pos = 0

    def take(fmt: str, what: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ImatrixError(f"{path}: not an imatrix (neither GGUF nor llama.cpp's legacy format): "
                               f"the file ends inside {what}")
        values = struct.unpack_from(fmt, data, pos)
        pos += size
        return values

    (n_entries,) = take("<i", "the entry count")
    if n_entries < 1:
        raise ImatrixError(f"{path}: no data in the imatrix (entry count {n_entries})")
    result = Imatrix()
    for i in range(n_entries):
        (length,) = take("<i", f"entry {i + 1}'s name length")
        if length < 0:
            raise ImatrixError(f"{path}: entry {i + 1} has a negative name length")
        (raw_name,) = take(f"<{length}s", f"entry {i + 1}'s name")
        name = raw_name.split(b"\0", 1)[0].decode("utf-8", errors="replace")
        ncall, nval = take("<ii", f"entry {i + 1}'s counts")
        if nval < 1:
            raise ImatrixError(f"{path}: entry {i + 1} ({name}) has {nval} values")
        sums = np.array(take(f"<{nval}f", f"entry {i + 1}'s values"), dtype=np.float32)
        result.entries[name] = (sums / np.float32(ncall)).astype(np.float32) if ncall > 0 else sums
    if pos < len(data):  # the optional trailer
        try:
            (result.chunk_count,) = take("<i", "the chunk count")
            (length,) = take("<i", "the dataset name length")
            if length > 0:
                (dataset,) = take(f"<{length}s", "the dataset name")
                result.datasets.append(dataset.split(b"\0", 1)[0].decode("utf-8", errors="replace"))
        except ImatrixError:
            pass
    return result
