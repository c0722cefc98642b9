"""The one way fastpath-hooks runs a tool (pip, uv, a build): its own session and process group,
the whole group killed on a timeout or an exception (Ctrl-C), output captured, a heartbeat."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from .. import events

HEARTBEAT_SECONDS = 30.0


def execute(inv, timeout: float, kernel, label: str, *, work: str | None = None, extra_env=(), log: str | None = None):
    """(exit code or None on timeout, output tail, seconds). Heartbeat every 30 s. `log`: append
    the whole output to that file (kept), instead of a temporary one.

    Any exception while the installer runs (Ctrl-C: the installer is in its own session, so the
    terminal's SIGINT never reaches it) kills its process group before it propagates: the
    rollback that follows must have no writer left."""
    environ = dict(os.environ)
    environ.update(dict(inv.env))
    environ.update(dict(extra_env))
    environ["FASTPATH_HOOKS_DISABLE"] = "1"
    environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    start = time.monotonic()
    with (open(log, "a+b") if log else tempfile.TemporaryFile(mode="w+b", dir=work)) as out:
        try:
            proc = subprocess.Popen(list(inv.argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=environ, start_new_session=True, preexec_fn=_death_signal())
        except OSError as exc:
            return 127, f"could not start {inv.argv[0]}: {exc}", 0.0
        try:
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
                    events.status(f"still {label} ({time.monotonic() - start:.0f} s)", kernel, heartbeat=True)
        except BaseException:
            _kill(proc)
            raise
        out.seek(0)
        text = out.read().decode("utf-8", errors="replace")
        if log:
            out.write(f"\n# exit: {'timeout' if code is None else code} after {time.monotonic() - start:.1f} s\n".encode())
    return code, _summary(text), time.monotonic() - start


def _summary(text: str) -> str:
    """The installer's error and the lines that explain it (uv puts the cause on the lines after
    `error:`), else its last lines."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = next((i for i, ln in enumerate(lines)
                  if ln.lower().startswith(("error", "×", "x ")) or "error:" in ln.lower()), None)
    chosen = lines[first:first + 4] if first is not None else lines[-3:]
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


