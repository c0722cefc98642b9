"""Issue 12, the hook side: every Mamba / state-space family of real transformers gets its kernels.

Real transformers of every era (4.57.6, 5.14.1, the newest tested - the versions test_eras.py
builds), real venvs, stand-in kernel wheels (tests/support/wheels.py: `mamba_ssm_wheel`,
`fake_causal_conv1d`), child processes that pose as an A100 only through FASTPATH_HOOKS_TARGET.

- "families": install() first, then for each family the modeling module is imported (era C:
  that is when the decorated functions choose) and a tiny model is built (eras A/B: era B's
  mixers bind their kernels in `__init__` through `lazy_load_kernel`; era A's mamba and
  falcon_mamba cache causal-conv1d at the first layer). Every kernel function the family
  names - era C: every decorated module global, found in the module (and compared with the list
  read from the source, families.DECORATED); eras A/B: the gated globals read from the sources
  (families.GATED) - must be the stand-in's.
- "late": install() AFTER the modeling import (and, in era B, after a model was built):
  late.py must rebind the module's choice. Both kernels are installed by the engine from the
  wheelhouse (their release-named stand-in wheels; einops, mamba-ssm's runtime need, beside them)
  when install() heals the module, which it then rebinds.
- The family table of docs/transformers.md is rebuilt from these observations and must equal the one there.

causal-conv1d and mamba-ssm are installed by fastpath-hooks (the engine) in each era's late step;
the "families" step runs in the same venv (should the late step fail before installing mamba-ssm,
the stand-in, with einops, is put there first).
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import A100, CAUSAL_WHEEL, PY
from support import families, venvs, wheels
from test_eras import PREAMBLE, Era, Step

FAMILIES = families.FAMILIES
MAMBA_WHEEL = f"mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-{PY}-{PY}-linux_x86_64.whl"

# Tiny configs, valid in 4.57.6, 5.14.1 and 5.24.0 (one Mamba layer where the family allows; hybrids
# with one attention layer too).
_ATTN = dict(num_attention_heads=4, num_key_value_heads=2)
_MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
               mamba_chunk_size=16)
TINY = {
    "mamba": dict(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=1, expand=2, conv_kernel=4),
    "falcon_mamba": dict(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=1, expand=2, conv_kernel=4),
    "mamba2": dict(vocab_size=128, hidden_size=32, num_heads=4, head_dim=16, state_size=8, n_groups=1, expand=2,
                   conv_kernel=4, chunk_size=16, num_hidden_layers=1),
    "jamba": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_experts=1,
                  num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, **_ATTN),
    "bamba": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, attn_layer_indices=[1],
                  **_MAMBA2, **_ATTN),
    "falcon_h1": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, mamba_d_ssm=64,
                      **_MAMBA2, **_ATTN),
    "granitemoehybrid": dict(vocab_size=128, hidden_size=32, intermediate_size=64, shared_intermediate_size=64,
                             num_hidden_layers=2, layer_types=["mamba", "attention"], num_local_experts=2,
                             num_experts_per_tok=1, **_MAMBA2, **_ATTN),
    "nemotron_h": dict(vocab_size=128, hidden_size=32, intermediate_size=64, layers_block_type=["mamba", "attention"],
                       head_dim=8,
                       mamba_num_heads=4, mamba_head_dim=16, n_groups=1, ssm_state_size=8, conv_kernel=4,
                       expand=2, chunk_size=16, **_ATTN),
    "zamba": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, attention_hidden_size=64,
                  attention_head_dim=16, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
                  n_mamba_heads=1, attn_layer_period=2, attn_layer_offset=0, **_ATTN),   # layers: 2 mamba, 2 hybrid
    "zamba2": dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, mamba_d_state=8,
                   mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, n_mamba_heads=4, chunk_size=16,
                   layers_block_type=["mamba", "hybrid"], num_mem_blocks=1, **_ATTN),
}

# -- the child scripts ------------------------------------------------------------------------

KERNELS = PREAMBLE + r'''
import importlib, os, subprocess
from transformers import AutoConfig, AutoModelForCausalLM

def kernel_of(obj):
    """Which stand-in an object comes from: "mamba-ssm", "causal-conv1d", "torch" (era C's torch function
    or another of transformers' own), or None (no kernel bound)."""
    if obj is None:
        return None
    name = getattr(obj, "__module__", None) or ""
    module = sys.modules.get(name)
    if getattr(module, "FAKE_MAMBA_SSM", False):
        return "mamba-ssm"
    if getattr(module, "FAKE_CAUSAL_CONV1D", False):
        return "causal-conv1d"
    # 4.57's falcon_mamba: transformers' own mamba_inner_fn, built on mamba-ssm's compiled extension
    if name.startswith("transformers.kernels.falcon_mamba") and getattr(sys.modules.get("selective_scan_cuda"),
                                                                       "FAKE_MAMBA_SSM", False):
        return "mamba-ssm"
    return "torch"

def _decorated(fn):
    """The function transformers' decorator made: the module global itself, or - under HF kernels (5.25; 5.23/5.24
    with kernels 0.18) - the one the `Func` module it became calls (the `func` its forward closes over)."""
    if getattr(fn, "__code__", None) is None and callable(getattr(type(fn), "forward", None)):
        fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
    return fn

def decorated_choice(modeling):
    """Eras C/D: every module global made by use_kernel_func_from_hub_with_fallback -> what it resolved to."""
    out = {}
    for name, value in vars(modeling).items():
        value = _decorated(value)
        if callable(value) and getattr(value, "__wrapped__", None) is not None and getattr(value, "__closure__", None):
            cells = inspect.getclosurevars(value).nonlocals
            if "implementation" in cells and "torch_function" in cells:
                impl = cells["implementation"]
                out[name] = "torch" if impl is cells["torch_function"] else kernel_of(impl)
    return out

def gated_choice(modeling, names):
    """Eras A/B: the named module globals -> what they are bound to ("absent": not bound at all)."""
    out = {}
    for name in names:
        if name == "_causal_conv1d_cache":     # era A mamba / falcon_mamba: (update, fn) cached at the first layer
            cache = vars(modeling).get(name) or (None, None)
            out["causal_conv1d_update"], out["causal_conv1d_fn"] = (kernel_of(x) for x in cache)
        else:
            out[name] = kernel_of(vars(modeling)[name]) if name in vars(modeling) else "absent"
    return out

def build(family):
    cfg = AutoConfig.for_model(family, **ARGS["tiny"][family])
    return AutoModelForCausalLM.from_config(cfg)

'''

FAMILIES_SCRIPT = KERNELS + r'''
OUT["families"] = {}
for family in ARGS["families"]:
    name = f"transformers.models.{family}.modeling_{family}"
    try:
        modeling = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name not in (name, f"transformers.models.{family}"):
            raise
        OUT["families"][family] = "absent"
        continue
    if ARGS["era"] != "C":
        build(family)                          # era B chooses here; era A's mamba caches causal-conv1d here
        OUT["families"][family] = gated_choice(modeling, ARGS["gated"][family])
    else:
        OUT["families"][family] = decorated_choice(modeling)
finish()
'''

LATE_SCRIPT = KERNELS + r'''
family = ARGS["family"]
modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")   # chooses (A, C): no kernels
early = build(family) if ARGS["era"] == "B" else None                                    # chooses (B): no kernels
names = ARGS["gated"][family] if ARGS["era"] != "C" else None
OUT["before"] = decorated_choice(modeling) if names is None else gated_choice(modeling, names)
import fastpath_hooks
assert fastpath_hooks.install(on_event=EVENTS.put) is True
OUT["after"] = decorated_choice(modeling) if names is None else gated_choice(modeling, names)
OUT["fast_path"] = vars(modeling).get("is_fast_path_available")
finish()
'''


# -- running them -----------------------------------------------------------------------------

def scenario(key: str, era: Era) -> dict:
    """The late step first (no kernel installed yet), then the families step, in one venv."""
    mamba_dir = os.path.join(era.base, "mamba")
    # with einops, mamba-ssm's runtime need (4.57's kernels/falcon_mamba imports it behind the mamba gate)
    mamba_wheels = [wheels.mamba_ssm_wheel(mamba_dir)] + glob.glob(os.path.join(era.dep_wheels, "einops-*.whl"))
    gated = {f: list(families.GATED.get(key, {}).get(f, ())) for f in FAMILIES}
    steps = {}
    late_family = families.LATE_FAMILY[key]
    house = era.wheelhouse(causal=True)
    wheels.mamba_ssm_wheel(house, filename=MAMBA_WHEEL)    # the release wheel for the posed A100's torch 2.10
    steps["late"] = Step(era.venv, LATE_SCRIPT, era.env(A100, house), "plain", era=key,
                         family=late_family, tiny=TINY, gated=gated)
    if "mamba-ssm" not in era.venv.versions():   # the late step failed before the engine installed it
        era.venv.uv_install(*mamba_wheels, no_deps=True)
    steps["families"] = Step(era.venv, FAMILIES_SCRIPT, era.env(A100, era.wheelhouse(causal=True)), "hook", era=key,
                             families=list(FAMILIES), tiny=TINY, gated=gated)
    return steps


@pytest.fixture(scope="module")
def observed(tmp_path_factory, torch_wheel, fastpath_wheel, dep_wheels):
    """era -> Future of {"late": Step, "families": Step}; the three eras, two at a time."""
    pool = ThreadPoolExecutor(max_workers=2)

    def run(key):
        transformers = families.ERAS[key]
        era = Era(str(tmp_path_factory.mktemp(f"mamba-{key}")), transformers, torch_wheel, fastpath_wheel, dep_wheels)
        return scenario(key, era)

    futures = {key: pool.submit(run, key) for key in "CBA"}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def families_of(observed, key: str) -> dict:
    return observed[key].result()["families"].result()["families"]


# -- the families ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("key,family", [(k, f) for k in "CBA" for f in FAMILIES])
def test_after_install_every_kernel_function_of_the_family_is_the_kernel(observed, key, family):
    choice = families_of(observed, key)[family]
    if (key, family) in families.ABSENT:
        assert choice == "absent"
        return
    if key == "C":
        # every decorated function the module has, found there: exactly the ones read from the 5.24.0 source
        assert sorted(choice) == sorted(families.DECORATED[family]), choice
        expected = {name: families.kernel_of_package(package) for name, (_, package) in families.DECORATED[family].items()}
    else:
        expected = families.expected_gated(key, family)
    assert choice == expected


@pytest.mark.slow
def test_falcon_mamba_in_era_b_never_asks_for_mamba_ssm(observed):
    """5.14's FalconMambaMixer asks lazy_load_kernel("falcon_mamba-ssm"): no gate of that name exists, so
    the pip package is never asked for (only the hub's `kernels` could give it): the table says so."""
    choice = families_of(observed, "B")["falcon_mamba"]
    assert choice["causal_conv1d_fn"] == "causal-conv1d"
    assert {choice[n] for n in ("selective_state_update", "selective_scan_fn", "falcon_mamba_inner_fn")} == {None}


# -- the late pass ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("key", "CBA")
def test_install_after_the_modeling_import_rebinds_the_family(observed, key):
    step = observed[key].result()["late"]
    out = step.result()
    family = families.LATE_FAMILY[key]
    before, after = out["before"], out["after"]
    # chosen before install(): nothing (no kernel was on disk); after: every function on its kernel
    assert set(before.values()) <= {"torch", None, "absent"}, before
    if key == "C":
        expected = {name: families.kernel_of_package(package) for name, (_, package) in families.DECORATED[family].items()}
    else:
        expected = families.expected_gated(key, family)
        assert out["fast_path"] is True
    assert after == expected
    lines = [line for line in step.ours() if f"{family}: imported before install()" in line]
    assert len(lines) == 1 and "now uses causal-conv1d, mamba-ssm" in lines[0], step.stderr
    # the engine installed both from the wheelhouse (mamba-ssm: its release-named stand-in, from the pins)
    assert re.search(r"installed .*mamba-ssm 2\.3\.2\.post1\+cu12torch2\.10cxx11abiTRUE", step.stderr), step.stderr
    assert re.search(r"installed .*causal-conv1d 1\.6\.2\.post1", step.stderr), step.stderr


# -- the table in docs/transformers.md -------------------------------------------------------------

@pytest.mark.slow
def test_the_documented_family_table_is_what_was_observed(observed):
    seen = {key: families_of(observed, key) for key in "CBA"}
    table = families.table(seen)
    with open(os.path.join(venvs.ROOT, "docs", "transformers.md"), encoding="utf-8") as fh:
        doc = fh.read()
    assert families.documented_table(doc) == table, f"the table in docs/transformers.md should be:\n{table}"


def test_the_tables_are_read_from_the_installed_transformers_source():
    """DECORATED (era C) is what the installed transformers' modeling files decorate, assignments included
    (zamba's `x = use_kernel_func_from_hub_with_fallback(...)(torch_x)`)."""
    import transformers

    from fastpath_hooks.hooks import late
    late_layouts = late

    if transformers.__version__ != venvs.NEWEST_TESTED_TRANSFORMERS:
        pytest.skip(f"transformers {transformers.__version__} is not the newest tested, whose tables these are")
    root = os.path.dirname(transformers.__file__)
    found = {f: families.decorated_in_source(os.path.join(root, "models", f, f"modeling_{f}.py")) for f in FAMILIES}
    assert found == families.DECORATED
    for table in found.values():
        for name, pair in table.items():
            assert late_layouts.DECORATED[name] == pair


def _einops(dep_wheels) -> list:
    """The einops wheel: the stand-in's selective_scan_interface imports it, as the real one does."""
    return glob.glob(os.path.join(dep_wheels, "einops-*.whl"))


@pytest.mark.slow
def test_the_stand_in_is_installed_by_uv_the_way_the_tests_use_it(tmp_path, dep_wheels):
    """mamba_ssm_wheel builds a wheel uv installs, with the layout transformers resolves."""
    wheel = wheels.mamba_ssm_wheel(str(tmp_path / "house"))
    target = tmp_path / "site"
    subprocess.run([venvs.uv(), "pip", "install", "-q", "--no-deps", "--target", str(target), wheel, *_einops(dep_wheels)],
                   check=True, env=venvs.clean_env(), capture_output=True)
    code = ("import mamba_ssm, mamba_ssm.ops.triton.ssd_combined as s, mamba_ssm.ops.triton.selective_state_update as u;"
            "print(mamba_ssm.__version__, s.mamba_chunk_scan_combined.__name__, s.mamba_split_conv1d_scan_combined.__name__,"
            " u.selective_state_update.__name__, mamba_ssm.selective_scan_fn.__name__, mamba_ssm.mamba_inner_fn.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], env=venvs.clean_env(PYTHONPATH=str(target)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2.3.2.post1", "mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined",
                                   "selective_state_update", "selective_scan_fn", "mamba_inner_fn"]


MAMBA_GATE = r'''
import json, sys
import fastpath_hooks
assert fastpath_hooks.install() is True
import torch
from transformers.utils import import_utils
from fastpath_hooks import engine
first = import_utils.is_mamba_ssm_available()        # the first question of the process: the mamba gate
print(json.dumps({"mamba_gate": first, "asked": sorted(engine.outcomes()),
                  "mamba2_gate": import_utils.is_mamba_2_ssm_available(),
                  "cuda_outside_the_gates": torch.cuda.is_available()}))
'''


@pytest.mark.slow
def test_the_mamba_gates_decide_mamba_ssm_and_causal_conv1d_and_answer_as_on_the_posed_gpu(tmp_path, dep_wheels):
    """Asked first, `is_mamba_ssm_available` decides mamba-ssm and causal-conv1d (the families' fast path
    needs both); on a posed A100 (report mode, the stand-ins importable) both mamba gates answer as the real
    gates would there, while the rest of the process sees no GPU. (Era B's `lazy_load_kernel("mamba-ssm")`
    reaches this wrapper by name: the 5.14.1 family observations above go through it.)"""
    house = str(tmp_path / "house")
    stand_ins = [wheels.mamba_ssm_wheel(house), wheels.fake_causal_conv1d(house, CAUSAL_WHEEL), *_einops(dep_wheels)]
    target = tmp_path / "site"
    subprocess.run([venvs.uv(), "pip", "install", "-q", "--no-deps", "--target", str(target), *stand_ins], check=True,
                   env=venvs.clean_env(), capture_output=True)
    env = venvs.clean_env(PYTHONPATH=str(target), FASTPATH_HOOKS_TARGET=A100, FASTPATH_HOOKS_MODE="report",
                          FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", MAMBA_GATE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out == {"mamba_gate": True, "asked": ["causal-conv1d", "mamba-ssm"], "mamba2_gate": True,
                   "cuda_outside_the_gates": False}, proc.stderr
