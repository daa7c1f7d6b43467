# pyllm - set-up, build and test entry points. See README.md.
PYTHON ?= python3
PIP = $(PYTHON) -m pip
CC ?= cc
CFLAGS_C = -std=c11 -O2 -g -Wall -Wextra -Werror -ffp-contract=off -pthread
SANITIZE = -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
C_SOURCES = $(filter-out csrc/tests/%,$(wildcard csrc/*.c))
C_HEADERS = $(wildcard csrc/*.h)

.PHONY: help install build models chat test test-py test-c test-asan lint clean

help:
	@echo "make chat       install pyllm, fetch the default model, show it (the chat arrives with the model issue)"
	@echo "make test       install the test dependencies and run every test (what CI runs)"
	@echo "make test-asan  the C kernel tests under AddressSanitizer + UndefinedBehaviorSanitizer"
	@echo "make models     fetch the catalogue models the tests use into models/"
	@echo "make build      rebuild the C core after editing csrc/"

install:
	$(PIP) install -q -e '.[test]'

build:
	$(PIP) install -q --no-deps -e .

models: install
	$(PYTHON) -m pyllm.cli pull smollm2-135m-instruct
	$(PYTHON) -m pyllm.cli pull gemma3-270m

chat: install
	$(PYTHON) -m pyllm.cli info smollm2-135m-instruct

csrc/tests/test_kernels: $(C_SOURCES) $(C_HEADERS) csrc/tests/test_kernels.c
	$(CC) $(CFLAGS_C) $(C_SOURCES) csrc/tests/test_kernels.c -o $@ -lm

csrc/tests/test_kernels_asan: $(C_SOURCES) $(C_HEADERS) csrc/tests/test_kernels.c
	$(CC) -std=c11 -Wall -Wextra -Werror -ffp-contract=off -pthread $(SANITIZE) $(C_SOURCES) csrc/tests/test_kernels.c -o $@ -lm

test-c: csrc/tests/test_kernels
	./csrc/tests/test_kernels

test-asan: csrc/tests/test_kernels_asan
	./csrc/tests/test_kernels_asan

test-py: models
	$(PYTHON) -m pytest -q

lint:
	$(PYTHON) -m ruff check pyllm tests

test: install models lint test-c test-asan test-py

clean:
	rm -rf build *.egg-info pyllm/*.so csrc/tests/test_kernels csrc/tests/test_kernels_asan
