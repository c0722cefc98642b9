"""mamba-ssm, the third compiled kernel, for real on a CPU machine: stand-in mamba-ssm and
causal-conv1d sdists (setup.py files that compile like the real ones, through the nvcc torch's
ninja build would use), a fake CUDA toolkit found through CUDA_HOME, the GPU posed by
FASTPATH_HOOKS_TARGET, real pip/uv installing into real venvs with real transformers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import offline_env
from support import sdists, venvs, wheels
from support.venvs import clean_env

# The lead's H200: torch 2.11 (no release wheels for either kernel), CUDA 13.0, triton 3.6, 16 cores
H200 = "gpu=sm_90,cuda=13.0,torch=2.11.0,triton=3.6.0,cpus=16"
LABEL = "+fph.torch2.11.0.cu130.abi1.sm90"
FIVE = ("mamba_ssm.ops.triton.ssd_combined:mamba_chunk_scan_combined",
        "mamba_ssm.ops.triton.ssd_combined:mamba_split_conv1d_scan_combined",
        "mamba_ssm.ops.triton.selective_state_update:selective_state_update",
        "mamba_ssm.ops.selective_scan_interface:selective_scan_fn",
        "mamba_ssm.ops.selective_scan_interface:mamba_inner_fn")


@pytest.fixture
def toolkit(tmp_path):
    return sdists.fake_cuda_toolkit(str(tmp_path / "cuda"), release="13.0")


@pytest.fixture(scope="session")
def build_deps(artifacts):
    """Real wheel, ninja, packaging and einops wheels (what the builds and mamba_ssm's import need)."""
    dest = os.path.join(artifacts, "mamba-build-deps")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", dest,
                    "wheel", "ninja", "packaging", "einops"], check=True, env=venvs.clean_env())
    return dest


def _house(path, build_deps, *, mamba=True, causal=True) -> str:
    os.makedirs(path)
    for name in os.listdir(build_deps):
        os.link(os.path.join(build_deps, name), os.path.join(path, name))
    if mamba:
        sdists.mamba_ssm_sdist(path)
    if causal:
        sdists.causal_conv1d_sdist(path)
    return path


@pytest.fixture
def sdist_house(tmp_path, build_deps):
    """Offline: the mamba-ssm 2.3.2.post1 and causal-conv1d 1.6.2.post1 sdists and what building them needs."""
    return _house(str(tmp_path / "sdists"), build_deps)


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
    logs = sorted(set(re.findall(r"log: (\S+mamba-ssm\S+\.log)", proc.stderr)))
    assert len(logs) == 1 and logs[0].startswith(cache)
    text = open(logs[0]).read()
    assert "# env: MAMBA_FORCE_BUILD=TRUE" in text and "# env: PYTORCH_NVCC=" in text
    assert len(re.findall(r"fastpath-hooks nvcc wrapper: kept arch=compute_90,code=sm_90;", text)) == 9
    assert re.search(r"installed .*mamba-ssm 2\.3\.2\.post1\+fph\S+ in [\d.]+ s .*verified in a child process", proc.stderr)
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
