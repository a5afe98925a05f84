# Two entry points for a fresh machine: `make demo` and `make test`.
# torch is pinned and installed first: an unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_SPEC := torch==2.13.0

.PHONY: install demo test bench qa-model clean

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

# A small Korean QA model for `longbird answer`: kobigbird-4096 from the embedded MiniLM, fine-tuned at 512 tokens
# on 2,000 questions of the KorQuAD 1.0 training paragraphs (the E4b recipe; reads 4096-token windows afterwards).
QA_MODEL ?= qa-model/kobigbird-minilm-korquad
qa-model: install
	$(VENV)/bin/longbird finetune-qa --format korquad1 --train data/korquad/KorQuAD_v1.0_dev.json \
		--split train --max-examples 2000 --preset kobigbird --max-length 4096 --window-length 512 \
		--doc-stride 128 --negative-fraction 0.1 --learning-rate 1e-4 --batch-size 8 --out $(QA_MODEL) --overwrite

bench: install
	$(PY) benchmarks/bigbird_vs_hf.py

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info
