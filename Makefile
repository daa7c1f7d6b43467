# pyllm - set-up, build and test entry points. See README.md.
PYTHON ?= python3
PIP = $(PYTHON) -m pip
CC ?= cc
CFLAGS_C = -std=c11 -O2 -g -Wall -Wextra -Werror -ffp-contract=off -pthread
SANITIZE = -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
C_SOURCES = $(filter-out csrc/tests/%,$(wildcard csrc/*/*.c))

.PHONY: help install build models chat test test-py test-c test-asan test-asan-py test-arm arm-toolchain bench-kernels lint \
	clean check-arm64-install

help:
	@echo "make chat       install pyllm, fetch the default model (Qwen2.5-Coder-1.5B, 1.1 GB) and chat with it"
	@echo "make test       install the test dependencies and run every test (what CI runs; test-arm included)"
	@echo "make test-asan  the C kernel tests under AddressSanitizer + UndefinedBehaviorSanitizer"
	@echo "make test-arm   the C tests cross-compiled for aarch64, run under qemu (NEON, dotprod; installs the tools)"
	@echo "make test-asan-py  forward passes of every architecture through the C core under ASan + UBSan"
	@echo "make models     fetch the catalogue models the tests use into models/"
	@echo "make check-arm64-install  pip install in an emulated arm64 Debian, logits against this machine's (root; 10-15 min)"
	@echo "make build      rebuild the C core after editing csrc/"

install:
	$(PIP) install -q -e '.[test]'

build:
	$(PIP) install -q --no-deps -e .

# The small models the tests read; never the 1.1 GB default chat model.
models: install
	$(PYTHON) -m pyllm.cli pull smollm2-135m-instruct
	$(PYTHON) -m pyllm.cli pull gemma3-270m

# MODEL=name (see `pyllm list`) chats with another model; empty: the default chat model.
MODEL ?=
chat: install
	$(PYTHON) -m pyllm.cli pull $(MODEL)
	$(PYTHON) -m pyllm.cli chat $(MODEL)

C_TESTS = test_kernels test_ops test_simd_stress test_forward test_quantize
C_DEPS = $(C_SOURCES) $(wildcard csrc/*.h csrc/*/*.h csrc/*/*.inc)

csrc/tests/%: csrc/tests/%.c $(C_DEPS)
	$(CC) $(CFLAGS_C) -Icsrc $(C_SOURCES) $< -o $@ -lm

csrc/tests/%_asan: csrc/tests/%.c $(C_DEPS)
	$(CC) -std=c11 -Wall -Wextra -Werror -ffp-contract=off -pthread $(SANITIZE) -Icsrc $(C_SOURCES) $< -o $@ -lm

# The C tests: every SIMD tier the CPU has against the generic kernels, bit for bit.
test-c: $(addprefix csrc/tests/,$(C_TESTS))
	@for t in $^; do echo "== $$t"; ./$$t || exit 1; done

test-asan: $(addprefix csrc/tests/,$(addsuffix _asan,$(C_TESTS)))
	@for t in $^; do echo "== $$t"; ./$$t || exit 1; done

# The C core built a second time under ASan + UBSan (into build/asan-py, the Python sources linked beside it),
# driven from Python: forward passes of each architecture's tiny model, a hostile file's refusal, and 1000 files
# of the loader fuzzer (each loaded and run on this build: a sanitizer's report is a crash). -O0: the
# SIMD files take minutes to build at -O1 under the sanitizers, the whole build 20 s at -O0.
ASAN_PY = build/asan-py
test-asan-py:
	rm -rf $(ASAN_PY) && mkdir -p $(ASAN_PY)/pyllm
	PYLLM_EXTRA_CFLAGS="-O0 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	PYLLM_EXTRA_LDFLAGS="-fsanitize=address,undefined" \
	    $(PYTHON) setup.py -q build_ext --build-lib $(ASAN_PY) --build-temp $(ASAN_PY)/temp
	ln -s $(abspath $(wildcard pyllm/*.py) $(filter-out %/__pycache__/,$(wildcard pyllm/*/))) $(ASAN_PY)/pyllm/
	LD_PRELOAD=$$($(CC) -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
	    PYTHONPATH=$(ASAN_PY) $(PYTHON) tests/sanitized_forward.py $(ASAN_PY)
	$(PYTHON) -m tests.fuzz.gguf_fuzz --files 1000 --seed 3 --sanitized $(ASAN_PY)

# ARM under emulation: the C tests cross-compiled for aarch64 (static: no target libraries needed at run time) and
# run under qemu-user, once as a CPU with dotprod and i8mm (-cpu max) and once as one with neither (cortex-a53): every
# tier each CPU runs against generic, bit for bit, as test-c does. The cross compiler, its libc and qemu are installed
# through apt-get where they are missing (as root, or by sudo).
ARM_CC = aarch64-linux-gnu-gcc
ARM_QEMU = qemu-aarch64
ARM_CPUS = max cortex-a53
ARM_PACKAGES = gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
ARM_DIR = build/arm
ARM_OBJS = $(patsubst csrc/%.c,$(ARM_DIR)/%.o,$(C_SOURCES))

arm-toolchain:
	@if ! command -v $(ARM_CC) >/dev/null || ! command -v $(ARM_QEMU) >/dev/null \
	    || [ ! -e "$$($(ARM_CC) -print-file-name=libc.a)" ]; then \
	    SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(ARM_PACKAGES); \
	fi

$(ARM_DIR)/%.o: csrc/%.c $(filter-out %.c,$(C_DEPS)) | arm-toolchain
	@mkdir -p $(dir $@)
	$(ARM_CC) $(CFLAGS_C) -Icsrc -c $< -o $@

$(ARM_DIR)/tests/%: $(ARM_DIR)/tests/%.o $(ARM_OBJS)
	$(ARM_CC) -static -pthread $^ -o $@ -lm
.PRECIOUS: $(ARM_DIR)/%.o

# The package itself on aarch64: `pip install` in an arm64 Debian root under qemu-user, a real model's logits on each
# ARM tier against this machine's (not in `make test`: it needs root and 10-15 minutes).
check-arm64-install: models
	tests/arm64_install.sh

# Then test_forward's digest of a forward pass, under emulation, against the native build's: the same bits.
test-arm: $(addprefix $(ARM_DIR)/tests/,$(C_TESTS)) csrc/tests/test_forward
	@for cpu in $(ARM_CPUS); do for t in $(addprefix $(ARM_DIR)/tests/,$(C_TESTS)); do \
	    echo "== qemu-aarch64 -cpu $$cpu $$t"; $(ARM_QEMU) -cpu $$cpu ./$$t || exit 1; done; done
	@want=$$(./csrc/tests/test_forward | sed -n 's/.*digest //p'); for cpu in $(ARM_CPUS); do \
	    got=$$($(ARM_QEMU) -cpu $$cpu ./$(ARM_DIR)/tests/test_forward | sed -n 's/.*digest //p'); \
	    echo "== forward pass digest: native $$want, aarch64 -cpu $$cpu $$got"; [ -n "$$want" ] && [ "$$want" = "$$got" ] || exit 1; done

# ns per 4096-element row of every vec_dot kernel, per tier (one thread)
bench-kernels: csrc/tests/test_simd_stress
	./csrc/tests/test_simd_stress 0 bench

test-py: models
	$(PYTHON) -m pytest -q

lint:
	$(PYTHON) -m ruff check pyllm tests

test: install models lint test-c test-arm test-asan test-asan-py test-py

clean:
	rm -rf build *.egg-info pyllm/*.so $(addprefix csrc/tests/,$(C_TESTS) $(addsuffix _asan,$(C_TESTS)))
