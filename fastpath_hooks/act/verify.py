"""Verification in a child process, with a timeout.

Never in-process: a bad tilelang/apache-tvm-ffi pair aborts the importing
process (SIGABRT), and a wrong-arch causal-conv1d build can segfault.
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import dataclass

_MARK = "FASTPATH_HOOKS_VERIFY "
_CODE = r"""
import importlib, json, sys
spec = json.loads(sys.argv[1])
out = {"ok": True, "error": None, "versions": {}}
try:
    for name in spec["modules"]:
        mod = importlib.import_module(name)
        out["versions"][name] = str(getattr(mod, "__version__", ""))
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
if out["ok"]:   # the distributions whose modules the import loaded (act/import_memory.py keys the memory on them)
    try:
        import importlib.metadata as md
        owners = md.packages_distributions()
        tops = {n.split(".")[0] for n, m in list(sys.modules.items()) if getattr(m, "__file__", None)}
        out["loaded"] = {d: md.version(d) for top in sorted(tops) for d in owners.get(top, ())}
    except Exception:
        pass
sys.stdout.write("\n" + MARK + json.dumps(out) + "\n")
sys.stdout.flush()
""".replace("MARK", repr(_MARK))


# Several kernels in one child (a request's cached kernels, dependency order): one result line per
# kernel as soon as it is checked, so a crash names the kernel it happened in and the ones before stand.
_MANY = r"""
import importlib, importlib.util, json, sys, time
specs = json.loads(sys.argv[2])   # argv[1]: act/numeric_check.py, loaded only where a numeric check runs
numeric = None
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
        # the numeric check (act/numeric_check.py) in this child too; a crash in it is said as its own
        sys.stdout.write("\n" + MARK + json.dumps({"index": i, "phase": "numeric"}) + "\n")
        sys.stdout.flush()
        if numeric is None:
            loaded = importlib.util.spec_from_file_location("fastpath_hooks_numeric_check", sys.argv[1])
            numeric = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(numeric)
        payload, results, began = spec["numeric"], [], time.monotonic()
        try:
            for check in payload["checks"]:
                results.append(numeric.run_check(check, payload["device"]))
            out["numeric"] = {"ok": True, "results": results}
        except BaseException as exc:
            out["numeric"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400], "results": results}
        out["numeric_seconds"] = round(time.monotonic() - began, 3)
    sys.stdout.write("\n" + MARK + json.dumps(out) + "\n")
    sys.stdout.flush()
# the distributions whose modules these imports loaded (act/import_memory.py keys the memory on them)
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
    child: bool = True        # a child process checked it (False: its import remembered, act/import_memory.py)
    loaded: tuple = ()        # ((distribution, version), ...) the child's import loaded (the memory's key)


def child_env(extra=()) -> dict:
    """The verification child's environment: hooks off, no posed target (it imports the real thing)."""
    from .runner import child_environ

    return child_environ(extra, drop=("FASTPATH_HOOKS_TARGET",))


def verify(kernel_spec, *, timeout: float, env_extra=(), python: str | None = None, started=None,
           numeric=None, check=None, root: str | None = None, gpus=()) -> Verification:
    """The kernel's import in a child process; then, with `numeric` (act/numeric.py's NumericPlan), its
    numbers against torch on the GPU (once per installed files, GPU arch and torch build); then, where
    its decision has a `check` (the gated delta rule through the served kernel with and without a
    backend, compared, and the JIT warmed: act/gdr_check.py), that check in another child. The numeric
    check speaks for the kernel's own build (a mismatch blocks it on that arch); the gated-delta-rule
    check for a backend against the served kernel's own path (a failure switches the backend off).
    `root`: the cache root whose import memory (act/import_memory.py) is read and written - the whole
    verification (import, numbers and check, the check's payload part of the key) passed before for the same
    files beside the same distributions, interpreter and machine: no child runs (a later environment)."""
    from dataclasses import replace

    from . import import_memory

    mine = root and python is None
    what = _check_key(check)
    if mine:
        known = import_memory.recall(root, kernel_spec, env_extra, extra=what, gpus=gpus)
        if known is not None and _numbers_remembered(numeric, kernel_spec):
            return Verification(True, f"import{' and check' if check else ''} remembered (same files and environment, "
                                      f"{known.get('when', '?')})", 0.0, None, child=False)
    payload = json.dumps({"modules": list(kernel_spec.verify_modules), "attributes": list(kernel_spec.verify_attributes)})
    result = run_check(_CODE, payload, timeout=timeout, env_extra=env_extra, python=python,
                       what=f"import {_modules(kernel_spec.verify_modules)}", started=started)
    if not result.ok:
        return result
    loaded, seconds = dict(result.loaded), result.seconds
    numbers = None
    if numeric is not None:
        from .numeric import verify_numbers

        numbers = verify_numbers(numeric, distributions=kernel_spec.distributions, timeout=timeout, env_extra=env_extra,
                                 python=python, started=started)
        if not numbers.ok:
            return replace(result, ok=False, detail=numbers.detail, numeric=True)
    if check:
        from .gdr_check import run_check as run_gdr_check

        checked = run_gdr_check(check, kernel=kernel_spec.name, timeout=max(1.0, timeout - result.seconds),
                                env_extra=env_extra, python=python, started=started)
        # the check imports and runs the kernel: its clause says more than the import's (one line stays short)
        detail = f"{numbers.detail}; {checked.detail}" if checked.ok and numbers is not None else checked.detail
        result = replace(result, ok=checked.ok, detail=detail, seconds=result.seconds + checked.seconds,
                         returncode=checked.returncode)
    elif numbers is not None:
        result = replace(result, detail=f"{result.detail}; {numbers.detail}")
    if result.ok and mine and loaded:
        import_memory.remember(root, kernel_spec, env_extra, loaded, seconds, extra=what, gpus=gpus)
    return result


def _check_key(check) -> str:
    """A decision's check as part of the memory's key (another check - other shapes, a backend - runs again)."""
    if not check:
        return ""
    from ..facts.frozen import thaw

    return json.dumps(thaw(check), sort_keys=True, default=str)


def _numbers_remembered(numeric, spec) -> bool:
    """No numeric check due, or it passed before for these installed files (act/numeric.py's records)."""
    if numeric is None:
        return True
    from .numeric import NumericResult, prepare

    got = prepare(numeric, spec.distributions)
    return isinstance(got, NumericResult) and got.ok


def verify_many(kernel_specs, *, timeout: float, env_extra=(), python: str | None = None, started=None,
                numeric=(), root: str | None = None, gpus=()) -> list:
    """Every kernel of `kernel_specs` (in order: a kernel after those it imports) checked in ONE child
    process: one Verification each (its `seconds` the kernel's own import time in the child). A kernel
    the child never reached (it crashed or timed out on an earlier one) gets a failed Verification
    saying so, with `returncode` None, and is not to be blamed: its `detail` starts with "not checked".
    `numeric`: per kernel, act/numeric.py's NumericPlan or None; a check not remembered for the installed
    files runs in the same child, after the kernel's import (torch is imported once for all of them),
    and a mismatch (or a crash in it) fails the kernel with `numeric` set, as verify() does.
    `root`: the cache root whose import memory (act/import_memory.py) is read and written: when every
    kernel's import is remembered for exactly this environment and no numeric check is due, no child
    runs at all."""
    import os

    from . import import_memory
    from .runner import run

    specs = list(kernel_specs)
    plans = list(numeric) + [None] * (len(specs) - len(numeric))
    pending: dict = {}   # index -> numeric.Pending; done: index -> NumericResult (skipped or remembered)
    done: dict = {}
    if any(p is not None for p in plans):
        from .numeric import NumericResult, prepare

        for i, (spec, plan) in enumerate(zip(specs, plans)):
            if plan is not None:
                got = prepare(plan, spec.distributions)
                (done if isinstance(got, NumericResult) else pending)[i] = got
    mine = root and python is None   # the memory speaks for this interpreter's environment only
    known = [import_memory.recall(root, s, env_extra, gpus=gpus) if mine else None for s in specs]
    if not pending and all(known):
        return [_with_numbers(Verification(True, f"import {_modules(s.verify_modules)}: remembered (same files and "
                                                 f"environment, {k.get('when', '?')})", 0.0, None, child=False),
                              i, {}, pending, done)
                for i, (s, k) in enumerate(zip(specs, known))]
    payload = json.dumps([{"modules": list(s.verify_modules), "attributes": list(s.verify_attributes),
                           **({"numeric": pending[i].payload} if i in pending else {})} for i, s in enumerate(specs)])
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "numeric_check.py")
    off = tuple(pair for plan in plans if plan is not None for pair in plan.env)   # backends off: the kernels' own numbers
    ran = run([python or sys.executable, "-c", _MANY, script, payload], timeout=timeout,
              environ=child_env(tuple(env_extra) + off),
              started=started)
    results: dict = {}
    in_numbers: set = set()
    loaded = None
    for line in ran.output.splitlines():
        if line.startswith(_MARK):
            try:
                item = json.loads(line[len(_MARK):])
                if "loaded" in item:
                    loaded = item["loaded"]
                elif item.get("phase") == "numeric":
                    in_numbers.add(int(item["index"]))
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
            detail = f"{what}: ok in {item.get('seconds', 0):.1f} s (one check for {len(specs)} kernels)" if ok \
                else f"{what}: {item.get('error')}"
            out.append(_with_numbers(Verification(ok, detail, float(item.get("seconds") or 0.0), ran.code),
                                     i, item, pending, done))
            continue
        if blamed:
            out.append(Verification(False, "not checked: the check stopped at an earlier kernel", 0.0, None))
            continue
        blamed = True
        if ran.timed_out:
            detail = f"{what} did not finish within {timeout:.0f} s"
        elif ran.code is not None and ran.code < 0:
            try:
                name = signal.Signals(-ran.code).name
            except ValueError:
                name = f"signal {-ran.code}"
            tail = _tail(other)
            detail = f"{what} killed the process ({name})" + (f": {tail}" if tail else "")
        else:
            detail = f"{what} exited with code {ran.code}: {_tail(other) or 'no output'}"
        if i in in_numbers and i in pending:   # it imported; its numeric check crashed or ran out of time
            from .numeric import conclude

            numbers = conclude(pending[i], None, f"{spec.name}'s numeric check: {detail.split(': ', 1)[-1]}"
                               if not ran.timed_out else f"{spec.name}'s numeric check did not finish within "
                               f"{timeout:.0f} s", ran.seconds)
            out.append(Verification(False, numbers.detail, ran.seconds, ran.code, numeric=True))
            continue
        out.append(Verification(False, detail, ran.seconds, ran.code))
    if mine and loaded:
        for spec, result in zip(specs, out):
            if result.ok:
                import_memory.remember(root, spec, env_extra, loaded, result.seconds, gpus=gpus)
    return out


def _with_numbers(result, i: int, item: dict, pending: dict, done: dict):
    """An imported kernel's Verification with its numeric result (run in the child, or known before)."""
    from dataclasses import replace

    if not result.ok:
        return result
    if i in pending:
        from .numeric import conclude

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


def run_check(code: str, payload: str, *, timeout: float, env_extra=(), python: str | None = None, what: str,
              started=None) -> Verification:
    """Run `code` in a child interpreter (the runner: its own process group, killed whole on a
    timeout or Ctrl-C) and read the result line it prints last."""
    from .runner import run

    ran = run([python or sys.executable, "-c", code, payload], timeout=timeout, environ=child_env(env_extra),
              started=started)
    lines = ran.output.splitlines()
    result = None
    for line in lines:
        if line.startswith(_MARK):
            try:
                result = json.loads(line[len(_MARK):])
            except ValueError:
                result = None
    other = "\n".join(ln for ln in lines if not ln.startswith(_MARK))
    if ran.timed_out:
        return Verification(False, f"{what} did not finish within {timeout:.0f} s", ran.seconds, None)
    if ran.code < 0:
        try:
            name = signal.Signals(-ran.code).name
        except ValueError:
            name = f"signal {-ran.code}"
        tail = _tail(other)
        return Verification(False, f"{what} killed the process ({name})" + (f": {tail}" if tail else ""),
                            ran.seconds, ran.code)
    if result is None:
        return Verification(False, f"{what} exited with code {ran.code}: {_tail(other) or 'no output'}",
                            ran.seconds, ran.code)
    if not result.get("ok"):
        return Verification(False, f"{what}: {result.get('error')}", ran.seconds, ran.code)
    return Verification(True, f"{what}: ok in {ran.seconds:.1f} s", ran.seconds, ran.code,
                        loaded=tuple(sorted((result.get("loaded") or {}).items())))


def _tail(text: str, lines: int = 3) -> str:
    rows = [r for r in (text or "").strip().splitlines() if r.strip()]
    return " | ".join(rows[-lines:])[-400:]
