#!/usr/bin/env bash
# The GPU campaign (docs/GPU_CHECK.md): one prepared call that trains and scores the language-modelling comparison on
# one GPU and times the kernel. Steps in order, each with its own cap (seconds on an H100, the slower kind; 510 in all
# for the LM part), each packing its results as it finishes, so a call cut short returns every finished step:
#   env          20  versions, GPU, the carried wheels (eval/gpu_wheels, make gpu-wheels) installed offline
#   correctness  40  the Triton kernel, forward and every gradient against the fp64 reference, fp32 and bf16, T = 1003
#   kernels      30  fwd+bwd device time (CUDA events) at T = 16k and 64k, C = 8 and 16, bf16, against its floors
#   corpus       40  data_prep/prepare.py --source python-packages: the image's installed packages, split by package
#   study       295  deepspeed launch/pretrain.py, configs/campaign/: RegularGPT (C 16, K 4), ALiBi, KERPLE-log, RoPE,
#                    d 512, T 512, bf16, equal tokens (the plan, printed before the first step: eval/gpu_campaign.py)
#   eval         70  eval/extrapolate.py on the four runs at 512 … 16384, RegularGPT under adaptive and train depth
#   profile      15  the top kernels of one RegularGPT training step
# --part speed (210 s; run as a second command on the same machine, or first on the next one once the LM part
# has landed): the kernel dispatch table, the base config's training step compiled against ALiBi and T5, long
# context.
#
#   bash eval/gpu_campaign.sh                  # on the GPU: run(command="COMMIT=<sha> bash eval/gpu_campaign.sh",
#                                              #   carry=["eval/gpu_wheels"], timeout_s=600)
#   bash eval/gpu_campaign.sh --part speed     # the speed part, second
#   DEVICE=cpu OUT=/tmp/c bash eval/gpu_campaign.sh   # every step at tiny sizes on CPU (tests/test_gpu_campaign.py)
#
# Files: $OUT/summary-PART.txt (a line per step: exit status, seconds, cap), $OUT/campaign-PART.tgz (every step's files,
# repacked after each step); a call returns at most 8 files. `python eval/gpu_campaign.py report --from DIR` writes
# the README from the unpacked tarball.
set -uo pipefail
SCRIPT=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
export DEVICE=${DEVICE:-cuda}
export OUT=${OUT:-/tmp/regulargpt_campaign}
export PY=${PYTHON:-python3}
export WORK=${WORK:-/tmp/regulargpt_campaign_work}  # deps, data and runs (too big for $OUT; kept for --part speed)
export PART=${PART:-lm}  # a step's own shell (--step) inherits it
[ "${1:-}" = --part ] && PART=${2:?--part needs lm or speed}
case $PART in lm|speed) ;; *) echo "error: --part $PART: expected lm or speed" >&2; exit 2;; esac
export W=$WORK/out-$PART  # what is packed
mkdir -p "$OUT" "$W"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD:$WORK/deps${PYTHONPATH:+:$PYTHONPATH} PATH=$WORK/deps/bin:$PATH PYTHONUNBUFFERED=1
export WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
SUMMARY=$W/summary.txt

if [ "$DEVICE" = cpu ]; then
  # Tiny sizes: the flow, not the figures (tests/test_gpu_campaign.py runs this beside another pytest worker).
  SIZE=(--set model.vocab_size=512 --set model.d_model=32 --set model.n_heads=2 --set model.chunk_size=4
        --set model.thickness=2 --set model.n_layers=2 --set data.seq_len=32 --set train.batch_size=4
        --set train.precision=fp32 --set train.zero_stage=0)
  STEPS_FLAG=(--steps 20) CHECK=(--algorithms cpp --length 45 --heads 2 --cases 2:1,16:16,8:64)
  KERNEL_ARGS=(--device cpu --lengths 1024 --chunks 4 --dtype fp32 --reps 3)
  CORPUS=(--vocab-size 512 --max-bytes 1500000 --tokenizer-sample-bytes 1000000 --num-proc 1)
  EVAL_LENGTHS=32,64,128,256,512 EVAL_TOKENS=2048 EVAL_MEMORY=1 PROFILE_BATCH=2
  export REGULARGPT_COMPILE_BACKEND=${REGULARGPT_COMPILE_BACKEND:-aot_eager}
  CAPS=(60 120 120 120 600 300 120)  # caps, not expectations: the suite runs this beside another pytest worker
  DISPATCH_ARGS=(--device cpu --lengths 256 --chunks 4 --dtype fp32 --reps 1 --algorithms blocked,shift)
  SPEED_CAPS=(60 120 240 240)
else
  SIZE=()
  STEPS_FLAG=() CHECK=(--algorithms triton --length 1003 --heads 12 --cases 2:1,16:16,8:64)
  KERNEL_ARGS=(--device cuda --lengths 16384,65536 --chunks 8,16 --dtype bf16 --reps 20 --algorithms triton,sdpa)
  CORPUS=(--vocab-size 8000 --max-bytes 250000000 --tokenizer-sample-bytes 8000000)
  EVAL_LENGTHS=512,1024,2048,4096,8192,16384 EVAL_TOKENS=65536 EVAL_MEMORY=16 PROFILE_BATCH=32
  CAPS=(20 40 30 40 295 70 15)  # 510 s
  DISPATCH_ARGS=(--device cuda --dtype bf16 --reps 5 --algorithms triton,blocked,shift)  # its T × C grid
  SPEED_CAPS=(10 55 60 85)   # 210 s, env included (the wheels are installed once per $WORK)
fi
[ -n "${CAMPAIGN_CAPS:-}" ] && read -r -a CAPS <<< "$CAMPAIGN_CAPS"  # e.g. CAMPAIGN_CAPS="60 120 120 120 2 300 120"
MODELS=$($PY -c "import json; print(' '.join(json.load(open('configs/campaign/plan.json'))['models']))")

# step NAME CAP: NAME_step (below) in a fresh shell capped at CAP seconds (the whole process group: launchers and
# ranks too), its output in $W/NAME.log; one summary line; then the files are packed.
step() {
  local name=$1 cap=$2 start=$SECONDS
  timeout -k 10 "$cap" bash "$SCRIPT" --step "$name" > "$W/$name.log" 2>&1
  local rc=$?
  local verdict="exit $rc"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then verdict="timed out"; fi
  echo "$name: $verdict ($((SECONDS - start)) s, planned $cap s)" | tee -a "$SUMMARY"
  pack
}

pack() {  # $OUT/campaign-PART.tgz from $W, atomically (a call cut short during the tar keeps the previous one)
  cp "$SUMMARY" "$OUT/summary-$PART.txt"
  tar czf "$OUT/.campaign-$PART.tgz.tmp" -C "$W" . && mv "$OUT/.campaign-$PART.tgz.tmp" "$OUT/campaign-$PART.tgz"
}

# 1. environment --------------------------------------------------------------------------------------------------
env_step() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
    $PY -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda',
torch.version.cuda, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
    $PY -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
    echo "cpu cores $(nproc), memory $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
    $PY eval/gpu_deps.py install --wheels eval/gpu_wheels --target "$WORK/deps"
    $PY -c "import deepspeed; print('deepspeed', deepspeed.__version__)"; } 2>&1 | grep -v "^\[20"
}

# 2. the Triton kernel against the fp64 reference ---------------------------------------------------------------------
correctness_step() {
  $PY eval/gpu_steps.py check --device "$DEVICE" "${CHECK[@]}" --out "$W/correctness.md"
}

# 3. kernel device time against its floors -------------------------------------------------------------------------
kernels_step() {
  $PY eval/bench_kernel_gpu.py "${KERNEL_ARGS[@]}" --out "$W/kernels.md" --jsonl "$W/kernels.jsonl"
}

# 4. a real corpus from the device's installed packages ---------------------------------------------------------------
corpus_step() {
  $PY data_prep/prepare.py --source python-packages --out "$WORK/data" "${CORPUS[@]}" --skip-bad-rows || return 1
  $PY eval/gpu_campaign.py corpus "$WORK/data" --out "$W/corpus.md"
}

# 5. the study --------------------------------------------------------------------------------------------------------
LAUNCH=(deepspeed --num_gpus 1 --master_port 29517 launch/pretrain.py)
[ "$DEVICE" = cpu ] && LAUNCH=($PY launch/pretrain.py)  # one process (the deepspeed launcher is tested elsewhere)

# train_model NAME STEPS CAP: one run in $WORK/runs/NAME, stopped by SIGTERM at CAP seconds (it saves a checkpoint),
# then exported if it was; metrics copied to $W/study/NAME.jsonl
train_model() {
  local name=$1 steps=$2 cap=$3 run=$WORK/runs/$1
  echo "== $name: $steps steps, cap ${cap} s ($(date -u +%T))"
  timeout -s TERM -k 60 "$cap" "${LAUNCH[@]}" --config "configs/campaign/$name.json" --run-dir "$run" \
    --set "data.path=$WORK/data" --set "train.steps=$steps" "${SIZE[@]}"
  local rc=$?
  local i
  for i in $(seq 600); do pgrep -f -- "--run-dir $run " > /dev/null || break; sleep 0.1; done  # the rank's save
  cp "$run/metrics.jsonl" "$W/study/$name.jsonl" 2>/dev/null
  if [ ! -f "$run/model.pt" ] && [ -f "$run/latest" ]; then
    echo "$name stopped at $(cat "$run/latest") (exit $rc): exporting that checkpoint"
    $PY launch/export.py "$run" || return 1
  fi
  [ -f "$run/model.pt" ]
}

study_step() {
  mkdir -p "$W/study"
  $PY eval/gpu_campaign.py plan --configs configs/campaign "${SIZE[@]}" "${STEPS_FLAG[@]}" --out "$W/plan.json" ||
    return 1
  local failed=0 name steps cap
  steps=$($PY -c "import json, sys; print(json.load(open(sys.argv[1]))['steps'])" "$W/plan.json")
  for name in $MODELS; do
    cap=$($PY -c "import json, sys; print(round(next(m['cap_s'] for m in json.load(open(sys.argv[1]))['models']
if m['name'] == sys.argv[2])))" "$W/plan.json" "$name")
    [ "$DEVICE" = cpu ] && cap=$((cap * 4))  # the rehearsal's rates are not the record's
    train_model "$name" "$steps" "$cap" || failed=1
  done
  $PY eval/gpu_campaign.py throughput "$W/study" --plan "$W/plan.json" --out "$W/study.md"
  return $failed
}

# 6. evaluation at 1× … 32× -------------------------------------------------------------------------------------------
eval_step() {
  local runs=() name rc=0
  for name in $MODELS; do [ -f "$WORK/runs/$name/model.pt" ] && runs+=("$WORK/runs/$name"); done
  [ ${#runs[@]} -gt 0 ] || { echo "no trained run to score"; return 1; }
  local common=(--data "$WORK/data" --split test --lengths "$EVAL_LENGTHS" --tokens "$EVAL_TOKENS"
                --memory-gb "$EVAL_MEMORY" --device "$DEVICE" --no-progress --out "$W/extrapolate")
  $PY eval/extrapolate.py --runs "${runs[@]}" "${common[@]}" || rc=1
  [ -f "$WORK/runs/regular_gpt/model.pt" ] &&
    { $PY eval/extrapolate.py --runs "$WORK/runs/regular_gpt" --depth-policy train "${common[@]}" || rc=1; }
  return $rc
}

# 7. profile ----------------------------------------------------------------------------------------------------------
profile_step() {
  $PY eval/gpu_steps.py profile --config configs/campaign/regular_gpt.json "${SIZE[@]}" --device "$DEVICE" \
    --batch $PROFILE_BATCH --out "$W/profile.md"
}

# --part speed ----------------------------------------------------------------------------------------------------------
dispatch_step() {  # the measured table behind `auto` on CUDA
  $PY eval/bench_kernel_gpu.py "${DISPATCH_ARGS[@]}" --dispatch-table "$W/dispatch.json" --out "$W/dispatch.md" \
    --jsonl "$W/dispatch.jsonl"
}
train_speed_step() {  # the base config's training step compiled, against ALiBi and T5 at equal layer applications
  local args=(--configs configs/base.json --steps 10 --warmup 3 --rounds 1 --base-batch 32 --compile)
  [ "$DEVICE" = cpu ] && args=(--configs configs/tiny/regular_gpt.json --steps 2 --warmup 1 --rounds 1 --batch 2)
  $PY eval/bench_train.py --device "$DEVICE" --baselines alibi,t5 "${args[@]}" --out "$W/bench_train.md"
}
long_step() {
  local extra=(--lengths 16384,32768,65536)
  if [ "$DEVICE" = cpu ]; then  # the 16k configs at T = 256 (a 16k step takes minutes on a CPU core)
    mkdir -p "$WORK/long_configs"
    for name in regular_gpt regular_gpt_train alibi; do
      echo "{\"extends\": \"$PWD/configs/long/${name}_16k.json\", \"data\": {\"seq_len\": 256}}" \
        > "$WORK/long_configs/${name}_256.json"
    done
    extra=(--lengths 256 --shrink --steps 2 --configs-dir "$WORK/long_configs")
  fi
  $PY eval/bench_long_context.py --device "$DEVICE" "${extra[@]}" --budget-s $((${SPEED_CAPS[3]} - 10)) \
    --out "$W/long_context.md" --jsonl "$W/long_context.jsonl"
}

if [ "${1:-}" = --step ]; then  # one step, inside step()'s time cap
  "${2}_step"
  exit $?
fi
echo "{\"date\": \"$(date -u +%F)\", \"commit\": \"${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}\",
 \"command\": \"$(basename "$SCRIPT") ${*:-}\", \"device\": \"$DEVICE\", \"part\": \"$PART\"}" > "$W/campaign.json"
: > "$SUMMARY"
if [ "$PART" = speed ]; then
  step env "${SPEED_CAPS[0]}"
  step dispatch "${SPEED_CAPS[1]}"
  step train_speed "${SPEED_CAPS[2]}"
  step long "${SPEED_CAPS[3]}"
else
  step env "${CAPS[0]}"
  cat "$W/env.log"
  step correctness "${CAPS[1]}"
  step kernels "${CAPS[2]}"
  step corpus "${CAPS[3]}"
  step study "${CAPS[4]}"
  step eval "${CAPS[5]}"
  step profile "${CAPS[6]}"
fi
echo "--- $OUT/summary.txt"
cat "$SUMMARY"
! grep -q -v ": exit 0 " "$SUMMARY"
