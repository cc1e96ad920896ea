# Every target sets up what it needs, and only that: a virtualenv in .venv with the project
# installed (the core for the demo; everything the tests use for the tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test bench clean browser

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

test: $(VENV)/.all browser  ## run the whole test suite
	$(PY) -m pytest

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
	$(PY) -m pip install --quiet 'celery[redis]' 'dramatiq[redis]' langgraph
	$(PY) benchmarks/bench_distributed.py
	$(PY) benchmarks/bench_agents.py
	$(PY) benchmarks/bench_crawler.py
	$(PY) benchmarks/bench_pulling.py
	$(PY) benchmarks/bench_runs_list.py
	$(PY) benchmarks/bench_state.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
