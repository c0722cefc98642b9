#!/usr/bin/env bash
# Issue 33's benchmark on the GPU machine without network (sm_90, torch 2.11.0+cu130, triton 3.6.0 - fla needs tilelang
# there, fla#640 - transformers 5.17.0): the seconds from a training script's start to the end of its first training
# step (benchmarks/time_to_step.py: tiny Qwen3.5 / Granite-4.0-H, seq 4096, bf16, forward + loss + backward + AdamW),
# in one background run, one case after the other, most important first:
#   qwen3_5-cold            a cold node: a fresh HOME (empty Triton / TileLang / CUDA caches), an empty fastpath-hooks
#                           cache, a fresh venv with fastpath-hooks; the script calls fastpath_hooks.install() first
#   qwen3_5-later           a later environment: a fresh venv, the same HOME and fastpath-hooks cache
#   qwen3_5-by-hand-cold    the baseline: fla + tilelang pip-installed (from the same wheelhouse, timed and counted),
#                           no fastpath-hooks, a fresh HOME (empty JIT caches)
#   granitemoehybrid-cold   as qwen3_5-cold (causal-conv1d and mamba-ssm built from their sdists for sm_90)
#   granitemoehybrid-later  as qwen3_5-later
#   qwen3_5-by-hand-later   as qwen3_5-by-hand-cold in a fresh venv (pip install again), the same HOME
# CASES="qwen3_5-cold ..." runs only those (in that order). Each case's JSON and log go to $WORK/cases, and the summary
# (issue 33's {"case", "first_step_done_s", "step_ms", "installed"} rows) is rewritten after every case.
#
# Carried in (gitignored; made on the CPU machine from the worktree root before the device calls):
#   .whl-qla/ (WHEELHOUSE) - fla-core + flash-linear-attention 0.6.0, tilelang 0.1.15 + apache-tvm-ffi 0.1.12, z3-solver,
#     torch-c-dlpack-ext and the causal-conv1d 1.7.0 / mamba-ssm 2.3.2.post1 sdists:
#     PYTHON=.venv/bin/python bash ../shared/tools/gpu-wheelhouse.sh .whl-qla fla-core==0.6.0 \
#       flash-linear-attention==0.6.0 tilelang==0.1.15 apache-tvm-ffi==0.1.12 z3-solver==4.15.4.0 \
#       torch-c-dlpack-ext==0.1.5 sdist:causal-conv1d==1.7.0 sdist:mamba-ssm==2.3.2.post1
#   .whl/ - this branch's fastpath-hooks wheel (HOOKS_WHEELS): .venv/bin/python -m pip wheel -q --no-deps -w .whl .
#
# THE RUN (nvidia-h200; each call at once after the last - the machine goes back after 30 s idle; ~20 min in all):
#     bash benchmarks/h200_time_to_step.sh facts stash start wait    # call 1, carry [".whl-qla", ".whl"]
#     bash benchmarks/h200_time_to_step.sh wait                      # call 2, 3 ... until "background: done"
# (Where one call cannot carry both, carry .whl-qla alone with `facts stash`, then .whl with `start wait`.)
# Results: copy the files (files_at) to benchmarks/results/h200-<date>-time-to-step/.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # step, fresh_env
OUT=${OUT:-/tmp/h200-tts-out}
WORK=${WORK:-/tmp/tts-h200}
KEEP=${KEEP:-/tmp/tts-carried}
mkdir -p "$OUT" "$WORK" "$KEEP"
BASE=${BASE:-/opt/torch/.venv/bin/python3}
[ -x "$BASE" ] || BASE=python3
DRIVER=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/time_to_step.py
WHEELHOUSE=${WHEELHOUSE:-.whl-qla}
HOOKS_WHEELS=${HOOKS_WHEELS:-$(ls .whl/fastpath_hooks-*.whl 2>/dev/null)}
CASES=${CASES:-qwen3_5-cold qwen3_5-later qwen3_5-by-hand-cold granitemoehybrid-cold granitemoehybrid-later qwen3_5-by-hand-later}
CASE_TIMEOUT=${CASE_TIMEOUT:-900}
DRIVER_ARGS=${DRIVER_ARGS:-}   # e.g. "--device cpu --tiny --seq 64 --steps 2": a CPU check of the script (BASE=.venv/bin/python)
export PYTHONUNBUFFERED=1
[ $# -gt 0 ] || set -- facts stash start wait
if [ "$1" != _bg ]; then exec > >(tee -a "$OUT/log.txt") 2>&1; fi


phase_facts() {
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  "$BASE" -c 'import torch, triton, transformers, sys; print(torch.__version__, triton.__version__, transformers.__version__, sys.version.split()[0])'
  which nvcc && nvcc --version | tail -1
}

phase_stash() {   # what this call carried, put aside for the background (a later call carries other things)
  step "the wheelhouse put aside in $KEEP"
  mkdir -p "$KEEP/wh"
  if [ -d "$WHEELHOUSE" ]; then cp "$WHEELHOUSE"/* "$KEEP/wh/"; fi
  # shellcheck disable=SC2086
  [ -n "$HOOKS_WHEELS" ] && cp $HOOKS_WHEELS "$KEEP/wh/"
  # the scripts too: a later call replaces the working tree under a background started from it
  rm -rf "$KEEP/src" && mkdir -p "$KEEP/src" && cp -r "$(dirname "$DRIVER")" "$(dirname "$DRIVER")/../examples" "$KEEP/src/"
  ls -la "$KEEP/wh"
}

phase_start() {
  running && { echo "the background is running already: 'wait' for it"; return 1; }
  phase_stash
  local f missing=()
  for f in "fla_core-*.whl" "flash_linear_attention-*.whl" "tilelang-*.whl" "apache_tvm_ffi-*.whl" "z3_solver-*.whl" \
           "torch_c_dlpack_ext-*.whl" causal_conv1d-1.7.0.tar.gz mamba_ssm-2.3.2.post1.tar.gz "fastpath_hooks-*.whl"; do
    compgen -G "$KEEP/wh/$f" >/dev/null || missing+=("$f")
  done
  [ ${#missing[@]} -eq 0 ] || { echo "the wheelhouse $KEEP/wh lacks ${missing[*]}: carry it (the header)"; return 1; }
  step "started in the background (log $WORK/bg.log): $CASES"
  rm -f "$WORK"/bg.*   # (cases of an earlier start are kept: a case run again replaces its own)
  date -u > "$WORK/bg.started"
  local detach=; command -v setsid >/dev/null && detach=setsid
  (cd "$WORK" && nohup $detach bash "$KEEP/src/benchmarks/$(basename "$0")" _bg > "$WORK/bg.log" 2>&1 < /dev/null &)
  local i; for i in $(seq 50); do [ -f "$WORK/bg.pid" ] && break; sleep 0.2; done
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# one_case NAME: its group's HOME and fastpath-hooks cache (emptied for a -cold case), a fresh venv, the script
one_case() {
  local name=$1 model=${1%%-*} group=${1%-*} via=install t venv setup rc
  local home=$WORK/$group/home cache=$WORK/$group/cache
  venv=$WORK/venvs/$name
  step "case $name"
  case $name in *-cold) rm -rf "${WORK:?}/$group" ;; esac
  mkdir -p "$home" "$cache" "$WORK/venvs"
  t=$(now)
  case $name in
    *by-hand*)   # what a user does by hand: the kernels' wheels pip-installed, fastpath-hooks nowhere
      via=none
      HOME=$home fresh_env "$venv" --no-deps "$KEEP"/wh/fla_core-*.whl "$KEEP"/wh/flash_linear_attention-*.whl \
        "$KEEP"/wh/tilelang-*.whl "$KEEP"/wh/apache_tvm_ffi-*.whl "$KEEP"/wh/z3_solver-*.whl \
        "$KEEP"/wh/torch_c_dlpack_ext-*.whl || { echo "!! could not make $venv"; return 1; }
      setup="{\"pip_install_kernels_s\": $(since "$t")}" ;;
    *)
      HOME=$home fresh_env "$venv" --no-deps "$KEEP"/wh/fastpath_hooks-*.whl || { echo "!! could not make $venv"; return 1; }
      setup="{\"pip_install_fastpath_hooks_s\": $(since "$t")}" ;;
  esac
  echo "setup: $setup"
  t=$(now)
  # shellcheck disable=SC2046,SC2086
  (cd "$WORK" && env HOME="$home" FASTPATH_HOOKS_CACHE_DIR="$cache" FASTPATH_HOOKS_FIND_LINKS="$KEEP/wh" \
    FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_INSTALLER=pip $( [ "$via" = none ] && echo FASTPATH_HOOKS_DISABLE=1 ) \
    BENCH_T0="$(now)" timeout "$CASE_TIMEOUT" "$venv/bin/python" "$DRIVER" case --model "$model" --via "$via" --name "$name" \
    --setup "$setup" --out "$WORK/cases/$name.json" $DRIVER_ARGS > "$WORK/cases/$name.log" 2>&1)
  rc=$?
  echo "exit $rc, $(since "$t") s from outside"
  grep -E '^fastpath-hooks' "$WORK/cases/$name.log" | cut -c1-240
  tail -1 "$WORK/cases/$name.log" | cut -c1-600
}

summary() {
  compgen -G "$WORK/cases/*.json" >/dev/null || return 0
  "$BASE" "$DRIVER" summary "$WORK"/cases/*.json --out "$WORK/summary.json"
}

phase__bg() {
  echo "$$" > "$WORK/bg.pid"
  mkdir -p "$WORK/cases"
  local name
  for name in $CASES; do
    one_case "$name"
    summary
  done
  local last; last=$(ls -d "$WORK"/venvs/*-later 2>/dev/null | grep -v by-hand | tail -1)
  if [ -n "$last" ]; then
    local group; group=$(basename "$last"); group=${group%-*}
    HOME=$WORK/$group/home FASTPATH_HOOKS_CACHE_DIR=$WORK/$group/cache FASTPATH_HOOKS_FIND_LINKS=$KEEP/wh \
      FASTPATH_HOOKS_OFFLINE=1 "$last/bin/fastpath-hooks" doctor > "$WORK/doctor.txt" 2>&1
  fi
  echo "done" > "$WORK/bg.done"
}

phase_wait() {
  wait_background h200_time_to_step.sh "${WAIT_UNTIL:-560}" || return 1
  cp "$WORK/bg.log" "$WORK/summary.json" "$WORK/doctor.txt" "$OUT/" 2>/dev/null
  (cd "$WORK/cases" 2>/dev/null && tar czf "$OUT/cases.tgz" . 2>/dev/null)
  # fastpath-hooks' own records: build logs, each compile's record, the build history, the checks
  (cd "$WORK" && tar czf "$OUT/hooks-caches.tgz" --exclude='*.whl' --exclude='*/cache/wheels' --exclude='*/jit/triton' \
    --exclude='*/jit/tilelang' --exclude='*.so' --exclude='*.o' ./*/cache 2>/dev/null)
  if [ "$(stat -c %s "$OUT/hooks-caches.tgz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
    (cd "$WORK" && tar czf "$OUT/hooks-caches.tgz" ./*/cache/logs ./*/cache/numeric ./*/cache/builds/history.jsonl 2>/dev/null)
  fi
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
