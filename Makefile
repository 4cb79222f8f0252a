# Two commands on a fresh machine: `make run` (main job on shipped data) and `make test` (the test suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
OUT    ?= results/compare

.PHONY: run run-one test test-slow fuzz bench bench-10m lint clean compiled pure gpu-matrix gpu-matrix-cpu gpu-wheels

$(VENV)/.stamp-run: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.stamp-dev: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,replay]'
	touch $(VENV)/.stamp-run $@

# `make run` runs the main job on the compiled core when it can be built: a copy of the package in
# $(COMPILED), its hot modules built with mypyc (tools/compile_core.py --copy-to), rebuilt whenever a source changes;
# the checkout itself stays pure (the tests import it). Without a C compiler (or mypy) it runs the pure-Python
# package: same results, bit for bit, slower. DVASIM_CORE=pure skips the build.
COMPILED := $(VENV)/compiled
SOURCES  := $(shell find dvasim -name '*.py' 2>/dev/null)

$(COMPILED)/.stamp: $(VENV)/.stamp-run tools/compile_core.py $(SOURCES)
	@rm -rf $(COMPILED)
	@$(PY) -c "import mypyc, setuptools" 2>/dev/null || $(PY) -m pip install -q "mypy>=1.17" setuptools \
		|| echo "make run: could not install mypy: the pure-Python core runs"
	@$(PY) tools/compile_core.py --copy-to $(COMPILED) && touch $@ \
		|| echo "make run: the compiled core could not be built: the pure-Python core runs"

run: $(VENV)/.stamp-run
	@if [ "$(DVASIM_CORE)" != pure ]; then $(MAKE) --no-print-directory $(COMPILED)/.stamp; fi
	@if [ "$(DVASIM_CORE)" != pure ] && [ -f $(COMPILED)/.stamp ]; then \
		echo "core: compiled (mypyc, $(COMPILED))"; PYTHONPATH=$(COMPILED) $(VENV)/bin/dvasim compare --out $(OUT); \
	else echo "core: pure Python"; $(VENV)/bin/dvasim compare --out $(OUT); fi

run-one: $(VENV)/.stamp-run
	$(VENV)/bin/dvasim run configs/default.toml --out results/default

test: $(VENV)/.stamp-dev
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

# the optional compiled core: mypyc builds the hot modules listed in dvasim/compiled.py in place, next to their
# .py files (tools/compile_core.py; needs a C compiler); `make pure` removes them. The pure path is the default.
compiled: $(VENV)/.stamp-run
	$(PY) -c "import mypyc, setuptools" 2>/dev/null || $(PY) -m pip install -q "mypy>=1.17" setuptools
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

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) results .pytest_cache
