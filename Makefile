# Every target sets up what it needs, and only that: a virtualenv in .venv with the project
# installed (the core for the demo; everything the tests use for the tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test bench clean

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.all: $(VENV)/.core
	$(PY) -m pip install --quiet -e '.[all]'
	touch $@

demo: $(VENV)/.core  ## run a flow in local mode and print its step tree
	$(PY) examples/demo.py

test: $(VENV)/.all  ## run the whole test suite
	$(PY) -m pytest

bench: $(VENV)/.all  ## run the benchmarks and keep their results in benchmarks/results/
	$(PY) benchmarks/bench_local.py
	$(PY) -m pip install --quiet 'celery[redis]' 'dramatiq[redis]' langgraph
	$(PY) benchmarks/bench_distributed.py
	$(PY) benchmarks/bench_agents.py
	$(PY) benchmarks/bench_crawler.py
	$(PY) benchmarks/bench_pulling.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
