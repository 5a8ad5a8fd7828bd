#!/usr/bin/env bash
# The prepared run for a lent GPU (docs/PERFORMANCE.md, "GPU"): correctness of the FlexAttention path against the
# dense reference (forward and gradients), kernel speed against causal FlexAttention and SDPA at T = 4k ... 128k, and
# base-config training tokens/s in bf16. Its steps are capped at 150 + 270 + 130 s, so the whole fits one device call of timeout_s=590.
# Writes everything under $OUT (default results/gpu); one step failing still leaves the others' files.
#
#   bash eval/gpu_check.sh                      # through the device tool: run(command="bash eval/gpu_check.sh")
set -uo pipefail
OUT=${OUT:-results/gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } > "$OUT/gpu.txt" 2>&1
timeout 150 $PY -m pytest -q -p no:cacheprovider -p no:logging tests/test_flex_sliding.py > "$OUT/tests.txt" 2>&1
echo "tests: exit $?" >> "$OUT/gpu.txt"
timeout 270 $PY eval/bench_attention.py --device cuda --dtype bf16 --heads 12 --chunks 2,8 \
  --lengths 4096,16384,65536,131072 --kernel-algorithm blocked --sdpa-max-length 131072 \
  --flex-max-length 131072 --reference-max-length 16384 --reference-max-gib 100 --threads 16 --timeout 90 \
  --out "$OUT/bench_attention_cuda.md" > "$OUT/bench_attention.log" 2>&1
echo "bench_attention: exit $?" >> "$OUT/gpu.txt"
timeout 130 $PY eval/bench_train.py --device cuda --configs configs/base.json --steps 5 --warmup 2 \
  --rounds 1 --baselines alibi,rope --base-batch 8 --threads 16 --out "$OUT/bench_train_cuda.md" > "$OUT/bench_train.log" 2>&1
echo "bench_train: exit $?" >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"
