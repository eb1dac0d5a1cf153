# Two commands on a fresh machine: `make demo` and `make test` (see README.md).
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.negft-installed

.PHONY: install demo test test-slow bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) train.py recipe=demo

test: $(STAMP)
	$(PY) -m pytest -q -n auto --dist loadfile

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) bench/bench_world.py 20000
