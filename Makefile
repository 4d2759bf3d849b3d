# Quick start (a fresh machine with Python >= 3.10):
#   make demo   # venv + install + fetch models/media, then stream a real video through the daemon
#   make test   # venv + install + fetch, then the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install assets clean

$(BIN)/streamer: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

install: $(BIN)/streamer

assets: install
	$(BIN)/streamer models fetch >/dev/null

demo: assets
	$(BIN)/python tools/demo.py

test: assets
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) results .pytest_cache
