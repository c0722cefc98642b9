"""`fastpath-hooks download`, then an offline install from what it fetched.

A file:// PEP 503 index holds the fake kernel wheels (apache-tvm-ffi as per-Python cp311 and
cp312 builds, tilelang as an abi3 build, like the real ones) and the real einops/packaging;
the causal-conv1d release wheels sit behind FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL. The
download runs in a small venv for a posed Hopper machine; the wheelhouse it makes is then
the only source of a fresh venv's install, with every index pointed at a dead address.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import H100_OLD_TRITON, SMALL_CHECK
from support import guarded, venvs, wheels

from fastpath_hooks.facts import pins as pins_mod

DEAD_INDEX = "http://127.0.0.1:9/simple/"
PY = "cp311"

# slow: real venvs, real downloads into a wheelhouse (docs/development.md)
pytestmark = pytest.mark.slow


def causal_name(py: str) -> str:
    return f"causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-{py}-{py}-linux_x86_64.whl"


@pytest.fixture(scope="module")
def index(tmp_path_factory, dep_wheels):
    """(index URL, release-wheel directory, pins file) for the fakes."""
    base = tmp_path_factory.mktemp("download-index")
    pkgs, release = str(base / "pkgs"), str(base / "release")
    os.makedirs(pkgs)
    for name in os.listdir(dep_wheels):
        shutil.copy(os.path.join(dep_wheels, name), pkgs)
    wheels.fake_fla(pkgs, "0.6.0")
    pins = pins_mod.load()
    wheels.fake_flash_qla(pkgs, pins.kernel("flash-qla").releases[0].version)   # fla's backend on Hopper
    tilelang = wheels.fake_tilelang_from_pins(pkgs, "0.1.15", pins)
    os.rename(tilelang, os.path.join(pkgs, "tilelang-0.1.15-cp38-abi3-manylinux_2_17_x86_64.whl"))
    for version in ("0.1.12", "0.1.11", "0.1.15.post2"):
        for py in ("cp311", "cp312"):
            wheels.build_wheel(pkgs, "apache-tvm-ffi", version, {"tvm_ffi/__init__.py": f'__version__ = "{version}"\n'},
                               tag=f"{py}-{py}-manylinux_2_17_x86_64")
    digests = {}
    for py in ("cp311", "cp312"):
        path = wheels.fake_causal_conv1d(release, causal_name(py))
        digests[causal_name(py)] = wheels.sha256_of(path)
    url = wheels.simple_index(pkgs, str(base / "simple"))
    pins_file = base / "pins.json"
    pins_file.write_text(json.dumps({"kernels": {
        "tilelang": {"runtime_deps": []},
        # turned on (off by default on Hopper): downloaded with the rest; the gated-delta-rule checks at a size
        # the stand-ins compute in a moment on a CPU (what is downloaded is the subject here, not the check)
        "fla": {"warm": SMALL_CHECK},
        "flash-qla": {"pays": {"hazard": True}, "warm": SMALL_CHECK},
        "causal-conv1d": {"runtime_deps": [], "release": {"sha256": digests}}}}))
    return url, release, str(pins_file)


@pytest.fixture(scope="module")
def small_venv(tmp_path_factory, fastpath_wheel):
    return venvs.make_venv(str(tmp_path_factory.mktemp("download") / "venv"), torch_wheel=None,
                           fastpath_wheel=fastpath_wheel, transformers=None)


def download(venv, index, dest: str, target: str, cache: str):
    url, release, pins = index
    env = guarded.kernel_env(target=H100_OLD_TRITON, cache_dir=cache, offline=False, pins=pins,
                             FASTPATH_HOOKS_INDEX_URL=url,
                             FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL="file://" + release + "/")
    del env["FASTPATH_HOOKS_TARGET"]  # the target comes from --target
    return venv.cli("download", "--dest", dest, "--target", target, env=env)


def test_download_for_another_python_fetches_its_wheels(small_venv, index, tmp_path, dep_wheels):
    dest = str(tmp_path / "wh312")
    proc = download(small_venv, index, dest, H100_OLD_TRITON + ",python=3.12", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(os.listdir(dest)) == sorted([
        "apache_tvm_ffi-0.1.12-cp312-cp312-manylinux_2_17_x86_64.whl",
        "tilelang-0.1.15-cp38-abi3-manylinux_2_17_x86_64.whl",
        "fla_core-0.6.0-py3-none-any.whl", "flash_linear_attention-0.6.0-py3-none-any.whl",
        "flash_qla-0.1.3-py3-none-any.whl",
        *os.listdir(dep_wheels),  # einops, packaging (pure Python)
        causal_name("cp312"),
    ])
    assert f"FASTPATH_HOOKS_FIND_LINKS={dest} FASTPATH_HOOKS_OFFLINE=1" in proc.stdout


def test_offline_install_from_a_downloaded_wheelhouse(small_venv, index, tmp_path, make_venv, tmp_path_factory):
    dest = str(tmp_path / "wh")
    proc = download(small_venv, index, dest, H100_OLD_TRITON, str(tmp_path / "cache-dl"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = sorted(os.listdir(dest))
    assert "apache_tvm_ffi-0.1.12-cp311-cp311-manylinux_2_17_x86_64.whl" in got and causal_name(PY) in got
    assert not any("cp312" in f for f in got)

    venv = make_venv()
    before = venv.file_hashes()
    uv = guarded.uv_dir(str(tmp_path_factory.mktemp("uvbin")))
    env = guarded.kernel_env(target=H100_OLD_TRITON, cache_dir=str(tmp_path / "cache"), wheelhouse=dest,
                             installer="uv", uv=uv, pins=index[2],
                             PIP_INDEX_URL=DEAD_INDEX, UV_DEFAULT_INDEX=DEAD_INDEX, UV_INDEX_URL=DEAD_INDEX)
    proc = venv.cli("install", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for kernel in ("fla", "tilelang", "flash-qla", "causal-conv1d"):
        assert f"{kernel}: installed" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.count("verified in a child process") == 4
    assert guarded.kernel_versions(venv) == {
        "fla-core": "0.6.0", "flash-linear-attention": "0.6.0", "tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12",
        "causal-conv1d": "1.6.2.post1+cu12torch2.10cxx11abiTRUE"}
    assert venv.versions()["flash-qla"] == "0.1.3"   # fla's backend on Hopper, from the same wheelhouse
    assert venv.file_hashes() == before and "triton" not in before
    assert venv.pip_check() == "No broken requirements found."
