#!/usr/bin/env bash
# One prepared check of a GPU machine (docs/GPU_CHECK.md, "Checking a GPU machine"), within 9.5 minutes on one GPU,
# ordered so that a call cut short still leaves the most useful results:
#   1 env         GPU, driver, Python/torch/Triton versions; installs eval/gpu_wheels (make gpu-wheels) offline
#   2 correctness every algorithm that runs on the device (sliding_dilated.algorithms_on; on CUDA triton, shift,
#                 blocked) against the fp64 dense reference, forward and gradients, fp32 and bf16; flex by the CUDA
#                 tests of tests/test_flex_sliding.py
#   3 train       `deepspeed launch/pretrain.py` on the base config (world 1, ZeRO 1, bf16, micro-batch 32, random
#                 tokens), 200 steps: SIGTERM at step 100, resume to 200, export; then again with train.compile
#   4 baselines   ALiBi, T5, KERPLE (FlexAttention on CUDA) and RoPE (SDPA flash), 60 steps each
#   5 kernels     forward+backward at T = 16k (H = 12, bf16): triton / blocked / shift / SDPA-flash causal, time ÷
#                 the HBM floor (datasheet and a measured copy)
#   6 eval        eval/extrapolate.py on the exported RegularGPT and ALiBi to 16× the training length; generation
#                 tokens/s at 16k context
#   7 profile     the top kernels of one RegularGPT training step, CPU vs GPU time
# Every step has its own time cap and writes its files under $OUT (default results/gpu) as it finishes, so a failure
# or a hang leaves the other steps' results; summary.txt lists each step's exit status and seconds.
#
#   bash eval/gpu_check.sh                    # on the GPU machine (device tool: run(command="bash eval/gpu_check.sh",
#                                             #   carry=["eval/gpu_wheels"], timeout_s=600))
#   DEVICE=cpu OUT=/tmp/check bash eval/gpu_check.sh   # the same flow at tiny sizes on CPU (tests/test_gpu_check.py)
#   bash eval/rehearse_gpu.sh                 # the CPU flow under the GPU image's Python and library versions
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
  # Tiny sizes: the flow, not the figures (tests/test_gpu_check.py runs this).
  MODEL=configs/tiny/regular_gpt.json BASELINES="alibi t5 kerple_log rope" CONFIG_DIR=configs/tiny
  SIZE=(--set model.vocab_size=512 --set model.d_model=32 --set model.n_heads=2 --set model.chunk_size=4
        --set model.thickness=2 --set model.n_layers=2 --set data.seq_len=32 --set train.batch_size=4)
  STEPS=40 STOP_AT=2 BASELINE_STEPS=20 LOG_EVERY=2 VOCAB=512 TOKENS=60000 LENGTHS=4096 HEADS=2 CHECK_T=40
  EVAL_LENGTHS=32,64,128,256,512 CONTEXT=256 NEW_TOKENS=4 PROFILE_BATCH=2 COPY_MIB=16
  COMPILED=${COMPILED:-}  # compile takes ~40 CPU-s even without inductor (tests/test_train_compile.py runs it)
  export REGULARGPT_COMPILE_BACKEND=${REGULARGPT_COMPILE_BACKEND:-aot_eager}  # inductor's C++ build takes minutes
  CAPS=(120 120 480 480 120 240 120)  # caps, not expectations: the suite runs this beside another pytest worker
else
  MODEL=configs/base.json BASELINES="alibi t5 kerple_log rope" CONFIG_DIR=configs/baselines
  SIZE=()
  STEPS=200 STOP_AT=100 BASELINE_STEPS=60 LOG_EVERY=10 VOCAB=8000 TOKENS=8000000 LENGTHS=16384 HEADS=12
  CHECK_T=1000 EVAL_LENGTHS=512,2048,8192 CONTEXT=16384 NEW_TOKENS=64 PROFILE_BATCH=32 COPY_MIB=1024
  COMPILED="regular_gpt"
  # seconds, 530 in all: on an H200 (results/gpu/README.md) env took 16, correctness 95 + the flex tests, train 172,
  # four baselines ~28 each, kernels 16, eval 19 per length of ALiBi (FlexAttention compiles per shape), profile 11
  CAPS=(20 100 180 125 25 65 15)
fi
TRAIN_SETS=(--set "data.path=$WORK/data" --set "train.log_every=$LOG_EVERY"
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
  # what runs on $DEVICE (never the CPU-only C++ operator on CUDA); on CUDA flex is checked by its own tests below
  # (forward and gradients, fp32 and bf16): in the table it spent 55 of 95 s building a kernel per case
  local rc=0
  $PY eval/gpu_steps.py check --device "$DEVICE" --algorithms device --without flex --length $CHECK_T --heads $HEADS \
    --out "$OUT/correctness.md" || rc=1
  if [ "$DEVICE" != cpu ]; then
    timeout 45 $PY -m pytest -q -p no:cacheprovider tests/test_flex_sliding.py -k cuda || rc=1
  fi
  return $rc
}

# 3. the trainer ----------------------------------------------------------------------------------------------------
LAUNCH=(deepspeed --num_gpus 1 --master_port 29517 launch/pretrain.py)
[ "$DEVICE" = cpu ] && LAUNCH=($PY launch/pretrain.py)  # one process; the deepspeed launcher is tests/test_pretrain.py's

ensure_data() {  # random tokens, once (the train step makes them; the baselines make them if it did not get there)
  [ -f "$WORK/data/manifest.json" ] || $PY eval/gpu_steps.py data "$WORK/data" --vocab $VOCAB --tokens $TOKENS
}

# train_run NAME CONFIG STEPS [--set ...]: one run to the end in $WORK/runs/NAME, metrics copied to
# $OUT/$METRICS/NAME.jsonl (METRICS: the step's folder)
train_run() {
  local name=$1 config=$2 steps=$3
  shift 3
  "${LAUNCH[@]}" --config "$config" --run-dir "$WORK/runs/$name" "${TRAIN_SETS[@]}" --set "train.steps=$steps" "$@"
  local rc=$?
  cp "$WORK/runs/$name/metrics.jsonl" "$OUT/$METRICS/$name.jsonl" 2>/dev/null
  return $rc
}

# The RegularGPT run gets a SIGTERM once step STOP_AT is logged (it saves a checkpoint at the step it is in and exits
# 0), then the same command resumes it to the end.
stop_and_resume() {
  local run=$WORK/runs/regular_gpt
  "${LAUNCH[@]}" --config "$MODEL" --run-dir "$run" "${TRAIN_SETS[@]}" --set "train.steps=$STEPS" &
  local pid=$!
  until grep -q "\"step\": $STOP_AT," "$run/metrics.jsonl" 2>/dev/null; do
    sleep 0.05
    kill -0 $pid 2>/dev/null || { echo "the run ended before step $STOP_AT"; wait $pid; return 1; }
  done
  kill -TERM $pid
  wait $pid
  local rc=$?
  # The launcher exits at once; its rank saves the checkpoint on its own (it sees the launcher gone), so wait for it.
  local i
  for i in $(seq 600); do pgrep -f -- "--run-dir $run " > /dev/null || break; sleep 0.1; done
  echo "SIGTERM after step $STOP_AT: launcher exit $rc, checkpoint $(cat "$run/latest" 2>/dev/null || echo none)"
  train_run regular_gpt "$MODEL" $STEPS || return $?
  echo "resumed and finished: $(tail -1 "$OUT/$METRICS/regular_gpt.jsonl")"
  ls -la "$run/model.pt"
}

# throughput NAME CONFIG: $OUT/NAME.md, one row per run in $OUT/NAME/ (tokens/s without the first window: the
# warm-up), and the ZeRO-1 row of eval/plan_scale.py for CONFIG to hold max_memory_gib against (it models no RoPE)
throughput() {
  local name=$1 config=$2
  $PY - "$OUT/$name" > "$OUT/$name.md" <<'EOF'
import json, sys
from pathlib import Path
rows = ["| run | steps | tokens/s | mfu | mfu_measured | max memory (GiB) |", "|---|---|---|---|---|---|"]
for path in sorted(Path(sys.argv[1]).glob("*.jsonl")):
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    last = recs[-1]
    tps = [r["tokens_per_s"] for r in recs[1:]] or [last["tokens_per_s"]]
    measured = f"{100 * last['mfu_measured']:.1f}%" if "mfu_measured" in last else "–"
    rows.append(f"| {path.stem} | {last['step']} | {sum(tps) / len(tps):,.0f} | {100 * last['mfu']:.1f}% | "
                f"{measured} | {last.get('max_memory_gib', '–')} |")
print("\n".join(rows))
EOF
  cat "$OUT/$name.md"
  $PY eval/plan_scale.py --config "$config" "${SIZE[@]}" --set train.zero_stage=1 --gpus-per-node 1 --nodes 1 \
    --gpu-memory-gb 141 --peak-tflops 989 --markdown "$OUT/plan_$name.md" | grep "^| 1 |"
}

compiled() { case " $COMPILED " in *" $1 "*) return 0;; esac; return 1; }

train_step() {
  METRICS=train
  mkdir -p "$OUT/$METRICS"
  ensure_data || return 1
  local failed=0
  echo "== regular_gpt ($MODEL), $STEPS steps, SIGTERM at $STOP_AT"
  stop_and_resume || failed=1
  if compiled regular_gpt; then
    echo "== regular_gpt, train.compile=true"
    train_run regular_gpt_compiled "$MODEL" $STEPS --set train.compile=true || failed=1
  fi
  throughput train "$MODEL"
  return $failed
}

# 4. the baselines: FlexAttention for the biased ones on CUDA (regulargpt/model/dense_attention.py), SDPA for RoPE -
baselines_step() {
  METRICS=baselines
  mkdir -p "$OUT/$METRICS"
  ensure_data || return 1
  local failed=0 name
  for name in $BASELINES; do
    echo "== $name ($CONFIG_DIR/$name.json), $BASELINE_STEPS steps"
    train_run "$name" "$CONFIG_DIR/$name.json" $BASELINE_STEPS || failed=1
  done
  if compiled alibi; then
    echo "== alibi, train.compile=true"
    train_run alibi_compiled "$CONFIG_DIR/alibi.json" $BASELINE_STEPS --set train.compile=true || failed=1
  fi
  throughput baselines "$CONFIG_DIR/alibi.json"
  return $failed
}

# 5. the kernel against the HBM floor ---------------------------------------------------------------------------------
kernels_step() {  # an algorithm that does not run on $DEVICE is a skipped row (triton on CPU)
  $PY eval/gpu_steps.py bench --device "$DEVICE" --algorithms triton,blocked,shift --lengths $LENGTHS \
    --heads $HEADS --reps 3 --copy-mib $COPY_MIB --out "$OUT/kernels.md"
}

# 6. evaluation to 16× the training length, and generation ------------------------------------------------------------
eval_step() {
  local rc=0
  $PY eval/extrapolate.py --runs "$WORK/runs/regular_gpt" "$WORK/runs/alibi" --data "$WORK/data" \
    --lengths $EVAL_LENGTHS --tokens $((4 * ${EVAL_LENGTHS##*,})) --device "$DEVICE" --out "$OUT/extrapolate" || rc=1
  $PY eval/gpu_steps.py generate "$WORK/runs/regular_gpt/model.pt" --context $CONTEXT --new-tokens $NEW_TOKENS \
    --device "$DEVICE" --out "$OUT/generate.md" || rc=1
  return $rc
}

# 7. profile ----------------------------------------------------------------------------------------------------------
profile_step() {
  $PY eval/gpu_steps.py profile --config "$MODEL" "${SIZE[@]}" --device "$DEVICE" --batch $PROFILE_BATCH \
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
step train "${CAPS[2]}"
step baselines "${CAPS[3]}"
step kernels "${CAPS[4]}"
step eval "${CAPS[5]}"
step profile "${CAPS[6]}"
echo "--- $OUT/summary.txt"
cat "$SUMMARY"
! grep -q -v ": exit 0 " "$SUMMARY"
