"""ensure(kernel): probe -> plan -> (cache) -> act -> verify -> record, once per process.

The hooks call only this module. It never raises into the caller: every failure
ends as an Outcome that leaves the import on transformers' working torch path,
with one clear line (one process per node, see events.py; every process logs at debug).

Two caches make later starts cheap (`state.VerdictCache`):
- the warm verdict: a kernel found good, under the environment's signature
  (interpreter, installed distributions, FASTPATH_HOOKS_* and GPU facts, all
  read without importing anything heavy). A match answers at once: no settings,
  pins, probe or policy modules are even imported, no subprocess starts.
- per-kernel verdicts under a fingerprint of the probed facts: a verified
  kernel is not verified again; a failed attempt is not retried for
  FASTPATH_HOOKS_RETRY_AFTER seconds.
Installs, repairs and the verification of an installed kernel happen under one
lock per environment, where every per-kernel verdict is written; whoever waited
re-reads the world (and the cache) after acquiring it, so exactly one process
installs - or verifies.
"""

from __future__ import annotations

import _thread
import os
import sys

from . import events
from ._names import MODULE_OF

GOOD = ("ok", "installed", "repaired")
GLOBAL_SKIPS = ("skip.no-accelerator", "skip.no-torch")

_lock = _thread.RLock()
_outcomes: dict = {}
_simulation = {"kind": None}
_facts: dict = {}   # kernel -> {"posed": accelerator kind posed by a target, "env": decision env, "fingerprint"}
_context = {"invalid": None}  # why load_context() fell back to report mode, if it did


class Outcome:
    """What ensure() did for a kernel. (A plain class: this module loads on the first kernel
    import, where typing/dataclasses may not be loaded yet.)"""

    __slots__ = ("kernel", "state", "reason", "block")

    def __init__(self, kernel: str, state: str, reason: str, block: str | None = None):
        self.kernel = kernel
        self.state = state      # ok installed repaired skipped blocked failed reported error
        self.reason = reason
        self.block = block      # when set, `import <kernel>` fails with this message

    def __repr__(self):
        return f"Outcome(kernel={self.kernel!r}, state={self.state!r}, reason={self.reason!r}, block={self.block!r})"


def before_import(kernel: str) -> str | None:
    return ensure(kernel).block


def ensure(kernel: str) -> Outcome:
    with _lock:
        if kernel in _outcomes:
            return _outcomes[kernel]
        try:
            from .act import state

            signature_env = state.signature_environ()
            outcome = _warm(kernel, signature_env)
            if outcome is None:
                outcome = _ensure(kernel)
                _remember_warm(kernel, outcome, signature_env)
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
        _facts.clear()
        _simulation["kind"] = None
        events.forget()


# -- the warm path: a verdict recorded under this environment's signature -------------------

def _warm(kernel: str, signature_env) -> Outcome | None:
    """The recorded good outcome, or None (a miss, or anything odd: the slow path decides)."""
    from .act import state

    try:
        signature = state.environment_signature(signature_env)
        entry = state.VerdictCache.from_environ(signature_env).get_warm(kernel, signature) if signature else None
    except Exception as exc:  # e.g. a deleted working directory: only the shortcut is lost
        events.debug(f"{kernel}: no cached verdict ({type(exc).__name__}: {exc})", kernel)
        return None
    if entry is None:
        return None
    _apply_env(kernel, entry.get("env") or (), entry.get("reason", ""))
    _set_simulation(entry.get("posed"))
    events.debug(f"{kernel}: {entry['reason']} (verdict cached for this environment; nothing probed)", kernel)
    return Outcome(kernel, "ok", entry["reason"])


def _remember_warm(kernel: str, outcome: Outcome, signature_env) -> None:
    """Record a good outcome for the next start - only when the settings and pins were valid
    (a bad variable must be reported at every start, not skipped by a cache hit)."""
    if outcome.state not in GOOD or _context["invalid"] is not None:
        return
    from .act import state

    try:
        signature = state.environment_signature(signature_env)
        if signature is None:
            return
        facts = _facts.get(kernel, {})
        state.VerdictCache.from_environ(signature_env).put_warm(
            kernel, signature, {"reason": outcome.reason, "posed": facts.get("posed"), "fingerprint": facts.get("fingerprint"),
                                "env": [list(pair) for pair in facts.get("env", ())]})
    except Exception as exc:  # the outcome stands; only the shortcut for the next start is lost
        events.debug(f"{kernel}: verdict not cached ({type(exc).__name__}: {exc})", kernel)


# -- context -----------------------------------------------------------------------

def load_context(target: str | None = None, *, strict: bool = False):
    """(settings, pins). Bad settings or pins: report-only mode with every valid variable kept
    (a posed target, a skip list...), so decisions - blocks included - stay right; or raise, strict."""
    from dataclasses import replace

    from .facts.pins import PinsError, load
    from .facts.settings import Settings, SettingsError

    _context["invalid"] = None
    try:
        settings = Settings.from_env()
        if target is not None:
            settings = settings.with_target(target)
    except SettingsError as exc:
        if strict:
            raise
        bad_settings(exc)
        settings = _valid_part(os.environ)
        _context["invalid"] = "a FASTPATH_HOOKS_* variable is invalid (see above)"
    try:
        pins = load(settings.pins_file)
    except PinsError as exc:
        if strict:
            raise
        events.error(f"{exc}. Using the shipped pins in report mode (nothing is installed)", once="pins")
        pins = load(None)
        settings = replace(settings, mode="report", pins_file=None)
        _context["invalid"] = "the pins file is invalid (see above)"
    return settings, pins


def bad_settings(exc) -> None:
    """The one line for invalid FASTPATH_HOOKS_* variables: said by install() or here, once."""
    var, value, why = exc.problems[0]
    more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
    # the value once (a short line), what it means before why: a long reason may be cut at the end
    events.error(f"{var}={value!r} is not valid, so nothing is installed{more}: {value_once(value, why)}",
                 once="settings")


def value_once(value, why: str) -> str:
    """A reason that starts by quoting the value again ("'/x' is not a directory") says "it" instead."""
    quoted = repr(value)
    return "it" + why[len(quoted):] if why.startswith(quoted + " ") else why


def _valid_part(environ):
    """Settings from the variables that are valid on their own, in report mode."""
    from dataclasses import replace

    from .facts.settings import VARIABLES, Settings, SettingsError

    valid = {}
    for name in VARIABLES:
        if name in environ:
            try:
                Settings.from_env({name: environ[name]})
                valid[name] = environ[name]
            except SettingsError:
                pass
    try:
        return replace(Settings.from_env(valid), mode="report")
    except SettingsError:  # valid alone, invalid together (OFFLINE without FIND_LINKS is caught alone)
        return Settings(mode="report")


def fingerprint(env, settings, pins, kernel: str) -> str:
    """The probed facts one kernel's verdict depends on (installing fla leaves tilelang's alone)."""
    import hashlib
    import json

    from ._names import VERSION as __version__

    facts = {
        "fastpath_hooks": __version__,
        "pins": pins.digest,
        "prefix": env.prefix,
        "python": env.python, "implementation": env.implementation, "platform": env.platform, "glibc": env.glibc,
        "torch": env.torch, "cuda": env.torch_cuda, "hip": env.torch_hip, "xpu": env.torch_xpu,
        "abi": env.cxx11_abi, "gpus": list(env.gpus), "triton": env.triton, "triton_dist": env.triton_dist,
        "nvcc": bool(env.nvcc), "nvcc_version": env.nvcc_version, "hipcc": bool(env.hipcc),
        "fla_tilelang": env.fla_tilelang_env,
        # only the cached wheels of this kernel's distributions: another kernel's (or another torch's) new
        # wheel in a shared cache must not make every verdict re-check
        "cached_wheels": hashlib.sha256("\n".join(
            w for w in env.cached_wheels
            if w.split("-", 1)[0].replace("_", "-").lower() in pins.kernel(kernel).distributions).encode()).hexdigest()[:16],
        "transformers": env.version("transformers"), "numpy": env.version("numpy"),
        "dists": {d: env.version(d) for d in verdict_distributions(pins, kernel)},
        "half_installed": list(env.half_installed),
        "settings": [sorted(settings.skip), settings.allow_build, settings.offline, list(settings.find_links),
                     settings.index_url, settings.target, settings.causal_conv1d_wheel_url, settings.mamba_ssm_wheel_url],
        "wheelhouse": hashlib.sha256("\n".join(env.wheelhouse).encode()).hexdigest()[:16],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def verdict_distributions(pins, kernel: str) -> tuple:
    """The distributions a kernel's verdict depends on, from the pins data: its own, its runtime
    dependencies and nvcc wheels, and the distributions of every kernel a hazard makes it need
    (fla on Hopper needs tilelang)."""
    from packaging.requirements import Requirement

    from .facts.distributions import canonical_name

    spec = pins.kernel(kernel)
    names = list(spec.distributions)
    for raw in tuple(spec.runtime_deps) + tuple((spec.nvcc_packages or {}).get("requirements", ())):
        names.append(canonical_name(Requirement(raw).name))
    for hazard in pins.hazards:
        if hazard.kernel == kernel and hazard.needs:
            names += pins.kernel(hazard.needs).distributions
    for partner in spec.with_kernels:   # mamba-ssm is decided with causal-conv1d
        names += pins.kernel(partner).distributions
    return tuple(sorted(set(names)))


def snapshot(settings, pins):
    from .decide.policy import decide
    from .facts.probe import probe

    env = probe(settings, pins=pins)
    return complete(env, decide(env, settings, pins), settings, pins)


def complete(env, plan, settings, pins, **kw):
    """(env, plan), with nvcc's CUDA release asked for (`nvcc --version`) only where a source build
    is being considered and no version.json told it - not at every probe."""
    from .decide.policy import decide
    from .facts.probe import with_nvcc_version

    if any(d.rule.endswith(".nvcc-unknown") for d in plan.decisions.values()):  # causal-conv1d, mamba-ssm
        fuller = with_nvcc_version(env)
        if fuller is not env:
            return fuller, decide(fuller, settings, pins, **kw)
    return env, plan


# -- the decision -----------------------------------------------------------------------

def _ensure(kernel: str) -> Outcome:
    from .decide.plan import BLOCK, OK, SKIP

    settings, pins = load_context()
    if kernel in settings.skip:
        events.debug(f"{kernel}: skipped by FASTPATH_HOOKS_SKIP", kernel)
        return Outcome(kernel, "skipped", "skipped by FASTPATH_HOOKS_SKIP")
    interrupted = _recover_interrupted(kernel, settings)
    if interrupted is not None:
        return interrupted
    env, plan = snapshot(settings, pins)
    _note_simulation(kernel, env)
    decision = plan[kernel]
    _apply_env(kernel, decision.env, decision.reason if decision.action == SKIP else "for this accelerator")

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
    _facts.setdefault(kernel, {})["fingerprint"] = fp  # the warm verdict names it: a new verdict for it drops the warm one
    if decision.action == OK:
        return _ok(decision, settings, pins, env, cache, fp)
    return _act(decision, settings, pins, env, cache, fp)


def _recover_interrupted(kernel: str, settings) -> Outcome | None:
    """An install killed half-way left a journal: roll it back before trusting what is on disk.

    The journal exists while an install runs too; taking the lock waits for that
    install, after which the journal is gone (committed) or its writer is dead.
    """
    from .act.state import JOURNAL, environment_state_dir

    state_dir = environment_state_dir(settings)
    if not os.path.exists(os.path.join(state_dir, JOURNAL)):
        return None
    if settings.mode == "report":
        events.warning(f"an install into this environment was interrupted ({state_dir}); it is not rolled back "
                       f"because {_context['invalid'] or 'FASTPATH_HOOKS_MODE=report'}", kernel,
                       once="interrupted-report")
        return None
    from .act.installer import recover

    try:
        with _EnvironmentLock(settings, kernel):
            recover(state_dir)
    except _LockUnavailable as exc:
        events.error(f"{kernel}: {exc}; leaving it as it is", kernel, once=f"fail-{kernel}")
        return Outcome(kernel, "failed", str(exc))
    return None


def _apply_env(kernel: str, pairs, why: str) -> None:
    _facts.setdefault(kernel, {})["env"] = tuple(tuple(p) for p in pairs)
    for name, value in pairs:
        if name not in os.environ:
            os.environ[name] = value
            events.status(f"set {name}={value} ({why})", kernel, human=False)


def _skipped(decision, plan) -> Outcome:
    if decision.rule in GLOBAL_SKIPS:
        kernels = ", ".join(plan.decisions)
        why = plan.notes[0] if plan.notes else decision.reason
        events.emit("status", f"{why}; nothing to install, transformers keeps its torch path ({kernels})",
                    decision.kernel, once="global-skip", persist=f"{decision.rule}:{why}")
    else:
        tail = f" ({decision.fix})" if decision.fix else ""
        kind = "warning" if decision.rule.startswith(("fla.hazard", "tilelang.no-nvcc", "causal.no-wheel", "mamba.no-wheel")) \
            else "status"
        events.emit(kind, f"{decision.kernel}: not installed - {decision.reason}{tail}", decision.kernel,
                    once=f"skip-{decision.kernel}", persist=f"{decision.rule}:{decision.reason}")
    return Outcome(decision.kernel, "skipped", decision.reason)


def _blocked(decision, reason: str, fix: str) -> Outcome:
    message = (f"fastpath-hooks blocked `import {MODULE_OF[decision.kernel]}`: {reason}; "
               f"using transformers' torch path." + (f" Fix: {fix}." if fix else ""))
    events.warning(f"{decision.kernel}: blocked - {reason}" + (f" (fix: {fix})" if fix else ""), decision.kernel,
                   once=f"block-{decision.kernel}")
    return Outcome(decision.kernel, "blocked", reason, block=message)


def _failed(decision, reason: str, remembered: dict | None = None, settings=None) -> Outcome:
    """remembered: the cached verdict of an earlier failed attempt (not retried until it expires)."""
    if remembered is not None:
        reason = remembered["reason"]
    if decision.on_failure == "block":
        return _blocked(decision, reason, decision.fix or "")
    persist = None
    if remembered is not None:
        retry = _retry_in(remembered, settings)
        message = f"{decision.kernel}: failed, retry in {retry} (FASTPATH_HOOKS_RETRY_AFTER): {reason}"
        # said once per failure: it would repeat at every start until FASTPATH_HOOKS_RETRY_AFTER expires
        persist = f"{decision.rule}:failed:{remembered.get('ts')}"
    else:
        message = f"{decision.kernel}: could not {decision.action} - {reason}"   # the torch path stays
    events.error(message, decision.kernel, once=f"fail-{decision.kernel}", persist=persist)
    return Outcome(decision.kernel, "failed", reason)


def _retry_in(entry: dict, settings) -> str:
    import time

    left = max(0.0, float(entry.get("ts", 0)) + (settings.retry_after if settings else 0) - time.time())
    return f"{left / 60:.0f} min" if left >= 120 else f"{left:.0f} s"


def _ok(decision, settings, pins, env, cache, fp) -> Outcome:
    """An installed kernel: verified once (in a child process) per fingerprint, by one process.

    The verification runs under the environment lock after the cache is read again, so
    ranks started together verify once and the others read that verdict."""
    if not decision.verify:
        events.debug(f"{decision.kernel}: {decision.reason}", decision.kernel)
        return Outcome(decision.kernel, "ok", decision.reason)
    known = _known(decision, settings, cache, fp)
    if known is not None:
        return known
    if settings.mode == "report":  # report mode takes no lock; a verdict is all it writes
        return _verify(decision, settings, pins, env, cache, fp)
    try:
        with _EnvironmentLock(settings, decision.kernel):
            return _act_locked(decision, settings, pins, cache, None)
    except _LockUnavailable as exc:  # verifying unlocked is what the lock only saves repeating
        events.debug(f"{decision.kernel}: {exc}; verifying without it", decision.kernel)
        return _verify(decision, settings, pins, env, cache, fp)


def _known(decision, settings, cache, fp) -> Outcome | None:
    """The cached verdict of an installed kernel: good, or a failure remembered for
    FASTPATH_HOOKS_RETRY_AFTER (not verified again, whatever repair the plan offers)."""
    cached = cache.get(decision.kernel, fp)
    if cached is None:
        return None
    if cached["state"] == "good":
        events.debug(f"{decision.kernel}: verified earlier ({cached['reason']})", decision.kernel)
        return Outcome(decision.kernel, "ok", decision.reason)
    return _failed(decision, cached["reason"], remembered=cached, settings=settings)


def _verify(decision, settings, pins, env, cache, fp, locked: bool = False) -> Outcome:
    from dataclasses import replace

    from .decide.plan import REPAIR
    from .act.verify import verify

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
        if locked:
            return _act_locked(repair, settings, pins, cache, repair)
        return _act(repair, settings, pins, env, cache, fp, replanned=repair)
    cache.put(decision.kernel, fp, "failed", result.detail)
    return _failed(decision, result.detail)


def _act(decision, settings, pins, env, cache, fp, replanned=None) -> Outcome:
    kernel = decision.kernel
    if settings.mode == "report":
        why = _context["invalid"] or "FASTPATH_HOOKS_MODE=report"
        events.warning(f"{kernel}: would {decision.action} {_describe(decision)}; nothing is installed: {why}",
                       kernel, once=f"report-{kernel}", persist=f"{decision.rule}:report:{why}:{decision.reason}")
        if decision.on_failure == "block" and decision.installed:
            return _blocked(decision, decision.reason + " (report mode: not repaired)", decision.fix)
        return Outcome(kernel, "reported", decision.reason)
    cached = cache.get(kernel, fp)
    if cached is not None and cached["state"] == "failed":
        return _failed(decision, cached["reason"], remembered=cached, settings=settings)
    try:
        with _EnvironmentLock(settings, kernel):
            return _act_locked(decision, settings, pins, cache, replanned)
    except _LockUnavailable as exc:
        return _failed(decision, str(exc))


def _act_locked(decision, settings, pins, cache, replanned) -> Outcome:
    """Under the environment lock: re-read the world, then verify, install or repair - or take
    what another process did while this one waited. Every verdict is written here."""
    from .decide.commands import installer_choice
    from .act.installer import InstallError, recover, run_steps
    from .decide.plan import BLOCK, OK, REPAIR, SKIP
    from .act.state import environment_state_dir

    kernel = decision.kernel
    state_dir = environment_state_dir(settings)
    recover(state_dir)
    # Re-read the world: another process may have done this while we waited.
    env, plan = snapshot(settings, pins)
    current = plan[kernel] if replanned is None else replanned
    fp = fingerprint(env, settings, pins, kernel)
    if replanned is None and current.action == OK:
        known = None if current.verify else Outcome(kernel, "ok", current.reason)
        if known is None:
            known = _known(current, settings, cache, fp)
        if known is None:
            return _verify(current, settings, pins, env, cache, fp, locked=True)
        if known.state == "ok" and decision.action != OK:  # this process was about to install it
            events.status(f"{kernel}: ready - done by another process while this one waited: {current.reason}",
                          kernel, once=f"done-{kernel}")
        return known
    if replanned is None and current.action in (SKIP, BLOCK):
        return _skipped(current, plan) if current.action == SKIP else _blocked(current, current.reason, current.fix)
    cached = cache.get(kernel, fp)
    if cached is not None and cached["state"] == "failed":
        # another process failed while we waited: its verdict, not a second attempt
        return _failed(current, cached["reason"], remembered=cached, settings=settings)

    installer, why = installer_choice(settings, env)
    if installer is None:  # not remembered as a failed attempt: fixing it takes effect at the next start
        events.warning(f"{kernel}: not installed - {why}", kernel, once=f"fail-{kernel}",
                       persist=f"{current.rule}:no-installer:{why}")
        return Outcome(kernel, "failed", why)
    verb = "repairing" if current.action == REPAIR else "installing"
    events.status(f"{kernel}: {verb} {_describe(current)} ({current.reason})", kernel)
    try:
        result = run_steps(current, settings=settings, env=env, pins=pins, state_dir=state_dir,
                           verify_specs=(pins.kernel(kernel),), kernel_env=current.env)
    except InstallError as exc:
        cache.put(kernel, fp, "failed", str(exc))
        return _failed(current, str(exc))
    env_after, _ = snapshot(settings, pins)
    fp_after = fingerprint(env_after, settings, pins, kernel)
    cache.put(kernel, fp_after, "good", f"{verb[:-3]}ed in {result.seconds:.1f} s")
    _facts.setdefault(kernel, {})["fingerprint"] = fp_after  # the warm verdict is earned under what is there now
    done = ", ".join(f"{k} {v}" for k, v in sorted(result.installed.items())) or _describe(current)
    events.status(f"{kernel}: {'repaired' if current.action == REPAIR else 'installed'} {done} in "
                  f"{result.seconds:.1f} s with {result.installer}; verified in a child process", kernel)
    if result.restart_advised:
        events.warning(f"this process had already imported {', '.join(result.restart_advised)} before it changed on "
                       "disk; restart it to avoid running mixed versions", kernel)
    return Outcome(kernel, "repaired" if current.action == REPAIR else "installed", current.reason)


# -- the environment lock -----------------------------------------------------------------

class _LockUnavailable(Exception):
    """The install lock could not be created or was held too long by another process."""


class _EnvironmentLock:
    """Hold the environment's install lock; say so once when another process holds it."""

    def __init__(self, settings, kernel: str):
        self.settings, self.kernel, self.lock = settings, kernel, None

    def __enter__(self):
        import filelock

        from .act.state import environment_lock

        settings = self.settings
        try:
            lock = environment_lock(settings)
        except OSError as exc:
            raise _LockUnavailable(f"cannot create the install lock: {exc}") from None
        try:
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                events.status(f"{self.kernel}: waiting for another process that is installing or checking kernels "
                              f"(at most {settings.lock_timeout:.0f} s, FASTPATH_HOOKS_LOCK_TIMEOUT)",
                              self.kernel,
                              once=f"wait-{self.kernel}")
                lock.acquire()
        except filelock.Timeout:
            raise _LockUnavailable(f"another process held the install lock for {settings.lock_timeout:.0f} s "
                                   "(FASTPATH_HOOKS_LOCK_TIMEOUT)") from None
        except OSError as exc:
            raise _LockUnavailable(f"cannot take the install lock {lock.lock_file}: {exc}") from None
        self.lock = lock
        return self

    def __exit__(self, *exc_info):
        self.lock.release()
        return False


# -- helpers -----------------------------------------------------------------------------

def _cache(settings):
    from .act.state import VerdictCache

    return VerdictCache(settings)


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


def _note_simulation(kernel: str, env) -> None:
    """A posed accelerator this machine lacks: wrapped gates answer as on the posed machine."""
    posed = None
    if env.gpu_source == "target" and env.accelerator is not None:
        posed = "xpu" if env.accelerator == "xpu" else "cuda"
    _facts.setdefault(kernel, {})["posed"] = posed
    _set_simulation(posed)


def _set_simulation(posed: str | None) -> None:
    kind = None
    if posed is not None:
        torch = sys.modules.get("torch")
        real = False
        if torch is not None:
            try:
                real = torch.xpu.is_available() if posed == "xpu" else torch.cuda.is_available()
            except Exception:
                real = False
        if not real:
            kind = posed
    _simulation["kind"] = kind
