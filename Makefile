# Two entry points for a fresh machine: `make demo` and `make test`.
# torch is pinned and installed first: an unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_SPEC := torch==2.13.0

.PHONY: install demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[test]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/longbird demo

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/bigbird_vs_hf.py

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info
