"""The guarded installer: run a decision's steps, check, verify, or roll back.

Protections, in order: the environment lock is held by the caller; an
interrupted earlier install is rolled back first; only allow-listed
distributions are named; protected distributions are pinned by a constraints
file and checked unchanged afterwards; every step has a timeout and a heartbeat;
resolved versions are checked (a range dependency can pull a broken one back);
the kernel is imported in a child process; any failure restores exactly what
was there before.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.version import Version

from . import events
from .commands import choose_installer, constraints, invocation
from .distributions import canonical_name, installed_versions, scan, site_packages
from .transaction import Transaction

HEARTBEAT_SECONDS = 30.0


class InstallError(Exception):
    """An install step, a check or the verification failed; the environment was restored."""


@dataclass(frozen=True)
class InstallResult:
    kernel: str
    installed: dict          # dist -> version now present that was not before (or changed)
    seconds: float
    installer: str
    restart_advised: tuple   # modules imported before their distribution changed


def step_names(steps) -> set:
    names = set()
    for step in steps:
        if step.kind == "wheel":
            names.add("causal-conv1d")
            continue
        for raw in step.requirements:
            names.add(canonical_name(Requirement(raw).name))
    return names


def check_allowed(steps, pins) -> None:
    bad = sorted(n for n in step_names(steps) if n not in pins.allowed)
    if bad:
        raise InstallError(f"refusing to install {', '.join(bad)}: not on the pins' allow-list")
    protected = sorted(n for n in step_names(steps) if n in pins.protected and n != "numpy")
    if protected:
        raise InstallError(f"refusing to install {', '.join(protected)}: protected (never changed by fastpath-hooks)")


def recover(state_dir: str) -> list:
    """Roll back an interrupted install found in `state_dir` (call with the lock held)."""
    tx = Transaction.pending(state_dir)
    if tx is None:
        return []
    events.warning(f"an earlier install was interrupted ({tx.description or tx.id}); restoring the state before it")
    done = tx.rollback()
    events.status("recovered: " + ("; ".join(done) if done else "nothing to restore"))
    return done


def run_steps(decision, *, settings, env, pins, state_dir: str, verify_specs=(), kernel_env=()) -> InstallResult:
    """Execute `decision.steps` in one transaction; verify; roll back on any failure."""
    from .verify import verify

    check_allowed(decision.steps, pins)
    site = site_packages()
    if not os.access(site, os.W_OK):
        raise InstallError(f"{site} is not writable: install the kernels as the environment's owner "
                           f"(`fastpath-hooks install`) or set FASTPATH_HOOKS_SKIP")
    installer = choose_installer(settings, env)
    real_before = installed_versions()
    protected_before = {n: real_before.get(n) for n in pins.protected}
    names = step_names(decision.steps)
    tx = Transaction(state_dir, site, names, description=f"{decision.action} {decision.kernel}: {decision.reason}")
    start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="fastpath-hooks-")
    try:
        cfile = os.path.join(tmp, "constraints.txt")
        with open(cfile, "w", encoding="utf-8") as fh:
            fh.write("\n".join(constraints(real_before, pins.protected)) + "\n")
        tx.begin()
        try:
            for step in decision.steps:
                local = _fetch_wheel(step, settings, tmp) if step.kind == "wheel" else None
                installer = _run_step(step, installer=installer, settings=settings, env=env, cfile=cfile,
                                      local=local, kernel=decision.kernel)
            after = installed_versions()
            _check_result(decision, after, protected_before, real_before, pins, env)
            for spec in verify_specs:
                result = verify(spec, timeout=settings.timeout, env_extra=kernel_env)
                if not result.ok:
                    raise InstallError(f"verification failed: {result.detail}")
                events.status(f"verified {spec.name}: {result.detail}", decision.kernel, human=False)
        except BaseException as exc:
            done = tx.rollback()
            detail = str(exc) if isinstance(exc, InstallError) else f"{type(exc).__name__}: {exc}"
            events.status("rolled back: " + ("; ".join(done) if done else "nothing had changed"), decision.kernel)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise InstallError(detail) from None
        tx.commit()
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    import importlib

    importlib.invalidate_caches()
    changed = {n: v for n, v in installed_versions().items() if real_before.get(n) != v}
    return InstallResult(decision.kernel, changed, time.monotonic() - start, installer, _restart_advised(changed))


def _check_result(decision, after: dict, protected_before: dict, before: dict, pins, env) -> None:
    for name, version in protected_before.items():
        if after.get(name) != version:
            raise InstallError(f"the installer changed protected {name} ({version} -> {after.get(name)})")
    for name, version in decision.target.items():
        have = after.get(canonical_name(name))
        if have is None or Version(have.split("+")[0]) != Version(version.split("+")[0]):
            raise InstallError(f"{name} resolved to {have}, not the pinned {version}")
    tl, ffi = after.get("tilelang"), after.get("apache-tvm-ffi")
    if tl and ffi and "tilelang" in decision.target:
        broken = pins.broken_for(tl, ffi, env.gpus)
        if broken is not None:
            raise InstallError(f"resolved to tilelang {tl} + apache-tvm-ffi {ffi}, a broken pair ({broken.effect})")
    strangers = sorted(n for n, v in after.items() if before.get(n) != v and n not in pins.allowed)
    if strangers:
        raise InstallError(f"the installer changed {', '.join(strangers)}, which is not on the allow-list")


def _fetch_wheel(step, settings, tmp: str) -> str:
    filename = step.requirements[0]
    for location in settings.find_links:
        path = location[len("file://"):] if location.startswith("file://") else location
        candidate = os.path.join(path, filename)
        if "://" not in path and os.path.isfile(candidate):
            _check_sha(candidate, step.sha256)
            return candidate
    if settings.offline or not step.url:
        raise InstallError(f"{filename} is not in FASTPATH_HOOKS_FIND_LINKS and the network is off")
    target = os.path.join(tmp, filename)
    events.status(f"downloading {step.url}")
    try:
        with urllib.request.urlopen(step.url, timeout=min(settings.timeout, 120)) as resp, open(target, "wb") as out:
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
    except OSError as exc:
        raise InstallError(f"could not download {step.url}: {exc}") from None
    _check_sha(target, step.sha256)
    return target


def _check_sha(path: str, expected: str | None) -> None:
    if not expected:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise InstallError(f"{os.path.basename(path)}: sha256 {digest.hexdigest()} does not match the pinned {expected}")


def _run_step(step, *, installer, settings, env, cfile, local, kernel) -> str:
    """Run one step; in auto mode a failing uv step is retried with pip. Returns the installer used."""
    inv = invocation(step, installer=installer, settings=settings, uv=env.uv if env.uv != "posed" else None,
                     constraints_file=cfile, local_file=local)
    code, tail, seconds = _execute(inv, settings.timeout, kernel, _step_label(step))
    if code == 0:
        events.status(f"{_step_label(step)}: done in {seconds:.1f} s ({installer})", kernel, human=False)
        return installer
    if code is None:
        raise InstallError(f"{_step_label(step)} did not finish within {settings.timeout:.0f} s (FASTPATH_HOOKS_TIMEOUT)")
    if installer == "uv" and settings.installer == "auto":
        events.status(f"uv failed ({tail}); retrying with pip", kernel)
        return _run_step(step, installer="pip", settings=settings, env=env, cfile=cfile, local=local, kernel=kernel)
    raise InstallError(f"{_step_label(step)} failed ({installer} exit {code}): {tail}")


def _step_label(step) -> str:
    return f"{step.kind} {' '.join(step.requirements)}"


def _execute(inv, timeout: float, kernel, label: str):
    """(exit code or None on timeout, output tail, seconds). Heartbeat every 30 s."""
    environ = dict(os.environ)
    environ.update(dict(inv.env))
    environ["FASTPATH_HOOKS_DISABLE"] = "1"
    environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    start = time.monotonic()
    with tempfile.TemporaryFile(mode="w+b") as out:
        try:
            proc = subprocess.Popen(list(inv.argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=environ, start_new_session=True, preexec_fn=_death_signal())
        except OSError as exc:
            return 127, f"could not start {inv.argv[0]}: {exc}", 0.0
        events.debug("running: " + " ".join(inv.argv), kernel)
        deadline = start + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill(proc)
                code = None
                break
            try:
                code = proc.wait(timeout=min(HEARTBEAT_SECONDS, remaining))
                break
            except subprocess.TimeoutExpired:
                events.status(f"still running {label} ({time.monotonic() - start:.0f} s)", kernel, heartbeat=True)
        out.seek(0)
        text = out.read().decode("utf-8", errors="replace")
    return code, _summary(text), time.monotonic() - start


def _summary(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith(("error", "×", "x ", "  ×")) or "error:" in ln.lower()]
    chosen = (errors or lines)[-3:]
    return " | ".join(chosen)[-600:]


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.wait()


def _death_signal():
    """Linux: make the installer die with us (PR_SET_PDEATHSIG), so a killed process never
    leaves pip writing behind the next lock holder. Resolved before fork: the child only
    makes one C call (no imports, no locks)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_death_signal():
        prctl(1, signal.SIGKILL)

    return set_death_signal


def _restart_advised(changed: dict) -> tuple:
    """Modules already imported in this process whose distribution just changed."""
    found, _ = scan()
    out = []
    for name in changed:
        dist = found.get(name)
        if dist is None:
            continue
        tops = set()
        try:
            with open(os.path.join(dist.path, "top_level.txt"), encoding="utf-8") as fh:
                tops.update(line.strip() for line in fh if line.strip())
        except OSError:
            from .distributions import record_files

            for path in record_files(dist):
                rel = os.path.relpath(path, dist.site)
                if not rel.startswith("..") and not rel.endswith((".dist-info", ".pth")):
                    top = rel.split(os.sep, 1)[0]
                    if not top.endswith(".dist-info"):
                        tops.add(top[:-3] if top.endswith(".py") else top)
        out.extend(t for t in sorted(tops) if t in sys.modules)
    return tuple(out)
