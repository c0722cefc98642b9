"""Print how long installing the fla pair from a local wheelhouse takes: uv vs pip.

    python benchmarks/install_time.py [--runs 5] [--wheelhouse DIR]

The wheelhouse holds the REAL fla-core + flash-linear-attention 0.6.0 wheels (1.1 MB +
0.4 MB, ~580 files) and their runtime deps einops + packaging, fetched once from the
index (or given with --wheelhouse). Every run gets a fresh venv (not timed), then:

- raw pip / raw uv: `pip install` / `uv pip install` of the pair, `--no-deps`, offline;
  uv both with a cold cache (a new UV_CACHE_DIR) and a warm one;
- fastpath-hooks: its guarded installer (FASTPATH_HOOKS_INSTALLER=pip / uv) running the
  plan's steps for a posed A100 - runtime deps, then the pinned pair - inside its
  transaction (backup, constraints, checks of what changed), without the verification
  child (importing the real fla needs triton and takes 16-30 s on CPU; that cost is the
  same for both installers and is printed by `fastpath-hooks install` itself).

Figures: median (min-max) seconds over the runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from support import venvs  # noqa: E402

PAIR = ("fla-core==0.6.0", "flash-linear-attention==0.6.0")
WHEELS = PAIR + ("einops", "packaging", "filelock", "platformdirs")
TARGET = "gpu=sm_80,cuda=12.8,torch=2.10.0,triton=3.7.1"

# Runs inside the fresh venv: the policy's fla decision for the posed machine, executed by the installer.
INSTALLER_RUN = r'''
import json, sys, time
from fastpath_hooks.engine import load_context, snapshot
from fastpath_hooks.act.installer import install
from fastpath_hooks.act.transaction import environment_state_dir
from fastpath_hooks.decide.policy import Commands
settings, pins = load_context()
env, plan = snapshot(settings, pins)
decision = plan["fla"]
assert decision.action == "install", decision.reason
start = time.perf_counter()
result = install([decision], settings=settings, env=env, pins=pins, commands=Commands.of(settings, env, pins),
                 state_dir=environment_state_dir(settings), verify=False).results["fla"]
took = time.perf_counter() - start
print(json.dumps({"seconds": took, "installer": result.installer, "installed": result.installed}))
'''


def uv_exe() -> str:
    exe = shutil.which("uv") or os.path.join(os.path.dirname(sys.executable), "uv")
    if not os.path.exists(exe):
        sys.exit("uv is needed (pip install uv)")
    return exe


def quiet_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPATH_HOOKS_", "PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(extra)
    return env


def run(argv, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
    return proc


def prepare_wheelhouse(path: str | None, work: str) -> str:
    dest = path or os.path.join(os.path.expanduser("~"), ".cache", "fastpath-hooks-bench", "wheelhouse")
    os.makedirs(dest, exist_ok=True)
    if not glob.glob(os.path.join(dest, "fla_core-0.6.0-*.whl")):
        print(f"fetching the real fla 0.6.0 wheels into {dest} ...", file=sys.stderr)
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", dest, *WHEELS],
            env=quiet_env())
    for name in glob.glob(os.path.join(dest, "fastpath_hooks-*.whl")):
        os.unlink(name)
    venvs.build_fastpath_wheel(dest)
    return dest


def fresh_venv(work: str, wheelhouse: str, n: int) -> str:
    path = os.path.join(work, f"venv{n}")
    base = getattr(sys, "_base_executable", sys.executable)
    run([uv_exe(), "venv", "-q", "--seed", "-p", base, path], env=quiet_env())
    python = os.path.join(path, "bin", "python")
    run([uv_exe(), "pip", "install", "-q", "--python", python, "--no-index", "--find-links", wheelhouse,
         "fastpath-hooks"], env=quiet_env())
    # pip's bytecode once, as an installed pip has it (PYTHONDONTWRITEBYTECODE would make every run compile pip)
    run([python, "-m", "compileall", "-q", glob.glob(os.path.join(path, "lib", "python3*", "site-packages", "pip"))[0]],
        env=quiet_env())
    return python


def timed(argv, env) -> float:
    start = time.perf_counter()
    run(argv, env=env)
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--wheelhouse", help="directory with the fla 0.6.0 pair, einops, packaging, filelock, platformdirs")
    args = p.parse_args()

    work = tempfile.mkdtemp(prefix="fastpath-install-bench-")
    try:
        wheelhouse = prepare_wheelhouse(args.wheelhouse, work)
        warm_cache = os.path.join(work, "uv-cache-warm")
        results: dict = {k: [] for k in ("pip (raw)", "uv (raw, cold cache)", "uv (raw, warm cache)",
                                         "fastpath-hooks + pip", "fastpath-hooks + uv")}
        uv_bin = os.path.join(work, "uv-bin")
        os.makedirs(uv_bin)
        os.symlink(uv_exe(), os.path.join(uv_bin, "uv"))
        offline = ["--no-index", "--find-links", wheelhouse, "--no-deps", *PAIR]
        n = 0
        run([uv_exe(), "pip", "install", "-q", "--python", fresh_venv(work, wheelhouse, "-warmup"), *offline],
            env=quiet_env(UV_CACHE_DIR=warm_cache))
        for i in range(args.runs):
            for label in results:
                n += 1
                python = fresh_venv(work, wheelhouse, n)
                if label == "pip (raw)":
                    seconds = timed([python, "-m", "pip", "install", "-q", *offline], quiet_env())
                elif label.startswith("uv (raw"):
                    cache = warm_cache if "warm" in label else os.path.join(work, f"uv-cache-{n}")
                    seconds = timed([uv_exe(), "pip", "install", "-q", "--python", python, *offline],
                                    quiet_env(UV_CACHE_DIR=cache))
                else:
                    installer = label.rsplit(" ", 1)[1]
                    env = quiet_env(FASTPATH_HOOKS_TARGET=TARGET, FASTPATH_HOOKS_FIND_LINKS=wheelhouse,
                                    FASTPATH_HOOKS_OFFLINE="1", FASTPATH_HOOKS_INSTALLER=installer,
                                    FASTPATH_HOOKS_CACHE_DIR=os.path.join(work, "cache"), FASTPATH_HOOKS_LOG="error",
                                    UV_CACHE_DIR=warm_cache, PATH=uv_bin + os.pathsep + os.environ.get("PATH", ""))
                    out = run([python, "-c", INSTALLER_RUN], env=env).stdout.strip().splitlines()[-1]
                    data = json.loads(out)
                    assert data["installer"] == installer and data["installed"].get("fla-core") == "0.6.0", data
                    seconds = data["seconds"]
                results[label].append(seconds)
                shutil.rmtree(os.path.dirname(os.path.dirname(python)), ignore_errors=True)
            print(f"run {i + 1}/{args.runs} done", file=sys.stderr)

        sizes = sum(os.path.getsize(f) for f in glob.glob(os.path.join(wheelhouse, "*lash_linear*.whl")) +
                    glob.glob(os.path.join(wheelhouse, "fla_core-*.whl")))
        print(f"fla 0.6.0 pair ({sizes / 1e6:.1f} MB of wheels) from a local wheelhouse, fresh venv per run, "
              f"{args.runs} runs, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
        print(f"{'installer':<24} {'median s':>9} {'min-max s':>14}")
        for label, values in results.items():
            print(f"{label:<24} {statistics.median(values):9.2f} {min(values):7.2f}-{max(values):<6.2f}")
        print("fastpath-hooks rows: the deps step (einops, packaging) + the pinned pair (--no-deps), in its "
              "transaction (backup, constraints, checks); uv with a warm cache; no verification child.")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
