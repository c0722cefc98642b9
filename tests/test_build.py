"""Source builds on a CPU machine, for real: a stand-in causal-conv1d sdist whose setup.py
compiles with the nvcc torch's ninja build would use, a fake CUDA toolkit found through
CUDA_HOME (the probe's own discovery), the GPU posed by FASTPATH_HOOKS_TARGET, real pip
building and installing into real venvs, the wheel cache shared through
FASTPATH_HOOKS_CACHE_DIR, `fastpath-hooks build --dest` serving an offline wheelhouse.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import PY, offline_env
from support import sdists
from support.venvs import clean_env
from fastpath_hooks.facts.wheels import sha256_of

# torch 2.13 has no causal-conv1d release wheel: only a build can bring it
HOPPER = "gpu=sm_90,cuda=13.0,torch=2.13.0,cpus=16"
BUILD_HOST = "cuda=13.0,torch=2.13.0,cpus=16"       # no GPU here: `build --arch` names it


@pytest.fixture
def sdist_house(tmp_path, build_dep_wheels):
    """An offline wheelhouse: the causal-conv1d sdist and what building it needs."""
    house = str(tmp_path / "sdists")
    sdists.causal_conv1d_sdist(house)
    for name in os.listdir(build_dep_wheels):
        os.link(os.path.join(build_dep_wheels, name), os.path.join(house, name))
    return house


def _env(house, target, toolkit, cache, pins, **extra):
    return offline_env(house, target, cache_dir=cache, pins=pins, CUDA_HOME=toolkit.home, **extra)


def _import_conv(venv, env=None) -> dict:
    code = ("import json, causal_conv1d as c, importlib.metadata as m\n"
            "print(json.dumps({'version': m.version('causal-conv1d'), 'fn': callable(c.causal_conv1d_fn)}))")
    proc = venv.run(code, env=env or clean_env(FASTPATH_HOOKS_DISABLE="1"))
    return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr.strip().splitlines()[-1]}


def _cached(cache) -> list:
    where = os.path.join(cache, "wheels")
    return sorted(os.listdir(where)) if os.path.isdir(where) else []


@pytest.mark.slow
def test_build_hands_nvcc_only_the_visible_arch_and_a_second_env_installs_from_the_cache(
        make_venv, toolkit, sdist_house, tmp_path, test_pins):
    cache = str(tmp_path / "shared-cache")
    env = _env(sdist_house, HOPPER, toolkit, cache, test_pins())
    first = make_venv(transformers=None)
    proc = first.cli("install", "causal-conv1d", env=env)
    assert proc.returncode == 0, proc.stderr
    # up front: a build for sm_90 only, with its estimate
    assert re.search(r"causal-conv1d: building - from source for sm_90, an estimated \d+ (s|min) "
                     r"\(ahead of time: fastpath-hooks build causal-conv1d\)", proc.stderr), proc.stderr
    calls = toolkit.calls()
    assert len(calls) == 3, calls                                   # the three .cu files
    assert all(sdists.gencode_codes(argv) == ["sm_90"] for argv in calls), calls
    # the log is kept, named in the messages, and holds the compiler's run
    logs = {p.replace("$FASTPATH_HOOKS_CACHE_DIR", cache) for p in re.findall(r"log: (\S+\.log)", proc.stderr)}
    assert len(logs) == 1
    log = logs.pop()
    assert os.path.isfile(log) and log.startswith(cache)
    text = open(log).read()
    assert "compiling csrc/causal_conv1d_fwd.cu" in text
    # the wrapper says what it did, in the log: the sm_90 pair kept, the sdist's eight others dropped
    kept = re.findall(r"fastpath-hooks nvcc wrapper: kept (\S+); dropped (.*)", text)
    assert len(kept) == 3 and {k for k, _ in kept} == {"arch=compute_90,code=sm_90"}
    assert all(len(d.split()) == 8 and "code=sm_120" in d for _, d in kept)
    assert "the build never ran the arch-restricting nvcc wrapper" not in proc.stderr
    # each compile's record is kept beside the log (the work directory goes): its source and the argv
    # the real nvcc got, restricted
    from fastpath_hooks.act import build as nvcc_speed

    with open(nvcc_speed.calls_path(log)) as fh:
        records = [json.loads(line) for line in fh]
    assert sorted(os.path.basename(r["source"]) for r in records) == sorted(
        os.path.basename(a) for argv in calls for a in argv if a.endswith(".cu"))
    assert all(r["code"] == 0 and sdists.gencode_codes(r["argv"]) == ["sm_90"] for r in records), records
    built = "causal_conv1d-1.6.2.post1+fph.torch2.13.0.cu130.abi1.sm90"
    assert _import_conv(first) == {"version": "1.6.2.post1+fph.torch2.13.0.cu130.abi1.sm90", "fn": True}
    assert [n for n in _cached(cache) if n.endswith(".whl")] == [n for n in _cached(cache) if n.startswith(built)][:1]
    assert any(n.startswith(built) and n.endswith(".whl.json") for n in _cached(cache))

    # another environment on the machine: from the cache, no compiler run, in seconds
    second = make_venv(transformers=None)
    proc = second.cli("install", "causal-conv1d", env=env)
    assert proc.returncode == 0, proc.stderr
    assert toolkit.calls() == calls, "nvcc compiled nothing for the second environment"
    assert "from the local wheel cache" in proc.stderr
    seconds = float(re.search(r"installed causal-conv1d \S+ in ([\d.]+) s", proc.stderr).group(1))
    assert seconds < 60
    assert _import_conv(second)["version"].endswith("+fph.torch2.13.0.cu130.abi1.sm90")

    # doctor and `cache list` show the entry, documented (docs/json-schema.md)
    from test_cli import check

    listing = json.loads(second.cli("cache", "list", "--json", env=env).stdout)
    check(listing, "wheel_cache", "wheel_cache")
    (entry,) = listing["wheels"]
    assert entry["ok"] and entry["origin"] == "built" and entry["key"]["archs"] == ["sm_90"] and entry["log"] == log
    doctor = json.loads(second.cli("doctor", "--json", env=env).stdout)
    check(doctor["wheel_cache"], "wheel_cache", "doctor.wheel_cache")
    assert "causal_conv1d-1.6.2.post1+fph" in second.cli("doctor", env=env).stdout

    # cache clear empties it; the next environment would build again
    cleared = second.cli("cache", "clear", "causal-conv1d", env=env)
    assert cleared.returncode == 0 and "removed 1 wheel of causal-conv1d" in cleared.stdout
    assert not [n for n in _cached(cache) if n.endswith(".whl")]


@pytest.mark.slow
def test_build_dest_installs_offline_elsewhere_with_builds_forbidden(make_venv, toolkit, sdist_house, tmp_path, test_pins):
    pins = test_pins()
    builder = make_venv(transformers=None)
    dest = str(tmp_path / "cluster-wheelhouse")
    env = _env(sdist_house, BUILD_HOST, toolkit, str(tmp_path / "builder-cache"), pins)
    proc = builder.cli("build", "causal-conv1d", "--arch", "sm_90", "--dest", dest, env=env)
    assert proc.returncode == 0, proc.stderr
    assert all(sdists.gencode_codes(argv) == ["sm_90"] for argv in toolkit.calls()) and toolkit.calls()
    assert "install it anywhere with FASTPATH_HOOKS_FIND_LINKS=" + dest in proc.stdout
    assert _import_conv(builder).get("error"), "build compiles into the cache; it installs nothing"
    calls = toolkit.calls()

    # a GPU node: its own empty cache, no compiler, builds forbidden, offline from the wheelhouse
    node = make_venv(transformers=None)
    node_env = offline_env(dest, HOPPER, cache_dir=str(tmp_path / "node-cache"), pins=pins,
                           FASTPATH_HOOKS_ALLOW_BUILD="0")
    proc = node.cli("install", "causal-conv1d", env=node_env)
    assert proc.returncode == 0, proc.stderr
    # the wheel's long name is no part of the line (doctor and plan have it): nothing to cut
    assert "causal-conv1d: installing - 1.6.2.post1, built for this machine, from FASTPATH_HOOKS_FIND_LINKS\n" in proc.stderr
    assert "installed causal-conv1d 1.6.2.post1+fph.torch2.13.0.cu130.abi1.sm90 in" in proc.stderr
    assert toolkit.calls() == calls
    assert _import_conv(node)["fn"] is True

    # a node with other GPUs gets no wrong binary: it would need a build, which is forbidden
    other = make_venv(transformers=None)
    proc = other.cli("install", "causal-conv1d",
                     env=offline_env(dest, HOPPER.replace("sm_90", "sm_100"), cache_dir=str(tmp_path / "other-cache"),
                                     pins=pins, FASTPATH_HOOKS_ALLOW_BUILD="0"))
    assert "causal-conv1d: not installed - no wheel fits; FASTPATH_HOOKS_ALLOW_BUILD=0 forbids a build" in proc.stderr
    assert _import_conv(other).get("error")


@pytest.mark.slow
def test_a_build_in_a_venv_whose_path_needs_quoting_builds(toolkit, sdist_house, tmp_path, test_pins, torch_wheel,
                                                           fastpath_wheel):
    """Issue 40: from `/tmp/v é/bin/` the build failed - torch's ninja build puts PYTORCH_NVCC into its compile
    command as given (a command such as `ccache nvcc`), so the wrapper's path, in the venv, split at the space. The
    stand-in sdist compiles as that build does (tests/support/sdists.py)."""
    from support import venvs

    venv = venvs.make_venv(str(tmp_path / "v é"), torch_wheel=torch_wheel, fastpath_wheel=fastpath_wheel,
                           transformers=None)
    cache = str(tmp_path / "cache")
    proc = subprocess.run([os.path.join(venv.bin, "fastpath-hooks"), "build", "causal-conv1d", "--arch", "sm_90"],
                          env=_env(sdist_house, BUILD_HOST, toolkit, cache, test_pins()), cwd=venv.bin,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert toolkit.calls() and all(sdists.gencode_codes(argv) == ["sm_90"] for argv in toolkit.calls())
    assert [n for n in _cached(cache) if n.endswith(".whl")] == [
        f"causal_conv1d-1.6.2.post1+fph.torch2.13.0.cu130.abi1.sm90-{PY}-{PY}-linux_x86_64.whl"]


@pytest.mark.slow
def test_build_leaves_the_environment_as_it_was_built_or_failed(make_venv, toolkit, sdist_house, tmp_path, test_pins):
    """Issue 40: `build` left ninja and wheel installed in the venv, also after a failed build. What the build needs
    and the environment lacks (the pins' build_deps: here wheel and ninja) comes from the build's own directory
    instead, which the build's setup.py imports from and finds ninja in."""
    venv = make_venv(transformers=None)
    subprocess.run([venv.python, "-m", "pip", "uninstall", "-q", "-y", "wheel"], check=True, env=clean_env())
    before = venv.versions()
    assert "wheel" not in before and "ninja" not in before
    env = _env(sdist_house, BUILD_HOST, toolkit, str(tmp_path / "cache"), test_pins())
    proc = venv.cli("build", "causal-conv1d", "--arch", "sm_90", env=env)
    assert proc.returncode == 0, proc.stderr
    log = open(re.search(r"log: (\S+\.log)", proc.stderr).group(1).replace("$FASTPATH_HOOKS_CACHE_DIR",
                                                                             str(tmp_path / "cache"))).read()
    ninja = re.search(r"^\s*ninja: (\S+)$", log, re.M).group(1)   # pip -v indents the build's output
    assert ninja.endswith("/helpers/bin/ninja") and not ninja.startswith(venv.path + "/bin"), ninja
    assert venv.versions() == before, "nothing installed in the environment"
    toolkit.fail()
    proc = venv.cli("build", "causal-conv1d", "--arch", "sm_90", "--rebuild", env=env)
    assert proc.returncode == 1 and "causal-conv1d: build failed - " in proc.stderr, proc.stderr
    assert venv.versions() == before, "nothing installed in the environment, also by a failed build"


@pytest.mark.slow
def test_a_failing_build_leaves_the_torch_path_caches_nothing_and_names_its_log(
        make_venv, toolkit, sdist_house, tmp_path, test_pins):
    toolkit.fail()
    cache = str(tmp_path / "cache")
    venv = make_venv(transformers=None)
    before = venv.versions()
    proc = venv.cli("install", "causal-conv1d", env=_env(sdist_house, HOPPER, toolkit, cache, test_pins()))
    assert proc.returncode == 1
    assert toolkit.calls(), "the compiler ran and failed"
    # the compiler's first error line, not pip's, and the log kept
    match = re.search(r"source build of causal-conv1d==1\.6\.2\.post1 for sm_90 failed \(pip exit 1\): "
                      r'csrc/causal_conv1d_fwd\.cu\(42\): error: identifier "__nv_bfloat16" is undefined \(fake nvcc\); '
                      r"full log: (\S+\.log)", proc.stderr)
    assert match, proc.stderr
    log = open(match.group(1)).read()
    assert '__nv_bfloat16" is undefined (fake nvcc)' in log and "error compiling csrc/causal_conv1d.cu" in log
    assert "causal-conv1d: could not install" in proc.stderr    # and the import stays as without it:
    assert venv.versions() == before, "nothing half installed"
    assert "ModuleNotFoundError" in _import_conv(venv)["error"]
    assert not [n for n in _cached(cache) if n.endswith(".whl")], "a failed build caches nothing"


@pytest.mark.slow
def test_auto_skips_a_build_with_a_clear_reason_when_nvcc_does_not_fit(make_venv, tmp_path, sdist_house, test_pins):
    """The real discovery path: CUDA_HOME's nvcc answers --version with another CUDA major."""
    old = sdists.fake_cuda_toolkit(str(tmp_path / "cuda12"), release="12.8")
    venv = make_venv(transformers=None)
    proc = venv.cli("plan", "causal-conv1d", env=_env(sdist_house, HOPPER, old, str(tmp_path / "c"), test_pins()))
    assert "nvcc is CUDA 12.8 while torch is built for CUDA 13.0" in proc.stdout
    assert old.calls() == []


# -- the cache's entries: atomic, checked, a damaged one never installed ---------------------------

def _wheel(tmp_path, name="causal_conv1d-1.6.2.post1+fph.torch2.13.0.cu130.abi1.sm90-cp312-cp312-linux_x86_64.whl"):
    from support import wheels

    return wheels.fake_causal_conv1d(str(tmp_path / "w"), name)


def test_cache_entries_are_complete_or_ignored(tmp_path):
    from fastpath_hooks.act import fetch as wheelcache
    from fastpath_hooks.facts.wheels import listing

    root = str(tmp_path / "cache")
    wheel = _wheel(tmp_path)
    name = os.path.basename(wheel)
    path = wheelcache.store(root, wheel, meta={"origin": "built", "distribution": "causal-conv1d"})
    assert listing(root) == (name,)
    assert wheelcache.recorded_sha256(path) == sha256_of(wheel)
    # an interrupted store leaves a temporary file (no sidecar): never listed
    with open(os.path.join(wheelcache.directory(root), ".tmp-abc.whl"), "wb") as fh:
        fh.write(b"partial")
    assert listing(root) == (name,)
    # a truncated wheel: ignored, and `cache list` says why
    with open(path, "r+b") as fh:
        fh.truncate(100)
    assert listing(root) == ()
    (entry,) = [e for e in wheelcache.entries(root) if e["file"] == name]
    assert not entry["ok"] and "partial or damaged" in entry["problem"]
    # an unreadable sidecar: ignored too
    wheelcache.store(root, wheel, meta={})
    with open(path + ".json", "w") as fh:
        fh.write("{not json")
    assert listing(root) == ()
    assert wheelcache.clear(root) == [".tmp-abc.whl", name]
    assert os.listdir(wheelcache.directory(root)) == [".lock"]


def test_a_cached_wheel_whose_bytes_changed_is_refused_at_install(tmp_path):
    """Same size, other bytes (a bit flip, a substituted file) and even its mtime put back, so that no listing
    hashes it: the sha256 recorded at store time refuses it before any installer runs."""
    from fastpath_hooks.act import fetch as wheelcache
    from fastpath_hooks.act.fetch import FetchError, fetch_wheel
    from fastpath_hooks.facts.wheels import listing
    from fastpath_hooks.decide.plan import Step
    from fastpath_hooks.facts.settings import Settings

    root = str(tmp_path / "cache")
    path = wheelcache.store(root, _wheel(tmp_path), meta={})
    stored = os.stat(path).st_mtime_ns
    _flip_a_byte(path)
    os.utime(path, ns=(stored, stored))
    assert listing(root), "size and mtime are the recorded ones: only the digest can tell"
    step = Step(kind="wheel", requirements=(os.path.basename(path),), url="file://" + path)
    with pytest.raises(FetchError, match=r"cached causal-conv1d wheel altered \(sha256 differs\), refused; "
                                         "fastpath-hooks cache clear removes it"):
        fetch_wheel(step, Settings(cache_dir=root), str(tmp_path))


_WATCHED: list = []   # the files whose opening this process records (an audit hook: no function replaced)
_OPENED: list = []


def _audit(event, args):
    if _WATCHED and event == "open" and args and args[0] in _WATCHED:
        _OPENED.append(args[0])


sys.addaudithook(_audit)


def _flip_a_byte(path: str) -> None:
    """Same size, other bytes (a bit flip, a substituted file), written as any editor or copy would."""
    data = bytearray(open(path, "rb").read())
    data[-30] ^= 0xFF
    with open(path, "wb") as fh:
        fh.write(bytes(data))


def test_a_cached_wheel_altered_without_changing_its_size_is_refused_and_the_wheelhouse_used(tmp_path, monkeypatch,
                                                                                             capsys):
    """Issue 40: `cache list` and `plan` took it (only the size was compared); `install` then failed. Now it is
    refused like a size change - by its digest, hashed only when its size or mtime differs from the recorded ones
    (no start hashes an untouched entry) - and the plan takes the same wheel from FASTPATH_HOOKS_FIND_LINKS."""
    from conftest import CAUSAL_WHEEL, H100_NEW_TRITON
    from fastpath_hooks import cli, events
    from fastpath_hooks.act import fetch as wheelcache
    from support import wheels

    house = str(tmp_path / "house")
    wheel = wheels.fake_causal_conv1d(house, CAUSAL_WHEEL)
    root = str(tmp_path / "cache")
    cached = wheelcache.store(root, wheel, meta={"origin": "downloaded"})
    for name in [k for k in os.environ if k.startswith("FASTPATH_HOOKS_")]:
        monkeypatch.delenv(name)
    for var, value in (("FASTPATH_HOOKS_CACHE_DIR", root), ("FASTPATH_HOOKS_FIND_LINKS", house),
                       ("FASTPATH_HOOKS_OFFLINE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(var, value)
    events.forget()

    def plan() -> str:
        assert cli.main(["plan", "causal-conv1d", "--target", H100_NEW_TRITON]) == 0
        return capsys.readouterr().out

    assert "from the local wheel cache" in plan()
    _OPENED.clear()
    _WATCHED.append(cached)
    try:
        assert "from the local wheel cache" in plan()
    finally:
        _WATCHED.clear()
    assert _OPENED == [], "an entry as it was stored is not read again (no start hashes it)"
    _flip_a_byte(cached)
    out = plan()
    assert "from the local wheel cache" not in out and f"prebuilt wheel {CAUSAL_WHEEL}" in out, out
    assert "--find-links " + house in out
    assert cli.main(["cache", "list", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["wheels"]
    assert not entry["ok"] and "sha256" in entry["problem"] and "cache clear" in entry["problem"], entry


def test_a_touched_cache_entry_is_hashed_once_and_its_new_mtime_recorded(tmp_path):
    """A copied or touched entry (or one stored before mtimes were recorded) with its bytes as recorded: kept, and
    `cache list` (or an install from it) records its mtime, so no later listing reads it again."""
    from fastpath_hooks.act import fetch as wheelcache
    from fastpath_hooks.facts.wheels import listing

    root = str(tmp_path / "cache")
    path = wheelcache.store(root, _wheel(tmp_path), meta={})
    os.utime(path, ns=(1_700_000_000_000_000_000,) * 2)
    _WATCHED.append(path)
    try:
        assert listing(root) == (os.path.basename(path),) and _OPENED == [path], "hashed: its mtime changed"
        assert [e["ok"] for e in wheelcache.entries(root)] == [True]
        _OPENED.clear()
        assert listing(root) == (os.path.basename(path),)
        assert _OPENED == [], "its new mtime is recorded: not read again"
    finally:
        _WATCHED.clear()
        _OPENED.clear()
