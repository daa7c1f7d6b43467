"""cffi (API mode) build of the C core: compiled by `pip install`, no manual step.

The cdef is the region of csrc/pyllm.h between the cffi-begin and cffi-end
markers, so the header stays the one source of truth.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"

# Every C file of the core (csrc/<layer>/*.c; csrc/README.md says what each folder holds): a new backend's
# files are built by being there. The C tests (csrc/tests) have mains of their own.
SOURCES = sorted(str(p.relative_to(CSRC)) for p in CSRC.glob("*/*.c") if p.parent.name != "tests")

# -ffp-contract=off: the reference kernels must not have a*b+c fused behind
# their back (the dequantizers are bit-identical to gguf's numpy, and the
# vec_dots use fmaf() exactly where they mean it). SIMD files raise their own
# target with pragmas, so one build runs on any x86-64 (or any aarch64: csrc/x86
# compiles to no kernels there, csrc/arm to none on x86).
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-ffp-contract=off", "-fno-math-errno", "-pthread"]


def _cdef() -> str:
    header = (CSRC / "pyllm.h").read_text()
    match = re.search(r"/\* cffi-begin \*/(.*?)/\* cffi-end \*/", header, re.S)
    if match is None:
        raise RuntimeError("csrc/pyllm.h has no cffi-begin/cffi-end region")
    return re.sub(r"/\*.*?\*/", "", match.group(1), flags=re.S)


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "pyllm._pyllm_c",
    '#include "pyllm.h"',
    sources=[os.path.relpath(CSRC / s, ROOT) for s in SOURCES],
    include_dirs=[os.path.relpath(CSRC, ROOT)],
    extra_compile_args=CFLAGS + os.environ.get("PYLLM_EXTRA_CFLAGS", "").split(),
    extra_link_args=["-pthread", "-lm"] + os.environ.get("PYLLM_EXTRA_LDFLAGS", "").split(),
)

