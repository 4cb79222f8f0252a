# Two commands on a fresh machine: `make run` (main job on shipped data) and `make test` (the test suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
OUT    ?= results/compare

.PHONY: run run-one test triton-env triton-check test-slow fuzz bench bench-10m lint clean compiled pure docs notebooks experiments gpu-matrix gpu-matrix-cpu gpu-wheels

# One build: `pip install -e .` compiles the core with mypyc in place where a C compiler exists (setup.py; the pure
# modules where none does, same results) and both targets use it. The dev extras come as their requirements alone
# (tools/extras.py), so `make test` after `make run` does not build the package a second time. A checkout edited
# after its build runs the pure modules (the build's hashes no longer match) until `make compiled` rebuilds it;
# `dvasim --version` says which core runs, and why.
$(VENV)/.stamp-run: pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.stamp-dev: $(VENV)/.stamp-run tools/extras.py
	$(PY) tools/extras.py dev replay > $(VENV)/extras.txt
	$(PY) -m pip install -q -r $(VENV)/extras.txt
	touch $@

run: $(VENV)/.stamp-run
	@$(VENV)/bin/dvasim --version
	$(VENV)/bin/dvasim compare --out $(OUT)

run-one: $(VENV)/.stamp-run
	$(VENV)/bin/dvasim run configs/default.toml --out results/default

# The real Triton server (issue 46; dvasim/engines/triton/server.py): nvidia-pytriton's tritonserver 2.51.0 (r24.10)
# in its own environment, .venv/triton, made from the system Python 3.11 whose libpython its Python backend's stub
# links; the wheel and its tritonclient need numpy<2 and protobuf<5, which dvasim's .venv does not keep.
TRITON_PY  ?= /usr/bin/python3.11
TRITON_ENV := $(VENV)/triton
TRITON_PINS := 'nvidia-pytriton==0.7.0' 'tritonclient[grpc]==2.51.0'
$(TRITON_ENV)/.stamp: Makefile
	test -x $(TRITON_ENV)/bin/python || $(TRITON_PY) -m venv $(TRITON_ENV)
	$(TRITON_ENV)/bin/pip install -q $(TRITON_PINS)
	touch $@

triton-env: $(TRITON_ENV)/.stamp

# the simulator against the real Triton server (experiments/validation/triton/README.md): calibrate, fit, predict
# 14 cases each served twice (about 6 minutes on the 2-core VM); --tiny is the CI version (tests/experiments)
triton-check: $(VENV)/.stamp-dev $(TRITON_ENV)/.stamp
	$(PY) experiments/validation/triton/matrix.py --out experiments/validation/triton/results

test: $(VENV)/.stamp-dev $(TRITON_ENV)/.stamp
	$(PY) -m pytest -q

test-slow: $(VENV)/.stamp-dev
	$(PY) -m pytest -q -m slow

# fuzz: 2,000 random simulator scenarios, and per subcommand a share of 2,000 generated bad inputs (mutations of good
# ones; the issue's repro cases as seeds): a case breaking the contract is appended to tests/corpus/<command>.jsonl
fuzz: $(VENV)/.stamp-dev
	DVASIM_FUZZ_EXAMPLES=2000 DVASIM_FUZZ_SAVE=tests/corpus $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz.py \
		tests/test_bad_input_corpus.py tests/engines/test_long_time.py --hypothesis-show-statistics

bench: $(VENV)/.stamp-run
	$(PY) benchmarks/bench_ratio.py --stacks gpu-only,triton-tensorrt --profile
	$(PY) benchmarks/bench_speed.py
	$(PY) benchmarks/bench_sim.py
	$(PY) benchmarks/bench_study.py
	$(PY) benchmarks/bench_study_rules.py

bench-10m: $(VENV)/.stamp-run
	$(PY) benchmarks/bench_memory.py

# `make compiled` rebuilds the compiled core in place after an edit (tools/compile_core.py, the builder pip install
# runs; needs a C compiler); `make pure` removes it (the pure modules then run).
compiled: $(VENV)/.stamp-dev
	$(PY) tools/compile_core.py

pure:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) tools/compile_core.py --clean

# The GPU matrix (issue 35; experiments/validation/gpu/README.md). `make gpu-matrix` runs on a lent GPU, from the
# repository root, with the image's python3 (no virtual environment there): profile, replay, co-runs, fit, predict,
# in about 8 minutes; the wheels the image lacks come from .whl (`make gpu-wheels` downloads them here first).
# Device tool: run(command="make gpu-matrix", carry=[".whl"], timeout_s=600). `make gpu-matrix-cpu` is the same
# command on this CPU, tiny (seconds; its outputs under results/gpu_matrix/).
GPU_PY ?= python3
gpu-matrix:
	PYTHONUNBUFFERED=1 $(GPU_PY) experiments/validation/gpu_matrix.py --wheels .whl $(GPU_MATRIX_ARGS)

gpu-matrix-cpu: $(VENV)/.stamp-dev
	$(PY) experiments/validation/gpu_matrix.py --cpu --tiny $(GPU_MATRIX_ARGS)

gpu-wheels: $(VENV)/.stamp-run
	$(PY) experiments/validation/gpu_matrix.py --download-wheels .whl

# the documentation site (docs/, mkdocs.yml) into site/, strictly: a broken link or a page missing from the nav fails
docs: $(VENV)/.stamp-dev
	$(VENV)/bin/mkdocs build --strict

# every notebook under notebooks/, run top to bottom by jupyter execute (nbclient, a dev extra); the committed
# files are not rewritten
notebooks: $(VENV)/.stamp-dev
	cd notebooks && $(abspath $(VENV))/bin/jupyter execute --timeout=-1 *.ipynb

# every committed experiment rerun from this tree into results/rerun/ (the committed results are not touched),
# each timed and its CSVs checked against the committed ones (experiments/rerun_all.py); EXPERIMENTS_ARGS=--long
# adds the paper rerun's figures, the stack question and the long-run check (hours on 2 cores)
experiments: $(VENV)/.stamp-run
	$(PY) experiments/rerun_all.py $(EXPERIMENTS_ARGS)

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) results .pytest_cache
