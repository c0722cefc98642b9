#!/usr/bin/env bash
# The end-to-end proof on a GPU machine without network (the H200 of this project's device tool).
#
# Carried in: .whl/ (the wheelhouse from ../shared/tools/gpu-wheelhouse.sh: fla-core and
# flash-linear-attention 0.6.0, tilelang 0.1.15, apache-tvm-ffi 0.1.12, z3-solver,
# torch-c-dlpack-ext) and .gpu/ (the fastpath-hooks wheel and platformdirs).
# The machine has torch, transformers and triton, and no fla/tilelang.
#
#   bash benchmarks/h200_run.sh            # writes everything under $OUT (default /tmp/h200-out)
#
# 1. doctor before anything;
# 2. fail closed: fla installed by hand, tilelang absent from the wheelhouse, triton < 3.7.1 on
#    Hopper -> with fastpath-hooks the tiny training run takes the torch path and finishes; without
#    it (FASTPATH_HOOKS_DISABLE=1) the same run crashes at the first backward;
# 3. benchmarks/gpu_speedup.py from a clean environment: the torch path, then fastpath-hooks,
#    which installs fla + tilelang + apache-tvm-ffi from the wheelhouse through its own installer;
# 4. doctor --smoke: gated delta rule forward+backward vs a float32 torch reference.
set -uo pipefail
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT"
PY=${PY:-python3}
WH=$PWD/.whl
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1

step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
$PY - <<'PY'
import importlib.metadata as md, sys
for n in ("torch", "triton", "transformers", "numpy", "fla-core", "flash-linear-attention", "tilelang",
          "apache-tvm-ffi", "causal-conv1d", "filelock", "packaging", "platformdirs"):
    try: print(f"{n:24s}{md.version(n)}")
    except md.PackageNotFoundError: print(f"{n:24s}-")
print("python", sys.version.split()[0])
PY
which nvcc && nvcc --version | tail -1

step "install fastpath-hooks from the carried wheels (no index)"
$PY -m pip install -q --no-index --no-deps .gpu/*.whl || exit 1
export FASTPATH_HOOKS_CACHE_DIR=$OUT/cache

step "1. doctor before anything (offline, wheelhouse $WH)"
FASTPATH_HOOKS_FIND_LINKS=$WH FASTPATH_HOOKS_OFFLINE=1 fastpath-hooks doctor | tee "$OUT/doctor-before.txt"
FASTPATH_HOOKS_FIND_LINKS=$WH FASTPATH_HOOKS_OFFLINE=1 fastpath-hooks plan --json > "$OUT/plan.json"

step "2. fail closed: fla present, tilelang not in the wheelhouse"
NOTL=/tmp/wheelhouse-without-tilelang
mkdir -p $NOTL && cp $WH/fla_core-* $WH/flash_linear_attention-* $NOTL/
$PY -m pip install -q --no-index --no-deps $WH/fla_core-*.whl $WH/flash_linear_attention-*.whl
TRAIN="examples/train_tiny_qwen3_5.py --device cuda --steps 3 --seq 1024 --hidden 512 --layers 4 --vocab 4096"
echo "--- without fastpath-hooks (FASTPATH_HOOKS_DISABLE=1): expected to crash"
FASTPATH_HOOKS_DISABLE=1 $PY $TRAIN > "$OUT/failclosed-without.txt" 2>&1
echo "exit code without fastpath-hooks: $?" | tee -a "$OUT/failclosed-without.txt"
grep -E "RuntimeError|Error" "$OUT/failclosed-without.txt" | tail -3
echo "--- with fastpath-hooks"
FASTPATH_HOOKS_FIND_LINKS=$NOTL FASTPATH_HOOKS_OFFLINE=1 $PY $TRAIN > "$OUT/failclosed-with.txt" 2>&1
echo "exit code with fastpath-hooks: $?" | tee -a "$OUT/failclosed-with.txt"
cat "$OUT/failclosed-with.txt" | grep -v "^\s*$" | tail -12
$PY -m pip uninstall -q -y fla-core flash-linear-attention
rm -rf "$FASTPATH_HOOKS_CACHE_DIR"

step "3. speed: torch path vs fastpath-hooks (installs from the wheelhouse itself)"
FASTPATH_HOOKS_FIND_LINKS=$WH FASTPATH_HOOKS_OFFLINE=1 $PY benchmarks/gpu_speedup.py \
    --out "$OUT/gpu_speedup.json" ${SPEEDUP_ARGS:-}

step "4. smoke test"
FASTPATH_HOOKS_FIND_LINKS=$WH FASTPATH_HOOKS_OFFLINE=1 fastpath-hooks doctor --smoke | tee "$OUT/doctor-after.txt"
FASTPATH_HOOKS_FIND_LINKS=$WH FASTPATH_HOOKS_OFFLINE=1 fastpath-hooks doctor --smoke --json > "$OUT/doctor-after.json"
echo "done"
