# Two commands a new user needs: `make demo` and `make test`. Each works on a fresh machine:
# it creates .venv if missing, installs the project (CPU torch first), then runs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# CPU build of torch for the venv; users with GPUs install their CUDA build first (see README).
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test lint format install bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,llm]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/clip-sandbox compare

test: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -n 2 -q

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: install
	$(PY) benchmarks/objectives.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
