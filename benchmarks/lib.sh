# Sourced by the device benchmarks (benchmarks/*.sh): a timed step header, and a fresh environment.

step() { echo; echo "=== $* ($(date -u +%H:%M:%S), ${SECONDS}s)"; }

# fresh_env DIR PIP_ARGS...: a venv over $BASE's packages (torch, triton, pip: never installed again),
# then `pip install -q --no-index PIP_ARGS` in it. $BASE may itself be a venv (the device's is), whose
# packages --system-site-packages misses: a .pth file names them.
fresh_env() {
  local dir=$1 base_site own_site
  shift
  rm -rf "$dir"
  "$BASE" -m venv --system-site-packages --without-pip "$dir" || return 1
  base_site=$("$BASE" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || return 1
  own_site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || return 1
  [ "$base_site" = "$own_site" ] || echo "$base_site" > "$own_site/zz-image-site.pth"
  "$dir/bin/python" -m pip install -q --no-index "$@" || return 1
}

# The background run of a device benchmark ($WORK/bg.started, bg.pid, bg.log, bg.done): whether it still runs,
# and wait_background SCRIPT UNTIL - poll it until UNTIL seconds into this call (the caller then copies results).
running() { [ -f "$WORK/bg.started" ] && [ ! -f "$WORK/bg.done" ] && kill -0 "$(cat "$WORK/bg.pid" 2>/dev/null)" 2>/dev/null; }

wait_background() {
  local script=$1 until=$2
  step "wait for the background (until ${until}s into this call)"
  [ -f "$WORK/bg.started" ] || { echo "nothing started in $WORK: run 'start' first (or the machine went cold)"; return 1; }
  while [ ! -f "$WORK/bg.done" ]; do
    running || { echo "the background is gone without finishing:"; tail -5 "$WORK/bg.log"; break; }
    if [ "$SECONDS" -ge "$until" ]; then
      echo "still running at ${SECONDS}s: call 'bash benchmarks/$script wait' at once"; break
    fi
    sleep 10
    echo "--- ${SECONDS}s: $(grep -v '^\s*$' "$WORK/bg.log" 2>/dev/null | tail -1 | cut -c1-200)"
  done
}
