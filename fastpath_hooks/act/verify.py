"""Verification in a child process, with a timeout.

Never in-process: a bad tilelang/apache-tvm-ffi pair aborts the importing
process (SIGABRT), and a wrong-arch causal-conv1d build can segfault.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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


@dataclass(frozen=True)
class Verification:
    ok: bool
    detail: str
    seconds: float
    returncode: int | None


def child_env(extra=()) -> dict:
    env = dict(os.environ)
    env["FASTPATH_HOOKS_DISABLE"] = "1"   # the child must not install hooks (or recurse)
    env.pop("FASTPATH_HOOKS_TARGET", None)
    env.update(dict(extra))
    return env


def verify(kernel_spec, *, timeout: float, env_extra=(), python: str | None = None) -> Verification:
    payload = json.dumps({"modules": list(kernel_spec.verify_modules), "attributes": list(kernel_spec.verify_attributes)})
    return run_check(_CODE, payload, timeout=timeout, env_extra=env_extra, python=python,
                     what=f"import {_modules(kernel_spec.verify_modules)}")


def _modules(names) -> str:
    """The modules as a message names them: all when short, else their package (a line stays short)."""
    joined = ", ".join(names)
    packages = sorted({name.split(".")[0] for name in names})
    return joined if len(joined) <= 24 else ", ".join(packages)


def run_check(code: str, payload: str, *, timeout: float, env_extra=(), python: str | None = None, what: str) -> Verification:
    start = time.monotonic()
    try:
        proc = subprocess.run([python or sys.executable, "-c", code, payload], env=child_env(env_extra),
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Verification(False, f"{what} did not finish within {timeout:.0f} s", time.monotonic() - start, None)
    except OSError as exc:
        return Verification(False, f"could not start {python or sys.executable}: {exc}", time.monotonic() - start, None)
    seconds = time.monotonic() - start
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        tail = _tail(proc.stderr)
        return Verification(False, f"{what} killed the process ({name})" + (f": {tail}" if tail else ""),
                            seconds, proc.returncode)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            try:
                result = json.loads(line[len(_MARK):])
            except ValueError:
                result = None
    if result is None:
        return Verification(False, f"{what} exited with code {proc.returncode}: {_tail(proc.stderr) or 'no output'}",
                            seconds, proc.returncode)
    if not result.get("ok"):
        return Verification(False, f"{what}: {result.get('error')}", seconds, proc.returncode)
    return Verification(True, f"{what}: ok in {seconds:.1f} s", seconds, proc.returncode)


def _tail(text: str, lines: int = 3) -> str:
    rows = [r for r in (text or "").strip().splitlines() if r.strip()]
    return " | ".join(rows[-lines:])[-400:]
