"""transformers 5.25 (era D): the hub as a kernel source beside the packages and the torch path (issue 32).

Real transformers 5.25.0 with its real HF `kernels` 0.19.1 (and 5.24.0 with kernels 0.18.3, where kernels
wraps the decorated functions too), real venvs, saved tiny models, child processes that pose as a Hopper
machine through FASTPATH_HOOKS_TARGET - and, for the one thing fastpath-hooks does not pose (kernels asks torch
which GPU kernelize is for), `torch.cuda.get_device_capability` answering (9, 0) in the child. The hub itself is
never reached: HF_HUB_OFFLINE, FASTPATH_HOOKS_OFFLINE, or HF_ENDPOINT at a closed local port; a hub kernel is a
stand-in in kernels' local layout served through LOCAL_KERNELS (tests/support/hub.py), computing with plain torch.

The kernelize step a GPU load runs is transformers' own: `model.set_use_kernels(True, device_map={"": "cuda"})`,
what `from_pretrained(..., device_map="cuda")` calls (it registers the mapping, then kernelizes for cuda).
"""

from __future__ import annotations

import json
import os
import socket

import pytest

from conftest import offline_env
from support import hub, venvs, wheels

pytestmark = pytest.mark.slow

HOPPER_OLD = "gpu=sm_90,cuda=12.8,torch=2.13.0,triton=3.6.0,nvcc=yes,numeric=cpu"
HOPPER_NEW = "gpu=sm_90,cuda=12.8,torch=2.13.0,triton=3.7.1,nvcc=yes,numeric=cpu"
# torch posed at 2.10: causal-conv1d and mamba-ssm have release wheels (the stand-ins in the wheelhouse) for it
HOPPER_210 = "gpu=sm_90,cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=yes,numeric=cpu"
QWEN = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, head_dim=16)
GRANITE = dict(vocab_size=128, hidden_size=32, intermediate_size=64, shared_intermediate_size=64, num_hidden_layers=2,
               layer_types=["mamba", "attention"], num_local_experts=2, num_experts_per_tok=1, mamba_n_heads=4,
               mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
               num_attention_heads=4, num_key_value_heads=2)

SAVE = r'''
import json, sys
from transformers import AutoConfig, AutoModelForCausalLM
for model_type, path, config in json.loads(sys.argv[1]):
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config)).save_pretrained(path)
'''

# Load a saved model as a GPU load does, train one step (on the CPU: kernels route by function, not by the
# tensors' device), and say what served: fastpath-hooks' choices, the stand-ins' calls, the lines said.
LOAD = r'''
import json, os, sys, torch
torch.manual_seed(0)
torch.cuda.get_device_capability = lambda device=None: (9, 0)   # the GPU kernelize is for (kernels asks torch)
ARGS = json.loads(sys.argv[1])
OUT = {}
if ARGS["hook"]:
    import fastpath_hooks
    assert fastpath_hooks.install() is True
from transformers import AutoModelForCausalLM
try:
    model = AutoModelForCausalLM.from_pretrained(ARGS["model"])
    model.set_use_kernels(True, device_map={"": "cuda"})     # what from_pretrained(device_map="cuda") runs
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (1, 24))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    OUT["loss"] = loss.item()
except Exception as exc:
    OUT["error"] = f"{type(exc).__name__}: {exc}"
if ARGS["hook"]:
    from fastpath_hooks.engine import hub
    OUT["hub"] = {c.entry.name: [c.serve, c.source, c.reason] for c in hub.chosen()}
OUT["calls"] = {name: dict(module.CALLS) for name, module in list(sys.modules.items())
                if name.endswith("_standin") and hasattr(module, "CALLS")}
OUT["installed"] = sorted(m for m in ("causal_conv1d", "mamba_ssm", "fla") if m in sys.modules and sys.modules[m])
print(json.dumps(OUT))
'''


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def era_d(tmp_path_factory, torch_wheel, fastpath_wheel, dep_wheels):
    """A venv with transformers 5.25.0 (and the kernels 0.19.1 it requires) and einops (the stand-in mamba-ssm
    hub kernel imports it, as the real one does), tiny saved models, and the stand-in hub kernels written from
    its functions' signatures."""
    base = tmp_path_factory.mktemp("era-d")
    einops = [os.path.join(dep_wheels, f) for f in os.listdir(dep_wheels) if f.startswith("einops-")]
    venv = venvs.make_venv(str(base / "venv"), torch_wheel=torch_wheel, fastpath_wheel=fastpath_wheel,
                           transformers="5.25.0", extra=einops)
    models = {"qwen3_5": str(base / "qwen3_5"), "granitemoehybrid": str(base / "granite")}
    venv.run(SAVE, args=[json.dumps([["qwen3_5_text", models["qwen3_5"], QWEN],
                                     ["granitemoehybrid", models["granitemoehybrid"], GRANITE]])], check=True)
    sigs = hub.signatures(venv)
    standins = {repo: hub.standin(str(base / "hub" / repo.split("/")[1]), repo, sigs) for repo in hub.REPOS}
    return {"venv": venv, "models": models, "standins": standins, "base": base}


def load(venv, model: str, env: dict, *, hook: bool = True) -> dict:
    proc = venv.run(LOAD, env=env, args=[json.dumps({"hook": hook, "model": model})], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


def lines(stderr: str) -> list:
    return [ln for ln in stderr.splitlines() if ln.startswith("fastpath-hooks: ")]


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "FASTPATH_HOOKS_OFFLINE", "unreachable"])
def test_offline_a_gpu_load_with_nothing_cached_loads_and_trains(era_d, tmp_path, offline):
    """Without fastpath-hooks the load raises ValueError (the kernel lookup); with it the entries that cannot load
    here are dropped from the mapping: the load goes on, the step trains, and one line says why."""
    empty = tmp_path / "wheelhouse"
    empty.mkdir()
    env = offline_env(str(empty), HOPPER_NEW, cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_MODE="report",
                      HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}")
    if offline != "FASTPATH_HOOKS_OFFLINE":   # (report mode: no package is installed either way)
        del env["FASTPATH_HOOKS_OFFLINE"]
    if offline == "HF_HUB_OFFLINE":
        env["HF_HUB_OFFLINE"] = "1"
    bare = load(era_d["venv"], era_d["models"]["qwen3_5"], env, hook=False)
    assert "ValueError" in bare.get("error", ""), bare            # the failure this guards against, for real

    got = load(era_d["venv"], era_d["models"]["qwen3_5"], env)
    assert "error" not in got and got["loss"] > 0, got
    why = {"HF_HUB_OFFLINE": "HF_HUB_OFFLINE is set", "FASTPATH_HOOKS_OFFLINE": "FASTPATH_HOOKS_OFFLINE is set",
           "unreachable": "did not answer within 3 s"}[offline]
    said = [ln for ln in lines(got["stderr"]) if ln.startswith("fastpath-hooks: hub kernels: ")]
    assert len(said) == 1 and why in said[0] and said[0].endswith("builds are not cached, so packages or torch serve them"), said
    assert got["hub"]["chunk_gated_delta_rule"][0] is False and got["hub"]["SiLU"][0] is False, got["hub"]


def test_a_stand_in_hub_kernel_is_chosen_checked_named_and_replaces_the_package_install(era_d, tmp_path, make_wheelhouse,
                                                                                      test_pins):
    """kernels-community/mamba-ssm served by LOCAL_KERNELS on a posed Hopper: every Granite-4.0-H kernel function
    comes from it - numerically checked first (as the packages are), then named by doctor and in the step's
    calls - and neither causal-conv1d nor mamba-ssm is installed, though the wheelhouse holds both."""
    venv = era_d["venv"]
    house = make_wheelhouse(causal=True)
    wheels.mamba_ssm_wheel(house, filename=f"mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-{wheels_py()}-"
                                           f"{wheels_py()}-linux_x86_64.whl")
    env = offline_env(house, HOPPER_210, cache_dir=str(tmp_path / "cache"), pins=test_pins(house),
                      HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
                      LOCAL_KERNELS=f"kernels-community/mamba-ssm={era_d['standins']['kernels-community/mamba-ssm']}")
    got = load(venv, era_d["models"]["granitemoehybrid"], env)
    assert "error" not in got and got["loss"] > 0, got
    served = {name: row for name, row in got["hub"].items() if row[0]}
    assert set(served) >= {"causal_conv1d_fn", "causal_conv1d_update", "mamba_chunk_scan_combined",
                           "mamba_split_conv1d_scan_combined", "selective_state_update"}, got["hub"]
    assert all(row[1] == "hub kernels-community/mamba-ssm@v5 (LOCAL_KERNELS)" for row in served.values())
    calls = got["calls"]["_mamba_ssm_standin"]
    assert calls.get("mamba_split_conv1d_scan_combined", 0) > 0 or calls.get("mamba_chunk_scan_combined", 0) > 0, calls
    said = lines(got["stderr"])
    assert any("causal-conv1d from kernels-community/mamba-ssm@v5: numbers match torch" in ln for ln in said), said
    assert got["installed"] == [] and "causal-conv1d" not in venv.versions() and "mamba-ssm" not in venv.versions()

    proc = venv.cli("doctor", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    doctor = {row["function"]: row for row in json.loads(proc.stdout)["sources"]}
    assert doctor["causal_conv1d_fn"]["source"] == "hub kernels-community/mamba-ssm@v5 (LOCAL_KERNELS)", doctor
    decisions = {d["kernel"]: d for d in json.loads(proc.stdout)["decisions"]}
    assert decisions["causal-conv1d"]["rule"] == "skip.hub" and decisions["mamba-ssm"]["rule"] == "skip.hub"


@pytest.mark.parametrize("target,served", [(HOPPER_OLD, False), (HOPPER_NEW, True)], ids=["triton-3.6", "triton-3.7.1"])
def test_the_hubs_fla_is_refused_on_hopper_where_fla_640_applies(era_d, tmp_path, target, served):
    """The hub's fla has no tilelang backend: on sm_90 with triton 3.6 (fla#640) its gated delta rule never runs
    - the mapping entry is dropped and a line says why; with triton 3.7.1 it is checked and serves."""
    empty = tmp_path / "wheelhouse"
    empty.mkdir()
    env = offline_env(str(empty), target, cache_dir=str(tmp_path / "cache"), HF_HUB_OFFLINE="1",
                      HF_HOME=str(tmp_path / "hf"),
                      LOCAL_KERNELS=f"kernels-community/fla={era_d['standins']['kernels-community/fla']}")
    got = load(era_d["venv"], era_d["models"]["qwen3_5"], env)
    assert "error" not in got and got["loss"] > 0, got
    chunk = got["hub"]["chunk_gated_delta_rule"]
    calls = got["calls"].get("_fla_standin", {})
    if served:
        assert chunk[0] is True and chunk[1] == "hub kernels-community/fla@v3 (LOCAL_KERNELS)", chunk
        assert calls.get("chunk_gated_delta_rule", 0) > 0, calls
        assert any("fla from kernels-community/fla@v3: numbers match torch" in ln for ln in lines(got["stderr"]))
    else:
        assert chunk[0] is False and "fla#640 on sm_90 + triton 3.6.0: it has no tilelang backend" in chunk[2], chunk
        assert calls.get("chunk_gated_delta_rule", 0) == 0, calls
        said = [ln for ln in lines(got["stderr"]) if "not from kernels-community/fla" in ln]
        assert said == ["fastpath-hooks: fla: not from kernels-community/fla - fla#640 on sm_90 + triton 3.6.0: "
                        "it has no tilelang backend"], lines(got["stderr"])


def wheels_py() -> str:
    import sys

    return f"cp{sys.version_info[0]}{sys.version_info[1]}"
