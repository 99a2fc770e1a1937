# `make demo` and `make test` each create or reuse .venv and install only what changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test docs bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dlvm-eq demo

# mypy first so that the log shows the type check (tests/test_types.py enforces it too); the
# tests in one process per core (pytest-xdist; the Ray tests share one, their xdist_group)
test: $(STAMP)
	$(PY) -m mypy
	$(PY) -m pytest -n auto --dist loadgroup tests

# the documentation site into site/, warnings as errors (the test extra installs MkDocs)
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build dist site
