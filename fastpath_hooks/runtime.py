"""ensure(kernel): probe -> plan -> (cache) -> act -> verify -> record, once per process.

The hooks call only this module. It never raises into the caller: every failure
ends as an Outcome that leaves the import on transformers' working torch path,
with one clear message (local rank 0).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from dataclasses import dataclass, replace

from . import events
from .plan import BLOCK, INSTALL, OK, REPAIR, SKIP

GOOD = ("ok", "installed", "repaired")
GLOBAL_SKIPS = ("skip.no-accelerator", "skip.no-torch")
KERNEL_FINGERPRINT_DISTS = {
    "fla": ("fla-core", "flash-linear-attention", "einops", "packaging", "tilelang", "apache-tvm-ffi"),
    "tilelang": ("tilelang", "apache-tvm-ffi", "z3-solver", "torch-c-dlpack-ext", "nvidia-cuda-nvcc"),
    "causal-conv1d": ("causal-conv1d",),
}

_lock = threading.RLock()
_outcomes: dict = {}
_simulation = {"kind": None}


@dataclass(frozen=True)
class Outcome:
    kernel: str
    state: str              # ok installed repaired skipped blocked failed reported error
    reason: str
    block: str | None = None  # when set, `import <kernel>` fails with this message


def before_import(kernel: str) -> str | None:
    return ensure(kernel).block


def ensure(kernel: str) -> Outcome:
    with _lock:
        if kernel in _outcomes:
            return _outcomes[kernel]
        try:
            outcome = _ensure(kernel)
        except Exception as exc:  # never into the user's import
            outcome = Outcome(kernel, "error", f"internal error: {type(exc).__name__}: {exc}")
            events.error(f"{kernel}: {outcome.reason}; leaving it as it is", kernel, once="internal")
        _outcomes[kernel] = outcome
        return outcome


def outcomes() -> dict:
    return dict(_outcomes)


def simulation() -> str | None:
    return _simulation["kind"]


def forget() -> None:
    with _lock:
        _outcomes.clear()
        _simulation["kind"] = None
        events.forget()


# -- context -----------------------------------------------------------------------

def load_context(target: str | None = None, *, strict: bool = False):
    """(settings, pins). Bad settings or pins: report-only mode with defaults (or raise, strict)."""
    from .pins import PinsError, load
    from .settings import Settings, SettingsError

    try:
        settings = Settings.from_env()
        if target is not None:
            settings = settings.with_target(target)
    except SettingsError as exc:
        if strict:
            raise
        events.error(f"{exc}. Nothing is installed until that is fixed; kernels stay as they are",
                     once="settings")
        settings = Settings(mode="report")
    try:
        pins = load(settings.pins_file)
    except PinsError as exc:
        if strict:
            raise
        events.error(f"{exc}. Using the shipped pins in report mode (nothing is installed)", once="pins")
        pins = load(None)
        settings = replace(settings, mode="report", pins_file=None)
    return settings, pins


def fingerprint(env, settings, pins, kernel: str) -> str:
    from . import __version__

    facts = {
        "fastpath_hooks": __version__,
        "pins": pins.digest,
        "prefix": env.prefix,
        "python": env.python, "implementation": env.implementation, "platform": env.platform, "glibc": env.glibc,
        "torch": env.torch, "cuda": env.torch_cuda, "hip": env.torch_hip, "xpu": env.torch_xpu,
        "abi": env.cxx11_abi, "gpus": list(env.gpus), "triton": env.triton, "triton_dist": env.triton_dist,
        "nvcc": bool(env.nvcc), "fla_tilelang": env.fla_tilelang_env,
        "transformers": env.version("transformers"), "numpy": env.version("numpy"),
        "dists": {d: env.version(d) for d in KERNEL_FINGERPRINT_DISTS[kernel]},
        "half_installed": list(env.half_installed),
        "settings": [sorted(settings.skip), settings.allow_build, settings.offline, list(settings.find_links),
                     settings.index_url, settings.target, settings.causal_conv1d_wheel_url],
        "wheelhouse": hashlib.sha256("\n".join(env.wheelhouse).encode()).hexdigest()[:16],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def snapshot(settings, pins):
    from .policy import decide
    from .probe import probe

    env = probe(settings)
    return env, decide(env, settings, pins)


# -- the decision -----------------------------------------------------------------------

def _ensure(kernel: str) -> Outcome:
    settings, pins = load_context()
    if kernel in settings.skip:
        events.debug(f"{kernel}: skipped by FASTPATH_HOOKS_SKIP", kernel)
        return Outcome(kernel, "skipped", "skipped by FASTPATH_HOOKS_SKIP")
    env, plan = snapshot(settings, pins)
    _note_simulation(env)
    decision = plan[kernel]
    for name, value in decision.env:
        if name not in os.environ:
            os.environ[name] = value
            events.status(f"set {name}={value} ({decision.reason if decision.action == SKIP else 'for this accelerator'})",
                          kernel, human=False)

    if decision.action == SKIP:
        return _skipped(decision, plan)
    if decision.action == BLOCK:
        return _blocked(decision, decision.reason, decision.fix)

    for dep in decision.needs:
        dep_outcome = ensure(dep)
        if dep_outcome.state not in GOOD:
            why = f"{kernel} needs {dep} here and {dep} is not usable ({dep_outcome.reason})"
            if decision.on_failure == "block":
                return _blocked(decision, why, decision.fix or _hazard_fix(pins, kernel))
            events.warning(f"{why}; {kernel} is not installed, transformers keeps its torch path", kernel)
            return Outcome(kernel, "skipped", why)

    cache = _cache(settings)
    fp = fingerprint(env, settings, pins, kernel)
    if decision.action == OK:
        return _ok(decision, settings, pins, env, cache, fp)
    return _act(decision, settings, pins, env, cache, fp)


def _skipped(decision, plan) -> Outcome:
    if decision.rule in GLOBAL_SKIPS:
        kernels = ", ".join(plan.decisions)
        events.emit("status", f"{plan.notes[0] if plan.notes else decision.reason}: nothing to install; "
                    f"transformers keeps its torch path ({kernels})", decision.kernel, once="global-skip")
    else:
        tail = f" ({decision.fix})" if decision.fix else ""
        kind = "warning" if decision.rule.startswith(("fla.hazard", "tilelang.no-nvcc", "causal.no-wheel")) else "status"
        events.emit(kind, f"{decision.kernel}: not installed - {decision.reason}{tail}", decision.kernel,
                    once=f"skip-{decision.kernel}")
    return Outcome(decision.kernel, "skipped", decision.reason)


def _blocked(decision, reason: str, fix: str) -> Outcome:
    message = (f"fastpath-hooks blocked `import {_module(decision.kernel)}`: {reason}. "
               f"transformers uses its torch path instead." + (f" To fix: {fix}." if fix else ""))
    events.warning(f"{decision.kernel}: blocked - {reason}" + (f" (fix: {fix})" if fix else ""), decision.kernel,
                   once=f"block-{decision.kernel}")
    return Outcome(decision.kernel, "blocked", reason, block=message)


def _failed(decision, reason: str, remembered: bool = False) -> Outcome:
    if decision.on_failure == "block":
        return _blocked(decision, reason, decision.fix or "")
    prefix = "an earlier attempt failed" if remembered else "could not"
    events.error(f"{decision.kernel}: {prefix} {decision.action} - {reason}; transformers keeps its torch path",
                 decision.kernel, once=f"fail-{decision.kernel}")
    return Outcome(decision.kernel, "failed", reason)


def _ok(decision, settings, pins, env, cache, fp) -> Outcome:
    if not decision.verify:
        events.debug(f"{decision.kernel}: {decision.reason}", decision.kernel)
        return Outcome(decision.kernel, "ok", decision.reason)
    cached = cache.get(decision.kernel, fp)
    if cached is not None:
        if cached["state"] == "good":
            events.debug(f"{decision.kernel}: verified earlier ({cached['reason']})", decision.kernel)
            return Outcome(decision.kernel, "ok", decision.reason)
        if not (decision.repair_steps and settings.mode == "install"):
            return _failed(decision, cached["reason"], remembered=True)
    from .verify import verify

    result = verify(pins.kernel(decision.kernel), timeout=settings.timeout, env_extra=decision.env)
    if result.ok:
        cache.put(decision.kernel, fp, "good", result.detail)
        events.debug(f"{decision.kernel}: {result.detail}", decision.kernel)
        return Outcome(decision.kernel, "ok", decision.reason)
    if decision.repair_steps and settings.mode == "install":
        events.warning(f"{decision.kernel}: {result.detail}; repairing", decision.kernel)
        repair = replace(decision, action=REPAIR, steps=decision.repair_steps,
                         reason=f"{result.detail}; repairing", rule=decision.rule + ".repair",
                         target=_target_of(decision.repair_steps))
        return _act(repair, settings, pins, env, cache, fp, replanned=repair)
    cache.put(decision.kernel, fp, "failed", result.detail)
    return _failed(decision, result.detail)


def _act(decision, settings, pins, env, cache, fp, replanned=None) -> Outcome:
    kernel = decision.kernel
    if settings.mode == "report":
        events.warning(f"{kernel}: would {decision.action} ({decision.reason}); FASTPATH_HOOKS_MODE=report, so "
                       "nothing is installed", kernel, once=f"report-{kernel}")
        if decision.on_failure == "block" and decision.installed:
            return _blocked(decision, decision.reason + " (report mode: not repaired)", decision.fix)
        return Outcome(kernel, "reported", decision.reason)
    cached = cache.get(kernel, fp)
    if cached is not None and cached["state"] == "failed":
        return _failed(decision, cached["reason"] + " (remembered; retried after FASTPATH_HOOKS_RETRY_AFTER)",
                       remembered=True)

    import filelock

    from .state import environment_lock, environment_state_dir

    try:
        lock = environment_lock(settings)
    except OSError as exc:
        return _failed(decision, f"cannot create the install lock: {exc}")
    try:
        with lock:
            return _act_locked(decision, settings, pins, cache, replanned)
    except filelock.Timeout:
        return _failed(decision, f"another process held the install lock for {settings.lock_timeout:.0f} s "
                                 "(FASTPATH_HOOKS_LOCK_TIMEOUT)")


def _act_locked(decision, settings, pins, cache, replanned) -> Outcome:
    from .installer import InstallError, recover, run_steps
    from .state import environment_state_dir

    kernel = decision.kernel
    state_dir = environment_state_dir(settings)
    recover(state_dir)
    # Re-read the world: another process may have done this while we waited.
    env, plan = snapshot(settings, pins)
    current = plan[kernel] if replanned is None else replanned
    fp = fingerprint(env, settings, pins, kernel)
    if replanned is None and current.action == OK:
        cached = cache.get(kernel, fp)
        if not current.verify or (cached is not None and cached["state"] == "good"):
            events.status(f"{kernel}: ready ({current.reason}; done by another process)", kernel, once=f"done-{kernel}")
            return Outcome(kernel, "ok", current.reason)
        return _ok(current, settings, pins, env, cache, fp)
    if replanned is None and current.action in (SKIP, BLOCK):
        return _skipped(current, plan) if current.action == SKIP else _blocked(current, current.reason, current.fix)
    cached = cache.get(kernel, fp)
    if cached is not None and cached["state"] == "failed":
        return _failed(current, cached["reason"], remembered=True)

    verb = "repairing" if current.action == REPAIR else "installing"
    events.status(f"{kernel}: {verb} {_describe(current)} ({current.reason})", kernel)
    try:
        result = run_steps(current, settings=settings, env=env, pins=pins, state_dir=state_dir,
                           verify_specs=(pins.kernel(kernel),), kernel_env=current.env)
    except InstallError as exc:
        cache.put(kernel, fp, "failed", str(exc))
        return _failed(current, str(exc))
    env_after, _ = snapshot(settings, pins)
    cache.put(kernel, fingerprint(env_after, settings, pins, kernel), "good", f"{verb[:-3]}ed in {result.seconds:.1f} s")
    done = ", ".join(f"{k} {v}" for k, v in sorted(result.installed.items())) or _describe(current)
    events.status(f"{kernel}: {'repaired' if current.action == REPAIR else 'installed'} {done} in "
                  f"{result.seconds:.1f} s with {result.installer}; verified in a child process", kernel)
    if result.restart_advised:
        events.warning(f"this process had already imported {', '.join(result.restart_advised)} before it changed on "
                       "disk; restart it to avoid running mixed versions", kernel)
    return Outcome(kernel, "repaired" if current.action == REPAIR else "installed", current.reason)


# -- helpers -----------------------------------------------------------------------------

def _cache(settings):
    from .state import VerdictCache

    return VerdictCache(settings)


def _module(kernel: str) -> str:
    return {"fla": "fla", "causal-conv1d": "causal_conv1d", "tilelang": "tilelang"}[kernel]


def _describe(decision) -> str:
    if decision.target:
        return " + ".join(f"{k} {v}" for k, v in decision.target.items())
    return ", ".join(r for s in decision.steps for r in s.requirements)


def _target_of(steps) -> dict:
    from packaging.requirements import Requirement

    out = {}
    for step in steps:
        if step.kind in ("kernel", "replace"):
            for raw in step.requirements:
                req = Requirement(raw)
                spec = list(req.specifier)
                if len(spec) == 1 and spec[0].operator == "==":
                    out[req.name] = spec[0].version
    return out


def _hazard_fix(pins, kernel: str) -> str:
    for hz in pins.hazards:
        if hz.kernel == kernel:
            return hz.fix
    return ""


def _note_simulation(env) -> None:
    """A posed accelerator this machine lacks: wrapped gates answer as on the posed machine."""
    kind = None
    if env.gpu_source == "target" and env.accelerator is not None:
        torch = sys.modules.get("torch")
        real = False
        if torch is not None:
            try:
                real = torch.cuda.is_available() if env.accelerator != "xpu" else torch.xpu.is_available()
            except Exception:
                real = False
        if not real:
            kind = "xpu" if env.accelerator == "xpu" else "cuda"
    _simulation["kind"] = kind
