"""mamba-ssm, the third compiled kernel, for real on a CPU machine: stand-in mamba-ssm and
causal-conv1d sdists (setup.py files that compile like the real ones, through the nvcc torch's
ninja build would use), a fake CUDA toolkit found through CUDA_HOME, the GPU posed by
FASTPATH_HOOKS_TARGET, real pip/uv installing into real venvs with real transformers.
"""

from __future__ import annotations

import json
import os
import re

import pytest

pytestmark = pytest.mark.slow   # real venvs, real pip/uv installs and builds

from conftest import offline_env
from support import guarded, sdists, wheels
from support.venvs import clean_env

# The lead's H200: torch 2.11 (no release wheels for either kernel), CUDA 13.0, triton 3.6, 16 cores
H200 = "gpu=sm_90,cuda=13.0,torch=2.11.0,triton=3.6.0,cpus=16"
LABEL = "+fph.torch2.11.0.cu130.abi1.sm90"
FIVE = ("mamba_ssm.ops.triton.ssd_combined:mamba_chunk_scan_combined",
        "mamba_ssm.ops.triton.ssd_combined:mamba_split_conv1d_scan_combined",
        "mamba_ssm.ops.triton.selective_state_update:selective_state_update",
        "mamba_ssm.ops.selective_scan_interface:selective_scan_fn",
        "mamba_ssm.ops.selective_scan_interface:mamba_inner_fn")


def _house(path, build_dep_wheels, *, mamba=True, causal=True) -> str:
    os.makedirs(path)
    for name in os.listdir(build_dep_wheels):
        os.link(os.path.join(build_dep_wheels, name), os.path.join(path, name))
    if mamba:
        sdists.mamba_ssm_sdist(path)
    if causal:
        sdists.causal_conv1d_sdist(path)
    return path


@pytest.fixture
def sdist_house(tmp_path, build_dep_wheels):
    """Offline: the mamba-ssm 2.3.2.post1 and causal-conv1d 1.6.2.post1 sdists and what building them needs."""
    return _house(str(tmp_path / "sdists"), build_dep_wheels)


def _imports(venv, env=None) -> dict:
    """What `import mamba_ssm` (and causal_conv1d) gives in a fresh process of the venv."""
    code = (
        "import importlib, json, importlib.metadata as m\n"
        "out = {}\n"
        "for dist, mod in (('mamba-ssm', 'mamba_ssm'), ('causal-conv1d', 'causal_conv1d')):\n"
        "    try:\n"
        "        importlib.import_module(mod)\n"
        "        out[dist] = m.version(dist)\n"
        "    except Exception as exc:\n"
        "        out[dist] = type(exc).__name__\n"
        "out['five'] = []\n"
        f"for item in {FIVE!r}:\n"
        "    mod, _, name = item.partition(':')\n"
        "    try:\n"
        "        out['five'].append(callable(getattr(importlib.import_module(mod), name)))\n"
        "    except Exception:\n"
        "        out['five'].append(False)\n"
        "print(json.dumps(out))\n")
    proc = venv.run(code, env=env or clean_env(FASTPATH_HOOKS_DISABLE="1"), check=True)
    return json.loads(proc.stdout)


def _mamba_calls(toolkit) -> list:
    return [argv for argv in toolkit.calls() if any("selective_scan" in a for a in argv)]


def _conv_calls(toolkit) -> list:
    return [argv for argv in toolkit.calls() if any("causal_conv1d" in a for a in argv)]


def test_plan_and_install_build_mamba_ssm_with_causal_conv1d_for_sm_90_offline(
        make_venv, toolkit, sdist_house, tmp_path, test_pins):
    """The first milestone: the H200's case (torch 2.11 has no release wheel), offline from a
    wheelhouse of the two sdists; then a second environment from the wheel cache."""
    cache = str(tmp_path / "cache")
    env = offline_env(sdist_house, H200, cache_dir=cache, pins=test_pins(), CUDA_HOME=toolkit.home)
    first = make_venv()

    plan = json.loads(first.cli("plan", "--json", env=env).stdout)
    decisions = {d["kernel"]: d for d in plan["decisions"]}
    mamba, conv = decisions["mamba-ssm"], decisions["causal-conv1d"]
    assert (mamba["action"], mamba["rule"], mamba["needs"]) == ("install", "mamba.build", ["causal-conv1d"])
    assert conv["action"] == "install" and conv["rule"] == "causal.build"
    build = mamba["steps"][-1]
    assert build["kind"] == "build" and build["requirements"] == ["mamba-ssm==2.3.2.post1"]
    assert build["env"] == {"MAMBA_FORCE_BUILD": "TRUE"} and build["archs"] == ["sm_90"] and build["no_deps"]
    assert mamba["target"] == {"mamba-ssm": "2.3.2.post1"} and mamba["expected_seconds"] == 117
    assert "with causal-conv1d, installed first" in mamba["reason"]
    # the dry run of mamba-ssm alone shows the joint decision: causal-conv1d first
    dry = first.cli("install", "mamba-ssm", "--dry-run", env=env).stdout
    assert re.search(r"^causal-conv1d: install - building from source for sm_90", dry, re.M), dry
    assert re.search(r"^mamba-ssm: install - building from source for sm_90", dry, re.M), dry

    proc = first.cli("install", "mamba-ssm", env=env)
    assert proc.returncode == 0, proc.stderr
    # nvcc got only the sm_90 pair: causal-conv1d's three .cu files, then mamba-ssm's nine
    assert len(_conv_calls(toolkit)) == 3 and len(_mamba_calls(toolkit)) == 9, toolkit.calls()
    assert all(sdists.gencode_codes(argv) == ["sm_90"] for argv in toolkit.calls())
    logs = sorted({p.replace("$FASTPATH_HOOKS_CACHE_DIR", cache)
                   for p in re.findall(r"log: (\S+mamba-ssm\S+\.log)", proc.stderr)})
    assert len(logs) == 1 and logs[0].startswith(cache)
    text = open(logs[0]).read()
    assert "# env: MAMBA_FORCE_BUILD=TRUE" in text and "# env: PYTORCH_NVCC=" in text
    assert len(re.findall(r"fastpath-hooks nvcc wrapper: kept arch=compute_90,code=sm_90;", text)) == 9
    assert re.search(r"installed mamba-ssm 2\.3\.2\.post1\+fph\S+( \(\+\d+ dependenc(y|ies)\))? in [\d.]+ s .*verified in "
                     r"a child process", proc.stderr), proc.stderr
    assert _imports(first) == {"mamba-ssm": "2.3.2.post1" + LABEL, "causal-conv1d": "1.6.2.post1" + LABEL,
                               "five": [True] * 5}
    cached = sorted(n for n in os.listdir(os.path.join(cache, "wheels")) if n.endswith(".whl"))
    assert [n.split("-")[0] for n in cached] == ["causal_conv1d", "mamba_ssm"]

    # another environment on the machine: both from the cache, nvcc not run again
    calls = toolkit.calls()
    second = make_venv()
    plan = json.loads(second.cli("plan", "--json", env=env).stdout)
    assert [d["rule"] for d in plan["decisions"] if d["kernel"] in ("causal-conv1d", "mamba-ssm")] == \
        ["causal.cache", "mamba.cache"]
    proc = second.cli("install", "mamba-ssm", env=env)
    assert proc.returncode == 0, proc.stderr
    assert toolkit.calls() == calls, "nvcc compiled nothing for the second environment"
    assert _imports(second)["mamba-ssm"] == "2.3.2.post1" + LABEL


# -- release wheels: coherence with fla's tilelang pair, rollback, download ------------------------

from conftest import CAUSAL_WHEEL, H100_OLD_TRITON, PY  # noqa: E402

MAMBA_WHEEL = f"mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-{PY}-{PY}-linux_x86_64.whl"
PAIR = ("tilelang", "apache-tvm-ffi")


def test_installing_mamba_ssm_keeps_flas_tilelang_pair_and_all_import_together(make_venv, make_wheelhouse, test_pins,
                                                                                tmp_path):
    """A posed Hopper with triton 3.6: fla 0.6.0 relies on tilelang 0.1.15 + apache-tvm-ffi 0.1.12. The
    mamba-ssm wheel declares tilelang==0.1.8 and apache-tvm-ffi<=0.1.9, and the wheelhouse holds exactly
    those (a resolver could take them); the install leaves the pair as it was."""
    from fastpath_hooks.facts import pins as pins_mod

    house = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi=("0.1.12", "0.1.9"), causal=True)
    wheels.fake_tilelang_from_pins(house, "0.1.8", pins_mod.load())
    wheels.mamba_ssm_wheel(house, filename=MAMBA_WHEEL)
    venv = make_venv()
    venv.uv_install("fla-core==0.6.0", "flash-linear-attention==0.6.0", "tilelang==0.1.15", "apache-tvm-ffi==0.1.12",
                    "einops", no_deps=True, extra=("--no-index", "--find-links", house))
    before = venv.file_hashes(PAIR + ("fla-core", "flash-linear-attention"))
    env = offline_env(house, H100_OLD_TRITON, cache_dir=str(tmp_path / "cache"), pins=test_pins(house))

    plan = {d["kernel"]: d for d in json.loads(venv.cli("plan", "--json", env=env).stdout)["decisions"]}
    assert (plan["tilelang"]["action"], plan["fla"]["action"]) == ("ok", "ok")
    mamba = plan["mamba-ssm"]
    # the installed tilelang is checked first: `import mamba_ssm` imports it
    assert (mamba["action"], mamba["rule"], mamba["needs"]) == ("install", "mamba.wheel", ["causal-conv1d", "tilelang"])
    assert "declares tilelang==0.1.8 while tilelang 0.1.15 is installed" in mamba["reason"]
    assert all(step["no_deps"] for step in mamba["steps"] if step["kind"] == "wheel")

    proc = venv.cli("install", "mamba-ssm", env=env)
    assert proc.returncode == 0, proc.stderr
    assert venv.file_hashes(PAIR + ("fla-core", "flash-linear-attention")) == before
    assert venv.versions()["mamba-ssm"] == "2.3.2.post1+cu12torch2.10cxx11abiTRUE"   # the release wheel
    requires = venv.run("import importlib.metadata as m; print(m.requires('mamba-ssm'))", check=True).stdout
    assert "tilelang==0.1.8" in requires and "apache-tvm-ffi<=0.1.9" in requires   # declared, left unmet
    code = ("import json, fla, tilelang, tvm_ffi, causal_conv1d, mamba_ssm\n"
            "from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined\n"
            "from fla.ops.gated_delta_rule import chunk_gated_delta_rule\n"
            "print(json.dumps([fla.__version__, tilelang.__version__, tvm_ffi.__version__, mamba_ssm.__version__]))")
    out = venv.run(code, env=clean_env(FASTPATH_HOOKS_DISABLE="1"), check=True).stdout
    assert json.loads(out) == ["0.6.0", "0.1.15", "0.1.12", "2.3.2.post1+cu12torch2.10cxx11abiTRUE"]


def test_a_mamba_ssm_that_crashes_at_import_is_rolled_back(make_venv, make_wheelhouse, test_pins, tmp_path):
    house = make_wheelhouse(causal=True)
    wheels.mamba_ssm_wheel(house, filename=MAMBA_WHEEL, crash=True)
    venv = make_venv()
    before = venv.versions()
    env = offline_env(house, H100_OLD_TRITON.replace("sm_90", "sm_80"), cache_dir=str(tmp_path / "cache"),
                      pins=test_pins(house))
    proc = venv.cli("install", "mamba-ssm", env=env)
    assert proc.returncode == 1
    assert re.search(r"mamba-ssm: .*import mamba_ssm.* killed the process \(SIGABRT\)", proc.stderr), proc.stderr
    assert "rolled back" in proc.stderr
    after = venv.versions()
    # causal-conv1d (installed first, verified) stays; mamba-ssm and the deps of its transaction are gone
    assert after.pop("causal-conv1d").startswith("1.6.2.post1")
    assert after == before
    assert "ModuleNotFoundError" in venv.run("import mamba_ssm", env=clean_env(FASTPATH_HOOKS_DISABLE="1")).stderr


def test_plan_prints_the_constraints_mamba_ssm_is_installed_under_after_causal_conv1d(
        make_venv, make_wheelhouse, test_pins, tmp_path):
    """mamba-ssm needs causal-conv1d: both are installed in one batch (one transaction, one installer
    call for the two wheels, causal-conv1d's first), and `plan` prints the batch's commands and the
    constraints file that call gets before anything is installed (a uv in front of the real one
    keeps a copy of every constraints file it is passed)."""
    house = make_wheelhouse(causal=True)
    wheels.mamba_ssm_wheel(house, filename=MAMBA_WHEEL)
    venv = make_venv()
    # the runtime deps beforehand: a version the resolver picks in an earlier transaction is not plannable
    venv.uv_install("einops", "packaging", extra=("--no-index", "--find-links", house))
    captured = str(tmp_path / "captured")
    bindir = guarded.capturing_uv(str(tmp_path), captured)
    env = offline_env(house, H100_OLD_TRITON.replace("sm_90", "sm_80"), cache_dir=str(tmp_path / "cache"),
                      pins=test_pins(house), FASTPATH_HOOKS_INSTALLER="uv")
    env["PATH"] = bindir + os.pathsep + env["PATH"]

    data = json.loads(venv.cli("plan", "--json", env=env).stdout)
    assert data["installer"] == "uv"
    assert ["causal-conv1d", "mamba-ssm"] in data["batches"]
    expected = data["kernel_constraints"]["causal-conv1d"]   # the batch's, under its first kernel
    assert not data["kernel_constraints"]["mamba-ssm"] and not data["commands"]["mamba-ssm"]
    assert not any(line.startswith(("causal-conv1d==", "mamba-ssm==")) for line in expected)   # both are named
    (wheel_call,) = [c for c in data["commands"]["causal-conv1d"] if c["kind"] == "wheel"]
    assert [os.path.basename(a) for a in wheel_call["argv"][-2:]] == [CAUSAL_WHEEL, MAMBA_WHEEL]   # dependency order

    proc = venv.cli("install", "mamba-ssm", env=env)
    assert proc.returncode == 0, proc.stderr
    files = sorted(open(os.path.join(captured, name)).read().splitlines() for name in os.listdir(captured))
    assert files == [expected] * len(data["commands"]["causal-conv1d"])
    assert "installing causal-conv1d and mamba-ssm together: one installer call" in proc.stderr, proc.stderr
    assert "causal-conv1d: installing - 1.6.2.post1" in proc.stderr and "mamba-ssm: installing - 2.3.2.post1" in proc.stderr


def test_download_mamba_ssm_fetches_its_release_wheel_and_causal_conv1d_s(make_venv, tmp_path, test_pins):
    """`download mamba-ssm` for a posed Hopper: the release wheels of mamba-ssm and of the kernel it is
    used with, from the mirrors FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL / _CAUSAL_CONV1D_WHEEL_URL name."""
    release = str(tmp_path / "release")
    mamba = wheels.mamba_ssm_wheel(release, filename=MAMBA_WHEEL)
    wheels.fake_causal_conv1d(release, CAUSAL_WHEEL)
    pins = test_pins(release, extra={"kernels": {"mamba-ssm": {"runtime_deps": []}}})
    venv = make_venv(transformers=None, torch=False)
    dest = str(tmp_path / "wheelhouse")
    env = clean_env(FASTPATH_HOOKS_PINS=pins, FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"),
                    FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL="file://" + release + "/",
                    FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL="file://" + release + "/")
    proc = venv.cli("download", "mamba-ssm", "--dest", dest, "--target", H100_OLD_TRITON + ",transformers=5.24.0", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(os.listdir(dest)) == sorted([CAUSAL_WHEEL, MAMBA_WHEEL])
    assert wheels.sha256_of(os.path.join(dest, MAMBA_WHEEL)) == wheels.sha256_of(mamba)


def test_build_mamba_ssm_for_a_cluster_then_nodes_install_offline_with_builds_forbidden(
        make_venv, toolkit, sdist_house, tmp_path, test_pins):
    """`fastpath-hooks build mamba-ssm --arch sm_90 --dest DIR` on a host without a GPU (the same
    nvcc wrapper, MAMBA_FORCE_BUILD), and causal-conv1d's; a node installs both from DIR alone."""
    pins = test_pins()
    builder = make_venv(transformers=None)
    dest = str(tmp_path / "cluster-wheelhouse")
    env = offline_env(sdist_house, "cuda=13.0,torch=2.11.0,triton=3.6.0,cpus=16", cache_dir=str(tmp_path / "builder"),
                      pins=pins, CUDA_HOME=toolkit.home)
    for kernel in ("mamba-ssm", "causal-conv1d"):
        proc = builder.cli("build", kernel, "--arch", "sm_90", "--dest", dest, env=env)
        assert proc.returncode == 0, proc.stderr
    assert len(_mamba_calls(toolkit)) == 9 and len(_conv_calls(toolkit)) == 3
    assert all(sdists.gencode_codes(argv) == ["sm_90"] for argv in toolkit.calls())
    built = sorted(n for n in os.listdir(dest) if n.endswith(".whl"))
    assert [n.split("-")[:2] for n in built] == [["causal_conv1d", "1.6.2.post1" + LABEL],
                                                 ["mamba_ssm", "2.3.2.post1" + LABEL]]
    # asked again, the cache answers
    again = builder.cli("build", "mamba-ssm", "--arch", "sm_90", env=env)
    assert again.returncode == 0 and "is already in the wheel cache" in again.stdout
    # `build fla` is refused with the kernels that are built
    refused = builder.cli("build", "fla", env=env)
    assert refused.returncode == 2 and "`build` knows causal-conv1d, mamba-ssm" in refused.stderr

    for name in os.listdir(sdist_house):   # what the wheels import (einops) travels with them
        if name.startswith("einops"):
            os.link(os.path.join(sdist_house, name), os.path.join(dest, name))
    calls = toolkit.calls()
    node = make_venv()
    node_env = offline_env(dest, H200, cache_dir=str(tmp_path / "node"), pins=pins, FASTPATH_HOOKS_ALLOW_BUILD="0")
    plan = {d["kernel"]: d["rule"] for d in json.loads(node.cli("plan", "--json", env=node_env).stdout)["decisions"]}
    assert (plan["causal-conv1d"], plan["mamba-ssm"]) == ("causal.wheelhouse", "mamba.wheelhouse")
    proc = node.cli("install", "mamba-ssm", env=node_env)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"mamba-ssm 2\.3\.2\.post1\+fph\.torch2\.11\.0\.cu130\.abi1\.sm90 \(\+1 dependency\) in [\d.]+ s",
                     proc.stderr), proc.stderr   # einops came with it
    assert toolkit.calls() == calls, "no compiler on the node"
    assert _imports(node) == {"mamba-ssm": "2.3.2.post1" + LABEL, "causal-conv1d": "1.6.2.post1" + LABEL,
                              "five": [True] * 5}


def test_mamba_ssms_optional_tilelang_import_installs_nothing_until_fla_asks(make_venv, make_wheelhouse, test_pins,
                                                                              tmp_path):
    """mamba-ssm 2.3.2.post1 tries `import tilelang` for its Mamba-3 kernels (guarded by `except ImportError`,
    as the stand-in's __init__). On a posed Hopper with triton 3.6, with the tilelang pair in the wheelhouse,
    `import mamba_ssm` installs nothing while neither tilelang nor fla is here (tilelang serves fla), and
    mamba-ssm imports with its kernels; `import fla` still brings its pair."""
    house = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi=("0.1.12",), causal=True)
    wheels.mamba_ssm_wheel(house, filename=MAMBA_WHEEL)
    venv = make_venv()
    venv.uv_install(os.path.join(house, MAMBA_WHEEL), "einops", no_deps=True, extra=("--no-index", "--find-links", house))
    env = offline_env(house, H100_OLD_TRITON, cache_dir=str(tmp_path / "cache"), pins=test_pins(house))
    optional = ("import fastpath_hooks; fastpath_hooks.install()\n"
                "import sys, mamba_ssm\n"
                "from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined\n"
                "print(mamba_ssm.__version__, 'tilelang' in sys.modules, mamba_chunk_scan_combined.__module__)\n")
    proc = venv.run(optional, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2.3.2.post1+cu12torch2.10cxx11abiTRUE", "False",
                                   "mamba_ssm.ops.triton.ssd_combined"], proc.stdout + proc.stderr
    assert "tilelang" not in venv.versions() and "tilelang" not in proc.stderr, proc.stderr
    proc = venv.run("import fastpath_hooks; fastpath_hooks.install()\nimport fla, tilelang\nprint(tilelang.__version__)",
                    env=env)
    assert proc.stdout.strip() == "0.1.15", proc.stdout + proc.stderr
    assert venv.versions()["tilelang"] == "0.1.15"


def test_a_broken_tilelang_is_checked_before_mamba_ssm_which_is_not_blamed(make_venv, make_wheelhouse, test_pins,
                                                                           tmp_path):
    """`import mamba_ssm` imports an installed tilelang under `except ImportError`: a pair that aborts kills
    it. So on a posed Hopper the installed tilelang is checked first (mamba-ssm `needs` it, pins
    `imports_optional`); when it cannot be made to work, mamba-ssm's message names tilelang, and mamba-ssm
    itself is left installed, never rolled back for tilelang's fault."""
    house = make_wheelhouse(tilelang="0.1.15", tilelang_abort=True, tvm_ffi=("0.1.12",), causal=True)
    wheels.mamba_ssm_wheel(house, filename=MAMBA_WHEEL)
    venv = make_venv()
    venv.uv_install(*(os.path.join(house, f) for f in os.listdir(house)
                      if f.startswith(("tilelang", "apache_tvm_ffi", "mamba_ssm", "causal_conv1d", "einops"))),
                    no_deps=True)
    env = offline_env(house, H100_OLD_TRITON, cache_dir=str(tmp_path / "cache"), pins=test_pins(house))
    plan = {d["kernel"]: d for d in json.loads(venv.cli("plan", "--json", env=env).stdout)["decisions"]}
    assert (plan["mamba-ssm"]["rule"], plan["mamba-ssm"]["needs"]) == ("mamba.ok", ["tilelang"])
    proc = venv.cli("install", "mamba-ssm", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "mamba-ssm: blocked - needs tilelang here, which is not usable (fix tilelang first" in proc.stderr, proc.stderr
    assert not re.search(r"mamba-ssm: .*import mamba_ssm.* killed the process", proc.stderr), proc.stderr
    assert venv.versions()["mamba-ssm"] == "2.3.2.post1+cu12torch2.10cxx11abiTRUE"


def test_a_batch_whose_lead_computes_wrongly_is_rolled_back_and_blocked_with_the_measured_error(
        make_venv, make_wheelhouse, test_pins, tmp_path):
    """causal-conv1d and mamba-ssm in one batch, causal-conv1d's numbers wrong (numeric=cpu: CPU stand-ins):
    the batch is rolled back, causal-conv1d is blocked with the measured error, as a lone install is,
    and mamba-ssm, which needs it, is not installed."""
    house = make_wheelhouse()
    wheels.fake_causal_conv1d(house, CAUSAL_WHEEL, wrong=True)
    wheels.mamba_ssm_wheel(house, filename=MAMBA_WHEEL)
    venv = make_venv()
    venv.uv_install("einops", "packaging", extra=("--no-index", "--find-links", house))
    before = venv.versions()
    env = offline_env(house, H100_OLD_TRITON.replace("sm_90", "sm_80") + ",numeric=cpu",
                      cache_dir=str(tmp_path / "cache"), pins=test_pins(house), FASTPATH_HOOKS_INSTALLER="uv")
    proc = venv.cli("install", "causal-conv1d", "mamba-ssm", env=env)
    assert proc.returncode == 1, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "installing causal-conv1d and mamba-ssm together" in proc.stderr, proc.stderr
    assert re.search(r"^fastpath-hooks: causal-conv1d: blocked - on sm_80 \(CPU tensors\), causal_conv1d_fn forward "
                     r"differs from torch by 0\.5", proc.stderr, re.M), proc.stderr
    assert "rolled back" in proc.stderr and venv.versions() == before
