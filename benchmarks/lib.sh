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
