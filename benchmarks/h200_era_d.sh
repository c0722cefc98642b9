#!/usr/bin/env bash
# Issue 32 on the GPU machine without network (sm_90, torch 2.11.0+cu130, triton 3.6.0): transformers 5.25.0 with
# kernels 0.19.1 carried in beside the image's 5.17; `from_pretrained(path, device_map="cuda")` of a tiny Qwen3.5
# and a tiny Granite-4.0-H saved locally, with HF_HUB_OFFLINE=1 and without it (no network: the hub does not
# answer), through install() and through `fastpath-hooks enable`, five training steps each; the torch path's first
# loss beside them; a stand-in hub kernel (tests/support/hub.py) in LOCAL_KERNELS chosen and checked.
# benchmarks/era_d.py runs each case in a fresh process and writes the summary.
#
# Carried in (gitignored; made on the CPU machine from the worktree root), over two calls (64 MiB a call):
#   .whl-qla/ - the kernels: fla-core + flash-linear-attention 0.6.0, tilelang 0.1.15 + apache-tvm-ffi 0.1.12,
#     torch-c-dlpack-ext, and the causal-conv1d 1.7.0 / mamba-ssm 2.3.2.post1 sdists (z3-solver, tilelang's, then
#     moved to .whl: each call's tree must stay under 64 MiB):
#     PYTHON=.venv/bin/python bash ../shared/tools/gpu-wheelhouse.sh .whl-qla fla-core==0.6.0 \
#       flash-linear-attention==0.6.0 tilelang==0.1.15 apache-tvm-ffi==0.1.12 z3-solver==4.15.4.0 \
#       torch-c-dlpack-ext==0.1.5 sdist:causal-conv1d==1.7.0 sdist:mamba-ssm==2.3.2.post1
#   .whl/ - this branch's fastpath-hooks wheel, transformers 5.25.0, kernels 0.19.1, huggingface-hub 2.4.0, httpx2,
#     httpcore2 2.17.0, truststore, tomlkit, click, idna, anyio, h11, hf-xet, regex, typing-extensions
#     (cp312 manylinux, `pip download --no-deps`)
#
# THE RUN (nvidia-h200, each call at once after the last: the machine stays warm 30 s):
#     bash benchmarks/h200_era_d.sh facts stash          # call 1, carry [".whl-qla"]: the kernels put aside
#     bash benchmarks/h200_era_d.sh start wait           # call 2, carry [".whl"]: starts the cases in the background
#     bash benchmarks/h200_era_d.sh wait                 # call 3 (and more) until "background: done"
# Results: copy the files (files_at) to benchmarks/results/h200-<date>-era-d/.
# ONLY=enable,install-on (case-name prefixes, comma-separated) runs just those cases (the rest were run:
# benchmarks/results/h200-2026-12-04-era-d); the build ahead runs only where a granite case is left.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # step, fresh_env
OUT=${OUT:-/tmp/h200-era-d-out}
WORK=${WORK:-/tmp/era-d-h200}
KEEP=${KEEP:-/tmp/era-d-carried}
mkdir -p "$OUT" "$WORK" "$KEEP"
BASE=${BASE:-/opt/torch/.venv/bin/python3}
[ -x "$BASE" ] || BASE=python3
ENV1=$WORK/env
export PYTHONUNBUFFERED=1
export FASTPATH_HOOKS_FIND_LINKS=$KEEP/qla FASTPATH_HOOKS_CACHE_DIR=$WORK/cache FASTPATH_HOOKS_INSTALLER=pip
PINS_FILE=$WORK/pins.json   # fla's checks narrowed to fit the device budget: see the background's first step
SEQ=${SEQ:-2048}
[ $# -gt 0 ] || set -- facts stash
if [ "$1" != _bg ]; then exec > >(tee -a "$OUT/log.txt") 2>&1; fi


phase_facts() {
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  "$BASE" -c 'import torch, triton, transformers, sys; print(torch.__version__, triton.__version__, transformers.__version__, sys.version.split()[0])'
  which nvcc && nvcc --version | tail -1
}

phase_stash() {
  step "the kernels' wheelhouse put aside for the next call"
  rm -rf "$KEEP/qla" && cp -r .whl-qla "$KEEP/qla" && ls "$KEEP/qla"
}

phase_start() {
  running && { echo "the background is running already: 'wait' for it"; return 1; }
  [ -d "$KEEP/qla" ] || { echo "no kernels' wheelhouse in $KEEP/qla: run 'stash' first (the machine went cold?)"; return 1; }
  rm -rf "$KEEP/whl" && cp -r .whl "$KEEP/whl" && mv "$KEEP"/whl/z3_solver-*.whl "$KEEP/qla/" 2>/dev/null   # (tilelang's)
  step "started in the background (log $WORK/bg.log)"
  rm -f "$WORK"/bg.*
  date -u > "$WORK/bg.started"
  local detach=; command -v setsid >/dev/null && detach=setsid
  nohup $detach bash "$0" _bg > "$WORK/bg.log" 2>&1 < /dev/null &
  local i; for i in $(seq 50); do [ -f "$WORK/bg.pid" ] && break; sleep 0.2; done
}

# one case: case NAME MODEL VIA OFFLINE [ENV=VALUE ...]
selected() {   # selected NAME: in ONLY (or ONLY unset)
  [ -z "${ONLY:-}" ] && return 0
  local p; for p in ${ONLY//,/ }; do case $1 in "$p"*) return 0 ;; esac; done
  return 1
}

case_() {
  local name=$1 model=$2 via=$3 offline=$4
  shift 4
  selected "$name" || return 0
  step "case $name: $model via $via, HF_HUB_OFFLINE=$offline $*"
  local t0=$SECONDS
  # shellcheck disable=SC2046
  env $( [ "$offline" = 1 ] && echo HF_HUB_OFFLINE=1 ) "$@" "$ENV1/bin/python" benchmarks/era_d.py case \
    --model "$WORK/models/$model" --via "$via" --offline "$offline" --seq "${CASE_SEQ:-$SEQ}" \
    --out "$WORK/cases/$name.json" > "$WORK/cases/$name.log" 2>&1
  echo "exit $? in $((SECONDS - t0)) s"; grep -E '^fastpath-hooks:' "$WORK/cases/$name.log" | cut -c1-220
  tail -1 "$WORK/cases/$name.log" | cut -c1-400
}

phase__bg() {
  echo "$$" > "$WORK/bg.pid"
  mkdir -p "$WORK/cases"
  step "a fresh environment: transformers 5.25.0 + kernels 0.19.1 over the image, fastpath-hooks"
  fresh_env "$ENV1" --no-deps "$KEEP"/whl/*.whl || { echo "!! could not make $ENV1"; echo fail > "$WORK/bg.done"; return; }
  "$ENV1/bin/python" -c 'import transformers, kernels, huggingface_hub, fastpath_hooks; print(transformers.__version__, kernels.__version__, huggingface_hub.__version__)'
  "$ENV1/bin/python" - "$PINS_FILE" "$SEQ" <<'PY'
import json, sys
# fla's checks narrowed to fit the device budget (what this run shows is loading and training on 5.25, not the
# checks' cost - issue 33's run measures that): its fp16 numeric check left out (149 s of JIT that training does not
# reuse, measured in this run's first attempt), the gated-delta-rule check and warm-up at the steps' length only
json.dump({"kernels": {"fla": {"numeric_checks": [], "warm": {"seqs": [int(sys.argv[2])], "final_state": [False]}}}},
          open(sys.argv[1], "w"))
PY
  "$ENV1/bin/python" benchmarks/era_d.py save --dir "$WORK/models"
  step "the torch path's first losses (FASTPATH_HOOKS_DISABLE=1, USE_HUB_KERNELS=0)"
  case_ torch-qwen qwen3_5 torch 1 FASTPATH_HOOKS_DISABLE=1 USE_HUB_KERNELS=0
  case_ torch-granite granitemoehybrid torch 1 FASTPATH_HOOKS_DISABLE=1 USE_HUB_KERNELS=0
  if [ -z "${ONLY:-}" ] || selected enable-on-granite || selected enable-off-granite || selected install-on-granite \
      || selected install-off-granite || selected hub-granite; then
    step "built ahead, side by side: fastpath-hooks install causal-conv1d mamba-ssm (the wheel cache)"
    FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_PINS="$PINS_FILE" "$ENV1/bin/fastpath-hooks" install causal-conv1d \
      mamba-ssm 2>&1 | cut -c1-220
  fi
  step "install() with HF_HUB_OFFLINE=1: tilelang and fla installed and checked here from the wheelhouse"
  case_ install-off-qwen qwen3_5 install 1 FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_PINS="$PINS_FILE"
  case_ install-off-granite granitemoehybrid install 1 FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_PINS="$PINS_FILE"
  step "a stand-in hub kernel: kernels-community/mamba-ssm in LOCAL_KERNELS (tests/support/hub.py), Granite"
  "$ENV1/bin/python" - "$WORK/hub" <<'PY'
import json, subprocess, sys
sys.path.insert(0, "tests")
from support import hub
out = subprocess.run([sys.executable, "-c", hub.SIGNATURES, "granitemoehybrid", "qwen3_5", "mamba"], capture_output=True, text=True,
                     check=True).stdout
print(hub.standin(sys.argv[1], "kernels-community/mamba-ssm", json.loads(out.strip().splitlines()[-1])))
PY
  CASE_SEQ=256 case_ hub-granite granitemoehybrid install 1 FASTPATH_HOOKS_PINS="$PINS_FILE" \
    LOCAL_KERNELS="kernels-community/mamba-ssm=$WORK/hub"
  step "fastpath-hooks enable: nothing in the script; no HF_HUB_OFFLINE (no network: the hub does not answer)"
  FASTPATH_HOOKS_PINS="$PINS_FILE" "$ENV1/bin/fastpath-hooks" enable
  case_ enable-on-qwen qwen3_5 enable 0 FASTPATH_HOOKS_PINS="$PINS_FILE"
  case_ enable-on-granite granitemoehybrid enable 0 FASTPATH_HOOKS_PINS="$PINS_FILE"
  case_ enable-off-qwen qwen3_5 enable 1 FASTPATH_HOOKS_PINS="$PINS_FILE"
  case_ enable-off-granite granitemoehybrid enable 1 FASTPATH_HOOKS_PINS="$PINS_FILE"
  "$ENV1/bin/fastpath-hooks" disable
  step "install() without HF_HUB_OFFLINE"
  case_ install-on-qwen qwen3_5 install 0 FASTPATH_HOOKS_PINS="$PINS_FILE"
  case_ install-on-granite granitemoehybrid install 0 FASTPATH_HOOKS_PINS="$PINS_FILE"
  "$ENV1/bin/fastpath-hooks" doctor > "$WORK/doctor.txt" 2>&1
  "$ENV1/bin/python" benchmarks/era_d.py summary "$WORK"/cases/*.json --out "$WORK/summary.json" > /dev/null
  echo "done" > "$WORK/bg.done"
}

phase_wait() {
  wait_background h200_era_d.sh "${WAIT_UNTIL:-560}" || return 1
  "$ENV1/bin/python" benchmarks/era_d.py summary "$WORK"/cases/*.json --out "$WORK/summary.json" > /dev/null 2>&1
  cp "$WORK/bg.log" "$WORK/doctor.txt" "$WORK/summary.json" "$OUT/" 2>/dev/null
  (cd "$WORK/cases" 2>/dev/null && tar czf "$OUT/cases.tgz" . 2>/dev/null)
  [ -f "$WORK/bg.done" ] && echo "background: $(cat "$WORK/bg.done")"
  return 0
}

for phase in "$@"; do
  case $phase in
    facts) phase_facts ;;
    stash) phase_stash ;;
    start) phase_start ;;
    _bg) phase__bg ;;
    wait) phase_wait ;;
    *) echo "unknown phase $phase: facts, stash, start or wait"; exit 2 ;;
  esac
done
echo "done (${SECONDS}s)"
