# Quick start: `make demo` (main job on the embedded default corpus) and `make test` (the suite).
# Both create .venv on first use. torch==2.13.0 (the CPU build) is installed first, and only when the venv has
# no torch, so a user's own torch build is kept; then the package with its dev extra.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test demo bench gpu-wheels clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) setup.py
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==2.13.0"
	@# Pin whatever torch the venv now has, so resolving deepspeed never swaps it for another (CUDA) build.
	$(PY) -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/constraints.txt
	$(PY) -m pip install --quiet -c $(VENV)/constraints.txt -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

# Ends with a short sample from the RegularGPT the demo trained (constant memory per token under depth policy train).
demo: $(STAMP)
	$(PY) eval/lm_comparison.py --demo
	$(PY) launch/generate.py results/demo/lm/runs/python-stdlib/regular_gpt-seed0 --prompt "    def __init__(self" \
		--max-new-tokens 60 --depth-policy train --seed 0

# Every CPU benchmark behind docs/PERFORMANCE.md and docs/GENERATION.md, one after another (about an hour on 2 cores).
bench: $(STAMP)
	$(PY) eval/bench_dispatch.py --out results/bench_dispatch.md
	$(PY) eval/bench_attention.py --out results/bench_attention.md
	$(PY) eval/bench_attention.py --dtype bf16 --heads 8 --no-reference --no-flex --out results/bench_attention_bf16.md
	$(PY) eval/bench_train.py --out results/bench_train.md
	$(PY) eval/bench_tree.py --config configs/formal/parity_check.json --out results/bench_tree.md
	OMP_NUM_THREADS=1 $(PY) eval/bench_generate.py --out results/bench_generate.md

# The wheels eval/gpu_check.sh installs on a GPU machine whose image has no deepspeed (eval/gpu_deps.py; pip and PyPI
# here, offline there): git-ignored, carried with the check (docs/PERFORMANCE.md, "Checking a GPU machine").
gpu-wheels: $(STAMP)
	$(PY) eval/gpu_deps.py download --out eval/gpu_wheels

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
