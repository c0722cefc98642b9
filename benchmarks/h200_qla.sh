#!/usr/bin/env bash
# Issue 21's H200 run: flash-qla under fla, installed, checked and warmed by fastpath-hooks from a cold
# environment on the GPU machine without network (sm_90, torch 2.11.0+cu130, triton 3.6.0 - so fla needs
# tilelang there, fla#640 - nvcc 13.0, transformers 5.17.0, Python 3.12), then benchmarks/qla_speedup.py:
# tiny Qwen3.5 and Qwen3-Next training steps at 4096 and 16384 tokens on the torch path, fla + tilelang,
# and fla + tilelang + flash-qla; the first step after the warm-up, and from an empty JIT cache without it.
#
# Carried in (about 61 MiB):
#   .whl/ - the kernels' wheelhouse: /work/research/wh-b (fla-core and flash-linear-attention 0.6.0,
#           tilelang 0.1.15 (LZMA: pip installs it, uv does not), apache-tvm-ffi 0.1.12,
#           torch-c-dlpack-ext 0.1.5, flash-qla 0.1.3) + z3-solver from /work/research/wh-a:
#     mkdir -p .whl && cp /work/research/wh-b/* .whl/ && cp /work/research/wh-a/z3_solver-* .whl/
#   .gpu/ - the fastpath-hooks wheel of this branch and platformdirs (not on the image):
#     .venv/bin/python -m pip wheel -q --no-deps -w .gpu . && cp /work/research/wh-a/platformdirs-* .gpu/
#
# Phases, given as arguments and run in order (one device call may run 600 s; the machine must stay warm
# between calls - everything lives in $WORK, default /tmp/qla-h200 - and $OUT gets at most 8 files):
#   facts  - the machine: GPU, the image's packages, nvcc, the carry
#   torch  - a fresh venv over the image (fastpath-hooks installed, no kernel), then the torch path
#            (FASTPATH_HOOKS_DISABLE=1, fla blocked): ~1.5 min
#   fast   - in the BACKGROUND: the same venv with fastpath-hooks on (install()): the first modeling import
#            installs tilelang, fla and flash-qla from .whl, checks flash-qla against fla's own path and warms
#            the JIT caches (the verification children), then every mode is timed; returns at once
#   wait   - polls for it until ${WAIT_UNTIL:-540} s into this call, printing its log's tail
#   cold   - FASTPATH_HOOKS_DISABLE=1 with empty TRITON_CACHE_DIR / TILELANG_CACHE_DIR: the first steps of
#            fla + tilelang + flash-qla as they are without the warm-up: ~2 min
#   report - the table and the verdicts (qla-h200.json)
#   all    - facts torch fast wait cold report, waiting without limit
# e.g. device call 1: `bash benchmarks/h200_qla.sh facts torch fast wait`   (<= 10 min)
#      device call 2: `bash benchmarks/h200_qla.sh wait cold report`        (wait returns at once if done)
# $OUT (each call's own): log.txt, and by phase torch.json, fast.json, fast.log, cold.json, qla-h200.json,
# doctor.txt.
set -uo pipefail
OUT=${OUT:-/tmp/h200-qla-out}
WORK=${WORK:-/tmp/qla-h200}
mkdir -p "$OUT" "$WORK"
BASE=${BASE:-/opt/torch/.venv/bin/python3}
[ -x "$BASE" ] || BASE=python3
ENV1=$WORK/env1
export PYTHONUNBUFFERED=1
# the kernels from the carried wheelhouse only; causal-conv1d and mamba-ssm left alone (a 5-min build for
# torch 2.11, and the same in every mode: transformers' torch conv)
export FASTPATH_HOOKS_FIND_LINKS=$PWD/.whl FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_CACHE_DIR=$WORK/cache
export FASTPATH_HOOKS_SKIP=causal-conv1d,mamba-ssm FASTPATH_HOOKS_INSTALLER=pip
BENCH=${BENCH:-benchmarks/qla_speedup.py}
BENCH_ARGS=${BENCH_ARGS:-}
[ $# -gt 0 ] || set -- all
if [ "$1" != _fast ]; then exec > >(tee -a "$OUT/log.txt") 2>&1; fi

step() { echo; echo "=== $* ($(date -u +%H:%M:%S), ${SECONDS}s)"; }

fresh_env() {   # fresh_env DIR: a venv over the image's packages, with fastpath-hooks installed
  local dir=$1 base_site own_site
  base_site=$($BASE -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  rm -rf "$dir"
  $BASE -m venv --without-pip "$dir" || return 1
  own_site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "$base_site" > "$own_site/zz-image-site.pth"
  "$dir/bin/python" -m pip install -q --no-index --no-deps .gpu/*.whl || return 1
}

need_env() { [ -x "$ENV1/bin/python" ] || { echo "no $ENV1: run the torch phase first (or the machine went cold)"; exit 1; }; }

phase_facts() {
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  $BASE - <<'PY'
import importlib.metadata as md, sys
for n in ("torch", "triton", "transformers", "numpy", "einops", "packaging", "filelock", "platformdirs",
          "fla-core", "tilelang", "apache-tvm-ffi", "flash-qla", "cloudpickle", "ml-dtypes", "psutil", "tqdm"):
    try: print(f"{n:24s}{md.version(n)}")
    except md.PackageNotFoundError: print(f"{n:24s}-")
print("python", sys.version.split()[0])
PY
  which nvcc && nvcc --version | tail -2
  ls -la .whl .gpu
}

phase_torch() {
  step "a fresh environment; the torch path (fla blocked, hooks off)"
  fresh_env "$ENV1" || { echo "!! could not make $ENV1"; return 1; }
  # shellcheck disable=SC2086
  FASTPATH_HOOKS_DISABLE=1 timeout 540 "$ENV1/bin/python" "$BENCH" torch $BENCH_ARGS --out "$OUT/torch.json"
  echo "torch phase exit $?"
  cp "$OUT/torch.json" "$WORK/torch.json" 2>/dev/null
}

phase_fast() {   # start _fast in the background, return at once
  need_env
  step "fast: started in the background (log $WORK/fast.log, marker $WORK/fast.done)"
  rm -f "$WORK/fast.done" "$WORK/fast.log" "$WORK/fast.pid" "$WORK/fast.json"
  date -u > "$WORK/fast.started"
  local detach=; command -v setsid >/dev/null && detach=setsid
  nohup $detach bash "$0" _fast > "$WORK/fast.log" 2>&1 < /dev/null &
}

phase__fast() {
  echo "$$" > "$WORK/fast.pid"
  "$ENV1/bin/fastpath-hooks" plan 2>&1 | tail -8
  # shellcheck disable=SC2086
  timeout 900 "$ENV1/bin/python" "$BENCH" fast $BENCH_ARGS --out "$WORK/fast.json"
  local rc=$?
  "$ENV1/bin/fastpath-hooks" doctor > "$WORK/doctor.txt" 2>&1
  echo "$rc" > "$WORK/fast.done"
}

phase_wait() {
  local until=${WAIT_UNTIL:-540}
  step "wait for the fast phase (until ${until}s into this call)"
  [ -f "$WORK/fast.started" ] || { echo "no fast phase started in $WORK: run the fast phase first (or the machine went cold)"; return 1; }
  while [ ! -f "$WORK/fast.done" ]; do
    sleep 5
    [ -f "$WORK/fast.done" ] && break
    if [ -f "$WORK/fast.pid" ] && ! kill -0 "$(cat "$WORK/fast.pid")" 2>/dev/null && [ ! -f "$WORK/fast.done" ]; then
      echo "the fast phase is gone without finishing:"; tail -5 "$WORK/fast.log"; break
    fi
    if [ "$until" != none ] && [ "$SECONDS" -ge "$until" ]; then
      echo "still running at ${SECONDS}s; call 'wait' again"; tail -3 "$WORK/fast.log"; break
    fi
    sleep 10
    echo "--- ${SECONDS}s: $(grep -v '^\s*$' "$WORK/fast.log" 2>/dev/null | tail -1 | cut -c1-200)"
  done
  cp "$WORK/fast.log" "$OUT/fast.log" 2>/dev/null
  cp "$WORK/fast.json" "$OUT/fast.json" 2>/dev/null
  cp "$WORK/doctor.txt" "$OUT/doctor.txt" 2>/dev/null
  [ -f "$WORK/fast.done" ] && echo "fast phase exit $(cat "$WORK/fast.done")"
  [ -f "$WORK/fast.done" ]
}

phase_cold() {
  need_env
  step "cold: empty JIT caches, hooks off: flash-qla's first steps without the warm-up"
  local jit=$WORK/cold-jit
  rm -rf "$jit" && mkdir -p "$jit/triton" "$jit/tilelang"
  # shellcheck disable=SC2086
  FASTPATH_HOOKS_DISABLE=1 TRITON_CACHE_DIR=$jit/triton TILELANG_CACHE_DIR=$jit/tilelang \
    timeout 540 "$ENV1/bin/python" "$BENCH" cold --models qwen3_5 --steps 2 --warmup 0 $BENCH_ARGS --out "$OUT/cold.json"
  echo "cold phase exit $?"
  cp "$OUT/cold.json" "$WORK/cold.json" 2>/dev/null
}

phase_report() {
  need_env
  step "report"
  local inputs=()
  for f in torch fast cold; do [ -f "$WORK/$f.json" ] && inputs+=("$WORK/$f.json"); done
  "$ENV1/bin/python" "$BENCH" report "${inputs[@]}" --out "$OUT/qla-h200.json"
}

for phase in "$@"; do
  case $phase in
    facts) phase_facts ;;
    torch) phase_torch ;;
    fast) phase_fast ;;
    _fast) phase__fast ;;
    wait) phase_wait ;;
    cold) phase_cold ;;
    report) phase_report ;;
    all) phase_facts; phase_torch; phase_fast; WAIT_UNTIL=none phase_wait; phase_cold; phase_report ;;
    *) echo "unknown phase $phase: facts, torch, fast, wait, cold, report or all"; exit 2 ;;
  esac
done
echo "done (${SECONDS}s)"
