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
	# byte-code for negft's own files, as pip writes it for an installed package's (an editable install writes
	# none): each process then loads them instead of compiling them (about 2 s a process on 2 cores), also
	# where PYTHONDONTWRITEBYTECODE is set
	$(PY) -m compileall -q negft
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) train.py recipe=demo

# one pytest-xdist worker per core, each file whole on one worker (its module fixtures run once), the longest
# files first (tests/conftest.py LONGEST_FIRST);
# PYTEST_ARGS adds options, e.g. make test PYTEST_ARGS=--durations=20
test: $(STAMP)
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) bench/bench_world.py 20000
