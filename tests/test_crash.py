"""Crash safety: a process killed (SIGKILL) mid-install or while waiting for the lock.

The next run must find the interrupted install (its journal), restore the state before
it, install again and verify - without waiting on a stale lock (flock dies with its
holder) and without anything half-installed left behind.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import A100, offline_env
from fastpath_hooks.act import transaction as state
from support.processes import link_uv, processes_with, running

# slow: real venvs, processes killed mid-install (docs/development.md)
pytestmark = pytest.mark.slow

PADDING = 3000  # small modules in the fake fla: extracting them takes seconds, long enough to be killed
USER_SCRIPT = r'''
import json
import fastpath_hooks
fastpath_hooks.install()
import fla
from fastpath_hooks import engine
print(json.dumps({"version": fla.__version__, "state": engine.outcomes()["fla"].state}))
'''
HOLD_LOCK = r'''
import sys
from fastpath_hooks.facts.settings import Settings
from fastpath_hooks.act.locks import environment_lock
lock = environment_lock(Settings.from_env())
lock.acquire()
print("held", flush=True)
sys.stdin.readline()
'''


def _popen(venv, code, env, tmp_path, name):
    out = open(tmp_path / f"{name}.out", "w")
    err = open(tmp_path / f"{name}.err", "w")
    return subprocess.Popen([venv.python, "-c", code], env=env, cwd=str(tmp_path), stdout=out, stderr=err,
                            stdin=subprocess.PIPE, text=True)


def _wait_for(condition, timeout: float, proc=None, what: str = ""):
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the process ended (exit {proc.returncode}) before {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _children_of_venv(venv) -> list:
    """Processes still running the venv's interpreter (an installer left behind would be one)."""
    return [cmd for _, cmd in processes_with(venv.path) if "pip" in cmd or "uv" in cmd]


def _fla_files(venv) -> int:
    return len(glob.glob(os.path.join(venv.site, "fla", "_padding", "*.py")))


@pytest.mark.parametrize("moment", ["extracting", "verifying"])
def test_sigkill_mid_install_then_next_run_recovers_and_installs(moment, make_venv, make_wheelhouse, tmp_path):
    venv = make_venv(transformers=None)
    link_uv(venv)
    wheelhouse = make_wheelhouse(fla="0.6.0", fla_padding=PADDING)
    scratch = tmp_path / "tmp"  # the processes' TMPDIR: a killed install must leave nothing there either
    scratch.mkdir()
    env = offline_env(wheelhouse, A100, cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_INSTALLER="uv",
                      FASTPATH_HOOKS_LOCK_TIMEOUT="60", TMPDIR=str(scratch))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # pip writes a wheel's files one by one (uv links them all at once): the victim uses pip
    victim_env = dict(env, FASTPATH_HOOKS_INSTALLER="pip" if moment == "extracting" else "uv")
    pip_check_before = venv.pip_check()
    journal = os.path.join(venv.site, ".fastpath-hooks", state.JOURNAL)
    core_info = os.path.join(venv.site, "fla_core-0.6.0.dist-info")
    layers_info = os.path.join(venv.site, "flash_linear_attention-0.6.0.dist-info")

    victim = _popen(venv, USER_SCRIPT, victim_env, tmp_path, "victim")
    if moment == "extracting":  # pip is writing fla's files
        _wait_for(lambda: _fla_files(venv) > 0, 120, victim, "fla's files appear")
    else:                       # both distributions are complete; the child-process verification runs
        _wait_for(lambda: os.path.isdir(core_info) and os.path.isdir(layers_info), 120, victim,
                  "fla's distributions are installed")
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    # What the kill left: a journal and a half-done fla (pip, in its own session, may still be
    # writing: the next run stops its recorded process group before it restores anything).
    assert os.path.exists(journal)
    assert os.path.isdir(os.path.join(venv.site, "fla"))
    assert glob.glob(os.path.join(venv.site, ".fastpath-hooks", "work-*"))  # its scratch, in the state dir

    start = time.monotonic()
    rerun = venv.run(USER_SCRIPT, env=env, timeout=300)
    seconds = time.monotonic() - start
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
    assert "was interrupted" in rerun.stderr and "fla: installed" in rerun.stderr, rerun.stderr
    assert "waiting for another process" not in rerun.stderr, rerun.stderr  # the killed holder's flock is gone
    assert seconds < 60, seconds
    assert json.loads(rerun.stdout.strip().splitlines()[-1]) == {"version": "0.6.0", "state": "installed"}
    assert not _children_of_venv(venv)

    # Complete and clean: every file, no journal or backups, no pip stash, pip check as before.
    assert _fla_files(venv) == PADDING
    assert not os.path.exists(journal)
    assert not glob.glob(os.path.join(venv.site, ".fastpath-hooks", "backup*"))
    assert not glob.glob(os.path.join(venv.site, ".fastpath-hooks", "work-*"))  # the killed run's scratch is gone
    assert os.listdir(scratch) == []  # and nothing was ever left under TMPDIR
    assert not [n for n in os.listdir(venv.site) if n.startswith("~")]
    assert venv.pip_check() == pip_check_before
    # and the next start just uses it
    again = venv.run(USER_SCRIPT, env=env)
    assert json.loads(again.stdout.strip().splitlines()[-1])["state"] == "ok", again.stderr


def test_process_killed_while_waiting_for_the_lock(make_venv, make_wheelhouse, tmp_path):
    import filelock

    venv = make_venv(transformers=None)
    link_uv(venv)
    wheelhouse = make_wheelhouse(fla="0.6.0")
    env = offline_env(wheelhouse, A100, cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_LOCK_TIMEOUT="120",
                      FASTPATH_HOOKS_INSTALLER="uv")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    before = sorted(os.listdir(venv.site))

    holder = _popen(venv, HOLD_LOCK, env, tmp_path, "holder")  # another process, holding the environment's lock
    _wait_for(lambda: "held" in (tmp_path / "holder.out").read_text(), 60, holder, "the holder takes the lock")
    waiter = _popen(venv, USER_SCRIPT, env, tmp_path, "waiter")
    _wait_for(lambda: "waiting for another process" in (tmp_path / "waiter.err").read_text(), 60, waiter,
              "the waiter reports that it waits")
    waiter.send_signal(signal.SIGKILL)
    assert waiter.wait(timeout=30) == -signal.SIGKILL

    # The waiter changed nothing, and the holder still holds the lock.
    lock_file = os.path.join(venv.site, ".fastpath-hooks", "install.lock")
    with pytest.raises(filelock.Timeout):
        filelock.FileLock(lock_file).acquire(timeout=0)
    assert sorted(os.listdir(venv.site)) == sorted(set(before) | {".fastpath-hooks"})
    assert not os.path.exists(os.path.join(venv.site, ".fastpath-hooks", state.JOURNAL))

    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.wait(timeout=30) == 0

    rerun = venv.run(USER_SCRIPT, env=env, timeout=300)
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
    assert "waiting for another process" not in rerun.stderr, rerun.stderr
    assert json.loads(rerun.stdout.strip().splitlines()[-1]) == {"version": "0.6.0", "state": "installed"}


# A stand-in `uv` that never finishes: it starts a helper in its process group, and both keep writing
# files into site-packages (an installer extracting a big wheel) until they are killed.
SLOW_UV = r'''#!/bin/sh
site="$(dirname "$(dirname "$0")")/lib/python*/site-packages"
site=$(echo $site)
( i=0; while :; do i=$((i+1)); echo x > "$site/standin_helper_$i.py"; sleep 0.02; done ) &
echo "$$ $!" > "{pids}"
i=0
while :; do i=$((i+1)); echo x > "$site/standin_uv_$i.py"; sleep 0.02; done
'''



def test_an_installer_outliving_its_killed_parent_is_stopped_before_the_rollback(make_venv, make_wheelhouse, tmp_path):
    """The installer runs in its own session (no PR_SET_PDEATHSIG: a threaded parent cannot use a
    preexec_fn), so it outlives a SIGKILLed parent; its process group is in the journal, and the
    next run kills what is left of it before restoring the state - no writer behind the rollback."""
    venv = make_venv(transformers=None)
    wheelhouse = make_wheelhouse(fla="0.6.0", fla_padding=10)
    pids = tmp_path / "standin.pids"
    uv = os.path.join(venv.bin, "uv")
    with open(uv, "w") as fh:
        fh.write(SLOW_UV.replace("{pids}", str(pids)))
    os.chmod(uv, 0o755)
    env = offline_env(wheelhouse, A100, cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_LOCK_TIMEOUT="60")
    before = sorted(os.listdir(venv.site))
    journal = os.path.join(venv.site, ".fastpath-hooks", state.JOURNAL)

    victim = _popen(venv, USER_SCRIPT, dict(env, FASTPATH_HOOKS_INSTALLER="uv"), tmp_path, "victim")
    _wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, 120, victim, "the stand-in installer runs")
    standin, helper = (int(p) for p in pids.read_text().split())
    with open(journal) as fh:
        group = json.load(fh)["group"]
    assert group["pgid"] == standin  # recorded before the installer ran
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    time.sleep(0.3)
    assert running(standin) and running(helper)  # the installer lives on, writing ...
    written = len(glob.glob(os.path.join(venv.site, "standin_*.py")))
    time.sleep(0.3)
    assert len(glob.glob(os.path.join(venv.site, "standin_*.py"))) > written

    try:
        rerun = venv.run(USER_SCRIPT, env=dict(env, FASTPATH_HOOKS_INSTALLER="pip"), timeout=300)
        assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
        # ... until the next run stops it (both processes), restores the state and installs
        assert re.search(r"was interrupted; rolling it back \(stopped \d+ process(es)? it left running\)",
                         rerun.stderr), rerun.stderr
        assert not running(standin) and not running(helper)
        assert json.loads(rerun.stdout.strip().splitlines()[-1]) == {"version": "0.6.0", "state": "installed"}
        assert not os.path.exists(journal)
        time.sleep(0.3)
        assert not glob.glob(os.path.join(venv.site, "standin_*.py"))  # removed, and nothing writes them again
        assert set(before) <= set(os.listdir(venv.site))
    finally:
        for pid in (standin, helper):
            if running(pid):
                os.kill(pid, signal.SIGKILL)
