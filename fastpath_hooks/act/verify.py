"""The check of installed kernels: ONE child process for every kernel of an install, with a timeout.

Per kernel, in order (a kernel after those it imports): its import; its numeric checks against torch
where they are due (act/numeric.py); its decision's gated-delta-rule check and JIT warm-up - both
from act/check_child.py, loaded by path in the child. torch and each kernel are imported once for all
of them. Never in-process: a bad tilelang/apache-tvm-ffi pair aborts the importing process (SIGABRT),
and a wrong-arch causal-conv1d build can segfault. A passed check is remembered (act/store.py): a
later environment with the same files beside the same distributions runs no child at all. Also the
parent side of the warm-up records (`doctor`) and of `doctor --smoke`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace

from .._names import cache_root_from_environ
from ..facts.frozen import thaw
from . import store
from .numeric import CHILD, NumericResult, conclude, prepare
from .runner import child_environ, ended, run
from .transaction import atomic_write_json

_MARK = "FASTPATH_HOOKS_VERIFY "
WARM_FILE = "warm.json"
SMOKE_MARK = "FASTPATH_HOOKS_SMOKE "   # check_child.py's


# Several kernels in one child (a request's cached kernels, dependency order): one result line per
# kernel as soon as it is checked, so a crash names the kernel it happened in and the ones before stand.
_MANY = r"""
import importlib, importlib.util, json, os, sys, time
specs = json.loads(sys.argv[2])   # argv[1]: act/check_child.py, loaded by path where a check runs
checks = None


def load():   # the checks' script (it imports nothing of the package)
    spec = importlib.util.spec_from_file_location("fastpath_hooks_check_child", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


for i, spec in enumerate(specs):
    out = {"index": i, "ok": True, "error": None, "seconds": 0.0}
    start = time.monotonic()
    try:
        for name in spec["modules"]:
            importlib.import_module(name)
        for item in spec["attributes"]:
            modname, _, attr = item.partition(":")
            obj = importlib.import_module(modname)
            for part in attr.split("."):
                obj = getattr(obj, part)
            if not callable(obj):
                raise TypeError(f"{item} is not callable")
    except BaseException as exc:
        out["ok"] = False
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["seconds"] = round(time.monotonic() - start, 3)
    if out["ok"] and spec.get("numeric"):
        # the numeric check in this child too; a crash in it is said as its own
        sys.stdout.write("\n" + MARK + json.dumps({"index": i, "phase": "numeric"}) + "\n")
        sys.stdout.flush()
        checks = checks or load()
        payload, results, began = spec["numeric"], [], time.monotonic()
        try:
            for check in payload["checks"]:
                results.append(checks.run_check(check, payload["device"]))
            out["numeric"] = {"ok": True, "results": results}
        except BaseException as exc:
            out["numeric"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400], "results": results}
        out["numeric_seconds"] = round(time.monotonic() - began, 3)
    numbers_ok = "numeric" not in out or (out["numeric"]["ok"] and not any(
        r.get("state") in ("mismatch", "error") for r in out["numeric"]["results"]))
    if out["ok"] and numbers_ok and spec.get("gdr"):
        # the decision's gated-delta-rule check and warm-up, its backend switches its own
        sys.stdout.write("\n" + MARK + json.dumps({"index": i, "phase": "gdr"}) + "\n")
        sys.stdout.flush()
        checks = checks or load()
        saved = dict(os.environ)
        try:
            out["gdr"] = checks.check_here(spec["gdr"])
        finally:
            os.environ.clear()
            os.environ.update(saved)
    sys.stdout.write("\n" + MARK + json.dumps(out) + "\n")
    sys.stdout.flush()
# the distributions whose modules these imports loaded (act/store.py keys the memory on them)
try:
    import importlib.metadata as md
    tops = {name.split(".")[0] for name, mod in list(sys.modules.items()) if getattr(mod, "__file__", None)}
    owners = md.packages_distributions()
    dists = {}
    for top in sorted(tops):
        for dist in owners.get(top, ()):
            try:
                dists[dist] = md.version(dist)
            except Exception:
                pass
    sys.stdout.write("\n" + MARK + json.dumps({"loaded": dists}) + "\n")
    sys.stdout.flush()
except Exception:
    pass
""".replace("MARK", repr(_MARK))


@dataclass(frozen=True)
class Verification:
    ok: bool
    detail: str
    seconds: float
    returncode: int | None
    numeric: bool = False     # it failed on its numbers (act/numeric.py): the kernel is blocked on that arch
    child: bool = True        # a child process checked it (False: its import remembered, act/store.py)
    loaded: tuple = ()        # ((distribution, version), ...) the child's import loaded (the memory's key)


def verify(kernel_spec, *, timeout: float, env_extra=(), python: str | None = None, started=None,
           numeric=None, check=None, root: str | None = None, gpus=()) -> Verification:
    """One kernel checked: verify_many of one."""
    return verify_many([kernel_spec], timeout=timeout, env_extra=env_extra, python=python, started=started,
                       numeric=[numeric], checks=[check], root=root, gpus=gpus)[0]


def _check_key(check) -> str:
    """A decision's check as part of the memory's key (another check - other shapes, a backend - runs again)."""
    if not check:
        return ""
    return json.dumps(thaw(check), sort_keys=True, default=str)


def verify_many(kernel_specs, *, timeout: float, env_extra=(), python: str | None = None, started=None,
                numeric=(), checks=(), root: str | None = None, gpus=()) -> list:
    """Every kernel of `kernel_specs` (in order: a kernel after those it imports) checked in ONE child
    process: one Verification each (its `seconds` the kernel's own time in the child). A kernel the
    child never reached (it crashed or timed out on an earlier one) is not to be blamed: its failed
    Verification's `detail` starts with "not checked", its `returncode` is None.
    `numeric`: per kernel, act/numeric.py's NumericPlan or None: a mismatch (or a crash in it) fails the
    kernel with `numeric` set - blocked on that arch. `checks`: per kernel, its decision's gated-delta-rule
    check or None; it runs after the numbers. `root`: the cache root whose import memory (act/store.py)
    is read and written: when every kernel's whole check passed before for exactly this environment,
    no child runs at all."""
    specs = list(kernel_specs)
    plans = list(numeric) + [None] * (len(specs) - len(numeric))
    gdrs = [c or None for c in checks] + [None] * (len(specs) - len(checks))
    keys = [_check_key(c) for c in gdrs]
    pending: dict = {}   # index -> numeric.Pending; done: index -> NumericResult (skipped or remembered)
    done: dict = {}
    for i, (spec, plan) in enumerate(zip(specs, plans)):
        if plan is not None:
            got = prepare(plan, spec.distributions)
            (done if isinstance(got, NumericResult) else pending)[i] = got
    mine = root and python is None   # the memory speaks for this interpreter's environment only
    known = [store.recall(root, s, env_extra, extra=k, gpus=gpus) if mine else None for s, k in zip(specs, keys)]
    if not pending and all(known):
        return [_with_numbers(Verification(True, f"{_what(s, c)}: remembered (same files and environment, "
                                                 f"{k.get('when', '?')})", 0.0, None, child=False),
                              i, {}, pending, done)
                for i, (s, k, c) in enumerate(zip(specs, known, gdrs))]

    payload = json.dumps([{"modules": list(s.verify_modules), "attributes": list(s.verify_attributes),
                           **({"numeric": pending[i].payload} if i in pending else {}),
                           **({"gdr": thaw(gdrs[i])} if gdrs[i] else {})} for i, s in enumerate(specs)])
    off = tuple(pair for plan in plans if plan is not None for pair in plan.env)   # backends off: the kernels' own numbers
    environ = child_environ(tuple(env_extra) + off, drop=("FASTPATH_HOOKS_TARGET",))   # the real GPU, not a posed one
    warmed = next((s.name for s, c in zip(specs, gdrs) if c), None)   # said while it runs (minutes on a cold GPU)
    ran = run([python or sys.executable, "-c", _MANY, CHILD, payload], timeout=timeout, environ=environ,
              started=started, kernel=warmed,
              label=f"checking {warmed} forward + backward and warming its JIT" if warmed else "")
    results: dict = {}
    phase: dict = {}     # index -> the last phase the child began for it ("numeric", "gdr")
    loaded = None
    for line in ran.output.splitlines():
        if line.startswith(_MARK):
            try:
                item = json.loads(line[len(_MARK):])
                if "loaded" in item:
                    loaded = item["loaded"]
                elif item.get("phase"):
                    phase[int(item["index"])] = item["phase"]
                else:
                    results[int(item["index"])] = item
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    other = "\n".join(ln for ln in ran.output.splitlines() if not ln.startswith(_MARK))
    out, blamed = [], False
    for i, spec in enumerate(specs):
        what = f"import {_modules(spec.verify_modules)}"
        item = results.get(i)
        if item is not None:
            ok = bool(item.get("ok"))
            many = f" (one check for {len(specs)} kernels)" if len(specs) > 1 else ""
            detail = f"{what}: ok in {item.get('seconds', 0):.1f} s{many}" if ok else f"{what}: {item.get('error')}"
            result = _with_numbers(Verification(ok, detail, float(item.get("seconds") or 0.0), ran.code),
                                   i, item, pending, done)
            out.append(_with_gdr(result, spec, gdrs[i], item, environ))
            continue
        if blamed:
            out.append(Verification(False, "not checked: the check stopped at an earlier kernel", 0.0, None))
            continue
        blamed = True
        step = phase.get(i)
        if step == "gdr":
            what = f"{spec.name}'s gated-delta-rule check"
        elif step == "numeric" and i in pending:
            what = f"{spec.name}'s numeric check"
        detail = ended(ran, what, timeout, other)
        if step == "numeric" and i in pending:   # it imported; its numeric check crashed or ran out of time
            numbers = conclude(pending[i], None, detail, ran.seconds)
            out.append(Verification(False, numbers.detail, ran.seconds, ran.code, numeric=True))
            continue
        out.append(Verification(False, detail, ran.seconds, ran.code))
    if mine and loaded:
        for spec, result, key in zip(specs, out, keys):
            if result.ok:
                store.remember(root, spec, env_extra, loaded, result.seconds, extra=key, gpus=gpus)
    return out


def _what(spec, check) -> str:
    return f"import {_modules(spec.verify_modules)}" + (" and its gated-delta-rule check" if check else "")


def _with_gdr(result, spec, check, item: dict, environ: dict):
    """A kernel's Verification with its gated-delta-rule check's result (the check's clause says more than
    the import's: it imports and runs the kernel); a passed check's warm-up is recorded for `doctor`."""
    if not result.ok or not check:
        return result
    report = item.get("gdr")
    what = f"{spec.name}'s gated-delta-rule check"
    if not isinstance(report, dict):
        return replace(result, ok=False, detail=f"{what} did not run")
    seconds = result.seconds + float(report.get("seconds") or 0.0)
    if report.get("status") != "pass":
        return replace(result, ok=False, detail=f"{what}: {report.get('reason')}", seconds=seconds)
    record_warm(cache_root_from_environ(environ), spec.name, report, environ)
    numbers = result.detail.split("; ", 1)[1] if "; " in result.detail else ""
    clause = f"{what}: {summary(report)}"
    return replace(result, detail=f"{numbers}; {clause}" if numbers else clause, seconds=seconds)


def _with_numbers(result, i: int, item: dict, pending: dict, done: dict):
    """An imported kernel's Verification with its numeric result (run in the child, or known before)."""
    if not result.ok:
        return result
    if i in pending:
        report = item.get("numeric")
        numbers = conclude(pending[i], report, None if isinstance(report, dict) else "the numeric check did not run",
                           float(item.get("numeric_seconds") or 0.0))
    elif i in done:
        numbers = done[i]
    else:
        return result
    if not numbers.ok:
        return replace(result, ok=False, detail=numbers.detail, numeric=True)
    return replace(result, detail=f"{result.detail}; {numbers.detail}")


def _modules(names) -> str:
    """The modules as a message names them: all when short, else their package (a line stays short)."""
    joined = ", ".join(names)
    packages = sorted({name.split(".")[0] for name in names})
    return joined if len(joined) <= 24 else ", ".join(packages)


# -- the warm-up records (doctor) -----------------------------------------------------------------

def summary(result: dict) -> str:
    """A passed gated-delta-rule check in one clause: how far from its limit it came, what the warm-up cost."""
    parts = []
    worst = result.get("worst")
    if worst:
        parts.append(f"{worst['tensor']} {worst['error']:.1e} (limit {worst['limit']:.1e}) at T={result['check_seq']}")
    warm = result.get("warm", [])
    if warm:
        seqs = sorted({w["seq"] for w in warm})      # each length once: its variants (a final state or not) too
        parts.append(f"JIT warmed for {', '.join(map(str, seqs))} tokens")
    parts.append(f"{result.get('seconds', 0):.1f} s")
    return ", ".join(parts)


def warm_path(root: str) -> str:
    return os.path.join(root, "jit", WARM_FILE)


def record_warm(root: str, kernel: str, result: dict, environ: dict) -> None:
    """Keep the last warm-up of `kernel` under the cache root (what, when, how long, into which cache
    directories) for `doctor`; best effort."""
    data = warm_records(root)
    data[kernel] = {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": result.get("seconds"),
                    "shapes": result.get("shapes"), "seqs": sorted({w["seq"] for w in result.get("warm", [])}),
                    "first_call_s": result.get("first_call_s"), "device": result.get("device"),
                    "dirs": {v: environ.get(v) for v in ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR") if environ.get(v)}}
    try:
        atomic_write_json(warm_path(root), data)
    except OSError:
        pass


def warm_records(root: str) -> dict:
    try:
        with open(warm_path(root), encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cache_listing(directory: str) -> dict:
    """Entries, bytes and the newest change in a JIT cache directory (doctor)."""
    size, newest = 0, None
    try:
        entries = len(os.listdir(directory))
    except OSError:
        return {"directory": directory, "exists": False, "entries": 0, "bytes": 0, "newest": None}
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            size += st.st_size
            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
    return {"directory": directory, "exists": True, "entries": entries, "bytes": size,
            "newest": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(newest)) if newest else None}


# -- doctor --smoke ---------------------------------------------------------------------------------

def run_smoke(settings, env) -> dict:
    """The installed fla's gated delta rule against the float32 reference, in the check child."""
    if env.accelerator != "cuda":
        return {"status": "skipped", "reason": f"needs a CUDA GPU (accelerator here: {env.accelerator or 'none'})"}
    ran = run([sys.executable, CHILD, "smoke"], timeout=settings.timeout, label="running the smoke test")
    if ran.timed_out:
        return {"status": "fail", "reason": f"did not finish within {settings.timeout:.0f} s"}
    for line in ran.output.splitlines():
        if line.startswith(SMOKE_MARK):
            return json.loads(line[len(SMOKE_MARK):])
    tail = " | ".join(ln for ln in ran.output.strip().splitlines()[-3:])
    return {"status": "fail", "reason": f"the smoke process exited with {ran.code}: {tail}"}


def smoke_text(result: dict) -> str:
    if result.get("status") == "skipped":
        return f"Smoke test: skipped - {result.get('reason')}"
    if "errors" not in result:
        return f"Smoke test: FAIL - {result.get('reason')}"
    tol = result.get("tolerances", {})
    lines = [f"Smoke test: {result['status'].upper()} (fla {result.get('fla')}, triton {result.get('triton')}, "
             f"tilelang {result.get('tilelang')}, {result.get('gpu')} {result.get('capability')})",
             "  relative error vs float32 torch reference (tolerance: output "
             f"{tol.get('output')}, gradients {tol.get('gradients')}):"]
    for name, err in result["errors"].items():
        mark = "FAIL" if name in result.get("failed", []) else "ok"
        lines.append(f"    {name:<8}{err:.2e}  {mark}")
    return "\n".join(lines)
