#!/usr/bin/env bash
# Issue 19's H200 acceptance run: causal-conv1d 1.7.0 and mamba-ssm 2.3.2.post1 built for sm_90
# through fastpath-hooks in a cold environment (no network), their numeric verification on the
# GPU (the pins' numeric_checks: a tiny forward and backward against torch references, timed, once),
# then upstream's own tests of the built kernels, and fla's Hopper check where fla is carried.
#
# Carried in (about 0.5 MiB, gitignored - put them there before the device call):
#   .whl/    causal_conv1d-1.7.0.tar.gz, mamba_ssm-2.3.2.post1.tar.gz (research wh-a), and for fla on
#            Hopper optionally the wh-b wheels (fla_core/flash_linear_attention 0.6.0, tilelang 0.1.15,
#            apache_tvm_ffi 0.1.12, torch_c_dlpack_ext) - `fla` below is skipped without them
#            and the fastpath-hooks wheel with platformdirs (the cold environment gets these two):
#              .venv/bin/python -m pip wheel -q --no-deps -w .whl . (platformdirs: as for benchmarks/cold_node.sh)
#   .tests/  upstream's tests: test_causal_conv1d-1.7.0.py (tests/ of the causal-conv1d 1.7.0 sdist),
#            test_selective_scan-v2.3.2.post1.py, test_selective_state_update-v2.3.2.post1.py (state-spaces/mamba
#            at v2.3.2.post1: tests/ops/, tests/ops/triton/), and optionally
#            test_selective_state_update-reffixed-v2.3.2.post1.py (the same with vllm#48578's reference fix)
#   e.g.  carry: [".whl", ".tests"]
#
# Phases (arguments, run in order; a device call may run 600 s and the causal-conv1d build takes ~300 s):
#   facts     the machine (GPU, torch, triton, nvcc)
#   build     a cold environment, `fastpath-hooks plan`, then `install causal-conv1d` and `install mamba-ssm`
#             ($KERNELS: which, in order; default both)
#             (each builds, installs, verifies the import AND the numbers) in the BACKGROUND; returns at once
#   wait      polls for the build's marker until ${WAIT_UNTIL:-540} s; copies the build logs and the numeric
#             records to $OUT
#   numeric   the numeric checks once more, with the remembered results removed first: how long they take
#             cold and warm, and every tensor's measured error (numeric.json)
#   upstream  upstream's tests against the built kernels ($CC_K / $MAMBA_K: a pytest -k subset; default all,
#             the whole causal-conv1d file is 13,373 cases; the ids name dtypes itype0/1/2, not float32/...)
#   fla       fla 0.6.0 + tilelang on sm_90 through fastpath-hooks: the Hopper numeric check
# e.g. call 1: bash benchmarks/h200_issue19.sh facts build
#      call 2: bash benchmarks/h200_issue19.sh wait numeric
#      call 3: bash benchmarks/h200_issue19.sh upstream
#      call 4: bash benchmarks/h200_issue19.sh fla
# Results: copy $OUT (files_at) to benchmarks/results/h200-<date>-issue19/.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # step, fresh_env
OUT=${OUT:-/tmp/h200-issue19-out}
WORK=${WORK:-/tmp/issue19-h200}
mkdir -p "$OUT" "$WORK"
BASE=${BASE:-python3}
ENV1=$WORK/env1
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
export FASTPATH_HOOKS_FIND_LINKS=$PWD/.whl FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_CACHE_DIR=$WORK/cache
CC_K=${CC_K:-}
MAMBA_K=${MAMBA_K:-}
KERNELS=${KERNELS:-causal-conv1d mamba-ssm}
[ $# -gt 0 ] || set -- facts build wait numeric upstream
if [ "$1" != _build ]; then exec > >(tee -a "$OUT/log.txt") 2>&1; fi



phase_facts() {
  step "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  nproc
  $BASE -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
  $BASE -c 'import triton; print("triton", triton.__version__)' 2>&1 | tail -1
  which nvcc && nvcc --version | tail -2
  ls -la .whl .tests 2>&1 | head -30
}

phase_build() {
  step "build: in the background (log $WORK/build.log, marker $WORK/build.done)"
  rm -f "$WORK/build.done" "$WORK/build.log"
  local detach=; command -v setsid >/dev/null && detach=setsid
  nohup $detach bash "$0" _build > "$WORK/build.log" 2>&1 < /dev/null &
}

phase__build() {
  local rc=0 t
  step "cold environment"; fresh_env "$ENV1" --no-deps .whl/fastpath_hooks-*.whl .whl/platformdirs-*.whl || { echo 1 > "$WORK/build.done"; exit 1; }
  step "plan"; # shellcheck disable=SC2086
  "$ENV1/bin/fastpath-hooks" plan $KERNELS
  for kernel in $KERNELS; do
    step "install $kernel"
    t=$SECONDS
    "$ENV1/bin/fastpath-hooks" install "$kernel" || rc=$?
    echo "$kernel install: $((SECONDS - t)) s, exit $rc"
  done
  echo "$rc" > "$WORK/build.done"
}

collect() {
  cp "$WORK/build.log" "$OUT/build.log" 2>/dev/null
  tar -C "$WORK/cache" -czf "$OUT/build-logs.tar.gz" logs numeric 2>/dev/null
}

phase_wait() {
  local until=${WAIT_UNTIL:-540}
  step "wait for the build (until ${until}s)"
  while [ ! -f "$WORK/build.done" ]; do
    if [ "$until" != none ] && [ "$SECONDS" -ge "$until" ]; then echo "still building; call wait again"; collect; return 1; fi
    sleep 20; echo "--- ${SECONDS}s: $(tail -1 "$WORK/build.log" 2>/dev/null | cut -c1-200)"
  done
  echo "build finished, exit $(cat "$WORK/build.done")"
  grep -E "install: [0-9]+ s|numbers match|blocked|built |could not" "$WORK/build.log" | cut -c1-300
  collect
}

phase_numeric() {
  step "numeric checks, cold (records removed) and warm"
  "$ENV1/bin/python" - "$WORK/cache" "$OUT/numeric.json" <<'PY'
import json, os, sys, time
from fastpath_hooks.act import numeric
from fastpath_hooks.facts.pins import load
from fastpath_hooks.facts.probe import probe
from fastpath_hooks.facts.settings import Settings
root, out = sys.argv[1], sys.argv[2]
pins, env = load(), probe(Settings())
report = {"gpus": list(env.gpus), "torch": env.torch, "kernels": {}}
for kernel in ("causal-conv1d", "mamba-ssm", "fla"):
    plan = numeric.plan_for(kernel, env, pins, root)
    if plan is None:
        continue
    try:
        os.unlink(numeric.cache_path(root, kernel))
    except FileNotFoundError:
        pass
    runs = []
    for _ in range(2):   # cold: runs the child; warm: remembered, no child
        t = time.monotonic()
        res = numeric.verify_numbers(plan, distributions=pins.kernel(kernel).distributions, timeout=600)
        runs.append({"ok": res.ok, "ran": res.ran, "detail": res.detail, "seconds": round(time.monotonic() - t, 2)})
    report["kernels"][kernel] = {"runs": runs, "records": numeric.read(root, kernel)}
    print(kernel, runs)
json.dump(report, open(out, "w"), indent=1)
PY
}

phase_upstream() {
  local py=$ENV1/bin/python t=$WORK/upstream f
  # pytest imports a test file by its name: `test_causal_conv1d-1.7.0.py` is no module name, so plain copies
  rm -rf "$t"; mkdir -p "$t"
  for f in .tests/*.py; do cp "$f" "$t/$(basename "$f" .py | tr '.-' '__').py"; done
  if [[ " $KERNELS " == *" causal-conv1d "* ]]; then
    step "upstream tests (causal-conv1d 1.7.0${CC_K:+: -k \"$CC_K\"})"
    (cd "$t" && timeout ${CC_TIMEOUT:-420} "$py" -m pytest -q -p no:cacheprovider test_causal_conv1d_1_7_0.py ${CC_K:+-k "$CC_K"} \
        --junitxml="$OUT/upstream-causal-conv1d.xml" 2>&1 | tail -15) | tee "$OUT/upstream-causal-conv1d.txt"
  fi
  [[ " $KERNELS " == *" mamba-ssm "* ]] || { touch "$WORK/upstream.done"; return 0; }
  step "upstream tests (mamba-ssm 2.3.2.post1)"
  (cd "$t" && timeout ${MAMBA_TIMEOUT:-150} "$py" -m pytest -q -p no:cacheprovider test_selective_scan_v2_3_2_post1.py \
      test_selective_state_update_v2_3_2_post1.py ${MAMBA_K:+-k "$MAMBA_K"} 2>&1 | tail -15) | tee "$OUT/upstream-mamba-ssm.txt"
  # the same state-update test with its reference's known bf16 defect fixed (.tests/...-reffixed-...: upstream's
  # reference rounds the new state to bf16 and computes `out` from that, the kernel computes `out` from the
  # unrounded state; the fixed reference does as the kernel; vllm-project/vllm#48578, sgl-project/sglang#20345)
  if [ -f "$t/test_selective_state_update_reffixed_v2_3_2_post1.py" ]; then
    step "upstream's state-update test, its reference fixed"
    (cd "$t" && timeout ${MAMBA_TIMEOUT:-150} "$py" -m pytest -q -p no:cacheprovider \
        test_selective_state_update_reffixed_v2_3_2_post1.py 2>&1 | tail -8) | tee "$OUT/upstream-mamba-ssm-reffixed.txt"
  fi
  touch "$WORK/upstream.done"
}

phase_fla() {
  step "fla on sm_90: install through fastpath-hooks (its Hopper numeric check runs at the install)"
  ls .whl/fla_core-*.whl >/dev/null 2>&1 || { echo "no fla wheels in .whl: skipped"; return 0; }
  local t=$SECONDS
  "$ENV1/bin/fastpath-hooks" install fla 2>&1 | tee "$OUT/fla-install.txt"
  echo "fla install: $((SECONDS - t)) s"
}

for phase in "$@"; do
  case $phase in
    facts) phase_facts ;;
    build) phase_build ;;
    _build) phase__build ;;
    wait) phase_wait || exit 1 ;;
    numeric) phase_numeric ;;
    upstream) phase_upstream ;;
    fla) phase_fla ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
done
echo "done (${SECONDS}s)"
