#!/usr/bin/env bash
# Issue 22's run (not yet made: no machine of several GPUs has been lent): torchrun ranks on one host,
# one install per node, every rank on the fast path. Ask the device tool's `status` first; run on
# nvidia-h200-x2 or larger (NCCL, NVLink multicast left off: NCCL_NVLS_ENABLE=0).
#
# Carry .whl: the fla wheelhouse (fla-core / flash-linear-attention 0.6.0, tilelang 0.1.15, apache-tvm-ffi
# 0.1.12, torch-c-dlpack-ext, z3-solver; /work/research/wh-b + z3) and, for the Mamba-2 hybrid, the
# causal-conv1d 1.7.0 and mamba-ssm 2.3.2.post1 sdists with ninja, packaging, filelock, platformdirs, wheel,
# plus the fastpath-hooks wheel (`.venv/bin/python -m pip wheel -q --no-deps -w .whl .`).
#   bash benchmarks/multi_gpu.sh                 # all phases; a cold build of the compiled kernels takes ~400 s:
#   KERNELS=fla bash benchmarks/multi_gpu.sh     # the Qwen3.5 half only (wheels, no build) - fits one call
# Phases (one fresh venv over the image, one cache, no network):
#   cold     torchrun --nproc-per-node N examples/train_tiny_qwen3_5.py --json: every rank calls install();
#            the node must show one install per kernel (the journal's installer calls), one line per
#            decision on the whole node, and fla's functions on every rank
#   torch    the same with FASTPATH_HOOKS_DISABLE=1 (and fla blocked by a fresh venv): steps per second against it
#   warm     a second launch: no child processes (the verdicts), the time to the first step per rank
#   enable   `fastpath-hooks enable` and an unmodified copy of the script (its install() lines removed)
# $OUT: multi_gpu.json (per phase: wall time, the fastpath-hooks lines, per-rank kernels, losses, step times)
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # step, fresh_env
OUT=${OUT:-/tmp/multi-gpu-out}
WORK=${WORK:-/tmp/multi-gpu}
BASE=${BASE:-python3}
N=${N:-$(nvidia-smi -L 2>/dev/null | wc -l)}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export FASTPATH_HOOKS_FIND_LINKS=$PWD/.whl FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_CACHE_DIR=$WORK/cache
[ "${KERNELS:-all}" = fla ] && export FASTPATH_HOOKS_SKIP=causal-conv1d,mamba-ssm
ARGS=${ARGS:-"--json --steps 20 --seq 2048 --batch 1 --hidden 1024 --layers 4 --vocab 8192"}
[ "$N" -ge 2 ] || { echo "multi_gpu: $N GPU(s) here; this run needs two or more"; exit 2; }


launch() {   # name venv script [env...]: torchrun over all GPUs; stdout (one JSON line per rank) and stderr kept
  local name=$1 venv=$2 script=$3; shift 3
  local t0=$SECONDS
  env "$@" "$venv/bin/python" -m torch.distributed.run --standalone --nproc-per-node "$N" "$script" $ARGS \
    > "$WORK/$name.out" 2> "$WORK/$name.err"
  echo "$name: exit $?, wall $((SECONDS - t0)) s"
  echo $((SECONDS - t0)) > "$WORK/$name.wall"
}

fresh_env "$WORK/env" --no-deps --find-links .whl fastpath-hooks platformdirs || exit 1
launch cold "$WORK/env" examples/train_tiny_qwen3_5.py
launch warm "$WORK/env" examples/train_tiny_qwen3_5.py
fresh_env "$WORK/torch-env" --no-deps --find-links .whl fastpath-hooks platformdirs || exit 1
launch torch "$WORK/torch-env" examples/train_tiny_qwen3_5.py FASTPATH_HOOKS_DISABLE=1
grep -v "fastpath_hooks" examples/train_tiny_qwen3_5.py > "$WORK/plain_train.py"   # the script, unmodified by us
fresh_env "$WORK/enabled-env" --no-deps --find-links .whl fastpath-hooks platformdirs || exit 1
"$WORK/enabled-env/bin/fastpath-hooks" enable
launch enable "$WORK/enabled-env" "$WORK/plain_train.py"

$BASE - "$WORK" "$OUT/multi_gpu.json" <<'PY'
import json, os, sys
work, out = sys.argv[1], sys.argv[2]
report = {}
for name in ("cold", "warm", "torch", "enable"):
    try:
        ranks = [json.loads(l) for l in open(os.path.join(work, name + ".out")) if l.startswith("{")]
        lines = [l.rstrip() for l in open(os.path.join(work, name + ".err")) if l.startswith("fastpath-hooks:")]
        wall = int(open(os.path.join(work, name + ".wall")).read())
    except (OSError, ValueError) as exc:
        report[name] = {"error": str(exc)}
        continue
    steps = [sorted(r["step_seconds"][2:])[len(r["step_seconds"][2:]) // 2] for r in ranks if len(r["step_seconds"]) > 2]
    report[name] = {"wall_s": wall, "ranks": len(ranks), "lines": lines,
                    "installs": sum(": installed " in l for l in lines),
                    "kernels": {r["rank"]: r["kernels"] for r in ranks},
                    "first_loss": {r["rank"]: r["losses"][0] for r in ranks},
                    "median_step_s": {r["rank"]: s for r, s in zip(ranks, steps)}}
json.dump(report, open(out, "w"), indent=1)
for name, r in report.items():
    if "error" in r:
        print(name, "error", r["error"]); continue
    med = sorted(r["median_step_s"].values())
    print(f"{name}: {r['ranks']} ranks, wall {r['wall_s']} s, {len(r['lines'])} fastpath-hooks lines "
          f"({r['installs']} installed), median step {med[len(med) // 2] * 1e3 if med else float('nan'):.1f} ms")
PY
cp "$WORK"/*.err "$OUT/" 2>/dev/null
echo "done (${SECONDS}s)"
