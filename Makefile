# Two commands on a fresh machine: `make run` (main job on shipped data) and `make test` (the test suite).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
OUT    ?= results/compare

.PHONY: run run-one test test-slow fuzz bench bench-10m lint clean compiled pure

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

run: $(VENV)/.stamp-run
	$(VENV)/bin/dvasim compare --out $(OUT)

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
	$(PY) benchmarks/bench_speed.py
	$(PY) benchmarks/bench_sim.py
	$(PY) benchmarks/bench_study.py

bench-10m: $(VENV)/.stamp-run
	$(PY) benchmarks/bench_memory.py

# the optional compiled core: mypyc builds the hot modules listed in dvasim/compiled.py in place, next to their
# .py files (tools/compile_core.py; needs a C compiler); `make pure` removes them. The pure path is the default.
compiled: $(VENV)/.stamp-run
	$(PY) -c "import mypyc, setuptools" 2>/dev/null || $(PY) -m pip install -q "mypy>=1.17" setuptools
	$(PY) tools/compile_core.py

pure:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) tools/compile_core.py --clean

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) results .pytest_cache
