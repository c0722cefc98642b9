"""One way to get a wheel step's file (act/fetch.py), shared by the installer and `download`:
FASTPATH_HOOKS_FIND_LINKS first, then the wheel cache, then the URL; the sha256 checked; a failed
download names the kernel's own mirror variable and leaves nothing behind. Real files, file:// URLs."""
from __future__ import annotations

import os

import pytest

from fastpath_hooks.act import fetch as wheelcache
from fastpath_hooks.act.fetch import _fetch
from fastpath_hooks.act.fetch import FetchError, fetch_wheel
from fastpath_hooks.decide.plan import Step
from fastpath_hooks.facts.settings import Settings
from support import wheels

CAUSAL = "causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
MAMBA = "mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"


def _step(name: str, url: str | None, sha256: str | None = None) -> Step:
    return Step(kind="wheel", requirements=(name,), url=url, sha256=sha256)


def test_a_url_is_downloaded_into_dest_and_checked(tmp_path):
    src = wheels.fake_causal_conv1d(str(tmp_path / "release"), CAUSAL)
    dest = tmp_path / "dest"
    dest.mkdir()
    got = fetch_wheel(_step(CAUSAL, "file://" + src, wheels.sha256_of(src)), Settings(cache_dir=str(tmp_path / "c")),
                      str(dest))
    assert got == str(dest / CAUSAL) and wheels.sha256_of(got) == wheels.sha256_of(src)
    with pytest.raises(FetchError, match=r"not the pinned one \(sha256 differs\), refused"):
        fetch_wheel(_step(CAUSAL, "file://" + src, "0" * 64), Settings(cache_dir=str(tmp_path / "c")), str(dest))
    assert os.listdir(dest) == [], "a substituted download is removed"


@pytest.mark.parametrize("name,variable", [(CAUSAL, "FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL"),
                                           (MAMBA, "FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL"),
                                           ("fla_core-0.6.0-py3-none-any.whl", None)])
def test_a_failed_download_names_the_kernels_own_mirror_variable(tmp_path, name, variable):
    with pytest.raises(FetchError) as info:
        fetch_wheel(_step(name, f"file://{tmp_path}/missing/{name}"), Settings(cache_dir=str(tmp_path / "c")),
                    str(tmp_path))
    message = str(info.value)
    assert message.startswith(f"could not download file://{tmp_path}/missing/{name}")
    if variable is None:
        assert "WHEEL_URL" not in message
    else:
        assert f"({variable} points at a mirror)" in message and message.count("WHEEL_URL") == 1
    assert not os.path.exists(tmp_path / name)


def test_download_copies_from_find_links_and_the_cache_and_checks_them(tmp_path):
    house = str(tmp_path / "house")
    src = wheels.fake_causal_conv1d(house, CAUSAL)
    dest = str(tmp_path / "dest")
    os.makedirs(dest)
    settings = Settings(find_links=(house,), cache_dir=str(tmp_path / "c"))
    _fetch(_step(CAUSAL, "https://unreachable.invalid/" + CAUSAL, wheels.sha256_of(src)), dest, settings)
    assert os.listdir(dest) == [CAUSAL] and os.path.isfile(src), "copied; the wheelhouse keeps its file"
    with pytest.raises(FetchError, match=r"not the pinned one \(sha256 differs\), refused"):
        _fetch(_step(CAUSAL, None, "0" * 64), str(tmp_path / "other"), settings)
    # a cache entry (a file:// URL into the cache) is copied without the network, its recorded sha256 checked
    root = str(tmp_path / "cache")
    cached = wheelcache.store(root, src, meta={})
    dest2 = str(tmp_path / "dest2")
    os.makedirs(dest2)
    _fetch(_step(CAUSAL, "file://" + cached), dest2, Settings(cache_dir=root, offline=True))
    assert os.listdir(dest2) == [CAUSAL]
    with open(cached, "r+b") as fh:    # same size, other bytes
        data = bytearray(fh.read())
        data[-30] ^= 0xFF
        fh.seek(0)
        fh.write(bytes(data))
    with pytest.raises(FetchError, match=r"cached causal-conv1d wheel altered \(sha256 differs\), refused; "
                                         "fastpath-hooks cache clear removes it"):
        _fetch(_step(CAUSAL, "file://" + cached), str(tmp_path / "dest3"), Settings(cache_dir=root, offline=True))


# -- `download` asks only for the wheels the target's glibc loads (issue 40) ------------------------

@pytest.mark.parametrize("glibc,version", [("2.28", "1.0"), ("2.34", "2.0"), ("2.17", "0.9")])
def test_download_fetches_only_wheels_the_targets_glibc_can_load(glibc, version, tmp_path, monkeypatch):
    """A real `pip download` from a file:// index holding one release per manylinux level: the newest whose
    glibc the target has is fetched - never a manylinux_2_34 wheel for a glibc 2.28 machine."""
    from fastpath_hooks.act.fetch import fetch_into
    from support.worlds import environment

    pkgs = str(tmp_path / "pkgs")
    for v, tag in (("0.9", "manylinux2014_x86_64"), ("1.0", "manylinux_2_28_x86_64"), ("2.0", "manylinux_2_34_x86_64")):
        wheels.build_wheel(pkgs, "glibc-probe", v, {"glibc_probe/__init__.py": ""}, tag=f"py3-none-{tag}")
    url = wheels.simple_index(pkgs, str(tmp_path / "simple"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)     # only the index given here
    monkeypatch.setenv("FASTPATH_HOOKS_LOG", "debug")
    got = fetch_into(str(tmp_path / "dest"), env=environment(glibc=glibc, arch="x86_64"),
                     settings=Settings(index_url=url, cache_dir=str(tmp_path / "c")), binary=["glibc-probe"], wheels=())
    assert [os.path.basename(p).split("-")[1] for p in got] == [version]
