# make demo: set up .venv if needed, then text → tokens → windows → training → checkpoints, in out/demo/.
# make demo-corpus: the same text as a sharded corpus, in out/demo-corpus/. Each removes only its own
# directory (one the demo made), never the other's.
# make test: the same set-up, then the whole test suite, mypy and ruff; make test-fast: the suite less its slow tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-corpus test test-fast bench clean

$(STAMP): pyproject.toml setup.py pskd_jax/corpus/_segments.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) demo/demo.py

demo-corpus: $(STAMP)
	$(PY) demo/demo.py --corpus

# The suite runs in a process per logical CPU (pytest-xdist, at most 4), a test file's tests in one process,
# so that a file's shared set-up (a server, a module fixture) is made once.
PYTEST_PARALLEL ?= -n logical --maxprocesses 4 --dist loadfile

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_PARALLEL)
	$(PY) -m mypy
	$(PY) -m ruff check .

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_PARALLEL)

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf out .pytest_cache .hypothesis
