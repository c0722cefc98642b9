"""The one child-process runner (act/runner.py), with real processes: its own session, the whole
group killed on a timeout and on Ctrl-C (grandchildren included), a thread-heavy parent, the
start gate and the recorded group that recovery kills.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fastpath_hooks import events
from fastpath_hooks.act import runner
from support.processes import running

# A child that starts a grandchild in its group, writes both pids, then waits for a long time.
FAMILY = 'sleep 300 & echo "$$ $!" > "$1"; echo started; wait'



def _gone(*pids, within: float = 10.0) -> bool:
    """All dead within a moment: a SIGKILLed process takes a little while to be torn down (longer on a
    loaded machine), so the check waits for what it asserts rather than sampling once."""
    deadline = time.monotonic() + within
    while any(running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _pids(path) -> list:
    deadline = time.monotonic() + 30
    while not (os.path.exists(path) and open(path).read().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return [int(p) for p in open(path).read().split()]


def test_result_output_and_own_session(tmp_path):
    code = "import os, sys; print('sid', os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid()); " \
           "print('error: it broke', file=sys.stderr); sys.exit(3)"
    ran = runner.run([sys.executable, "-c", code], timeout=60, work=str(tmp_path))
    assert ran.code == 3 and not ran.ok and not ran.timed_out
    assert "sid True True" in ran.output          # a session and a group of its own
    assert ran.tail == "error: it broke"           # stderr with stdout, the error chosen
    assert os.listdir(tmp_path) == []              # the temporary output file is gone


def test_the_child_has_hooks_off_and_the_extra_environment(tmp_path):
    environ = runner.child_environ((("MARK_X", "7"),), drop=("HOME",))
    ran = runner.run([sys.executable, "-c", "import os; print(os.environ.get('FASTPATH_HOOKS_DISABLE'), "
                      "os.environ.get('MARK_X'), 'HOME' in os.environ)"], timeout=60, environ=environ)
    assert ran.ok and ran.output.split() == ["1", "7", "False"]


def test_a_timeout_kills_the_whole_group_grandchildren_too(tmp_path):
    pids = tmp_path / "pids"
    start = time.monotonic()
    ran = runner.run(["/bin/sh", "-c", FAMILY, "sh", str(pids)], timeout=2)
    assert ran.timed_out and ran.code is None and "started" in ran.output
    assert time.monotonic() - start < 30
    child, grandchild = _pids(pids)
    assert _gone(child, grandchild)


def test_members_left_behind_by_a_finished_command_are_killed(tmp_path):
    pids = tmp_path / "pids"
    ran = runner.run(["/bin/sh", "-c", 'sleep 300 & echo "$$ $!" > "$1"', "sh", str(pids)], timeout=60)
    assert ran.ok
    _child, grandchild = _pids(pids)
    assert _gone(grandchild)


def test_the_kept_log_gets_the_whole_output_and_the_result_only_this_run(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("# header\n")
    ran = runner.run([sys.executable, "-c", "print('x' * 100); print('last')"], timeout=60, log=str(log))
    assert ran.ok and "# header" not in ran.output and ran.output.strip().endswith("last")
    text = log.read_text()
    assert text.startswith("# header\n" + "x" * 100) and "# exit: 0 after" in text


def test_a_command_that_cannot_start_is_exit_127():
    ran = runner.run(["/nonexistent/tool", "--version"], timeout=10)
    assert ran.code == 127 and "could not start /nonexistent/tool" in ran.output


def test_heartbeat_while_it_runs():
    seen = []
    events.add_listener(seen.append)
    try:
        ran = runner.run([sys.executable, "-c", "import time; time.sleep(1.0)"], timeout=60, label="testing it",
                         heartbeat=0.2)
    finally:
        events.clear_listeners()
    beats = [e["message"] for e in seen if e.get("heartbeat")]
    assert ran.ok and beats and all(m.startswith("still testing it (") for m in beats)


# -- Ctrl-C and a thread-heavy parent: in a real parent process --------------------------------

CTRL_C = textwrap.dedent(r'''
    import os, signal, sys, threading, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    from fastpath_hooks.act import runner
    pids = sys.argv[1]
    def press_ctrl_c():
        while not (os.path.exists(pids) and open(pids).read().strip()):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=press_ctrl_c, daemon=True).start()
    try:
        runner.run(["/bin/sh", "-c", sys.argv[2], "sh", pids], timeout=300)
        print("finished")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    sys.stdin.readline()   # the parent lives on (a notebook), its child group must not
''')


def test_ctrl_c_in_the_parent_kills_the_whole_group(tmp_path):
    pids = tmp_path / "pids"
    parent = subprocess.Popen([sys.executable, "-c", CTRL_C, str(pids), FAMILY], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "interrupted"
        child, grandchild = _pids(pids)
        assert _gone(child, grandchild)
        assert parent.poll() is None
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)


THREADED = textwrap.dedent(r'''
    import logging, os, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from fastpath_hooks.act import runner
    stop = threading.Event()
    lock = threading.Lock()
    log = logging.getLogger("busy")
    def busy():   # threads that hold locks and allocate while others fork (a data loader, a logger)
        while not stop.is_set():
            with lock:
                log.debug("x" * 100)
                [bytearray(4096) for _ in range(50)]
    workers = [threading.Thread(target=busy, daemon=True) for _ in range(24)]
    for t in workers:
        t.start()
    code = "import os; print(os.getpid(), os.getpgid(0), os.getsid(0))"
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: runner.run([sys.executable, "-c", code], timeout=120), range(24)))
    stop.set()
    ok = [r for r in results if r.ok and len(set(r.output.split())) == 1]
    print(len(ok), len({r.output for r in ok}))
''')


def test_a_thread_heavy_parent_runs_children_safely():
    proc = subprocess.run([sys.executable, "-c", THREADED], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["24", "24"]  # every child ran, each the leader of its own session


# -- the start gate and a group recorded by a process that died ----------------------------------

def test_started_is_called_with_the_group_before_the_command_runs(tmp_path):
    marker = tmp_path / "ran"
    calls = []

    def started(pgid):
        calls.append(pgid)
        if pgid is not None:
            time.sleep(0.3)
            assert not marker.exists()               # the command waits at the gate
            assert os.getpgid(pgid) == pgid           # the group exists already

    ran = runner.run(["/bin/sh", "-c", 'echo "$$" > "$1"', "sh", str(marker)], timeout=60, started=started)
    assert ran.ok and calls[0] == int(marker.read_text()) and calls[1:] == [None]


def test_a_failing_started_means_the_command_never_runs(tmp_path):
    marker = tmp_path / "ran"

    def started(pgid):
        if pgid is not None:
            raise OSError("journal not writable")

    with pytest.raises(OSError):
        runner.run(["/bin/sh", "-c", 'echo ran > "$1"', "sh", str(marker)], timeout=60, started=started)
    time.sleep(0.2)
    assert not marker.exists()


def test_the_gate_stays_closed_when_the_parent_dies_before_saying_go(tmp_path):
    marker = tmp_path / "ran"
    proc = subprocess.Popen(["/bin/sh", "-c", runner.GATE, "gate", "/bin/sh", "-c", f'echo ran > "{marker}"'],
                            stdin=subprocess.PIPE, start_new_session=True)
    proc.stdin.close()   # what a SIGKILLed parent leaves: the pipe's writer gone
    assert proc.wait(timeout=30) == runner.GATE_CLOSED and not marker.exists()


def test_kill_group_kills_only_the_recorded_group(tmp_path):
    pids = tmp_path / "pids"
    proc = subprocess.Popen(["/bin/sh", "-c", FAMILY, "sh", str(pids)], start_new_session=True,
                            stdout=subprocess.DEVNULL)
    try:
        child, grandchild = _pids(pids)
        record = runner.group_record(proc.pid)
        assert record["pgid"] == proc.pid and record["start"] and record["boot"]
        # a number now leading another group (another start time) is never killed
        assert runner.kill_group(dict(record, start=record["start"] + 1)) == 0
        assert runner.kill_group(dict(record, boot="another boot")) == 0
        assert running(child) and running(grandchild)
        assert runner.kill_group(record) == 2
        assert proc.wait(timeout=30) == -signal.SIGKILL and _gone(grandchild)
        assert runner.kill_group(record) == 0   # nothing left
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


EARLY_CTRL_C = textwrap.dedent(r'''
    import os, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from fastpath_hooks.act import runner
    try:
        # the child's first act is the Ctrl-C: it can land while Popen is still starting it
        runner.run(["/bin/sh", "-c", 'kill -INT "$PPID"; sleep 300 & echo "$$ $!" > "$1"; wait', "sh", sys.argv[1]],
                   timeout=300)
        print("finished")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
''')


@pytest.mark.parametrize("attempt", range(5))
def test_a_ctrl_c_while_the_child_starts_still_kills_its_group(tmp_path, attempt):
    """Ctrl-C during Popen (after the fork) is held until the runner holds the child, then raised
    where the whole group is killed; nothing of the command outlives the interrupted run."""
    pids = tmp_path / "pids"
    parent = subprocess.run([sys.executable, "-c", EARLY_CTRL_C, str(pids)], capture_output=True, text=True,
                            timeout=120)
    assert parent.stdout.strip() == "interrupted", parent.stdout + parent.stderr
    if pids.exists() and pids.read_text().strip():   # the shell may have been killed before it wrote them
        assert _gone(*[int(p) for p in pids.read_text().split()])
