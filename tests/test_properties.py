"""Property-based tests (hypothesis): bad input gets a clear error of the documented kind,
never a crash; the policy never raises and its plans are internally consistent.
"""

from __future__ import annotations

import copy
import itertools
import json
import os

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from fastpath_hooks.facts import pins as pins_mod
from fastpath_hooks.decide.plan import invocation
from fastpath_hooks.facts.pins import PinsError
from fastpath_hooks.decide.plan import BLOCK, INSTALL, OK, REPAIR, SKIP, Action, Plan
from fastpath_hooks.decide.policy import decide
from fastpath_hooks.facts.settings import KERNELS, VARIABLES, Settings, SettingsError
from fastpath_hooks.facts.pins import load as load_pins
from fastpath_hooks.facts.environment import FACT_KEYS, Environment, distribution_keys, parse_target

# Sane for a 2-core CI machine; no example database written into the repository.
# FASTPATH_HOOKS_TEST_EXAMPLES=20000 for a deeper search (4 tests, ~9 min on 2 cores; passed on 2026-11-30)
FAST = settings(max_examples=int(os.environ.get("FASTPATH_HOOKS_TEST_EXAMPLES", "200")), deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

# Environment values are str without NUL; values read from os.environ may carry surrogate escapes.
env_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40) | \
    st.sampled_from(["", " ", "1", "0", "true", "off", "-1", "0.0", "nan", "inf", "1e999", "~", ".", "/", "\udcff",
                     "http://", "file://", "https://x", "fla", "all", "fla,,tilelang", "gpu=sm_90", "pip", "uv"])


# -- settings --------------------------------------------------------------------------------

@FAST
@given(st.dictionaries(st.sampled_from(sorted(VARIABLES) + ["FASTPATH_HOOKS_X", "FASTPATH_HOOKS_", "PATH"]), env_text))
def test_settings_from_any_environment_is_settings_or_a_settings_error(environ):
    try:
        result = Settings.from_env(environ)
    except SettingsError as exc:
        text = str(exc)
        assert exc.problems and all(name in text for name, _, _ in exc.problems)
        assert all(name.startswith("FASTPATH_HOOKS_") for name, _, _ in exc.problems)
        return
    assert isinstance(result, Settings)
    assert result.mode in ("install", "report") and result.timeout > 0 and result.lock_timeout > 0
    assert result.retry_after >= 0 and result.skip <= frozenset(KERNELS)


# -- target specs --------------------------------------------------------------------------------

fact_value = st.sampled_from(["sm_90", "sm_80+sm_90", "gfx942", "xpu", "none", "12.8", "13.0", "6.4", "2.10.0", "3.6.0",
                              "3.12", "3.12.3", "yes", "no", "linux", "linux-x86_64", "darwin-arm64", "x86_64",
                              "aarch64", "banana", "", "sm_", "3", "2.10.0+cu128", "0.6.0"]) | env_text
entry = st.tuples(st.sampled_from(FACT_KEYS + distribution_keys(load_pins()) + ("gpus", "Torch", "bogus")), fact_value).map(
    lambda kv: f"{kv[0]}={kv[1]}") | env_text


@FAST
@given(st.lists(entry, max_size=6).map(",".join) | env_text)
def test_a_target_spec_parses_or_raises_value_error(spec):
    try:
        facts = parse_target(spec)
    except ValueError as exc:
        assert str(exc)
        return
    assert isinstance(facts, dict)
    assert not (facts.get("cuda") and facts.get("hip"))


# -- pins files ------------------------------------------------------------------------------------

json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | env_text
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(env_text, inner, max_size=4),
                          max_leaves=12)
with open(pins_mod.SHIPPED) as _fh:
    SHIPPED = json.load(_fh)


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _paths(value, prefix + (i,))


SHIPPED_PATHS = [p for p in _paths(SHIPPED) if p]


@st.composite
def mutated_pins(draw):
    """The shipped pins (or one section of them, as a user file would give) with a few random edits."""
    data = copy.deepcopy(SHIPPED)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(SHIPPED_PATHS))
        parent = data
        try:
            for key in path[:-1]:
                parent = parent[key]
            if draw(st.booleans()):
                parent[path[-1]] = draw(json_value)
            elif isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent.pop(path[-1])
        except (KeyError, IndexError, TypeError, AttributeError):  # an earlier edit replaced a container
            continue
    if draw(st.booleans()) and isinstance(data, dict):
        keep = draw(st.sampled_from(sorted(data)))
        data = {keep: data[keep]}
    return data


_counter = itertools.count()


@pytest.mark.slow
@FAST
@given(json_value | mutated_pins(), st.sampled_from([".json", ".toml"]))
def test_a_pins_file_loads_or_raises_pins_error(tmp_path_factory, data, suffix):
    path = str(tmp_path_factory.getbasetemp() / f"pins-{next(_counter)}{suffix}")  # a new file each time (load caches)
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as fh:
        if suffix == ".json":
            json.dump(data, fh)
        else:
            fh.write(_as_toml_text(data))
    try:
        loaded = pins_mod.load(path)
    except PinsError as exc:
        assert path in str(exc) or "pins" in str(exc)
        event("PinsError")
        return
    finally:
        os.unlink(path)
    assert set(loaded.kernels) == set(KERNELS)
    event("loaded")


def _as_toml_text(data) -> str:
    """Something TOML-shaped (often invalid): the loader must say so, not crash."""
    if isinstance(data, dict):
        return "\n".join(f"{k!s} = {json.dumps(v)}" for k, v in data.items())
    return json.dumps(data)


# -- the policy ----------------------------------------------------------------------------------------

PINS = pins_mod.load(None)
VERSIONS = {
    "fla-core": ["0.4.1", "0.5.2", "0.6.0", "0.3.2", "0.7.0"],
    "flash-linear-attention": ["0.4.1", "0.5.2", "0.6.0", "0.5.0"],
    "tilelang": ["0.1.8", "0.1.11", "0.1.15", "0.1.6"],
    "apache-tvm-ffi": ["0.1.9", "0.1.10", "0.1.11", "0.1.12", "0.1.15.post2", "0.1.13.post3"],
    "causal-conv1d": ["1.6.2.post1", "1.5.3.post1", "1.7.0"],
    "transformers": ["4.57.1", "5.14.0", "5.24.0", "5.6.1"],
    "einops": ["0.8.2"], "packaging": ["26.3"], "z3-solver": ["4.15.4.0"],
}
GPUS = ["sm_70", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "gfx942", "gfx90a", "xpu"]
KERNEL_DISTS = ("fla-core", "flash-linear-attention", "tilelang", "apache-tvm-ffi", "causal-conv1d")


def _wheel_names():
    names = []
    for dist in ("fla-core", "flash-linear-attention", "tilelang", "apache-tvm-ffi", "einops", "packaging", "ninja",
                 "z3-solver"):
        for version in VERSIONS.get(dist, ["1.0"]):
            names.append(f"{dist.replace('-', '_')}-{version}-py3-none-any.whl")
    for py in ("311", "312"):
        names.append(f"causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-cp{py}-cp{py}-linux_x86_64.whl")
        for torch, cuda, archs in (("2.13.0", "cu128", "sm90"), ("2.11.0", "cu130", "sm80.sm90"), ("2.13.0", "cu130", "all"),
                                   ("2.13.0", "rocm64", "gfx942")):
            names.append(f"causal_conv1d-1.6.2.post1+fph.torch{torch}.{cuda}.abi1.{archs}-cp{py}-cp{py}-linux_x86_64.whl")
    names.append("causal_conv1d-1.6.2.post1.tar.gz")
    return names


@st.composite
def environments(draw):
    """Mostly machines a kernel could run on (so every rule is reached) - a third of them Hopper
    machines with a triton in the bug's range -, sometimes anything."""
    kind = draw(st.sampled_from(["hopper", "hopper", "cuda", "cuda", "rocm", "xpu", "random"]))
    realistic = kind != "random"
    build = ("cuda" if kind == "hopper" else kind) if realistic else \
        draw(st.sampled_from(["cuda", "rocm", "xpu", "cpu", "none"]))
    torch = None if build == "none" else draw(st.sampled_from(
        ["2.7.1", "2.10.0", "2.11.0", "2.13.0"] if realistic else ["2.4.0", "2.7.1", "2.10.0", "2.15.0"]))
    if realistic:
        pool = {"cuda": ["sm_80", "sm_86", "sm_90", "sm_90", "sm_100"], "rocm": ["gfx942", "gfx90a"], "xpu": ["xpu"]}[build]
        gpus = tuple(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2)))
        if kind == "hopper":
            gpus = ("sm_90",) + gpus
    else:
        gpus = tuple(draw(st.lists(st.sampled_from(GPUS), max_size=3)))
    dists = {}
    if torch:
        dists["torch"] = torch
    triton = draw(st.sampled_from(["3.4.0", "3.6.0", "3.7.0"] if kind == "hopper" else
                                  ["3.3.1", "3.4.0", "3.6.0", "3.7.1", "3.8.0", "3.9.0"] + ([] if realistic else [None, "3.1.0"])))
    triton_dist = None
    if triton:
        triton_dist = {"rocm": "pytorch-triton-rocm", "xpu": "pytorch-triton-xpu"}.get(build, "triton")
        dists[triton_dist] = triton
    for dist, versions in VERSIONS.items():
        if draw(st.booleans()):
            dists[dist] = draw(st.sampled_from(versions))
    return Environment(
        python=draw(st.sampled_from(["3.10.14", "3.11.7", "3.12.3", "3.13.1"] if realistic else
                                    ["3.9.18", "3.11.7", "3.14.0"])),
        implementation="cpython",
        os="linux" if realistic else draw(st.sampled_from(["linux", "darwin", "windows"])),
        arch=draw(st.sampled_from(["x86_64", "x86_64", "aarch64"])),
        glibc=draw(st.sampled_from(["2.35", "2.39"] if realistic else [None, "2.28", "2.34"])),
        torch=torch,
        torch_cuda=draw(st.sampled_from(["12.8", "13.0", "11.8"])) if build == "cuda" else None,
        torch_hip="6.4" if build == "rocm" else None,
        torch_xpu=build == "xpu",
        cxx11_abi=draw(st.sampled_from([None, True, False])),
        gpus=gpus,
        gpu_source="target",
        triton=triton,
        triton_dist=triton_dist,
        nvcc=draw(st.sampled_from([None, "/usr/local/cuda/bin/nvcc"])),
        nvcc_version=draw(st.sampled_from([None, "12.8", "13.0", "11.8"])),
        hipcc=draw(st.sampled_from([None, "/opt/rocm/bin/hipcc"])),
        cpus=draw(st.sampled_from([None, 2, 16, 64])),
        wheel_cache="/cache/wheels",
        cached_wheels=tuple(sorted(draw(st.lists(st.sampled_from(_wheel_names()), max_size=3, unique=True)))),
        distributions=dists,
        half_installed=tuple(draw(st.lists(st.sampled_from(KERNEL_DISTS), max_size=2, unique=True))),
        uv=draw(st.sampled_from([None, "/usr/bin/uv"])),
        wheelhouse=tuple(sorted(draw(st.lists(st.sampled_from(_wheel_names()), max_size=16, unique=True)))),
        switches={"FLA_TILELANG": v for v in [draw(st.sampled_from([None, None, "0", "1"]))] if v is not None},
    )


@st.composite
def valid_settings(draw):
    offline = draw(st.booleans())
    return Settings(
        skip=frozenset(draw(st.lists(st.sampled_from(KERNELS), max_size=3))),
        mode=draw(st.sampled_from(["install", "report"])),
        offline=offline,
        find_links=("/wheelhouse",) if offline or draw(st.booleans()) else (),
        index_url=draw(st.sampled_from([None, "https://mirror.example/simple"])),
        installer=draw(st.sampled_from(["auto", "uv", "pip"])),
        allow_build=draw(st.sampled_from(["auto", "1", "0"])),
        timeout=draw(st.sampled_from([900.0, 1e6])),
    )


def _hazard(env) -> bool:
    return (env.accelerator == "cuda" and env.triton is not None and "sm_90" in env.gpus
            and any(h.kernel == "fla" and _in_spec(env.triton, h.triton) for h in PINS.hazards))


def _in_spec(version, spec) -> bool:
    return spec.contains(version, prereleases=True)


HOPPER_FLA_MISMATCH = Environment(  # a rare corner: fla on disk needs a repair where it needs tilelang
    python="3.12.3", implementation="cpython", os="linux", arch="x86_64", glibc="2.39", torch="2.10.0",
    torch_cuda="12.8", torch_hip=None, torch_xpu=False, cxx11_abi=True, gpus=("sm_90",), gpu_source="target",
    triton="3.6.0", triton_dist="triton", nvcc="/usr/local/cuda/bin/nvcc",
    distributions={"torch": "2.10.0", "triton": "3.6.0", "fla-core": "0.6.0", "flash-linear-attention": "0.5.2",
                   "tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12", "transformers": "5.24.0"})


@pytest.mark.slow
@FAST
@given(environments(), valid_settings())
@example(HOPPER_FLA_MISMATCH, Settings())
def test_the_policy_never_raises_and_its_plan_is_consistent(env, chosen):
    plan = decide(env, chosen, PINS)
    assert isinstance(plan, Plan) and tuple(plan.decisions) == ("fla", "causal-conv1d", "mamba-ssm", "flash-attn",
                                                                "flash-attn-3", "tilelang", "flash-qla")
    json.dumps(plan.to_json())  # the documented JSON is serialisable
    for kernel, decision in plan.decisions.items():
        assert decision.kernel == kernel and decision.action in tuple(Action) and decision.reason.strip()
        if decision.action in (INSTALL, REPAIR):
            assert decision.steps and decision.target, decision
            names = set()
            for step in decision.steps:
                for installer in ("uv", "pip"):
                    argv = invocation(step, installer=installer, settings=chosen, uv="uv").argv
                    if step.kind == "build":  # `pip wheel --no-deps` installs nothing (its wheel is installed next)
                        assert argv[1:4] == ("-m", "pip", "wheel") and "--no-deps" in argv and "--no-cache-dir" in argv
                        continue
                    assert ("--constraints" in argv) or ("--constraint" in argv)
                if step.kind != "wheel":
                    from packaging.requirements import Requirement

                    names |= {Requirement(r).name.lower().replace("_", "-") for r in step.requirements}
            # never torch, triton or transformers; only the allow-list
            assert not names & {"torch", "triton", "transformers", "pytorch-triton", "pytorch-triton-rocm"}, decision
            assert names <= set(PINS.allowed), (names - set(PINS.allowed), decision)
        if decision.action in (SKIP, BLOCK, OK):
            assert not decision.steps, decision
        if decision.action == BLOCK:
            assert decision.fix.strip(), decision  # a blocked import always says how to fix it
        event(f"{kernel} {decision.action}" + (" (hazard)" if _hazard(env) else ""))
    if env.accelerator is None:
        assert all(d.action == SKIP for d in plan.decisions.values()), plan.decisions
    for kernel in chosen.skip:
        assert plan[kernel].action in (SKIP, BLOCK), plan[kernel]
    fla, tilelang = plan["fla"], plan["tilelang"]
    if _hazard(env) and "fla" not in chosen.skip:
        # fla under the Hopper hazard: never installed or kept without tilelang being usable
        if fla.action in (INSTALL, REPAIR, OK):
            assert tilelang.action in (OK, INSTALL, REPAIR), (fla, tilelang)
            assert "tilelang" in fla.needs, fla
        if env.version("fla-core") and fla.action in (REPAIR, OK):
            # an fla already on disk must fail closed if tilelang cannot be made usable at run time
            assert fla.on_failure == "block", fla
        if tilelang.action not in (OK, INSTALL, REPAIR) and env.version("fla-core"):
            assert fla.action == BLOCK, (fla, tilelang)
    if env.accelerator == "rocm":
        assert tilelang.action == SKIP
        if fla.action != SKIP and env.switches.get("FLA_TILELANG") is None:
            assert ("FLA_TILELANG", "0") in fla.env
    causal = plan["causal-conv1d"]
    builds = [s for s in causal.steps if s.kind == "build"] if causal.acts else []
    if builds:
        # a source build only as FASTPATH_HOOKS_ALLOW_BUILD allows, with a compiler, for code that runs on every GPU
        assert chosen.allow_build != "0", causal
        assert env.hipcc if env.torch_hip else (env.nvcc and env.nvcc_version in (None, *[
            v for v in ("11.8", "12.8", "13.0") if v.split(".")[0] == env.torch_cuda.split(".")[0]])), causal
        archs = builds[0].archs
        if archs == ("all",):
            assert chosen.allow_build == "1"
        else:
            from fastpath_hooks.facts.wheels import pair_for

            assert all(pair_for(g, archs) for g in env.gpus), (archs, env.gpus)
        assert causal.expected_seconds is not None and causal.expected_seconds <= chosen.timeout
    if causal.acts and causal.rule in ("causal.cache", "causal.wheelhouse"):
        assert not builds and causal.steps[-1].kind == "wheel"
    if chosen.offline:
        for decision in plan.decisions.values():
            for step in decision.steps if decision.action in (INSTALL, REPAIR) else ():
                if step.kind == "kernel":
                    for raw in step.requirements:
                        name, _, version = raw.partition("==")
                        wheel = f"{name.replace('-', '_')}-{version}-"
                        assert any(w.startswith(wheel) for w in env.wheelhouse), (raw, env.wheelhouse)
