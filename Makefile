# Every target sets up what it needs, and only that: a virtualenv in .venv with the project
# installed (the core for the demo; the user extras and the project's tools for the tests and
# the docs). Each install says what it installs: the first one takes a minute or two.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --progress-bar off --disable-pip-version-check

.PHONY: demo test test-fast docs docs-serve bench bench-compare clean browser

$(VENV)/.core: pyproject.toml
	@echo "make: creating the virtualenv $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "make: upgrading pip in $(VENV)"
	$(PIP) --quiet --upgrade pip
	@echo "make: installing dflow and its core dependencies (msgpack, cloudpickle, pydantic, croniter) into $(VENV)"
	$(PIP) -e .
	touch $@

$(VENV)/.all: $(VENV)/.core
	@echo "make: installing every extra (redis, kafka, agents, mcp, server, metrics, otel) and the dev tools"
	@echo "      (pytest, pytest-xdist, hypothesis, playwright, tansu, mypy, basedpyright, ruff, radon, mkdocs) into $(VENV)"
	$(PIP) -e '.[all,dev]'
	touch $@

demo: $(VENV)/.core  ## run a flow in local mode and print its step tree
	$(PY) examples/demo.py

# The suite runs on TEST_PROCS processes (pytest-xdist): most of its time is spent waiting on
# worker processes, brokers and kills, so more processes than cores; tests that must not run
# beside each other's load share a group (pytest.mark.xdist_group), which --dist loadgroup
# keeps on one. make test TEST_PROCS=0 runs it on one process.
TEST_PROCS ?= 4

test: $(VENV)/.all browser  ## run the whole test suite (the docs site's strict build included)
	$(PY) -m pytest -n $(TEST_PROCS) --dist loadgroup

test-fast: $(VENV)/.all  ## run the unit tests only: no services, worker processes, browser or tools
	$(PY) -m pytest -n auto -m "not integration and not checks and not slow"

docs: $(VENV)/.all  ## build the documentation site into build/site (open build/site/index.html)
	$(VENV)/bin/mkdocs build --strict

docs-serve: $(VENV)/.all  ## serve the documentation site on http://127.0.0.1:8000, rebuilt on each edit
	$(VENV)/bin/mkdocs serve

# The console's browser tests drive the system's chromium (Debian's package), never a
# browser that Playwright downloads. Installed when missing and apt-get is there; where it
# cannot be, the browser tests skip, except under CI, where this fails.
browser:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo"; \
	  if command -v apt-get >/dev/null 2>&1 && \
	     $$sudo apt-get update -qq && $$sudo apt-get install -y -qq chromium; then \
	    echo "installed chromium for the browser tests"; \
	  elif [ -n "$$CI" ]; then \
	    echo "error: chromium is missing and could not be installed (apt-get install chromium):" \
	         "the console's browser tests must run under CI" >&2; exit 1; \
	  else \
	    echo "warning: chromium is missing and could not be installed: the browser tests will skip" >&2; \
	  fi; \
	fi

bench: $(VENV)/.all  ## run the benchmarks and keep their results in benchmarks/results/
	$(PY) benchmarks/bench_local.py
	@echo "make: installing the peers the benchmarks compare with (benchmarks/requirements.txt: celery, dramatiq, langgraph) into $(VENV)"
	$(PIP) -r benchmarks/requirements.txt
	$(PY) benchmarks/bench_peers.py
	$(PY) benchmarks/bench_distributed.py
	$(PY) benchmarks/bench_agents.py
	$(PY) benchmarks/bench_hiredis.py
	$(PY) benchmarks/bench_crawler.py
	$(PY) benchmarks/bench_pulling.py
	$(PY) benchmarks/bench_runs_list.py
	$(PY) benchmarks/bench_state.py

# The step path of two commits side by side in one run (interleaved rounds, ratios per benchmark):
# by default the state before the structure refactor (f4c2405) against this checkout's HEAD.
BEFORE ?= f4c2405
AFTER ?= HEAD
bench-compare: $(VENV)/.all  ## the step-path benchmarks of BEFORE and AFTER side by side (benchmarks/results/compare.md)
	$(PY) benchmarks/bench_compare.py --before $(BEFORE) --after $(AFTER)

clean:  ## remove the virtualenv, the caches and the built site
	rm -rf $(VENV) .pytest_cache .hypothesis build/site
