"""Issue 13 part A: install() called AFTER a transformers modeling module was imported.

Real transformers of every era (pinned: 4.57.6, 5.14.1, the latest - the versions
test_eras.py builds), real venvs, fake kernel wheels that count their calls
(tests/support/wheels.py), child processes that pose as GPU machines only through
FASTPATH_HOOKS_TARGET. Each child imports the modeling module and builds a model BEFORE
`fastpath_hooks.install()`, then reports what the module globals resolve to and which
kernels a forward called.

What each era can heal (see late.py):
- era C (latest): the decorated module globals are rebuilt; forward looks them up at call
  time, so the model built before install() runs the kernels too. On Hopper with triton
  3.6.0 and an fla imported before install() (no tilelang to be had), fla is taken away
  again: the torch functions, one line saying why.
- era B (5.14.1): the module globals are rebound; a model built afterwards gets the kernels;
  a qwen3_5 model built before keeps the torch path (its layers copied the choice) and one
  line says so; lfm2's layers read the module globals at call time and follow.
- era A (4.57.6): the same for qwen3_next (module globals) and lfm2 (a model built before).
"""

from __future__ import annotations

import ast
import glob
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import A100, H100_OLD_TRITON
from support import venvs
from test_eras import PREAMBLE, QWEN3_5_TINY, Era, Step

# install() is NOT called by the preamble ("plain"): each script calls it after the modeling import.
LATE = PREAMBLE + r'''
import fastpath_hooks
LFM2_TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, layer_types=["conv", "full_attention"])

def late_install():
    OUT["imported_before"] = sorted(n for n in sys.modules if n.startswith("transformers.models.") and ".modeling_" in n)
    print("INSTALL", file=sys.stderr, flush=True)          # marks where install() begins in stderr
    assert fastpath_hooks.install(on_event=EVENTS.put) is True

def conv_layer_calls_kernel(model):
    """The layer's kernel path (CPU torch never takes it by itself: it asks for a cuda tensor)."""
    conv = next(l.conv for l in model.model.layers if hasattr(l, "conv"))
    with torch.no_grad():
        conv.cuda_kernels_forward(torch.randn(2, 7, model.config.hidden_size))
'''

ERA_C = LATE + r'''
from transformers import Qwen3_5ForCausalLM, AutoConfig      # imports the modeling module: kernels chosen here
cfg = AutoConfig.for_model("qwen3_5_text", **ARGS["config"])
model = Qwen3_5ForCausalLM(cfg)                              # built before install()
modeling = sys.modules[type(model).__module__]
ids = torch.randint(0, cfg.vocab_size, (2, 12))
OUT["before"] = decorated(modeling)
late_install()
OUT["resolved"] = decorated(modeling)
train(model, ids)
OUT["calls_train"] = calls()
model.generate(ids[:, :4], max_new_tokens=3, do_sample=False)
OUT["calls_generate"] = calls()
n = len(list(EVENTS.queue))
assert fastpath_hooks.install() is True                     # again: nothing more to do or say
OUT["events_again"] = len(list(EVENTS.queue)) - n
finish()
'''

# torch.compile before install(): dynamo guards on the module globals the graph read, so the rebound ones retrace.
ERA_C_COMPILED = LATE + r'''
from transformers import Qwen3_5ForCausalLM, AutoConfig
cfg = AutoConfig.for_model("qwen3_5_text", **ARGS["config"])
model = Qwen3_5ForCausalLM(cfg)
compiled = torch.compile(model, backend="eager")
ids = torch.randint(0, cfg.vocab_size, (2, 12))
with torch.no_grad():
    compiled(input_ids=ids)                                  # traced on the torch path
from torch._dynamo.utils import counters
OUT["graphs_before"] = counters["stats"]["unique_graphs"]
late_install()
with torch.no_grad():
    compiled(input_ids=ids)
OUT["graphs_after"] = counters["stats"]["unique_graphs"]
OUT["calls"] = calls()
finish()
'''

ERA_C_HOPPER = LATE + r'''
from transformers import Qwen3_5ForCausalLM, AutoConfig
cfg = AutoConfig.for_model("qwen3_5_text", **ARGS["config"])
model = Qwen3_5ForCausalLM(cfg)
modeling = sys.modules[type(model).__module__]
ids = torch.randint(0, cfg.vocab_size, (2, 12))
OUT["before"] = decorated(modeling)
OUT["fla_imported_before"] = "fla" in sys.modules
late_install()
OUT["resolved"] = decorated(modeling)
train(model, ids)
OUT["calls_train"] = calls()
finish()
'''

ERA_B = LATE + r'''
import transformers.models.qwen3_5.modeling_qwen3_5 as modeling
from transformers import AutoConfig, AutoModelForCausalLM
cfg = AutoConfig.for_model("qwen3_5_text", **ARGS["config"])
early = AutoModelForCausalLM.from_config(cfg)               # built before install(): its layers copy the choice
lfm2_early = AutoModelForCausalLM.from_config(AutoConfig.for_model("lfm2", **LFM2_TINY))
lfm2 = sys.modules[type(lfm2_early).__module__]
late_install()
OUT["globals"] = {n: where(getattr(modeling, n)) for n in
                  ("causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
                   "FusedRMSNormGated")}
OUT["fast_path"] = [modeling.is_fast_path_available, lfm2.is_fast_path_available]
OUT["early_layer"] = where(next(l.linear_attn for l in early.model.layers if hasattr(l, "linear_attn")).chunk_gated_delta_rule)
model = AutoModelForCausalLM.from_config(cfg)               # built after install()
OUT["layer"] = where(next(l.linear_attn for l in model.model.layers if hasattr(l, "linear_attn")).chunk_gated_delta_rule)
ids = torch.randint(0, cfg.vocab_size, (2, 12))
train(model, ids)
OUT["calls_train"] = calls()
conv_layer_calls_kernel(lfm2_early)
OUT["calls_lfm2_early"] = calls()
finish()
'''

ERA_A = LATE + r'''
import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next
from transformers import AutoConfig, AutoModelForCausalLM
lfm2_early = AutoModelForCausalLM.from_config(AutoConfig.for_model("lfm2", **LFM2_TINY))
lfm2 = sys.modules[type(lfm2_early).__module__]
late_install()
OUT["qwen3_next"] = {n: where(getattr(qwen3_next, n)) for n in
                     ("causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule",
                      "fused_recurrent_gated_delta_rule", "FusedRMSNormGated")}
OUT["fast_path"] = [qwen3_next.is_fast_path_available, lfm2.is_fast_path_available]
OUT["lfm2"] = {n: where(getattr(lfm2, n)) for n in ("causal_conv1d_fn", "causal_conv1d_update")}
conv_layer_calls_kernel(lfm2_early)
OUT["calls"] = calls()
finish()
'''


def after_install(step: Step) -> list[str]:
    """fastpath-hooks' lines printed from install() on."""
    lines = step.stderr.splitlines()
    start = lines.index("INSTALL") if "INSTALL" in lines else 0
    return [line for line in lines[start:] if line.startswith("fastpath-hooks:")]


def scenario_c(era: Era) -> dict:
    steps = {}
    era.uninstall_kernels()
    model = dict(config=QWEN3_5_TINY, functions=("causal_conv1d_fn", "causal_conv1d_update",
                                                 "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"))
    steps["late"] = Step(era.venv, ERA_C, era.env(A100, era.wheelhouse(fla="0.6.0", causal=True)), "plain", **model)
    era.uninstall_kernels()
    steps["compiled"] = Step(era.venv, ERA_C_COMPILED, era.env(A100, era.wheelhouse(fla="0.6.0", causal=True)), "plain",
                             **model)
    if "fla-core" not in era.venv.versions():   # a step above failed: give the Hopper step its fla anyway
        house = era.wheelhouse(fla="0.6.0", deps=False)
        era.venv.uv_install(*glob.glob(os.path.join(house, "*.whl")), no_deps=True)
    env = era.env(H100_OLD_TRITON, era.wheelhouse(fla="0.6.0"), FASTPATH_HOOKS_SKIP="causal-conv1d")
    steps["hopper"] = Step(era.venv, ERA_C_HOPPER, env, "plain", **model)
    return steps


def scenario_b(era: Era) -> Step:
    return Step(era.venv, ERA_B, era.env(A100, era.wheelhouse(fla="0.6.0", causal=True)), "plain", config=QWEN3_5_TINY)


def scenario_a(era: Era) -> Step:
    return Step(era.venv, ERA_A, era.env(A100, era.wheelhouse(fla="0.5.2", causal=True)), "plain")


# "C": the newest tested transformers (5.25: era D, HF kernels 0.19 wraps every decorated function in a `Func`
# module); "K": 5.24.0 with HF kernels 0.18.3, which wraps them too (era C); B and A without kernels.
SCENARIOS = {"C": ("latest", scenario_c, ()), "K": ("5.24.0", scenario_c, ("kernels==0.18.3",)),
             "B": ("5.14.1", scenario_b, ()), "A": ("4.57.6", scenario_a, ())}


@pytest.fixture(scope="module")
def scenarios(request, tmp_path_factory, torch_wheel, fastpath_wheel, dep_wheels):
    """era -> Future of its scenario; only the eras the selected tests need are started (two at a time)."""
    wanted = {key for item in request.session.items if getattr(item, "module", None) is request.module
              for key in getattr(item.function, "era", ())}
    pool = ThreadPoolExecutor(max_workers=2)

    def run(key):
        transformers, scenario, extra = SCENARIOS[key]
        era = Era(str(tmp_path_factory.mktemp(f"late-{key}")), transformers, torch_wheel, fastpath_wheel, dep_wheels,
                  extra=extra)
        return scenario(era)

    futures = {key: pool.submit(run, key) for key in sorted(wanted, key="CKBA".index)}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def era(*keys: str):
    def mark(test):
        test.era = keys
        return test

    return mark


# -- era C: decorated module globals, looked up at call time ----------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("key", ["C", "K"], ids=["latest", "5.24-kernels-0.18"])
@era("C", "K")
def test_era_c_late_install_heals_the_module_and_the_model_built_before(scenarios, key):
    step = scenarios[key].result()["late"]
    out = step.result()
    assert "transformers.models.qwen3_5.modeling_qwen3_5" in out["imported_before"]
    assert all(r["torch"] for r in out["before"].values()), out["before"]      # chosen at import: torch
    assert {n: (r["fake"], r["torch"]) for n, r in out["resolved"].items()} == dict.fromkeys(out["resolved"], (True, False))
    assert out["resolved"]["torch_chunk_gated_delta_rule"]["module"] == "fla.ops.gated_delta_rule"
    # the model built BEFORE install() ran the kernels: forward + backward, then decoding
    train, gen = out["calls_train"], out["calls_generate"]
    assert train["fla"]["chunk"] >= 1 and train["causal_conv1d"]["fn"] >= 1, train
    assert gen["fla"]["recurrent"] >= 1 and gen["causal_conv1d"]["update"] >= 1, gen
    assert out["grads_finite"]
    healed = [line for line in after_install(step) if "qwen3_5: imported before install()" in line]
    assert len(healed) == 1 and "now uses causal-conv1d, fla" in healed[0] and "models already built follow" in healed[0]
    assert out["events_again"] == 0      # a second install() has nothing to heal and says nothing


@pytest.mark.slow
@pytest.mark.parametrize("key", ["C", "K"], ids=["latest", "5.24-kernels-0.18"])
@era("C", "K")
def test_era_c_a_graph_compiled_before_install_retraces_onto_the_kernels(scenarios, key):
    step = scenarios[key].result()["compiled"]
    out = step.result()
    assert out["graphs_before"] >= 1 and out["graphs_after"] > out["graphs_before"]
    assert out["calls"]["fla"]["chunk"] >= 1 and out["calls"]["causal_conv1d"]["fn"] >= 1, out["calls"]
    assert any("retrace at their next call" in line for line in after_install(step)), step.stderr


@pytest.mark.slow
@pytest.mark.parametrize("key", ["C", "K"], ids=["latest", "5.24-kernels-0.18"])
@era("C", "K")
def test_era_c_hopper_late_install_takes_an_imported_fla_away_again(scenarios, key):
    step = scenarios[key].result()["hopper"]
    out = step.result()
    assert out["fla_imported_before"]                                         # the modeling import took fla
    assert out["before"]["torch_chunk_gated_delta_rule"]["module"] == "fla.ops.gated_delta_rule"
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        assert out["resolved"][name]["torch"], out["resolved"]                 # the torch function again
    assert out["calls_train"]["fla"] == {"chunk": 0, "recurrent": 0, "flash_qla": 0}   # fla never ran
    assert out["grads_finite"]                                                  # forward + backward on torch
    lines = [line for line in after_install(step) if "qwen3_5" in line]
    assert len(lines) == 1, step.stderr
    for words in ("imported before install()", "back on the torch path for fla", "fla stays imported",
                  "call install() first", "fastpath-hooks enable"):
        assert words in lines[0], lines[0]
    assert any(line.startswith("fastpath-hooks: fla: blocked - fla#640 on sm_90 needs tilelang")
               for line in after_install(step)), step.stderr


# -- era B: module globals bound behind the gates; layers copy them when built ------------------

@pytest.mark.slow
@era("B")
def test_era_b_late_install_rebinds_the_globals_and_says_an_early_model_keeps_torch(scenarios):
    step = scenarios["B"].result()
    out = step.result()
    assert all(w["fake"] for w in out["globals"].values()), out["globals"]
    assert out["fast_path"] == [True, True]
    assert out["layer"]["fake"]                                                # built after install(): fla
    assert out["early_layer"] == {"module": "transformers.models.qwen3_5.modeling_qwen3_5", "fake": False}  # before: torch
    assert out["calls_train"]["fla"]["chunk"] >= 1 and out["calls_train"]["causal_conv1d"]["fn"] >= 1
    assert out["grads_finite"]
    # lfm2's layer reads the module globals at call time: the model built before install() follows
    assert out["calls_lfm2_early"]["causal_conv1d"]["fn"] > out["calls_train"]["causal_conv1d"]["fn"]
    lines = after_install(step)
    qwen = [line for line in lines if line.startswith("fastpath-hooks: qwen3_5:")]
    assert len(qwen) == 1 and "older ones keep theirs: rebuild them" in qwen[0], lines
    assert "rebuild them" in qwen[0]
    assert any(line.startswith("fastpath-hooks: lfm2:") and "models already built follow" in line for line in lines)


# -- era A: plain gates at modeling import ------------------------------------------------------

@pytest.mark.slow
@era("A")
def test_era_a_late_install_rebinds_the_globals_and_an_early_lfm2_model_follows(scenarios):
    step = scenarios["A"].result()
    out = step.result()
    assert all(w["fake"] for w in out["qwen3_next"].values()), out["qwen3_next"]
    assert all(w["fake"] for w in out["lfm2"].values()), out["lfm2"]
    assert out["fast_path"] == [True, True]
    assert out["calls"]["causal_conv1d"]["fn"] >= 1
    lines = after_install(step)
    assert any(line.startswith("fastpath-hooks: qwen3_next: imported before install(); now uses causal-conv1d, fla")
               for line in lines), lines


# -- the data table against the real sources ------------------------------------------------------

@pytest.mark.slow
def test_every_decorated_kernel_function_of_the_installed_transformers_is_in_the_table():
    """Era C: every `@use_kernel_func_from_hub_with_fallback(func, package)` in this environment's
    transformers is known to late_layouts.py with the same arguments (a new one would not be healed)."""
    import transformers

    from fastpath_hooks.hooks import late
    late_layouts = late

    if late.transformers_era() not in ("C", "D"):
        pytest.skip(f"transformers {transformers.__version__} is not era C or D")
    found = {}
    for path in glob.glob(os.path.join(os.path.dirname(transformers.__file__), "models", "*", "modeling_*.py")):
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "use_kernel_func_from_hub_with_fallback"
                        and len(deco.args) >= 2):
                    found.setdefault(node.name, set()).add((deco.args[0].value, deco.args[1].value))
    assert len(found) >= 10, found
    assert {name: pairs for name, pairs in found.items() if pairs != {late_layouts.DECORATED.get(name)}} == {}
    assert {package for pairs in found.values() for _, package in pairs} <= set(late_layouts.PACKAGES)


# -- a bad setting is said at install() ------------------------------------------------------------

BAD_SETTING = r'''
import sys
import fastpath_hooks
assert fastpath_hooks.install() is True
print("INSTALLED", file=sys.stderr, flush=True)
try:
    import fla          # the first kernel import: the runtime decides (and reads the settings) now
except ImportError:
    pass
from fastpath_hooks import engine
print(engine.outcomes()["fla"].state)
'''


def test_a_bad_setting_is_said_once_at_install_not_again_at_the_first_kernel_import(tmp_path):
    env = venvs.clean_env(FASTPATH_HOOKS_MODE="instal", FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"),
                          FASTPATH_HOOKS_TARGET=A100)
    proc = subprocess.run([sys.executable, "-c", BAD_SETTING], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    bad = [i for i, line in enumerate(lines) if "FASTPATH_HOOKS_MODE" in line]
    assert len(bad) == 1, proc.stderr                                  # said once
    assert bad[0] < lines.index("INSTALLED"), proc.stderr              # by install(), before any kernel import
    line = lines[bad[0]]
    assert "FASTPATH_HOOKS_MODE='instal' is not valid" in line and "install, report" in line, line
    assert proc.stdout.split() == ["reported"]                         # and nothing was installed


def test_install_without_settings_or_transformers_imports_nothing_more(tmp_path):
    """The late pass and the settings check cost nothing when there is nothing to do."""
    code = ("import sys; import fastpath_hooks; fastpath_hooks.install(); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('fastpath_hooks'))))")
    proc = subprocess.run([sys.executable, "-c", code], env=venvs.clean_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["fastpath_hooks", "fastpath_hooks._names", "fastpath_hooks.hooks"]
