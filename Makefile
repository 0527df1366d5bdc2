# memeflow — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast lint clean system-deps

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[ml,dev]'
	touch $(STAMP)

install: $(STAMP)

system-deps:
	@bash scripts/system-deps.sh

demo: install system-deps
	$(VENV)/bin/memeflow demo

test: install system-deps
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-fast: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow"

lint: install
	$(VENV)/bin/ruff check app tests bench

clean:
	rm -rf $(VENV) var build *.egg-info
