"""Issue 39: the first training step - fla's check is one pass at the model's shapes, dtype and variant, run beside
the model's build and waited for at the kernel's first call; a failed verdict there leaves the torch path.

Real transformers (the newest tested: 5.25, HF kernels beside it), a real venv, fastpath-hooks installing stand-in
fla / tilelang wheels from a local wheelhouse on a posed Hopper with triton 3.6 (fla#640: fla's check runs there).
The stand-in fla writes each call's facts to $FAKE_FLA_LOG, so the test reads what the check child ran.
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import H100_OLD_TRITON, offline_env

pytestmark = pytest.mark.slow

# a tiny Qwen3.5 whose linear-attention heads are NOT the config class's defaults: the check must take them from
# the model (2 key heads, 4 value heads, K = V = 16), and its dtype from what the model runs in (bf16)
CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, layer_types=["linear_attention", "full_attention"],
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
              head_dim=16)

SCRIPT = r'''
import inspect, json, os, sys
if sys.argv[2] == "torch":   # the reference: no kernel package importable, no fastpath-hooks
    sys.modules["fla"] = None
else:
    import fastpath_hooks
    fastpath_hooks.install()
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.integrations import hub_kernels
# transformers 5.25 sends only GPU inputs to a package: these CPU tensors stand for the posed GPU's
hub_kernels._PACKAGE_SUPPORTED_DEVICES = {k: tuple(v) + ("cpu",) for k, v in hub_kernels._PACKAGE_SUPPORTED_DEVICES.items()}
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_5_text", **json.loads(sys.argv[1])))
model = model.to(torch.bfloat16).train()
ids = torch.randint(0, 128, (1, 24))
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
modeling = sys.modules[type(model).__module__]
function = modeling.torch_chunk_gated_delta_rule
if getattr(function, "__code__", None) is None:   # under HF kernels: the function its Func module calls
    function = inspect.getclosurevars(type(function).forward).nonlocals["func"]
impl = inspect.getclosurevars(function).nonlocals["implementation"]
if sys.argv[2] == "torch":
    print("RESULT " + json.dumps({"pid": os.getpid(), "loss": loss.item()}))
    sys.exit(0)
outcome = fastpath_hooks.engine.outcomes()["fla"]
held = outcome.first_call
print("RESULT " + json.dumps({"pid": os.getpid(), "loss": loss.item(), "state": outcome.state,
                              "torch_path": impl is function.__wrapped__, "impl": type(impl).__name__,
                              "ran": held.ran if held is not None else None}))
'''


def _run(venv, env, log, mode="hooks"):
    proc = venv.run(SCRIPT, env=dict(env, FAKE_FLA_LOG=str(log), FASTPATH_HOOKS_SKIP="causal-conv1d"),
                    args=(json.dumps(CONFIG), mode), timeout=600)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), proc.stderr


def _calls(log, pid=None, *, other=False) -> list:
    rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return [r for r in rows if (r["pid"] != pid if other else r["pid"] == pid)]


@pytest.fixture
def qwen_env(make_venv, make_wheelhouse, tmp_path, test_pins):
    def make(**wheelhouse):
        house = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi="0.1.12", **wheelhouse)
        env = offline_env(house, H100_OLD_TRITON, cache_dir=str(tmp_path / "cache"),
                          pins=test_pins(house, flash_qla_on=False))
        return make_venv(), env
    return make


def test_the_check_runs_once_at_the_models_shapes_and_dtype_and_the_first_call_waits_for_it(qwen_env, tmp_path):
    venv, env = qwen_env()
    log = tmp_path / "calls.jsonl"
    out, stderr = _run(venv, env, log)
    assert out["state"] == "installed" and not out["torch_path"], stderr
    checked = _calls(log, out["pid"], other=True)            # what ran outside the training process: the check
    assert checked, json.dumps(out)
    # the model's heads (transformers 5.25 passes q and k with their own count), dims, dtype and variant: its config
    # gave them while it was built, and the first call's were the same - no pass at any other shape or length
    assert {(r["heads_k"], r["heads_v"], r["K"], r["V"], r["dtype"], r["final_state"], r["varlen"]) for r in checked} \
        == {(2, 4, 16, 16, "torch.bfloat16", True, False)}, checked
    assert {r["T"] for r in checked} == {16} and len(checked) == 1, checked   # one pass (the CPU compiles nothing)
    assert [r["check"]["shapes"] for r in out["ran"]] == [[[2, 4, 16, 16]]] and out["ran"][0]["ok"], out["ran"]
    assert [(r["heads_k"], r["T"]) for r in _calls(log, out["pid"])] == [(2, 24)]   # the training step's own call
    # a later process of this environment finds the pass remembered: no check child at its first call
    log.unlink()
    again, stderr = _run(venv, env, log)
    assert again["state"] == "ok" and not again["torch_path"] and again["ran"][0]["child"] is False, (again, stderr)
    assert _calls(log, again["pid"], other=True) == []


def test_a_later_environment_checks_nothing_again(qwen_env, tmp_path):
    """Issue 39's later environment (a new venv, the same cache - the H100's 33.7 s of checks not found): fla's pass
    at the model's shapes and tilelang's check are remembered on what they compute with, not on the venv - the new
    environment installs the cached wheels and runs no check child, at its import or its first call."""
    venv, env = qwen_env()
    out, stderr = _run(venv, env, tmp_path / "first.jsonl")
    assert out["state"] == "installed" and out["ran"][0]["child"], (out, stderr)
    later, env2 = qwen_env()   # the same wheels (rebuilt alike), the same cache directory
    assert later.path != venv.path and env2["FASTPATH_HOOKS_CACHE_DIR"] == env["FASTPATH_HOOKS_CACHE_DIR"]
    log = tmp_path / "later.jsonl"
    again, stderr = _run(later, dict(env2, FASTPATH_HOOKS_LOG="debug"), log)
    assert again["state"] == "installed" and not again["torch_path"], (again, stderr)
    assert again["ran"][0]["child"] is False and again["ran"][0]["check"]["shapes"] == [[2, 4, 16, 16]], again["ran"]
    assert _calls(log, again["pid"], other=True) == [], "a check child ran fla"
    assert "check_child.py" not in stderr, [x for x in stderr.splitlines() if "running:" in x]


def test_a_failed_verdict_at_the_first_call_leaves_the_torch_path(qwen_env, tmp_path):
    """An fla that imports but computes wrongly (1.5 times its output): installed and imported, it fails its check at
    the first call - that call and every later one run transformers' torch path (the loss is the torch path's), and
    the mismatch is remembered: the next process blocks `import fla` at once."""
    venv, env = qwen_env(fla_broken="wrong")
    log = tmp_path / "calls.jsonl"
    out, stderr = _run(venv, env, log)
    assert out["state"] == "blocked" and out["torch_path"], (out, stderr)
    assert "fla: blocked at its first call" in stderr, stderr
    assert _calls(log, out["pid"]) == [], "the training process never ran the wrong kernel"
    torch_path, _ = _run(venv, env, tmp_path / "none.jsonl", mode="torch")
    assert out["loss"] == pytest.approx(torch_path["loss"], abs=1e-6)
    later, stderr = _run(venv, env, tmp_path / "later.jsonl")
    assert later["state"] == "blocked" and later["torch_path"] and later["ran"] is None, (later, stderr)
    assert "fla: blocked" in stderr


BUILD_SCRIPT = r'''
import json, sys, time
import fastpath_hooks
T0, EVENTS = time.time(), []
fastpath_hooks.install(on_event=lambda e: EVENTS.append((round(e["ts"] - T0, 2), e["kernel"], e["message"])))
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.integrations import hub_kernels
hub_kernels._PACKAGE_SUPPORTED_DEVICES = {k: tuple(v) + ("cpu",) for k, v in hub_kernels._PACKAGE_SUPPORTED_DEVICES.items()}
config = AutoConfig.for_model("qwen3_5_text", **json.loads(sys.argv[1]))
AutoModelForCausalLM._model_mapping[type(config)]   # the modeling import asks for causal-conv1d, fla, tilelang
states = {k: o.state for k, o in fastpath_hooks.engine.outcomes().items()}
model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
ids = torch.randint(0, 128, (1, 24))
model(input_ids=ids, labels=ids).loss.backward()
print("RESULT " + json.dumps({"events": EVENTS, "states": states,
                              "first_call": fastpath_hooks.engine.outcomes()["fla"].first_call.ran}))
'''


def test_the_pure_kernels_are_installed_and_checked_while_a_compiled_one_builds(
        make_venv, make_wheelhouse, toolkit, build_dep_wheels, tmp_path, test_pins):
    """Nothing waits that need not (issue 39): a Qwen3.5 modeling import on a posed Hopper asks for causal-conv1d
    (no wheel for torch 2.13: a source build, 6 s of fake nvcc here), tilelang and fla (wheels). They go in as one
    batch: tilelang and fla are installed and checked - fla's check at the shapes of the model being built - while
    causal-conv1d builds, as the events' timestamps show."""
    from support import sdists

    house = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi="0.1.12")
    sdists.causal_conv1d_sdist(house)
    for name in os.listdir(build_dep_wheels):
        if not os.path.exists(os.path.join(house, name)):
            os.link(os.path.join(build_dep_wheels, name), os.path.join(house, name))
    with open(os.path.join(toolkit.home, "DELAY"), "w") as fh:
        fh.write("2")                                        # each of the three .cu files: 2 s
    env = offline_env(house, "gpu=sm_90,cuda=13.0,torch=2.13.0,triton=3.6.0,cpus=16", cache_dir=str(tmp_path / "c"),
                      pins=test_pins(house, flash_qla_on=False), CUDA_HOME=toolkit.home)
    proc = make_venv().run(BUILD_SCRIPT, env=env, args=(json.dumps(CONFIG),), timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert out["states"]["causal-conv1d"] == "installed", proc.stderr
    assert {out["states"][k] for k in ("tilelang", "fla")} <= {"installed", "ok"}, proc.stderr   # (installed with it)
    assert "causal-conv1d: installing tilelang and fla while causal-conv1d builds" in proc.stderr, proc.stderr

    def when(kernel, text):
        return next(t for t, k, m in out["events"] if k == kernel and text in m)

    building, built = when("causal-conv1d", "building for sm_90"), when("causal-conv1d", "built for sm_90")
    checked = when("fla", "verified fla")
    assert building < when("tilelang", "verified tilelang") < built, "\n".join(map(str, out["events"]))
    assert building < checked < built, out["events"]
    # fla's check ran there, at the shapes of the model being built (its configuration): its first call found it
    assert "gated-delta-rule check" in next(m for t, k, m in out["events"] if k == "fla" and "verified fla" in m)
    (ran,) = out["first_call"]
    assert ran["ok"] and ran["child"] is False and ran["check"]["shapes"] == [[2, 4, 16, 16]], out["first_call"]
