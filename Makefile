# Two commands work on a fresh machine: `make serve` and `make test` (each sets everything up first).
# EXTRAS picks the install: the CPU build of ONNX Runtime by default; on a CUDA machine
# `make EXTRAS=gpu,bench,test` (one ONNX Runtime build per install: cpu or gpu, never both).
PYTHON ?= python3
EXTRAS ?= cpu,bench,test,tensorrt-rtx,ray
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup serve test

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/s1omni serve $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
