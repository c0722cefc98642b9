#!/usr/bin/env bash
# Issue 21's H200 run: flash-qla under fla, installed, checked and warmed by fastpath-hooks from a cold
# environment on the GPU machine without network (sm_90, torch 2.11.0+cu130, triton 3.6.0 - so fla needs
# tilelang there, fla#640 - nvcc 13.0, transformers 5.17.0, Python 3.12), then benchmarks/qla_speedup.py:
# tiny Qwen3.5 and Qwen3-Next training steps at 4096 and 16384 tokens on the torch path, fla + tilelang,
# and fla + tilelang + flash-qla; the first step after the warm-up, and from an empty JIT cache without it.
#
# Carried in (about 60 MiB, gitignored: put them there on the CPU machine, from the worktree root, before
# the device call):
#   .whl-qla/ (WHEELHOUSE) - the kernels' wheels: fla-core and flash-linear-attention 0.6.0, tilelang 0.1.15
#           (repacked with LZMA: pip installs it, uv refuses it, so FASTPATH_HOOKS_INSTALLER=pip below),
#           apache-tvm-ffi 0.1.12, torch-c-dlpack-ext 0.1.5, z3-solver 4.15.4.0 (tilelang links libz3), flash-qla 0.1.3:
#     bash ../shared/tools/gpu-wheelhouse.sh .whl-qla fla-core==0.6.0 flash-linear-attention==0.6.0 tilelang==0.1.15 \
#       apache-tvm-ffi==0.1.12 z3-solver==4.15.4.0 torch-c-dlpack-ext==0.1.5 flash-qla==0.1.3
#   HOOKS_WHEELS - the fastpath-hooks wheel of this branch and platformdirs (not on the image), e.g. in .whl/:
#     .venv/bin/python -m pip wheel -q --no-deps -w .whl .   (platformdirs: pip download --no-deps -d .whl platformdirs)
#
# THE RUN (2026-12-02: two device calls on nvidia-h200, carry [".whl", ".whl-qla"]; the whole run takes
# ~12 min, most of it the installs' checks and JIT warm-ups - fla 377 s, flash-qla 259 s):
#     HOOKS_WHEELS="$PWD/.whl/fastpath_hooks-0.1.0-py3-none-any.whl $PWD/.whl/platformdirs-4.14.9-py3-none-any.whl" \
#       WHEELHOUSE=.whl-qla bash benchmarks/h200_qla.sh facts start torch wait
# then at once - the machine stays warm only 30 s after a call, and $WORK (/tmp/qla-h200) goes with it -,
# with the same variables and carry:
#     bash benchmarks/h200_qla.sh wait report
# Results: copy the files (files_at) to benchmarks/results/h200-<date>-qla/ and set
# kernels.flash-qla.pays.hazard in fastpath_hooks/facts/pins.json as the report's last lines say.
#
# Phases, given as arguments and run in order:
#   facts  - the machine: GPU, the image's packages, nvcc, the carry
#   start  - in the BACKGROUND (a new session: it outlives the call while the machine is warm):
#            cold - a second fresh venv with the kernels installed by hand from .whl, FASTPATH_HOOKS_DISABLE=1,
#                   empty TRITON_CACHE_DIR / TILELANG_CACHE_DIR: the first steps of fla + tilelang + flash-qla
#                   as a user gets them without the warm-up (qwen3_5; mostly JIT, ~2-3 min) - beside the
#                   torch phase, whose GPU work is small next to that compile time;
#            fast - once the torch phase is done and the cold one too, alone on the GPU: the first venv with
#                   fastpath-hooks on (install()): the first modeling import installs tilelang, fla and
#                   flash-qla from .whl, checks fla's numbers and flash-qla against fla's own path and warms
#                   the JIT caches (the verification children), then every mode is timed (~4-5 min)
#   torch  - a fresh venv over the image (fastpath-hooks installed, no kernel), the torch path
#            (FASTPATH_HOOKS_DISABLE=1, fla blocked): ~1.5 min; marks itself done for the background
#   wait   - polls for the background until ${WAIT_UNTIL:-570} s into this call and copies what it wrote to $OUT
#   report - the table and the verdicts (qla-h200.json); says so and stops when the background is not done
#   all    - facts start torch, then wait without a limit, then report (longer than one device call)
# Knobs: WHEELHOUSE (default .whl: the kernels' wheels), COLD=0 (no cold phase: the report then takes
# COLD_FROM, an earlier run's cold.json on the same image), FAST_TIMEOUT (default 900 s: on a cold machine
# the fast phase's installs, checks and warm-ups take ~10 min, mostly Triton and TileLang JIT), OUT, WORK.
# A model class this transformers lacks is skipped with a line saying so (transformers 5.17.0, the
# image's, has both: qwen3_5_text -> Qwen3_5ForCausalLM, qwen3_next -> Qwen3NextForCausalLM).
# $OUT: log.txt, torch.json, bg.log, cold.json, fast.json, doctor.txt, qla-h200.json.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # step, fresh_env
OUT=${OUT:-/tmp/h200-qla-out}
WORK=${WORK:-/tmp/qla-h200}
mkdir -p "$OUT" "$WORK"
BASE=${BASE:-/opt/torch/.venv/bin/python3}
[ -x "$BASE" ] || BASE=python3
ENV1=$WORK/env1     # the torch path, then fastpath-hooks on
ENV2=$WORK/env2     # the kernels installed by hand: the cold first steps
export PYTHONUNBUFFERED=1
# the kernels from the carried wheelhouse only; causal-conv1d and mamba-ssm left alone (a 5-min build for
# torch 2.11, and the same in every mode: transformers' torch conv)
WHEELHOUSE=$(cd "${WHEELHOUSE:-.whl}" 2>/dev/null && pwd || echo "${WHEELHOUSE:-.whl}")
export FASTPATH_HOOKS_FIND_LINKS=$WHEELHOUSE FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_CACHE_DIR=$WORK/cache
export FASTPATH_HOOKS_SKIP=causal-conv1d,mamba-ssm FASTPATH_HOOKS_INSTALLER=pip
BENCH=${BENCH:-benchmarks/qla_speedup.py}
BENCH_ARGS=${BENCH_ARGS:-}
# the fastpath-hooks wheel and platformdirs for the fresh venvs (.gpu/ by default; HOOKS_WHEELS to name others)
HOOKS_WHEELS=${HOOKS_WHEELS:-$(ls "$PWD"/.gpu/*.whl 2>/dev/null)}
COLD_WHEELS=${COLD_WHEELS-$(ls "$WHEELHOUSE"/*.whl 2>/dev/null)}   # what the cold venv gets by hand
[ $# -gt 0 ] || set -- facts start torch wait report
if [ "$1" != _bg ]; then exec > >(tee -a "$OUT/log.txt") 2>&1; fi



running() {   # the background was started and has not finished
  [ -f "$WORK/bg.started" ] && [ ! -f "$WORK/bg.done" ] && [ -f "$WORK/bg.pid" ] && kill -0 "$(cat "$WORK/bg.pid")" 2>/dev/null
}

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
  ls -la "$WHEELHOUSE" .gpu
}

phase_start() {
  running && { echo "the background is running already: 'wait' for it"; return 1; }
  step "cold, then fast: started in the background (log $WORK/bg.log, marker $WORK/bg.done)"
  rm -f "$WORK"/bg.* "$WORK"/*.rc "$WORK"/*.json "$WORK/doctor.txt" "$WORK/torch.done"
  date -u > "$WORK/bg.started"
  local detach=; command -v setsid >/dev/null && detach=setsid
  nohup $detach bash "$0" _bg > "$WORK/bg.log" 2>&1 < /dev/null &
}

phase__bg() {
  echo "$$" > "$WORK/bg.pid"
  if [ "${COLD:-1}" = 0 ]; then echo "cold phase left out (COLD=0)"; else bg_cold; fi
  step "waiting for the torch phase"
  local waited=0
  while [ ! -f "$WORK/torch.done" ] && [ "$waited" -lt 400 ]; do sleep 2; waited=$((waited + 2)); done
  bg_fast
  echo "fast $(cat "$WORK/fast.rc" 2>/dev/null), cold $(cat "$WORK/cold.rc" 2>/dev/null)" > "$WORK/bg.done"
}

bg_cold() {
  step "cold: the kernels installed by hand, hooks off, empty JIT caches: flash-qla's first steps without the warm-up"
  local jit=$WORK/cold-jit
  rm -rf "$jit" && mkdir -p "$jit/triton" "$jit/tilelang"
  if ! fresh_env "$ENV2" --no-deps $HOOKS_WHEELS; then echo "!! could not make $ENV2"; echo 1 > "$WORK/cold.rc"; return; fi
  # shellcheck disable=SC2086
  [ -z "$COLD_WHEELS" ] || "$ENV2/bin/python" -m pip install -q --no-index --no-deps $COLD_WHEELS \
    || { echo "!! the hand install failed"; echo 1 > "$WORK/cold.rc"; return; }
  # shellcheck disable=SC2086
  FASTPATH_HOOKS_DISABLE=1 TRITON_CACHE_DIR=$jit/triton TILELANG_CACHE_DIR=$jit/tilelang \
    timeout 360 "$ENV2/bin/python" "$BENCH" cold --models qwen3_5 --steps 2 --warmup 0 $BENCH_ARGS \
    --out "$WORK/cold.json"
  echo "$?" > "$WORK/cold.rc"
  echo "cold phase exit $(cat "$WORK/cold.rc")"
}

bg_fast() {
  step "fast: fastpath-hooks on (installs, checks and warms at the first modeling import)"
  [ -x "$ENV1/bin/python" ] || { echo "!! no $ENV1: the torch phase makes it"; echo 1 > "$WORK/fast.rc"; return; }
  "$ENV1/bin/fastpath-hooks" plan 2>&1 | tail -12
  # shellcheck disable=SC2086
  timeout "${FAST_TIMEOUT:-900}" "$ENV1/bin/python" "$BENCH" fast $BENCH_ARGS --out "$WORK/fast.json"
  echo "$?" > "$WORK/fast.rc"
  "$ENV1/bin/fastpath-hooks" doctor > "$WORK/doctor.txt" 2>&1
  echo "fast phase exit $(cat "$WORK/fast.rc")"
}

phase_torch() {
  step "a fresh environment; the torch path (fla blocked, hooks off)"
  rm -f "$WORK/torch.done"
  if fresh_env "$ENV1" --no-deps $HOOKS_WHEELS; then
    # shellcheck disable=SC2086
    FASTPATH_HOOKS_DISABLE=1 timeout 300 "$ENV1/bin/python" "$BENCH" torch $BENCH_ARGS --out "$WORK/torch.json"
    echo "torch phase exit $?"
    cp "$WORK/torch.json" "$OUT/" 2>/dev/null
  else
    echo "!! could not make $ENV1"
  fi
  date -u > "$WORK/torch.done"    # the background's fast phase goes on (without ENV1 it fails and says so)
}

phase_wait() {
  local until=${WAIT_UNTIL:-570}
  step "wait for the background (until ${until}s into this call)"
  [ -f "$WORK/bg.started" ] || { echo "nothing started in $WORK: run 'start' first (or the machine went cold)"; return 1; }
  while [ ! -f "$WORK/bg.done" ]; do
    if ! running; then
      echo "the background is gone without finishing:"; tail -5 "$WORK/bg.log"; break
    fi
    if [ "$until" != none ] && [ "$SECONDS" -ge "$until" ]; then
      echo "still running at ${SECONDS}s: call 'bash benchmarks/h200_qla.sh wait report' at once"
      tail -3 "$WORK/bg.log"; break
    fi
    sleep 10
    echo "--- ${SECONDS}s: $(grep -v '^\s*$' "$WORK/bg.log" 2>/dev/null | tail -1 | cut -c1-200)"
  done
  for f in bg.log torch.json cold.json fast.json doctor.txt; do cp "$WORK/$f" "$OUT/$f" 2>/dev/null; done
  [ -f "$WORK/bg.done" ] && echo "background done: $(cat "$WORK/bg.done")"
  return 0
}

phase_report() {
  step "report"
  [ -f "$WORK/bg.done" ] || { echo "the background is not done: no report yet"; return 1; }
  local inputs=()
  for f in torch fast cold; do [ -f "$WORK/$f.json" ] && inputs+=("$WORK/$f.json"); done
  # COLD=0: the cold phase's figures from an earlier run on the same image (COLD_FROM, carried in)
  [ -f "$WORK/cold.json" ] || [ -z "${COLD_FROM:-}" ] || inputs+=("$COLD_FROM")
  "${ENV1}/bin/python" "$BENCH" report "${inputs[@]}" --out "$OUT/qla-h200.json"
}

for phase in "$@"; do
  case $phase in
    facts) phase_facts ;;
    start) phase_start ;;
    _bg) phase__bg ;;
    torch) phase_torch ;;
    wait) phase_wait ;;
    report) phase_report ;;
    all) phase_facts; phase_start; phase_torch; WAIT_UNTIL=none phase_wait; phase_report ;;
    *) echo "unknown phase $phase: facts, start, torch, wait, report or all"; exit 2 ;;
  esac
done
echo "done (${SECONDS}s)"
