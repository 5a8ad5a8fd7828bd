#!/usr/bin/env bash
# One prepared check of a GPU machine (docs/PERFORMANCE.md, "Checking a GPU machine"), within 9 minutes on one GPU:
#   1 env       GPU, driver, torch/Triton versions; installs eval/gpu_wheels (make gpu-wheels) when deepspeed is missing
#   2 correct   the kernels (triton, cpp, blocked, shift, flex) against the fp64 dense reference, forward and
#               gradients, fp32 and bf16; and the CUDA tests of tests/test_flex_sliding.py
#   3 kernels   forward+backward at T = 4k, 16k, 64k (H = 12, bf16): triton / blocked / shift / SDPA-flash causal,
#               time ÷ the HBM floor (datasheet and a measured copy)
#   4 train     `deepspeed launch/pretrain.py` (world 1, ZeRO 1, bf16, the config's micro-batch 32), 60 steps on random
#               tokens: RegularGPT (SIGTERM at step 30, then a resume to 60 and the export), ALiBi, RoPE, each also
#               with train.compile; tokens/s, MFU against the datasheet peak, peak memory against eval/plan_scale.py
#   5 eval      eval/extrapolate.py on the exported RegularGPT to 16,384 tokens; generation tokens/s at 16k context
#   6 profile   the top kernels of one RegularGPT training step, CPU vs GPU time
# Every step has its own time cap, so a failure or a hang leaves the other steps' results; everything is written under
# $OUT (default results/gpu), with summary.txt listing each step's exit status and seconds.
#
#   bash eval/gpu_check.sh                    # on the GPU machine (device tool: run(command="bash eval/gpu_check.sh",
#                                             #   carry=["eval/gpu_wheels"], timeout_s=590))
#   DEVICE=cpu OUT=/tmp/check bash eval/gpu_check.sh   # the same flow at tiny sizes on CPU (tests/test_gpu_check.py)
set -uo pipefail
SCRIPT=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
export DEVICE=${DEVICE:-cuda}
export OUT=${OUT:-results/gpu}
export PY=${PYTHON:-python3}
export WORK=${WORK:-$(mktemp -d /tmp/regulargpt_gpu_check.XXXXXX)}  # run directories: checkpoints are too big for $OUT
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD:$WORK/deps${PYTHONPATH:+:$PYTHONPATH} PATH=$WORK/deps/bin:$PATH PYTHONUNBUFFERED=1
export WANDB_MODE=disabled
SUMMARY=$OUT/summary.txt

# step NAME SECONDS: run NAME_step (below) in a fresh shell capped at SECONDS, its output in $OUT/NAME.log, one
# summary line. (timeout signals the whole process group: the launcher and its ranks too.)
step() {
  local name=$1 cap=$2 start=$SECONDS
  timeout -k 10 "$cap" bash "$SCRIPT" --step "$name" > "$OUT/$name.log" 2>&1
  local rc=$?
  local verdict="exit $rc"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then verdict="timed out after ${cap} s"; fi
  echo "$name: $verdict ($((SECONDS - start)) s)" | tee -a "$SUMMARY"
}

if [ "$DEVICE" = cpu ]; then
  # Tiny sizes: the flow, not the figures (tests/test_gpu_check.py runs this in `make test`).
  CONFIGS="regular_gpt=configs/tiny/regular_gpt.json alibi=configs/tiny/alibi.json rope=configs/tiny/rope.json"
  SIZE=(--set model.vocab_size=512 --set model.d_model=32 --set model.n_heads=2 --set model.chunk_size=4
        --set model.thickness=2 --set model.n_layers=2 --set data.seq_len=32 --set train.batch_size=4)
  STEPS=40 STOP_AT=2 LOG_EVERY=2 VOCAB=512 TOKENS=60000 LENGTHS=4096 HEADS=2 CHECK_T=40 EVAL_LENGTHS=32,64,128
  CONTEXT=256 NEW_TOKENS=4 PROFILE_BATCH=2 COPY_MIB=16
  COMPILED=${COMPILED:-}  # compile takes ~40 CPU-s even without inductor (tests/test_train_compile.py runs it)
  export REGULARGPT_COMPILE_BACKEND=${REGULARGPT_COMPILE_BACKEND:-aot_eager}  # inductor's C++ build takes minutes
  CAPS=(120 120 120 480 120 120)  # caps, not expectations: the suite runs this beside another pytest worker
else
  CONFIGS="regular_gpt=configs/base.json alibi=configs/baselines/alibi.json rope=configs/baselines/rope.json"
  SIZE=()
  STEPS=60 STOP_AT=30 LOG_EVERY=10 VOCAB=8000 TOKENS=4000000 LENGTHS=4096,16384,65536 HEADS=12 CHECK_T=1000
  EVAL_LENGTHS=512,1024,2048,4096,8192,16384 CONTEXT=16384 NEW_TOKENS=64 PROFILE_BATCH=32 COPY_MIB=1024
  COMPILED="regular_gpt alibi rope"
  CAPS=(60 100 75 240 70 25)  # seconds: 570 in all
fi
TRAIN_SETS=(--set "data.path=$WORK/data" --set "train.steps=$STEPS" --set "train.log_every=$LOG_EVERY"
            --set train.eval_every=0 --set train.save_every=0 --set train.warmup_fraction=0.1
            --set train.zero_stage=1 --set train.precision=bf16 --set logging.wandb=false
            --set logging.progress=false --set train.keep_last=1 "${SIZE[@]}")

# 1. environment ---------------------------------------------------------------------------------------------------
env_step() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
    $PY -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda',
torch.version.cuda, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
    $PY -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
    $PY eval/gpu_deps.py install --wheels eval/gpu_wheels --target "$WORK/deps"
    $PY -c "import deepspeed; print('deepspeed', deepspeed.__version__)"; } 2>&1 | grep -v "^\[20"
}

# 2. correctness -----------------------------------------------------------------------------------------------------
correctness_step() {
  local algorithms=triton,cpp,blocked,shift,flex rc=0
  [ "$DEVICE" = cpu ] && algorithms=cpp,blocked,shift  # triton and flex's backward are CUDA-only
  $PY eval/gpu_steps.py check --device "$DEVICE" --algorithms $algorithms --length $CHECK_T --heads $HEADS \
    --out "$OUT/correctness.md" || rc=1
  if [ "$DEVICE" != cpu ]; then
    timeout 45 $PY -m pytest -q -p no:cacheprovider tests/test_flex_sliding.py -k cuda || rc=1
  fi
  return $rc
}

# 3. kernels -------------------------------------------------------------------------------------------------------
kernels_step() {
  local algorithms=triton,blocked,shift
  [ "$DEVICE" = cpu ] && algorithms=blocked,shift
  $PY eval/gpu_steps.py bench --device "$DEVICE" --algorithms $algorithms --lengths $LENGTHS \
    --heads $HEADS --reps 3 --copy-mib $COPY_MIB --out "$OUT/kernels.md"
}

# 4. the trainer ----------------------------------------------------------------------------------------------------
LAUNCH=(deepspeed --num_gpus 1 --master_port 29517 launch/pretrain.py)
[ "$DEVICE" = cpu ] && LAUNCH=($PY launch/pretrain.py)  # one process; the deepspeed launcher is tests/test_pretrain.py's

# train_run NAME CONFIG [--set ...]: one run to the end in $WORK/runs/NAME, metrics copied to $OUT/train/NAME.jsonl
train_run() {
  local name=$1 config=$2
  shift 2
  "${LAUNCH[@]}" --config "$config" --run-dir "$WORK/runs/$name" "${TRAIN_SETS[@]}" "$@"
  local rc=$?
  cp "$WORK/runs/$name/metrics.jsonl" "$OUT/train/$name.jsonl" 2>/dev/null
  return $rc
}

# The RegularGPT run gets a SIGTERM once step STOP_AT is logged (it saves a checkpoint at the step it is in and exits
# 0), then the same command resumes it to the end.
stop_and_resume() {
  local config=$1 run=$WORK/runs/regular_gpt
  "${LAUNCH[@]}" --config "$config" --run-dir "$run" "${TRAIN_SETS[@]}" &
  local pid=$!
  until grep -q "\"step\": $STOP_AT," "$run/metrics.jsonl" 2>/dev/null; do
    sleep 0.05
    kill -0 $pid 2>/dev/null || { echo "the run ended before step $STOP_AT"; wait $pid; return 1; }
  done
  kill -TERM $pid
  wait $pid
  echo "SIGTERM after step $STOP_AT: exit $?, checkpoint $(cat "$run/latest" 2>/dev/null || echo none)"
  train_run regular_gpt "$config" || return $?
  echo "resumed and finished: $(tail -1 "$OUT/train/regular_gpt.jsonl")"
  ls -la "$run/model.pt"
}

train_step() {
  mkdir -p "$OUT/train"
  $PY eval/gpu_steps.py data "$WORK/data" --vocab $VOCAB --tokens $TOKENS || return 1
  local failed=0 pair name config
  for pair in $CONFIGS; do
    name=${pair%%=*} config=${pair#*=}
    echo "== $name ($config)"
    if [ "$name" = regular_gpt ]; then stop_and_resume "$config" || failed=1
    else train_run "$name" "$config" || failed=1; fi
    case " $COMPILED " in *" $name "*)
      echo "== $name, train.compile=true"
      train_run "${name}_compiled" "$config" --set train.compile=true || failed=1;;
    esac
  done
  $PY - "$OUT/train" <<'EOF'
import json, sys
from pathlib import Path
rows = ["| run | steps | tokens/s | mfu | mfu_measured | max memory (GiB) |", "|---|---|---|---|---|---|"]
for path in sorted(Path(sys.argv[1]).glob("*.jsonl")):
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    last = recs[-1]
    tps = [r["tokens_per_s"] for r in recs[1:]] or [last["tokens_per_s"]]  # the first window holds the warm-up
    rows.append(f"| {path.stem} | {last['step']} | {sum(tps) / len(tps):,.0f} | {100 * last['mfu']:.1f}% | "
                f"{100 * last['mfu_measured']:.1f}% | {last.get('max_memory_gib', '–')} |"
                if "mfu_measured" in last else
                f"| {path.stem} | {last['step']} | {sum(tps) / len(tps):,.0f} | {100 * last['mfu']:.1f}% | – | "
                f"{last.get('max_memory_gib', '–')} |")
print("\n".join(rows))
EOF
  for pair in ${CONFIGS% rope=*}; do  # the estimate to hold max_memory_gib against: the ZeRO 1 row (the planner
    $PY eval/plan_scale.py --config "${pair#*=}" "${SIZE[@]}" --set train.zero_stage=1 --gpus-per-node 1 --nodes 1 \
      --gpu-memory-gb 141 --peak-tflops 989 --markdown "$OUT/plan_${pair%%=*}.md" | grep "^| 1 |"  # models no RoPE)
  done
  return $failed
}

# 5. evaluation and generation ----------------------------------------------------------------------------------------
eval_step() {
  local rc=0
  $PY eval/extrapolate.py --runs "$WORK/runs/regular_gpt" "$WORK/runs/alibi" --data "$WORK/data" \
    --lengths $EVAL_LENGTHS --tokens $((4 * ${EVAL_LENGTHS##*,})) --device "$DEVICE" --out "$OUT/extrapolate" || rc=1
  $PY eval/gpu_steps.py generate "$WORK/runs/regular_gpt/model.pt" --context $CONTEXT --new-tokens $NEW_TOKENS \
    --device "$DEVICE" --out "$OUT/generate.md" || rc=1
  return $rc
}

# 6. profile ----------------------------------------------------------------------------------------------------------
profile_step() {
  local first=${CONFIGS%% *}
  $PY eval/gpu_steps.py profile --config "${first#*=}" "${SIZE[@]}" --device "$DEVICE" --batch $PROFILE_BATCH \
    --out "$OUT/profile.md"
}

if [ "${1:-}" = --step ]; then  # one step, inside step()'s time cap
  "${2}_step"
  exit $?
fi
: > "$SUMMARY"
step env "${CAPS[0]}"
cat "$OUT/env.log"
step correctness "${CAPS[1]}"
step kernels "${CAPS[2]}"
step train "${CAPS[3]}"
step eval "${CAPS[4]}"
step profile "${CAPS[5]}"
echo "--- $OUT/summary.txt"
cat "$SUMMARY"
! grep -q -v ": exit 0 " "$SUMMARY"
