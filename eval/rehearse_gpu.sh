#!/usr/bin/env bash
# The GPU check rehearsed on this CPU machine under the GPU machine's software (`make rehearse-gpu`;
# docs/GPU_CHECK.md, "Checking a GPU machine"): a fresh Python 3.12 venv with the image's exact library versions,
# our carried wheels installed into it offline by eval/gpu_campaign.sh's own env step, then
# `DEVICE=cpu bash eval/gpu_campaign.sh` (both parts) and the non-slow suite in it; the report in $REPORT.
#
#   bash eval/rehearse_gpu.sh                            # REHEARSAL_DIR=build/rehearse_gpu, about 2.8 GB of wheels
#   REHEARSAL_DIR=/big/disk PYTHON312=/usr/bin/python3.12 JOBS=0 bash eval/rehearse_gpu.sh
#
# Python 3.12: $PYTHON312, else python3.12 on PATH, else pyenv's newest 3.12 (pyenv does not need to enable it).
# Debian 12 ships 3.11 only, and uv/conda fetch interpreters from GitHub/anaconda.org; with PyPI alone, install 3.12
# another way first (docs/GPU_CHECK.md). torch 2.11 for Python 3.12 on PyPI is the CUDA 13 build with its nvidia-*
# wheels (2.6 GiB in all); it imports and runs on a CPU without a GPU or a driver. The wheels are downloaded once
# into $REHEARSAL_DIR/wheels and the venv is built from them offline (again with FRESH=1, or when the pins change). Test tools that the image lacks
# (pytest, pytest-xdist, protobuf, datasets) are installed beside the image's versions so the suite can run; nothing
# else (no matplotlib, wandb, deepspeed: the check installs deepspeed from eval/gpu_wheels as on the GPU).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DIR=${REHEARSAL_DIR:-build/rehearse_gpu}
REPORT=${REPORT:-results/gpu/rehearsal_cpu.md}
JOBS=${JOBS:-2}
IMAGE=(torch==2.11.0 triton==3.6.0 transformers==5.17.0 numpy==2.5.2 sentencepiece==0.2.2 tokenizers==0.23.2
       safetensors==0.8.0)
TEST_TOOLS=(pytest pytest-xdist protobuf datasets)
mkdir -p "$DIR" "$(dirname "$REPORT")"
DIR=$(cd "$DIR" && pwd)
LOG=$DIR/phases.txt
: > "$LOG"

python312() {  # the first candidate that runs and is 3.12
  local candidate
  for candidate in "${PYTHON312:-}" python3.12 $(ls -d "$(pyenv root 2>/dev/null || echo ~/.pyenv)"/versions/3.12*/bin/python3.12 2>/dev/null | sort -V -r); do
    [ -n "$candidate" ] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null &&
      { command -v "$candidate"; return 0; }
  done
  echo "error: no Python 3.12 found (set PYTHON312=/path/to/python3.12; Debian 12 has 3.11 only)" >&2
  return 1
}

# phase NAME COMMAND...: run it, output to $DIR/NAME.log, one line "NAME: exit N (S s)" in $LOG
phase() {
  local name=$1 start=$SECONDS
  shift
  "$@" > "$DIR/$name.log" 2>&1
  local rc=$? note
  note=$(tail -1 "$DIR/$name.log" | grep -x -E "cached|kept")
  echo "$name: exit $rc ($((SECONDS - start)) s${note:+, $note})" | tee -a "$LOG"
  return $rc
}

download() {  # once: the image's versions and the test tools, with every dependency, for this Python
  [ -f "$DIR/wheels/.complete" ] && { echo "cached"; return 0; }
  local start=$SECONDS
  "$PY312" -m venv --clear "$DIR/pip"
  "$DIR/pip/bin/python" -m pip download --dest "$DIR/wheels" "${IMAGE[@]}" "${TEST_TOOLS[@]}" &&
    echo "downloaded in $((SECONDS - start)) s on $(date -u +%F)" > "$DIR/wheels/.complete"
}

install() {  # a fresh venv from the wheel folder, offline (kept while the pins are the same, unless FRESH=1)
  local pins="$PY312 ${IMAGE[*]} ${TEST_TOOLS[*]}"
  if [ "${FRESH:-0}" != 1 ] && [ "$(cat "$DIR/venv/.pins" 2>/dev/null)" = "$pins" ]; then echo "kept"; return 0; fi
  "$PY312" -m venv --clear "$DIR/venv" &&
    "$DIR/venv/bin/python" -m pip install --quiet --no-index --find-links "$DIR/wheels" "${IMAGE[@]}" "${TEST_TOOLS[@]}" &&
    echo "$pins" > "$DIR/venv/.pins"
}

kernel() {  # the C++ CPU operator built once for this torch (about a minute of g++, longer under load), before the
  # capped steps: a step that times out mid-build leaves torch's build lock behind and the next build waits on it
  rm -rf "$DIR/kernel_deps"
  "$DIR/venv/bin/python" -m pip install --quiet --no-index --no-deps --find-links eval/gpu_wheels \
    --target "$DIR/kernel_deps" ninja &&
    PATH="$DIR/kernel_deps/bin:$PATH" PYTHONPATH="$ROOT:$DIR/kernel_deps" "$DIR/venv/bin/python" -c \
      "from regulargpt.kernels.sliding_dilated_cpp import build_error; e = build_error(); print(e or 'C++ kernel built'); raise SystemExit(e is not None)"
}

versions() {
  "$DIR/venv/bin/python" - <<'EOF'
import importlib.metadata as md, sys
print("| package | version |\n|---|---|")
print(f"| python | {sys.version.split()[0]} ({sys.executable}) |")
for name in ("torch", "triton", "transformers", "numpy", "sentencepiece", "tokenizers", "safetensors", "pytest",
             "datasets", "matplotlib", "deepspeed", "wandb"):
    try:
        print(f"| {name} | {md.version(name)} |")
    except md.PackageNotFoundError:
        print(f"| {name} | not installed |")
import torch
print(f"\ntorch: CUDA build {torch.version.cuda}, torch.cuda.is_available() = {torch.cuda.is_available()}")
EOF
}

check() {  # the campaign's flow at tiny sizes, both parts, exactly as on the GPU machine (its env step installs
  # eval/gpu_wheels offline into $WORK/deps)
  rm -rf "$DIR/check" "$DIR/work"
  local rc=0
  DEVICE=cpu OUT="$DIR/check" WORK="$DIR/work" PYTHON="$DIR/venv/bin/python" bash eval/gpu_campaign.sh || rc=1
  DEVICE=cpu OUT="$DIR/check" WORK="$DIR/work" PYTHON="$DIR/venv/bin/python" bash eval/gpu_campaign.sh --part speed ||
    rc=1
  return $rc
}

suite() {  # the non-slow suite, with the check's deps (deepspeed and what it imports) on the path
  OMP_NUM_THREADS=1 PYTHONPATH="$ROOT:$DIR/work/deps" PATH="$DIR/work/deps/bin:$PATH" \
    "$DIR/venv/bin/python" -m pytest -q -p no:cacheprovider -n "$JOBS" -m "not slow" -rfEs tests
}

PY312=$(python312) || exit 2
phase download download
du_wheels=$(du -sb "$DIR/wheels" | cut -f1)
phase install install || { cat "$DIR/install.log"; exit 1; }
phase versions versions
[ -d eval/gpu_wheels ] || { echo "error: eval/gpu_wheels does not exist; build it with make gpu-wheels" >&2; exit 2; }
phase kernel kernel
phase check check
phase suite suite
{
  echo "# The GPU check rehearsed on CPU under the GPU image's versions"
  echo
  echo "\`bash eval/rehearse_gpu.sh\` (\`make rehearse-gpu\`), $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
       "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!results' || echo ' + uncommitted changes'), on" \
       "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))."
  echo
  echo "Python 3.12 from \`$PY312\`; wheels: $(ls "$DIR/wheels" | grep -c '\.whl$') files," \
       "$((du_wheels / 1048576)) MiB in \`$DIR/wheels\` ($(cat "$DIR/wheels/.complete"); later runs install offline)."
  echo
  cat "$DIR/versions.log"
  echo
  echo "| phase | result |"
  echo "|---|---|"
  sed 's/^\([a-z]*\): \(.*\)$/| \1 | \2 |/' "$LOG"
  echo
  echo "The campaign's steps (\`DEVICE=cpu bash eval/gpu_campaign.sh\` and \`--part speed\`, tiny sizes):"
  echo
  echo "| step | result |"
  echo "|---|---|"
  cat "$DIR/check/summary-lm.txt" "$DIR/check/summary-speed.txt" 2>/dev/null | sed 's/^\([a-z_]*\): \(.*\)$/| \1 | \2 |/'
  echo
  echo "The non-slow suite (\`pytest -m 'not slow' -n $JOBS\`): $(tail -1 "$DIR/suite.log")"
  grep -E "^(FAILED|ERROR|SKIPPED) " "$DIR/suite.log" | sed 's/^/    /'
} > "$REPORT.tmp"
mv "$REPORT.tmp" "$REPORT"
cat "$REPORT"
! grep -q -v ": exit 0 " "$LOG" "$DIR/check/summary-lm.txt" "$DIR/check/summary-speed.txt"
