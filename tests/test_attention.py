"""Flash attention (issue 41, the kernels half): fastpath_hooks.attention() per posed machine (fast), the numeric
check of a flash attention against torch's SDPA in the one check child (slow: a child importing torch), and, in
real venvs of every transformers era, the gates answering True in the same process once a model asks for flash
attention - built from stand-in sdists by a stand-in nvcc, FA3 trimmed and for sm_90a only, FA2 for sm_80 only,
an sdpa model installing nothing (slow)."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys

import pytest

import fastpath_hooks
from support import sdists, venvs

TIME = {"FASTPATH_HOOKS_TIMEOUT": "100000"}   # the builds' estimates outlast the default timeout


@pytest.mark.parametrize("target,implementation,why", [
    ("gpu=sm_80,cuda=13.0,torch=2.13.0,nvcc=13.0", "flash_attention_2", r"sm_80: flash-attn can be had \(from source for sm_80"),
    ("gpu=sm_86,cuda=13.0,torch=2.13.0,nvcc=13.0", "flash_attention_2", r"sm_86: flash-attn can be had \(from source for sm_80"),
    ("gpu=sm_89,cuda=12.8,torch=2.8.0", "flash_attention_2", r"sm_89: flash-attn can be had \(2\.8\.3, the release wheel"),
    ("gpu=sm_90,cuda=12.8,torch=2.13.0,nvcc=12.8", "flash_attention_3", r"sm_90: flash-attn-3 can be had \(from source for sm_90"),
    ("gpu=sm_90,cuda=12.8,torch=2.13.0,nvcc=none", "sdpa", r"sm_90: flash-attn-3 cannot be had here: no wheel fits; a build needs nvcc"),
    ("gpu=sm_100,cuda=13.0,torch=2.13.0,nvcc=13.0", "sdpa", r"sm_100: no flash attention is preferred on it"),
    ("gpu=gfx942,hip=6.4,torch=2.13.0", "sdpa", r"flash attention is managed on CUDA GPUs only; this is ROCM"),
    ("gpu=none,torch=2.13.0", "sdpa", r"no CUDA/XPU accelerator: torch 2.13.0 is a CPU build"),
], ids=["sm_80", "sm_86", "sm_89-wheel", "sm_90", "sm_90-no-nvcc", "sm_100", "rocm", "cpu"])
def test_attention_names_the_implementation_for_this_machine_with_its_reason(monkeypatch, tmp_path, target,
                                                                               implementation, why):
    monkeypatch.setenv("FASTPATH_HOOKS_TARGET", target)
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path))
    for key, value in TIME.items():
        monkeypatch.setenv(key, value)
    chosen = fastpath_hooks.attention()
    assert chosen == implementation and chosen.implementation == implementation and str(chosen) == implementation
    assert isinstance(chosen, str) and re.search(why, chosen.reason), chosen.reason
    assert pickle.loads(pickle.dumps(chosen)).reason == chosen.reason
    with pytest.raises(AttributeError):
        chosen.reason = "changed"
    # a choice the caller made is never changed
    kept = fastpath_hooks.attention("eager")
    assert kept == "eager" and "kept as given" in kept.reason


def test_attention_is_not_loaded_by_importing_the_package():
    code = ("import sys, fastpath_hooks; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers') or m.startswith('fastpath_hooks.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=venvs.clean_env(), timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- the numeric check: the one check child, the shipped checks, stand-ins that compute in torch (or wrongly) ----

def _stand_in(tmp_path, *, wrong: bool) -> str:
    root = tmp_path / ("wrong" if wrong else "right")
    module = sdists.ATTENTION_MODULE.replace("WRONG_VALUE", repr(wrong)).replace("VERSION", "2.8.3.post2")
    for name, text in {"flash_attn/__init__.py": module, "flash_attn_interface.py": module}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return str(root)


@pytest.mark.slow   # two child interpreters importing torch: ~10 s here
def test_a_flash_attention_computing_wrongly_fails_its_check_with_the_measured_error(tmp_path):
    from fastpath_hooks.facts.pins import load
    from test_numeric import _numbers, _plan

    pins = load()
    assert {c.reference for k in ("flash-attn", "flash-attn-3") for c in pins.kernel(k).numeric_checks} == {"attention"}
    for kernel in ("flash-attn", "flash-attn-3"):
        plan = _plan(kernel, "gpu=sm_90,cuda=12.8,torch=2.13.0,numeric=cpu", root=str(tmp_path / "cache"))
        wrong = _numbers(plan, (kernel,), timeout=120, env_extra=(("PYTHONPATH", _stand_in(tmp_path, wrong=True)),))
        assert not wrong.ok and wrong.numeric, wrong.detail
        assert re.fullmatch(r"on sm_90 \(CPU tensors\), flash_attn_func forward differs from torch by 0\.5\d*, relative "
                            r"error [\d.e-]+ \(tolerance 0\.02\)", wrong.detail), wrong.detail
        right = _numbers(plan, (kernel,), timeout=120, env_extra=(("PYTHONPATH", _stand_in(tmp_path, wrong=False)),))
        assert right.ok, right.detail
        assert "numbers match torch on sm_90 (CPU tensors): 2 checks" in right.detail, right.detail


# -- real transformers of every era: a model asks for flash attention, the gate answers True in that process ------

ERAS = ("5.25.0", "5.24.0", "5.14.1", "4.57.6")
CHILD = r'''
import importlib.metadata as md, json, sys
import fastpath_hooks
assert fastpath_hooks.install() is True
from transformers import AutoConfig, AutoModelForCausalLM
import transformers.utils.import_utils as iu
impl = sys.argv[1]
gate = getattr(iu, "is_flash_attn_2_available" if impl.endswith("2") else "is_flash_attn_3_available")
flash = lambda: sorted(d.metadata["Name"] for d in md.distributions() if "flash" in d.metadata["Name"].lower())
cfg = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=64)
out = {"at_start": flash()}
out.update(sdpa=AutoModelForCausalLM.from_config(cfg).config._attn_implementation, asked_plainly=gate())
out["after_sdpa"] = flash()
model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
out.update(impl=model.config._attn_implementation, gate=gate(), installed=flash())
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def attention_world(tmp_path_factory, build_dep_wheels):
    """One wheelhouse (the stand-in flash-attn sdist, FA3 in its hopper/, and what building needs), one fake CUDA
    12.8 toolkit and one wheel cache for every era: the first era builds, the others install from the cache."""
    root = tmp_path_factory.mktemp("attention")
    house = str(root / "house")
    sdist = sdists.flash_attn_sdist(house)
    for name in os.listdir(build_dep_wheels):
        os.link(os.path.join(build_dep_wheels, name), os.path.join(house, name))
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", house,
                    "psutil", "setuptools"], check=True, env=venvs.clean_env())
    pins = str(root / "pins.json")
    with open(pins, "w") as fh:   # FA3's source: the stand-in sdist's hopper/ (the shipped pins: the repository's)
        json.dump({"kernels": {"flash-attn-3": {"source_build": {"url": f"file://{sdist}#subdirectory=hopper"}}}}, fh)
    return {"house": house, "pins": pins, "cache": str(root / "cache"),
            "toolkit": sdists.fake_cuda_toolkit(str(root / "cuda"), release="12.8"), "built": []}


@pytest.mark.slow
@pytest.mark.parametrize("transformers", ERAS)
def test_a_model_asking_for_flash_attention_gets_it_built_for_its_gpu_and_the_gate_says_true(
        attention_world, tmp_path, torch_wheel, fastpath_wheel, transformers):
    world, tk = attention_world, attention_world["toolkit"]
    venv = venvs.make_venv(str(tmp_path / "venv"), torch_wheel=torch_wheel, fastpath_wheel=fastpath_wheel,
                           transformers=transformers)
    for impl, gpu, code, dist, label in (("flash_attention_2", "sm_80", "sm_80", "flash-attn", "sm80"),
                                         ("flash_attention_3", "sm_90", "sm_90a", "flash_attn_3", "sm90")):
        env = venvs.clean_env(FASTPATH_HOOKS_FIND_LINKS=world["house"], FASTPATH_HOOKS_OFFLINE="1",
                              FASTPATH_HOOKS_TARGET=f"gpu={gpu},cuda=12.8,torch=2.13.0,cpus=16",
                              FASTPATH_HOOKS_CACHE_DIR=world["cache"], FASTPATH_HOOKS_PINS=world["pins"],
                              CUDA_HOME=tk.home, **TIME)
        before = len(tk.calls())
        proc = venv.run(CHILD, env=env, args=[impl], timeout=900)
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert found, proc.stdout + proc.stderr
        out = json.loads(found[-1][len("RESULT "):])
        # an sdpa model (and the gate asked by plain code) installs nothing; the flash model gets it, the gate says True
        assert out["sdpa"] == "sdpa" and out["asked_plainly"] is False and out["after_sdpa"] == out["at_start"], (out, proc.stderr)
        assert out["impl"] == impl and out["gate"] is True, (out, proc.stderr)
        assert [n for n in out["installed"] if n.replace("_", "-") == dist.replace("_", "-")], out
        assert re.search(rf"installed {dist.replace('_', '-')} [\w.]+\+fph\.torch2\.13\.0\.cu128\.abi1\.{label}", proc.stderr), proc.stderr
        calls = tk.calls()[before:]
        if calls:   # built here (the first era): for this GPU's code only, FA3 trimmed
            world["built"].append(impl)
            assert {c for argv in calls for c in sdists.gencode_codes(argv)} == {code}, calls
            if impl == "flash_attention_3":
                flags = {a for argv in calls for a in argv if a.startswith("-DFLASHATTENTION_DISABLE_")}
                assert flags == {f"-DFLASHATTENTION_DISABLE_{n}" for n in (
                    "FP8", "PAGEDKV", "APPENDKV", "SPLIT", "SOFTCAP", "LOCAL", "CLUSTER", "SM8x")}, flags
                assert not any("_sm80.cu" in a or "_paged" in a or "e4m3" in a for argv in calls for a in argv)
                assert any("flash_bwd_hdim" in a for argv in calls for a in argv), "backward kept"
        else:
            assert "from the local wheel cache" in proc.stderr, proc.stderr
    assert set(world["built"]) == {"flash_attention_2", "flash_attention_3"}, "the first era built both"
