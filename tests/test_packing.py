"""doctor says when packed-sequence (padding-free) training would fail, for which kernels, and the fix.

The facts (pins.json `packed_sequences`) are checked against the real installed transformers:
its kernel functions really raise on cu_seqlens / seq_idx without the package, and the models
listed really route those arguments to that package. The doctor runs are the real CLI on this
(CPU) machine, posing GPUs and versions through FASTPATH_HOOKS_TARGET.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import A100
from fastpath_hooks.facts import pins as pins_mod
from support.venvs import clean_env

PACKED = pins_mod.load().packed_sequences
HAVE_ALL = ",fla-core=0.6.0,flash-linear-attention=0.6.0,causal-conv1d=1.6.2.post1,mamba-ssm=2.2.4"
HEADLINE = "padding-free training (cu_seqlens / seq_idx) would fail here: transformers {} raises ValueError without {}"

# slow: reads every modeling module of the installed transformers, runs it and doctor in processes
pytestmark = pytest.mark.slow


def _transformers():
    try:
        import transformers
    except ImportError:
        pytest.skip("transformers is not installed")
    return transformers


def _doctor(*args, **env) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "fastpath_hooks", "doctor", *args], env=clean_env(**env),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def _both(**env):
    """(doctor --json's packed_sequences, doctor's text)."""
    return json.loads(_doctor("--json", **env).stdout)["packed_sequences"], _doctor(**env).stdout


# -- the facts, against the real transformers --------------------------------------------------

CALL = r'''
import importlib, inspect, json, sys, torch
def _decorated(fn):
    """The function transformers' decorator made: the module global itself, or - under HF kernels (5.25; 5.23/5.24
    with kernels 0.18) - the one the `Func` module it became calls (the `func` its forward closes over)."""
    if getattr(fn, "__code__", None) is None and callable(getattr(type(fn), "forward", None)):
        fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
    return fn

out = {}
for model, module in json.loads(sys.argv[1]):
    mod = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    for name, fn in vars(mod).items():
        fn = _decorated(fn)
        if not (callable(fn) and hasattr(fn, "__wrapped__")):
            continue
        try:
            found = inspect.getclosurevars(fn).nonlocals
        except (TypeError, ValueError):
            continue
        if found.get("package") != module:
            continue
        for argument in ("cu_seqlens", "seq_idx"):
            try:
                fn(torch.zeros(1), **{argument: torch.zeros(2, dtype=torch.int32)})
                out[f"{model}.{name}.{argument}"] = None
            except ValueError as exc:
                out[f"{model}.{name}.{argument}"] = str(exc)
print(json.dumps(out))
'''


def test_the_installed_transformers_raises_on_packed_sequences_as_the_pins_say():
    transformers = _transformers()
    assert PACKED.transformers.contains(transformers.__version__, prereleases=True), transformers.__version__
    for package in PACKED.packages:  # none of them is installed in the test environment
        assert subprocess.run([sys.executable, "-c", f"import {package.module}"], capture_output=True).returncode != 0
    wanted = [(package.models[0], package.module) for package in PACKED.packages]
    proc = subprocess.run([sys.executable, "-c", CALL, json.dumps(wanted)], capture_output=True, text=True,
                          env=clean_env(FASTPATH_HOOKS_DISABLE="1"), timeout=600)
    assert proc.returncode == 0, proc.stderr
    raised = json.loads(proc.stdout.strip().splitlines()[-1])
    for model, module in wanted:
        mine = {k: v for k, v in raised.items() if k.startswith(model + ".")}
        assert mine, f"no kernel function from {module} in {model}"
        assert all(v and "can't keep packed sequences apart without" in v for v in mine.values()), mine


def _routes(path: str) -> dict:
    """module -> True when a modeling file passes cu_seqlens / seq_idx (or **kwargs) to a kernel
    function decorated with use_kernel_func_from_hub_with_fallback(..., module)."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    decorated = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "use_kernel_func_from_hub_with_fallback":
                    decorated[node.name] = d.args[1].value
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in decorated:
            names = {k.arg for k in node.keywords}
            if names & {"cu_seqlens", "seq_idx", None}:
                found[decorated[node.func.id]] = True
    return found


def test_the_listed_models_route_packed_sequences_to_their_package():
    transformers = _transformers()
    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    routes: dict = {}
    for path in glob.glob(os.path.join(root, "*", "modeling_*.py")):
        model = os.path.basename(os.path.dirname(path))
        for module in _routes(path):
            routes.setdefault(module, set()).add(model)
    assert PACKED.packages, "the pins list the packages that route packed sequences"
    for package in PACKED.packages:
        assert set(package.models) <= routes.get(package.module, set()), package
        if transformers.__version__ == "5.24.0":  # the release the list was read from: complete
            assert set(package.models) == routes[package.module], package


# -- doctor ------------------------------------------------------------------------------------------

def test_doctor_says_it_would_fail_on_this_cpu_machine():
    _transformers()
    packed, text = _both()
    assert packed["raises"] is True
    assert [f["package"] for f in packed["failures"]] == ["fla", "causal-conv1d", "mamba-ssm"]
    fla, causal, mamba = packed["failures"]
    assert fla["action"] == "skip" and "no CUDA/XPU accelerator" in fla["problem"]
    assert fla["fix"] == "run on a machine with a CUDA (or XPU) GPU and a matching torch build"
    assert fla["models"][:3] == ["qwen3_5", "qwen3_5_moe", "qwen3_next"] and "qwen3_next" in causal["models"]
    # mamba-ssm is managed too (its skip says why, like fla's)
    assert mamba["kernel"] == "mamba-ssm" and mamba["action"] == "skip" and "mamba2" in mamba["models"]
    assert "no CUDA/XPU accelerator" in mamba["problem"] and mamba["fix"] == fla["fix"]
    assert HEADLINE.format(packed["transformers"], "fla, causal-conv1d, mamba-ssm") in text
    # the same fix for every kernel: said once, as the summary's
    assert text.count(fla["fix"]) == 1 and f"To change it: {fla['fix']}." in text, text


def test_doctor_is_quiet_when_the_kernels_are_there_or_transformers_does_not_raise():
    _transformers()
    packed, text = _both(FASTPATH_HOOKS_TARGET=A100 + HAVE_ALL)
    assert packed["raises"] is True and packed["failures"] == [], packed
    assert "Packed sequences" not in text

    packed, text = _both(FASTPATH_HOOKS_TARGET=A100 + ",transformers=5.19.0")
    assert packed == {"transformers": "5.19.0", "raises": False, "failures": []}
    assert "Packed sequences" not in text
    assert _both(FASTPATH_HOOKS_TARGET=A100 + ",transformers=5.20.0")[0]["raises"] is True
    assert _both(FASTPATH_HOOKS_TARGET="transformers=none")[0] == {"transformers": None, "raises": False,
                                                                    "failures": []}


def test_doctor_names_the_setting_or_what_fastpath_hooks_would_do():
    _transformers()
    target = A100 + ",mamba-ssm=2.2.4"
    packed, text = _both(FASTPATH_HOOKS_TARGET=target, FASTPATH_HOOKS_SKIP="fla")
    assert [f["package"] for f in packed["failures"]] == ["fla", "causal-conv1d"]
    fla, causal = packed["failures"]
    assert (fla["action"], fla["problem"], fla["fix"]) == (
        "skip", "fla is left alone here: skipped by FASTPATH_HOOKS_SKIP", "remove fla from FASTPATH_HOOKS_SKIP")
    assert causal["action"] == "install" and causal["problem"] == "causal-conv1d is not installed"
    assert causal["fix"].startswith("fastpath-hooks would install causal-conv1d==1.6.2.post1 at the first import "
                                    "once active: `fastpath-hooks enable`")
    assert HEADLINE.format(packed["transformers"], "fla, causal-conv1d") in text

    packed, _ = _both(FASTPATH_HOOKS_TARGET=target, FASTPATH_HOOKS_MODE="report")
    assert {f["package"]: f["fix"] for f in packed["failures"]} == {
        "fla": "unset FASTPATH_HOOKS_MODE: fastpath-hooks would then install fla-core==0.6.0, flash-linear-attention==0.6.0",
        "causal-conv1d": "unset FASTPATH_HOOKS_MODE: fastpath-hooks would then install causal-conv1d==1.6.2.post1"}


@pytest.mark.slow
def test_doctor_is_quiet_about_a_planned_install_once_fastpath_hooks_runs_at_start_up(make_venv, tmp_path):
    venv = make_venv()
    assert venv.cli("enable", env=clean_env()).returncode == 0
    out = venv.cli("doctor", "--json", env=clean_env(FASTPATH_HOOKS_TARGET=A100 + ",mamba-ssm=2.2.4",
                                                     FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache")))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["activation"]["pth"] or data["activation"]["sitecustomize"]
    assert {d["kernel"]: d["action"] for d in data["decisions"]}["causal-conv1d"] == "install"
    assert data["packed_sequences"]["raises"] is True and data["packed_sequences"]["failures"] == []
