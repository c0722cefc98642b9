"""Many threads, one process: each kernel is decided once, callers of other kernels are not held up,
and `on_event` callbacks never run under a lock of ours - so a callback may block or call
fastpath-hooks itself without deadlocking anything.

Real threads in a real process of a real venv, posing as a GPU machine (FASTPATH_HOOKS_TARGET),
installing stand-in kernels from a local wheelhouse through uv, whose every call is counted by a
logging `uv` placed where fastpath-hooks looks for it first (the venv's bin).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.slow   # real venvs, real threads installing stand-in wheels

from conftest import A100, H100_OLD_TRITON, offline_env
from support import guarded, venvs
from support.processes import counting_uv, installer_calls

KERNELS = ("fla", "causal-conv1d", "tilelang")


@pytest.fixture(scope="module")
def venv(tmp_path_factory, torch_wheel, fastpath_wheel):
    return venvs.make_venv(str(tmp_path_factory.mktemp("engine") / "venv"), torch_wheel=torch_wheel,
                           fastpath_wheel=fastpath_wheel, transformers=None)


@pytest.fixture
def fresh(venv, tmp_path):
    """The module venv without kernels; a uv that logs its calls to the returned file."""
    guarded.reset_kernels(venv)
    log = str(tmp_path / "uv-calls.log")
    counting_uv(venv, log)
    return log


def _env(tmp_path, wheelhouse, target, pins, **extra):
    env = offline_env(wheelhouse, target, cache_dir=str(tmp_path / "cache"), pins=pins, FASTPATH_HOOKS_INSTALLER="uv",
                      FASTPATH_HOOKS_LOCK_TIMEOUT="120", **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(venv, script: str, env: dict, *args) -> tuple[dict, str]:
    proc = subprocess.run([venv.python, "-c", script, *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _planned_steps(venv, env, kernel: str) -> int:
    out = venv.cli("plan", "--json", kernel, env=env)
    assert out.returncode == 0, out.stderr
    decisions = {d["kernel"]: d for d in json.loads(out.stdout)["decisions"]}
    assert decisions[kernel]["action"] == "install", decisions[kernel]
    return len(decisions[kernel]["steps"])


EIGHT_THREADS = r'''
import json, sys, threading
import fastpath_hooks
from fastpath_hooks import engine

KERNELS = ("fla", "causal-conv1d", "tilelang")
seen = []
fastpath_hooks.install(on_event=lambda event: seen.append(event["kernel"]))
barrier = threading.Barrier(8)
got = {}

def work(i):
    barrier.wait()
    order = KERNELS[i % 3:] + KERNELS[:i % 3]   # every kernel asked for first by some thread
    got[i] = {kernel: engine.ensure(kernel) for kernel in order}

threads = [threading.Thread(target=work, args=(i,), name=f"t{i}", daemon=True) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=400)
first = got.get(0, {})
print(json.dumps({
    "alive": [t.name for t in threads if t.is_alive()],
    "threads": len(got),
    "one_outcome_each": all(got[i][k] is first[k] for i in got for k in KERNELS),
    "states": {k: o.state for k, o in first.items()},
    "registry": {k: o.state for k, o in engine.outcomes().items()},
    "events": len(seen),
}))
'''


def test_eight_threads_three_kernels_each_decided_and_installed_once(venv, fresh, tmp_path, make_wheelhouse,
                                                                     test_pins):
    # A Hopper machine with triton 3.6: fla needs tilelang first (fla #640), so the threads that ask
    # for fla wait on tilelang's decision while others are deciding tilelang and causal-conv1d.
    wheelhouse = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi=("0.1.12",), causal=True)
    env = _env(tmp_path, wheelhouse, H100_OLD_TRITON, test_pins(wheelhouse))
    planned = {k: _planned_steps(venv, env, k) for k in KERNELS}

    out, err = _run(venv, EIGHT_THREADS, env)

    assert out["alive"] == [] and out["threads"] == 8, (out, err)
    assert out["one_outcome_each"], out           # every thread got the very same Outcome per kernel
    assert out["states"] == {"fla": "installed", "causal-conv1d": "installed", "tilelang": "installed"}, (out, err)
    assert out["registry"] == out["states"]
    assert out["events"] > 0
    calls = installer_calls(fresh)
    assert len(calls) == sum(planned.values()), (calls, planned)   # each kernel's steps ran once
    assert sum("fla-core==0.6.0" in args for _, args in calls) == 1, calls
    assert sum("tilelang==0.1.15" in args for _, args in calls) == 1, calls
    assert sum("causal_conv1d-" in args for _, args in calls) == 1, calls
    assert guarded.kernel_versions(venv) == {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0",
                                             "tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12",
                                             "causal-conv1d": "1.6.2.post1+cu12torch2.10cxx11abiTRUE"}
    assert not os.path.exists(os.path.join(venv.site, ".fastpath-hooks", "journal.json"))


CALLBACKS = r'''
import fcntl, json, os, sys
import fastpath_hooks
from fastpath_hooks import engine

LOCK = sys.argv[1]        # the environment's install lock file
under_lock, inner, order = [], {}, []

def lock_held():
    """Whether an open file of this process holds the install lock: flock through a descriptor of our own
    conflicts with one held through another descriptor, even in the same process."""
    try:
        fd = os.open(LOCK, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)

def on_event(event):
    order.append(event["kernel"])
    if lock_held():
        under_lock.append(event["message"])
    if event["kernel"] == "fla" and "fla: installing" in event["message"] and not inner:
        inner["fla"] = engine.ensure("fla").state               # its own decision, still running in this thread
        inner["decided"] = sorted(engine.outcomes())
        inner["causal-conv1d"] = engine.ensure("causal-conv1d").state   # a whole other decision, from a callback

fastpath_hooks.install(on_event=on_event)
import fla
print(json.dumps({"fla": engine.outcomes()["fla"].state, "inner": inner, "under_lock": under_lock,
                  "events": len(order)}))
'''


def test_callbacks_run_outside_the_install_lock_and_may_call_fastpath_hooks(venv, fresh, tmp_path, make_wheelhouse,
                                                                            test_pins):
    wheelhouse = make_wheelhouse(fla="0.6.0", causal=True)
    env = _env(tmp_path, wheelhouse, A100, test_pins(wheelhouse))
    lock_file = os.path.join(venv.site, ".fastpath-hooks", "install.lock")

    out, err = _run(venv, CALLBACKS, env, lock_file)

    assert out["under_lock"] == [], out           # not one callback while the install lock was held
    assert out["events"] > 5, out
    assert out["fla"] == "installed", (out, err)
    # From inside fla's own decision: answered at once ("pending"), not waited for; nothing decided yet;
    # causal-conv1d decided - and installed, taking the lock fla's install had released - within the callback.
    assert out["inner"] == {"fla": "pending", "decided": [], "causal-conv1d": "installed"}, (out, err)
    assert "fla: installed" in err and "causal-conv1d: installed" in err, err
    assert guarded.kernel_versions(venv)["causal-conv1d"] == "1.6.2.post1+cu12torch2.10cxx11abiTRUE"


BLOCKING = r'''
import json, threading
import fastpath_hooks
from fastpath_hooks import engine

release, blocked = threading.Event(), threading.Event()

def on_event(event):
    if threading.current_thread().name == "fla" and event["kernel"] == "fla" and not blocked.is_set():
        blocked.set()
        release.wait(300)            # a callback that blocks (a slow dashboard, a full queue)

fastpath_hooks.install(on_event=on_event)
results = {}

def ask(kernel):
    results[threading.current_thread().name] = engine.ensure(kernel)

def start(name, kernel):
    thread = threading.Thread(target=ask, args=(kernel,), name=name, daemon=True)
    thread.start()
    return thread

fla = start("fla", "fla")
assert blocked.wait(300)
other, same = start("other", "causal-conv1d"), start("same", "fla")
other.join(300)
report = {"other_while_blocked": results["other"].state if "other" in results else None,
          "fla_still_blocked": fla.is_alive(), "same_still_waiting": same.is_alive()}
release.set()
fla.join(300)
same.join(300)
report.update(fla=results["fla"].state, same_is_fla=results.get("same") is results["fla"])
print(json.dumps(report))
'''


def test_a_callback_that_blocks_holds_up_only_its_own_kernel(venv, fresh, tmp_path, make_wheelhouse, test_pins):
    wheelhouse = make_wheelhouse(fla="0.6.0", causal=True)
    env = _env(tmp_path, wheelhouse, A100, test_pins(wheelhouse))

    out, err = _run(venv, BLOCKING, env)

    # causal-conv1d was decided and installed while fla's callback was blocked ...
    assert out["other_while_blocked"] == "installed" and out["fla_still_blocked"], (out, err)
    # ... while a second caller of fla waited for fla's one decision, and got its outcome.
    assert out["same_still_waiting"] and out["same_is_fla"] and out["fla"] == "installed", (out, err)


CROSSED = r'''
import json, threading
import fastpath_hooks
from fastpath_hooks import engine

answers, b_asks = {}, threading.Event()

def on_event(event):
    me = threading.current_thread().name
    if me == "A" and event["kernel"] == "fla" and "A" not in answers:
        answers["A"] = None
        B.start()
        b_asks.wait(300)                                    # B, inside causal-conv1d's decision, asks for fla
        answers["A"] = engine.ensure("causal-conv1d").state   # ... and A, inside fla's, for causal-conv1d
    elif me == "B" and event["kernel"] == "causal-conv1d" and "B" not in answers:
        answers["B"] = None
        b_asks.set()
        answers["B"] = engine.ensure("fla").state

fastpath_hooks.install(on_event=on_event)
results = {}

def ask(kernel):
    results[threading.current_thread().name] = engine.ensure(kernel).state

A = threading.Thread(target=ask, args=("fla",), name="A", daemon=True)
B = threading.Thread(target=ask, args=("causal-conv1d",), name="B", daemon=True)
A.start()
A.join(400)
B.join(400)
print(json.dumps({"alive": [t.name for t in (A, B) if t.is_alive()], "answers": answers, "results": results}))
'''


def test_two_decisions_asking_for_each_other_do_not_deadlock(venv, fresh, tmp_path, make_wheelhouse, test_pins):
    """Callbacks of two kernels' decisions, in two threads, each ask for the other kernel: the wait that
    would close the circle is refused (that caller hears 'pending'); both decisions finish."""
    wheelhouse = make_wheelhouse(fla="0.6.0", causal=True)
    env = _env(tmp_path, wheelhouse, A100, test_pins(wheelhouse))

    out, err = _run(venv, CROSSED, env)

    assert out["alive"] == [], (out, err)
    assert out["results"] == {"A": "installed", "B": "installed"}, (out, err)
    # exactly one of the two waits would have closed the circle; the other caller got the real outcome
    assert sorted(out["answers"].values()) == ["installed", "pending"], out
