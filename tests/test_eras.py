"""Issue 3 acceptance, end to end: real transformers of every era, real venvs, fake kernel wheels.

Each era gets one venv (CPU torch + that transformers + fastpath-hooks as a wheel + uv).
The scripts run in child processes that pose as a GPU machine only through
FASTPATH_HOOKS_TARGET and install only from a local wheelhouse of fake kernels
(tests/support/wheels.py), whose functions count their calls.

- era C (latest 5.x): kernels are chosen by `importlib.import_module` when the modeling
  module is imported; only the import hook can act. Baseline: the same without install().
- era B (5.14.1) and era A (4.57.6): kernels come through the gates at modeling import.
- the real CPU machine (no override) and the block path (Hopper + old triton, tilelang not
  obtainable) run in the era C venv.

Speed: the three venvs' scenarios run in two worker threads (this machine and CI have two
cores; each child process is single-threaded), started once for the module; each test waits
for the scenario it checks. The era C steps share one venv and run in order (baseline and
the CPU run before the hook installs the kernels, the block path after). Child processes
may write .pyc files (PYTHONDONTWRITEBYTECODE dropped): otherwise every one of them
recompiles torch and transformers from source (~10 s each here).
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import A100, CAUSAL_WHEEL, H100_OLD_TRITON
from support import venvs, wheels

pytestmark = pytest.mark.slow

KERNEL_DISTS = ("fla-core", "flash-linear-attention", "causal-conv1d")
ERA_C_FUNCTIONS = ("causal_conv1d_fn", "causal_conv1d_update", "torch_chunk_gated_delta_rule",
                   "torch_recurrent_gated_delta_rule")
# A tiny Qwen3.5 text model: one linear-attention (gated delta rule + causal conv) and one full-attention layer.
QWEN3_5_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=128, layer_types=["linear_attention", "full_attention"],
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=16, head_dim=16)

# -- the child scripts ---------------------------------------------------------------------

# Shared preamble: optional install() with events to a queue; a JSON result line on stdout.
PREAMBLE = r'''
import inspect, json, queue, sys
import torch
torch.manual_seed(0)
try:   # transformers 5.25+ sends only GPU inputs to a package: these CPU tensors stand for GPU ones (the posed GPU)
    from transformers.integrations import hub_kernels as _hub
    _hub._PACKAGE_SUPPORTED_DEVICES = {k: tuple(v) + ("cpu",) for k, v in _hub._PACKAGE_SUPPORTED_DEVICES.items()}
except (ImportError, AttributeError):
    pass
EVENTS = queue.Queue()
if sys.argv[1] == "hook":
    import fastpath_hooks
    assert fastpath_hooks.install(on_event=EVENTS.put) is True
OUT = {}
ARGS = json.loads(sys.argv[2])

def where(obj):
    """The module an implementation comes from and whether it is one of the fakes."""
    if obj is None:
        return None
    mod = sys.modules.get(getattr(obj, "__module__", None) or "")
    fake = any(getattr(x, flag, False) for x in (mod, obj) for flag in ("FAKE_FLA", "FAKE_CAUSAL_CONV1D"))
    return {"module": obj.__module__, "fake": fake}

def calls():
    fla, conv = sys.modules.get("fla.ops.gated_delta_rule"), sys.modules.get("causal_conv1d")
    return {"fla": dict(fla.CALLS) if fla else None, "causal_conv1d": dict(conv.CALLS) if conv else None}

def _decorated(fn):
    """The function transformers' decorator made: the module global itself, or - under HF kernels (5.25; 5.23/5.24
    with kernels 0.18) - the one the `Func` module it became calls (the `func` its forward closes over)."""
    if getattr(fn, "__code__", None) is None and callable(getattr(type(fn), "forward", None)):
        fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
    return fn

def decorated(modeling):
    """Eras C/D: what each decorated kernel function resolved to (the decorator's closure)."""
    out = {}
    for name in ARGS["functions"]:
        function = _decorated(getattr(modeling, name))
        impl = inspect.getclosurevars(function).nonlocals["implementation"]
        out[name] = dict(where(impl), torch=impl is function.__wrapped__)
    return out

def train(model, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    OUT["loss"] = loss.item()
    OUT["grads_finite"] = all(bool(p.grad.isfinite().all()) for p in model.parameters() if p.grad is not None)

def finish():
    events = []
    while not EVENTS.empty():
        events.append(EVENTS.get())
    OUT["events"] = json.loads(json.dumps(events))  # JSON-serialisable as sent
    print("RESULT " + json.dumps(OUT))

def qwen3_5():
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("qwen3_5_text", **ARGS["config"])
    model = AutoModelForCausalLM.from_config(cfg)
    return model, sys.modules[type(model).__module__], torch.randint(0, cfg.vocab_size, (2, 12))
'''

ERA_C = PREAMBLE + r'''
model, modeling, ids = qwen3_5()
OUT["resolved"] = decorated(modeling)
train(model, ids)
OUT["calls_train"] = calls()
model.generate(ids[:, :4], max_new_tokens=3, do_sample=False)   # decode steps: the recurrent/update kernels
OUT["calls_generate"] = calls()
finish()
'''

# The real CPU machine: gates imported by name (as a user module would), kernel imports, a model.
CPU_MACHINE = PREAMBLE + r'''
from transformers.utils import import_utils, is_causal_conv1d_available
OUT["wrapped"] = hasattr(import_utils.is_flash_linear_attention_available, "_fastpath_hooks_original")
OUT["gates"] = [import_utils.is_flash_linear_attention_available(), is_causal_conv1d_available()]
# their job done (nothing to install or block here), the wrappers step aside: the originals are back
OUT["stepped_aside"] = not hasattr(import_utils.is_flash_linear_attention_available, "_fastpath_hooks_original")
for name in ("fla", "causal_conv1d"):
    try:
        __import__(name)
        OUT[name] = "imported"
    except ImportError as exc:
        OUT[name] = type(exc).__name__
model, modeling, ids = qwen3_5()
OUT["resolved"] = decorated(modeling)
finish()
'''

BLOCKED = PREAMBLE + r'''
try:
    import fla
    OUT["import_fla"] = "imported"
except ImportError as exc:
    OUT["import_fla"] = str(exc)
model, modeling, ids = qwen3_5()
OUT["resolved"] = decorated(modeling)
train(model, ids)
finish()
'''

ERA_B = PREAMBLE + r'''
from transformers.utils import import_utils
model, modeling, ids = qwen3_5()
OUT["globals"] = {n: where(getattr(modeling, n)) for n in
                  ("causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
                   "FusedRMSNormGated")}
OUT["is_fast_path_available"] = modeling.is_fast_path_available
layer = next(l.linear_attn for l in model.model.layers if hasattr(l, "linear_attn"))
OUT["layer"] = {n: where(getattr(layer, n)) for n in
                ("causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule", "recurrent_gated_delta_rule")}
OUT["layer"]["norm"] = where(type(layer.norm))
train(model, ids)
OUT["calls_train"] = calls()
# the posed accelerator is seen by the wrapped gates only, never by the rest of the process
OUT["after"] = [torch.cuda.is_available(), import_utils.is_torch_cuda_available(),
                import_utils.is_flash_linear_attention_available(), import_utils.is_causal_conv1d_available()]
finish()
'''

# qwen3_next's layer asks torch.cuda.current_device() when fla's FusedRMSNormGated exists, which
# CPU torch cannot answer: its module globals are checked, and an lfm2 model (causal-conv1d only) is built.
ERA_A = PREAMBLE + r'''
import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next
OUT["qwen3_next"] = {n: where(getattr(qwen3_next, n)) for n in
                     ("causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule",
                      "fused_recurrent_gated_delta_rule", "FusedRMSNormGated")}
OUT["qwen3_next_fast_path"] = qwen3_next.is_fast_path_available
from transformers import AutoConfig, AutoModelForCausalLM
cfg = AutoConfig.for_model("lfm2", vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"])
model = AutoModelForCausalLM.from_config(cfg)
lfm2 = sys.modules[type(model).__module__]
OUT["lfm2"] = {n: where(getattr(lfm2, n)) for n in ("causal_conv1d_fn", "causal_conv1d_update")}
OUT["lfm2_fast_path"] = lfm2.is_fast_path_available
conv = next(l.conv for l in model.model.layers if hasattr(l, "conv"))
x = torch.randn(2, 7, cfg.hidden_size)
with torch.no_grad():
    fast, slow = conv.cuda_kernels_forward(x), conv.slow_forward(x)   # the layer's kernel path vs its torch path
OUT["kernel_path_matches_torch"] = bool(torch.allclose(fast, slow, atol=1e-5))
OUT["calls"] = calls()
finish()
'''

# -- running them ---------------------------------------------------------------------------


class Step:
    """One child run: its parsed result, or the failure with everything needed to read it."""

    def __init__(self, venv, script: str, env: dict, mode: str, **args):
        env = dict(env)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        proc = venv.run(script, env=env, args=[mode, json.dumps(args)], timeout=600)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        self.error = None if proc.returncode == 0 and lines else (
            f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}")
        self.out = json.loads(lines[-1][len("RESULT "):]) if lines else {}
        self.stderr = proc.stderr
        self.facts: dict = {}

    def result(self) -> dict:
        assert self.error is None, self.error
        return self.out

    def ours(self) -> list[str]:
        """The lines fastpath-hooks printed."""
        return [line for line in self.stderr.splitlines() if line.startswith("fastpath-hooks:")]


class Era:
    """A venv for one transformers version, wheelhouses of fakes, and a child environment maker."""

    def __init__(self, base: str, transformers: str, torch_wheel: str, fastpath_wheel: str, dep_wheels: str,
                 extra=()):
        self.base, self.dep_wheels = base, dep_wheels
        # uv in the venv: the hooks install with it (pip works too, 3-4 s slower per step)
        self.venv = venvs.make_venv(os.path.join(base, "venv"), torch_wheel=torch_wheel, fastpath_wheel=fastpath_wheel,
                                    transformers=transformers, extra=("uv",) + tuple(extra))
        self._n = 0

    def wheelhouse(self, *, fla: str | None = None, causal: bool = False, deps: bool = True) -> str:
        self._n += 1
        dest = os.path.join(self.base, f"wheelhouse{self._n}")
        os.makedirs(dest)
        if deps:
            for name in os.listdir(self.dep_wheels):
                os.link(os.path.join(self.dep_wheels, name), os.path.join(dest, name))
        if fla:
            wheels.fake_fla(dest, fla)
        if causal:
            wheels.fake_causal_conv1d(dest, CAUSAL_WHEEL)
        return dest

    def env(self, target: str | None, house: str, **extra) -> dict:
        """A child posing as `target` (None: this machine as it is), installing only from `house`."""
        pins = {"kernels": {"tilelang": {"runtime_deps": []}, "causal-conv1d": {"runtime_deps": []}}}
        if os.path.exists(os.path.join(house, CAUSAL_WHEEL)):   # the fake's real hash, as for a release wheel
            pins["kernels"]["causal-conv1d"]["release"] = {
                "sha256": {CAUSAL_WHEEL: wheels.sha256_of(os.path.join(house, CAUSAL_WHEEL))}}
        pins_file = os.path.join(house, "pins.json")
        with open(pins_file, "w") as fh:
            json.dump(pins, fh)
        env = venvs.clean_env(FASTPATH_HOOKS_FIND_LINKS=house, FASTPATH_HOOKS_OFFLINE="1", FASTPATH_HOOKS_PINS=pins_file,
                              FASTPATH_HOOKS_CACHE_DIR=os.path.join(house, "cache"), **extra)
        if target is not None:
            env["FASTPATH_HOOKS_TARGET"] = target
        return env

    def uninstall_kernels(self) -> None:
        present = [d for d in KERNEL_DISTS if d in self.venv.versions()]
        if present:
            subprocess.run([venvs.uv(), "pip", "uninstall", "-q", "--python", self.venv.python, *present], check=True,
                           env=venvs.clean_env(), capture_output=True)

    def site_listing(self) -> list[str]:
        out = []
        for root, dirs, files in os.walk(self.venv.site):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            out.extend(os.path.relpath(os.path.join(root, f), self.venv.site) for f in files)
        return sorted(out)


def scenario_era_c(era: Era) -> dict:
    """The era C steps, in order, in one venv. Each step records its result or its failure."""
    steps: dict = {}
    model = dict(config=QWEN3_5_TINY, functions=ERA_C_FUNCTIONS)
    era.uninstall_kernels()
    full = era.wheelhouse(fla="0.6.0", causal=True)

    steps["baseline"] = step = Step(era.venv, ERA_C, era.env(A100, full), "plain", **model)
    step.facts["kernels_after"] = sorted(set(KERNEL_DISTS) & set(era.venv.versions()))

    before = era.site_listing()
    steps["cpu"] = step = Step(era.venv, CPU_MACHINE, era.env(None, full), "hook", **model)
    step.facts["site_unchanged"] = era.site_listing() == before

    steps["hook"] = step = Step(era.venv, ERA_C, era.env(A100, era.wheelhouse(fla="0.6.0", causal=True)), "hook", **model)
    step.facts["versions"] = era.venv.versions()

    # fla present (installed above; installed here if that step failed); offline without tilelang
    if "fla-core" not in era.venv.versions():
        house = era.wheelhouse(fla="0.6.0", deps=False)
        era.venv.uv_install(*(os.path.join(house, f) for f in sorted(os.listdir(house)) if f.endswith(".whl")),
                            no_deps=True)
    fla_dir = os.path.join(era.venv.site, "fla")
    fla_files = sorted(os.listdir(fla_dir))
    env = era.env(H100_OLD_TRITON, era.wheelhouse(fla="0.6.0"), FASTPATH_HOOKS_SKIP="causal-conv1d")
    steps["block"] = step = Step(era.venv, BLOCKED, env, "hook", **model)
    step.facts["fla_files_kept"] = os.path.isdir(fla_dir) and sorted(os.listdir(fla_dir)) == fla_files
    step.facts["fla_version"] = era.venv.versions().get("fla-core")
    return steps


def scenario_era_b(era: Era) -> Step:
    step = Step(era.venv, ERA_B, era.env(A100, era.wheelhouse(fla="0.6.0", causal=True)), "hook", config=QWEN3_5_TINY)
    step.facts["versions"] = era.venv.versions()
    return step


def scenario_era_a(era: Era) -> Step:
    # flash-linear-attention 0.6.0 wants transformers >= 5.6.2: the plan picks 0.5.2 for 4.57
    step = Step(era.venv, ERA_A, era.env(A100, era.wheelhouse(fla="0.5.2", causal=True)), "hook")
    step.facts["versions"] = era.venv.versions()
    return step


SCENARIOS = {"C": ("latest", scenario_era_c), "B": ("5.14.1", scenario_era_b), "A": ("4.57.6", scenario_era_a)}


@pytest.fixture(scope="module")
def scenarios(request, tmp_path_factory, torch_wheel, fastpath_wheel, dep_wheels):
    """era -> Future of its scenario; only the eras the selected tests need are started."""
    wanted = {getattr(item.function, "era", None) for item in request.session.items
              if getattr(item, "module", None) is request.module} - {None}
    pool = ThreadPoolExecutor(max_workers=2)

    def run(key):
        transformers, scenario = SCENARIOS[key]
        era = Era(str(tmp_path_factory.mktemp(f"era-{key}")), transformers, torch_wheel, fastpath_wheel, dep_wheels)
        return scenario(era)

    futures = {key: pool.submit(run, key) for key in sorted(wanted, key="CBA".index)}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def era(key: str):
    """Which scenario a test reads (the fixture starts only the ones selected tests need)."""

    def mark(test):
        test.era = key
        return test

    return mark


# -- era C ---------------------------------------------------------------------------------

@era("C")
def test_era_c_without_the_hook_the_decorated_functions_are_torch(scenarios):
    step = scenarios["C"].result()["baseline"]
    out = step.result()
    assert {name: r["torch"] for name, r in out["resolved"].items()} == dict.fromkeys(ERA_C_FUNCTIONS, True)
    assert out["calls_train"] == {"fla": None, "causal_conv1d": None}  # never imported
    assert out["grads_finite"]
    assert step.ours() == [] and out["events"] == []
    assert step.facts["kernels_after"] == []


@era("C")
def test_era_c_install_then_from_config_resolves_and_calls_the_kernels(scenarios):
    step = scenarios["C"].result()["hook"]
    out = step.result()
    resolved = out["resolved"]
    assert {name: (r["fake"], r["torch"]) for name, r in resolved.items()} == dict.fromkeys(ERA_C_FUNCTIONS, (True, False))
    assert resolved["torch_chunk_gated_delta_rule"]["module"] == "fla.ops.gated_delta_rule"
    assert resolved["causal_conv1d_fn"]["module"] == "causal_conv1d"
    # forward + backward ran through the fakes; decoding through the recurrent/update ones
    train, gen = out["calls_train"], out["calls_generate"]
    assert train["fla"]["chunk"] >= 1 and train["causal_conv1d"]["fn"] >= 1, train
    assert gen["fla"]["recurrent"] >= 1 and gen["causal_conv1d"]["update"] >= 1, gen
    assert out["grads_finite"]

    versions = step.facts["versions"]
    assert versions["fla-core"] == versions["flash-linear-attention"] == "0.6.0"
    assert versions["causal-conv1d"].startswith("1.6.2.post1")
    # what the caller's queue got: JSON dicts of the documented shape, naming what was installed
    events = out["events"]
    assert events and all(set(e) >= {"type", "kernel", "message", "ts"} for e in events)
    assert all(e["type"] in ("status", "warning", "error") and isinstance(e["ts"], float) for e in events)
    installed = {e["kernel"] for e in events if e["type"] == "status" and ": installed " in e["message"]}
    assert installed == {"fla", "causal-conv1d"}, [e["message"] for e in events]


@era("C")
def test_real_cpu_machine_gates_false_nothing_installed_one_line(scenarios):
    step = scenarios["C"].result()["cpu"]
    out = step.result()
    assert out["wrapped"] and out["gates"] == [False, False] and out["stepped_aside"]
    assert out["fla"] == out["causal_conv1d"] == "ModuleNotFoundError"
    assert all(r["torch"] for r in out["resolved"].values())
    assert step.facts["site_unchanged"]
    lines = step.ours()
    assert len(lines) == 1, step.stderr
    assert "no CUDA/XPU accelerator" in lines[0] and "CPU build" in lines[0] and "torch path" in lines[0], lines


@era("C")
def test_block_path_import_fla_explains_and_the_model_builds_on_torch(scenarios):
    step = scenarios["C"].result()["block"]
    out = step.result()
    message = out["import_fla"]
    assert message != "imported"
    for words in ("blocked `import fla`", "sm_90 + triton 3.6.0", "fla#640", "tilelang is unavailable", "torch path",
                  "Fix: ", ">= 3.7.1"):
        assert words in message, message
    assert out["resolved"]["torch_chunk_gated_delta_rule"]["torch"]
    assert out["resolved"]["torch_recurrent_gated_delta_rule"]["torch"]
    assert out["grads_finite"]          # forward + backward ran, on the torch path
    assert step.facts["fla_files_kept"] and step.facts["fla_version"] == "0.6.0"
    warnings = [e for e in out["events"] if e["kernel"] == "fla" and e["type"] == "warning"]
    assert warnings and "blocked" in warnings[0]["message"]


# -- era B: transformers 5.14.x, gates at modeling import ------------------------------------

@era("B")
def test_era_b_gates_give_module_globals_and_layers_the_kernels(scenarios):
    step = scenarios["B"].result()
    out = step.result()
    assert all(w["fake"] for w in out["globals"].values()), out["globals"]
    assert out["globals"]["chunk_gated_delta_rule"]["module"] == "fla.ops.gated_delta_rule"
    assert out["is_fast_path_available"] is True
    assert all(w["fake"] for w in out["layer"].values()), out["layer"]
    train = out["calls_train"]
    assert train["fla"]["chunk"] >= 1 and train["causal_conv1d"]["fn"] >= 1, train
    assert out["grads_finite"]
    assert out["after"] == [False, False, True, True]
    assert step.facts["versions"]["fla-core"] == "0.6.0"


# -- era A: transformers 4.57.x, plain (uncached) gates ---------------------------------------

@era("A")
def test_era_a_gates_give_module_globals_and_layers_the_kernels(scenarios):
    step = scenarios["A"].result()
    out = step.result()
    assert all(w["fake"] for w in out["qwen3_next"].values()), out["qwen3_next"]
    assert out["qwen3_next_fast_path"] is True
    assert all(w["fake"] for w in out["lfm2"].values()), out["lfm2"]
    assert out["lfm2_fast_path"] is True
    assert out["kernel_path_matches_torch"]
    assert out["calls"]["causal_conv1d"]["fn"] >= 1
    versions = step.facts["versions"]
    assert versions["fla-core"] == "0.5.2" and versions["causal-conv1d"].startswith("1.6.2.post1")
