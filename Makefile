# Two set-up commands: `make demo` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test lint typecheck gpu clean

# torch==2.13.0 is a CPU build on local disk here; a bare `torch` would pull several GB.
# triton 3.6.0 matches the GPU machine, and its interpreter needs numpy < 2.4.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 triton==3.6.0 "numpy<2.4"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/attncc demo examples/gqa_causal.attn

lint: install
	$(VENV)/bin/ruff check attncc tests benchmarks
	$(VENV)/bin/ruff format --check attncc tests benchmarks

typecheck: install
	$(VENV)/bin/mypy

test: lint typecheck
	$(VENV)/bin/pytest -q

gpu:
	bash benchmarks/gpu_suite.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
