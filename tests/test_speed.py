"""Issue 20 on a CPU machine, for real: the two compiled kernels of one request build side by side
(stand-in sdists whose setup.py compiles through the nvcc torch's ninja build would use; a fake CUDA
toolkit whose compiles take a second each) and still install in dependency order, in one installer
call under the environment lock; the estimate later builds and `doctor` say comes from what this
machine measured; a second environment on the same cache checks both kernels in ONE verification
child.

Processes are counted with the package's own means: every process the fastpath-hooks command
starts is seen by a PEP 578 audit hook in that same process (tests/support/processes.py's way).
"""

from __future__ import annotations

import json
import os
import re

import pytest

pytestmark = pytest.mark.slow   # real venvs, real pip/uv installs and builds

from conftest import PY, offline_env
from support import sdists, wheels
from support.venvs import clean_env

H200 = "gpu=sm_90,cuda=13.0,torch=2.11.0,triton=3.6.0,cpus=16,memory=128"   # the shares: not this host's
LABEL = "+fph.torch2.11.0.cu130.abi1.sm90"

# The CLI in the venv's interpreter, behind an audit hook that writes every process it starts to
# SPAWNS (a JSON line each: the argv), so a test counts installer calls and verification children.
COUNTED_CLI = r'''
import json, os, sys
_log = open(os.environ["SPAWNS"], "a")
def _hook(event, args):
    if event == "subprocess.Popen":
        _log.write(json.dumps([str(a) for a in args[1]]) + "\n")
        _log.flush()
sys.addaudithook(_hook)
from fastpath_hooks.cli import main
sys.exit(main(sys.argv[1:]))
'''


def _house(path, build_dep_wheels) -> str:
    os.makedirs(path)
    for name in os.listdir(build_dep_wheels):
        os.link(os.path.join(build_dep_wheels, name), os.path.join(path, name))
    sdists.mamba_ssm_sdist(path)
    sdists.causal_conv1d_sdist(path)
    return path


def _counted(venv, *args, env, spawns):
    env = dict(env, SPAWNS=spawns)
    open(spawns, "w").close()
    proc = venv.run(COUNTED_CLI, env=env, args=args, timeout=900)
    with open(spawns) as fh:
        started = [json.loads(line) for line in fh if line.strip()]
    return proc, started


def _verification_children(started) -> list:
    return [argv for argv in started if any(a.endswith("check_child.py") for a in argv)]


def _payload(argv) -> list:
    """A verification child's kernels: the JSON argument after the numeric check's script (act/verify.py)."""
    return json.loads(argv[[a.endswith("check_child.py") for a in argv].index(True) + 1])


def _installs(started) -> list:
    """The installer calls (uv pip install / pip install), not builds (pip wheel) or checks."""
    return [argv for argv in started if "install" in argv and ("pip" in argv or any(a.endswith("/uv") or a == "uv"
                                                                                  for a in argv))]


def _interval(log: str) -> tuple:
    text = open(log).read()
    start = float(re.search(r"^# started: ([\d.]+)$", text, re.M).group(1))
    took = float(re.search(r"^# exit: 0 after ([\d.]+) s$", text, re.M).group(1))
    return start, start + took


def test_two_kernels_of_one_request_build_side_by_side_and_install_in_dependency_order(
        make_venv, toolkit, build_dep_wheels, tmp_path, test_pins):
    house = _house(str(tmp_path / "sdists"), build_dep_wheels)
    cache = str(tmp_path / "cache")
    env = offline_env(house, H200, cache_dir=cache, pins=test_pins(), CUDA_HOME=toolkit.home)
    toolkit.delay(1.0)        # 3 causal-conv1d compiles and 9 mamba-ssm ones, a second each
    first = make_venv()
    plan = json.loads(first.cli("plan", "--json", env=env).stdout)
    assert ["causal-conv1d", "mamba-ssm"] in plan["batches"]

    proc, started = _counted(first, "install", "mamba-ssm", env=env, spawns=str(tmp_path / "spawns1.jsonl"))
    assert proc.returncode == 0, proc.stderr
    # the wait said up front: both builds, side by side, how long, how to do it ahead
    assert re.search(r"causal-conv1d and mamba-ssm: building from source side by side, about \d+ (s|min) in all .*"
                     r"`fastpath-hooks build`", proc.stderr), proc.stderr
    logs = {k: sorted({p.replace("$FASTPATH_HOOKS_CACHE_DIR", cache) for p in re.findall(rf"log: (\S+/{k}-\S+\.log)",
                                                                                       proc.stderr)})
            for k in ("causal-conv1d", "mamba-ssm")}
    assert all(len(v) == 1 for v in logs.values()), logs
    (c0, c1), (m0, m1) = _interval(logs["causal-conv1d"][0]), _interval(logs["mamba-ssm"][0])
    assert max(c0, m0) < min(c1, m1), f"the build logs do not overlap in time: {c0, c1} {m0, m1}"
    # nvcc got only sm_90; causal-conv1d's four files... here three, with the split its share of the cores allows
    conv = [a for a in toolkit.calls() if any("causal_conv1d" in x for x in a)]
    mamba = [a for a in toolkit.calls() if any("selective_scan" in x for x in a)]
    assert len(conv) == 3 and len(mamba) == 9
    assert all(a.count("--split-compile=2") == 1 for a in conv), conv      # 9 of 16 cores (balanced: decide/builds.py), 4 jobs
    assert all(sdists.gencode_codes(a) == ["sm_90"] for a in conv + mamba)
    assert re.search(r"causal-conv1d: building for sm_90 \(MAX_JOBS=4, --split-compile=2, 9 of 16 cores\)", proc.stderr), \
        proc.stderr
    # one installer call put both wheels in, causal-conv1d's first, after the two builds; one check of both
    wheel_calls = [a for a in _installs(started) if any(x.endswith(".whl") for x in a)]
    assert len(wheel_calls) == 1, wheel_calls
    files = [os.path.basename(x) for x in wheel_calls[0] if x.endswith(".whl")]
    assert [f.split("-")[0] for f in files] == ["causal_conv1d", "mamba_ssm"]
    assert started.index(wheel_calls[0]) > max(i for i, a in enumerate(started) if "wheel" in a and "pip" in a[:4] + a)
    assert len(_verification_children(started)) == 1
    # said as a lone install is (engine/outcome.installed_outcome), its dependencies counted
    assert re.search(r"mamba-ssm: installed mamba-ssm 2\.3\.2\.post1\+fph\S+( \(\+\d+ dependenc(y|ies)\))? in [\d.]+ s "
                     r"with \w+; verified in a child process", proc.stderr), proc.stderr
    versions = first.versions()
    assert versions["causal-conv1d"] == "1.6.2.post1" + LABEL and versions["mamba-ssm"] == "2.3.2.post1" + LABEL
    out = first.run("import causal_conv1d, mamba_ssm; print('ok')", env=clean_env(FASTPATH_HOOKS_DISABLE="1"))
    assert out.stdout.strip() == "ok", out.stderr

    # the builds are recorded, and what `doctor` estimates next is what this machine measured
    second = make_venv()
    doctor = json.loads(second.cli("doctor", "--json", env=dict(env, FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "c2")))
                        .stdout)
    assert doctor["environment"]["build_history"] == []        # another cache: no history there
    doctor = json.loads(second.cli("doctor", "--json", env=env).stdout)
    history = {r["distribution"]: r for r in doctor["environment"]["build_history"]}
    assert history["causal-conv1d"]["split"] == 2 and history["causal-conv1d"]["cores"] == 9
    assert history["causal-conv1d"]["concurrent"] == ["mamba-ssm"] and history["mamba-ssm"]["split"] == 1
    assert history["causal-conv1d"]["seconds"] >= 3
    # the estimate doctor prints, and the one the next build says before it starts, are the same
    clear = second.cli("cache", "clear", env=env)
    assert clear.returncode == 0
    doctor = json.loads(second.cli("doctor", "--json", env=env).stdout)
    reason = {d["kernel"]: d["reason"] for d in doctor["decisions"]}["causal-conv1d"]
    said = re.search(r"about (\d+ (?:s|min)), an estimate", reason).group(1)
    assert "this machine's build of causal-conv1d 1.6.2.post1 took" in \
        next(s for d in doctor["decisions"] if d["kernel"] == "causal-conv1d" for s in d["steps"] if s["kind"] == "build")["note"]
    proc = second.cli("install", "causal-conv1d", env=env)
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"causal-conv1d: building - from source for sm_90, an estimated {said} ", proc.stderr), \
        (said, proc.stderr)


def test_a_second_environment_checks_two_cached_kernels_in_one_child_and_one_installer_call(
        make_venv, toolkit, build_dep_wheels, tmp_path, test_pins):
    house = _house(str(tmp_path / "sdists"), build_dep_wheels)
    cache = str(tmp_path / "cache")
    env = offline_env(house, H200, cache_dir=cache, pins=test_pins(), CUDA_HOME=toolkit.home)
    first = make_venv()
    assert first.cli("install", "mamba-ssm", env=env).returncode == 0
    calls = toolkit.calls()

    second = make_venv()
    plan = json.loads(second.cli("plan", "--json", env=env).stdout)
    assert [d["rule"] for d in plan["decisions"] if d["kernel"] in ("causal-conv1d", "mamba-ssm")] == \
        ["causal.cache", "mamba.cache"]
    proc, started = _counted(second, "install", "mamba-ssm", env=env, spawns=str(tmp_path / "spawns2.jsonl"))
    assert proc.returncode == 0, proc.stderr
    assert toolkit.calls() == calls, "nothing compiled for the second environment"
    assert not [a for a in started if "wheel" in a and "-w" in a], "no build"
    # the same files beside the same versions of what their imports load (the first environment's
    # build deps do not count): remembered, no child at all (act/store.py)
    assert _verification_children(started) == [], started
    # and its lines say so, not "verified in a child process"
    for kernel in ("causal-conv1d", "mamba-ssm"):
        assert re.search(rf"{kernel}: installed .* in [\d.]+ s with \w+; import check remembered\n", proc.stderr), \
            proc.stderr
    assert "verified in a child process" not in proc.stderr
    # one installer call in all: the wheels and the dependencies they lack (einops), no separate call for those
    # (issue 34: a later environment ran two installer calls and a check child, three Python children with pip)
    assert len(_installs(started)) == 1 and started == _installs(started), started
    # another environment for the import (another PYTHONPATH), pip the installer: one child checks both kernels,
    # after one installer call - two Python children in all
    third = make_venv()
    other = dict(env, PYTHONPATH=str(tmp_path), FASTPATH_HOOKS_INSTALLER="pip")
    proc3, started3 = _counted(third, "install", "mamba-ssm", env=other, spawns=str(tmp_path / "spawns2b.jsonl"))
    assert proc3.returncode == 0, proc3.stderr
    children = _verification_children(started3)
    assert len(children) == 1, children                       # one child checked both kernels
    assert len(started3) == 2 and len(_installs(started3)) == 1, started3
    assert proc3.stderr.count("; verified in a child process") == 2, proc3.stderr
    payload = _payload(children[0])
    assert [spec["modules"][0] for spec in payload] == ["causal_conv1d", "mamba_ssm"]   # dependency order
    wheel_calls = [a for a in _installs(started) if any(x.endswith(".whl") for x in a)]
    assert len(wheel_calls) == 1 and sum(x.endswith(".whl") for x in wheel_calls[0]) == 2   # one call, both wheels
    # the time is said, for each kernel
    for kernel, label in (("causal-conv1d", "1.6.2.post1"), ("mamba-ssm", "2.3.2.post1")):
        assert re.search(rf"{kernel}: installed {re.escape(kernel + ' ' + label + LABEL)}( \(\+\d+ dependenc(y|ies)\))? "
                         rf"in [\d.]+ s", proc.stderr), proc.stderr
    assert "installing causal-conv1d" in proc.stderr and "together: one installer call, one check" in proc.stderr
    versions = second.versions()
    assert versions["mamba-ssm"] == "2.3.2.post1" + LABEL and versions["causal-conv1d"] == "1.6.2.post1" + LABEL
    # and the next start in that environment: both good, nothing started at all
    proc, started = _counted(second, "install", "mamba-ssm", env=env, spawns=str(tmp_path / "spawns3.jsonl"))
    assert proc.returncode == 0 and started == [], started


def test_a_dependency_installed_with_the_wheels_gets_what_it_needs_in_a_second_call(make_venv, make_wheelhouse,
                                                                                    test_pins, tmp_path):
    """The batch's dependencies go in the wheels' one call without theirs (`--no-deps`); one that needs another
    not installed (depa needs depb) gets it from a second, resolving call - only then."""
    from conftest import A100, CAUSAL_WHEEL
    from fastpath_hooks.facts import pins as pins_mod

    house = make_wheelhouse(causal=True)
    mamba = f"mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-{PY}-{PY}-linux_x86_64.whl"
    wheels.mamba_ssm_wheel(house, filename=mamba)
    wheels.build_wheel(house, "depa", "1.0", {"depa/__init__.py": ""}, requires=("depb>=2",))
    wheels.build_wheel(house, "depb", "2.1", {"depb/__init__.py": ""})
    pins = test_pins(house, extra={"kernels": {"mamba-ssm": {"runtime_deps": ["einops", "depa"]}},
                                   "allowed_distributions": {"names": list(pins_mod.load().allowed) + ["depa", "depb"]}})
    venv = make_venv()
    env = offline_env(house, A100, cache_dir=str(tmp_path / "cache"), pins=pins, FASTPATH_HOOKS_INSTALLER="uv")
    proc, started = _counted(venv, "install", "mamba-ssm", env=env, spawns=str(tmp_path / "spawns.jsonl"))
    assert proc.returncode == 0, proc.stderr
    first, second = _installs(started)
    assert "--no-deps" in first and "depa" in first and {CAUSAL_WHEEL, mamba} <= {os.path.basename(a) for a in first}
    assert "--no-deps" not in second and "depa" in second and not [a for a in second if a.endswith(".whl")]
    assert venv.versions()["depb"] == "2.1" and venv.versions()["depa"] == "1.0"


def test_a_later_environment_installs_a_checked_pure_kernel_with_no_child(make_venv, make_wheelhouse, tmp_path,
                                                                           test_pins):
    """fla (pure wheels) checked in one environment: the next one with the same cache installs the same wheels
    beside the same distributions with no verification child at all (issue 33: it re-verified fla in a child,
    43 s on the H200) - and another environment for the import (another PYTHONPATH) checks it again."""
    from conftest import A100

    house = make_wheelhouse(fla="0.6.0")
    env = offline_env(house, A100, cache_dir=str(tmp_path / "cache"), pins=test_pins(house))
    first = make_venv()
    proc, started = _counted(first, "install", "fla", env=env, spawns=str(tmp_path / "spawns1.jsonl"))
    assert proc.returncode == 0 and "fla: installed" in proc.stderr, proc.stderr
    assert len(_verification_children(started)) == 1, started        # checked once, here
    second = make_venv()
    proc, started = _counted(second, "install", "fla", env=env, spawns=str(tmp_path / "spawns2.jsonl"))
    assert proc.returncode == 0, proc.stderr
    assert _verification_children(started) == [], started             # remembered: no child
    assert re.search(r"fla: installed .* with \w+; import check remembered\n", proc.stderr), proc.stderr
    third = make_venv()
    other = dict(env, PYTHONPATH=str(tmp_path))
    proc, started = _counted(third, "install", "fla", env=other, spawns=str(tmp_path / "spawns3.jsonl"))
    assert proc.returncode == 0 and len(_verification_children(started)) == 1, started


def test_an_install_checks_its_kernels_in_one_child_import_and_the_gated_delta_rule(make_venv, make_wheelhouse,
                                                                                      tmp_path, test_pins):
    """One check child per install (issue 33): fla on a posed Hopper with triton 3.6 (fla#640: it runs tilelang,
    so its decision carries the gated-delta-rule check) - its import and that check's one pass (issue 39: it is
    fla's numeric check too; a command typed runs it now, at the decision's shapes) in ONE child process, torch and
    fla imported once; no child of their own. It ran: the pass is recorded for doctor."""
    from conftest import H100_OLD_TRITON

    house = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi="0.1.12")
    cache = tmp_path / "cache"
    env = offline_env(house, H100_OLD_TRITON + ",numeric=cpu", cache_dir=str(cache),
                      pins=test_pins(house, flash_qla_on=False))
    proc, started = _counted(make_venv(), "install", "fla", env=env, spawns=str(tmp_path / "spawns.jsonl"))
    assert proc.returncode == 0 and "fla: installed" in proc.stderr, proc.stderr
    checks = _verification_children(started)
    installed = re.findall(r"^fastpath-hooks: (\S+): installed", proc.stderr, re.M)
    assert sorted(installed) == ["fla", "tilelang"] and len(checks) == 2, (installed, checks)
    payloads = [_payload(argv) for argv in checks]
    (fla,) = [p for p in payloads if any("gdr" in item for item in p)]
    assert [sorted(k for k in item if k in ("numeric", "gdr")) for item in fla] == [["gdr"]]
    assert not fla[0]["gdr"]["first_call"]   # a command typed waits for no first call
    assert "fla" in json.loads((cache / "jit" / "warm.json").read_text())
