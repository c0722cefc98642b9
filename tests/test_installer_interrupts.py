"""The installer under interruption and with protected-but-allowed dependencies: Ctrl-C during a step, numpy for tilelang.

Real pip into one small real venv (no torch, no transformers: nothing here imports them;
torch is posed through FASTPATH_HOOKS_TARGET), driven through the public surfaces - a user
script that turns fastpath-hooks on and imports a kernel, or `fastpath-hooks install`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest
from conftest import A100, H100_OLD_TRITON
from support import guarded, venvs, wheels
from support.processes import processes_with
from test_transaction import tree

from fastpath_hooks.facts import pins as pins_mod
from fastpath_hooks.act.transaction import JOURNAL
from fastpath_hooks.engine.world import HELD_BEFORE

PINS = pins_mod.load()

# slow: real venvs, installers interrupted mid-step (docs/development.md)
pytestmark = pytest.mark.slow
STATE = ".fastpath-hooks"


@pytest.fixture(scope="module")
def venv(tmp_path_factory, fastpath_wheel):
    v = venvs.make_venv(str(tmp_path_factory.mktemp("review") / "venv"), torch_wheel=None,
                        fastpath_wheel=fastpath_wheel, transformers=None)
    # bytecode for everything there now, so only what an install adds changes the tree
    subprocess.run([v.python, "-m", "compileall", "-q", v.site], check=True, capture_output=True,
                   env=venvs.clean_env())
    return v


def _env(tmp_path, target, wheelhouse, **extra):
    """Posing as `target`, offline from `wheelhouse`, pip, its own TMPDIR; no bytecode written (byte-for-byte trees)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    return guarded.kernel_env(target=target, cache_dir=str(tmp_path / "cache"), wheelhouse=wheelhouse,
                              installer="pip", TMPDIR=str(tmpdir), PYTHONDONTWRITEBYTECODE="1", **extra)


def _installers(venv) -> list:
    return [cmd for _, cmd in processes_with(venv.path) if " -m pip " in cmd or "uv pip" in cmd]


def _state_entries(venv) -> list:
    state = os.path.join(venv.site, STATE)
    # the lock and the marker of its first holder stay (engine/world.py); a journal, backups or work dirs must not
    return sorted(e for e in os.listdir(state) if e not in ("install.lock", HELD_BEFORE)) if os.path.isdir(state) else []


# -- Ctrl-C while a step runs ---------------------------------------------------------------

NOTEBOOK = r'''
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job inherits SIG_IGN)
import fastpath_hooks
fastpath_hooks.install()
try:
    import fla
    print("imported", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)  # like a notebook kernel: the process lives on
sys.stdin.readline()
'''


def test_ctrl_c_during_a_step_stops_the_installer_before_the_rollback(venv, tmp_path, make_wheelhouse, test_pins):
    wh = make_wheelhouse(fla="0.6.0", fla_padding=3000)  # pip writes its files one by one for seconds
    env = _env(tmp_path, A100, wh, pins=test_pins())
    before = tree(venv.site)
    padding = os.path.join(venv.site, "fla", "_padding")
    proc = subprocess.Popen([venv.python, "-c", NOTEBOOK], env=env, cwd=str(tmp_path), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "err", "w"), text=True)
    try:
        deadline = time.monotonic() + 120
        while not (os.path.isdir(padding) and os.listdir(padding)):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()
            time.sleep(0.002)
        assert _installers(venv)  # pip is writing fla's files
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "interrupted", (tmp_path / "err").read_text()
        # By the time the KeyboardInterrupt reaches the user, no installer writes any more and the
        # environment is as before; the process is still alive.
        assert _installers(venv) == []
        assert tree(venv.site) == before
        assert not os.path.exists(os.path.join(venv.site, STATE, JOURNAL)) and _state_entries(venv) == []
        assert os.listdir(tmp_path / "tmp") == []  # pip's and fastpath-hooks' scratch lived in the state dir
        assert proc.poll() is None
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert tree(venv.site) == before  # nothing came back after the fact


# -- numpy: tilelang may install it where it is absent, never change it where it is present --------

def _numpy_wheels(wh: str) -> None:
    for version in ("2.0.0", "1.20.0"):
        wheels.build_wheel(wh, "numpy", version, {"numpy/__init__.py": f"__version__ = '{version}'\n"})


def test_tilelang_installs_an_absent_numpy_and_never_names_a_present_one(venv, tmp_path, make_wheelhouse, test_pins):
    good = PINS.good_companions("tilelang", "0.1.15")
    wh = make_wheelhouse(tilelang="0.1.15", tvm_ffi=tuple(good), deps=False)
    _numpy_wheels(wh)
    pins = test_pins(extra={"kernels": {"tilelang": {"runtime_deps": ["numpy>=1.23.5"]}}})
    env = _env(tmp_path, H100_OLD_TRITON, wh, pins=pins, FASTPATH_HOOKS_LOG="debug")
    try:
        assert "numpy" not in venv.versions()
        first = venv.cli("install", "tilelang", env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert venv.versions()["numpy"] == "2.0.0" and guarded.kernel_versions(venv)["tilelang"] == "0.1.15"

        # numpy present and new enough: not named to the installer (nothing to back up or rewrite), untouched
        subprocess.run([venvs.uv(), "pip", "uninstall", "-q", "--python", venv.python, "tilelang", "apache-tvm-ffi"],
                       check=True, env=venvs.clean_env(), capture_output=True)
        numpy_files = guarded.stat_state(venv, ("numpy",))
        second = venv.cli("install", "tilelang", env=env)
        assert second.returncode == 0, second.stdout + second.stderr
        runs = [ln for ln in second.stderr.splitlines() if "running:" in ln]
        assert runs and not any("numpy" in ln for ln in runs), runs
        assert guarded.stat_state(venv, ("numpy",)) == numpy_files

        # numpy present and too old: refused, numpy untouched, tilelang not installed
        subprocess.run([venvs.uv(), "pip", "uninstall", "-q", "--python", venv.python, "tilelang", "apache-tvm-ffi"],
                       check=True, env=venvs.clean_env(), capture_output=True)
        subprocess.run([venvs.uv(), "pip", "install", "-q", "--python", venv.python, "--no-deps", "--reinstall",
                        os.path.join(wh, "numpy-1.20.0-py3-none-any.whl")],
                       check=True, env=venvs.clean_env(), capture_output=True)
        old_files = guarded.stat_state(venv, ("numpy",))
        third = venv.cli("install", "tilelang", env=env)
        assert third.returncode == 1, third.stdout + third.stderr
        assert "numpy 1.20.0" in third.stdout + third.stderr
        assert guarded.stat_state(venv, ("numpy",)) == old_files and "tilelang" not in venv.versions()
    finally:
        subprocess.run([venvs.uv(), "pip", "uninstall", "-q", "--python", venv.python, "numpy",
                        *guarded.RESET_DISTS], check=True, env=venvs.clean_env(), capture_output=True)
        shutil.rmtree(os.path.join(venv.site, STATE), ignore_errors=True)
