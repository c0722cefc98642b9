#!/usr/bin/env bash
# Issue 21's first-step run on the GPU machine without network (sm_90, torch 2.11.0+cu130, triton 3.6.0 - fla
# needs tilelang there, fla#640 - transformers 5.17.0): fastpath-hooks installs, checks and warms tilelang and
# fla from a cold environment (a modeling import, no training step), then benchmarks/first_step.py times the
# first training step of fresh processes against their warm steps, and profiles where it goes.
#
# Carried in (gitignored; made on the CPU machine from the worktree root before the device call):
#   .whl-qla/ (WHEELHOUSE) - the kernels' wheels, as benchmarks/h200_qla.sh says
#   .whl/ - the fastpath-hooks wheel of this branch (HOOKS_WHEELS):
#     .venv/bin/python -m pip wheel -q --no-deps -w .whl .
#
# THE RUN (two device calls on nvidia-h200, carry [".whl", ".whl-qla"], ~13 min in all: the install's
# Hopper numeric check and JIT warm-up ~6.5 min, then 12 fresh processes):
#     bash benchmarks/h200_first_step.sh facts start wait      # call 1
#     bash benchmarks/h200_first_step.sh wait                  # call 2, at once (the machine stays warm 30 s)
# Results: copy the files (files_at) to benchmarks/results/h200-<date>-first-step/.
#
# Phases: facts (the machine), start (the BACKGROUND: a fresh venv with fastpath-hooks; its install at the
# modeling imports of qwen3_5 and qwen3_next; `doctor`; the series; the report), wait (polls until
# ${WAIT_UNTIL:-570} s into the call, copies what there is to $OUT). $OUT: log.txt, bg.log, install.txt,
# doctor.txt, first-step.json (the table's rows, the verdict and every case's raw figures and profile).
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # step, fresh_env
OUT=${OUT:-/tmp/h200-first-out}
WORK=${WORK:-/tmp/first-h200}
mkdir -p "$OUT" "$WORK"
BASE=${BASE:-/opt/torch/.venv/bin/python3}
[ -x "$BASE" ] || BASE=python3
ENV1=$WORK/env1
export PYTHONUNBUFFERED=1
WHEELHOUSE=$(cd "${WHEELHOUSE:-.whl-qla}" 2>/dev/null && pwd || echo "${WHEELHOUSE:-.whl-qla}")
export FASTPATH_HOOKS_FIND_LINKS=$WHEELHOUSE FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_CACHE_DIR=$WORK/cache
export FASTPATH_HOOKS_SKIP=causal-conv1d,mamba-ssm FASTPATH_HOOKS_INSTALLER=pip   # uv refuses the LZMA tilelang
HOOKS_WHEELS=${HOOKS_WHEELS:-$(ls "$PWD"/.whl/fastpath_hooks-*.whl 2>/dev/null)}
SERIES_ARGS=${SERIES_ARGS:-}
[ $# -gt 0 ] || set -- facts start wait
if [ "$1" != _bg ]; then exec > >(tee -a "$OUT/log.txt") 2>&1; fi


phase_facts() {
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  "$BASE" -c 'import torch, triton, transformers, sys; print(torch.__version__, triton.__version__, transformers.__version__, sys.version.split()[0])'
  which nvcc && nvcc --version | tail -1
  ls -la "$WHEELHOUSE" $HOOKS_WHEELS
}

phase_start() {
  running && { echo "the background is running already: 'wait' for it"; return 1; }
  step "started in the background (log $WORK/bg.log)"
  rm -f "$WORK"/bg.*
  date -u > "$WORK/bg.started"
  local detach=; command -v setsid >/dev/null && detach=setsid
  nohup $detach bash "$0" _bg > "$WORK/bg.log" 2>&1 < /dev/null &
  local i; for i in $(seq 50); do [ -f "$WORK/bg.pid" ] && break; sleep 0.2; done   # 'wait' reads it
}

phase__bg() {
  echo "$$" > "$WORK/bg.pid"
  step "a fresh environment with fastpath-hooks"
  # shellcheck disable=SC2086
  fresh_env "$ENV1" --no-deps $HOOKS_WHEELS || { echo "!! could not make $ENV1"; echo fail > "$WORK/bg.done"; return; }
  step "the install: two modeling imports, no training step (tilelang, fla: installed, checked, warmed)"
  local t0=$SECONDS
  "$ENV1/bin/python" - > "$WORK/install.txt" 2>&1 <<'PY'
import time
t = time.perf_counter()
import fastpath_hooks
fastpath_hooks.install(on_event=lambda e: print(e.get("type"), e.get("message"), flush=True))
import transformers.models.qwen3_5.modeling_qwen3_5  # noqa: F401  (fastpath-hooks decides at this import)
import transformers.models.qwen3_next.modeling_qwen3_next  # noqa: F401
print(f"install + checks + warm-up: {time.perf_counter() - t:.1f} s")
PY
  echo "install exit $? in $((SECONDS - t0)) s"; tail -3 "$WORK/install.txt"
  "$ENV1/bin/fastpath-hooks" doctor > "$WORK/doctor.txt" 2>&1
  step "the first steps: one fresh process a case"
  # shellcheck disable=SC2086
  "$ENV1/bin/python" benchmarks/first_step.py series --python "$ENV1/bin/python" --out-dir "$WORK/first" $SERIES_ARGS
  "$ENV1/bin/python" benchmarks/first_step.py report "$WORK"/first/*.json --out "$WORK/first-step.json"
  echo "done $?" > "$WORK/bg.done"
}

phase_wait() {
  wait_background h200_first_step.sh "${WAIT_UNTIL:-570}" || return 1
  for f in bg.log install.txt doctor.txt first-step.json; do cp "$WORK/$f" "$OUT/$f" 2>/dev/null; done
  [ -f "$WORK/bg.done" ] && echo "background: $(cat "$WORK/bg.done")"
  return 0
}

for phase in "$@"; do
  case $phase in
    facts) phase_facts ;;
    start) phase_start ;;
    _bg) phase__bg ;;
    wait) phase_wait ;;
    *) echo "unknown phase $phase: facts, start or wait"; exit 2 ;;
  esac
done
echo "done (${SECONDS}s)"
