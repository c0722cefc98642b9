#!/usr/bin/env bash
# causal-conv1d built from source through fastpath-hooks on a GPU machine without network (the
# H200 of this project's device tool: torch 2.11.0+cu130, no release wheel for it), then installed
# into a second fresh environment from the wheel cache; a packed-sequence training step of a tiny
# Qwen3.5 with fla + causal-conv1d (per-document losses packed vs unpacked, and on the torch path);
# and, when time is left, a third environment from `build --dest`.
#
# Carried in: .whl/ (the causal-conv1d sdist, and fla + tilelang's wheels for the packed step -
# ninja/packaging/wheel are on the image):
#   PYTHON=.venv/bin/python ../shared/tools/gpu-wheelhouse.sh .whl fla-core==0.6.0 \
#       flash-linear-attention==0.6.0 tilelang==0.1.15 apache-tvm-ffi==0.1.12 z3-solver==4.15.4.0 \
#       torch-c-dlpack-ext==0.1.5 sdist:causal-conv1d==1.6.2.post1
# and .gpu/ (the fastpath-hooks wheel: `python -m pip wheel --no-deps -w .gpu .`).
#
#   bash benchmarks/h200_build.sh          # everything under $OUT (default /tmp/h200-build); ~9 min
#
# Each environment is a fresh venv layered over the image's site-packages (torch, ninja, pip:
# a .pth line after its own), so causal-conv1d lands in the venv's own site-packages.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # step, fresh_env
OUT=${OUT:-/tmp/h200-build}
mkdir -p "$OUT"
BASE=${BASE:-python3}
export PYTHONUNBUFFERED=1
export MAX_JOBS=${MAX_JOBS:-16}   # as in the measured 275 s (the default follows available memory)
export FASTPATH_HOOKS_FIND_LINKS=$PWD/.whl FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_CACHE_DIR=$OUT/cache
exec > >(tee -a "$OUT/log.txt") 2>&1



GPU_CHECK='
import torch, torch.nn.functional as F, causal_conv1d, importlib.metadata as md
x = torch.randn(2, 64, 512, device="cuda", dtype=torch.float32); w = torch.randn(64, 4, device="cuda"); b = torch.randn(64, device="cuda")
ref = F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=3, groups=64)[..., :512])
out = causal_conv1d.causal_conv1d_fn(x, w, b, activation="silu")
print("causal-conv1d", md.version("causal-conv1d"), "max abs err vs torch", (out - ref).abs().max().item())
'

step "machine"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$BASE -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])'
which nvcc && nvcc --version | tail -2
ls -la .whl

step "1. cold environment: plan, then install (a source build for sm_90 only)"
fresh_env /tmp/env1 --no-deps .gpu/*.whl || exit 1
/tmp/env1/bin/fastpath-hooks plan causal-conv1d | tee "$OUT/plan.txt"
time /tmp/env1/bin/fastpath-hooks install causal-conv1d
/tmp/env1/bin/python -c "$GPU_CHECK"
SO=$(/tmp/env1/bin/python -c 'import glob, sysconfig; print(glob.glob(sysconfig.get_path("platlib") + "/causal_conv1d_cuda*.so")[0])')
echo "--- cubins in $SO (expected: sm_90 only)"
cuobjdump --list-elf "$SO" | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c
cp "$OUT"/cache/logs/*.log "$OUT/" 2>/dev/null
grep -c "fastpath-hooks nvcc wrapper: kept" "$OUT"/cache/logs/*.log

step "2. a second fresh environment: from the wheel cache, no build"
fresh_env /tmp/env2 --no-deps .gpu/*.whl || exit 1
time /tmp/env2/bin/fastpath-hooks install causal-conv1d
/tmp/env2/bin/python -c "$GPU_CHECK"
/tmp/env2/bin/fastpath-hooks cache list

PACKED=${PACKED:---hidden 1024 --vocab 8192 --steps 3 --warmup 1}
step "3. packed sequences (three documents in one row): torch path, then fla + causal-conv1d"
timeout 90 /tmp/env1/bin/python benchmarks/packed_sequences.py --path torch $PACKED --out "$OUT/packed-torch.json" \
    > "$OUT/packed-torch.log" 2>&1
tail -3 "$OUT/packed-torch.log"
timeout 90 /tmp/env1/bin/fastpath-hooks install fla
timeout 150 /tmp/env1/bin/python benchmarks/packed_sequences.py --path fastpath $PACKED --out "$OUT/packed-fastpath.json" \
    > "$OUT/packed-fastpath.log" 2>&1
grep -v '^ ' "$OUT/packed-fastpath.log" | tail -5
for f in "$OUT"/packed-*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['path'], {k: r.get(k) for k in ('packed_losses','unpacked_losses','max_abs_diff','max_rel_logit_diff','packed_step_ms','peak_mem_gb','error')}); print('  resolved', r['resolved'])" "$f"
done
if [ "$SECONDS" -gt 470 ]; then echo "skipping step 4 ($SECONDS s used)"; echo done; exit 0; fi

step "4. build --dest: a wheelhouse for offline nodes; a third environment installs from it with builds off"
/tmp/env2/bin/fastpath-hooks build causal-conv1d --arch sm_90 --dest "$OUT/wheelhouse"
fresh_env /tmp/env3 --no-deps .gpu/*.whl || exit 1
FASTPATH_HOOKS_FIND_LINKS=$OUT/wheelhouse FASTPATH_HOOKS_CACHE_DIR=/tmp/cache3 FASTPATH_HOOKS_ALLOW_BUILD=0 \
    /tmp/env3/bin/fastpath-hooks install causal-conv1d
/tmp/env3/bin/python -c "$GPU_CHECK"
echo done
