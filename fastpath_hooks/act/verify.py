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


@dataclass(frozen=True)
class Verification:
    ok: bool
    detail: str
    seconds: float
    returncode: int | None
    numeric: bool = False     # it failed on its numbers (act/numeric.py): the kernel is blocked on that arch


def child_env(extra=()) -> dict:
    """The verification child's environment: hooks off, no posed target (it imports the real thing)."""
    from .runner import child_environ

    return child_environ(extra, drop=("FASTPATH_HOOKS_TARGET",))


def verify(kernel_spec, *, timeout: float, env_extra=(), python: str | None = None, started=None,
           numeric=None) -> Verification:
    """The kernel's import in a child process; then, with `numeric` (act/numeric.py's NumericPlan), its
    numbers against torch on the GPU (once per installed files, GPU arch and torch build)."""
    payload = json.dumps({"modules": list(kernel_spec.verify_modules), "attributes": list(kernel_spec.verify_attributes)})
    result = run_check(_CODE, payload, timeout=timeout, env_extra=env_extra, python=python,
                       what=f"import {_modules(kernel_spec.verify_modules)}", started=started)
    if not result.ok or numeric is None:
        return result
    from dataclasses import replace

    from .numeric import verify_numbers

    numbers = verify_numbers(numeric, distributions=kernel_spec.distributions, timeout=timeout, env_extra=env_extra,
                             python=python, started=started)
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
    return Verification(True, f"{what}: ok in {ran.seconds:.1f} s", ran.seconds, ran.code)


def _tail(text: str, lines: int = 3) -> str:
    rows = [r for r in (text or "").strip().splitlines() if r.strip()]
    return " | ".join(rows[-lines:])[-400:]
