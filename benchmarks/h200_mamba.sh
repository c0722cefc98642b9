#!/usr/bin/env bash
# Issue 12's H200 acceptance run: mamba-ssm (and causal-conv1d) built for sm_90 through
# fastpath-hooks from a cold environment on a GPU machine without network (torch 2.11.0+cu130,
# transformers 5.17.0, triton 3.6.0, nvcc 13.0), the five mamba-ssm functions checked on the
# GPU, and a tiny Granite-4.0-H trained with transformers' torch path and with the kernels
# (benchmarks/mamba_hybrid.py, seq 4096 and 16384).
#
# Carried in (about 0.3 MiB; einops, packaging, ninja, wheel, setuptools, huggingface_hub,
# transformers, triton and torch are on the image, and they are all mamba-ssm needs at run
# time besides causal-conv1d - see the report of the bench-mamba branch):
#   .whl/ - the two sdists:
#     PYTHON=.venv/bin/python ../shared/tools/gpu-wheelhouse.sh .whl \
#         sdist:mamba-ssm==2.3.2.post1 sdist:causal-conv1d==1.6.2.post1
#   .gpu/ - the fastpath-hooks wheel (with mamba-ssm support) and platformdirs (not on the image):
#     .venv/bin/python -m pip wheel -q --no-deps -w .gpu . platformdirs
#
# One device call may run 600 s and the builds take about 300 s (causal-conv1d) + 120 s
# (mamba-ssm), so the run is cut into phases, given as arguments and run in order:
#   facts  - the machine (GPU, torch/triton/transformers, nvcc, what the image has, the carry)
#   build  - a cold environment, `fastpath-hooks plan mamba-ssm`, then the install(s), started in
#            the BACKGROUND (nohup); returns at once
#   wait   - polls for the build's done-marker until ${WAIT_UNTIL:-540} s after this script
#            started, printing the build log's tail; copies the build's logs to $OUT
#   check  - the five mamba-ssm functions on the GPU against references; cuobjdump of the .so files
#   train  - benchmarks/mamba_hybrid.py, torch path then fastpath-hooks, at $SEQS (4096,16384)
#   bench  - check train
#   all    - facts build wait bench, waiting without limit (a machine without call limits)
# e.g. device call 1: `bash benchmarks/h200_mamba.sh facts build wait`
#      device call 2: `bash benchmarks/h200_mamba.sh wait check`   (wait returns at once if done)
#      device call 3: `SEQS=4096 bash benchmarks/h200_mamba.sh train`
#      device call 4: `SEQS=16384 bash benchmarks/h200_mamba.sh train`
# The machine must stay warm between calls: the build, the environment and the cache live in
# $WORK (default /tmp/mamba-h200), not in $OUT, which each call gets empty. Each call leaves
# under $OUT: log.txt (this call's output), and by phase plan.txt, build.log, build-logs.tar.gz
# (fastpath-hooks' build logs), ops-check.txt, mamba-h200-<seqs>.json - at most 8 files, no '+'.
#
# Each environment is a fresh venv layered over the image's site-packages (torch, ninja, pip:
# a .pth line after its own), so the kernels land in the venv's own site-packages.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # step, fresh_env
OUT=${OUT:-/tmp/h200-mamba-out}
WORK=${WORK:-/tmp/mamba-h200}
mkdir -p "$OUT" "$WORK"
BASE=${BASE:-python3}
ENV1=$WORK/env1
export PYTHONUNBUFFERED=1
export MAX_JOBS=${MAX_JOBS:-16}   # as in the measured builds (the default follows available memory)
export FASTPATH_HOOKS_FIND_LINKS=$PWD/.whl FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_CACHE_DIR=$WORK/cache
SEQS=${SEQS:-4096,16384}
BENCH_ARGS=${BENCH_ARGS:---steps 10 --warmup 3 --timeout 420}
[ $# -gt 0 ] || set -- all
if [ "$1" != _build ]; then exec > >(tee -a "$OUT/log.txt") 2>&1; fi



has_dist() { "$ENV1/bin/python" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$1" 2>/dev/null; }

phase_facts() {
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nproc
  $BASE - <<'PY'
import importlib.metadata as md, sys
for n in ("torch", "triton", "transformers", "numpy", "einops", "packaging", "ninja", "wheel", "setuptools",
          "huggingface-hub", "mamba-ssm", "causal-conv1d", "tilelang", "apache-tvm-ffi", "quack-kernels",
          "nvidia-cutlass-dsl", "flash-linear-attention", "platformdirs", "filelock", "uv"):
    try: print(f"{n:24s}{md.version(n)}")
    except md.PackageNotFoundError: print(f"{n:24s}-")
print("python", sys.version.split()[0])
PY
  which nvcc && nvcc --version | tail -2
  which cuobjdump uv
  ls -la .whl .gpu
}

phase_build() {   # start _build in the background, return at once
  step "build: started in the background (log $WORK/build.log, marker $WORK/build.done)"
  rm -f "$WORK/build.done" "$WORK/build.log" "$WORK/build.pid" "$WORK/build.started"
  local detach=; command -v setsid >/dev/null && detach=setsid   # outlive this call's process group
  date -u > "$WORK/build.started"
  nohup $detach bash "$0" _build > "$WORK/build.log" 2>&1 < /dev/null &
}

timed_install() {   # timed_install KERNEL: `fastpath-hooks install KERNEL`, its wall time and exit status
  local t=$SECONDS r=0
  time "$ENV1/bin/fastpath-hooks" install "$1" || r=$?
  echo "$1 install: $((SECONDS - t)) s, exit $r"
  [ "$r" = 0 ] || BUILD_RC=$r
}

phase__build() {   # the background part: a cold environment, plan, install(s), each timed
  local prc
  BUILD_RC=0
  echo "$$" > "$WORK/build.pid"
  step "1. cold environment"
  fresh_env "$ENV1" --no-deps .gpu/*.whl || { echo 1 > "$WORK/build.done"; exit 1; }
  step "2. fastpath-hooks plan mamba-ssm"
  "$ENV1/bin/fastpath-hooks" plan mamba-ssm 2>&1 | tee "$WORK/plan.txt"
  prc=${PIPESTATUS[0]}
  [ "$prc" = 0 ] || echo "!! fastpath-hooks plan mamba-ssm failed (exit $prc)"
  # the plan's decision lines read "<kernel>: install - ...": does it bring causal-conv1d along?
  if ! grep -qE "^ *causal-conv1d: *(install|build|download|upgrade|repair)" "$WORK/plan.txt"; then
    step "3a. the mamba-ssm plan does not bring causal-conv1d: install it first"
    timed_install causal-conv1d
  fi
  step "3. fastpath-hooks install mamba-ssm"
  timed_install mamba-ssm
  if ! has_dist causal-conv1d; then
    step "3b. causal-conv1d still missing (mamba_split_conv1d_scan_combined needs it): install it"
    timed_install causal-conv1d
  fi
  "$ENV1/bin/python" -m pip list 2>/dev/null | grep -iE "mamba|causal|tilelang|tvm|quack|einops|fastpath"
  "$ENV1/bin/fastpath-hooks" cache list
  echo "$BUILD_RC" > "$WORK/build.done"
}

collect_build() {   # the build's files into $OUT (names without '+', each well under 16 MiB)
  [ -f "$WORK/plan.txt" ] && cp "$WORK/plan.txt" "$OUT/plan.txt"
  [ -f "$WORK/build.log" ] && tail -c 8000000 "$WORK/build.log" > "$OUT/build.log"
  if [ -d "$WORK/cache/logs" ]; then
    rm -rf "$WORK/logs-out" && mkdir -p "$WORK/logs-out"
    for f in "$WORK"/cache/logs/*; do
      [ -f "$f" ] && tail -c 4000000 "$f" > "$WORK/logs-out/$(basename "$f" | tr '+' '_')"
    done
    tar -czf "$OUT/build-logs.tar.gz" -C "$WORK" logs-out
  fi
}

phase_wait() {
  local until=${WAIT_UNTIL:-540}
  step "wait for the build (until ${until}s into this call)"
  [ -f "$WORK/build.started" ] || { echo "no build started in $WORK: run the build phase first (or the machine went cold)"; return 1; }
  while [ ! -f "$WORK/build.done" ]; do
    if [ -f "$WORK/build.pid" ] && ! kill -0 "$(cat "$WORK/build.pid")" 2>/dev/null && [ ! -f "$WORK/build.done" ]; then
      echo "the build process is gone without finishing:"; tail -5 "$WORK/build.log"; collect_build; return 1
    fi
    if [ "$until" != none ] && [ "$SECONDS" -ge "$until" ]; then
      echo "build still running at ${SECONDS}s; call 'wait' again"; tail -3 "$WORK/build.log"; collect_build; return 1
    fi
    sleep 20
    echo "--- ${SECONDS}s: $(tail -1 "$WORK/build.log" 2>/dev/null | cut -c1-200)"
  done
  echo "build finished, exit $(cat "$WORK/build.done")"
  grep -E "install: [0-9]+ s|^real|fastpath-hooks: (mamba-ssm|causal-conv1d)" "$WORK/build.log" | grep -v "still building" | cut -c1-300
  collect_build
  [ "$(cat "$WORK/build.done")" = 0 ]
}

need_env() {
  [ -x "$ENV1/bin/python" ] || { echo "no environment $ENV1: run the build phase first (or the machine went cold)"; exit 1; }
}

phase_check() {
  local py=$ENV1/bin/python so
  need_env
  step "4. the five mamba-ssm functions on the GPU, against references"
  timeout 300 "$py" benchmarks/mamba_ops_check.py 2>&1 | tee "$OUT/ops-check.txt"
  "$py" - <<'PY'
import importlib.metadata as md
try:
    import tilelang
    from mamba_ssm.modules import mamba3
    print("tilelang", md.version("tilelang"), "importable next to mamba_ssm; Mamba-3 tilelang kernels:",
          mamba3.mamba3_mimo_combined is not None)
except ImportError as exc:
    print("tilelang not importable here (", exc, "): mamba_ssm imported without its Mamba-3 tilelang kernels")
PY
  step "5. cubins in selective_scan_cuda (expected: sm_90 only)"
  so=$("$py" -c 'import glob, sysconfig; print((glob.glob(sysconfig.get_path("platlib") + "/selective_scan_cuda*.so") + [""])[0])')
  if [ -n "$so" ]; then
    echo "$so"; cuobjdump --list-elf "$so" | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c
  else
    echo "no selective_scan_cuda*.so in $ENV1"
  fi
  so=$("$py" -c 'import glob, sysconfig; print((glob.glob(sysconfig.get_path("platlib") + "/causal_conv1d_cuda*.so") + [""])[0])')
  [ -n "$so" ] && { echo "$so"; cuobjdump --list-elf "$so" | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c; }
}

phase_cache2() {   # a second fresh environment on this machine: both kernels from the wheel cache, no compiler run
  step "7. a second fresh environment: install from the wheel cache"
  fresh_env "$WORK/env2" --no-deps .gpu/*.whl || return 1
  local s=$SECONDS
  time "$WORK/env2/bin/fastpath-hooks" install causal-conv1d mamba-ssm
  echo "second environment: causal-conv1d + mamba-ssm in $((SECONDS - s)) s (exit $?)"
  "$WORK/env2/bin/python" -c 'import mamba_ssm, causal_conv1d, importlib.metadata as md; print("env2:", md.version("mamba-ssm"), md.version("causal-conv1d"))'
}

phase_train() {
  need_env
  step "6. tiny Granite-4.0-H training step: torch path vs fastpath-hooks, seq $SEQS"
  # shellcheck disable=SC2086
  "$ENV1/bin/python" benchmarks/mamba_hybrid.py --seqs "$SEQS" $BENCH_ARGS --out "$OUT/mamba-h200-${SEQS//,/-}.json"
  echo "benchmark exit $?"
}

for phase in "$@"; do
  case $phase in
    facts) phase_facts ;;
    build) phase_build ;;
    _build) phase__build ;;
    wait) phase_wait || exit 1 ;;
    check) phase_check ;;
    train) phase_train ;;
    cache2) phase_cache2 ;;
    bench) phase_check; phase_train ;;
    all) phase_facts; phase_build; WAIT_UNTIL=none phase_wait || exit 1; phase_check; phase_train ;;
    *) echo "unknown phase $phase: facts, build, wait, check, train, bench or all"; exit 2 ;;
  esac
done
echo "done (${SECONDS}s)"
