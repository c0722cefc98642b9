"""The guarded installer and its transaction in milliseconds: the real `install` (allow-list,
constraints, a check after every step, the journal, backup and exact rollback, the verification
child) and a stand-in installer that writes into a temporary site directory on sys.path
(tests/support/fake_uv.py) instead of downloading and unpacking with pip or uv.
tests/test_installer.py and tests/test_transaction.py run the same protections with real pip and
uv in real venvs (slow)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from fastpath_hooks.act.installer import InstallError, install as run_install
from fastpath_hooks.act.transaction import JOURNAL, Transaction, recover
from fastpath_hooks.decide.policy import Commands, decide
from fastpath_hooks.facts.settings import Settings
from support.fake_uv import install_fake_uv
from support.worlds import PINS, environment, write_dist_info

FLA = {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}


def tree(site: str) -> dict:
    """relative path -> content of every file under `site` (what a rollback must give back exactly)."""
    out = {}
    for root, _, files in os.walk(site):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, site)] = fh.read()
    return out


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("FAKE_UV_SITE", str(site))
    monkeypatch.setenv("FAKE_UV_LOG", str(tmp_path / "uv.log"))
    monkeypatch.setenv("PYTHONPATH", str(site))      # the verification child imports from it
    return str(site)


def install(tmp_path, site, decision, spec=None):
    """A batch of one; `spec`: the kernel's import check (none without one); InstallError when it failed."""
    env = environment(uv=install_fake_uv(str(tmp_path / "bin")))
    pins = PINS if spec is None else dataclasses.replace(PINS, kernels={**PINS.kernels, decision.kernel: spec})
    settings = Settings(installer="uv", offline=True, find_links=(str(tmp_path),))
    done = run_install([decision], settings=settings, env=env, pins=pins, commands=Commands.of(settings, env, pins),
                       state_dir=str(tmp_path / "state"), site=site, verify=spec is not None)
    if decision.kernel in done.failed:
        raise InstallError(done.failed[decision.kernel])
    return done.results[decision.kernel]


def fla_install(**dists):
    decision = decide(environment(dists), Settings(), PINS)["fla"]
    assert decision.acts and dict(decision.target) == FLA, decision
    return decision


def calls(tmp_path) -> list:
    with open(tmp_path / "uv.log", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_an_install_commits_pins_what_it_does_not_name_and_reports_what_changed(tmp_path, site):
    result = install(tmp_path, site, fla_install())
    assert dict(result.installed) == FLA and result.installer == "uv"
    assert {n for n in os.listdir(site) if n.endswith(".dist-info")} == \
        {"fla_core-0.6.0.dist-info", "flash_linear_attention-0.6.0.dist-info"}
    assert not os.path.exists(tmp_path / "state" / JOURNAL) and not [
        n for n in os.listdir(tmp_path / "state") if n.startswith(("backup-", "work-"))], "committed: nothing left"
    found, _ = result.scan
    assert found["fla-core"].version == "0.6.0" and found["fla-core"].site == site   # the engine settles from this
    (call,) = calls(tmp_path)
    assert call["requirements"] == ["fla-core==0.6.0", "flash-linear-attention==0.6.0"]
    assert "--no-deps" in call["argv"] and "--no-index" in call["argv"]
    assert any(line.startswith("torch==") for line in call["constraints"]), "protected torch pinned"
    assert not any(line.startswith(("fla-core==", "flash-linear-attention==")) for line in call["constraints"])


def test_a_failed_step_restores_site_packages_exactly(tmp_path, site, monkeypatch):
    mixed = {"fla-core": "0.5.2", "flash-linear-attention": "0.6.0"}     # versions differ: the policy repairs
    for name, version in mixed.items():
        write_dist_info(site, name, version, {f"{name.replace('-', '_')}_old/__init__.py": "old = True\n"})
    before = tree(site)
    monkeypatch.setenv("FAKE_UV_FAIL", "flash-linear-attention")   # fla-core replaced, then a half-written one
    with pytest.raises(InstallError, match="disk quota exceeded"):
        install(tmp_path, site, fla_install(**mixed))
    assert tree(site) == before
    assert not os.path.exists(tmp_path / "state" / JOURNAL)


def test_a_distribution_off_the_allow_list_is_refused_and_rolled_back(tmp_path, site, monkeypatch):
    before = tree(site)
    monkeypatch.setenv("FAKE_UV_ALSO", "left-pad==1.0")
    with pytest.raises(InstallError, match=r"changed left-pad \(absent -> 1.0\), which is not on the pins' allow-list"):
        install(tmp_path, site, fla_install())
    assert tree(site) == before


def test_a_protected_distribution_the_installer_changes_is_refused_and_rolled_back(tmp_path, site, monkeypatch):
    before = tree(site)
    monkeypatch.setenv("FAKE_UV_ALSO", "transformers==9.9.9")   # shadows the real one: first on sys.path
    with pytest.raises(InstallError, match="the installer changed protected transformers"):
        install(tmp_path, site, fla_install())
    assert tree(site) == before


def test_the_kernel_is_verified_in_a_child_process_before_it_commits(tmp_path, site):
    decision = fla_install()
    good = dataclasses.replace(PINS.kernel("fla"), verify_modules=("fla_core_module",), verify_attributes=())
    result = install(tmp_path, site, decision, spec=good)
    assert dict(result.installed) == FLA
    for name in FLA:   # uninstall by hand, then a check that fails: rolled back, nothing left
        for entry in os.listdir(site):
            if entry.startswith(name.replace("-", "_")):
                import shutil

                shutil.rmtree(os.path.join(site, entry))
    before = tree(site)
    bad = dataclasses.replace(good, verify_modules=("fla_core_module", "no_such_module"))
    with pytest.raises(InstallError, match="verification failed: .*ModuleNotFoundError: No module named 'no_such_module'"):
        install(tmp_path, site, decision, spec=bad)
    assert tree(site) == before


def test_a_journal_left_by_a_killed_install_is_rolled_back_by_the_next_run(tmp_path, site):
    write_dist_info(site, "fla-core", "0.5.2", {"fla_old/__init__.py": "old = True\n"})
    before = tree(site)
    state = str(tmp_path / "state")
    tx = Transaction(state, site, ["fla-core"], description="install fla")
    tx.begin()                                   # then the process is killed half-way through the install:
    install_fake_uv(str(tmp_path / "bin"))
    from support.fake_uv import _write

    _write(site, "fla-core", "0.6.0")
    _write(site, "flash-linear-attention", "0.6.0", half=True)
    assert os.path.exists(os.path.join(state, JOURNAL))
    done = recover(state)                        # the next run, under the lock
    assert "restored fla-core 0.5.2" in done and tree(site) == before
    assert not os.path.exists(os.path.join(state, JOURNAL)) and not os.listdir(state)


def test_constraints_keep_kernels_and_huggingface_hub_as_installed():
    """transformers 5.25 requires kernels 0.19.x and huggingface-hub 2.4+: a kernel install never changes them
    (protected, so pinned first in every constraints file, even where a step names them) - a --no-deps 5.25
    without them would break every from_pretrained."""
    from fastpath_hooks.decide.plan import constraints

    installed = {"torch": "2.13.0+cpu", "transformers": "5.25.0", "kernels": "0.19.1", "huggingface-hub": "2.4.0",
                 "einops": "0.8.2"}
    lines = constraints(installed, PINS.protected, ["kernels", "huggingface-hub", "einops"])
    assert {"kernels==0.19.1", "huggingface-hub==2.4.0"} <= set(lines[:4]) and "einops==0.8.2" not in lines
    assert {"kernels", "huggingface-hub"} <= set(PINS.protected) and not {"kernels", "huggingface-hub"} & PINS.allowed
