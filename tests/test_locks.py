"""Locks on filesystems without flock (Lustre mounted without `-o flock`, some NFS).

The failing flock is real: a tiny LD_PRELOAD library, compiled here with gcc, makes flock()
return -1/ENOSYS for every file under one directory (NOFLOCK_UNDER) - the test's - and
leaves every other file alone (uv's own cache keeps working, as it would on a local disk).
Real processes take the locks; a real SIGKILL removes a holder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import A100, offline_env
from fastpath_hooks.act import locks as softlock
from support.processes import IMPORT_FLA_TOGETHER, counting_uv, installer_calls, start_together

SHIM = r'''
/* flock() fails with ENOSYS on files under $NOFLOCK_UNDER, as on Lustre mounted without -o flock. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int flock(int fd, int operation) {
    static int (*real_flock)(int, int) = 0;
    const char *under = getenv("NOFLOCK_UNDER");
    if (under && *under) {
        char link[64], path[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof path - 1);
        if (n > 0) {
            path[n] = 0;
            if (strncmp(path, under, strlen(under)) == 0) {
                errno = ENOSYS;
                return -1;
            }
        }
    }
    if (!real_flock)
        real_flock = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
    return real_flock(fd, operation);
}
'''
NO_FLOCK_LINE = "does not support flock (Lustre without -o flock?); using a lock file with stale-holder recovery"


@pytest.fixture(scope="module")
def noflock_library(tmp_path_factory):
    if not sys.platform.startswith("linux"):
        pytest.skip("the flock shim is an LD_PRELOAD library for Linux")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc/cc) to build the LD_PRELOAD library that makes flock fail")
    where = tmp_path_factory.mktemp("noflock")
    source, library = where / "noflock.c", where / "libnoflock.so"
    source.write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"], check=True)
    return str(library)


def without_flock(env: dict, library: str, under: str) -> dict:
    return dict(env, LD_PRELOAD=library, NOFLOCK_UNDER=os.path.realpath(under) + os.sep)


# Takes file_lock() the way every caller does; prints when held, then holds it.
HOLD = r'''
import json, sys, time
from fastpath_hooks.act import locks
lock = locks.file_lock(sys.argv[1], timeout=float(sys.argv[2]))
t0 = time.monotonic()
try:
    lock.acquire()
except Exception as exc:
    print(json.dumps({"acquired": False, "error": type(exc).__name__, "waited": time.monotonic() - t0}), flush=True)
    sys.exit(0)
print(json.dumps({"acquired": True, "type": type(lock).__name__, "file": lock.lock_file,
                  "waited": time.monotonic() - t0}), flush=True)
if sys.argv[3] == "hold":
    time.sleep(600)
lock.release()
'''


def _hold(path, timeout, mode, env):
    return subprocess.Popen([sys.executable, "-c", HOLD, path, str(timeout), mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _first_line(proc) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


def test_the_shim_makes_flock_fail_only_under_its_directory(noflock_library, tmp_path):
    code = ("import json, sys; from fastpath_hooks.act import locks as softlock\n"
            "print(json.dumps([softlock.flock_works(d) for d in sys.argv[1:]]))")
    other = os.path.dirname(os.path.realpath(str(tmp_path)))
    env = without_flock(dict(os.environ), noflock_library, str(tmp_path / "lustre"))
    (tmp_path / "lustre").mkdir()
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "lustre"), other], env=env,
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [False, True]
    assert softlock.flock_works(str(tmp_path / "lustre"))  # this process has no shim
    assert not [n for n in os.listdir(tmp_path / "lustre")]  # the probe leaves nothing behind


@pytest.mark.slow
def test_a_holder_killed_with_sigkill_does_not_block_the_next_process(noflock_library, tmp_path):
    env = without_flock(dict(os.environ), noflock_library, str(tmp_path))
    path = str(tmp_path / "install.lock")
    holder = _hold(path, 5, "hold", env)
    try:
        held = _first_line(holder)
        assert held["acquired"] and held["type"] == "HolderLock" and held["file"] == path + ".holder"
        with open(path + ".holder") as fh:
            record = json.load(fh)
        assert record["pid"] == holder.pid and record["host"] == os.uname().nodename and record["start"]

        # Alive: a second process waits, and gives up at its timeout without breaking the lock.
        waiter = _hold(path, 1, "release", env)
        assert {k: v for k, v in _first_line(waiter).items() if k != "waited"} == {"acquired": False, "error": "Timeout"}
        waiter.wait(30)
        assert os.path.exists(path + ".holder")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)

    # Dead: its pid is gone, so the next process takes the lock long before the age rule
    # (STALE_AFTER_S) could apply - its own timeout (20 s) is shorter than that.
    assert softlock.STALE_AFTER_S > 20
    nxt = _hold(path, 20, "release", env)
    got = _first_line(nxt)
    assert got["acquired"] and got["type"] == "HolderLock", got
    assert nxt.wait(30) == 0
    err = nxt.stderr.read()
    assert err.count(NO_FLOCK_LINE) == 1 and "SoftFileLock" not in err and "Traceback" not in err, err
    assert not os.path.exists(path + ".holder")  # released: removed


def _write_holder(path: str, record: dict, age: float) -> None:
    with open(path, "w") as fh:
        json.dump(record, fh)
    then = time.time() - age
    os.utime(path, (then, then))


def test_the_recovery_rule_for_other_hosts_and_reused_pids(tmp_path):
    path = str(tmp_path / "x.lock")
    lock = softlock.HolderLock(path, timeout=0)
    import filelock

    # Another host that keeps touching its lock file: waited for, never broken.
    elsewhere = {"host": "node-elsewhere", "boot": "b", "pidns": "pid:[1]", "pid": 4242, "start": "1", "time": 0}
    _write_holder(path, elsewhere, age=1)
    with pytest.raises(filelock.Timeout):
        lock.acquire()
    # ... that stopped touching it STALE_AFTER_S ago: gone.
    _write_holder(path, elsewhere, age=softlock.STALE_AFTER_S + 5)
    lock.acquire()
    assert json.load(open(path))["pid"] == os.getpid()
    lock.release()
    assert not os.path.exists(path)

    # This machine, a live pid that is another process now (another start time): dead.
    reused = dict(softlock.holder_record(), pid=os.getppid(), start="1")
    _write_holder(path, reused, age=0)
    with lock:
        assert lock.is_locked and json.load(open(path))["pid"] == os.getpid()
    # This machine, the live process itself: held.
    _write_holder(path, softlock.holder_record(), age=0)
    with pytest.raises(filelock.Timeout):
        lock.acquire()
    os.unlink(path)

    # A half-written record (a holder between create and write): waited for, until old.
    _write_holder(path, {}, age=0)
    with pytest.raises(filelock.Timeout):
        lock.acquire()
    _write_holder(path, {}, age=softlock.STALE_AFTER_S + 5)
    with lock:
        pass


def test_the_holder_keeps_its_lock_file_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(softlock, "REFRESH_S", 0.05)
    path = str(tmp_path / "x.lock")
    with softlock.HolderLock(path, timeout=1):
        then = time.time() - 1000
        os.utime(path, (then, then))
        deadline = time.monotonic() + 10
        while os.stat(path).st_mtime < then + 500:
            assert time.monotonic() < deadline, "the heartbeat did not touch the lock file"
            time.sleep(0.02)


@pytest.mark.slow
def test_eight_processes_without_flock_at_filelocks_floor_install_once(make_venv, make_wheelhouse, noflock_library,
                                                                        tmp_path):
    """filelock 3.12.0 (the declared floor) raises NotImplementedError where flock fails with ENOSYS."""
    venv = make_venv(transformers=None, extra=("filelock==3.12.0",))
    assert venv.versions()["filelock"] == "3.12.0"
    wheelhouse = make_wheelhouse(fla="0.6.0")
    log = str(tmp_path / "uv-calls.log")
    counting_uv(venv, log)
    env = offline_env(wheelhouse, A100, cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_INSTALLER="uv",
                      FASTPATH_HOOKS_LOCK_TIMEOUT="300")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env = without_flock(env, noflock_library, str(tmp_path))   # the venv and the cache: both "on Lustre"
    floor = venv.run("import filelock, sys\ntry:\n    filelock.FileLock(sys.argv[1]).acquire(timeout=1)\n"
                     "except NotImplementedError:\n    print('NotImplementedError')",
                     args=[str(tmp_path / "probe.lock")], env=env, check=True)
    assert floor.stdout.strip() == "NotImplementedError"  # what every start ran into before

    results = start_together(venv.python, IMPORT_FLA_TOGETHER, 8, env, str(tmp_path))

    for pid, out, err, code in results:
        assert code == 0 and "Traceback" not in err and "internal error" not in err, (pid, out, err)
        assert "SoftFileLock" not in err and "flock not supported" not in err, err
    # said once on the node (one process of the eight speaks; both directories: one filesystem)
    assert sum(err.count(NO_FLOCK_LINE) for _, _, err, _ in results) == 1, [err for _, _, err, _ in results]
    reports = [json.loads(out.strip().splitlines()[-1]) for _, out, _, _ in results]
    assert all(r["version"] == "0.6.0" and r["fake"] is True for r in reports), reports
    assert sorted(r["state"] for r in reports) == ["installed"] + ["ok"] * 7
    (installer_pid,) = [r["pid"] for r in reports if r["state"] == "installed"]
    calls = installer_calls(log)
    assert calls and {pid for pid, _ in calls} == {installer_pid}, calls
    assert not os.path.exists(os.path.join(venv.site, ".fastpath-hooks", "journal.json"))
    assert not os.path.exists(os.path.join(venv.site, ".fastpath-hooks", "install.lock.holder"))  # released
