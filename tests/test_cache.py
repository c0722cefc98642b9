"""The verdict cache: later starts skip probes and subprocesses; failures are remembered
for a while; a changed environment invalidates; a corrupt cache is never fatal.

The first tests use the cache directly on real files; the others run the user's side in
real processes of a real venv and count, with a PEP 578 audit hook, every process the
decision starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time

import pytest

from conftest import A100, CAUSAL_WHEEL, offline_env
from fastpath_hooks.facts.settings import Settings
from fastpath_hooks.act.store import VerdictCache
from fastpath_hooks.act.store import environment_signature, signature_environ
from support import wheels
from support.venvs import clean_env
from support.processes import AUDIT_PRELUDE, counting_uv, installer_calls, link_uv


# -- the cache file ------------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path):
    return VerdictCache(Settings(cache_dir=str(tmp_path), retry_after=60.0))


def test_a_verdict_is_found_under_its_fingerprint_only(cache):
    assert cache.get("fla", "fp1") is None
    assert cache.record("fla", verdict=("fp1", "good", "verified"))
    assert cache.get("fla", "fp1")["reason"] == "verified"
    assert cache.get("fla", "fp2") is None            # a changed environment
    assert cache.get("tilelang", "fp1") is None       # per kernel


def test_a_failure_is_remembered_for_retry_after_seconds(cache):
    cache.record("fla", verdict=("fp", "failed", "index unreachable"))
    ts = cache.get("fla", "fp")["ts"]
    assert cache.get("fla", "fp", now=ts + 59)["reason"] == "index unreachable"
    assert cache.get("fla", "fp", now=ts + 61) is None
    cache.record("fla", verdict=("fp", "good", "verified"))        # successes do not expire
    assert cache.get("fla", "fp", now=ts + 10 ** 6) is not None


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe garbage", b"[]", b'{"schema": 1, "kernels": []}',
                                     b'{"schema": 99, "kernels": {}}',
                                     b'{"schema": 1, "kernels": {"fla": {"fingerprint": "fp", "state": "good", "reason": "r", "ts": 1}}}',
                                     b'{"schema": 1, "kernels": {}, "warm": {"fla": {"signature": "s", "reason": "r"}}}',
                                     b'{"schema": 2, "kernels": {"fla": {"fp": {"state": 3, "reason": "r", "ts": 1}}}}',
                                     b'{"schema": 2, "kernels": {"fla": {"fp": {"state": "good", "reason": "r"}}}}',
                                     b'{"schema": 2, "kernels": {"fla": ["fp"]}}',
                                     b'{"schema": 2, "kernels": {"fla": {"reason": "r", "env": 5}}}',
                                     b'{"schema": 2, "kernels": {"fla": {"reason": "r", "posed": "tpu"}}}'])
def test_a_corrupt_cache_file_is_ignored_and_rewritten(cache, content):
    os.makedirs(cache.warm_dir)
    for path in (cache.path, os.path.join(cache.warm_dir, "s.json")):  # the verdicts, a warm signature
        with open(path, "wb") as fh:
            fh.write(content)
    assert cache.get("fla", "fp") is None
    assert cache.get_warm("fla", "s") is None
    assert cache.entries() == {} or all(isinstance(v, dict) for v in cache.entries().values())
    assert cache.record("fla", verdict=("fp", "good", "verified"))
    assert cache.record("fla", warm=("s", {"reason": "r", "posed": None, "env": [], "fingerprint": "fp"}))
    with open(cache.path) as fh:
        assert json.load(fh)["kernels"]["fla"]["fp"]["state"] == "good"
    assert cache.get_warm("fla", "s")["reason"] == "r"


def test_an_unreadable_cache_is_never_fatal(cache):
    os.makedirs(cache.path)  # directories where the files belong: reads and writes fail
    os.makedirs(os.path.join(cache.warm_dir, "sig.json"))
    assert cache.get("fla", "fp") is None
    assert cache.record("fla", verdict=("fp", "good", "verified")) is False
    assert cache.record("fla", warm=("sig", {"reason": "r", "posed": None, "env": []})) is False
    assert cache.get_warm("fla", "sig") is None


def test_warm_verdicts_follow_the_signature_and_a_new_verdict_clears_them(cache):
    cache.record("fla", warm=("sig", {"reason": "fla 0.6.0 installed", "posed": "cuda", "env": [["FLA_TILELANG", "0"]]}))
    assert cache.get_warm("fla", "sig")["env"] == [["FLA_TILELANG", "0"]]
    assert cache.get_warm("fla", "other") is None
    cache.record("fla", verdict=("fp", "failed", "broken"))
    assert cache.get_warm("fla", "sig") is None    # earned under unknown facts: re-earned
    cache.record("fla", warm=("sig", {"reason": "again", "posed": None, "env": []}))
    assert cache.forget() and not os.path.exists(cache.path) and cache.forget() is False
    assert cache.get_warm("fla", "sig") is None and not os.path.exists(cache.warm_dir)


def test_several_signatures_and_fingerprints_live_side_by_side(cache):
    # Two GPU types sharing one cache directory: neither evicts the other's verdicts.
    for n in (1, 2):
        assert cache.record("fla", verdict=(f"fp{n}", "good", f"verified on type {n}"))
        assert cache.record("fla", warm=(f"sig{n}", {"reason": f"ok {n}", "posed": None, "env": [], "fingerprint": f"fp{n}"}))
    assert cache.get("fla", "fp1")["reason"] == "verified on type 1"
    assert cache.get("fla", "fp2")["reason"] == "verified on type 2"
    assert cache.get_warm("fla", "sig1")["reason"] == "ok 1" and cache.get_warm("fla", "sig2")["reason"] == "ok 2"
    assert cache.entries()["fla"]["fingerprint"] == "fp2"   # doctor shows the latest

    # A new verdict for type 1's facts drops only the warm verdicts earned under them.
    cache.record("fla", verdict=("fp1", "failed", "broken now"))
    assert cache.get_warm("fla", "sig1") is None
    assert cache.get_warm("fla", "sig2")["reason"] == "ok 2"
    assert cache.get("fla", "fp2")["state"] == "good"


def test_the_cache_keeps_the_most_recently_written_entries(cache):
    from fastpath_hooks.act.store import KEEP, WARM_KEEP

    for n in range(WARM_KEEP + 3):
        cache.record("fla", warm=(f"sig{n}", {"reason": f"ok {n}", "posed": None, "env": [], "fingerprint": "fp"}))
    assert [n for n in range(WARM_KEEP + 3) if cache.get_warm("fla", f"sig{n}")] == list(range(3, WARM_KEEP + 3))
    assert len(os.listdir(cache.warm_dir)) == WARM_KEEP       # one small file per signature
    for n in range(KEEP + 3):
        cache.record("tilelang", verdict=(f"fp{n}", "good", "verified"))
    assert [n for n in range(KEEP + 3) if cache.get("tilelang", f"fp{n}")] == list(range(3, KEEP + 3))
    with open(cache.path) as fh:
        assert len(json.load(fh)["kernels"]["tilelang"]) == KEEP
    assert cache.get_warm("fla", f"sig{WARM_KEEP + 2}") is not None   # another kernel's verdicts leave fla's


# -- the environment signature (the warm path's key) ----------------------------------------

def test_an_installed_kernels_digest_is_the_same_in_every_environment_despite_its_console_scripts(tmp_path):
    """apache-tvm-ffi has console scripts; pip writes them with this venv's python in the shebang and lists
    them in RECORD as ../../../bin/...: two environments with the same wheel must give one digest, or
    tilelang's check is never remembered in a later environment (seen on the H200, issue 33)."""
    from fastpath_hooks.act.store import installed_digest

    def site(venv: str, module: str = "x = 1\n") -> str:
        path = tmp_path / venv / "site-packages"
        info = path / "apache_tvm_ffi-0.1.12.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apache-tvm-ffi\nVersion: 0.1.12\n")
        script = f"#!{tmp_path / venv}/bin/python\nimport tvm_ffi.config\n"
        (info / "RECORD").write_text(f"tvm_ffi/__init__.py,sha256={hash(module)},5\n"
                                     f"../../../bin/tvm-ffi-config,sha256={hash(script)},{len(script)}\n"
                                     "apache_tvm_ffi-0.1.12.dist-info/RECORD,,\n")
        return str(path)

    def digest(path: str):
        saved = sys.path[:]
        sys.path.insert(0, path)
        try:
            return installed_digest(["apache-tvm-ffi"])
        finally:
            sys.path[:] = saved

    one, two, other = site("venv1"), site("venv2"), site("venv3", module="x = 2\n")
    assert digest(one) is not None
    assert digest(one) == digest(two)          # only the scripts' shebangs differ
    assert digest(one) != digest(other)        # another file inside site-packages: another digest


def test_the_signature_changes_with_what_a_decision_depends_on(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    env = (("FASTPATH_HOOKS_TARGET", A100),)
    first = environment_signature(env)
    assert first == environment_signature(env)
    assert environment_signature((("FASTPATH_HOOKS_TARGET", A100 + ",python=3.12"),)) != first
    (site / "fla_core-0.6.0.dist-info").mkdir()                 # an install
    second = environment_signature(env)
    assert second != first
    (site / "fla_core-0.6.0.dist-info").rename(site / "fla_core-0.5.2.dist-info")
    assert environment_signature(env) not in (first, second)    # another version
    (site / "unrelated.py").write_text("")                      # site-packages' mtime: a reinstall in place
    assert environment_signature(env) != second


def test_no_signature_while_an_install_is_pending(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    (site / ".fastpath-hooks").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    assert environment_signature(()) is not None
    (site / ".fastpath-hooks" / "journal.json").write_text("{}")
    assert environment_signature(()) is None


def test_a_deleted_working_directory_is_not_an_error(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    monkeypatch.setattr(sys, "path", [""] + sys.path)  # `python -c` puts the working directory first
    gone.rmdir()
    assert environment_signature(()) is not None


def test_the_signature_covers_the_wheelhouse_and_only_relevant_variables(tmp_path, monkeypatch):
    house = tmp_path / "wheels"
    house.mkdir()
    monkeypatch.setenv("FASTPATH_HOOKS_FIND_LINKS", str(house))
    monkeypatch.setenv("SOME_OTHER_VARIABLE", "1")
    captured = signature_environ()
    assert ("FASTPATH_HOOKS_FIND_LINKS", str(house)) in captured
    assert not any(name == "SOME_OTHER_VARIABLE" for name, _ in captured)
    before = environment_signature(captured)
    (house / "fla_core-0.6.0-py3-none-any.whl").write_bytes(b"")
    assert environment_signature(captured) != before


# -- in real processes ------------------------------------------------------------------------

# find_spec() resolves `import causal_conv1d` - through the import hook - without running the
# module (which imports torch: seconds per run, and nothing to do with the decision).
CAUSAL_SCRIPT = AUDIT_PRELUDE + r'''
import importlib.util, json, sys
import fastpath_hooks
fastpath_hooks.install()
spec = importlib.util.find_spec("causal_conv1d")
from fastpath_hooks import engine
print(json.dumps({"state": engine.outcomes()["causal-conv1d"].state, "spawns": len(SPAWNS),
                  # the warm path loads none of these (settings alone costs ~4 ms of dataclass set-up)
                  "probed": bool({"fastpath_hooks.facts.probe", "fastpath_hooks.facts.settings", "fastpath_hooks.facts.pins"} & set(sys.modules)),
                  "fake": "FAKE_CAUSAL_CONV1D" in open(spec.origin).read()}))
'''

FLA_SCRIPT = AUDIT_PRELUDE + r'''
import json
import fastpath_hooks
fastpath_hooks.install()
try:
    import fla
except ImportError:
    pass
from fastpath_hooks import engine
outcome = engine.outcomes()["fla"]
print(json.dumps({"state": outcome.state, "reason": outcome.reason, "spawns": len(SPAWNS)}))
'''


def _run(venv, script, env):
    proc = venv.run(script, env=env, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _verdict_file(cache_dir: str) -> str:
    (name,) = [n for n in os.listdir(os.path.join(cache_dir, "verdicts")) if n.endswith(".json")]
    return os.path.join(cache_dir, "verdicts", name)


@pytest.mark.slow
def test_a_verified_environment_skips_probes_and_subprocesses(make_venv, make_wheelhouse, test_pins, tmp_path):
    venv = make_venv(transformers=None)
    link_uv(venv)
    wheelhouse = make_wheelhouse(causal=True)
    cache_dir = str(tmp_path / "cache")
    env = offline_env(wheelhouse, A100, cache_dir=cache_dir, pins=test_pins(wheelhouse), FASTPATH_HOOKS_INSTALLER="uv")
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    first, err = _run(venv, CAUSAL_SCRIPT, env)
    assert first["state"] == "installed" and first["fake"] and first["spawns"] > 0, (first, err)

    # A later start: the warm verdict answers; neither the probe nor any subprocess runs.
    warm, err = _run(venv, CAUSAL_SCRIPT, env)
    assert warm == {"state": "ok", "spawns": 0, "probed": False, "fake": True}, err
    assert "fastpath-hooks" not in err  # nothing to say

    # Without the warm verdict the probe runs, but the kernel's verified verdict saves the child process.
    path = _verdict_file(cache_dir)
    warm_dir = path[:-len(".json")] + ".warm"
    (signature,) = os.listdir(warm_dir)
    shutil.rmtree(warm_dir)
    probed, _ = _run(venv, CAUSAL_SCRIPT, env)
    assert probed == {"state": "ok", "spawns": 0, "probed": True, "fake": True}
    assert os.listdir(warm_dir) == [signature]  # re-earned under the same signature

    # A corrupt cache: ignored (verified again - in a child process, as its import is not remembered either:
    # act/store.py, which would save the child) and rewritten.
    for corrupt in (path, os.path.join(warm_dir, signature)):
        with open(corrupt, "wb") as fh:
            fh.write(b'{"schema": 2, "kernels": {"causal-conv1d": \xff')
    shutil.rmtree(os.path.join(cache_dir, "verified"))
    reverified, err = _run(venv, CAUSAL_SCRIPT, env)
    assert reverified["state"] == "ok" and reverified["spawns"] == 1, (reverified, err)
    with open(path) as fh:
        data = json.load(fh)
    assert [v["state"] for v in data["kernels"]["causal-conv1d"].values()] == ["good"]
    with open(os.path.join(warm_dir, signature)) as fh:
        assert set(json.load(fh)["kernels"]) == {"causal-conv1d"}
    assert _run(venv, CAUSAL_SCRIPT, env)[0]["spawns"] == 0

    # `doctor --refresh` forgets it all.
    doctor = venv.cli("doctor", "--refresh", env=env)
    assert doctor.returncode == 0, doctor.stderr
    assert not os.path.exists(path)
    forgotten, _ = _run(venv, CAUSAL_SCRIPT, env)
    assert forgotten["state"] == "ok" and forgotten["spawns"] == 1

    # Another distribution installed: a new environment signature (the probe runs again), but
    # causal-conv1d's own fingerprint is unchanged, so it is not verified again.
    venv.uv_install(os.path.join(wheelhouse, [n for n in os.listdir(wheelhouse) if n.startswith("einops")][0]),
                    no_deps=True)
    unrelated, _ = _run(venv, CAUSAL_SCRIPT, env)
    assert unrelated == {"state": "ok", "spawns": 0, "probed": True, "fake": True}

    # causal-conv1d itself changed (another build): its fingerprint changed, so it is verified again.
    other = wheels.fake_causal_conv1d(str(tmp_path), CAUSAL_WHEEL.replace("1.6.2.post1", "1.6.1"), version="1.6.1")
    venv.uv_install(other, no_deps=True, extra=("--reinstall",))
    changed, _ = _run(venv, CAUSAL_SCRIPT, env)
    assert changed["state"] == "ok" and changed["spawns"] == 1 and changed["probed"]


@pytest.mark.slow
def test_a_failed_attempt_is_remembered_until_retry_after(make_venv, make_wheelhouse, tmp_path):
    venv = make_venv(transformers=None)
    log = str(tmp_path / "uv-calls.log")
    counting_uv(venv, log)
    wheelhouse = make_wheelhouse(fla="0.6.0", fla_broken="raise")
    env = offline_env(wheelhouse, A100, cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_INSTALLER="uv")
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    first, err = _run(venv, FLA_SCRIPT, env)
    assert first["state"] == "failed" and "broken on purpose" in first["reason"], (first, err)
    assert "fla: could not install - verification failed: import fla: " in err
    attempts = len(installer_calls(log))
    assert attempts >= 2  # the deps step and the kernel step
    failed_at = time.time()

    # Remembered: no installer, no subprocess at all, and the message says why and for how long.
    again, err = _run(venv, FLA_SCRIPT, env)
    assert again["state"] == "failed" and again["spawns"] == 0, (again, err)
    assert len(installer_calls(log)) == attempts
    assert re.search(r"fla: failed \d+ s ago: verification failed: .*broken on purpose", err), err   # when, why
    assert "now: fastpath-hooks install fla)" in err, err                                            # and the fix
    # said once per environment: the next start keeps it to the debug log
    _, err = _run(venv, FLA_SCRIPT, env)
    assert "fla: failed" not in err, err

    # Expired: FASTPATH_HOOKS_RETRY_AFTER=1, a second later, retries.
    time.sleep(max(0.0, failed_at + 1.2 - time.time()))
    retried, err = _run(venv, FLA_SCRIPT, dict(env, FASTPATH_HOOKS_RETRY_AFTER="1"))
    assert retried["state"] == "failed" and len(installer_calls(log)) == 2 * attempts, (retried, err)
    assert "fla: could not install" in err

    # A changed fingerprint (einops, one of fla's runtime dependencies, now installed) retries at once.
    venv.uv_install(os.path.join(wheelhouse, [n for n in os.listdir(wheelhouse) if n.startswith("einops")][0]),
                    no_deps=True)
    _run(venv, FLA_SCRIPT, env)
    assert len(installer_calls(log)) > 2 * attempts

    # And `doctor --refresh` forgets a remembered failure.
    calls = len(installer_calls(log))
    assert _run(venv, FLA_SCRIPT, env)[0]["spawns"] == 0
    assert venv.cli("doctor", "--refresh", env=env).returncode == 0
    _run(venv, FLA_SCRIPT, env)
    assert len(installer_calls(log)) > calls



CAUSAL_START = AUDIT_PRELUDE + r'''
import importlib.util, json
import fastpath_hooks
fastpath_hooks.install()
importlib.util.find_spec("causal_conv1d")
from fastpath_hooks import engine
print(json.dumps({"state": engine.outcomes()["causal-conv1d"].state, "spawns": len(SPAWNS)}))
'''


@pytest.mark.slow
def test_the_install_command_tries_now_what_starts_remember_as_failed(make_venv, test_pins, tmp_path):
    """Issue 34, defect 1, for real: causal-conv1d's release wheel from a mirror served over HTTP. With the
    server down, `install causal-conv1d` fails (Connection refused); with it back up, a start replays the
    remembered failure (saying when it was seen and the command) and asks the server nothing; the command
    the user types tries now - it reaches the server and installs."""
    from support.file_server import FileServer

    release = str(tmp_path / "release")
    wheels.fake_causal_conv1d(release, CAUSAL_WHEEL)
    with FileServer() as down:
        port = down.httpd.server_address[1]
    venv = make_venv(transformers=None)
    link_uv(venv)
    env = clean_env(FASTPATH_HOOKS_TARGET=A100, FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"), LOCAL_RANK="0",
                    FASTPATH_HOOKS_PINS=test_pins(release), FASTPATH_HOOKS_INSTALLER="uv",
                    FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL=f"http://127.0.0.1:{port}/files/")
    first = venv.cli("install", "causal-conv1d", env=env)
    assert first.returncode == 1 and "Connection refused" in first.stdout, first.stdout + first.stderr

    with FileServer(port=port) as up:           # the source is back, at the same address
        up.files[CAUSAL_WHEEL] = os.path.join(release, CAUSAL_WHEEL)
        start, err = _run(venv, CAUSAL_START, env)
        assert start["state"] == "failed" and start["spawns"] == 0 and up.requests == [], (start, err, up.requests)
        assert re.search(r"causal-conv1d: failed \d+ s ago: .*Connection refused", err), err
        assert "now: fastpath-hooks install causal-conv1d" in err, err
        again = venv.cli("install", "causal-conv1d", env=env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert up.requests == [f"/files/{CAUSAL_WHEEL}"], up.requests
        assert "Connection refused" not in again.stdout + again.stderr
    assert venv.versions()["causal-conv1d"] == "1.6.2.post1+cu12torch2.10cxx11abiTRUE"


@pytest.mark.slow
def test_two_gpu_types_sharing_one_cache_do_not_evict_each_other(make_venv, make_wheelhouse, test_pins, tmp_path):
    """Nodes with different GPUs (posed: an A100 and an RTX A6000) on one shared FASTPATH_HOOKS_CACHE_DIR,
    starting alternately: each verifies causal-conv1d once, then both answer from their warm verdicts."""
    venv = make_venv(transformers=None)
    log = str(tmp_path / "uv-calls.log")
    counting_uv(venv, log)
    wheelhouse = make_wheelhouse(causal=True)
    cache_dir = str(tmp_path / "shared-cache")
    env = offline_env(wheelhouse, A100, cache_dir=cache_dir, pins=test_pins(wheelhouse), FASTPATH_HOOKS_INSTALLER="uv")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    a6000 = dict(env, FASTPATH_HOOKS_TARGET=A100.replace("sm_80", "sm_86"))

    first, err = _run(venv, CAUSAL_SCRIPT, env)
    assert first["state"] == "installed" and first["fake"], (first, err)
    installs = len(installer_calls(log))
    other, err = _run(venv, CAUSAL_SCRIPT, a6000)
    assert other == {"state": "ok", "spawns": 1, "probed": True, "fake": True}, (other, err)  # verified there once

    for _ in range(2):
        for node in (env, a6000):
            again, err = _run(venv, CAUSAL_SCRIPT, node)
            assert again == {"state": "ok", "spawns": 0, "probed": False, "fake": True}, (again, err)
    assert len(installer_calls(log)) == installs
    with open(_verdict_file(cache_dir)) as fh:
        assert len(json.load(fh)["kernels"]["causal-conv1d"]) == 2
    assert len(os.listdir(_verdict_file(cache_dir)[:-len(".json")] + ".warm")) == 2
