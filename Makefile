# Two commands work on a fresh machine: `make serve` and `make test` (each sets everything up first).
# EXTRAS picks the install: the CPU build of ONNX Runtime by default; on a CUDA machine
# `make EXTRAS=gpu,bench,test` (one ONNX Runtime build per install: cpu or gpu, never both).
PYTHON ?= python3
EXTRAS ?= cpu,bench,test,tensorrt-rtx,ray,fla
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# ONNX Runtime's C API headers, which `s1omni build --gated-delta-kernel ChunkedGatedDeltaRule` compiles its op
# library against: no ONNX Runtime wheel ships them, Debian's libonnxruntime-dev does (the op keeps to this API version).
ORT_DEV_DEB := libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb
ORT_DEV_URL := http://deb.debian.org/debian/pool/main/o/onnxruntime/$(ORT_DEV_DEB)
ORT_DEV_SHA256 := 14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08

.PHONY: setup serve test

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[$(EXTRAS)]'
	curl -fsSL -o $(VENV)/$(ORT_DEV_DEB) $(ORT_DEV_URL)
	echo '$(ORT_DEV_SHA256)  $(VENV)/$(ORT_DEV_DEB)' | sha256sum -c --quiet
	rm -rf $(VENV)/ort-dev $(VENV)/include/onnxruntime && dpkg-deb -x $(VENV)/$(ORT_DEV_DEB) $(VENV)/ort-dev
	mkdir -p $(VENV)/include && mv $(VENV)/ort-dev/usr/include/onnxruntime $(VENV)/include/ && rm -rf $(VENV)/ort-dev $(VENV)/$(ORT_DEV_DEB)
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/s1omni serve $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
