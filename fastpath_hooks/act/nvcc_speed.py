"""The part of a source build's nvcc wrapper that makes it faster: `--split-compile=N`, a compiler
cache, and a record of every compile.

torch's ninja build runs `PYTORCH_NVCC` for every .cu file. The arch-restricting wrapper
(act/build.py) hands the real nvcc only the -gencode pairs asked for; it runs this one as its
"real" nvcc, so what reaches the real one is restricted first and sped up here:

- `--split-compile=N` (nvcc >= 11.8: the optimizer and ptxas of one file in N threads) on a
  compile that does not name one already, N from the build's share of the cores (decide/builds.py
  `core_budget`); none when the share leaves one thread per job or the switch is off
  (pins `parallel.split_compile`, FASTPATH_HOOKS_SPLIT_COMPILE=0).
- ccache (else sccache) in front of the real nvcc where one is on the build's PATH: ccache writes
  each compile's result into a stats log of this build (`CCACHE_STATSLOG`), so the build says how
  many compiles hit; sccache's counters are read before and after the build (its server is shared,
  so they count every compile it served meanwhile). `CCACHE_BASEDIR` is the build's scratch
  directory: pip unpacks the sdist into a new temporary directory every time, and ccache rewrites
  the paths under it to relative ones, so the same sources hit in the next build.
- one JSON line per compile (`<work>/nvcc-calls.jsonl`, kept beside the build's log as
  `<log>.nvcc.jsonl`: the source, seconds, the split, the launcher, the exit status, the real nvcc,
  argv and cwd), and one line in the build's log: which file set the wall time is read off, and
  benchmarks/cold_node.py replays a compile from it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass

MARK = "fastpath-hooks nvcc speed:"
CALLS = "nvcc-calls.jsonl"
CCACHE_STATS = "ccache-stats.log"

_SCRIPT = r'''# Written by fastpath-hooks for one source build: --split-compile, a compiler cache, a record per compile.
import json, os, subprocess, sys, time

REAL = {real!r}
SPLIT = {split!r}
LAUNCHER = {launcher!r}
CALLS = {calls!r}
MARK = {mark!r}

args = sys.argv[1:]
compiling = "-c" in args or "--compile" in args
if compiling and SPLIT > 1 and not any(a.startswith(("--split-compile", "-split-compile")) for a in args):
    args.append("--split-compile=%d" % SPLIT)
command = ([LAUNCHER] if LAUNCHER and compiling else []) + [REAL] + args
if not compiling:
    os.execv(command[0], command)
start = time.time()
try:
    code = subprocess.call(command)
except OSError as exc:
    sys.stderr.write("%s could not run %s: %s\n" % (MARK, command[0], exc))
    code = 127
seconds = time.time() - start
source = next((a for a in args if a.endswith((".cu", ".cpp", ".cc", ".c")) and not a.startswith("-")), "?")
record = {{"source": source, "seconds": round(seconds, 2), "split": SPLIT if SPLIT > 1 else 1, "real": REAL,
          "launcher": os.path.basename(LAUNCHER) if LAUNCHER else None, "code": code, "argv": args,
          "cwd": os.getcwd(), "start": round(start, 2)}}
try:
    with open(CALLS, "a") as fh:
        fh.write(json.dumps(record) + "\n")
except OSError:
    pass
sys.stderr.write("%s %s in %.1f s (%s%s), exit %d\n" % (
    MARK, source, seconds, "--split-compile=%d" % SPLIT if SPLIT > 1 else "no split",
    ", " + os.path.basename(LAUNCHER) if LAUNCHER else "", code))
sys.stderr.flush()
sys.exit(code)
'''


@dataclass(frozen=True)
class Speed:
    """What the wrapper of one build does: `split` threads per compile (1: none), `launcher` the
    compiler cache's path (None: none found), `wrapper` the script torch's build runs."""
    wrapper: str
    split: int
    launcher: str | None
    calls: str


def launcher(path_var: str | None = None) -> str | None:
    """ccache, else sccache, on the build's PATH."""
    for name in ("ccache", "sccache"):
        found = shutil.which(name, path=path_var)
        if found:
            return found
    return None


def write(work: str, real_nvcc: str, *, split: int, path_var: str | None = None) -> Speed:
    """The wrapper (a `/bin/sh` shim running the script with this interpreter) in `work`."""
    calls = os.path.join(work, CALLS)
    cache = launcher(path_var)
    script = os.path.join(work, "nvcc-speed.py")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(_SCRIPT.format(real=real_nvcc, split=int(split), launcher=cache, calls=calls, mark=MARK))
    shim = os.path.join(work, "nvcc-speed")
    with open(shim, "w", encoding="utf-8") as fh:
        fh.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(script)} \"$@\"\n")
    os.chmod(shim, 0o755)
    return Speed(wrapper=shim, split=max(1, int(split)), launcher=cache, calls=calls)


def launcher_environ(speed: Speed, work: str) -> dict:
    """The compiler cache's variables for this build (ccache: its stats log here, paths under the
    scratch directory made relative)."""
    if speed.launcher is None or os.path.basename(speed.launcher) != "ccache":
        return {}
    return {"CCACHE_STATSLOG": os.path.join(work, CCACHE_STATS), "CCACHE_BASEDIR": work}


def sccache_counts(path: str | None) -> dict | None:
    """sccache's hit/miss counters now (`sccache --show-stats --stats-format=json`), or None."""
    if path is None or os.path.basename(path) != "sccache":
        return None
    import subprocess

    try:
        out = subprocess.run([path, "--show-stats", "--stats-format=json"], capture_output=True, text=True, timeout=30)
        stats = json.loads(out.stdout).get("stats", {})
    except (OSError, ValueError, subprocess.SubprocessError, AttributeError):
        return None

    def total(key):
        value = stats.get(key)
        if isinstance(value, dict):
            value = value.get("counts", value)
            return sum(v for v in value.values() if isinstance(v, int)) if isinstance(value, dict) else 0
        return value if isinstance(value, int) else 0

    return {"hits": total("cache_hits"), "misses": total("cache_misses")}


def calls(speed: Speed) -> list:
    """The compiles the wrapper recorded, in order."""
    try:
        with open(speed.calls, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError):
        return []


def calls_path(log: str) -> str:
    """Where a build's compile records are kept, beside its log (`<log without .log>.nvcc.jsonl`)."""
    return (log[:-len(".log")] if log.endswith(".log") else log) + ".nvcc.jsonl"


def keep_calls(speed: Speed, log: str) -> None:
    """Keep the compile records beside the build's log (the work directory goes): which file set the
    wall time, and the exact command of each (benchmarks/cold_node.py replays one)."""
    try:
        shutil.copyfile(speed.calls, calls_path(log))
    except OSError:
        pass


def ccache_result(work: str) -> dict | None:
    """{"hits": n, "misses": m} from this build's ccache stats log, or None without one. Its entries
    are a `# <file>` line followed by the counters that compile moved (`direct_cache_hit`,
    `preprocessed_cache_hit`, `cache_miss`, or why it could not be cached)."""
    try:
        with open(os.path.join(work, CCACHE_STATS), encoding="utf-8", errors="replace") as fh:
            lines = [ln.strip() for ln in fh if ln.strip() and not ln.startswith("#")]
    except OSError:
        return None
    hits = sum(1 for ln in lines if ln.endswith("_hit"))
    misses = sum(1 for ln in lines if ln == "cache_miss")
    return {"hits": hits, "misses": misses, "uncacheable": len(lines) - hits - misses}


def summary(speed: Speed, work: str, sccache_before: dict | None = None) -> tuple:
    """(one line for the log and the build's message, a dict for the build record)."""
    done = calls(speed)
    slowest = max(done, key=lambda c: c.get("seconds", 0), default=None)
    info = {"compiles": len(done), "split": speed.split,
            "launcher": os.path.basename(speed.launcher) if speed.launcher else None,
            "slowest": {"source": slowest.get("source"), "seconds": slowest.get("seconds")} if slowest else None}
    cache = None
    if info["launcher"] == "ccache":
        cache = ccache_result(work)
    elif info["launcher"] == "sccache" and sccache_before is not None:
        after = sccache_counts(speed.launcher)
        if after is not None:
            cache = {k: after[k] - sccache_before.get(k, 0) for k in ("hits", "misses")}
    info["cache"] = cache
    parts = [f"{len(done)} nvcc compile{'s' if len(done) != 1 else ''}",
             f"--split-compile={speed.split}" if speed.split > 1 else "no --split-compile"]
    if slowest:
        parts.append(f"slowest {os.path.basename(str(slowest.get('source')))} {slowest.get('seconds', 0):.0f} s")
    if info["launcher"] is None:
        parts.append("no compiler cache")   # ccache or sccache on the build's PATH would keep the compiles
    elif cache is None:
        parts.append(f"{info['launcher']}: hits unknown")
    else:
        scope = " (server-wide)" if info["launcher"] == "sccache" else ""
        parts.append(f"{info['launcher']}: {cache['hits']} hit{'s' if cache['hits'] != 1 else ''}, "
                     f"{cache['misses']} miss{'es' if cache['misses'] != 1 else ''}{scope}")
    return ", ".join(parts), info
