"""Print what `import fastpath_hooks` (and `fastpath_hooks.install()`) costs a fresh interpreter.

    python benchmarks/import_cost.py [--runs 60] [--python PATH] [--no-callgrind]

Target: < 5 ms over `python -c pass` (the package loads at every interpreter start when
enabled). Figures:
- wall: median of many fresh interpreters, each variant interleaved with `python -c pass`
  (identical runs differ by ~7% here, so read the delta, not one run);
- importtime: the interpreter's own `-X importtime` cumulative figure for fastpath_hooks;
- instructions: `valgrind --tool=callgrind` "Collected" counts (repeatable to ~0.1%), when
  valgrind is installed.
The package's .pyc files are written first (py_compile): with PYTHONDONTWRITEBYTECODE=1,
as here and in many images, Python reads .pyc files but never writes them, so without this
every start would compile the modules from source and the figures would measure the compiler.
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_MS = 5.0
VARIANTS = {
    "pass": "pass",
    "import": "import fastpath_hooks",
    "install": "import fastpath_hooks; fastpath_hooks.install()",
}


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTPATH_HOOKS_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # measure what such images get: only pre-written .pyc files
    return env


def package_dir(python: str) -> str:
    out = subprocess.run([python, "-c", "import fastpath_hooks, os; print(os.path.dirname(fastpath_hooks.__file__))"],
                         capture_output=True, text=True, check=True, env=clean_env())
    return out.stdout.strip()


def compile_package(python: str, pkg: str) -> list[str]:
    """Write the .pyc of every module of the package, with the measured interpreter."""
    sources = sorted(glob.glob(os.path.join(pkg, "**", "*.py"), recursive=True))   # the subpackages too
    code = ("import py_compile, sys\n"
            "for path in sys.argv[1:]:\n"
            "    py_compile.compile(path, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)\n")
    subprocess.run([python, "-c", code, *sources], check=True, env=clean_env())
    return sources


def pyc_used(python: str) -> list[str]:
    """The fastpath_hooks modules the interpreter loaded from .pyc (from `python -v`)."""
    out = subprocess.run([python, "-v", "-c", VARIANTS["install"]], capture_output=True, text=True, env=clean_env())
    return sorted(set(re.findall(r"# code object from '[^']*fastpath_hooks/__pycache__/([^'.]+)\.[^']*\.pyc'",
                                 out.stderr)))


def wall_ms(python: str, code: str) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", code], check=True, env=clean_env(), stdout=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def importtime_us(python: str, code: str, module: str) -> int:
    out = subprocess.run([python, "-X", "importtime", "-c", code], capture_output=True, text=True, env=clean_env())
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].strip() == module:
            return int(parts[1])
    return 0


def instructions(python: str, code: str) -> int | None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    out = subprocess.run([valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", python, "-c", code],
                         capture_output=True, text=True, env=clean_env())
    match = re.search(r"Collected : (\d+)", out.stderr)
    return int(match.group(1)) if match else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=60, help="fresh interpreters per variant (default 60)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter to measure (default: this one)")
    ap.add_argument("--no-callgrind", action="store_true", help="skip the instruction counts")
    args = ap.parse_args()
    python = args.python

    enabled = subprocess.run([python, "-c", "import sys; print('fastpath_hooks' in sys.modules)"],
                             capture_output=True, text=True, env=clean_env()).stdout.strip() == "True"
    pkg = package_dir(python)
    sources = compile_package(python, pkg)
    cached = pyc_used(python)
    print(f"python        {python} ({sys.version.split()[0] if python == sys.executable else 'other'})")
    print(f"package       {pkg}")
    print(f"bytecode      wrote .pyc for {len(sources)} modules (py_compile); loaded from .pyc at import: "
          f"{', '.join(cached) or 'none'}")
    if enabled:
        print("WARNING       fastpath-hooks is enabled at start-up in this environment: `python -c pass` already "
              "imports it, so the deltas below understate the cost (run `fastpath-hooks disable` first)")

    for code in VARIANTS.values():  # warm the OS caches
        wall_ms(python, code)
    samples: dict = {name: [] for name in VARIANTS}
    for _ in range(args.runs):
        for name, code in VARIANTS.items():  # interleaved: drift hits every variant alike
            samples[name].append(wall_ms(python, code))
    base, fastest = statistics.median(samples["pass"]), min(samples["pass"])
    print(f"\nwall time of fresh interpreters, {args.runs} runs each (median / fastest)")
    print(f"  {'python -c pass':<48}{base:8.2f} / {fastest:6.2f} ms")
    wall_delta = {}
    for name in ("import", "install"):
        med, low = statistics.median(samples[name]), min(samples[name])
        wall_delta[name] = low - fastest
        print(f"  {VARIANTS[name]:<48}{med:8.2f} / {low:6.2f} ms   delta {med - base:+6.2f} / {low - fastest:+6.2f} ms")
    q = statistics.quantiles(samples["pass"], n=4)
    print(f"  (python -c pass quartiles {q[0]:.1f} / {q[2]:.1f} ms: on a busy machine wall deltas are mostly noise;"
          " the two figures below are not)")

    print("\n-X importtime, cumulative, median of 15")
    importtime = {}
    for name, module in (("import", "fastpath_hooks"), ("install", "fastpath_hooks.hooks")):
        us = statistics.median(importtime_us(python, VARIANTS[name], module) for _ in range(15))
        importtime[name] = us / 1000
        print(f"  {module:<48}{us / 1000:8.2f} ms")

    estimate = {}
    if not args.no_callgrind:
        counts = {name: instructions(python, code) for name, code in VARIANTS.items()}
        if counts["pass"] is None:
            print("\ninstructions: valgrind not found (apt-get install valgrind) - skipped")
        else:
            per_ms = counts["pass"] / fastest  # this machine's speed, from the fastest `python -c pass`
            print("\ninstructions (valgrind --tool=callgrind, Collected; ms at this machine's "
                  f"{per_ms / 1e6:.1f} M instructions/ms of `python -c pass`)")
            print(f"  {'python -c pass':<48}{counts['pass']:>14,}")
            for name in ("import", "install"):
                extra = counts[name] - counts["pass"]
                estimate[name] = extra / per_ms
                print(f"  {VARIANTS[name]:<48}{counts[name]:>14,}   delta {extra:+,} ({100 * extra / counts['pass']:+.2f}%,"
                      f" ~{estimate[name]:.2f} ms)")

    # The verdict uses the repeatable figures: instructions when valgrind ran, else the fastest-run wall delta.
    cost = {name: max(importtime[name], estimate.get(name, wall_delta[name])) for name in ("import", "install")}
    ok = all(c < TARGET_MS for c in cost.values())
    basis = "instruction counts and importtime" if estimate else "fastest-run wall delta and importtime"
    print(f"\ntarget: < {TARGET_MS:.0f} ms over `python -c pass` ({basis}): import {cost['import']:.2f} ms, "
          f"install() {cost['install']:.2f} ms - {'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
