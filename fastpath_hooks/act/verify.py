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
sys.stdout.write("\n" + MARK + json.dumps(out) + "\n")
sys.stdout.flush()
""".replace("MARK", repr(_MARK))


# Several kernels in one child (a request's cached kernels, dependency order): one result line per
# kernel as soon as it is checked, so a crash names the kernel it happened in and the ones before stand.
_MANY = r"""
import importlib, json, sys, time
specs = json.loads(sys.argv[1])
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
    sys.stdout.write("\n" + MARK + json.dumps(out) + "\n")
    sys.stdout.flush()
""".replace("MARK", repr(_MARK))


@dataclass(frozen=True)
class Verification:
    ok: bool
    detail: str
    seconds: float
    returncode: int | None


def child_env(extra=()) -> dict:
    """The verification child's environment: hooks off, no posed target (it imports the real thing)."""
    from .runner import child_environ

    return child_environ(extra, drop=("FASTPATH_HOOKS_TARGET",))


def verify(kernel_spec, *, timeout: float, env_extra=(), python: str | None = None, started=None) -> Verification:
    payload = json.dumps({"modules": list(kernel_spec.verify_modules), "attributes": list(kernel_spec.verify_attributes)})
    return run_check(_CODE, payload, timeout=timeout, env_extra=env_extra, python=python,
                     what=f"import {_modules(kernel_spec.verify_modules)}", started=started)


def verify_many(kernel_specs, *, timeout: float, env_extra=(), python: str | None = None, started=None) -> list:
    """Every kernel of `kernel_specs` (in order: a kernel after those it imports) checked in ONE child
    process: one Verification each (its `seconds` the kernel's own import time in the child). A kernel
    the child never reached (it crashed or timed out on an earlier one) gets a failed Verification
    saying so, with `returncode` None, and is not to be blamed: its `detail` starts with "not checked"."""
    from .runner import run

    specs = list(kernel_specs)
    payload = json.dumps([{"modules": list(s.verify_modules), "attributes": list(s.verify_attributes)} for s in specs])
    ran = run([python or sys.executable, "-c", _MANY, payload], timeout=timeout, environ=child_env(env_extra),
              started=started)
    results: dict = {}
    for line in ran.output.splitlines():
        if line.startswith(_MARK):
            try:
                item = json.loads(line[len(_MARK):])
                results[int(item["index"])] = item
            except (ValueError, KeyError, TypeError):
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
            out.append(Verification(ok, detail, float(item.get("seconds") or 0.0), ran.code))
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
        out.append(Verification(False, detail, ran.seconds, ran.code))
    return out


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
    return Verification(True, f"{what}: ok in {ran.seconds:.1f} s", ran.seconds, ran.code)


def _tail(text: str, lines: int = 3) -> str:
    rows = [r for r in (text or "").strip().splitlines() if r.strip()]
    return " | ".join(rows[-lines:])[-400:]
