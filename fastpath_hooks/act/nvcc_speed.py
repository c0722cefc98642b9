"""The speed half of a source build's nvcc wrapper: `--split-compile=N`, a compiler cache, and a
record of every compile - planned here, done by the one wrapper (act/compiler_wrapper.py, which also
restricts the archs and hands the C++ standard last), read back here after the build.

- `--split-compile=N` (nvcc >= 11.8: the optimizer and ptxas of one file in N threads) on a
  compile that does not name one already, N from the build's share of the cores (decide/builds.py
  `core_budget`); none when the share leaves one thread per job or the switch is off
  (pins `parallel.split_compile`, FASTPATH_HOOKS_SPLIT_COMPILE=0).
- a file the pins name in `parallel.split_units` compiled as N parts side by side (N from the same
  share: the cores the build's other files leave), linked back into its one object by the wrapper.
- ccache (else sccache) in front of the real nvcc where one is on the build's PATH: ccache writes
  each compile's result into a stats log of this build (`CCACHE_STATSLOG`), so the build says how
  many compiles hit; sccache's counters are read before and after the build (its server is shared,
  so they count every compile it served meanwhile). `CCACHE_BASEDIR` is the build's scratch
  directory: pip unpacks the sdist into a new temporary directory every time, and ccache rewrites
  the paths under it to relative ones, so the same sources hit in the next build.
- one JSON line per compile (`<work>/nvcc-calls.jsonl`, kept beside the build's log as
  `<log>.nvcc.jsonl`: the source, seconds, the split, the launcher, the exit status, the real nvcc,
  argv and cwd), and one line in the build's log: which file set the wall time is read off, and
  benchmarks/cold_node.sh collects them.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

from .compiler_wrapper import SPEED_MARK

MARK = SPEED_MARK   # the summary line in the build's log starts with it, as each compile's line does

CALLS = "nvcc-calls.jsonl"
CCACHE_STATS = "ccache-stats.log"


@dataclass(frozen=True)
class Speed:
    """What the wrapper of one build does for speed: `split` threads per compile (1: none), `launcher`
    the compiler cache's path (None: none found), `calls` where each compile is recorded."""
    split: int
    launcher: str | None
    calls: str
    parts: tuple = ()    # (file name, N): compiled as N parts side by side (pins `parallel.split_units`)

    def config(self) -> dict:
        """The wrapper config's keys for it (act/compiler_wrapper.py)."""
        return {"split": self.split, "launcher": self.launcher, "calls": self.calls, "parts": dict(self.parts)}


def launcher(path_var: str | None = None) -> str | None:
    """ccache, else sccache, on the build's PATH."""
    for name in ("ccache", "sccache"):
        found = shutil.which(name, path=path_var)
        if found:
            return found
    return None


def plan(work: str, *, split: int, path_var: str | None = None, parts=()) -> Speed:
    """The speed part of one build's nvcc wrapper: its records in `work`, the cache on `path_var`,
    `parts`: (file name, N) for the files compiled in N parts."""
    return Speed(split=max(1, int(split)), launcher=launcher(path_var), calls=os.path.join(work, CALLS),
                 parts=tuple((name, int(n)) for name, n in parts if int(n) > 1))


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
    wall time, and the exact command of each (benchmarks/cold_node.sh collects them)."""
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
