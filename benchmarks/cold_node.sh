#!/usr/bin/env bash
# Issue 20's acceptance run: kernels in minutes on a cold node, seconds in every later environment.
#
# A fresh venv (--system-site-packages over the device's python: torch 2.11, nvcc 13.0, triton 3.6,
# transformers 5.17), no network, an empty fastpath-hooks cache: benchmarks/cold_node_train.py (a tiny
# Mamba-2 hybrid, `fastpath_hooks.install()` first) - the wall time until its kernels are ready, with
# causal-conv1d 1.7.0 and mamba-ssm 2.3.2.post1 built side by side with --split-compile (target <= 300 s);
# then a second fresh venv on the same cache (target <= 10 s: the cached wheels, one installer call, one
# verification child, numbers remembered).
#
# The wheelhouse ($WHEELHOUSE, default .whl; carry it): causal_conv1d-1.7.0.tar.gz,
# mamba_ssm-2.3.2.post1.tar.gz, ninja, packaging, filelock wheels and a fastpath-hooks wheel
# (`.venv/bin/python -m pip wheel -q --no-deps -w .whl .`); einops and wheel too unless the device's
# python has them (mamba-ssm needs einops, causal-conv1d's setup.py imports wheel) - `check` says.
#
# Phases (each device call <= 600 s; the machine goes back when idle, so the build runs detached):
#   check     the machine and the wheelhouse (exit 2 naming what is missing); no GPU needed
#   start     `check`, then the whole run in the BACKGROUND (setsid; log $WORK/run.log); returns at once
#   wait      waits for it until ${WAIT_UNTIL:-540} s of this call, then collects (exit 1: still running)
#   collect   copies results to $OUT: cold_node.json (both environments' figures), log.txt, run.log,
#             env1.json/env2.json (the training script's), build-logs.tar.gz (build logs, each compile's
#             record <log>.nvcc.jsonl, the build history, the numeric records)
# e.g. call 1: bash benchmarks/cold_node.sh start wait        (carry [".whl"])
#      call 2: bash benchmarks/cold_node.sh wait               (only if call 1 said "still running")
# Knobs: SPLIT=0 (FASTPATH_HOOKS_SPLIT_COMPILE=0, today's one-thread compiles, for the side-by-side
# figure; use another WORK), WORK (default /tmp/cold-node), BASE (default python3), OUT.
# Results: copy $OUT (files_at) to benchmarks/results/h200-<date>-cold-node/ with the command.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # step, fresh_env
OUT=${OUT:-/tmp/cold-node-out}
WORK=${WORK:-/tmp/cold-node}
BASE=${BASE:-python3}
WHEELHOUSE=$(cd "${WHEELHOUSE:-.whl}" 2>/dev/null && pwd || echo "${WHEELHOUSE:-.whl}")
TRAIN=$PWD/benchmarks/cold_node_train.py
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
export FASTPATH_HOOKS_FIND_LINKS=$WHEELHOUSE FASTPATH_HOOKS_OFFLINE=1 FASTPATH_HOOKS_CACHE_DIR=$WORK/cache
[ "${SPLIT:-1}" = 0 ] && export FASTPATH_HOOKS_SPLIT_COMPILE=0
unset MAX_JOBS   # the cores are shared out by the package (decide/builds.py core_budget)
[ $# -gt 0 ] || set -- start wait
if [ "$1" != _run ]; then exec > >(tee -a "$OUT/log.txt") 2>&1; fi


phase_check() {
  step "machine and wheelhouse ($WHEELHOUSE)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader
  echo "cores: $(nproc)"
  $BASE -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' \
    || { echo "cold_node: $BASE has no torch; set BASE to the python with torch"; return 2; }
  command -v nvcc >/dev/null && nvcc --version | tail -1
  local missing=() f
  for f in causal_conv1d-1.7.0.tar.gz mamba_ssm-2.3.2.post1.tar.gz "ninja-*.whl" "packaging-*.whl" "filelock-*.whl" \
           "fastpath_hooks-*.whl"; do
    compgen -G "$WHEELHOUSE/$f" >/dev/null || missing+=("$f")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "cold_node: the wheelhouse $WHEELHOUSE lacks ${missing[*]}; put them there (see the header) and carry it"
    return 2
  fi
  for f in einops wheel; do
    $BASE -c "import $f" 2>/dev/null || compgen -G "$WHEELHOUSE/$f-*.whl" >/dev/null \
      || echo "cold_node: warning: neither $BASE nor the wheelhouse has $f (mamba-ssm / causal-conv1d's build need it)"
  done
  echo "wheelhouse ok"
}


train() {   # env name: a fresh environment, the training script in it, timed from outside too
  local name=$1 t rc
  step "$name: fresh environment"; fresh_env "$WORK/$name" --find-links "$WHEELHOUSE" fastpath-hooks || return 1
  step "$name: training script (fastpath_hooks.install() first)"
  t=$SECONDS
  (cd "$WORK" && "$WORK/$name/bin/python" "$TRAIN" --device "$DEVICE" --out "$WORK/$name.json")
  rc=$?
  echo "$name: script exit $rc, wall $((SECONDS - t)) s"
  return $rc
}

phase_start() {
  phase_check || exit 2
  step "run in the background (log $WORK/run.log, marker $WORK/run.done)"
  rm -rf "$WORK/cache" "$WORK/run.done" "$WORK/run.log" "$WORK"/env1* "$WORK"/env2*
  local detach=; command -v setsid >/dev/null && detach=setsid
  nohup $detach bash "$0" _run > "$WORK/run.log" 2>&1 < /dev/null &
  echo "started (pid $!)"
}

phase__run() {
  local rc=0
  train env1 || rc=$?
  train env2 || rc=$((rc ? rc : $?))
  echo "$rc" > "$WORK/run.done"
}

phase_collect() {
  step "collect into $OUT"
  cp "$WORK/run.log" "$OUT/run.log" 2>/dev/null
  cp "$WORK/env1.json" "$WORK/env2.json" "$OUT/" 2>/dev/null
  tar -C "$WORK/cache" -czf "$OUT/build-logs.tar.gz" logs numeric builds 2>/dev/null
  $BASE - "$WORK" "$OUT/cold_node.json" <<'PY'
import glob, json, os, sys
work, out = sys.argv[1], sys.argv[2]
report = {"targets": {"env1_ready_s": 300, "env2_ready_s": 10},
          "issue_20_before": {"env1_ready_s": 685, "env2_install_s": "6.0 + 18.1"}}
for name in ("env1", "env2"):
    try:
        r = json.load(open(os.path.join(work, name + ".json")))
    except (OSError, ValueError):
        report[name] = None
        continue
    report[name] = {k: r.get(k) for k in ("install_s", "ready_s", "first_step_s", "ready", "unresolved", "torch")}
    report[name]["lines"] = [f"{e['t']:>7.1f} s {e['message']}" for e in r.get("events", [])
                             if e.get("type") in ("status", "warning", "error")]
builds = []
for path in glob.glob(os.path.join(work, "cache", "**", "*.nvcc.jsonl"), recursive=True):
    calls = [json.loads(line) for line in open(path) if line.strip()]
    builds.append({"log": os.path.basename(path), "compiles": len(calls),
                   "slowest": max(({"source": os.path.basename(c["source"]), "seconds": c["seconds"],
                                    "split": c["split"]} for c in calls), key=lambda c: c["seconds"], default=None)})
report["compiles"] = builds
history = glob.glob(os.path.join(work, "cache", "builds", "history.jsonl"))   # facts/memory.py
report["builds"] = [json.loads(line) for h in history for line in open(h) if line.strip()]
json.dump(report, open(out, "w"), indent=1)
for name in ("env1", "env2"):
    r = report[name] or {}
    print(f"{name}: kernels ready {r.get('ready')} after {r.get('ready_s')} s (target <= {report['targets'][name + '_ready_s']} s)")
for b in report["builds"]:
    print(f"built {b.get('distribution')} {b.get('version')} in {b.get('seconds')} s: {b.get('cores')} cores, "
          f"{b.get('jobs')} jobs, split {b.get('split')}, together with {b.get('concurrent')}, slowest {b.get('slowest')}")
PY
}

phase_wait() {
  local until=${WAIT_UNTIL:-540}
  step "wait for the run (until ${until}s of this call)"
  while [ ! -f "$WORK/run.done" ]; do
    if [ "$SECONDS" -ge "$until" ]; then echo "still running; call wait again"; phase_collect; return 1; fi
    sleep 15; echo "--- ${SECONDS}s: $(grep -v '^\s*$' "$WORK/run.log" 2>/dev/null | tail -1 | cut -c1-200)"
  done
  echo "run finished, exit $(cat "$WORK/run.done")"
  phase_collect
}

for phase in "$@"; do
  case $phase in
    check) phase_check || exit 2 ;;
    start) phase_start ;;
    _run) phase__run ;;
    wait) phase_wait || exit 1 ;;
    collect) phase_collect ;;
    *) echo "cold_node: unknown phase $phase (check, start, wait, collect)"; exit 2 ;;
  esac
done
echo "done (${SECONDS}s)"
