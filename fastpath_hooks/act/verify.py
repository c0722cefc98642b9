"""The check of installed kernels: ONE child (act/check_child.py) for every kernel of an install - never
in-process: a bad build can abort or segfault the importer. A passed check is remembered (act/store.py). Also
the parent side of the warm-up records (`doctor`) and of `doctor --smoke`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, replace

from .. import events
from .._names import cache_root_from_environ
from ..facts.distributions import installed_versions, scan
from ..facts.frozen import thaw
from ..facts.memory import read_records
from . import store
from .store import check_key
from .numeric import NumericResult, conclude, prepare, run_child, skipped
from .runner import child_environ, ended
from .transaction import atomic_write_json


@dataclass(frozen=True)
class Verification:
    ok: bool
    detail: str
    seconds: float
    numeric: bool = False     # it failed on its numbers: the kernel is blocked on that arch
    child: bool = True        # False: its check was remembered (act/store.py)


def relevant(loaded: dict, names) -> dict:
    """The distributions of `loaded` a kernel computes with (`names`: the pins' allow-list, triton's, torch; CUDA's
    nvidia-* libraries): transformers and the hub's libraries, which fla imports, are no part of its check."""
    keep = set(names) | {"torch"}
    return {d: v for d, v in loaded.items() if d in keep or d.startswith("nvidia-")}


def verify(kernel_spec, *, timeout: float, env_extra=(), numeric=None, check=None, root: str | None = None,
           gpus=(), keyed=()) -> Verification:
    return verify_many([kernel_spec], timeout=timeout, env_extra=env_extra, numeric=[numeric], checks=[check],
                       root=root, gpus=gpus, keyed=keyed)[0]


def verify_many(kernel_specs, *, timeout: float, env_extra=(), started=None, numeric=(), checks=(),
                root: str | None = None, gpus=(), keyed=(), envs=()) -> list:
    """One Verification per kernel (in dependency order), all checked in ONE child. A kernel the child never
    reached (it died on an earlier one) is not blamed: its `detail` starts with "not checked". `numeric`: per
    kernel its NumericPlan or None (a mismatch fails it with `numeric` set: blocked on that arch); `checks`: per
    kernel its decision's gated-delta-rule check or None - one that waits for the kernel's first call
    (`first_call`, hooks/first_call.py) is not run here. When every kernel's whole check passed before for
    exactly this environment (the memory under `root`, keyed on the `keyed` distributions it loaded and each
    kernel's own variables: `envs`, default `env_extra`), no child runs."""
    specs = list(kernel_specs)
    plans = list(numeric) + [None] * (len(specs) - len(numeric))
    gdrs = [c if c and not c.get("first_call") else None for c in checks] + [None] * (len(specs) - len(checks))
    # a decision's check is part of the memory's key: another check (other shapes, a backend) runs again
    keys = [check_key(c) for c in gdrs]
    numbers = {i: skipped(plan) or prepare(plan, store.installed_digest(spec.distributions),
                                           installed_versions().get(spec.distributions[0]))
               for i, (spec, plan) in enumerate(zip(specs, plans)) if plan is not None}
    pending = {i: n for i, n in numbers.items() if not isinstance(n, NumericResult)}   # the rest: skipped, known
    owns = [tuple(e) for e in envs] + [tuple(env_extra)] * (len(specs) - len(envs))   # what a kernel is keyed on
    # a passed gated-delta-rule check is remembered on what it computed with alone (store.recall_pass); the rest
    # on all the check child read
    known = [(store.recall_pass(root, s, c, gpus) if c else store.recall(root, s, own, extra=k, gpus=gpus))
             if root else None for s, k, own, c in zip(specs, keys, owns, gdrs)]
    if not pending and all(known):
        return [_with_numbers(Verification(True, f"{_what(s, c)}: remembered (same files and environment, "
                                                 f"{k.get('when', '?')})", 0.0, child=False), numbers.get(i), {})
                for i, (s, k, c) in enumerate(zip(specs, known, gdrs))]

    payload = json.dumps([{"modules": list(s.verify_modules), "attributes": list(s.verify_attributes),
                           **({"numeric": pending[i].payload} if i in pending else {}),
                           **({"gdr": thaw(gdrs[i])} if gdrs[i] else {})} for i, s in enumerate(specs)])
    off = tuple(pair for plan in plans if plan is not None for pair in plan.env)   # the kernels' own numbers
    environ = child_environ(tuple(env_extra) + off, drop=("FASTPATH_HOOKS_TARGET",))   # the real GPU, not a posed one
    warmed = next((s.name for s, c in zip(specs, gdrs) if c), None)   # said while it runs (minutes on a cold GPU)
    ran, items, other = run_child(payload, timeout=timeout, environ=environ, started=started, kernel=warmed,
                                  label=f"checking {warmed} forward + backward and warming its JIT" if warmed else "")
    results, phase, loaded = {}, {}, None   # phase: index -> the last check the child began for it
    for item in items:
        if "loaded" in item:
            loaded = item["loaded"]
        elif item.get("phase"):
            phase[item.get("index")] = item["phase"]
        else:
            results[item.get("index")] = item
    out, blamed = [], False
    for i, spec in enumerate(specs):
        what = f"import {_modules(spec.verify_modules)}"
        item = results.get(i)
        if item is not None:
            ok = bool(item.get("ok"))
            many = f" (one check for {len(specs)} kernels)" if len(specs) > 1 else ""
            detail = f"{what}: ok in {item.get('seconds', 0):.1f} s{many}" if ok else \
                f"{what}: {_shadowed(spec, item.get('origin'), item.get('error'))}"
            result = _with_numbers(Verification(ok, detail, float(item.get("seconds") or 0.0)), numbers.get(i), item)
            out.append(_with_gdr(result, spec, gdrs[i], item, environ))
            continue
        if blamed:
            out.append(Verification(False, "not checked: the check stopped at an earlier kernel", 0.0))
            continue
        blamed = True
        step = phase.get(i)   # it imported; a numeric check that crashes is a verdict on the build's numbers
        if step:
            what = f"{spec.name}'s {'gated-delta-rule' if step == 'gdr' else 'numeric'} check"
        out.append(Verification(False, ended(ran, what, timeout, other), ran.seconds, numeric=step == "numeric"))
    if root and loaded:
        for i, (spec, result, key, own) in enumerate(zip(specs, out, keys, owns)):
            if not result.ok:
                continue
            # a kernel's key leaves out the kernels checked after it in the same child (installed after it
            # elsewhere: tilelang is checked before fla is there); its import alone is remembered too
            later = {d for other in specs[i + 1:] for d in other.distributions}
            read = {d: v for d, v in (relevant(loaded, keyed) if keyed else loaded).items() if d not in later}
            for extra in dict.fromkeys((key, "")):
                store.remember(root, spec, own, read, result.seconds, extra=extra, gpus=gpus)
            if gdrs[i]:
                store.remember_pass(root, spec, gdrs[i], gpus, result.seconds)
    return out


def check_now(spec, check, *, timeout: float, env_extra=(), root: str | None = None, gpus=(), keyed=(),
              started=None) -> Verification:
    """A check that waited for the kernel's first call (`check`: the decision's, with the call's shapes, dtype,
    length and variant): remembered for exactly this environment, else run in the check child - which imports the
    kernel and runs the one pass; `child` False when remembered."""
    check = {**thaw(check), "first_call": False}
    return verify_many([spec], timeout=timeout, env_extra=env_extra, checks=[check], root=root, gpus=gpus, keyed=keyed,
                       started=started)[0]


def _shadowed(spec, origin, error) -> str:
    """Why the import failed: the error, or - where the kernel's package was imported from another place than the
    copy its installed distribution put in site-packages (an `fla/` on PYTHONPATH or in the working directory) -
    that place and the fix (the error it causes, "No module named 'fla.modules'", goes to the debug log). An
    editable install (no copy in site-packages) is never taken for a shadow."""
    if origin and spec.verify_modules:
        top = spec.verify_modules[0].split(".")[0]
        found, _ = scan()
        where = os.path.realpath(origin)
        for dist in (d for d in getattr(spec, "distributions", ()) if d in found):
            site = os.path.realpath(found[dist].site)
            copy = os.path.isdir(os.path.join(site, top)) or os.path.isfile(os.path.join(site, top + ".py"))
            if copy and not where.startswith(site + os.sep):
                events.debug(f"{spec.name}: {error}", spec.name)
                return f"{origin} shadows the installed {dist} (move or rename it)"
    return str(error)


def _what(spec, check) -> str:
    return f"import {_modules(spec.verify_modules)}" + (" and its gated-delta-rule check" if check else "")


def _with_gdr(result, spec, check, item: dict, environ: dict):
    """With its gated-delta-rule check's clause (it says more than the import's); a passed check's warm-up is
    recorded for `doctor`."""
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


def _with_numbers(result, numbers, item: dict):
    """With its numbers: a NumericResult (skipped, remembered), or the child's report of a numeric.Pending."""
    if not result.ok or numbers is None:
        return result
    if not isinstance(numbers, NumericResult):
        report = item.get("numeric")
        numbers = conclude(numbers, report, None if isinstance(report, dict) else "the numeric check did not run",
                           float(item.get("numeric_seconds") or 0.0))
    if not numbers.ok:
        return replace(result, ok=False, detail=numbers.detail, numeric=True)
    return replace(result, detail=f"{result.detail}; {numbers.detail}")


def _modules(names) -> str:
    """The modules as a message names them: all when short, else their package (a line stays short)."""
    joined = ", ".join(names)
    return joined if len(joined) <= 24 else ", ".join(sorted({name.split(".")[0] for name in names}))


# -- the warm-up records and doctor --smoke -------------------------------------------------------

def summary(result: dict) -> str:
    """A passed gated-delta-rule check in one clause: how far from its limit it came, what its one pass compiled."""
    worst = result.get("worst")
    tuned = result.get("tune_seq")
    parts = [f"{worst['tensor']} {worst['error']:.1e} (limit {worst['limit']:.1e}) at T={result['check_seq']}"
             if worst else "", f"JIT compiled and tuned at {tuned} tokens" if tuned else "",
             f"{result.get('seconds', 0):.1f} s"]
    return ", ".join(p for p in parts if p)


def warm_path(root: str) -> str:
    return os.path.join(root, "jit", "warm.json")


def record_warm(root: str, kernel: str, result: dict, environ: dict) -> None:
    """The last check pass of `kernel` (what, when, how long, into which cache directories), for `doctor`."""
    data = warm_records(root)
    data[kernel] = {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": result.get("seconds"),
                    "shapes": result.get("shapes"), "dtype": result.get("dtype"), "tune_seq": result.get("tune_seq"),
                    "first_call_s": result.get("first_call_s"), "device": result.get("device"),
                    "dirs": {v: environ.get(v) for v in ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR") if environ.get(v)}}
    with contextlib.suppress(OSError):
        atomic_write_json(warm_path(root), data)


def warm_records(root: str) -> dict:
    return read_records(warm_path(root))


def cache_listing(directory: str) -> dict:
    """Entries, bytes and the newest change in a JIT cache directory (doctor)."""
    try:
        entries = len(os.listdir(directory))
    except OSError:
        return {"directory": directory, "exists": False, "entries": 0, "bytes": 0, "newest": None}
    stats = []
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                stats.append(os.stat(os.path.join(root, name)))
    newest = max((st.st_mtime for st in stats), default=None)
    return {"directory": directory, "exists": True, "entries": entries, "bytes": sum(st.st_size for st in stats),
            "newest": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(newest)) if newest else None}


def run_smoke(settings, env) -> dict:
    """The installed fla's gated delta rule against the float32 reference, in the check child."""
    if env.accelerator != "cuda":
        return {"status": "skipped", "reason": f"needs a CUDA GPU (accelerator here: {env.accelerator or 'none'})"}
    ran, items, other = run_child("smoke", timeout=settings.timeout, environ=child_environ(),
                                  label="running the smoke test")
    return items[-1] if items else {"status": "fail", "reason": ended(ran, "the smoke test", settings.timeout, other)}


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
