"""The one way to run a child process: its own session, the whole group killed on a timeout or any exception.

No `preexec_fn` (unsafe in a threaded parent), so no PR_SET_PDEATHSIG: the caller journals the child's group
(`started=`) while the child waits at a gate (`sh` reading a line; it exits unrun if the parent died first), and a
recovery kills a living group (`kill_group`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

from .. import events
from ..facts.host import boot_id, group_members, process_stat

HEARTBEAT_SECONDS = 30.0
TAIL_BYTES = 64 * 1024        # the output a result keeps (a verification's marker line is its last)
GATE_CLOSED = 125   # the exit status of a command whose parent never said "go" (it died first)
GATE = f'IFS= read -r _ || exit {GATE_CLOSED}; exec "$@"'   # run the command only once the parent said "go"


@dataclass(frozen=True)
class Ran:
    """`code`: the exit status (negative: that signal), None past the timeout; `output`: its last TAIL_BYTES."""
    code: int | None
    output: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.code is None

    @property
    def ok(self) -> bool:
        return self.code == 0

    @property
    def tail(self) -> str:
        return summary(self.output)


def child_environ(extra=(), drop=()) -> dict:
    """This process's environment with fastpath-hooks off (no hooks, no recursion), pip quiet, `extra` on top."""
    environ = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", **{k: v for k, v in os.environ.items() if k not in drop}}
    return {**environ, "FASTPATH_HOOKS_DISABLE": "1", **dict(extra)}


def run(argv, *, timeout: float, environ: dict | None = None, kernel=None, label: str = "", work: str | None = None,
        log: str | None = None, started=None, heartbeat: float = HEARTBEAT_SECONDS,
        expected: float | None = None) -> Ran:
    """Run `argv`; its whole group is killed past `timeout`, when the command exits, or before any exception
    (Ctrl-C: the child's session gets none) propagates - a rollback that follows has no writer left. `label`:
    said every `heartbeat` s; `log`: the whole output kept there; `started(pgid)` before the command runs
    (its exception kills the group) and `started(None)` once the group is gone."""
    argv = [str(a) for a in argv]
    environ = child_environ() if environ is None else environ
    gated = started is not None
    command = ["/bin/sh", "-c", GATE, "fastpath-hooks-gate", *argv] if gated else argv
    start = time.monotonic()
    with (open(log, "a+b") if log else tempfile.TemporaryFile(mode="w+b", dir=work)) as out:
        offset = out.seek(0, os.SEEK_END)
        deferred = _defer_ctrl_c()
        try:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.PIPE if gated else subprocess.DEVNULL,
                                    env=environ, start_new_session=True)
        except OSError as exc:
            _resume_ctrl_c(deferred)
            return Ran(127, f"could not start {argv[0]}: {exc}", 0.0)
        try:
            _resume_ctrl_c(deferred)   # a Ctrl-C while Popen started the child is raised here: the group dies
            events.debug("running: " + " ".join(argv), kernel)
            if gated:
                started(proc.pid)
                proc.stdin.write(b"go\n")
                proc.stdin.close()
            code = None
            while (remaining := start + timeout - time.monotonic()) > 0:
                try:
                    code = proc.wait(timeout=min(heartbeat, remaining))
                    break
                except subprocess.TimeoutExpired:
                    if label:
                        events.status(f"still {label} ({_elapsed(time.monotonic() - start, expected)})", kernel,
                                      heartbeat=True)
            else:   # past its timeout
                _kill(proc)
        except BaseException:
            _kill(proc)
            if gated:
                with contextlib.suppress(Exception):   # the exception that stopped the run is the one to report
                    started(None)
            raise
        if code is not None:
            _kill_group(proc.pid)  # nothing of the tool outlives its run
        if gated:
            started(None)
        seconds = time.monotonic() - start
        size = out.seek(0, os.SEEK_END)
        out.seek(max(offset, size - TAIL_BYTES))
        text = out.read().decode("utf-8", errors="replace")
        if log:
            out.write(f"\n# exit: {'timeout' if code is None else code} after {seconds:.1f} s\n".encode())
    return Ran(code, text, seconds)


def _defer_ctrl_c():
    """Hold SIGINT while Popen starts the child: a KeyboardInterrupt inside Popen, after the fork, leaves a
    child we hold no handle of (seen under load). Handlers run in the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return None
    pending = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    except (ValueError, OSError, TypeError):
        return None
    return previous, pending


def _resume_ctrl_c(deferred) -> None:
    """The handler back; a Ctrl-C that came meanwhile is delivered now."""
    if deferred is None:
        return
    previous, pending = deferred
    signal.signal(signal.SIGINT, previous)
    if pending:
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)


def _elapsed(seconds: float, expected: float | None) -> str:
    """`95 s`, or `95 s of about 270 s expected` (`over the 270 s expected` once past it)."""
    if not expected:
        return f"{seconds:.0f} s"
    if seconds <= expected:
        return f"{seconds:.0f} s of about {expected:.0f} s expected"
    return f"{seconds:.0f} s, over the {expected:.0f} s expected"


def execute(inv, timeout: float, kernel, label: str, *, work: str | None = None, extra_env=(), log: str | None = None,
            started=None, expected: float | None = None) -> Ran:
    return run(inv.argv, timeout=timeout, environ=child_environ(tuple(inv.env) + tuple(extra_env)), kernel=kernel,
               label=label, work=work, log=log, started=started, expected=expected)


def summary(text: str) -> str:
    """A tool's error and the lines after it (uv's cause), else its last lines."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = next((i for i, ln in enumerate(lines)
                  if ln.lower().startswith(("error", "×", "x ")) or "error:" in ln.lower()), None)
    chosen = lines[first:first + 4] if first is not None else lines[-3:]
    return " | ".join(chosen)[-600:]


def ended(ran: Ran, what: str, timeout: float, output: str | None = None) -> str:
    """Why a child gave no answer: past its timeout, killed by a signal or its exit code, with its last lines."""
    rows = [r for r in (ran.output if output is None else output).strip().splitlines() if r.strip()]
    tail = " | ".join(rows[-3:])[-400:]
    if ran.timed_out:
        return f"{what} did not finish within {timeout:.0f} s"
    if ran.code is not None and ran.code < 0:
        try:
            name = signal.Signals(-ran.code).name
        except ValueError:
            name = f"signal {-ran.code}"
        return f"{what} killed the process ({name})" + (f": {tail}" if tail else "")
    return f"{what} exited with code {ran.code}: {tail or 'no output'}"


def _kill(proc) -> None:
    """SIGKILL the child's whole group, wait (seconds at most) until no member runs, reap the child."""
    if not _kill_group(proc.pid):
        proc.kill()
    proc.wait()


def _kill_group(pgid: int) -> bool:
    """False when no member was left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        return False
    deadline = time.monotonic() + 10.0
    while group_members(pgid) and time.monotonic() < deadline:   # zombies are not members
        time.sleep(0.01)
    return True


def group_record(pgid: int) -> dict:
    """What identifies the group later, in another process: its leader's start time and the boot (a pid is
    reused; a group's number is not while any member lives)."""
    stat = process_stat(pgid)
    return {"pgid": pgid, "start": stat[2] if stat else None, "boot": boot_id()}


def kill_group(record) -> int:
    """Kill what is left of a recorded group, only where provably the same (same boot; its leader the recorded
    process, or gone with members left); the number of processes still running."""
    pgid = record.get("pgid") if isinstance(record, dict) else None
    if not isinstance(pgid, int) or pgid <= 1 or record.get("boot") != boot_id():
        return 0
    members, leader = group_members(pgid), process_stat(pgid)
    if not members or (leader is not None and leader[1] == pgid and leader[2] != record.get("start")):
        return 0   # gone, or the number leads a new group now
    return len(members) if _kill_group(pgid) else 0
