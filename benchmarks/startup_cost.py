"""What `fastpath-hooks enable` costs every interpreter start: `python -c pass`, with and without.

    python benchmarks/startup_cost.py [--runs 400] [--callgrind-runs 3] [--kinds bare,standard] [--keep DIR]

Target: at most 3% more than without (issue 3). Set-up, per kind of fresh venv:
- bare: `uv venv` (nothing installed but fastpath-hooks: the worst case, the smallest start);
- standard: `python -m venv` (pip and setuptools seeded, setuptools' .pth runs at start);
fastpath-hooks is installed from its wheel WITH compiled .pyc files (what pip does, and
`uv pip install --compile-bytecode`); one venv stays as it is (baseline), one gets
`fastpath-hooks enable` (.pth), one `enable --method sitecustomize`. Two more show the floor
of each mechanism, whatever it runs: a .pth holding only `import sys` (site.py reads the file and
compiles that line from source at every start - twice in a venv on CPython 3.11, which
processes the venv's site-packages twice) and an empty compiled sitecustomize.py.

Figures:
- instructions: valgrind --tool=callgrind "Collected" counts, the median over PYTHONHASHSEED=0..N-1
  (the same seeds for every venv: a count is exactly repeatable, while the seed alone moves
  it by up to ~0.3%);
- wall: the median of many `python -c pass` runs per venv (posix_spawn + wait), the venvs
  interleaved in a shuffled order each round (identical runs differ by ~7% here;
  interleaving keeps drift and other load out of the ratio);
- what a started interpreter holds: our finder on sys.meta_path, our modules - also with
  FASTPATH_HOOKS_DISABLE=1 (no fastpath_hooks module may be imported then).
PYTHONDONTWRITEBYTECODE=1 is set for the runs, as in many images: only pre-written .pyc
files are used.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from support import venvs  # noqa: E402

TARGET = 1.03
MODULES = ("import sys; names = [getattr(f, '__name__', type(f).__name__) for f in sys.meta_path]; "
           "print('meta_path:', [n for n in names if 'astpath' in n or n == 'KernelImportFinder'], "
           "'modules:', sorted(m for m in sys.modules if 'fastpath_hooks' in m))")


def env(**extra) -> dict:
    out = {k: v for k, v in os.environ.items()
           if not k.startswith(("FASTPATH_HOOKS_", "PIP_", "PYTHON")) and k != "VIRTUAL_ENV"}
    out.update(PYTHONDONTWRITEBYTECODE="1", PIP_CONFIG_FILE=os.devnull, **extra)
    return out


def uv() -> str:
    exe = shutil.which("uv") or os.path.join(os.path.dirname(sys.executable), "uv")
    if not os.path.exists(exe):
        sys.exit("uv is needed (pip install uv)")
    return exe



def make_venv(path: str, wheel: str, kind: str, method: str | None) -> str:
    base = getattr(sys, "_base_executable", None) or sys.executable
    python = os.path.join(path, "bin", "python")
    if kind == "bare":
        subprocess.run([uv(), "venv", "-q", "-p", base, path], check=True, env=env(), capture_output=True)
        subprocess.run([uv(), "pip", "install", "-q", "--no-deps", "--compile-bytecode", "--python", python, wheel],
                       check=True, env=env(), capture_output=True)
    else:
        subprocess.run([base, "-m", "venv", path], check=True, env=env(), capture_output=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], check=True, env=env(),
                       capture_output=True)
    if method:
        subprocess.run([os.path.join(path, "bin", "fastpath-hooks"), "enable", "--method", method], check=True,
                       env=env(), capture_output=True)
    return python


FLOORS = {"floor: .pth `import sys`": ("fastpath-hooks-floor.pth", "import sys\n"),
          "floor: empty sitecustomize": ("sitecustomize.py", "")}


def make_floor(path: str, wheel: str, kind: str, name: str) -> str:
    """A venv with only the mechanism: a .pth that runs one line, or an empty sitecustomize.py (compiled)."""
    import py_compile

    python = make_venv(path, wheel, kind, None)
    site = glob.glob(os.path.join(path, "lib", "python3*", "site-packages"))[0]
    filename, text = FLOORS[name]
    with open(os.path.join(site, filename), "w") as fh:
        fh.write(text)
    if filename.endswith(".py"):
        target = os.path.join(site, filename)
        py_compile.compile(target, cfile=__import__("importlib.util").util.cache_from_source(target), doraise=True)
    return python


def wall_ms(pythons: dict, runs: int) -> dict:
    """Median wall time of `python -c pass` per venv; each round runs every venv once, shuffled."""
    import random

    times: dict = {name: [] for name in pythons}
    run_env = env()
    names = list(pythons)
    rng = random.Random(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    actions = [(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]

    def once(python: str) -> float:
        start = time.perf_counter()
        pid = os.posix_spawn(python, [python, "-c", "pass"], run_env, file_actions=actions)
        _, status = os.waitpid(pid, 0)
        elapsed = (time.perf_counter() - start) * 1000
        if status != 0:
            raise RuntimeError(f"{python} -c pass failed")
        return elapsed

    for name in names:  # warm the page cache
        once(pythons[name])
    for _ in range(runs):
        rng.shuffle(names)
        for name in names:
            times[name].append(once(pythons[name]))
    os.close(devnull)
    return {name: statistics.median(values) for name, values in times.items()}


def instructions(python: str, runs: int, extra_env: dict | None = None) -> int | None:
    if not shutil.which("valgrind"):
        return None
    counts = []
    for seed in range(runs):  # the same hash seeds for every venv: counts are repeatable and paired
        proc = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, "-c", "pass"],
                              env=env(PYTHONHASHSEED=str(seed), **(extra_env or {})), capture_output=True, text=True,
                              check=True)
        counts.append(int(re.search(r"Collected : (\d+)", proc.stderr).group(1)))
    return int(statistics.median(counts))


def started(python: str, **extra) -> str:
    return subprocess.run([python, "-c", MODULES], env=env(**extra), capture_output=True, text=True,
                          check=True).stdout.strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="wall-time runs per venv (default 400)")
    parser.add_argument("--callgrind-runs", type=int, default=3)
    parser.add_argument("--kinds", default="bare,standard", help="bare (uv venv) and/or standard (python -m venv)")
    parser.add_argument("--keep", metavar="DIR", help="build the venvs here and keep them")
    args = parser.parse_args(argv)

    work = args.keep or tempfile.mkdtemp(prefix="fastpath-startup-")
    os.makedirs(work, exist_ok=True)
    ok = True
    try:
        wheel = venvs.build_fastpath_wheel(os.path.join(work, "dist"))
        print(f"python {sys.version.split()[0]}, fastpath-hooks from {os.path.basename(wheel)} (compiled .pyc), "
              f"PYTHONDONTWRITEBYTECODE=1")
        for kind in args.kinds.split(","):
            ok &= measure(kind, work, wheel, args)
        print(f"\ntarget for `fastpath-hooks enable` (default: {DEFAULT} in a venv that owns its sitecustomize.py): "
              f"ratio <= {TARGET} -> {'met' if ok else 'MISSED'}; the .pth fallback costs one more module import")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


DEFAULT = "sitecustomize"  # what `fastpath-hooks enable` picks (method auto) where the environment owns sitecustomize.py


def _mark(name: str) -> str:
    return "  <- enable's default" if name == DEFAULT else ""


def measure(kind: str, work: str, wheel: str, args) -> bool:
    pythons = {method or "baseline": make_venv(os.path.join(work, f"{kind}-{method or 'baseline'}"), wheel, kind, method)
               for method in (None, "pth", "sitecustomize")}
    floors = {name: make_floor(os.path.join(work, f"{kind}-floor-{i}"), wheel, kind, name) for i, name in enumerate(FLOORS)}
    print(f"\n== {kind} venv ({'uv venv, nothing else installed' if kind == 'bare' else 'python -m venv: pip, setuptools'})")
    for name, python in pythons.items():
        print(f"  {name:14s} starts with  {started(python)}")
    for name in ("pth", "sitecustomize"):
        print(f"  {name + ', DISABLE=1':14s} starts with  {started(pythons[name], FASTPATH_HOOKS_DISABLE='1')}")

    ok = True
    counts = {name: instructions(python, args.callgrind_runs) for name, python in pythons.items()}
    for name in ("pth", "sitecustomize"):
        counts[f"{name}, DISABLE=1"] = instructions(pythons[name], args.callgrind_runs, {"FASTPATH_HOOKS_DISABLE": "1"})
    for name, python in floors.items():
        counts[name] = instructions(python, args.callgrind_runs)
    if counts["baseline"] is not None:
        print(f"  instructions (callgrind, median of {args.callgrind_runs}):")
        for name, count in counts.items():
            ratio = count / counts["baseline"]
            print(f"    {name:28s} {count:>12,d}  ratio {ratio:.4f}  ({count - counts['baseline']:+,d}){_mark(name)}")
            ok &= ratio <= TARGET or name != DEFAULT
    else:
        print("  instructions: valgrind is not installed")

    medians = wall_ms(pythons, args.runs)
    print(f"  wall time, `python -c pass`, median of {args.runs} interleaved runs:")
    for name, ms in medians.items():
        ratio = ms / medians["baseline"]
        print(f"    {name:24s} {ms:7.2f} ms  ratio {ratio:.3f}{_mark(name)}")
        ok &= ratio <= TARGET or name != DEFAULT
    return ok


if __name__ == "__main__":
    sys.exit(main())
