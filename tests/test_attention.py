"""Flash attention (issue 41, the kernels half): fastpath_hooks.attention() per posed machine (fast), the numeric
check of a flash attention against torch's SDPA in the one check child (slow: a child importing torch), and, in
real venvs of every transformers era, the gates answering True in the same process once a model asks for flash
attention - built from stand-in sdists by a stand-in nvcc, FA3 trimmed and for sm_90a only, FA2 for sm_80 only,
an sdpa model installing nothing (slow)."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import re
import subprocess
import sys

import pytest

import fastpath_hooks
from fastpath_hooks.facts.pins import load
from fastpath_hooks.facts.probe import attention_shapes
from fastpath_hooks.facts.settings import Settings
from support import hub, sdists, venvs
from test_policy import make_env, plan_for

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


# -- FA3 trimmed to the models in use: the switch lists per real transformers config ---------------------------

ALWAYS_OFF = {f"FLASH_ATTENTION_DISABLE_{n}" for n in ("FP8", "PAGEDKV", "APPENDKV", "SPLIT", "SOFTCAP", "CLUSTER",
                                                        "SM80")}


def _hdims_off(*dims) -> set:
    return {f"FLASH_ATTENTION_DISABLE_HDIM{d}" for d in dims}


@pytest.mark.parametrize("models,off,variant", [
    # Qwen3.5's full attention: head dim 256, no sliding window
    (("qwen3_5",), _hdims_off(64, 96, 128, 192) | {"FLASH_ATTENTION_DISABLE_LOCAL"}, ("hd256",)),
    # Llama's head dim is derived (hidden_size / heads): unknown, every head dim kept; no sliding window
    (("llama",), {"FLASH_ATTENTION_DISABLE_LOCAL"}, ()),
    # Mistral: derived head dim, a sliding window (4096 by default): local attention kept
    (("mistral",), set(), ("swa",)),
    # Gemma 3: 256 and a sliding window; Qwen3: 128 (a sliding window by default, off by use_sliding_window)
    (("gemma3",), _hdims_off(64, 96, 128, 192), ("hd256", "swa")),
    (("qwen3", "qwen3_5"), _hdims_off(64, 96, 192), ("hd128x256", "swa")),
    # one unknown model among known ones: every head dim
    (("qwen3_5", "llama"), {"FLASH_ATTENTION_DISABLE_LOCAL"}, ()),
    # none imported (`fastpath-hooks build flash-attn-3` ahead of time): everything a model may call
    ((), set(), ("swa",)),
], ids=["qwen3_5", "llama", "mistral", "gemma3", "qwen3+qwen3_5", "qwen3_5+llama", "none"])
def test_fa3_is_trimmed_to_the_head_dims_and_window_of_the_imported_configs(models, off, variant):
    """The switches FA3's build gets and the label its wheel gets, from the real configuration modules of the
    installed transformers (their class defaults, as the probe reads them)."""
    pins = load()
    modules = {f"transformers.models.{m}.configuration_{m}": importlib.import_module(
        f"transformers.models.{m}.configuration_{m}") for m in models}
    env = make_env(gpus=("sm_90",), torch="2.13.0", attention_shapes=attention_shapes(pins, modules))
    step = plan_for(env, Settings(timeout=1e6), pins)["flash-attn-3"].steps[-1]
    assert step.kind == "build" and step.variant == variant, step
    assert {k for k, v in step.env if "_DISABLE_" in k and v == "TRUE"} == ALWAYS_OFF | off, step.env


def test_attention_is_not_loaded_by_importing_the_package():
    code = ("import sys, fastpath_hooks; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers') or m.startswith('fastpath_hooks.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=venvs.clean_env(), timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- the numeric check: the one check child, the shipped checks, stand-ins that compute in torch (or wrongly) ----

@pytest.mark.parametrize("shapes,dims", [
    ((("qwen3_5", 256, 4, 16, False),), (256,)),                                   # Qwen3.5: 256, not 128
    ((("qwen3_5", 256, 4, 16, False), ("llama", None, None, 32, False)), (128, 256)),   # unknown: the check's own
    ((("llama", None, None, 32, False),), ()),                                      # only unknown: as pinned
    ((), ()),
], ids=["qwen3_5", "qwen3_5+llama", "llama", "none"])
def test_the_attention_checks_run_at_the_models_head_dims(shapes, dims):
    from fastpath_hooks.act.numeric import _key, plan_for

    pins = load()
    env = make_env(gpus=("sm_90",), torch="2.13.0", attention_shapes=shapes)
    for kernel in ("flash-attn", "flash-attn-3"):
        plan = plan_for(kernel, env, pins)
        assert plan.head_dims == dims
        assert sorted({c.shapes["head_dim"] for c in plan.checks}) == list(dims or (128,))
        assert len(plan.checks) == 2 * max(1, len(dims))
        assert all(("at head dim" in c.name) == bool(dims) for c in plan.checks)
        # remembered apart from a check at other head dims
        assert (_key(plan, "digest", "sm_90") == _key(plan_for(kernel, make_env(gpus=("sm_90",), torch="2.13.0"), pins), "digest",
                                                       "sm_90")) == (not dims)

def _numbers(plans, *, env_extra, timeout):
    """The kernels' numeric checks through the one check child (act/verify.verify_many), their imports trivial."""
    from types import SimpleNamespace

    from fastpath_hooks.act.verify import verify_many

    specs = [SimpleNamespace(name=p.kernel, verify_modules=(), verify_attributes=(), distributions=(p.kernel,))
             for p in plans]
    return verify_many(specs, timeout=timeout, env_extra=env_extra, numeric=list(plans))


def _stand_in(tmp_path, *, wrong: bool) -> str:
    root = tmp_path / ("wrong" if wrong else "right")
    module = sdists.ATTENTION_MODULE.replace("WRONG_VALUE", repr(wrong)).replace("VERSION", "2.8.3.post2")
    for name, text in {"flash_attn/__init__.py": module, "flash_attn_interface.py": module}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return str(root)


@pytest.mark.slow   # two child interpreters importing torch: ~10 s here
def test_a_flash_attention_computing_wrongly_fails_its_check_with_the_measured_error(tmp_path):
    from test_numeric import _plan

    pins = load()
    assert {c.reference for k in ("flash-attn", "flash-attn-3") for c in pins.kernel(k).numeric_checks} == {"attention"}
    # FA2 at the checks' own head dim (posed: 128); FA3 at the model's (posed: Qwen3.5's full attention, 256); both
    # kernels' checks in one child, as an install of both runs them
    plans = [_plan(kernel, f"gpu=sm_90,cuda=12.8,torch=2.13.0,numeric=cpu{dims}", root=str(tmp_path / "cache"))
             for kernel, dims in (("flash-attn", ",head_dims=128x128"), ("flash-attn-3", ",head_dims=256x256"))]
    wrong = _numbers(plans, timeout=120, env_extra=(("PYTHONPATH", _stand_in(tmp_path, wrong=True)),))
    right = _numbers(plans, timeout=120, env_extra=(("PYTHONPATH", _stand_in(tmp_path, wrong=False)),))
    for bad, good, at in zip(wrong, right, ("", " at head dim 256")):
        assert not bad.ok and bad.numeric, bad.detail
        assert re.fullmatch(rf"on sm_90 \(CPU tensors\){at}, flash_attn_func forward differs from torch by 0\.5\d*, "
                            r"relative error [\d.e-]+ \(tolerance 0\.02\)", bad.detail), bad.detail
        assert good.ok and f"numbers match torch on sm_90 (CPU tensors){at}: 2 checks" in good.detail, good.detail


# -- real transformers of every era: a model asks for flash attention, the gate answers True in that process ------

# run in this order, one after another in one venv: the first era builds FA2 and FA3 (trimmed to Qwen3.5's head dim),
# the next take them from the wheel cache, 4.57 builds FA3 again (its configs' head dims are unknown: untrimmed);
# 5.25, which brings HF `kernels` (the older eras have none), last
ERAS = ("5.14.1", "5.24.0", "4.57.6", "5.25.0")
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=64)
# what asks for FA3: Qwen3.5's text model, full attention only (its config's class defaults: head dim 256, no sliding
# window) where the era has it; 4.57's configs hold no class defaults to read: every head dim, local attention kept
QWEN35 = dict(TINY, layer_types=["full_attention"], head_dim=16)

# save the model (an sdpa one: nothing installed, the gate asked by plain code says False), load it asking for
# `impl`, one training step; what served it: the gate, the distributions, the stand-ins' calls
CHILD = r"""
import importlib.metadata as md, json, os, sys, torch
import fastpath_hooks
assert fastpath_hooks.install() is True
from transformers import AutoConfig, AutoModelForCausalLM
import transformers.utils.import_utils as iu
impl, model_type, config, path = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
gate = getattr(iu, "is_flash_attn_2_available" if impl.endswith("2") else "is_flash_attn_3_available")
flash = lambda: sorted(d.metadata["Name"] for d in md.distributions() if "flash" in d.metadata["Name"].lower())
out = {"at_start": flash()}
sdpa = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))
sdpa.save_pretrained(path)
out.update(sdpa=sdpa.config._attn_implementation, asked_plainly=gate(), after_sdpa=flash())
model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=impl)
ids = torch.randint(0, 64, (1, 12))
model(input_ids=ids, labels=ids).loss.backward()
out.update(impl=model.config._attn_implementation, gate=gate(), installed=flash())
out["calls"] = {name: dict(m.CALLS) for name, m in list(sys.modules.items())
                if name in ("flash_attn", "flash_attn_interface") or name.endswith("_standin")}
print("RESULT " + json.dumps(out))
"""

# transformers 5.25 alone, then with fastpath-hooks: flash attention asked for where no package can be had (no nvcc)
# and the hub is offline: FA3's hub build is not cached, FA2's is a LOCAL_KERNELS stand-in
HUB_CHILD = r"""
import json, os, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
path = sys.argv[1]
AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **json.loads(sys.argv[2]))).save_pretrained(path)
def load(impl):
    try:
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=impl)
        ids = torch.randint(0, 64, (1, 12))
        model(input_ids=ids, labels=ids).loss.backward()
        return model.config._attn_implementation
    except Exception as exc:
        return f"raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
out = {"bare": load("flash_attention_3")}
import fastpath_hooks
said = []
assert fastpath_hooks.install(on_event=lambda e: said.append(e["message"])) is True
out.update(fa3=load("flash_attention_3"), fa2=load("flash_attention_2"), said=said)
from fastpath_hooks.engine import hub
out["hub"] = {c.entry.name: [c.serve, c.source, c.reason] for c in hub.chosen()}
out["calls"] = {name: dict(m.CALLS) for name, m in list(sys.modules.items()) if name.endswith("_standin")}
print("RESULT " + json.dumps(out))
"""


def result(proc) -> dict:
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert found, proc.stdout + proc.stderr
    return json.loads(found[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def attention_world(tmp_path_factory, build_dep_wheels, torch_wheel, fastpath_wheel):
    """One wheelhouse (the stand-in flash-attn sdist, FA3 in its hopper/, and what building needs), one fake CUDA
    12.8 toolkit and one wheel cache for every era: the first era builds, the others install from the cache; the
    hub's flash attentions as LOCAL_KERNELS stand-ins; one venv per era (`venv(version)`), made when first asked."""
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
    made: dict = {}

    def venv(version: str):
        """The module's one venv with transformers `version` and no flash attention package: the eras follow one
        another in it (pip-installing another transformers), as torch's start-up (its .pyc, written by the first
        child) is the same for every era."""
        if not made:
            made["venv"] = venvs.make_venv(str(root / "venv"), torch_wheel=torch_wheel, fastpath_wheel=fastpath_wheel,
                                           transformers=version)
        subprocess.run([venvs.uv(), "pip", "uninstall", "-q", "--python", made["venv"].python, "flash-attn",
                        "flash-attn-3"], env=venvs.clean_env(), capture_output=True)
        if made.get("transformers", version) != version:
            made["venv"].uv_install(f"transformers=={version}")
        made["transformers"] = version
        return made["venv"]

    return {"house": house, "pins": pins, "cache": str(root / "cache"), "root": root, "venv": venv,
            "toolkit": sdists.fake_cuda_toolkit(str(root / "cuda"), release="12.8"), "built": [],
            "fa2_hub": hub.attention_standin(str(root / "hub" / "flash-attn2"), "kernels-community/flash-attn2")}


@pytest.mark.slow
@pytest.mark.parametrize("transformers", ERAS)
def test_a_model_asking_for_flash_attention_gets_it_built_for_its_gpu_and_the_gate_says_true(
        attention_world, tmp_path, transformers):
    world, tk = attention_world, attention_world["toolkit"]
    venv = world["venv"](transformers)
    qwen35 = transformers != "4.57.6"
    for impl, gpu, code, dist, label, model in (
            ("flash_attention_2", "sm_80", "sm_80", "flash-attn", "sm80", ("llama", TINY)),
            ("flash_attention_3", "sm_90", "sm_90a", "flash_attn_3", "sm90",
             ("qwen3_5_text", QWEN35) if qwen35 else ("llama", TINY))):
        env = venvs.clean_env(FASTPATH_HOOKS_FIND_LINKS=world["house"], FASTPATH_HOOKS_OFFLINE="1",
                              FASTPATH_HOOKS_TARGET=f"gpu={gpu},cuda=12.8,torch=2.13.0,cpus=16",
                              FASTPATH_HOOKS_CACHE_DIR=world["cache"], FASTPATH_HOOKS_PINS=world["pins"],
                              CUDA_HOME=tk.home, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
                              LOCAL_KERNELS=f"kernels-community/flash-attn2={world['fa2_hub']}", **TIME)
        before = len(tk.calls())
        proc = venv.run(CHILD, env=env, args=[impl, model[0], json.dumps(model[1]), str(tmp_path / impl)], timeout=900)
        out = result(proc)
        # an sdpa model (and the gate asked by plain code) installs nothing; the flash model gets it, the gate says True
        assert out["sdpa"] == "sdpa" and out["asked_plainly"] is False and out["after_sdpa"] == out["at_start"], (out, proc.stderr)
        assert out["impl"] == impl and out["gate"] is True, (out, proc.stderr)
        assert [n for n in out["installed"] if n.replace("_", "-") == dist.replace("_", "-")], out
        # the package computes the step, not the hub's stand-in (5.25 loads that only where the package is missing)
        module = "flash_attn" if impl.endswith("2") else "flash_attn_interface"
        assert sum(out["calls"][module].values()) > 0 and not any(out["calls"].get("_flash_attn2_standin", {}).values()), out
        calls = tk.calls()[before:]
        # FA3's wheel: built for the head dim Qwen3.5's config has, no sliding window; every head dim and local attention
        # for 4.57; from the cache, one keeping at least what the model needs
        variant = "" if impl.endswith("2") else r"\.hd256" if qwen35 and calls else r"\.swa" if calls else r"\.(hd256|swa)"
        found = re.search(rf"installed {dist.replace('_', '-')} [\w.]+\+fph\.torch2\.13\.0\.cu128\.abi1\.{label}{variant}"
                          r"( |$)", proc.stderr, re.M)
        assert found, proc.stderr
        if calls:   # built here (the first era, and FA3 again in 4.57, whose models' head dims are unknown)
            world["built"].append((impl, transformers))
            assert {c for argv in calls for c in sdists.gencode_codes(argv)} == {code}, calls
            if impl == "flash_attention_3":
                flags = {a for argv in calls for a in argv if a.startswith("-DFLASHATTENTION_DISABLE_")}
                trimmed = {"HDIM64", "HDIM96", "HDIM128", "HDIM192", "LOCAL"} if qwen35 else set()
                assert flags == {f"-DFLASHATTENTION_DISABLE_{n}" for n in (
                    "FP8", "PAGEDKV", "APPENDKV", "SPLIT", "SOFTCAP", "CLUSTER", "SM8x", *trimmed)}, flags
                assert not any("_sm80.cu" in a or "_paged" in a or "e4m3" in a for argv in calls for a in argv)
                backward = {re.search(r"flash_bwd_hdim(\d+)", a)[1] for argv in calls for a in argv if "flash_bwd_hdim" in a}
                assert backward == ({"256"} if qwen35 else {"64", "96", "128", "192", "256"}), backward
        else:
            assert "from the local wheel cache" in proc.stderr, proc.stderr
    if transformers == ERAS[-1]:
        assert world["built"] == [("flash_attention_2", ERAS[0]), ("flash_attention_3", ERAS[0]),
                                  ("flash_attention_3", "4.57.6")], world["built"]


@pytest.mark.slow
def test_offline_with_no_package_flash_attention_is_the_hubs_stand_in_or_sdpa_and_never_raises(attention_world):
    """transformers 5.25 + kernels 0.19.1, the hub offline, a posed Hopper without nvcc (no package can be had):
    alone, transformers raises for flash_attention_3 (its hub build is not cached); with fastpath-hooks the same load
    is an sdpa model and one line names the fix, and flash_attention_2 comes from the LOCAL_KERNELS stand-in -
    numerically checked first, then computing the training step."""
    world = attention_world
    venv = world["venv"]("5.25.0")
    env = venvs.clean_env(FASTPATH_HOOKS_FIND_LINKS=world["house"], FASTPATH_HOOKS_OFFLINE="1", HF_HUB_OFFLINE="1",
                          FASTPATH_HOOKS_TARGET="gpu=sm_90,cuda=12.8,torch=2.13.0,nvcc=none,numeric=cpu",
                          FASTPATH_HOOKS_CACHE_DIR=str(world["root"] / "hub-cache"), HF_HOME=str(world["root"] / "hf"),
                          LOCAL_KERNELS=f"kernels-community/flash-attn2={world['fa2_hub']}")
    proc = venv.run(HUB_CHILD, env=env, args=[str(world["root"] / "llama-hub"), json.dumps(TINY)], timeout=600)
    out = result(proc)
    assert out["bare"].startswith("raised "), out          # the failure this guards against, for real
    assert out["fa3"] == "sdpa", out
    line = ("fastpath-hooks: flash-attn-3: sdpa for flash_attention_3 - no package, FASTPATH_HOOKS_OFFLINE is set "
            "(cache kernels-community/vllm-flash-attn3@v1 online)")
    assert [ln for ln in proc.stderr.splitlines() if "sdpa for" in ln] == [line], proc.stderr
    assert out["fa2"] == "kernels-community/flash-attn2", out
    assert out["hub"]["flash_attention_2"][:2] == [True, "hub kernels-community/flash-attn2@v4 (LOCAL_KERNELS)"], out
    assert out["hub"]["flash_attention_3"][0] is False, out
    assert sum(out["calls"]["_flash_attn2_standin"].values()) > 0, out
    assert any(m.startswith("flash-attn from kernels-community/flash-attn2@v4: numbers match torch on sm_90 (CPU "
                            "tensors): 2 checks") for m in out["said"]), out["said"]
    assert "flash-attn" not in venv.versions() and "flash-attn-3" not in venv.versions()
