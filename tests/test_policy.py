"""The decision policy, table-driven: policy.decide(env, settings, pins) is pure, so every
rule is one row built from a plain Environment value - no probe, no machine, no mocks.

Rows start from an H100-like machine (sm_90, CUDA 12.8 torch 2.10.0, triton 3.6.0,
Python 3.12, transformers 5.24.0, nvcc present: the Hopper hazard fla#640 applies) and
override only the facts the rule is about.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from fastpath_hooks.decide import plan as commands

from fastpath_hooks.facts import pins as pins_mod
from fastpath_hooks.facts.distributions import canonical_name
from fastpath_hooks.facts.pins import BrokenPair, Hazard
from fastpath_hooks.decide.plan import BLOCK, INSTALL, OK, REPAIR, SKIP
from fastpath_hooks.decide import messages as rule_ids
from fastpath_hooks.decide.builds import decide_build
from fastpath_hooks.decide.policy import decide
from fastpath_hooks.decide.policy.compiled import release_wheel
from fastpath_hooks.facts.environment import Environment
from fastpath_hooks.facts.settings import Settings

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

PINS = pins_mod.load()
DECIDE_DIR = os.path.join(os.path.dirname(os.path.dirname(pins_mod.__file__)), "decide")

BASE = dict(
    python="3.12.3", implementation="cpython", os="linux", arch="x86_64", glibc="2.36",
    torch="2.10.0", torch_cuda="12.8", torch_hip=None, torch_xpu=False, cxx11_abi=True,
    gpus=("sm_90",), gpu_source="target", triton="3.6.0", triton_dist="triton",
    nvcc="/usr/local/cuda/bin/nvcc", uv=None, wheelhouse=(), half_installed=(),
    nvcc_version="12.8", cpus=16, wheel_cache="/cache/wheels",
)
BASE_DISTS = {"transformers": "5.24.0", "numpy": "2.2.6", "einops": "0.8.1", "packaging": "25.0"}
TILELANG_DEPS = {"z3-solver": "4.15.4.0", "torch-c-dlpack-ext": "0.1.3", "cloudpickle": "3.1.1", "ml-dtypes": "0.5.3",
                 "psutil": "7.1.0", "tqdm": "4.67.1", "typing-extensions": "4.15.0"}
WHEELS_06 = ("fla_core-0.6.0-py3-none-any.whl", "flash_linear_attention-0.6.0-py3-none-any.whl")
WHEELS_052 = ("fla_core-0.5.2-py3-none-any.whl", "flash_linear_attention-0.5.2-py3-none-any.whl")
WHEELS_PAIR = ("tilelang-0.1.15-cp38-abi3-manylinux_2_28_x86_64.whl",
               "apache_tvm_ffi-0.1.12-cp312-abi3-manylinux_2_28_x86_64.whl")
ROCM = dict(torch_cuda=None, torch_hip="6.4", gpus=("gfx942",), triton_dist="pytorch-triton-rocm", hipcc="/opt/rocm/bin/hipcc")
# A wheel `fastpath-hooks build` made for the BASE machine, but for torch 2.13 (no release wheel)
BUILT_213 = "causal_conv1d-1.6.2.post1+fph.torch2.13.0.cu128.abi1.sm90-cp312-cp312-linux_x86_64.whl"
NO_RELEASE = {"torch": "2.13.0"}
XPU = dict(torch_cuda=None, torch_xpu=True, gpus=("xpu",), triton_dist="pytorch-triton-xpu")
OFFLINE = dict(offline=True, find_links=("/wheelhouse",))
# causal-conv1d's release wheel for BASE, and upstream's digest of it
CC_WHEEL = "causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
CC_SHA256 = "c16c1c48d4fa63415cc797e02d69f97248c57c04627d99e394d5bb0ef266e288"
CC_WHEEL_170 = "causal_conv1d-1.7.0+cu12torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"   # no digest pinned


B300 = dict(gpus=("sm_103",), torch="2.13.0", torch_cuda="13.0", nvcc_version="13.0")


def NUMERIC_FAILURE(kernel, version, *, arch="sm_90", torch="2.13.0", cuda="12.8"):
    """One remembered numeric mismatch, as the probe hands it to the policy (facts/memory.failures)."""
    return (kernel, version, arch, f"torch {torch} CUDA {cuda}",
            f"on {arch}, causal_conv1d_fn forward differs from torch by 0.43 (tolerance 0.05 + 1%)",
            f"/c/numeric/{kernel}.json")


def _next_mamba():
    """The shipped pins plus a mamba-ssm release with the opt-in CUDA extension (2.4.0 stands for the next one)."""
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump({"kernels": {"mamba-ssm": {"releases": [
            {"version": "2.4.0", "torch": ">=2.6", "triton": ">=3.5.0", "source": "upstream: test stand-in"}]}}}, fh)
    return pins_mod.load(fh.name)


NEXT_MAMBA = _next_mamba()
MAMBA_PY = "2.4.0+fph.torch2.13.0.cu128.abi1.py"


def _hub_rows(repo: str, version: int, kernel: str, functions) -> tuple:
    return tuple((f, repo, f, version, None, kernel, ("inference", "training")) for f in functions)


# transformers 5.25's mapping as the probe reads it, each repo loaded from a LOCAL_KERNELS directory
HUB_MAMBA_LOCAL = dict(
    hub_entries=_hub_rows("kernels-community/mamba-ssm", 5, "causal-conv1d", ("causal_conv1d_fn", "causal_conv1d_update"))
    + _hub_rows("kernels-community/mamba-ssm", 5, "mamba-ssm", ("mamba_chunk_scan_combined", "selective_state_update")),
    hub_where={"kernels-community/mamba-ssm@v5": ("LOCAL_KERNELS", "/kernels/mamba-ssm")})
HUB_FLA_LOCAL = dict(
    hub_entries=_hub_rows("kernels-community/fla", 3, "fla", ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")),
    hub_where={"kernels-community/fla@v3": ("LOCAL_KERNELS", "/kernels/fla")})


def make_env(dists: dict | None = None, **over) -> Environment:
    """An Environment with BASE facts, `over` replacing facts and `dists` adding (None: removing) distributions."""
    facts = {**BASE, **over}
    installed = dict(BASE_DISTS)
    if facts["torch"]:
        installed["torch"] = facts["torch"]
    if facts["triton"]:
        installed[facts["triton_dist"]] = facts["triton"]
    for name, version in (dists or {}).items():
        if version is None:
            installed.pop(name, None)
        else:
            installed[name] = version
    return Environment(distributions=installed, **facts)


def plan_for(env=None, settings=None, pins=PINS, **kw):
    return decide(env or make_env(), settings or Settings(), pins, **kw)


def with_kernel(pins, name: str, **changes) -> pins_mod.Pins:
    """`pins` with one kernel's entry changed (its KernelSpec fields)."""
    return dataclasses.replace(pins, kernels={**pins.kernels, name: dataclasses.replace(pins.kernel(name), **changes)})


def with_broken(*entries) -> pins_mod.Pins:
    extra = tuple(BrokenPair(tl, tuple(ffi), arch, "test: broken", "measured: test") for tl, ffi, arch in entries)
    return with_kernel(PINS, "tilelang", broken=PINS.kernel("tilelang").broken + extra)


def with_hazard(gpu: str, triton: str) -> pins_mod.Pins:
    hz = Hazard("test-hazard", "fla", (gpu,), SpecifierSet(triton), "tilelang", "test: wrong backward", "upgrade",
                "measured: test")
    return dataclasses.replace(PINS, hazards=(hz,))


def reqs(decision) -> list:
    return [r for step in decision.steps for r in step.requirements]


def assert_known_good_pair(decision, gpus):
    tl, ffi = decision.target["tilelang"], decision.target["apache-tvm-ffi"]
    assert ffi in PINS.good_companions("tilelang", tl), f"{tl} + {ffi} is not a pinned known-good pair"
    assert PINS.broken_for("tilelang", tl, ffi, gpus) is None
    assert ffi not in PINS.yanked.get("apache-tvm-ffi", ())
    last = decision.steps[-1]
    assert last.kind == "kernel" and last.no_deps
    assert last.requirements == (f"tilelang=={tl}", f"apache-tvm-ffi=={ffi}")
    return True


def assert_replaces_ffi_first(decision):
    """The repair shape: apache-tvm-ffi alone, --no-deps and forced, before anything else."""
    first = decision.steps[0]
    assert first.kind == "replace"
    assert first.requirements == (f"apache-tvm-ffi=={decision.target['apache-tvm-ffi']}",)
    assert first.no_deps and first.force and first.binary_only
    pip = commands.invocation(first, installer="pip", settings=Settings(), python="py").argv
    assert "--no-deps" in pip and "--force-reinstall" in pip and pip[-1] == first.requirements[0]
    uv = commands.invocation(first, installer="uv", settings=Settings(), python="py", uv="uv").argv
    assert "--no-deps" in uv and uv[uv.index("--reinstall-package") + 1] == "apache-tvm-ffi"
    return True


# -- one row per rule ----------------------------------------------------------------------

@dataclass
class Row:
    id: str
    kernel: str
    action: str
    rule: str
    env: dict = field(default_factory=dict)
    dists: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    pins: object = None
    check: object = None          # check(decision, plan) -> True or a tuple of True: what the decision does
    via: object = None            # via(env, settings, pins) -> Decision instead of decide() (`fastpath-hooks build`)


def _fla_installs(version, needs=()):
    def check(d, plan):
        assert d.target == {"fla-core": version, "flash-linear-attention": version}
        assert reqs(d)[-2:] == [f"fla-core=={version}", f"flash-linear-attention=={version}"]
        assert d.steps[-1].no_deps and d.steps[-1].binary_only
        assert d.needs == needs
        return True
    return check


def _leaves_alone(reason, fix=None, also=None):
    """A skip: nothing to run or check, the import proceeds on its own; the reason says why, the fix (where
    there is one) how to change it; `also`: kernel -> the rule that decided it in the same plan."""
    def check(d, plan):
        assert not d.steps and not d.repair_steps and not d.target and not d.verify
        assert d.on_failure == "proceed"
        assert reason in d.reason, d.reason
        assert fix is None or fix in d.fix, d.fix
        for kernel, rule in (also or {}).items():
            assert plan[kernel].rule == rule, (kernel, plan[kernel].rule)
        return True
    return check


def _skips_all(fragment, fix="run on a machine with a CUDA (or XPU) GPU"):
    def check(d, plan):
        for other in plan.decisions.values():
            assert other.action == SKIP and _leaves_alone(fragment, fix)(other, plan)
        assert plan.notes and fragment in plan.notes[0]     # said once for the machine, not per kernel
        return True
    return check


def _checked_once(installed, reason="checked once in a child process"):
    """Kept as installed, checked once in a child process (verify), its import blocked if that fails."""
    def check(d, plan):
        assert d.verify and d.on_failure == "block" and not d.steps
        assert dict(d.installed) == installed
        assert reason in d.reason, d.reason
        return True
    return check


def _repairs_to_pair(tl, ffi):
    """What a failed check runs: apache-tvm-ffi replaced alone first, then the known-good pair pinned together."""
    def check(d, plan):
        first, last = d.repair_steps[0], d.repair_steps[-1]
        assert first.kind == "replace" and first.requirements == (f"apache-tvm-ffi=={ffi}",) and first.force
        assert last.kind == "kernel" and last.requirements == (f"tilelang=={tl}", f"apache-tvm-ffi=={ffi}")
        return True
    return check


def _rocm_fla(d, plan):
    assert dict(d.env) == {"FLA_TILELANG": "0"}
    assert plan["tilelang"].action == SKIP and plan["tilelang"].rule == "skip.accelerator.rocm"
    return True


def _hazard_block(d, plan):
    assert d.on_failure == "block" and "3.7.1" in d.fix and "fla#640" in d.reason
    assert plan["tilelang"].action == SKIP
    return True


def _causal_wheel(filename, *, sha256, url=True):
    def check(d, plan):
        step = d.steps[-1]
        assert step.kind == "wheel" and step.requirements == (filename,) and step.no_deps
        if url:
            assert step.url.endswith("/" + filename.replace("+", "%2B"))
        else:
            assert step.url is None
        assert step.sha256 == sha256, "the digest of exactly this file"
        assert d.target == {"causal-conv1d": "1.6.2.post1"}
        return True
    return check


def _causal_build(archs, version="1.7.0", **env):
    """A build of exactly `archs` against the installed torch, with the sdist's own switches (of 1.7.0, the
    preferred release, unless only another's sdist is there)."""
    def check(d, plan):
        step = d.steps[-1]
        assert step.kind == "build" and not step.build_isolation and not step.binary_only and step.no_deps
        assert step.archs == archs
        assert dict(step.env) == {"CAUSAL_CONV1D_FORCE_BUILD": "TRUE", **env}, "compile, never download a wheel"
        assert d.target == {"causal-conv1d": version} and step.requirements == (f"causal-conv1d=={version}",)
        assert d.expected_seconds > 0 and "estimate" in d.reason and re.search(r"about \d+ (s|min)", d.reason)
        return True
    return check


MAMBA_WHEEL = "mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
MAMBA_BUILT = "mamba_ssm-2.3.2.post1+fph.torch2.13.0.cu128.abi1.sm90-cp312-cp312-linux_x86_64.whl"
CONV = {"causal-conv1d": "1.6.2.post1"}        # a release wheel (all archs): causal.ok
MAMBA_NO_RELEASE = {"torch": "2.13.0", "triton": "3.7.1"}   # no release wheel; no Hopper hazard, so no tilelang planned
H200 = {"torch": "2.11.0", "torch_cuda": "13.0", "nvcc_version": "13.0"}   # no release wheel for torch 2.11
PAIR_015 = {"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"}
MAMBA_SDIST_HOUSE = ("mamba_ssm-2.3.2.post1.tar.gz", "causal_conv1d-1.6.2.post1.tar.gz", "wheel-0.45.1-py3-none-any.whl",
                     "setuptools-80.0.0-py3-none-any.whl")


def _mamba_wheel(filename, needs=("causal-conv1d",), declares=None):
    def check(d, plan):
        step = d.steps[-1]
        assert step.kind == "wheel" and step.requirements == (filename,) and step.no_deps
        assert step.url == "https://github.com/state-spaces/mamba/releases/download/v2.3.2.post1/" + \
            filename.replace("+", "%2B")
        assert step.sha256 is None and "no pinned sha256" in step.note   # the pins do not know the hashes
        assert d.target == {"mamba-ssm": "2.3.2.post1"} and d.needs == needs
        assert plan["causal-conv1d"].action == INSTALL
        if declares:
            assert f"declares {declares}: the --no-deps install leaves it unmet" in d.reason, d.reason
        else:   # fla's planned tilelang pair is no clash: fla may never be imported, and the install is --no-deps
            assert plan["tilelang"].action == INSTALL and "declares" not in d.reason, d.reason
        return True
    return check


def _mamba_build(version, archs, why=None, needs=("causal-conv1d",)):
    def check(d, plan):
        step = d.steps[-1]
        assert step.kind == "build" and not step.build_isolation and not step.binary_only and step.no_deps
        assert step.requirements == (f"mamba-ssm=={version}",) and step.archs == archs
        assert dict(step.env) == {"MAMBA_FORCE_BUILD": "TRUE"}
        assert d.target == {"mamba-ssm": version} and d.needs == needs
        assert d.expected_seconds == 117 * len(archs)
        if why:
            assert why in d.reason, d.reason
        return True
    return check


def _from_cache(name):
    def check(d, plan):
        assert [s.kind for s in d.steps] == ["wheel"], "no build, nothing else"   # ninja is a build's need only
        assert d.steps[-1].url == "file:///cache/wheels/" + name.replace("+", "%2B")
        assert "local wheel cache" in d.reason
        return True
    return check


def _no_build(fragment, fix=None):
    return _leaves_alone(fragment, fix)


# flash attention (FA2: flash-attn, FA3: flash-attn-3): the compiled path, asked for by attn_implementation
FA2_WHEEL = "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"
FA = {"flash-attn": dict(prefix="fa2", gpu="sm_80", dist="flash-attn", version="2.8.3.post2", archs=("sm_80",),
                         env={"FLASH_ATTENTION_FORCE_BUILD": "TRUE", "FLASH_ATTN_CUDA_ARCHS": "80"},
                         requirement="flash-attn==2.8.3.post2",
                         built="flash_attn-2.8.3.post2+fph.torch2.10.0.cu128.abi1.sm80-cp312-cp312-linux_x86_64.whl"),
      # no model imported: every head dim and sliding-window attention kept (`swa` in its label)
      "flash-attn-3": dict(prefix="fa3", gpu="sm_90", dist="flash-attn-3", version="3.0.0b1", archs=("sm_90",),
                           env={"FLASH_ATTENTION_FORCE_BUILD": "TRUE", **{f"FLASH_ATTENTION_DISABLE_{n}": "TRUE" for n in (
                               "FP8", "PAGEDKV", "APPENDKV", "SPLIT", "SOFTCAP", "CLUSTER", "SM80")}},
                           requirement="flash-attn-3 @ git+https://github.com/Dao-AILab/flash-attention@v2.8.3#subdirectory=hopper",
                           built="flash_attn_3-3.0.0b1+fph.torch2.10.0.cu128.abi1.sm90.swa-cp39-abi3-linux_x86_64.whl",
                           variant=".swa")}
FA_TIME = {"timeout": 1e6}   # their builds outlast the default FASTPATH_HOOKS_TIMEOUT (the timeout row says so)
FA3_ALWAYS_OFF = tuple(f"FLASH_ATTENTION_DISABLE_{n}" for n in ("FP8", "PAGEDKV", "APPENDKV", "SPLIT", "SOFTCAP",
                                                                 "CLUSTER", "SM80"))
QWEN35_ATTENTION = (("qwen3_5", 256, 4, 16, False),)   # Environment.attention_shapes: Qwen3.5's full attention


def FA3_MINE(variant: str) -> str:
    """An FA3 build of ours for sm_90 keeping `variant` (facts/wheels.py: hd256, swa)."""
    return "3.0.0b1+fph.torch2.10.0.cu128.abi1.sm90" + (f".{variant}" if variant else "")


def FA3_BUILT(variant: str) -> str:
    return f"flash_attn_3-{FA3_MINE(variant)}-cp39-abi3-linux_x86_64.whl"


def _fa_build(kernel, archs=None):
    """A build of exactly the visible GPU's code with the sdist's own switches (FA2: FLASH_ATTN_CUDA_ARCHS; FA3:
    FORCE_BUILD and the trimming switches), from its sdist (FA3: its repository's hopper/)."""
    fa = FA[kernel]

    def check(d, plan):
        step = d.steps[-1]
        assert step.kind == "build" and not step.build_isolation and not step.binary_only and step.no_deps
        assert step.archs == (archs or fa["archs"]) and step.requirements == (fa["requirement"],)
        assert dict(step.env) == fa["env"] if archs is None else dict(step.env)["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
        assert d.target == {fa["dist"]: fa["version"]} and "estimate" in d.reason
        return True
    return check


def _fa_rows(kernel) -> list:
    """The compiled kernel's rules for one flash attention, on its own GPU (FA2 on sm_80, FA3 on sm_90)."""
    fa = FA[kernel]
    p, gpu, dist = fa["prefix"], fa["gpu"], fa["dist"]
    on = {"gpus": (gpu,)}
    old = {**on, "torch": "2.13.0"}
    mine = f"{fa['version']}+fph.torch2.10.0.cu128.abi1.{gpu.replace('_', '')}{fa.get('variant', '')}"
    return [
        Row(f"{p}.no-release: no pinned release fits this torch", kernel, SKIP, f"{p}.no-release", env=on,
            pins=with_kernel(PINS, kernel, releases=tuple(
                dataclasses.replace(r, torch=SpecifierSet(">=2.99")) for r in PINS.kernel(kernel).releases)),
            check=lambda d, p: ("no pinned" in d.reason and "fits torch 2.10.0" in d.reason, not d.steps)),
        Row(f"{p}.offline-missing: neither a wheel nor its source here", kernel, SKIP, f"{p}.offline-missing", env=on,
            settings={**OFFLINE, **FA_TIME}, check=lambda d, p: ("FASTPATH_HOOKS_FIND_LINKS" in d.reason, not d.steps)),
        Row(f"{p}.cache: a wheel built earlier for this torch/CUDA/Python/ABI/GPU", kernel, INSTALL, f"{p}.cache",
            env={**on, "cached_wheels": (fa["built"],)}, check=lambda d, p: (
                d.steps[-1].url == "file:///cache/wheels/" + fa["built"].replace("+", "%2B"), "local wheel cache" in d.reason)),
        Row(f"{p}.wheelhouse: a built wheel served offline, with builds forbidden", kernel, INSTALL, f"{p}.wheelhouse",
            env={**on, "wheelhouse": (fa["built"],)}, settings={**OFFLINE, "allow_build": "0"},
            dists={"einops": "0.8.1", "packaging": "25.0", "ninja": "1.13.0"},
            check=lambda d, p: [s.kind for s in d.steps] == ["wheel"] and d.steps[0].requirements == (fa["built"],)),
        Row(f"{p}.no-wheel (ALLOW_BUILD=0)", kernel, SKIP, f"{p}.no-wheel", env=old, settings={"allow_build": "0"},
            check=lambda d, p: "ALLOW_BUILD=auto" in d.fix and not d.steps),
        Row(f"{p}.no-nvcc", kernel, SKIP, f"{p}.no-nvcc", env={**old, "nvcc": None, "nvcc_version": None},
            settings=FA_TIME, check=_no_build("needs a CUDA toolkit's nvcc")),
        Row(f"{p}.nvcc-unknown (auto does not guess)", kernel, SKIP, f"{p}.nvcc-unknown",
            env={**old, "nvcc_version": None}, settings=FA_TIME, check=_no_build("cannot be told")),
        Row(f"{p}.nvcc-mismatch: nvcc 12.8 for a CUDA 13.0 torch", kernel, SKIP, f"{p}.nvcc-mismatch",
            env={**old, "torch_cuda": "13.0"}, settings=FA_TIME, check=_no_build("nvcc is CUDA 12.8")),
        Row(f"{p}.build: only {gpu}'s code, with the sdist's switches", kernel, INSTALL, f"{p}.build", env=old,
            settings=FA_TIME, check=_fa_build(kernel)),
        Row(f"{p}.build.no-arch: nothing it compiles runs on sm_75", kernel, SKIP, f"{p}.build.no-arch",
            env={**old, "gpus": ("sm_75",)}, settings=FA_TIME, check=_no_build("sm_75")),
        Row(f"{p}.build.timeout: its build outlasts the default FASTPATH_HOOKS_TIMEOUT", kernel, SKIP, f"{p}.build.timeout",
            env=old, check=lambda d, p: "FASTPATH_HOOKS_TIMEOUT=900" in d.reason and "raise FASTPATH_HOOKS_TIMEOUT" in d.fix),
        Row(f"{p}.build.all-archs: `fastpath-hooks build --arch all`", kernel, INSTALL, f"{p}.build.all-archs",
            env={**old, "gpus": ()}, settings={"allow_build": "1", "timeout": 1e7},
            via=lambda env, settings, pins: decide_build(env, settings, pins, kernel), check=_fa_build(kernel, ("all",))),
        Row(f"{p}.build.unrestricted: no GPU listed, auto", kernel, SKIP, f"{p}.build.unrestricted",
            env={**old, "gpus": ()}, settings=FA_TIME,
            via=lambda env, settings, pins: decide_build(env, settings, pins, kernel), check=_no_build("cannot be restricted")),
        Row(f"{p}.build.no-pip: a source build needs pip", kernel, SKIP, f"{p}.build.no-pip", env={**old, "pip": False},
            settings=FA_TIME, check=lambda d, p: "ensurepip" in d.fix),
        Row(f"{p}.ok", kernel, OK, f"{p}.ok", env=on, dists={dist: mine}, check=_checked_once({dist: mine})),
        Row(f"{p}.block.arch: a build of ours for another GPU only", kernel, BLOCK, f"{p}.block.arch",
            env={"gpus": ("sm_90" if gpu == "sm_80" else "sm_100",)}, dists={dist: mine},
            check=lambda d, p: (gpu in d.reason, d.on_failure == "block")),
        Row(f"{p}.block.numeric: its numbers were measured wrong on this GPU under this torch", kernel, BLOCK,
            f"{p}.block.numeric", env={**on, "numeric_failures": (NUMERIC_FAILURE(kernel, mine, arch=gpu, torch="2.10.0"),)},
            dists={dist: mine}, check=lambda d, p: (d.reason.startswith(f"on {gpu}, "), not d.steps, d.on_failure == "block")),
        Row(f"{p}.repair.half-installed", kernel, REPAIR, f"{p}.repair.half-installed",
            env={**old, "half_installed": (dist,)}, dists={dist: fa["version"]}, settings=FA_TIME,
            check=lambda d, p: d.steps[-1].kind == "build" and d.steps[-1].force),
        Row(f"{p}.ok.half-installed (no way to reinstall)", kernel, OK, f"{p}.ok.half-installed",
            env={**old, "half_installed": (dist,)}, dists={dist: fa["version"]}, settings={"allow_build": "0"},
            check=lambda d, p: d.verify and d.on_failure == "block"),
    ]


# flash-qla: a backend fla 0.6 dispatches to by itself when `flash_qla` is importable
QLA = {"flash-qla": "0.1.3"}
WHEEL_QLA = ("flash_qla-0.1.3-py3-none-any.whl",)
QWEN35 = (("qwen3_5", 128, 128, 16, 32),)          # Environment.model_shapes: a Qwen3.5 config imported
JIT = {"jit_caches": {"TRITON_CACHE_DIR": "/cache/jit/triton", "TILELANG_CACHE_DIR": "/cache/jit/tilelang"}}
OFF = {"FLA_FLASH_QLA": "0"}


def with_pays(hazard: bool, elsewhere: bool) -> pins_mod.Pins:
    """The one-line data change the benchmark decides (pins `pays`)."""
    from fastpath_hooks.facts.pins import Pays

    return with_kernel(PINS, "flash-qla", pays=Pays(hazard, elsewhere, "measured: test"))


# flash-qla is off by default on Hopper (measured on the H200 not to pay at small sizes: pins pays.hazard);
# its install path as a user turns it on, with a FASTPATH_HOOKS_PINS file
QLA_ON = with_pays(True, False)


def QlaOn(*args, **kw) -> "Row":
    """A row under QLA_ON."""
    return Row(*args, pins=QLA_ON, **kw)


def _qla_installs(fragment, shapes=((16, 32, 128, 128),)):
    """flash-qla 0.1.3 alone (--no-deps: tilelang is the pinned pair, decided first), after tilelang and fla,
    its failure never blocking anything (fla keeps its own path: FLA_FLASH_QLA=0), checked against fla's own
    path at `shapes`, and ensured by fla right after fla (`wants`)."""
    def check(d, plan):
        assert d.target == QLA and d.steps[-1].requirements == ("flash-qla==0.1.3",) and d.steps[-1].no_deps
        assert d.needs == ("tilelang", "fla") and d.on_failure == "proceed" and dict(d.off) == OFF
        assert d.check["compare"] == {"module": "flash_qla", "function": "chunk_gated_delta_rule", "switch": "FLA_FLASH_QLA"}
        assert [tuple(s) for s in d.check["shapes"]] == list(shapes) and d.check["own"] == OFF
        assert plan["fla"].wants == ("flash-qla",) and plan["tilelang"].action in (INSTALL, OK)
        assert fragment in d.reason, d.reason
        return True
    return check


def _qla_skips(fragment, *, off=False, fix=None, fla_wants=None):
    """Not installed; an installed flash-qla that cannot work here is switched off in fla (`off`: FLA_FLASH_QLA=0
    in the decision's env, since blocking `import flash_qla` would make fla dispatch to the blocked module)."""
    def check(d, plan):
        assert not d.steps and not d.target and d.on_failure == "proceed"
        assert dict(d.env) == (OFF if off else {}), d.env
        assert fragment in d.reason, d.reason
        assert fix is None or fix in d.fix, d.fix
        if fla_wants is not None:
            assert plan["fla"].wants == fla_wants
        return True
    return check


ROWS = [
    # shared skip rules
    Row("skip.user", "causal-conv1d", SKIP, "skip.user", settings={"skip": frozenset({"causal-conv1d"})},
        check=_leaves_alone("FASTPATH_HOOKS_SKIP", fix="remove causal-conv1d from FASTPATH_HOOKS_SKIP",
                            also={"fla": "fla.install"})),
    Row("skip.user tilelang under the hazard", "tilelang", SKIP, "skip.user", settings={"skip": frozenset({"tilelang"})},
        check=lambda d, p: ("fla needs it" in d.reason and p["fla"].rule == "fla.hazard.skip")),
    Row("skip.no-torch", "fla", SKIP, "skip.no-torch", env={"torch": None, "torch_cuda": None},
        check=_skips_all("torch is not installed", fix="install torch first")),
    Row("skip.no-accelerator: CPU torch", "fla", SKIP, "skip.no-accelerator", env={"torch_cuda": None, "gpus": ()},
        check=_skips_all("CPU build")),
    Row("skip.no-accelerator: CUDA torch, no device", "tilelang", SKIP, "skip.no-accelerator",
        env={"gpus": (), "gpu_source": "none: torch.cuda.is_available() is False"}, check=_skips_all("sees no device")),
    Row("skip.no-accelerator: posed GPU, CPU torch", "causal-conv1d", SKIP, "skip.no-accelerator",
        env={"torch_cuda": None, "gpus": ("sm_80",)}, check=_skips_all("add its torch build")),
    Row("skip.python", "fla", SKIP, "skip.python", env={"python": "3.9.18"},
        check=lambda d, p: p["tilelang"].rule == "skip.python" and ">=3.10" in d.reason),
    Row("skip.platform", "fla", SKIP, "skip.platform", env={"os": "darwin", "arch": "aarch64", "glibc": None},
        check=lambda d, p: (_leaves_alone("no fla builds for darwin-aarch64 (supported: linux-x86_64, linux-aarch64)")(d, p),
                            all(x.rule == "skip.platform" for x in p.decisions.values()))),
    Row("skip.glibc (tilelang aarch64 wheels)", "tilelang", SKIP, "skip.glibc", env={"arch": "aarch64", "glibc": "2.31"},
        check=_leaves_alone("need glibc >=2.34; this system has 2.31", also={"fla": "fla.hazard.skip"})),
    Row("skip.torch", "causal-conv1d", SKIP, "skip.torch", env={"torch": "2.4.1"},
        check=_leaves_alone("torch 2.4.1 is outside causal-conv1d's support (>=2.6)", fix="use torch >=2.6",
                            also={"fla": "skip.torch", "tilelang": "tilelang.install"})),
    Row("skip.accelerator.xpu (tilelang)", "tilelang", SKIP, "skip.accelerator.xpu", env=XPU,
        check=_leaves_alone("tilelang does not support XPU", also={"fla": "fla.install"})),
    Row("skip.accelerator.xpu (causal-conv1d)", "causal-conv1d", SKIP, "skip.accelerator.xpu", env=XPU,
        check=_leaves_alone("causal-conv1d does not support XPU", also={"fla": "fla.install"})),

    # transformers 5.25+: the hub's kernels (the probe's facts: facts/probe.py; the choice: decide/transformers.py)
    Row("skip.hub: the hub serves every causal-conv1d function here", "causal-conv1d", SKIP, "skip.hub",
        env=HUB_MAMBA_LOCAL, dists={"transformers": "5.25.0"},
        check=_leaves_alone("from the hub here (kernels-community/mamba-ssm@v5)", fix="USE_HUB_KERNELS=0",
                            also={"fla": "fla.install", "mamba-ssm": "skip.hub"})),
    Row("skip.hub: not where the hub serves only some of its functions", "causal-conv1d", INSTALL, "causal.wheel",
        env=dict(HUB_MAMBA_LOCAL, hub_where={**HUB_MAMBA_LOCAL["hub_where"], "kernels-community/conv@v1": ("", "offline")},
                 hub_entries=HUB_MAMBA_LOCAL["hub_entries"][:1] + (("causal_conv1d_update", "kernels-community/conv",
                                                                    "causal_conv1d_update", 1, None, "causal-conv1d", ()),)),
        dists={"transformers": "5.25.0"}, check=lambda d, p: "causal-conv1d" in d.target and bool(d.steps)),
    Row("skip.hub: not offline where the cache lacks the build", "mamba-ssm", INSTALL, "mamba.wheel",
        env=dict(HUB_MAMBA_LOCAL, hub_where={"kernels-community/mamba-ssm@v5": ("", "HF_HUB_OFFLINE is set")}),
        dists={"transformers": "5.25.0"},
        check=lambda d, p: "mamba-ssm" in d.target and bool(d.steps) and p["causal-conv1d"].rule == "causal.wheel"),
    Row("skip.hub: not for fla on Hopper + triton 3.6 (fla#640: the hub's fla has no tilelang backend)", "fla",
        INSTALL, "fla.install", env=HUB_FLA_LOCAL, dists={"transformers": "5.25.0"},
        check=lambda d, p: d.needs == ("tilelang",)),
    Row("skip.hub: fla on Hopper with triton 3.7.1, where fla#640 is fixed", "fla", SKIP, "skip.hub",
        env=dict(HUB_FLA_LOCAL, triton="3.7.1", torch="2.13.0"), dists={"transformers": "5.25.0"},
        check=lambda d, p: "kernels-community/fla@v3" in d.reason),
    Row("skip.hub: never in a plan for another machine (download: offline nodes have no hub)", "causal-conv1d",
        INSTALL, "causal.wheel", env=HUB_MAMBA_LOCAL, dists={"transformers": "5.25.0"},
        via=lambda env, settings, pins: decide(env, settings, pins, fresh=True)["causal-conv1d"],
        check=lambda d, p: "causal-conv1d" in d.target and bool(d.steps)),

    # tilelang
    Row("tilelang.install (acceptance: sm_90 + triton 3.6)", "tilelang", INSTALL, "tilelang.install",
        check=lambda d, p: (assert_known_good_pair(d, ("sm_90",)), d.on_failure == "block")),
    Row("skip.accelerator.rocm (tilelang)", "tilelang", SKIP, "skip.accelerator.rocm", env=ROCM,
        check=lambda d, p: "ROCm" in d.reason),
    Row("tilelang.not-needed: sm_80", "tilelang", SKIP, "tilelang.not-needed", env={"gpus": ("sm_80",)},
        check=lambda d, p: "no sm_90 GPU" in d.reason),
    Row("tilelang.not-needed: sm_90 + triton 3.7.1", "tilelang", SKIP, "tilelang.not-needed", env={"triton": "3.7.1"},
        check=lambda d, p: "triton 3.7.1 is outside fla#640" in d.reason and p["fla"].needs == ()),
    Row("tilelang.ok.not-needed", "tilelang", OK, "tilelang.ok.not-needed", env={"gpus": ("sm_80",)},
        dists={"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"}, check=lambda d, p: not d.verify),
    Row("tilelang.user-disabled", "tilelang", SKIP, "tilelang.user-disabled", env={"switches": {"FLA_TILELANG": "0"}},
        check=_leaves_alone("FLA_TILELANG=0 is set", fix="unset FLA_TILELANG: fla needs tilelang here because of fla#640",
                            also={"fla": "fla.hazard.skip"})),
    Row("tilelang.no-nvcc (CUDA 12: no nvcc wheel)", "tilelang", SKIP, "tilelang.no-nvcc", env={"nvcc": None},
        check=_leaves_alone("no nvcc; tilelang compiles its kernels with it at run time", fix="point CUDA_HOME at one",
                            also={"fla": "fla.hazard.skip"})),
    Row("tilelang.install with the nvcc wheel (CUDA 13)", "tilelang", INSTALL, "tilelang.install",
        env={"nvcc": None, "torch_cuda": "13.0"},
        check=lambda d, p: any(r.startswith("nvidia-cuda-nvcc") for r in reqs(d))),
    Row("tilelang.install.nvcc (pair present, nvcc missing)", "tilelang", REPAIR, "tilelang.install.nvcc",
        env={"nvcc": None, "torch_cuda": "13.0"}, dists={"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"},
        check=lambda d, p: any(r.startswith("nvidia-cuda-nvcc") for r in reqs(d))),
    Row("tilelang.ok (known-good pair, checked once)", "tilelang", OK, "tilelang.ok",
        dists={"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.11"},
        check=lambda d, p: (_checked_once({"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.11"}, "is a known-good pair")(d, p),
                            _repairs_to_pair("0.1.15", "0.1.12")(d, p), p["fla"].rule == "fla.install")),
    Row("tilelang.ok.unverified (pair not in the pins)", "tilelang", OK, "tilelang.ok.unverified",
        dists={"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12.post1"},
        check=lambda d, p: (_checked_once({"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12.post1"},
                                          "is not in the pins; checking it in a child process")(d, p), _repairs_to_pair("0.1.15", "0.1.12")(d, p))),
    Row("tilelang.offline-missing: no pair in the wheelhouse", "tilelang", SKIP, "tilelang.offline-missing",
        settings=OFFLINE, env={"wheelhouse": WHEELS_06},
        check=_leaves_alone("FASTPATH_HOOKS_FIND_LINKS has no known-good tilelang + apache-tvm-ffi pair",
                            fix="fastpath-hooks download --dest DIR", also={"fla": "fla.hazard.skip"})),
    Row("tilelang.offline-missing: pair present, deps absent", "tilelang", SKIP, "tilelang.offline-missing",
        settings=OFFLINE, env={"wheelhouse": WHEELS_PAIR}, check=lambda d, p: "z3-solver" in d.reason),
    Row("tilelang install offline from the wheelhouse", "tilelang", INSTALL, "tilelang.install",
        settings=OFFLINE, env={"wheelhouse": WHEELS_PAIR}, dists=TILELANG_DEPS,
        check=lambda d, p: d.target == {"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"}),
    Row("tilelang.repair.broken-pair", "tilelang", REPAIR, "tilelang.repair.broken-pair",
        dists={"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.15.post2"},
        check=lambda d, p: (assert_replaces_ffi_first(d), assert_known_good_pair(d, ("sm_90",)))),
    Row("tilelang.repair.broken-pair.offline-missing", "tilelang", BLOCK, "tilelang.repair.broken-pair.offline-missing",
        settings=OFFLINE, dists={"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.15.post2"},
        check=lambda d, p: d.on_failure == "block" and p["fla"].rule == "fla.hazard.skip"),
    Row("tilelang.repair.broken-pair.unrepairable", "tilelang", BLOCK, "tilelang.repair.broken-pair.unrepairable",
        dists={"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"},
        pins=with_broken(*[(pair.version, pair.companions, "sm_90") for pair in PINS.kernel("tilelang").pairs]),
        check=lambda d, p: "FASTPATH_HOOKS_PINS" in d.fix),
    Row("tilelang.repair.missing-companion", "tilelang", REPAIR, "tilelang.repair.missing-companion", dists={"tilelang": "0.1.11"},
        check=lambda d, p: (assert_replaces_ffi_first(d), assert_known_good_pair(d, ("sm_90",)),
                            d.target["tilelang"] == "0.1.11")),
    Row("tilelang.repair.missing-companion.offline-missing", "tilelang", BLOCK,
        "tilelang.repair.missing-companion.offline-missing",
        settings=OFFLINE, env={"gpus": ("sm_80",)}, dists={"tilelang": "0.1.15"},
        check=lambda d, p: (d.on_failure == "block", not d.steps, d.installed == {"tilelang": "0.1.15"},
                            "installed without apache-tvm-ffi" in d.reason, "lacks apache-tvm-ffi==0.1.12" in d.reason,
                            "fastpath-hooks download --dest DIR" in d.fix)),
    Row("tilelang.repair.half-installed", "tilelang", REPAIR, "tilelang.repair.half-installed",
        dists={"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"}, env={"half_installed": ("apache-tvm-ffi",)},
        check=lambda d, p: (assert_replaces_ffi_first(d), "interrupted" in d.reason)),
    Row("tilelang.repair.half-installed.offline-missing", "tilelang", BLOCK, "tilelang.repair.half-installed.offline-missing",
        settings=OFFLINE, dists={"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"}, env={"half_installed": ("tilelang",)},
        check=lambda d, p: (d.on_failure == "block", not d.steps, "interrupted" in d.reason,
                            "lacks apache-tvm-ffi==0.1.12" in d.reason, "fastpath-hooks download --dest DIR" in d.fix)),
    Row("tilelang.repair.half-installed.unrepairable", "tilelang", BLOCK, "tilelang.repair.half-installed.unrepairable",
        dists={"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"}, env={"half_installed": ("apache-tvm-ffi",)},
        pins=with_broken(*[(pair.version, pair.companions, "sm_90") for pair in PINS.kernel("tilelang").pairs]),
        check=lambda d, p: ("interrupted" in d.reason, "FASTPATH_HOOKS_PINS" in d.fix, not d.steps)),
    Row("tilelang.repair.missing-companion.unrepairable", "tilelang", BLOCK, "tilelang.repair.missing-companion.unrepairable",
        dists={"tilelang": "0.1.15"},
        pins=with_broken(*[(pair.version, pair.companions, "sm_90") for pair in PINS.kernel("tilelang").pairs]),
        check=lambda d, p: ("installed without apache-tvm-ffi" in d.reason, "known-good tilelang + apache-tvm-ffi pair"
                            in d.fix, d.on_failure == "block")),

    # fla
    Row("fla.install (acceptance: with tilelang on sm_90 + triton 3.6)", "fla", INSTALL, "fla.install",
        check=_fla_installs("0.6.0", needs=("tilelang",))),
    Row("fla.install on sm_80 (no tilelang)", "fla", INSTALL, "fla.install", env={"gpus": ("sm_80",)},
        check=_fla_installs("0.6.0")),
    Row("fla.install on ROCm with FLA_TILELANG=0", "fla", INSTALL, "fla.install", env=ROCM, check=_rocm_fla),
    Row("fla on ROCm keeps the user's FLA_TILELANG", "fla", INSTALL, "fla.install", env={**ROCM, "switches": {"FLA_TILELANG": "1"}},
        check=lambda d, p: d.env == ()),
    Row("fla.no-triton (ROCm torch without its triton)", "fla", SKIP, "fla.no-triton", env={**ROCM, "triton": None},
        check=_rocm_fla),
    Row("fla.no-triton", "fla", SKIP, "fla.no-triton", env={"triton": None},
        check=_leaves_alone("no triton", fix="install the triton your torch build depends on")),
    Row("fla.xpu.old-transformers", "fla", SKIP, "fla.xpu.old-transformers", env=XPU, dists={"transformers": "5.14.2"},
        check=lambda d, p: "5.15" in d.fix),
    Row("fla.install on XPU with transformers >= 5.15", "fla", INSTALL, "fla.install", env=XPU,
        check=_fla_installs("0.6.0")),
    Row("fla.hazard.skip", "fla", SKIP, "fla.hazard.skip", env={"nvcc": None},
        check=lambda d, p: "3.7.1" in d.fix and "crash" in d.reason),
    Row("fla.hazard.block", "fla", BLOCK, "fla.hazard.block", env={"nvcc": None}, dists={"fla-core": "0.6.0"},
        check=_hazard_block),
    # an installed fla outside its Python support still imports: the hazard's block comes before the skip
    Row("fla.hazard.block before skip.python", "fla", BLOCK, "fla.hazard.block",
        env={"python": "3.9.18", "torch": "2.4.0", "triton": "3.4.0"}, dists={"fla-core": "0.4.1"},
        check=lambda d, p: p["tilelang"].rule == "skip.python" and "Python 3.9.18" in d.reason),
    Row("skip.python with an installed fla and no hazard", "fla", SKIP, "skip.python",
        env={"python": "3.9.18", "gpus": ("sm_80",)}, dists={"fla-core": "0.6.0"},
        check=lambda d, p: (_leaves_alone("Python 3.9.18 is outside fla's support (>=3.10)", fix="use Python >=3.10")(d, p),
                            d.installed == {"fla-core": "0.6.0"})),
    Row("fla.ok (no hazard)", "fla", OK, "fla.ok", env={"gpus": ("sm_80",)},
        dists={"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"},
        check=lambda d, p: d.on_failure == "proceed" and d.needs == () and not d.steps),
    Row("fla.ok under the hazard needs tilelang", "fla", OK, "fla.ok",
        dists={"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"},
        check=lambda d, p: d.needs == ("tilelang",) and d.on_failure == "block" and p["tilelang"].action == INSTALL),
    Row("fla.repair: triton 3.9 breaks 0.5.2", "fla", REPAIR, "fla.repair", env={"gpus": ("sm_80",), "triton": "3.9.0"},
        dists={"fla-core": "0.5.2", "flash-linear-attention": "0.5.2"},
        check=lambda d, p: (_fla_installs("0.6.0")(d, p), d.steps[-1].force, d.on_failure == "block")),
    Row("fla.repair: versions differ", "fla", REPAIR, "fla.repair", env={"gpus": ("sm_80",)},
        dists={"fla-core": "0.6.0", "flash-linear-attention": "0.5.2"},
        check=lambda d, p: d.on_failure == "proceed" and "differ" in d.reason),
    Row("fla.repair: no tilelang backend under the hazard", "fla", REPAIR, "fla.repair",
        dists={"fla-core": "0.4.1", "flash-linear-attention": "0.4.1"},
        check=lambda d, p: (_fla_installs("0.6.0", needs=("tilelang",))(d, p), d.on_failure == "block")),
    Row("fla.repair: half-installed", "fla", REPAIR, "fla.repair", env={"half_installed": ("fla-core",), "gpus": ("sm_80",)},
        dists={"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"},
        check=lambda d, p: "interrupted" in d.reason and d.steps[-1].force),
    Row("fla.unsafe.block", "fla", BLOCK, "fla.unsafe.block", settings=OFFLINE,
        dists={"fla-core": "0.4.1", "tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"},
        check=lambda d, p: d.on_failure == "block" and p["tilelang"].rule == "tilelang.ok"),
    Row("fla.incompatible.block", "fla", BLOCK, "fla.incompatible.block", settings=OFFLINE,
        env={"gpus": ("sm_80",), "triton": "3.9.0"}, dists={"fla-core": "0.5.2"},
        check=lambda d, p: "triton 3.9.0" in d.reason and d.on_failure == "block"),
    Row("fla.ok.with-problems", "fla", OK, "fla.ok.with-problems", settings=OFFLINE, env={"gpus": ("sm_80",)},
        dists={"fla-core": "0.6.0", "flash-linear-attention": "0.5.2"}, check=lambda d, p: "differ" in d.reason),
    Row("fla.install on Hopper: 0.6.0 where transformers fits it", "fla", INSTALL, "fla.install", env={"triton": "3.7.1"},
        check=lambda d, p: (_fla_installs("0.6.0")(d, p), "PR #1262" not in d.reason)),
    Row("fla.install on Hopper with transformers < 5.6.2: 0.5.2, its Hopper state-backward bug said, numbers checked",
        "fla", INSTALL, "fla.install", env={"triton": "3.7.1"}, dists={"transformers": "5.5.0"},
        check=lambda d, p: (_fla_installs("0.5.2")(d, p), "on sm_90 it can compute the state backward wrongly" in d.reason,
                            "fixed in 0.6.0, which needs transformers" in d.reason,
                            "its numbers are checked on this GPU first" in d.reason)),
    Row("fla.block.numeric: fla on Hopper measured wrong (fla#640-like miscompiles)", "fla", BLOCK, "fla.block.numeric",
        env={"triton": "3.7.1", "numeric_failures": (NUMERIC_FAILURE("fla", "0.6.0", torch="2.10.0", cuda="12.8"),)},
        check=lambda d, p: (d.reason.startswith("on sm_90,"), d.on_failure == "block", not d.steps)),
    Row("fla.no-release", "fla", SKIP, "fla.no-release", env={"gpus": ("sm_80",)}, dists={"transformers": "4.40.0"},
        check=lambda d, p: "FASTPATH_HOOKS_PINS" in d.fix),
    Row("fla.offline-missing", "fla", SKIP, "fla.offline-missing", settings=OFFLINE, env={"gpus": ("sm_80",)},
        check=lambda d, p: "fla-core==0.6.0" in d.reason),
    Row("fla offline takes the release the wheelhouse has", "fla", INSTALL, "fla.install", settings=OFFLINE,
        env={"gpus": ("sm_80",), "wheelhouse": WHEELS_052}, dists={"transformers": "4.57.1"},
        check=_fla_installs("0.5.2")),

    # flash-qla (a backend of fla)
    QlaOn("qla.install (acceptance: sm_90 + nvcc + tilelang; the model's head dims not known)", "flash-qla", INSTALL,
        "qla.install", check=_qla_installs("head dims are not known here: fla uses it for K = V = 128")),
    QlaOn("qla.install: a Qwen3.5 config imported (K = V = 128, 16 / 32 heads): its shapes are checked and warmed",
        "flash-qla", INSTALL, "qla.install", env={"model_shapes": QWEN35},
        check=_qla_installs("the qwen3_5 config: K x V = 128 x 128")),
    QlaOn("qla.install under transformers 5.17 (it repeats q and k to the 32 value heads before calling fla)", "flash-qla",
        INSTALL, "qla.install", dists={"transformers": "5.17.0"},
        check=_qla_installs("flash-qla 0.1.3", shapes=((32, 32, 128, 128),))),
    QlaOn("qla.install with the nvcc wheel tilelang installs (CUDA 13 torch, no toolkit)", "flash-qla", INSTALL,
        "qla.install", env={"nvcc": None, "torch_cuda": "13.0"}, check=_qla_installs("where fla runs tilelang anyway")),
    QlaOn("qla.install offline from the wheelhouse", "flash-qla", INSTALL, "qla.install", settings=OFFLINE,
        env={"wheelhouse": WHEELS_06 + WHEELS_PAIR + WHEEL_QLA}, dists=TILELANG_DEPS,
        check=_qla_installs("flash-qla 0.1.3 for fla's gated delta rule on sm_90")),
    Row("qla.install where fla needs no tilelang (triton 3.7.1), once the benchmark flips pays.elsewhere", "flash-qla",
        INSTALL, "qla.install", env={"triton": "3.7.1"}, pins=with_pays(True, True),
        check=lambda d, p: (_qla_installs("on by default where fla needs no tilelang")(d, p),
                            p["tilelang"].rule == "tilelang.install.for-backend")),
    Row("tilelang.install.for-backend: flash-qla runs on it where fla alone does not need it", "tilelang", INSTALL,
        "tilelang.install.for-backend", env={"triton": "3.7.1"}, pins=with_pays(True, True),
        check=lambda d, p: (assert_known_good_pair(d, ("sm_90",)), "flash-qla runs on tilelang" in d.reason,
                            p["fla"].needs == ())),
    Row("qla.ok: installed; checked once against fla's own path (its failure switches it off)", "flash-qla", OK,
        "qla.ok", dists=QLA,
        check=lambda d, p: (d.verify, not d.steps, d.on_failure == "proceed", dict(d.off) == OFF, d.env == (),
                            d.check["compare"]["switch"] == "FLA_FLASH_QLA", d.needs == ("tilelang", "fla"),
                            "checked once against fla's own path" in d.reason, p["fla"].wants == ("flash-qla",))),
    Row("skip.user: FASTPATH_HOOKS_SKIP=flash-qla", "flash-qla", SKIP, "skip.user",
        settings={"skip": frozenset({"flash-qla"})},
        check=lambda d, p: (_leaves_alone("FASTPATH_HOOKS_SKIP", fix="remove flash-qla")(d, p),
                            p["fla"].wants == (), p["fla"].rule == "fla.install")),
    Row("qla.user-disabled: FLA_FLASH_QLA=0 (fla's own switch)", "flash-qla", SKIP, "qla.user-disabled",
        env={"switches": OFF}, check=_qla_skips("FLA_FLASH_QLA=0 is set", fix="unset FLA_FLASH_QLA", fla_wants=())),
    Row("qla.not-used: no nvcc, so no tilelang and no fla (fla#640)", "flash-qla", SKIP, "qla.not-used",
        env={"nvcc": None}, check=_qla_skips("fla is not used here: sm_90 + triton 3.6.0 computes fla's backward wrongly")),
    Row("qla.arch: not on sm_80", "flash-qla", SKIP, "qla.arch", env={"gpus": ("sm_80",)},
        check=_qla_skips("sm_80: flash-qla trains (forward + backward) on sm_90, sm_100, sm_103 only", fla_wants=())),
    Row("qla.arch: not on sm_120 for training (a bf16 forward only)", "flash-qla", SKIP, "qla.arch",
        env={"gpus": ("sm_120",), "triton": "3.7.1"}, pins=with_pays(True, True),
        check=_qla_skips("on sm_120 it has a forward only, and training needs the backward")),
    Row("qla.arch: an sm_80 beside the sm_90 (fla picks its backend by device 0)", "flash-qla", SKIP, "qla.arch",
        env={"gpus": ("sm_90", "sm_80")}, check=_qla_skips("sm_80: flash-qla trains")),
    Row("qla.arch with flash-qla installed by hand: switched off in fla, never blocked", "flash-qla", SKIP, "qla.arch",
        env={"gpus": ("sm_80",)}, dists=QLA, check=_qla_skips("sm_80", off=True, fla_wants=("flash-qla",))),
    Row("qla.no-nvcc: flash-qla and tilelang installed, no nvcc (triton 3.7.1): switched off", "flash-qla", SKIP,
        "qla.no-nvcc", env={"triton": "3.7.1", "nvcc": None}, dists={**QLA, **PAIR_015},
        check=_qla_skips("no nvcc; tilelang compiles flash-qla's kernels with it at first use", off=True,
                         fix="point CUDA_HOME at one")),
    Row("qla.without.tilelang: flash-qla installed by hand where tilelang is not used (triton 3.7.1)", "flash-qla", SKIP,
        "qla.without.tilelang", env={"triton": "3.7.1"}, dists=QLA,
        check=_qla_skips("flash-qla runs on tilelang, which is not used here", off=True)),
    QlaOn("qla.old.tilelang: tilelang 0.1.11 installed (flash-qla 0.1.3 needs >= 0.1.12)", "flash-qla", SKIP,
        "qla.old.tilelang", dists={"tilelang": "0.1.11", "apache-tvm-ffi": "0.1.11"},
        check=_qla_skips("tilelang 0.1.11 is used here; flash-qla 0.1.3 needs tilelang >=0.1.12", fix="tilelang 0.1.15")),
    Row("qla.no-backend: fla 0.5.2 does not dispatch to flash-qla", "flash-qla", SKIP, "qla.no-backend",
        dists={"fla-core": "0.5.2", "flash-linear-attention": "0.5.2"},
        check=_qla_skips("fla 0.5.2 does not dispatch to flash-qla (fla does from 0.6.0)", fix="upgrade fla")),
    # a pins file whose fla releases name no flash-qla backend (issue 40: it said "fla does from ?")
    Row("qla.no-backend.pinned: no pinned fla release dispatches to flash-qla", "flash-qla", SKIP,
        "qla.no-backend.pinned", dists={"fla-core": "0.5.2", "flash-linear-attention": "0.5.2"},
        pins=with_kernel(PINS, "fla", releases=tuple(dataclasses.replace(r, backends=tuple(
            b for b in r.backends if b != "flash-qla")) for r in PINS.kernel("fla").releases)),
        check=_qla_skips("nor does any pinned fla release", fix="whose `backends` name flash-qla")),
    Row("qla.off: where fla needs no tilelang (triton 3.7.1), off until a benchmark shows it pays", "flash-qla", SKIP,
        "qla.off", env={"triton": "3.7.1"},
        check=lambda d, p: (_qla_skips("off by default where fla needs no tilelang (triton 3.7.1)",
                                       fix="pays.elsewhere to true")(d, p), p["tilelang"].rule == "tilelang.not-needed")),
    Row("qla.off on Hopper with the shipped pins (the H200 benchmark: 1.02-1.08x over fla + tilelang)", "flash-qla",
        SKIP, "qla.off",
        check=lambda d, p: (_qla_skips("where fla runs tilelang anyway (fla#640)", fix="pays.hazard")(d, p),
                            p["tilelang"].action == INSTALL, p["fla"].wants == ())),
    QlaOn("qla.head-dims: the imported model's K x V = 64 x 64", "flash-qla", SKIP, "qla.head-dims",
        env={"model_shapes": (("qwen3_5", 64, 64, 16, 32),)},
        check=_qla_skips("qwen3_5: K x V = 64 x 64; flash-qla computes K = 128, V = 128 only", fla_wants=())),
    Row("qla.no-release: no pinned flash-qla for this torch", "flash-qla", SKIP, "qla.no-release",
        pins=with_kernel(QLA_ON, "flash-qla", releases=tuple(dataclasses.replace(r, torch=SpecifierSet(">=2.12"))
                                                          for r in PINS.kernel("flash-qla").releases)),
        check=_qla_skips("no known-good flash-qla release for torch 2.10.0", fix="FASTPATH_HOOKS_PINS")),
    QlaOn("qla.offline-missing: the wheelhouse has fla and tilelang, not flash-qla", "flash-qla", SKIP,
        "qla.offline-missing", settings=OFFLINE, env={"wheelhouse": WHEELS_06 + WHEELS_PAIR}, dists=TILELANG_DEPS,
        check=lambda d, p: (_qla_skips("lacks flash-qla==0.1.3", fix="fastpath-hooks download")(d, p),
                            p["fla"].rule == "fla.install", p["fla"].wants == ())),
    QlaOn("fla.install on Hopper checks and warms its own path (FLA_FLASH_QLA=0) in its verification child", "fla",
        INSTALL, "fla.install", env={"model_shapes": QWEN35},
        check=lambda d, p: (_fla_installs("0.6.0", needs=("tilelang",))(d, p), d.check["own"] == OFF,
                            "compare" not in d.check, d.check["shapes"] == ((16, 32, 128, 128),), d.wants == ("flash-qla",))),
    QlaOn("the JIT caches under fastpath-hooks' cache for the training process, where a verification warms them",
        "flash-qla", INSTALL, "qla.install", env=JIT,
        check=lambda d, p: (_qla_installs("flash-qla 0.1.3")(d, p), dict(d.env) == dict(JIT["jit_caches"]),
                            dict(p["fla"].env) == {"TRITON_CACHE_DIR": "/cache/jit/triton"},
                            dict(p["tilelang"].env) == {"TILELANG_CACHE_DIR": "/cache/jit/tilelang"})),
    QlaOn("a TRITON_CACHE_DIR the user set is theirs: only TILELANG_CACHE_DIR is set", "flash-qla", INSTALL, "qla.install",
        env={**JIT, "jit_caches_given": ("TRITON_CACHE_DIR",)},
        check=lambda d, p: (_qla_installs("flash-qla 0.1.3")(d, p), dict(d.env) == {"TILELANG_CACHE_DIR": "/cache/jit/tilelang"},
                            p["fla"].env == ())),
    Row("no JIT warmed here (sm_80): the caches stay where triton puts them", "fla", INSTALL, "fla.install",
        env={**JIT, "gpus": ("sm_80",)},
        check=lambda d, p: (_fla_installs("0.6.0")(d, p), d.env == (), not d.check, p["flash-qla"].rule == "qla.arch")),
    # the H200 run of issue 21: before this, a training process after the install set no cache dirs and
    # compiled everything again (first step 144.0 s; 5.0 s once it found the warm-up's caches)
    Row("a later process, fla and the pair installed on Hopper: it finds the caches the install warmed", "fla", OK,
        "fla.ok", env=JIT, dists={"fla-core": "0.6.0", "flash-linear-attention": "0.6.0", "tilelang": "0.1.15",
                                  "apache-tvm-ffi": "0.1.12"},
        check=lambda d, p: (not d.verify, p["tilelang"].rule == "tilelang.ok",
                            dict(d.env) == {"TRITON_CACHE_DIR": "/cache/jit/triton"},
                            dict(p["tilelang"].env) == {"TILELANG_CACHE_DIR": "/cache/jit/tilelang"})),
    Row("a later process on sm_80 (no JIT warmed there): the caches stay where triton puts them", "fla", OK, "fla.ok",
        env={**JIT, "gpus": ("sm_80",)}, dists={"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"},
        check=lambda d, p: (d.env == (), not d.check)),

    # flash-attn (FA2) and flash-attn-3 (FA3)
    *_fa_rows("flash-attn"), *_fa_rows("flash-attn-3"),
    Row("fa2.wheel: torch 2.8 has a release wheel (2.8.3, CUDA 12): no build", "flash-attn", INSTALL, "fa2.wheel",
        env={"gpus": ("sm_89",), "torch": "2.8.0"},
        check=lambda d, p: (d.steps[-1].kind == "wheel" and d.steps[-1].requirements == (FA2_WHEEL,),
                            d.target == {"flash-attn": "2.8.3"})),

    # FA3 trimmed to the imported models' attention (Environment.attention_shapes; tests/test_attention.py: per config)
    Row("fa3.build for Qwen3.5: head dim 256 only, no sliding window", "flash-attn-3", INSTALL, "fa3.build",
        env={"gpus": ("sm_90",), "torch": "2.13.0", "attention_shapes": QWEN35_ATTENTION}, settings=FA_TIME,
        check=lambda d, p: (d.steps[-1].variant == ("hd256",), "trimmed to head dim 256 (qwen3_5), no sliding window"
                            in d.steps[-1].note, {k for k, v in d.steps[-1].env if "_DISABLE_" in k} - set(FA3_ALWAYS_OFF) ==
                            {f"FLASH_ATTENTION_DISABLE_{n}" for n in ("HDIM64", "HDIM96", "HDIM128", "HDIM192", "LOCAL")})),
    Row("fa3.cache: a cached build keeping more than Qwen3.5 needs", "flash-attn-3", INSTALL, "fa3.cache",
        env={"gpus": ("sm_90",), "attention_shapes": QWEN35_ATTENTION, "cached_wheels": (FA3_BUILT("hd128x256.swa"),)},
        check=lambda d, p: d.steps[-1].requirements == (FA3_BUILT("hd128x256.swa"),)),
    Row("fa3.build: a cached build without Qwen3.5's head dim is not taken", "flash-attn-3", INSTALL, "fa3.build",
        env={"gpus": ("sm_90",), "torch": "2.10.0", "attention_shapes": QWEN35_ATTENTION,
             "cached_wheels": (FA3_BUILT("hd128"),)}, settings=FA_TIME,
        check=lambda d, p: d.steps[-1].kind == "build" and d.steps[-1].variant == ("hd256",)),
    Row("fa3.ok: a build for head dim 256, Qwen3.5 imported", "flash-attn-3", OK, "fa3.ok",
        env={"gpus": ("sm_90",), "attention_shapes": QWEN35_ATTENTION}, dists={"flash-attn-3": FA3_MINE("hd256")},
        check=_checked_once({"flash-attn-3": FA3_MINE("hd256")})),
    Row("fa3.repair.trim: a build for Qwen3's head dim 128 while Qwen3.5 (256) is imported", "flash-attn-3", REPAIR,
        "fa3.repair.trim", env={"gpus": ("sm_90",), "attention_shapes": QWEN35_ATTENTION},
        dists={"flash-attn-3": FA3_MINE("hd128.swa")}, settings=FA_TIME,
        check=lambda d, p: (d.steps[-1].kind == "build", d.steps[-1].force, d.steps[-1].variant == ("hd256",),
                            "built without head dim 256, which a model here needs: rebuilding" in d.reason)),
    Row("fa3.block.trim: no sliding window in the build, a Mistral imported, no build allowed", "flash-attn-3", BLOCK,
        "fa3.block.trim", env={"gpus": ("sm_90",), "attention_shapes": (("mistral", None, 8, 32, True),)},
        dists={"flash-attn-3": FA3_MINE("")}, settings={"allow_build": "0"},
        check=lambda d, p: ("without sliding window" in d.reason, d.on_failure == "block", not d.steps)),

    # causal-conv1d
    Row("causal.wheel", "causal-conv1d", INSTALL, "causal.wheel", check=_causal_wheel(CC_WHEEL, sha256=CC_SHA256)),
    Row("causal.no-release: no pinned causal-conv1d release fits this torch", "causal-conv1d", SKIP, "causal.no-release",
        pins=with_kernel(PINS, "causal-conv1d", releases=tuple(
            dataclasses.replace(r, torch=SpecifierSet(">=2.14")) for r in PINS.kernel("causal-conv1d").releases)),
        check=lambda d, p: ("no pinned causal-conv1d release fits torch 2.10.0" in d.reason, not d.steps)),
    Row("causal.wheel from the wheelhouse, offline", "causal-conv1d", INSTALL, "causal.wheel", settings=OFFLINE,
        env={"wheelhouse": (CC_WHEEL,)}, dists={"ninja": "1.13.0"},
        check=_causal_wheel(CC_WHEEL, sha256=CC_SHA256, url=False)),
    Row("causal.wheel: the 1.7.0 release wheel in the wheelhouse, offline, no ninja, nvcc of another CUDA major "
        "(ninja is a build's need, issue 40)", "causal-conv1d", INSTALL, "causal.wheel", settings=OFFLINE,
        env={"wheelhouse": (CC_WHEEL_170,), "nvcc_version": "13.0", "triton": "3.7.1"},
        check=lambda d, p: ([s.kind for s in d.steps] == ["wheel"], d.steps[0].requirements == (CC_WHEEL_170,),
                            d.steps[0].url is None, d.target == {"causal-conv1d": "1.7.0"})),
    Row("causal.offline-missing (no wheel, no sdist to build)", "causal-conv1d", SKIP, "causal.offline-missing",
        settings=OFFLINE, check=lambda d, p: "cu12torch2.10" in d.reason and "causal_conv1d==1.6.2.post1" not in d.reason),
    Row("causal.offline-missing, builds off: the wheel is what is missing", "causal-conv1d", SKIP,
        "causal.offline-missing", settings={**OFFLINE, "allow_build": "0"},
        check=lambda d, p: "download" in d.fix and "cu12torch2.10" in d.reason),
    Row("causal.cache: a wheel built earlier for this torch/CUDA/Python/ABI/GPU, before any build",
        "causal-conv1d", INSTALL, "causal.cache", env={**NO_RELEASE, "cached_wheels": (BUILT_213,)},
        check=_from_cache(BUILT_213)),
    Row("causal.cache: a cached release wheel is preferred to downloading it", "causal-conv1d", INSTALL, "causal.cache",
        env={"cached_wheels": (CC_WHEEL,)}, check=_from_cache(CC_WHEEL)),
    Row("causal.cache: an sm_80 build runs on sm_86", "causal-conv1d", INSTALL, "causal.cache",
        env={**NO_RELEASE, "gpus": ("sm_86",),
             "cached_wheels": (BUILT_213.replace("sm90", "sm80"),)}, check=_from_cache(BUILT_213.replace("sm90", "sm80"))),
    Row("causal.wheelhouse: a built wheel served offline, with builds forbidden", "causal-conv1d", INSTALL,
        "causal.wheelhouse", env={**NO_RELEASE, "wheelhouse": (BUILT_213,)}, settings={**OFFLINE, "allow_build": "0"},
        dists={"ninja": "1.13.0"},
        check=lambda d, p: [s.kind for s in d.steps] == ["wheel"] and d.steps[0].requirements == (BUILT_213,)
        and d.steps[0].url is None),
    Row("causal.no-wheel (ALLOW_BUILD=0)", "causal-conv1d", SKIP, "causal.no-wheel", env=NO_RELEASE,
        settings={"allow_build": "0"}, check=lambda d, p: "torch 2.13" in d.reason and "ALLOW_BUILD=auto" in d.fix),
    Row("causal.no-nvcc", "causal-conv1d", SKIP, "causal.no-nvcc", env={**NO_RELEASE, "nvcc": None, "nvcc_version": None},
        check=_no_build("needs a CUDA toolkit's nvcc")),
    Row("causal.no-nvcc: the nvcc wheel is no toolkit to build with", "causal-conv1d", SKIP, "causal.no-nvcc",
        env={**NO_RELEASE, "nvcc": "nvidia-cuda-nvcc 13.0.48", "nvcc_version": None},
        check=_no_build("a source build needs a CUDA toolkit's nvcc", fix="install a CUDA 12.8 toolkit (torch's)")),
    Row("causal.nvcc-unknown (auto does not guess)", "causal-conv1d", SKIP, "causal.nvcc-unknown",
        env={**NO_RELEASE, "nvcc_version": None}, check=_no_build("cannot be told")),
    Row("causal.nvcc-mismatch: nvcc 12.8 for a CUDA 13.0 torch", "causal-conv1d", SKIP, "causal.nvcc-mismatch",
        env={**NO_RELEASE, "torch_cuda": "13.0"}, check=_no_build("nvcc is CUDA 12.8 while torch is built for CUDA 13.0")),
    Row("causal.nvcc-mismatch also with ALLOW_BUILD=1 (the build would fail)", "causal-conv1d", SKIP,
        "causal.nvcc-mismatch", env={**NO_RELEASE, "torch_cuda": "13.0"}, settings={"allow_build": "1"},
        check=_no_build("nvcc is CUDA 12.8 while torch is built for CUDA 13.0", fix="CUDA 13.x toolkit")),
    Row("causal.build: torch 2.13 has no release wheel; only sm_90 is compiled", "causal-conv1d", INSTALL,
        "causal.build", env=NO_RELEASE, check=_causal_build(("sm_90",))),
    Row("causal.build: sm_86 + sm_90 compile sm_80 (runs on sm_86) and sm_90", "causal-conv1d", INSTALL, "causal.build",
        env={**NO_RELEASE, "gpus": ("sm_86", "sm_90", "sm_90")}, check=_causal_build(("sm_80", "sm_90"))),
    Row("causal.build with ALLOW_BUILD=1 and an nvcc of unknown release", "causal-conv1d", INSTALL, "causal.build",
        env={**NO_RELEASE, "nvcc_version": None}, settings={"allow_build": "1"}, check=_causal_build(("sm_90",))),
    Row("causal.build offline from an sdist when the wheel is missing", "causal-conv1d", INSTALL, "causal.build",
        settings=OFFLINE, env={"wheelhouse": ("causal_conv1d-1.6.2.post1.tar.gz", "wheel-0.45.1-py3-none-any.whl")},
        dists={"ninja": "1.13.0"}, check=_causal_build(("sm_90",), "1.6.2.post1")),
    Row("causal.offline-missing: what setup.py imports (wheel) is missing offline", "causal-conv1d", SKIP,
        "causal.offline-missing", settings=OFFLINE, env={"wheelhouse": ("causal_conv1d-1.6.2.post1.tar.gz",)},
        dists={"ninja": "1.13.0"}, check=lambda d, p: "a source build needs wheel too" in d.reason),
    Row("causal.build: a cached build for other GPUs does not fit", "causal-conv1d", INSTALL, "causal.build",
        env={**NO_RELEASE, "cached_wheels": (BUILT_213.replace("sm90", "sm80"),)}, check=_causal_build(("sm_90",))),
    Row("causal.build.no-arch: the sdist compiles nothing that runs on sm_70", "causal-conv1d", SKIP,
        "causal.build.no-arch", env={**NO_RELEASE, "gpus": ("sm_70",)}, check=_no_build("sm_70")),
    Row("causal.build.timeout: the estimate on 1 core outlasts FASTPATH_HOOKS_TIMEOUT", "causal-conv1d", SKIP,
        "causal.build.timeout", env={**NO_RELEASE, "cpus": 1},
        check=lambda d, p: "FASTPATH_HOOKS_TIMEOUT=900" in d.reason and "raise FASTPATH_HOOKS_TIMEOUT" in d.fix),
    Row("causal.build.all-archs: `fastpath-hooks build --arch all`", "causal-conv1d", INSTALL, "causal.build.all-archs",
        env={**NO_RELEASE, "gpus": ()}, settings={"allow_build": "1", "timeout": 1e6},
        via=lambda env, settings, pins: decide_build(env, settings, pins, "causal-conv1d"), check=_causal_build(("all",))),
    Row("causal.build.unrestricted: a GPU of unknown arch, auto", "causal-conv1d", SKIP, "causal.build.unrestricted",
        env={**ROCM, "gpus": ("gfx",)}, check=_no_build("cannot be restricted")),
    Row("causal.rocm.no-build", "causal-conv1d", SKIP, "causal.rocm.no-build", env=ROCM, settings={"allow_build": "0"},
        check=lambda d, p: "ALLOW_BUILD=auto" in d.fix),
    Row("causal.rocm.no-hipcc", "causal-conv1d", SKIP, "causal.rocm.no-hipcc", env={**ROCM, "hipcc": None},
        check=_no_build("a source build needs hipcc, which is not found", fix="install ROCm's hipcc")),
    Row("causal.rocm.build: HIP_ARCHITECTURES is the visible gfx arch", "causal-conv1d", INSTALL, "causal.rocm.build",
        env=ROCM, check=_causal_build(("gfx942",), HIP_ARCHITECTURES="gfx942")),
    Row("causal.ok", "causal-conv1d", OK, "causal.ok", dists={"causal-conv1d": "1.6.2.post1"},
        check=lambda d, p: d.verify and d.on_failure == "block"),
    Row("causal.block.arch: a build of ours for sm_90 only, on an sm_80 GPU (imports, then fails at the first forward)",
        "causal-conv1d", BLOCK, "causal.block.arch", env={"gpus": ("sm_80",)},
        dists={"causal-conv1d": "1.6.2.post1+fph.torch2.11.0.cu130.abi1.sm90"},
        check=lambda d, p: ("sm_80" in d.reason, "--arch sm_80,sm_90" in d.fix, d.on_failure == "block")),
    Row("causal.block.arch: a build of ours with sm_103 code from nvcc 13, on sm_103 (causal-conv1d#105)",
        "causal-conv1d", BLOCK, "causal.block.arch", env=B300,
        dists={"causal-conv1d": "1.6.2.post1+fph.torch2.13.0.cu130.abi1.sm103"},
        check=lambda d, p: ("causal-conv1d#105" in d.reason, "builds sm_100 code for sm_103" in d.fix,
                            d.on_failure == "block")),
    Row("causal.block.arch: a cu13 release wheel on sm_103 (carries sm_103 code from nvcc 13)", "causal-conv1d", BLOCK,
        "causal.block.arch", env={**B300, "torch": "2.10.0"},
        dists={"causal-conv1d": "1.6.2.post1+cu13torch2.10cxx11abiTRUE"},
        check=lambda d, p: ("runs sm_103 code from nvcc 13.0" in d.reason, "pip uninstall causal-conv1d" in d.fix)),
    Row("causal.ok: a build of ours with sm_100 code runs on sm_103", "causal-conv1d", OK, "causal.ok", env=B300,
        dists={"causal-conv1d": "1.6.2.post1+fph.torch2.13.0.cu130.abi1.sm100"},
        check=_checked_once({"causal-conv1d": "1.6.2.post1+fph.torch2.13.0.cu130.abi1.sm100"})),
    Row("causal.build: sm_103 with nvcc 13 gets sm_100 code, the release wheel of CUDA 13 is not taken", "causal-conv1d",
        INSTALL, "causal.build", env={**B300, "torch": "2.10.0"},
        check=lambda d, p: (_causal_build(("sm_100",))(d, p), "cu13 release wheels carry sm_103 code" in d.reason,
                            "sm_103 gets sm_100 code: causal-conv1d#105" in d.reason,
                            "computes wrong forward/update results" in d.steps[-1].note)),
    Row("causal.build: a cached sm_103 build from nvcc 13 does not fit sm_103", "causal-conv1d", INSTALL, "causal.build",
        env={**B300, "cached_wheels": ("causal_conv1d-1.6.2.post1+fph.torch2.13.0.cu130.abi1.sm103-cp312-cp312-"
                                       "linux_x86_64.whl",)},
        check=_causal_build(("sm_100",))),
    Row("causal.build: torch 2.14 needs C++20: both compilers get -std=c++20", "causal-conv1d", INSTALL, "causal.build",
        env={"torch": "2.14.1", "torch_cuda": "13.0", "nvcc_version": "13.0"},
        check=lambda d, p: (d.steps[-1].cxx_std == "c++20", "with nvcc 13.0 and -std=c++20" in d.reason,
                            "-std=c++20 handed last to the host compiler and nvcc" in d.steps[-1].note)),
    Row("causal.block.numeric: its numbers were measured wrong on this GPU under this torch", "causal-conv1d", BLOCK,
        "causal.block.numeric", env={**NO_RELEASE, "numeric_failures": (NUMERIC_FAILURE("causal-conv1d", "1.7.0+fph.torch2.13.0.cu128.abi1.sm90"),)},
        check=lambda d, p: (d.reason.startswith("on sm_90, causal_conv1d_fn forward differs from torch by 0.43"),
                            "/c/numeric/causal-conv1d.json" in d.fix, not d.steps, d.on_failure == "block")),
    Row("causal.build.no-pip: a source build needs pip (a `uv venv` has none)", "causal-conv1d", SKIP,
        "causal.build.no-pip", env={**NO_RELEASE, "pip": False}, check=lambda d, p: "ensurepip" in d.fix),
    Row("causal.ok: a build of ours for sm_80 runs on sm_86", "causal-conv1d", OK, "causal.ok", env={"gpus": ("sm_86",)},
        dists={"causal-conv1d": "1.6.2.post1+fph.torch2.11.0.cu130.abi1.sm80"},
        check=_checked_once({"causal-conv1d": "1.6.2.post1+fph.torch2.11.0.cu130.abi1.sm80"})),
    Row("causal.repair.half-installed", "causal-conv1d", REPAIR, "causal.repair.half-installed",
        env={"half_installed": ("causal-conv1d",)}, dists={"causal-conv1d": "1.6.2.post1"},
        check=lambda d, p: d.steps[-1].kind == "wheel" and d.steps[-1].force),
    Row("causal.ok.half-installed (no way to reinstall)", "causal-conv1d", OK, "causal.ok.half-installed",
        env={"half_installed": ("causal-conv1d",), "torch": "2.13.0"}, dists={"causal-conv1d": "1.6.2.post1"},
        settings={"allow_build": "0"},
        check=lambda d, p: d.verify and d.on_failure == "block"),

    # mamba-ssm: the same compiled-kernel path with its own pins entry (and causal-conv1d with it)
    Row("mamba.wheel: the release wheel, with causal-conv1d first; fla's planned tilelang is no clash",
        "mamba-ssm", INSTALL, "mamba.wheel", check=_mamba_wheel(MAMBA_WHEEL)),
    Row("mamba.wheel: with tilelang installed it is checked first, and the declared tilelang==0.1.8 is said",
        "mamba-ssm", INSTALL, "mamba.wheel", dists=PAIR_015,
        check=_mamba_wheel(MAMBA_WHEEL, needs=("causal-conv1d", "tilelang"),
                           declares="tilelang==0.1.8 while tilelang 0.1.15 is installed")),
    Row("mamba.wheel from a mirror (FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL)", "mamba-ssm", INSTALL, "mamba.wheel",
        settings={"wheel_urls": {"mamba-ssm": "https://mirror.example/mamba/"}},
        check=lambda d, p: d.steps[-1].url == "https://mirror.example/mamba/" + MAMBA_WHEEL.replace("+", "%2B")),
    Row("mamba.build: torch 2.13 has no release wheel; 2.3.2.post1 for sm_90 with MAMBA_FORCE_BUILD", "mamba-ssm",
        INSTALL, "mamba.build", env=MAMBA_NO_RELEASE, check=_mamba_build("2.3.2.post1", ("sm_90",))),
    Row("mamba.build: the H200 (torch 2.11, CUDA 13): fla's planned tilelang pair is no clash: 2.3.2.post1",
        "mamba-ssm", INSTALL, "mamba.build", env=H200,
        check=lambda d, p: (_mamba_build("2.3.2.post1", ("sm_90",))(d, p), p["tilelang"].action == INSTALL,
                            "declares" not in d.reason)),
    Row("mamba.build: both need a build and tilelang 0.1.15 is installed: 2.3.1, which declares no tilelang",
        "mamba-ssm", INSTALL, "mamba.build", env=H200, dists=PAIR_015,
        check=_mamba_build("2.3.1", ("sm_90",), why="which declares tilelang==0.1.8 while tilelang 0.1.15 is installed",
                           needs=("causal-conv1d", "tilelang"))),
    Row("mamba.build: a V100 (sm_70) with nvcc 12.8 gets 2.3.1, whose setup.py still compiles sm_70", "mamba-ssm",
        INSTALL, "mamba.build", env={**MAMBA_NO_RELEASE, "gpus": ("sm_70",)}, dists=CONV, check=_mamba_build("2.3.1", ("sm_70",))),
    Row("mamba.build: triton 3.4 (torch 2.8) is below 2.3.2.post1's triton>=3.5.0: 2.3.1", "mamba-ssm", INSTALL,
        "mamba.build", env={"torch": "2.8.0", "triton": "3.4.0"}, check=_mamba_build("2.3.1", ("sm_90",))),
    Row("mamba.build offline from the sdist when only 2.3.2.post1's is in the wheelhouse", "mamba-ssm", INSTALL,
        "mamba.build", settings=OFFLINE, env={"torch": "2.11.0", "torch_cuda": "13.0", "nvcc_version": "13.0",
                                              "wheelhouse": MAMBA_SDIST_HOUSE}, dists={"ninja": "1.13.0"},
        check=_mamba_build("2.3.2.post1", ("sm_90",))),
    Row("mamba.build.no-arch: neither release compiles sm_70 with nvcc 13.0", "mamba-ssm", SKIP, "mamba.build.no-arch",
        env={**MAMBA_NO_RELEASE, "gpus": ("sm_70",), "torch_cuda": "13.0", "nvcc_version": "13.0"},
        dists=CONV, check=_no_build("sm_70")),
    Row("mamba.cache: a build of ours for this torch and GPU, before any build", "mamba-ssm", INSTALL, "mamba.cache",
        env={**MAMBA_NO_RELEASE, "cached_wheels": (MAMBA_BUILT,)},
        check=lambda d, p: [s.kind for s in d.steps] == ["wheel"] and "local wheel cache" in d.reason
        and d.target == {"mamba-ssm": "2.3.2.post1"}),
    Row("mamba.cache: another kernel's cached build is not taken", "mamba-ssm", INSTALL, "mamba.build",
        env={**MAMBA_NO_RELEASE, "cached_wheels": (BUILT_213,)}, check=_mamba_build("2.3.2.post1", ("sm_90",))),
    Row("mamba.wheelhouse: a built wheel served offline, with builds forbidden", "mamba-ssm", INSTALL,
        "mamba.wheelhouse", env={**MAMBA_NO_RELEASE, "wheelhouse": (MAMBA_BUILT,)}, settings={**OFFLINE, "allow_build": "0"},
        dists=CONV, check=lambda d, p: [s.kind for s in d.steps] == ["wheel"] and d.steps[0].requirements == (MAMBA_BUILT,)),
    Row("mamba.offline-missing: a built wheel in the wheelhouse, but not einops, which it imports", "mamba-ssm", SKIP,
        "mamba.offline-missing", env={**MAMBA_NO_RELEASE, "wheelhouse": (MAMBA_BUILT,)},
        settings={**OFFLINE, "allow_build": "0"}, dists={"einops": None, **CONV},
        check=lambda d, p: "lacks einops, which " + MAMBA_BUILT + " needs" in d.reason),
    Row("mamba.offline-missing (no wheel, no sdist)", "mamba-ssm", SKIP, "mamba.offline-missing", settings=OFFLINE,
        dists=CONV, check=lambda d, p: "mamba_ssm-2.3.2.post1+cu12torch2.10" in d.reason),
    Row("mamba.no-wheel (ALLOW_BUILD=0)", "mamba-ssm", SKIP, "mamba.no-wheel", env=MAMBA_NO_RELEASE,
        settings={"allow_build": "0"}, dists=CONV, check=lambda d, p: "torch 2.13" in d.reason and "ALLOW_BUILD=auto" in d.fix),
    Row("mamba.no-nvcc", "mamba-ssm", SKIP, "mamba.no-nvcc", env={**MAMBA_NO_RELEASE, "nvcc": None, "nvcc_version": None},
        dists=CONV, check=_no_build("needs a CUDA toolkit's nvcc")),
    Row("mamba.nvcc-unknown (auto does not guess)", "mamba-ssm", SKIP, "mamba.nvcc-unknown",
        env={**MAMBA_NO_RELEASE, "nvcc_version": None}, dists=CONV, check=_no_build("cannot be told")),
    Row("mamba.nvcc-mismatch: nvcc 12.8 for a CUDA 13.0 torch", "mamba-ssm", SKIP, "mamba.nvcc-mismatch",
        env={**MAMBA_NO_RELEASE, "torch_cuda": "13.0"}, dists=CONV, check=_no_build("nvcc is CUDA 12.8 while torch")),
    Row("mamba.build.timeout: 117 s for one arch on 16 cores is 15.6 min on 2", "mamba-ssm", SKIP, "mamba.build.timeout",
        env={**MAMBA_NO_RELEASE, "cpus": 2}, dists=CONV, check=lambda d, p: "about 16 min" in d.reason and "1404" in d.fix),
    Row("mamba.build.all-archs: `fastpath-hooks build mamba-ssm --arch all`", "mamba-ssm", INSTALL,
        "mamba.build.all-archs", env={**MAMBA_NO_RELEASE, "gpus": ()}, settings={"allow_build": "1", "timeout": 1e6},
        via=lambda env, settings, pins: decide_build(env, settings, pins, "mamba-ssm"),
        check=lambda d, p: d.steps[-1].archs == ("all",) and d.expected_seconds == 117 * 6),
    Row("mamba.build.unrestricted: a GPU of unknown arch, auto", "mamba-ssm", SKIP, "mamba.build.unrestricted",
        env={**ROCM, "gpus": ("gfx",)}, dists=CONV, check=_no_build("cannot be restricted")),
    Row("mamba.rocm.no-build", "mamba-ssm", SKIP, "mamba.rocm.no-build", env=ROCM, settings={"allow_build": "0"},
        dists=CONV, check=lambda d, p: "hipcc" in d.fix),
    Row("mamba.rocm.no-hipcc", "mamba-ssm", SKIP, "mamba.rocm.no-hipcc", env={**ROCM, "hipcc": None},
        dists=CONV, check=_no_build("needs hipcc")),
    Row("mamba.rocm.build: HIP_ARCHITECTURES is the visible gfx arch", "mamba-ssm", INSTALL, "mamba.rocm.build",
        env=ROCM, check=lambda d, p: dict(d.steps[-1].env) == {"MAMBA_FORCE_BUILD": "TRUE", "HIP_ARCHITECTURES": "gfx942"}),
    Row("mamba.ok", "mamba-ssm", OK, "mamba.ok", dists={"mamba-ssm": "2.3.2.post1"},
        check=lambda d, p: d.verify and d.on_failure == "block" and not d.needs),
    Row("mamba.ok: `import mamba_ssm` imports an installed tilelang: tilelang is checked first", "mamba-ssm", OK,
        "mamba.ok", dists={"mamba-ssm": "2.3.2.post1", **PAIR_015},
        check=lambda d, p: (d.verify, d.on_failure == "block", d.needs == ("tilelang",), p["tilelang"].verify)),
    Row("mamba.ok: a broken tilelang pair is repaired before mamba-ssm is checked", "mamba-ssm", OK, "mamba.ok",
        dists={"mamba-ssm": "2.3.2.post1", "tilelang": "0.1.15", "apache-tvm-ffi": "0.1.9"},
        pins=with_broken(("0.1.15", ["0.1.9"], "*")),
        check=lambda d, p: (d.verify, d.needs == ("tilelang",), p["tilelang"].action == REPAIR)),
    Row("mamba.ok: tilelang installed but skipped by the user: not needed first", "mamba-ssm", OK, "mamba.ok",
        dists={"mamba-ssm": "2.3.2.post1", **PAIR_015}, settings={"skip": frozenset({"tilelang"})},
        check=lambda d, p: (d.verify, d.on_failure == "block", d.needs == ())),
    Row("mamba.block.arch: a build of ours for sm_90 only, on an sm_80 GPU", "mamba-ssm", BLOCK, "mamba.block.arch",
        env={"gpus": ("sm_80",)}, dists={"mamba-ssm": "2.3.2.post1+fph.torch2.11.0.cu130.abi1.sm90"},
        check=lambda d, p: "sm_80" in d.reason and "build mamba-ssm --arch sm_80,sm_90" in d.fix),
    Row("mamba.block.numeric: installed, and its numbers were measured wrong here", "mamba-ssm", BLOCK,
        "mamba.block.numeric", dists={"mamba-ssm": "2.3.2.post1"},
        env={"numeric_failures": (NUMERIC_FAILURE("mamba-ssm", "2.3.2.post1", torch="2.10.0", cuda="12.8"),)},
        check=lambda d, p: (d.reason.startswith("on sm_90,"), d.installed == {"mamba-ssm": "2.3.2.post1"},
                            d.on_failure == "block")),
    # the next mamba-ssm: its CUDA extension is opt-in (MAMBA_KEEP_CUDA_BUILD=TRUE), the Mamba-1 families need it
    Row("mamba.build.triton-only: only Mamba-2 families in use, and the release allows: nothing compiled", "mamba-ssm",
        INSTALL, "mamba.build.triton-only", env={**MAMBA_NO_RELEASE, "model_types": ("llama", "mamba2"), "nvcc": None,
                                                 "nvcc_version": None}, dists=CONV, pins=NEXT_MAMBA,
        check=lambda d, p: (d.steps[-1].archs == ("py",), dict(d.steps[-1].env) == {"MAMBA_FORCE_BUILD": "TRUE"},
                            "only mamba2 in use, which uses its Triton ops" in d.reason,
                            d.target == {"mamba-ssm": "2.4.0"})),
    Row("mamba.build: a Mamba-1 family in use turns the CUDA build on", "mamba-ssm", INSTALL, "mamba.build",
        env={**MAMBA_NO_RELEASE, "model_types": ("jamba", "mamba2")}, dists=CONV, pins=NEXT_MAMBA,
        check=lambda d, p: (dict(d.steps[-1].env) == {"MAMBA_FORCE_BUILD": "TRUE", "MAMBA_KEEP_CUDA_BUILD": "TRUE"},
                            "jamba calls its CUDA extension" in d.steps[-1].note, d.steps[-1].archs == ("sm_90",))),
    Row("mamba.build: families not known (a CLI run): the CUDA build stays on", "mamba-ssm", INSTALL, "mamba.build",
        env=MAMBA_NO_RELEASE, dists=CONV, pins=NEXT_MAMBA,
        check=lambda d, p: "MAMBA_KEEP_CUDA_BUILD=TRUE: the model families in use are not known here" in d.steps[-1].note),
    Row("mamba.ok.triton-only: a build without the extension, Mamba-2 in use", "mamba-ssm", OK, "mamba.ok.triton-only",
        env={**MAMBA_NO_RELEASE, "model_types": ("bamba",)}, dists={**CONV, "mamba-ssm": MAMBA_PY}, pins=NEXT_MAMBA,
        check=lambda d, p: (d.verify, "decided again at every start" in d.reason, not d.steps)),
    Row("mamba.repair.cuda: a build without the extension, and a Mamba-1 model imported", "mamba-ssm", REPAIR,
        "mamba.repair.cuda", env={**MAMBA_NO_RELEASE, "model_types": ("falcon_mamba",)},
        dists={**CONV, "mamba-ssm": MAMBA_PY}, pins=NEXT_MAMBA,
        check=lambda d, p: (d.steps[-1].force, ("MAMBA_KEEP_CUDA_BUILD", "TRUE") in d.steps[-1].env,
                            "falcon_mamba calls its CUDA extension" in d.reason)),
    Row("mamba.block.no-cuda: ... and no rebuild possible here (builds off)", "mamba-ssm", BLOCK, "mamba.block.no-cuda",
        env={**MAMBA_NO_RELEASE, "model_types": ("mamba",)}, dists={**CONV, "mamba-ssm": MAMBA_PY}, pins=NEXT_MAMBA,
        settings={"allow_build": "0"},
        check=lambda d, p: ("Mamba-1 calls would raise" in d.reason, d.on_failure == "block", "ALLOW_BUILD" in d.fix)),
    Row("mamba.build.no-pip: a source build needs pip", "mamba-ssm", SKIP, "mamba.build.no-pip",
        env={**MAMBA_NO_RELEASE, "pip": False}, dists=CONV, check=lambda d, p: "ensurepip" in d.fix),
    Row("mamba.repair.half-installed", "mamba-ssm", REPAIR, "mamba.repair.half-installed",
        env={"half_installed": ("mamba-ssm",)}, dists={"mamba-ssm": "2.3.2.post1"},
        check=lambda d, p: d.steps[-1].kind == "wheel" and d.steps[-1].force),
    Row("mamba.ok.half-installed (no way to reinstall)", "mamba-ssm", OK, "mamba.ok.half-installed",
        env={"half_installed": ("mamba-ssm",), **MAMBA_NO_RELEASE}, dists={"mamba-ssm": "2.3.2.post1"},
        settings={"allow_build": "0"}, check=lambda d, p: d.verify and d.on_failure == "block"),
    Row("mamba.no-release: only 2.3.2.post1 pinned and triton 3.4", "mamba-ssm", SKIP, "mamba.no-release",
        env={"torch": "2.8.0", "triton": "3.4.0"},
        pins=with_kernel(PINS, "mamba-ssm", releases=PINS.kernel("mamba-ssm").releases[:1]),
        check=lambda d, p: "no pinned mamba-ssm release fits torch 2.8.0, triton 3.4.0" in d.reason),
    Row("mamba.no-transformers: `import mamba_ssm` imports transformers", "mamba-ssm", SKIP, "mamba.no-transformers",
        dists={"transformers": None},
        check=lambda d, p: ("transformers" in d.reason and not d.steps, p["causal-conv1d"].action == INSTALL)),
    Row("mamba.no-triton: its ssd kernels are triton programs", "mamba-ssm", SKIP, "mamba.no-triton",
        env={"triton": None}, check=lambda d, p: "pip install torch==" in d.fix),
    Row("mamba.without.causal: causal-conv1d skipped by the user: mamba-ssm alone is not installed", "mamba-ssm", SKIP,
        "mamba.without.causal", settings={"skip": frozenset({"causal-conv1d"})},
        check=lambda d, p: "FASTPATH_HOOKS_SKIP" in d.reason and not d.steps),
    Row("mamba.without.causal: causal-conv1d cannot be built either (no nvcc)", "mamba-ssm", SKIP,
        "mamba.without.causal", env={**MAMBA_NO_RELEASE, "nvcc": None, "nvcc_version": None},
        check=lambda d, p: "only with causal-conv1d, which is not installed here: " in d.reason and "CUDA" in d.fix),
    Row("mamba.wheel: the user's own causal-conv1d (skipped) is enough", "mamba-ssm", INSTALL, "mamba.wheel",
        settings={"skip": frozenset({"causal-conv1d"})}, dists={"causal-conv1d": "1.5.0"},
        check=lambda d, p: d.needs == ()),
]


def _accepts(verdict) -> bool:
    """A check's verdict: True, or a non-empty tuple of True (the assert_* helpers return True)."""
    return verdict is True or (isinstance(verdict, tuple) and len(verdict) > 0 and all(x is True for x in verdict))


def _unlike(value):
    """A value of the same kind as `value` but different: what a check that looks at it must reject."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, enum.Enum):
        return next(m for m in type(value) if m is not value)
    if isinstance(value, (int, float)):
        return -1 - value
    if isinstance(value, str):
        return "" if value else "unlike"
    if isinstance(value, Mapping):
        return {} if value else {"unlike": "0"}
    if isinstance(value, tuple):
        return () if value else ("unlike",)
    return "unlike" if value is None else None


def _mutant(d):
    """`d` with every field but kernel, action and rule changed (bypassing validation: it only feeds a check)."""
    m = copy.copy(d)
    for f in dataclasses.fields(d):
        if f.name not in ("kernel", "action", "rule"):
            object.__setattr__(m, f.name, _unlike(getattr(d, f.name)))
    return m


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_rule(row):
    settings = dataclasses.replace(Settings(), **row.settings)
    plan = plan_for(make_env(row.dists, **row.env), settings, row.pins or PINS)
    d = plan[row.kernel] if row.via is None else row.via(make_env(row.dists, **row.env), settings, row.pins or PINS)
    assert (d.action, d.rule) == (row.action, row.rule), d.reason
    assert d.reason, "every decision carries a one-line reason"
    assert "\n" not in d.reason
    if d.acts:
        assert d.steps and d.target
        for name in d.target:
            assert name in PINS.allowed
    for step in d.steps + d.repair_steps:
        for raw in step.requirements:
            if step.kind in ("wheel", "build"):
                continue
            name = canonical_name(Requirement(raw).name)
            assert name in PINS.allowed, f"{raw}: only allow-listed distributions are installed"
            if step.kind != "deps":  # deps resolve under constraints that pin the protected ones
                assert name not in PINS.protected, f"{raw}: never install a protected distribution"
    assert_checks_behaviour(row.check, d, plan)


def assert_checks_behaviour(check, d, plan):
    """A row's check accepts its decision and rejects that decision's mutant: one whose steps, target,
    reason, fix, ... all differ (action and rule stay: the harness checks those). A check that returns
    nothing, or looks only at the rule or at other kernels, cannot fail on its own decision: it fails here."""
    assert check is not None, "give the row a check of what the decision does (steps, target, reason, fix...)"
    verdict = check(d, plan)
    assert _accepts(verdict), f"a check returns True or a non-empty tuple of True, not {verdict!r}"
    mutant = _mutant(d)
    try:
        accepts_mutant = _accepts(check(mutant, dataclasses.replace(plan, decisions={**plan.decisions, d.kernel: mutant})))
    except Exception:   # noqa: BLE001 - any failure on the mutant is a rejection
        accepts_mutant = False
    assert not accepts_mutant, "the check cannot fail: it accepts a decision with every field but action and rule changed"


@pytest.mark.parametrize("check", [
    None,
    lambda d, p: (),                                              # the old `tilelang.ok.unverified` row
    lambda d, p: None,
    lambda d, p: d.repair_steps,                                  # truthy, but no verdict
    lambda d, p: (d.rule == "tilelang.ok.unverified", True),      # the rule only
    lambda d, p: p["fla"].rule == "fla.install",                  # another kernel only
    lambda d, p: d.verify or not d.verify,
], ids=["none", "empty-tuple", "returns-none", "truthy-value", "rule-only", "other-kernel-only", "tautology"])
def test_a_check_that_cannot_fail_fails_the_row(check):
    plan = plan_for(make_env({"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12.post1"}))
    with pytest.raises(AssertionError):
        assert_checks_behaviour(check, plan["tilelang"], plan)
    assert_checks_behaviour(lambda d, p: "not in the pins" in d.reason, plan["tilelang"], plan)   # the same, checking


def test_every_declared_rule_has_a_row():
    """Every rule id the shipped kernels can get (decide/messages.py, expanded with their data) is what
    some row here decides, and every row's rule is declared. The ids the engine makes (the repair of a
    failed check) are the `.repair` of a declared rule whose decision offers repair steps."""
    declared = rule_ids.declared(PINS)
    covered = {r.rule for r in ROWS}
    assert covered - set(declared) == set(), f"rows whose rule is not declared: {sorted(covered - set(declared))}"
    by_policy = {r for r, rule in declared.items() if not rule.engine}
    assert len(by_policy) > 80
    assert by_policy - covered == set(), f"declared rules without a table row: {sorted(by_policy - covered)}"
    repairable = set()
    for row in ROWS:
        env, settings = make_env(row.dists, **row.env), dataclasses.replace(Settings(), **row.settings)
        d = plan_for(env, settings, row.pins or PINS)[row.kernel] if row.via is None else row.via(env, settings, row.pins or PINS)
        if d.repair_steps:
            repairable.add(d.rule + ".repair")
    engine = {r for r, rule in declared.items() if rule.engine}
    assert engine and engine == repairable


# -- every known-broken pair in the shipped data ------------------------------------------------

def _broken_cases():
    cases = []
    for entry in PINS.kernel("tilelang").broken:
        archs = (("sm_90",), ("sm_80",)) if entry.arch == "*" else ((entry.arch,),)
        for ffi in entry.companions:
            for gpus in archs:
                cases.append(pytest.param(entry.version, ffi, gpus, id=f"tilelang{entry.version}-ffi{ffi}-{gpus[0]}"))
    return cases


@pytest.mark.parametrize("tilelang,ffi,gpus", _broken_cases())
def test_every_broken_pair_is_repaired_to_a_known_good_pair(tilelang, ffi, gpus):
    env = make_env({"tilelang": tilelang, "apache-tvm-ffi": ffi}, gpus=gpus)
    assert PINS.broken_for("tilelang", tilelang, ffi, gpus) is not None
    d = plan_for(env)["tilelang"]
    assert (d.action, d.rule) == (REPAIR, "tilelang.repair.broken-pair"), d.reason
    assert_replaces_ffi_first(d)
    assert_known_good_pair(d, gpus)
    assert d.target["apache-tvm-ffi"] != ffi
    assert d.on_failure == "block"


def test_arch_specific_broken_entry_only_applies_on_that_arch():
    pins = with_broken(("0.1.15", ("0.1.12",), "sm_90"))
    installed = {"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"}
    on_hopper = plan_for(make_env(installed), pins=pins)["tilelang"]
    assert on_hopper.action == REPAIR and on_hopper.target == {"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.11"}
    on_ampere = plan_for(make_env(installed, gpus=("sm_80",)), pins=pins)["tilelang"]
    assert on_ampere.action == OK
    fresh = plan_for(make_env(), pins=pins)["tilelang"]
    assert fresh.target == {"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.11"}


# -- the fla version fits triton and transformers ----------------------------------------------

@pytest.mark.parametrize("triton,transformers,gpus,expected", [
    ("3.9.0", "4.57.6", ("sm_80",), "0.4.1"),
    ("3.9.0", "5.24.0", ("sm_80",), "0.6.0"),
    ("3.9.0", "5.24.0", ("sm_90",), "0.6.0"),
    ("3.8.0", "4.57.6", ("sm_80",), "0.5.2"),
    ("3.8.0", "5.24.0", ("sm_90",), "0.6.0"),
    ("3.6.0", "4.57.6", ("sm_90",), "0.5.2"),   # under the hazard: a release with the tilelang backend
    ("3.6.0", "5.24.0", ("sm_90",), "0.6.0"),
    ("3.4.0", "5.0.0", ("sm_80",), "0.5.2"),
])
def test_fla_version_fits_triton_and_transformers(triton, transformers, gpus, expected):
    env = make_env({"transformers": transformers}, triton=triton, gpus=gpus)
    d = plan_for(env)["fla"]
    assert d.action == INSTALL and d.target["fla-core"] == expected, d.reason
    rel = next(r for r in PINS.kernel("fla").releases if r.version == expected)
    assert rel.triton.contains(triton) and rel.transformers.contains(transformers)


def test_fla_without_tilelang_backend_is_never_chosen_under_a_hazard():
    """0.4.1 is the only release for triton 3.9 + transformers 4.57; under a hazard it must not be chosen."""
    env = make_env({"transformers": "4.57.6"}, triton="3.9.0", gpus=("sm_80",))
    assert plan_for(env)["fla"].target["fla-core"] == "0.4.1"
    hazardous = plan_for(env, pins=with_hazard("sm_80", ">=3.9"))
    d = hazardous["fla"]
    assert (d.action, d.rule) == (SKIP, "fla.no-release") and "tilelang backend" in d.reason
    assert hazardous["tilelang"].action == INSTALL


# -- the issue's acceptance rows ----------------------------------------------------------------

ACCEPT = dict(gpus=("sm_90",), torch="2.11.0", torch_cuda="13.0", triton="3.6.0", python="3.12")


def test_acceptance_hopper_old_triton_plans_fla_and_tilelang():
    plan = plan_for(make_env(**ACCEPT))
    fla, tl = plan["fla"], plan["tilelang"]
    assert fla.action == INSTALL and set(fla.target) == {"fla-core", "flash-linear-attention"}
    assert fla.needs == ("tilelang",)
    assert tl.action == INSTALL and set(tl.target) == {"tilelang", "apache-tvm-ffi"}
    assert_known_good_pair(tl, ("sm_90",))
    # causal-conv1d: torch 2.11 loads the 2.10 builds
    assert plan["causal-conv1d"].steps[-1].requirements == (
        "causal_conv1d-1.6.2.post1+cu13torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl",)


def test_acceptance_ampere_plans_no_tilelang():
    plan = plan_for(make_env(**{**ACCEPT, "gpus": ("sm_80",)}))
    assert plan["fla"].action == INSTALL and plan["fla"].needs == ()
    assert plan["tilelang"].action == SKIP
    assert "tilelang" not in str([reqs(d) for d in plan.decisions.values()])


def test_acceptance_hopper_new_triton_needs_no_tilelang():
    plan = plan_for(make_env(**{**ACCEPT, "triton": "3.7.1"}))
    assert plan["fla"].action == INSTALL and plan["fla"].needs == ()
    assert plan["tilelang"].action == SKIP


def test_acceptance_rocm_no_tilelang_and_fla_tilelang_off():
    plan = plan_for(make_env(**{**ACCEPT, **ROCM}))
    assert plan["tilelang"].action == SKIP
    assert dict(plan["fla"].env) == {"FLA_TILELANG": "0"}
    # no ROCm wheels: a source build for the visible gfx arch with hipcc, else skipped
    assert plan["causal-conv1d"].steps[-1].archs == ("gfx942",)
    assert plan_for(make_env(**{**ACCEPT, **ROCM, "hipcc": None}))["causal-conv1d"].action == SKIP


# -- source builds: the estimate, and which built wheels fit ------------------------------------

def _build_seconds(**env):
    d = plan_for(make_env(**{**NO_RELEASE, **env}), dataclasses.replace(Settings(), timeout=1e9))["causal-conv1d"]
    assert d.rule == "causal.build", d.reason
    return d.expected_seconds


def test_the_build_estimate_scales_with_archs_and_fewer_cores_not_more():
    one = _build_seconds()
    assert _build_seconds(gpus=("sm_80", "sm_90")) == pytest.approx(2 * one, rel=0.01)
    assert _build_seconds(gpus=("sm_90", "sm_90", "sm_90", "sm_90")) == one       # one arch, four GPUs
    assert _build_seconds(cpus=4) == pytest.approx(4 * one, rel=0.01)    # measured on 16 cores
    assert _build_seconds(cpus=128) == one   # the big files compile one per job: more cores do not help


def _with_cached(name, **env):
    return plan_for(make_env(**{**NO_RELEASE, "cached_wheels": (name,), **env}))["causal-conv1d"]


@pytest.mark.parametrize("name,env", [
    (BUILT_213.replace("torch2.13.0", "torch2.12.0"), {}),                     # built against another torch
    (BUILT_213.replace("cu128", "cu130"), {}),                                 # another CUDA build of torch
    (BUILT_213.replace("abi1", "abi0"), {}),                                   # the pre-cxx11 ABI
    (BUILT_213.replace("cp312-cp312", "cp311-cp311"), {}),                     # another Python
    (BUILT_213.replace("x86_64", "aarch64"), {}),                              # another platform
    (BUILT_213.replace("sm90", "sm80"), {}),                                   # code for other GPUs
    (BUILT_213, {"gpus": ("sm_90", "sm_100")}),                                # one of the GPUs lacks code
    (BUILT_213.replace("1.6.2.post1+", "1.6.1+"), {}),                         # another version
    (BUILT_213.replace("+fph.", "+xyz."), {}),                                 # not a key of ours
    ("causal_conv1d-1.6.2.post1-cp312-cp312-linux_x86_64.whl", {}),            # an unlabelled build (pip's cache)
    ("not a wheel name.whl", {}),
])
def test_a_cached_wheel_that_does_not_fit_is_never_installed(name, env):
    d = _with_cached(name, **env)
    assert d.rule == "causal.build" and d.steps[-1].kind == "build", d.reason


def test_a_cached_all_arch_build_fits_any_gpu_its_sdist_compiles_for():
    all_archs = BUILT_213.replace("sm90", "all")
    assert _with_cached(all_archs, gpus=("sm_89", "sm_90")).rule == "causal.cache"
    assert _with_cached(all_archs, gpus=("sm_70",)).rule == "causal.build.no-arch"


def test_acceptance_no_gpu_plans_nothing():
    plan = plan_for(make_env(**{**ACCEPT, "gpus": ()}))
    assert not any(d.acts for d in plan.decisions.values())
    assert plan.notes and "no CUDA accelerator" in plan.notes[0] and "sees no device" in plan.notes[0]


def test_multi_gpu_any_hopper_triggers_the_hazard():
    plan = plan_for(make_env(gpus=("sm_80", "sm_90")))
    assert plan["tilelang"].action == INSTALL and plan["fla"].needs == ("tilelang",)


# -- other properties ---------------------------------------------------------------------------

@pytest.mark.parametrize("torch,cuda,python,arch,abi,expected", [
    ("2.10.0", "12.8", "3.12.1", "x86_64", True, "cu12torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64"),
    ("2.11.0+cu130", "13.0", "3.11.9", "aarch64", True, "cu13torch2.10cxx11abiTRUE-cp311-cp311-linux_aarch64"),
    ("2.12.0", "12.6", "3.13.0", "x86_64", None, "cu12torch2.10cxx11abiTRUE-cp313-cp313-linux_x86_64"),
    ("2.6.0", "12.4", "3.10.4", "x86_64", None, "cu12torch2.6cxx11abiFALSE-cp310-cp310-linux_x86_64"),
    ("2.6.0", "12.4", "3.10.4", "x86_64", True, "cu12torch2.6cxx11abiTRUE-cp310-cp310-linux_x86_64"),
    ("2.6.0", "12.4", "3.10.4", "aarch64", False, None),    # no pre-cxx11 aarch64 build
    ("2.9.1", "13.0", "3.12.0", "x86_64", True, "cu13torch2.9cxx11abiTRUE-cp312-cp312-linux_x86_64"),
    ("2.13.0", "12.8", "3.12.0", "x86_64", True, None),     # newer than any release build
    ("2.10.0", "12.8", "3.14.0", "x86_64", True, None),     # no Python 3.14 wheels
    ("2.8.0", "11.8", "3.12.0", "x86_64", True, None),      # no CUDA 11 wheels
])
def test_causal_conv1d_wheel_name(torch, cuda, python, arch, abi, expected):
    env = make_env(torch=torch, torch_cuda=cuda, python=python, arch=arch, cxx11_abi=abi)
    name, why = release_wheel(env, PINS, "causal-conv1d")
    if expected is None:
        assert name is None and "no prebuilt" in why
    else:
        assert name == f"causal_conv1d-1.6.2.post1+{expected}.whl" and why == ""


def test_causal_conv1d_mirror_url():
    settings = Settings(wheel_urls={"causal-conv1d": "https://mirror.example/cc1d/"})
    step = plan_for(settings=settings)["causal-conv1d"].steps[-1]
    assert step.url.startswith("https://mirror.example/cc1d/causal_conv1d-1.6.2.post1%2Bcu12")


def test_fresh_plans_as_if_no_kernel_were_installed():
    env = make_env({"fla-core": "0.6.0", "flash-linear-attention": "0.6.0", "tilelang": "0.1.15",
                    "apache-tvm-ffi": "0.1.12", "causal-conv1d": "1.6.2.post1", "mamba-ssm": "2.3.2.post1",
                    "flash-qla": "0.1.3", "flash-attn": "2.8.3.post2", "flash-attn-3": "3.0.0b1"})
    assert all(d.action == OK for d in plan_for(env, pins=QLA_ON).decisions.values())
    fresh = plan_for(env, dataclasses.replace(Settings(), **FA_TIME), pins=QLA_ON, fresh=True)
    assert all(d.action == INSTALL for d in fresh.decisions.values())
    # with the shipped pins an installed flash-qla is the user's and stays; a fresh plan leaves it off
    assert plan_for(env).decisions["flash-qla"].action == OK
    assert plan_for(env, fresh=True).decisions["flash-qla"].rule == "qla.off"


def test_policy_is_pure_and_deterministic():
    env = make_env({"tilelang": "0.1.11", "apache-tvm-ffi": "0.1.12"})
    before = dict(env.distributions)
    a, b = plan_for(env), plan_for(env)
    assert a.to_json() == b.to_json()
    assert env.distributions == before


def test_plan_json_round_trips():
    import json

    data = plan_for().to_json()
    assert json.loads(json.dumps(data)) == data
    assert [d["kernel"] for d in data["decisions"]] == ["fla", "causal-conv1d", "mamba-ssm", "flash-attn", "flash-attn-3",
                                                       "tilelang", "flash-qla"]
