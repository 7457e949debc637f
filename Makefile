# make demo: set up .venv if needed, then text → tokens → windows → training → checkpoints, in out/demo/.
# make demo-corpus: the same text as a sharded corpus, in out/demo-corpus/. Each removes only its own
# directory (one the demo made), never the other's.
# make test: the same set-up, then the whole test suite, mypy and ruff; make test-fast: the suite less its slow tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-corpus test test-fast bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) demo/demo.py

demo-corpus: $(STAMP)
	$(PY) demo/demo.py --corpus

test: $(STAMP)
	$(PY) -m pytest -q
	$(PY) -m mypy
	$(PY) -m ruff check .

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf out .pytest_cache .hypothesis
