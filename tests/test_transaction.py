"""The install transaction: begin / rollback / commit on real site directories, and crash recovery.

Distributions are installed by real pip (`--target` into a temporary site directory, or
into a venv); every "restored" claim is checked file by file, bytes included.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import zipfile

import pytest
from conftest import A100
from support import guarded, venvs, wheels
from support.processes import processes_with

from fastpath_hooks.act.transaction import JOURNAL, Transaction, recover

STATE = ".fastpath-hooks"
FLA = ("fla-core", "flash-linear-attention")

# slow: real pip installs of real wheels into real directories, processes killed mid-install
pytestmark = pytest.mark.slow


def tree(site: str) -> dict:
    """relative path -> sha256 of every file (and symlink target) under `site`, the state directory left out."""
    out = {}
    for root, dirs, files in os.walk(site):
        if root == site:
            dirs[:] = [d for d in dirs if d != STATE]
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, site)
            if os.path.islink(path):
                out[rel] = "link:" + os.readlink(path)
            else:
                with open(path, "rb") as fh:
                    out[rel] = hashlib.sha256(fh.read()).hexdigest()
        for name in dirs:
            if not os.listdir(os.path.join(root, name)):
                out[os.path.relpath(os.path.join(root, name), site) + "/"] = "empty dir"
    return out


def pip_install(venv, *wheel_files: str) -> None:
    subprocess.run([venv.python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheel_files], check=True,
                   env=venvs.clean_env(), capture_output=True, text=True)


def version_of(site: str, dist: str) -> list:
    prefix = dist.replace("-", "_") + "-"
    return sorted(e[len(prefix):-len(".dist-info")] for e in os.listdir(site)
                  if e.startswith(prefix) and e.endswith(".dist-info"))


@pytest.fixture
def fla_wheels(tmp_path):
    old = wheels.fake_fla(str(tmp_path / "old"), "0.5.2")
    new = wheels.fake_fla(str(tmp_path / "new"), "0.6.0", padding_files=20)
    return old, new


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    v = venvs.make_venv(str(tmp_path_factory.mktemp("template") / "venv"), torch_wheel=None, fastpath_wheel=None,
                        transformers=None)
    subprocess.run([v.python, "-m", "compileall", "-q", os.path.join(v.site, "pip")], check=True, capture_output=True,
                   env=venvs.clean_env())
    return v


@pytest.fixture
def venv(template, tmp_path):
    """A small real venv (pip, no torch), copied from the module's template."""
    path = str(tmp_path / "venv")
    shutil.copytree(template.path, path, symlinks=True)
    return venvs.Venv(path)


@pytest.fixture
def site(venv, fla_wheels, dep_wheels):
    """The venv's site-packages with fla 0.5.2 and einops (a bystander no step names), installed by pip."""
    pip_install(venv, *fla_wheels[0], *(os.path.join(dep_wheels, f) for f in os.listdir(dep_wheels) if "einops" in f))
    return venv.site


def new_tx(site: str, names=FLA) -> Transaction:
    prefix = os.path.dirname(os.path.dirname(os.path.dirname(site)))  # <prefix>/lib/pythonX.Y/site-packages
    return Transaction(os.path.join(site, STATE), site, names, description="test", prefix=prefix)


def assert_clean_state(site: str) -> None:
    assert os.listdir(os.path.join(site, STATE)) == []  # no journal, no backup left


def test_rollback_restores_a_replaced_distribution_byte_for_byte(venv, site, fla_wheels):
    before = tree(site)
    tx = new_tx(site)
    tx.begin()
    assert os.path.exists(os.path.join(site, STATE, JOURNAL))
    pip_install(venv, *fla_wheels[1])
    assert version_of(site, "fla-core") == ["0.6.0"] and tree(site) != before
    done = tx.rollback()
    assert tree(site) == before
    assert "restored fla-core 0.5.2" in done and "removed fla-core 0.6.0" in done
    assert not any("einops" in d for d in done)  # the bystander was never touched
    assert_clean_state(site)


def test_rollback_removes_a_new_distribution(venv, fla_wheels):
    site = venv.site
    before = tree(site)
    tx = new_tx(site)
    tx.begin()
    pip_install(venv, *fla_wheels[1])
    assert version_of(site, "fla-core") == ["0.6.0"]
    done = tx.rollback()
    assert tree(site) == before
    assert "removed fla-core 0.6.0" in done and "removed flash-linear-attention 0.6.0" in done
    assert_clean_state(site)


def test_commit_keeps_the_new_state_and_drops_the_backup(venv, site, fla_wheels):
    tx = new_tx(site)
    tx.begin()
    pip_install(venv, *fla_wheels[1])
    after = tree(site)
    tx.commit()
    assert tree(site) == after and version_of(site, "fla-core") == ["0.6.0"]
    assert_clean_state(site)


def _extract_part(wheel: str, site: str, fraction: float) -> list:
    """What a killed installer leaves: part of a wheel's package files and its metadata, but no
    RECORD (an installer writes it last)."""
    with zipfile.ZipFile(wheel) as zf:
        files = [m for m in zf.namelist() if ".dist-info/" not in m]
        meta = [m for m in zf.namelist() if ".dist-info/" in m and not m.endswith("/RECORD")]
        part = files[: max(1, int(len(files) * fraction))] + meta
        zf.extractall(site, members=part)
    return part


def test_rollback_removes_orphans_of_a_half_extracted_install(site, fla_wheels):
    before = tree(site)
    tx = new_tx(site)
    tx.begin()
    core_new = fla_wheels[1][0]
    part = _extract_part(core_new, site, 0.6)
    # files inside the existing fla/ package, and a second fla-core dist-info without a RECORD
    assert any(p.startswith("fla/_padding/") for p in part)
    assert os.path.isdir(os.path.join(site, "fla_core-0.6.0.dist-info"))
    assert version_of(site, "fla-core") == ["0.5.2", "0.6.0"]
    # a stray file in an existing directory that no RECORD lists (e.g. written by a build step)
    with open(os.path.join(site, "fla", "ops", "stray.py"), "w") as fh:
        fh.write("X = 1\n")
    tx.rollback()
    assert tree(site) == before
    assert_clean_state(site)


def test_rollback_restores_both_dist_info_dirs_that_were_there_before(venv, site, fla_wheels, tmp_path):
    # An earlier crash (before fastpath-hooks kept journals) left two fla-core dist-info directories.
    stale = tmp_path / "stale"
    with zipfile.ZipFile(fla_wheels[1][0]) as zf:
        zf.extractall(stale, members=[m for m in zf.namelist() if m.startswith("fla_core-0.6.0.dist-info/")])
    shutil.copytree(stale / "fla_core-0.6.0.dist-info", os.path.join(site, "fla_core-0.6.0.dist-info"))
    assert version_of(site, "fla-core") == ["0.5.2", "0.6.0"]
    before = tree(site)
    tx = new_tx(site)
    tx.begin()
    shutil.rmtree(os.path.join(site, "fla_core-0.6.0.dist-info"))  # so pip sees one fla-core and replaces it
    pip_install(venv, *fla_wheels[1])
    tx.rollback()
    assert tree(site) == before
    assert_clean_state(site)


def test_an_untouched_distribution_is_left_alone(venv, site, fla_wheels):
    # named in the steps but not changed by them (e.g. packaging, already satisfied): not removed and re-copied
    tx = new_tx(site, names=FLA + ("einops",))
    tx.begin()
    einops_dir = [e for e in os.listdir(site) if e.startswith("einops-")][0]
    inode = os.stat(os.path.join(site, einops_dir, "METADATA")).st_ino
    pip_install(venv, *fla_wheels[1])
    done = tx.rollback()
    assert os.stat(os.path.join(site, einops_dir, "METADATA")).st_ino == inode
    assert not any("einops" in d for d in done)


def test_rollback_of_a_new_distribution_keeps_a_file_it_shares_with_another(venv, tmp_path):
    # nvidia-* wheels all ship the namespace file nvidia/__init__.py: a failed nvidia-cuda-nvcc install
    # must not take it away from the nvidia-cuda-cccl the user already has.
    wh = str(tmp_path / "nvidia")
    cccl = wheels.build_wheel(wh, "nvidia-cuda-cccl", "13.0.50",
                              {"nvidia/__init__.py": "", "nvidia/cuda_cccl/__init__.py": "CCCL = True\n"})
    nvcc = wheels.build_wheel(wh, "nvidia-cuda-nvcc", "13.0.48",
                              {"nvidia/__init__.py": "", "nvidia/cuda_nvcc/__init__.py": "NVCC = True\n"})
    pip = [venv.python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile"]
    subprocess.run(pip + [cccl], check=True, env=venvs.clean_env(), capture_output=True)
    before = tree(venv.site)
    tx = new_tx(venv.site, names=("nvidia-cuda-nvcc",))
    tx.begin()
    subprocess.run(pip + [nvcc], check=True, env=venvs.clean_env(), capture_output=True)
    assert version_of(venv.site, "nvidia-cuda-nvcc") == ["13.0.48"]
    done = tx.rollback()
    assert "removed nvidia-cuda-nvcc 13.0.48" in done
    assert tree(venv.site) == before  # nvidia/__init__.py included
    assert venv.run("import nvidia.cuda_cccl as m; print(m.CCCL)", env=venvs.clean_env()).stdout.strip() == "True"
    assert_clean_state(venv.site)


def test_bytecode_caches_written_meanwhile_stay_only_for_existing_sources(site):
    cache = os.path.join(site, "einops", "__pycache__")
    kept = [f for f in os.listdir(cache) if f.startswith("__init__.")][0]
    data = open(os.path.join(cache, kept), "rb").read()
    os.unlink(os.path.join(cache, kept))
    tx = new_tx(site)
    tx.begin()
    # another process imports einops meanwhile (writes its cache); a module that is gone leaves one too
    for name in (kept, "gone.cpython-311.pyc"):
        with open(os.path.join(cache, name), "wb") as fh:
            fh.write(data)
    tx.rollback()
    assert sorted(f for f in os.listdir(cache) if f in (kept, "gone.cpython-311.pyc")) == [kept]


def test_recover_drops_an_unreadable_journal_and_stale_backups(site):
    state = os.path.join(site, STATE)
    os.makedirs(os.path.join(state, "backup-0123456789ab"))
    os.makedirs(os.path.join(state, "work-0123456789ab", "pip-unpack-x"))  # a killed run's scratch
    before = tree(site)
    assert recover(state) == []  # no journal: the stale backup (a crash inside begin()) and work dir go
    assert os.listdir(state) == []
    with open(os.path.join(state, JOURNAL), "w") as fh:
        fh.write("{ not json")
    recover(state)
    assert tree(site) == before and os.listdir(state) == []


# -- a real crash: fastpath-hooks killed while pip replaces fla ----------------------------------

def _processes_under(path: str) -> list:
    return processes_with(path)


def test_a_journal_left_by_a_killed_install_is_rolled_back_by_recover(tmp_path, fastpath_wheel, dep_wheels):
    venv = venvs.make_venv(str(tmp_path / "venv"), torch_wheel=None, fastpath_wheel=fastpath_wheel, transformers=None)
    old = wheels.fake_fla(str(tmp_path / "old"), "0.5.2")
    wh = str(tmp_path / "wheelhouse")
    wheels.fake_fla(wh, "0.6.0", padding_files=3000)  # big enough that extraction takes a while
    for name in os.listdir(dep_wheels):
        shutil.copy(os.path.join(dep_wheels, name), wh)
    subprocess.run([venv.python, "-m", "pip", "install", "-q", "--no-deps", *old,
                    *(os.path.join(wh, f) for f in os.listdir(wh) if f.startswith("einops"))],
                   check=True, env=venvs.clean_env(), capture_output=True)
    shutil.rmtree(os.path.join(venv.site, STATE), ignore_errors=True)
    before = tree(venv.site)
    bin_before = sorted(os.listdir(venv.bin))
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps({"kernels": {"tilelang": {"runtime_deps": []}, "causal-conv1d": {"runtime_deps": []}}}))
    # triton 3.9 (posed): fla 0.5.2 does not import there, so fastpath-hooks replaces it with 0.6.0 using pip
    env = guarded.kernel_env(target=A100.replace("triton=3.6.0", "triton=3.9.0"), cache_dir=str(tmp_path / "cache"),
                             wheelhouse=wh, installer="pip", pins=str(pins),
                             PYTHONDONTWRITEBYTECODE="1")  # byte-for-byte below: no caches of fastpath_hooks itself
    proc = subprocess.Popen([os.path.join(venv.bin, "fastpath-hooks"), "install", "fla"], env=env, cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    padding = os.path.join(venv.site, "fla", "_padding")
    deadline = time.monotonic() + 240
    try:
        # kill it when pip has stashed the old fla (a `~la...` directory) and written part of the new one
        while time.monotonic() < deadline and proc.poll() is None:
            stash = [e for e in os.listdir(venv.site) if e.startswith("~")]
            if stash and os.path.isdir(padding) and len(os.listdir(padding)) > 20:
                break
            time.sleep(0.002)
        assert proc.poll() is None, proc.stdout.read().decode()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # pip runs in its own session: it outlives its killed parent, still writing; its process group is
    # in the journal, and recover() (the next lock holder) kills it before restoring anything
    state = os.path.join(venv.site, STATE)
    assert [e for e in os.listdir(venv.site) if e.startswith("~")]  # the crash left pip's stash ...
    assert tree(venv.site) != before                                # ... and a half-replaced fla
    pending = Transaction.pending(state)
    assert pending is not None and pending.group["pgid"] != proc.pid
    assert {k: pending.before[k] for k in FLA} == {"fla-core": "0.5.2", "flash-linear-attention": "0.5.2"}
    done = recover(state)
    assert _processes_under(venv.path) == []
    assert any("stash" in d for d in done), done
    assert tree(venv.site) == before
    time.sleep(0.5)
    assert tree(venv.site) == before   # nothing writes behind the rollback
    assert sorted(os.listdir(venv.bin)) == bin_before
    assert Transaction.pending(state) is None and [e for e in os.listdir(state) if e.startswith("backup-")] == []
    assert venv.run("import fla; print(fla.__version__)", env=venvs.clean_env(FASTPATH_HOOKS_DISABLE="1"),
                    check=True).stdout.strip() == "0.5.2"
