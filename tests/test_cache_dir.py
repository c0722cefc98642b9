"""An unusable FASTPATH_HOOKS_CACHE_DIR (issue 17, defect 3): said once, and the default cache root is used.

`/proc/nope` cannot be created. It was accepted silently: every verdict was lost, so every start
verified its kernels again in a child process (2.3-2.9 s instead of 0.04 s), and doctor said nothing.
"""

from __future__ import annotations

import os

import pytest

from conftest import A100, offline_env
from fastpath_hooks._environ import cache_root, cache_root_from_environ, default_cache_root
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
