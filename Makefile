# Quick start: `make demo` (main job on the embedded default corpus) and `make test` (the suite).
# Both create .venv on first use. torch==2.13.0 (the CPU build) is installed first, and only when the venv has
# no torch, so a user's own torch build is kept; then the package with its dev extra.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
KERNEL := $(VENV)/.kernel-built
# `make test` runs the suite on this many pytest-xdist workers (CI's machine has 2 cores), handing tests out one at a
# time; TEST_WORKERS=0 runs it in one process. Shared fixtures are built once per run (tests/conftest.py).
TEST_WORKERS ?= 2

.PHONY: install test test-all demo bench gpu-wheels rehearse-gpu clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) setup.py
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "torch==2.13.0"
	@# Pin whatever torch the venv now has, so resolving deepspeed never swaps it for another (CUDA) build.
	$(PY) -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/constraints.txt
	$(PY) -m pip install --quiet -c $(VENV)/constraints.txt -e ".[dev]"
	@touch $(STAMP)

# The fused C++ kernel, compiled once here (about a minute of g++) into torch's extension cache rather than on first
# use inside the suite; rebuilt when its source or flags change. A failed build is reported, not fatal: the kernel
# falls back to the PyTorch paths and tests/test_kernel_cpp.py is skipped with the reason.
$(KERNEL): $(STAMP) regulargpt/kernels/sliding_dilated_cpu.cpp regulargpt/kernels/sliding_dilated_cpu_vec.h \
		regulargpt/kernels/sliding_dilated_cpu_pool.h regulargpt/kernels/sliding_dilated_cpu_lanes.h regulargpt/kernels/sliding_dilated_cpu_sweep.h \
		regulargpt/kernels/sliding_dilated_cpu_row_backward.h regulargpt/kernels/sliding_dilated_cpu_chain_lanes.h \
		regulargpt/kernels/sliding_dilated_cpp.py
	$(PY) -c "from regulargpt.kernels.sliding_dilated_cpp import build_error; print(build_error() or 'C++ kernel built')"
	@touch $(KERNEL)

install: $(KERNEL)

# OMP_NUM_THREADS=1: one torch thread per worker, as every training subprocess of the suite already runs.
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --maxschedchunk 1

# The suite CI runs (.ci/run): every test except the `long` end-to-end flows (pytest.ini), under 10 minutes.
test: $(KERNEL)
	$(PYTEST) -m "not long" tests

# Everything, the `long` flows included.
test-all: $(KERNEL)
	$(PYTEST) tests

# Ends with a short sample from the RegularGPT the demo trained (constant memory per token under depth policy train).
demo: $(KERNEL)
	$(PY) eval/lm_comparison.py --demo
	$(PY) launch/generate.py results/demo/lm/runs/python-stdlib/regular_gpt-seed0 --prompt "    def __init__(self" \
		--max-new-tokens 60 --depth-policy train --seed 0

# Every CPU benchmark behind docs/KERNELS.md, docs/THROUGHPUT.md and docs/GENERATION.md, one after another (about an hour on 2 cores).
bench: $(KERNEL)
	$(PY) eval/bench_dispatch.py --out results/bench_dispatch.md
	$(PY) eval/bench_attention.py --out results/bench_attention.md
	$(PY) eval/bench_attention.py --dtype bf16 --heads 8 --no-reference --no-flex --out results/bench_attention_bf16.md
	$(PY) eval/bench_train.py --out results/bench_train.md
	$(PY) eval/bench_tree.py --config configs/formal/parity_check.json --out results/bench_tree.md
	OMP_NUM_THREADS=1 $(PY) eval/bench_generate.py --out results/bench_generate.md

# The wheels eval/gpu_campaign.sh installs on a GPU machine whose image has no deepspeed (eval/gpu_deps.py; pip and PyPI
# here, offline there): git-ignored, carried with the check (docs/GPU_CHECK.md).
gpu-wheels: $(STAMP)
	$(PY) eval/gpu_deps.py download --out eval/gpu_wheels

# The GPU check rehearsed here under the GPU image's Python 3.12 and library versions (eval/rehearse_gpu.sh: a venv in
# build/rehearse_gpu from ~2.8 GB of wheels, the CUDA build of torch 2.11 included; not part of `make test`).
rehearse-gpu:  # needs eval/gpu_wheels (make gpu-wheels) and a Python 3.12
	bash eval/rehearse_gpu.sh

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
