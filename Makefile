# Two entry points for a fresh machine: `make demo` and `make test`.
# torch is pinned and installed first: an unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_SPEC := torch==2.13.0

.PHONY: install demo test docs lint bench qa-model long-reader clean

# pip byte-compiles what it installs in one process (93 of about 140 s on a 2-core AVX2-only machine, 2026-11-27);
# so it installs with --no-compile and compileall compiles the same files on every core (-j 0), in about 60 s. Its
# exit status is not checked: as under pip, a file written for another Python version does not compile (torch's
# testing/_internal/py312_intrinsics.py on 3.11) and is never imported; a .pyc that is missing only costs time.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet --no-compile "$(TORCH_SPEC)"
	$(PIP) install --quiet --no-compile -e ".[test,docs,lint]"
	$(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null || true
	touch $@

install: $(VENV)/.installed

# The docs and lint tools come with the install: one pip resolution instead of three (on a 2-core AVX2-only machine,
# 2026-11-27, the two separate installs took 18 and 10 s, the same packages inside the one install 12 to 23 s more). A
# .venv made before they joined it gets them when `make docs` or `make lint` first finds them missing (make decides
# to remake a missing target before the install has run, hence the test: a fresh clone installs them once).
$(VENV)/bin/mkdocs: | $(VENV)/.installed
	test -x $@ || $(PIP) install --quiet -e ".[docs]"
$(VENV)/bin/lint-imports: | $(VENV)/.installed
	test -x $@ || $(PIP) install --quiet -e ".[lint]"

# --overwrite: the demo's own default output (demo-output/), which demos from before its longbird_demo.json record
# would otherwise keep (a demo replaces unasked only outputs that record marks as a demo's)
demo: install
	$(VENV)/bin/longbird demo --overwrite

# One pytest-xdist worker per core, each file on one worker (module fixtures built once), each worker with its share
# of the cores (tests/conftest.py): 13 instead of 18 minutes on a 2-core AVX2-only machine (2026-11-27), since most
# tests run tiny models whose time is Python and dispatch, which a second thread does not shorten. Files are handed
# out in collection order, the slowest first (--no-loadscope-reorder; tests/conftest.py). The slowest tests are listed
# at the end.
test: install
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=15

# The documentation site (docs/, mkdocs.yml) into site/. --strict turns every warning into a failure: a broken link or
# anchor, a missing results file or snippet, a page griffe cannot read. The API pages read src/ without importing it.
# NO_MKDOCS_2_WARNING silences mkdocs-material's notice about its successor, which is no warning about these docs.
docs: $(VENV)/bin/mkdocs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The layering of the package (import-linter contracts in pyproject.toml: layers from the CLI down to the kernels,
# torch-only attention/ and positions/, no import cycle between siblings) and ruff over src/ with its pinned rules.
lint: $(VENV)/bin/lint-imports
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check src

# The Korean QA recipe: multilingual-e5-small converted to a 4096-token kobigbird model (full attention up to 512
# tokens = the source exactly; TAPER copy beyond), fine-tuned on the KorQuAD 1.0 training paragraphs of the
# by-article split at 512-token windows, bf16 autocast where native (below), word embeddings frozen, length-grouped
# batches (each padded to its own longest window): 1200 steps x 8 windows = 1.8 epochs. Batches of 8, not 16: where
# the time budget ends the run after one epoch, twice the updates read better (fp32 on an AVX2-only CPU, 2026-11-28,
# 55 minutes each, the same 1.7M tokens: F1 76.2 at batch 8 against 71.6 at batch 16, paired +4.6, +2.7 to +6.5;
# experiments/results/qa_model_e5_batch8_vs_batch16_fp32_55min.md). With native bf16 (a 2-core Intel Xeon with AMX,
# 2026-11-28) all 1200 steps took 49.5 minutes and the whole target 54:52: F1 79.4 (interval 77.1-81.6) on the 931
# held-out dev questions, against 79.5 for 600 x 16 in 53.2 minutes on the same machine (paired -0.1, -1.8 to +1.5;
# experiments/results/qa_model_e5_batch8_vs_batch16_bf16_amx.md): equal where both finish their 1.8 epochs.
# Then `longbird evaluate ... --format korquad1 --split dev` scores it and experiments/qa_learning_curve.py scores
# the checkpoints kept every 300 steps (F1 against training windows seen).
QA_MODEL ?= qa-model/kobigbird-e5-korquad
# bf16 autocast only where the CPU multiplies bf16 (AVX-512 bf16 or AMX; longbird/precision.py): on an AVX2-only CPU
# bf16 is emulated and about 75x slower, so the recipe runs in fp32 there, where its 1200 steps would take about 100
# minutes. Deferred (?=), so it is asked after `install`; set QA_BF16=--bf16 or QA_BF16= to choose.
# QA_WALL_MINUTES bounds the training: 1200 steps or that many minutes, whichever ends first, the learning rate
# decaying to 0 where the run will end (training/budget.py). Where the steps run fast enough (the batch-16 recipe's
# 1.7M tokens in 41.7 minutes with native bf16) the projected end lies past the last step and the schedule is the
# plain linear one; without native bf16 the budget ends the run early, leaving time for the evaluation within the
# hour (fp32 on an AVX2-only CPU, 2026-11-28: 670 steps in 55.1 minutes, F1 76.2; experiments/results/qa_model_e5.md).
# QA_WALL_MINUTES= (empty) trains all 1200 steps whatever they take.
QA_WALL_MINUTES ?= 55
# experiments/results/NAME.{json,md,png}: the learning curve read from the checkpoints
QA_CURVE_NAME ?= qa_model_e5_curve
QA_BF16 ?= $(shell $(PY) -c "from longbird.precision import native_bf16; print('--bf16' if native_bf16('cpu') else '')")
qa-model: install
	$(VENV)/bin/longbird finetune-qa --model multilingual-e5-small --format korquad1 \
		--train data/korquad/KorQuAD_v1.0_dev.json --split train --preset kobigbird --max-length 4096 \
		--window-length 512 --max-steps 1200 --batch-size 8 --group-by-length --learning-rate 1e-4 $(QA_BF16) \
		$(if $(QA_WALL_MINUTES),--wall-minutes $(QA_WALL_MINUTES)) --save-steps 300 \
		--out $(QA_MODEL) --overwrite
	$(VENV)/bin/longbird evaluate --model $(QA_MODEL) --format korquad1 --data data/korquad/KorQuAD_v1.0_dev.json \
		--split dev --out $(QA_MODEL)-eval --batch-size 16 --overwrite
	$(PY) experiments/qa_learning_curve.py --model $(QA_MODEL) --name $(QA_CURVE_NAME)

# The long reader (issue 24): E7's best long row. `make qa-model`'s paragraph reader is first reconverted for long
# reading (`longbird convert QA_DIR --set ...`: every weight kept; BigBird blocks of 128 tokens, so each token reads a
# 384-token window and the question's 128-token global block; no random blocks; positions beyond 512 repeat rows
# 128..511 only, so no document token takes a question position: E7's conversion probe, round 2; the question global
# as keys only, its own queries reading the first 512 tokens as in the paragraph reader: round 3; a "no answer" null
# token every 128 article tokens past 512, so that spans are ranked against their region's null: round 4), then trained
# further on whole KorQuAD 1.0 training-side articles in single windows of their own length (up to 4096 tokens;
# longer articles in windows sharing 1024), 4 articles per update, constant lr 5e-5, for LONG_CPU_MINUTES of process
# CPU time (all threads: 30 CPU minutes = 15 minutes on 2 cores), then scored on the dev-side articles. Its record
# keeps the 4096-token window, so `longbird answer` and `longbird serve` read a whole document at once with it.
# E7 (docs/experiments/e7.md, round 4) measured this row against sliding 512-token windows of the paragraph reader at
# the same budget: see the README for whether it reads better; until it does, answer with the reader of
# `make qa-model`, which reads in sliding 512-token windows by default.
LONG_READER ?= qa-model/kobigbird-e5-korquad-long
LONG_CONVERSION ?= --set block_size=128 --set num_random_blocks=0 --set taper_start=128 \
	--set global_blocks=first-reads-source --set qa_null_every=128
LONG_CPU_MINUTES ?= 30
LONG_EVAL_ARGS ?=  # e.g. --max-examples 50 for a quick look; empty: every dev-side question (about 20 minutes)
long-reader: install
	@test -f $(QA_MODEL)/longbird_finetune.json || { echo "$(QA_MODEL) is missing: run make qa-model first (or set QA_MODEL)"; exit 1; }
	$(VENV)/bin/longbird convert $(QA_MODEL) --preset kobigbird --max-length 4096 $(LONG_CONVERSION) \
		--out $(LONG_READER)-start --overwrite
	$(VENV)/bin/longbird finetune-qa --model $(LONG_READER)-start --format korquad1-articles \
		--train data/korquad/KorQuAD_v1.0_dev.json --split train --window-length 4096 --doc-stride 1024 \
		--negative-fraction 0.1 --batch-size 4 --learning-rate 5e-5 --lr-scheduler constant --warmup-ratio 0 \
		--group-by-length --max-steps 100000 --cpu-minutes $(LONG_CPU_MINUTES) $(QA_BF16) \
		--out $(LONG_READER) --overwrite
	$(VENV)/bin/longbird evaluate --model $(LONG_READER) --format korquad1-articles \
		--data data/korquad/KorQuAD_v1.0_dev.json --split dev --out $(LONG_READER)-eval --batch-size 2 $(QA_BF16) \
		--overwrite $(LONG_EVAL_ARGS)

bench: install
	$(PY) benchmarks/bigbird_vs_hf.py

clean:
	rm -rf $(VENV) build dist site *.egg-info src/*.egg-info
