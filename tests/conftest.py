"""Shared fixtures: fake kernel wheels, real venvs, a test pins file, posed targets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import venvs, wheels  # noqa: E402

PY = f"cp{sys.version_info[0]}{sys.version_info[1]}"
# Pose as machines this CPU host is not. torch is posed at 2.10 so causal-conv1d has a release wheel name.
A100 = "gpu=sm_80,cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=yes"
H100_OLD_TRITON = "gpu=sm_90,cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=yes"
H100_NEW_TRITON = "gpu=sm_90,cuda=12.8,torch=2.10.0,triton=3.7.1,nvcc=yes"
CAUSAL_WHEEL = f"causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-{PY}-{PY}-linux_x86_64.whl"
# The gated-delta-rule check (pins `warm`) at a size a CPU computes in a moment (the stand-ins run there).
SMALL_CHECK = {"check_seq": 16, "tune_seq": 32, "heads": [1, 2], "dims": [128, 128]}


# Fixtures that make real venvs, build wheels or fetch from the index: a test using one is slow (minutes in
# all, and not offline). The fast subset, `pytest -m "not slow"`, must stay fast and offline, so such a test
# fails unless it is marked slow, instead of silently making the subset slow.
SLOW_FIXTURES = frozenset({"torch_wheel", "fastpath_wheel", "dep_wheels", "make_wheelhouse", "make_venv"})


def pytest_collection_modifyitems(session, config, items):
    """Parallel runs (pytest-xdist, `-n N --dist loadscope`, what .ci/run does) hand each module to one worker
    whole (module-scoped venvs and scenarios are made once, a module's last test checks what the others left),
    in the order the modules come: the modules with the most slow tests first, so that no long module starts
    last; the fast ones after them."""
    slow_count: dict = {}
    for item in items:
        if item.get_closest_marker("slow") is not None:
            module = item.nodeid.split("::", 1)[0]
            slow_count[module] = slow_count.get(module, 0) + 1
    items.sort(key=lambda item: -slow_count.get(item.nodeid.split("::", 1)[0], 0))   # stable: a module keeps its order


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("slow") is not None:
        return
    heavy = sorted(SLOW_FIXTURES.intersection(item.fixturenames))
    if item.get_closest_marker("network") is not None:
        heavy.append("the network")
    if heavy:
        pytest.fail(f"{item.nodeid} uses {', '.join(heavy)}: mark it slow (@pytest.mark.slow, or pytestmark = "
                    "pytest.mark.slow for the whole module)", pytrace=False)


@pytest.fixture
def toolkit(tmp_path):
    """A fake CUDA 13.0 toolkit (tests/support/sdists.py): nvcc records what it is asked to compile."""
    from support import sdists

    return sdists.fake_cuda_toolkit(str(tmp_path / "cuda"), release="13.0")


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory):
    """One directory per test run for what the whole run shares (wheels fetched or built once): the
    parent of every xdist worker's base directory, so that parallel workers share it too."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "artifacts"
    path.mkdir(exist_ok=True)
    return str(path)


def made_once(artifacts: str, name: str, make) -> str:
    """`make(path)` run once per test run for `artifacts/name`, whichever worker asks first (the others
    wait on its lock and then reuse it); a make that failed is tried again by the next asker."""
    from filelock import FileLock

    path = os.path.join(artifacts, name)
    with FileLock(path + ".lock"):
        if not os.path.exists(path + ".done"):
            shutil.rmtree(path, ignore_errors=True)
            make(path)
            with open(path + ".done", "w"):
                pass
    return path


def _download(dest: str, *names: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", dest,
                    *names], check=True, env=venvs.clean_env())


@pytest.fixture(scope="session")
def build_dep_wheels(artifacts):
    """Real wheel, ninja, packaging and einops wheels (what the stand-in sdists' builds and mamba_ssm's
    import need), fetched once per run."""
    return made_once(artifacts, "build-deps", lambda dest: _download(dest, "wheel", "ninja", "packaging", "einops"))


@pytest.fixture(scope="session")
def torch_wheel(artifacts):
    """The CPU torch 2.13.0 wheel (the one on this machine's disk, or downloaded once per run)."""
    from filelock import FileLock

    with FileLock(os.path.join(artifacts, "torch.lock")):
        return venvs.find_torch_wheel(os.path.join(artifacts, "torch"))


@pytest.fixture(scope="session")
def fastpath_wheel(artifacts):
    dist = made_once(artifacts, "dist", venvs.build_fastpath_wheel)
    return venvs.newest_fastpath_wheel(dist)


@pytest.fixture(scope="session")
def dep_wheels(artifacts):
    """Real einops and packaging wheels (fla's runtime deps), fetched once per run from the index."""
    return made_once(artifacts, "deps", lambda dest: _download(dest, "einops", "packaging"))


@pytest.fixture
def make_wheelhouse(tmp_path, dep_wheels):
    """make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi="0.1.12", causal=True, ...) -> directory."""
    counter = {"n": 0}

    def make(*, fla=None, fla_broken=None, fla_padding=0, tilelang=None, tvm_ffi=(), causal=False,
             causal_crash=False, tilelang_abort=False, deps=True, flash_qla=None):
        counter["n"] += 1
        dest = str(tmp_path / f"wheelhouse{counter['n']}")
        os.makedirs(dest)
        if deps:
            for name in os.listdir(dep_wheels):
                os.link(os.path.join(dep_wheels, name), os.path.join(dest, name))
        if fla:
            wheels.fake_fla(dest, fla, broken=fla_broken, padding_files=fla_padding)
        if isinstance(tvm_ffi, str):
            tvm = [tvm_ffi]
        else:
            tvm = list(tvm_ffi)
        for v in tvm:
            wheels.fake_tvm_ffi(dest, v)
        if tilelang:
            from fastpath_hooks.facts import pins as pins_mod

            if tilelang_abort:
                wheels.fake_tilelang(dest, tilelang, always_abort=True)
            else:
                wheels.fake_tilelang_from_pins(dest, tilelang, pins_mod.load())
        if causal:
            wheels.fake_causal_conv1d(dest, CAUSAL_WHEEL, crash=causal_crash)
        if flash_qla:   # its mode: ok, jit, import, wrong (tests/support/wheels.py fake_flash_qla)
            wheels.fake_flash_qla(dest, mode=flash_qla)
        return dest

    return make


@pytest.fixture
def test_pins(tmp_path):
    """A FASTPATH_HOOKS_PINS file for the fakes: no heavy tilelang deps, the fake causal wheel's real hash, and
    the gated-delta-rule check at a size the stand-ins compute in a moment on a CPU (one key head, two value
    heads, K = V = 128: what fla sends to flash-qla)."""

    def make(wheelhouse: str | None = None, extra: dict | None = None, flash_qla_on: bool = True) -> str:
        # flash-qla is off by default on Hopper (measured not to pay at small sizes: pins pays.hazard); the tests
        # of its install path turn it on as a user does, with a FASTPATH_HOOKS_PINS file
        data = {
            "kernels": {
                "tilelang": {"runtime_deps": []},
                "causal-conv1d": {"runtime_deps": []},
                "fla": {"warm": SMALL_CHECK},
                "flash-qla": {"warm": SMALL_CHECK, **({"pays": {"hazard": True}} if flash_qla_on else {})},
            }
        }
        if wheelhouse and os.path.exists(os.path.join(wheelhouse, CAUSAL_WHEEL)):
            data["kernels"]["causal-conv1d"]["release"] = {
                "sha256": {CAUSAL_WHEEL: wheels.sha256_of(os.path.join(wheelhouse, CAUSAL_WHEEL))}}
        if extra:
            from fastpath_hooks.facts.pins import _merge

            data = _merge(data, extra, (), {})
        path = str(tmp_path / f"pins-{len(os.listdir(tmp_path))}.json")
        with open(path, "w") as fh:
            json.dump(data, fh)
        return path

    return make


@pytest.fixture
def make_venv(tmp_path, torch_wheel, fastpath_wheel):
    counter = {"n": 0}

    def make(*, transformers="latest", torch=True, fastpath=True, extra=()):
        counter["n"] += 1
        return venvs.make_venv(str(tmp_path / f"venv{counter['n']}"), torch_wheel=torch_wheel if torch else None,
                               fastpath_wheel=fastpath_wheel if fastpath else None, transformers=transformers,
                               extra=extra)

    return make


def offline_env(wheelhouse: str, target: str, *, cache_dir: str, pins: str | None = None, **extra) -> dict:
    """The environment of a process that poses as `target` and installs only from `wheelhouse`."""
    env = venvs.clean_env(FASTPATH_HOOKS_FIND_LINKS=wheelhouse, FASTPATH_HOOKS_OFFLINE="1",
                          FASTPATH_HOOKS_TARGET=target, FASTPATH_HOOKS_CACHE_DIR=cache_dir, **extra)
    if pins:
        env["FASTPATH_HOOKS_PINS"] = pins
    return env
