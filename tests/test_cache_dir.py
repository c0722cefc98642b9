"""An unusable FASTPATH_HOOKS_CACHE_DIR (issue 17, defect 3): said once, and the default cache root is used.

`/proc/nope` cannot be created. It was accepted silently: every verdict was lost, so every start
verified its kernels again in a child process (2.3-2.9 s instead of 0.04 s), and doctor said nothing.
"""

from __future__ import annotations

import os

import pytest

from conftest import A100, offline_env
from fastpath_hooks._names import cache_root, cache_root_from_environ, default_cache_root
from fastpath_hooks.facts.settings import Settings
from test_cache import CAUSAL_SCRIPT, _run
from support.processes import link_uv

UNUSABLE = "/proc/nope"


def test_an_uncreatable_cache_dir_falls_back_to_the_default_root_in_the_settings_and_the_warm_path(tmp_path):
    environ = {"FASTPATH_HOOKS_CACHE_DIR": UNUSABLE, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    default = os.path.join(str(tmp_path / "xdg"), "fastpath-hooks")
    settings = Settings.from_env(environ)     # not an error: the run goes on, with the default root
    assert settings.cache_dir is None
    assert settings.cache_dir_unusable.startswith(f"FASTPATH_HOOKS_CACHE_DIR={UNUSABLE} cannot be created (")
    assert "using " in settings.cache_dir_unusable
    assert settings.public()["cache_dir_unusable"] == settings.cache_dir_unusable
    # the settings and the warm path (which does not parse them) agree on the root
    assert cache_root_from_environ(environ) == default
    assert cache_root(settings) == default_cache_root()   # of this process's environment


def test_a_creatable_cache_dir_is_made_and_used(tmp_path):
    wanted = str(tmp_path / "a" / "b")
    settings = Settings.from_env({"FASTPATH_HOOKS_CACHE_DIR": wanted})
    assert settings.cache_dir == wanted and settings.cache_dir_unusable is None and os.path.isdir(wanted)
    assert cache_root_from_environ({"FASTPATH_HOOKS_CACHE_DIR": wanted}) == wanted


@pytest.mark.slow
def test_with_an_uncreatable_cache_dir_the_second_start_is_warm_and_it_is_said_once(make_venv, make_wheelhouse,
                                                                                     test_pins, tmp_path):
    venv = make_venv(transformers=None)
    link_uv(venv)
    wheelhouse = make_wheelhouse(causal=True)
    home = tmp_path / "home"
    env = offline_env(wheelhouse, A100, cache_dir=UNUSABLE, pins=test_pins(wheelhouse), FASTPATH_HOOKS_INSTALLER="uv",
                      XDG_CACHE_HOME=str(home / ".cache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    said = f"FASTPATH_HOOKS_CACHE_DIR={UNUSABLE} cannot be created"

    first, err = _run(venv, CAUSAL_SCRIPT, env)
    assert first["state"] == "installed" and first["spawns"] > 0, (first, err)
    assert err.count(said) == 1, err
    assert os.path.isdir(home / ".cache" / "fastpath-hooks" / "verdicts")   # the verdicts went to the default root

    warm, err = _run(venv, CAUSAL_SCRIPT, env)
    assert warm == {"state": "ok", "spawns": 0, "probed": False, "fake": True}, err   # no child process
    assert said not in err      # said once per environment

    doctor = venv.cli("doctor", env=env)
    assert doctor.returncode == 0, doctor.stderr
    assert f"cache         {said}" in doctor.stdout        # doctor shows it, and where the cache is instead
    assert os.path.join(str(home), ".cache", "fastpath-hooks", "wheels") in doctor.stdout


# -- a cache dir that exists but cannot be written; a relative one (issue 34, defect 2 and 6) -------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def full_dir(tmp_path):
    """A directory that exists and cannot take a file's bytes: a full tmpfs where this machine lets the tests
    mount one, else a read-only directory (chmod; as root a chmod does not stop writes, so then the tmpfs is
    the test). os.access says both are writable when mounted full; only a write tells."""
    import subprocess

    path = tmp_path / "full"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(path)], capture_output=True).returncode == 0
    if mounted:
        try:
            with open(path / "filler", "wb") as fh:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
        except OSError:
            pass
    else:
        if os.geteuid() == 0:
            pytest.skip("cannot mount a tmpfs here, and a chmod does not stop root from writing")
        path.chmod(0o555)
    try:
        yield str(path)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        else:
            path.chmod(0o755)


def _cli_env(tmp_path, cache_dir: str, **extra) -> dict:
    from support import venvs

    return venvs.clean_env(PYTHONPATH=ROOT, FASTPATH_HOOKS_CACHE_DIR=cache_dir, XDG_CACHE_HOME=str(tmp_path / "xdg"),
                           LOCAL_RANK="0", **extra)


def _python(env, *args, cwd=None):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120, cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


START = "import fastpath_hooks; fastpath_hooks.install()"


def test_a_full_cache_dir_is_said_once_falls_back_and_doctor_shows_it(full_dir, tmp_path):
    """A full tmpfs as FASTPATH_HOOKS_CACHE_DIR was silent: every verdict lost (each start verified again in
    child processes), the JIT caches pointed into it, doctor said nothing."""
    default = os.path.join(str(tmp_path / "xdg"), "fastpath-hooks")
    settings = Settings.from_env({"FASTPATH_HOOKS_CACHE_DIR": full_dir, "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert settings.cache_dir is None and f"FASTPATH_HOOKS_CACHE_DIR={full_dir} cannot be written (" in \
        settings.cache_dir_unusable, settings.cache_dir_unusable
    assert cache_root_from_environ({"FASTPATH_HOOKS_CACHE_DIR": full_dir, "XDG_CACHE_HOME": str(tmp_path / "xdg")}) == \
        default
    env = _cli_env(tmp_path, full_dir)
    (line,) = _python(env, "-c", START).stderr.splitlines()    # its long value may be left to doctor
    assert line.startswith("fastpath-hooks: FASTPATH_HOOKS_CACHE_DIR") and " cannot be written (" in line, line
    assert line.endswith("instead (set it to a directory you can write)"), line
    assert _python(env, "-c", START).stderr == ""            # once: the marker went to the default root
    doctor = _python(env, "-m", "fastpath_hooks", "doctor")
    assert doctor.returncode == 0 and f"cache         FASTPATH_HOOKS_CACHE_DIR={full_dir} cannot be written (" in \
        doctor.stdout, doctor.stdout
    import json

    data = json.loads(_python(env, "-m", "fastpath_hooks", "doctor", "--json").stdout)
    jit = [c["directory"] for c in data["jit"]["caches"].values()]
    assert jit and all(d.startswith(default + os.sep) for d in jit), jit     # the JIT caches are not put there
    assert data["wheel_cache"]["directory"].startswith(default + os.sep)


def test_a_relative_cache_dir_is_refused_with_one_line_and_nothing_made_in_the_working_directory(tmp_path):
    """A relative FASTPATH_HOOKS_CACHE_DIR was made in each process's working directory (even by doctor):
    every directory a job runs in got its own cache. It is refused: the default root, one line, doctor shows it."""
    work = tmp_path / "work"
    work.mkdir()
    env = _cli_env(tmp_path, "fph-cache")
    settings = Settings.from_env({"FASTPATH_HOOKS_CACHE_DIR": "fph-cache", "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert settings.cache_dir is None and settings.cache_dir_unusable.startswith(
        "FASTPATH_HOOKS_CACHE_DIR=fph-cache is a relative path"), settings.cache_dir_unusable
    (line,) = _python(env, "-c", START, cwd=str(work)).stderr.splitlines()
    assert line.startswith("fastpath-hooks: FASTPATH_HOOKS_CACHE_DIR=fph-cache is a relative path") and \
        line.endswith("(set it to an absolute path)"), line
    doctor = _python(env, "-m", "fastpath_hooks", "doctor", cwd=str(work))
    assert doctor.returncode == 0 and "cache         FASTPATH_HOOKS_CACHE_DIR=fph-cache is a relative path" in \
        doctor.stdout, doctor.stdout
    assert os.listdir(work) == []                              # nothing made where it was run


def test_doctor_says_a_non_ascii_cache_path_where_the_output_is_ascii(tmp_path):
    """`PYTHONIOENCODING=ascii fastpath-hooks doctor` with a cache under a non-ASCII path ended in a traceback."""
    cache = tmp_path / "caché-ü"
    env = _cli_env(tmp_path, str(cache), PYTHONIOENCODING="ascii")
    doctor = _python(env, "-m", "fastpath_hooks", "doctor")
    assert doctor.returncode == 0, doctor.stderr
    assert f"{tmp_path}/cach\\xe9-\\xfc/wheels" in doctor.stdout, doctor.stdout    # said, escaped
