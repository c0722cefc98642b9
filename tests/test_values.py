"""True values (#10): what the pins, the probe and the policy return cannot be changed.

`pins.load()` is cached and shared by every caller in a process, so one caller's
`pins.load().causal_release.sha256.clear()` used to switch sha256 checking off for the rest of it.
The walker below visits every reachable field, property, key and item of the loaded pins, a probed
Environment, a Plan, an install result and a built wheel, and tries every mutation it knows on each: a field added later is covered
without touching this file, and a new type of value fails here until it is known to be read-only.
Also: the enums for actions, failure modes, step kinds, outcome states and event severities are their old strings to JSON,
comparisons and callbacks, and versions/requirements are parsed once where the values are made."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from fastpath_hooks import events
from fastpath_hooks.decide.plan import Action, Decision, OnFailure, Step, StepKind
from fastpath_hooks.decide.policy import decide
from fastpath_hooks.engine.outcome import BAD, CHANGED, GOOD, Outcome, OutcomeState
from fastpath_hooks.facts import pins as pins_module
from fastpath_hooks.facts.frozen import FrozenMap, FrozenSpecifierSet, freeze, thaw
from fastpath_hooks.facts.probe import probe
from fastpath_hooks.facts.settings import Settings

LEAVES = (str, int, float, bool, bytes, type(None))
MUTATING_METHODS = {          # method -> arguments that would succeed on the mutable twin
    "clear": (), "pop": (0,), "popitem": (), "update": ({},), "setdefault": ("x", 1), "append": (1,),
    "extend": ((1,),), "insert": (0, 1), "remove": (1,), "sort": (), "reverse": (), "add": (1,),
    "discard": (1,),
}
HOPPER = ("gpu=sm_90,cuda=13.0,torch=2.11.0,triton=3.6.0,nvcc=13.0,python=3.12.3,glibc=2.35,"
          "transformers=5.24.0,tilelang=0.1.15,apache-tvm-ffi=0.1.0")


def _refuses(action, what: str) -> None:
    try:
        action()
    except (AttributeError, TypeError, dataclasses.FrozenInstanceError):
        return
    pytest.fail(f"{what} changed a value that must be read-only")


def assert_read_only(value, path: str = "value", seen: set | None = None) -> int:
    """Walk `value` and try to change everything reachable; returns how many values were visited."""
    seen = set() if seen is None else seen
    if isinstance(value, LEAVES) or id(value) in seen:
        return 1
    seen.add(id(value))
    if isinstance(value, (list, dict, set, bytearray)):
        pytest.fail(f"{path} is a mutable {type(value).__name__}")
    count = 1
    for name, args in MUTATING_METHODS.items():
        method = getattr(value, name, None)
        if callable(method):
            _refuses(lambda: method(*args), f"{path}.{name}()")

    if isinstance(value, Version):
        for name in ("release", "major", "local", "public"):
            _refuses(lambda: setattr(value, name, None), f"{path}.{name} = ...")
        return count
    if isinstance(value, SpecifierSet):
        assert isinstance(value, FrozenSpecifierSet), f"{path} is a plain SpecifierSet (prereleases can be switched)"
        _refuses(lambda: setattr(value, "prereleases", True), f"{path}.prereleases = True")
        for i, spec in enumerate(value):
            _refuses(lambda: setattr(spec, "prereleases", True), f"{path}[{i}].prereleases = True")
        return count
    if isinstance(value, Mapping):
        assert isinstance(value, FrozenMap), f"{path} is a {type(value).__name__}, not a FrozenMap"
        _refuses(lambda: value.__setitem__("x", 1), f"{path}['x'] = 1")
        for key in list(value):
            _refuses(lambda: value.__setitem__(key, None), f"{path}[{key!r}] = None")
            _refuses(lambda: value.__delitem__(key), f"del {path}[{key!r}]")
            count += assert_read_only(key, f"{path} key {key!r}", seen)
            count += assert_read_only(value[key], f"{path}[{key!r}]", seen)
        return count
    if isinstance(value, (tuple, frozenset)):
        if isinstance(value, tuple) and value:
            _refuses(lambda: value.__setitem__(0, None), f"{path}[0] = None")
        for i, item in enumerate(value):
            count += assert_read_only(item, f"{path}[{i}]", seen)
        return count
    if dataclasses.is_dataclass(value):
        assert type(value).__dataclass_params__.frozen, f"{path}: {type(value).__name__} is not a frozen dataclass"
        _refuses(lambda: setattr(value, "added_later", 1), f"{path}.added_later = 1")
        names = {f.name for f in dataclasses.fields(value)}
        names |= {n for n in dir(value) if not n.startswith("_") and not callable(getattr(value, n))}
        for name in sorted(names):
            _refuses(lambda: setattr(value, name, None), f"{path}.{name} = None")
            _refuses(lambda: delattr(value, name), f"del {path}.{name}")
            count += assert_read_only(getattr(value, name), f"{path}.{name}", seen)
        return count
    pytest.fail(f"{path}: a {type(value).__name__} is not known to be read-only; freeze it (facts/frozen.py) "
                "or teach this walker why it is")


def _settings(target: str, **extra) -> Settings:
    return Settings.from_env({"FASTPATH_HOOKS_TARGET": target, **extra})


def test_the_loaded_pins_are_read_only_all_the_way_down():
    pins = pins_module.load()
    assert assert_read_only(pins, "pins") > 200


def test_a_user_pins_file_is_frozen_too(tmp_path):
    user = tmp_path / "pins.json"
    user.write_text(json.dumps({"yanked": {"einops": ["0.0.1"]}, "kernels": {"causal-conv1d": {"release": {
        "sha256": {"some.whl": "0" * 64}}}}}))
    pins = pins_module.load(str(user))
    assert pins.yanked["einops"] == ("0.0.1",)
    assert_read_only(pins, "user pins")


def test_clearing_the_shared_pins_sha256_raises_and_changes_nothing():
    pins = pins_module.load()
    before = dict(pins.release("causal-conv1d").sha256)
    with pytest.raises(AttributeError):
        pins.release("causal-conv1d").sha256.clear()
    with pytest.raises(TypeError):
        pins.release("causal-conv1d").sha256["x.whl"] = "0" * 64
    with pytest.raises(AttributeError):
        pins.kernel("fla").torch.prereleases = True
    assert pins_module.load() is pins and dict(pins_module.load().release("causal-conv1d").sha256) == before


@pytest.mark.parametrize("target", [HOPPER, "gpu=gfx942,hip=6.4,torch=2.9.1,triton=3.5.1",
                                    "gpu=none,torch=none"])
def test_a_probed_environment_is_read_only(target):
    env = probe(_settings(target))
    assert env.posed  # the facts came from the target spec
    visited = assert_read_only(env, "env")
    assert visited > len(env.distributions)
    replaced = dataclasses.replace(env, distributions={"x": "1"}, gpus=["sm_80"])  # a caller's dict stays its own
    assert isinstance(replaced.distributions, FrozenMap) and replaced.gpus == ("sm_80",)
    assert_read_only(replaced, "replaced env")


def test_a_plan_its_decisions_and_steps_are_read_only():
    settings = _settings(HOPPER)
    env = probe(settings)
    plan = decide(env, settings, pins_module.load())
    assert any(d.steps for d in plan.decisions.values()), "the walk must reach real steps"
    assert_read_only(plan, "plan")
    fresh = decide(env, settings, pins_module.load(), fresh=True)
    assert_read_only(fresh, "fresh plan")


def test_install_results_and_built_wheels_are_read_only():
    """What the installer and a source build hand back (shared by the engine, the cache's sidecar)."""
    from fastpath_hooks.act.build import Built
    from fastpath_hooks.act.installer import InstallResult

    changed = {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}
    result = InstallResult("fla", changed, 1.5, "uv", ("fla",))
    changed["einops"] = "0.8.1"   # the caller's dict stays its own
    assert dict(result.installed) == {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}
    assert_read_only(result, "install result")
    key = {"distribution": "causal-conv1d", "version": "1.6.2.post1", "cuda": "13.0", "archs": ["sm_90"]}
    built = Built(path="/w/x.whl", log="/w/x.log", seconds=90.0, key=key)
    assert_read_only(built, "built")
    assert json.loads(json.dumps(thaw(built.key))) == key   # the cache's sidecar gets the same JSON


def test_json_output_is_unchanged_by_the_frozen_values():
    settings = _settings(HOPPER)
    env = probe(settings)
    data = env.to_json()
    assert type(data["distributions"]) is dict and type(data["gpus"]) is list
    assert data["distributions"] == dict(env.distributions)
    assert {"platform", "accelerator", "torch_build"} <= set(data)
    assert {f.name for f in dataclasses.fields(env)} <= set(data)
    text = json.dumps(decide(env, settings, pins_module.load()).to_json())
    back = json.loads(text)
    actions = {d["kernel"]: d["action"] for d in back["decisions"]}
    assert set(actions.values()) <= {a.value for a in Action}
    assert all(d["on_failure"] in ("proceed", "block") for d in back["decisions"])


def test_freeze_and_thaw_round_trip():
    raw = {"a": [1, {"b": {2, 3}}], "s": SpecifierSet(">=1,<2", prereleases=True)}
    frozen = freeze(raw)
    assert frozen == {"a": (1, {"b": frozenset({2, 3})}), "s": SpecifierSet(">=1,<2", prereleases=True)}
    assert isinstance(frozen["s"], FrozenSpecifierSet) and frozen["s"].prereleases is True
    assert hash(freeze({"x": (1, 2)})) == hash(freeze({"x": [1, 2]}))
    assert thaw(frozen["a"]) == [1, {"b": [2, 3]}]
    raw["a"].append(4)  # the frozen copy does not follow its source
    assert frozen["a"] == (1, {"b": frozenset({2, 3})})
    import pickle

    assert pickle.loads(pickle.dumps(frozen)) == frozen


# -- enums --------------------------------------------------------------------------------

def test_actions_and_failure_modes_are_their_strings():
    assert [str(a) for a in Action] == ["ok", "install", "repair", "skip", "block"]
    assert Action.SKIP == "skip" and f"{Action.REPAIR}" == "repair" and json.dumps(Action.OK) == '"ok"'
    decision = Decision(kernel="fla", action="skip", reason="r", rule="x", on_failure="block")  # old strings
    assert decision.action is Action.SKIP and decision.on_failure is OnFailure.BLOCK
    assert json.loads(json.dumps(decision.to_json()))["on_failure"] == "block"
    with pytest.raises(ValueError):
        Decision(kernel="fla", action="later", reason="r", rule="x")


def test_step_kinds_are_their_strings():
    assert [str(k) for k in StepKind] == ["deps", "kernel", "replace", "wheel", "build"]
    step = Step(kind="build", requirements=("causal-conv1d==1.6.2.post1",))   # an old string
    assert step.kind is StepKind.BUILD and f"{step.kind}" == "build"
    assert json.loads(json.dumps(step.to_json()))["kind"] == "build"
    assert dataclasses.replace(step, kind="wheel", requirements=("x-1.0-py3-none-any.whl",)).kind is StepKind.WHEEL
    with pytest.raises(ValueError):
        Step(kind="download", requirements=("x",))


def test_outcome_states_are_their_strings():
    assert [str(s) for s in OutcomeState] == ["ok", "installed", "repaired", "skipped", "blocked", "failed",
                                              "reported", "error", "pending"]
    outcome = Outcome("fla", "installed", "r")   # an old string
    assert outcome.state is OutcomeState.INSTALLED and outcome.state in GOOD and outcome.state in CHANGED
    assert f"fla: {outcome.state}" == "fla: installed" and json.dumps({"state": outcome.state}) == '{"state": "installed"}'
    assert repr(outcome) == "Outcome(kernel='fla', state='installed', reason='r', block=None)"
    assert {OutcomeState.FAILED, OutcomeState.ERROR, OutcomeState.BLOCKED} == set(BAD) and not set(BAD) & set(GOOD)
    with pytest.raises(ValueError):
        Outcome("fla", "done", "r")


def test_event_types_are_severities_and_plain_strings_to_callbacks(monkeypatch):
    got = []
    events.add_listener(got.append)
    try:
        events.status("a status", "fla", human=False)
        events.warning("a warning", human=False)
        events.debug("a debug line")
    finally:
        events.clear_listeners()
    assert [e["type"] for e in got] == ["status", "warning", "status"]
    assert all(isinstance(e["type"], events.Severity) for e in got)
    assert json.loads(json.dumps(got[1]))["type"] == "warning"
    with pytest.raises(ValueError):
        events.emit("loud", "no such severity", human=False)


# -- parsed once ---------------------------------------------------------------------------

def test_environment_versions_are_parsed_once():
    env = probe(_settings(HOPPER))
    assert env.torch_version == Version("2.11.0") and env.triton_version == Version("3.6.0")
    assert env.python_version == Version("3.12.3") and env.glibc_version == Version("2.35")
    assert env.cuda_version == Version("13.0")
    assert env.torch_version is env.torch_version           # computed once, then the same object
    assert env.dist_version("Transformers") == Version("5.24.0")
    assert env.dist_version("tilelang") is env.dist_version("tilelang")
    assert env.dist_version("no-such-distribution") is None
    unreadable = dataclasses.replace(env, torch="2.11-local-build")   # a dist-info can carry any string
    assert unreadable.torch_version is None and unreadable.torch == "2.11-local-build"


def test_steps_carry_their_requirements_parsed():
    step = Step(kind="kernel", requirements=("fla_core==0.6.0", "einops>=0.7; python_version>'3'"))
    assert step.names == ("fla-core", "einops")
    assert dict(step.exact) == {"fla-core": "0.6.0"}
    assert str(step.wants[1].specifier) == ">=0.7"
    wheel = Step(kind="wheel", requirements=("causal_conv1d-1.6.2.post1+cu13torch2.10cxx11abiTRUE-cp312-cp312-"
                                             "linux_x86_64.whl",))
    assert wheel.names == ("causal-conv1d",) and wheel.exact["causal-conv1d"].startswith("1.6.2.post1+")
    narrowed = dataclasses.replace(step, requirements=("einops",))   # derived again, never stale
    assert narrowed.names == ("einops",) and not narrowed.exact
    assert "wants" not in step.to_json()  # the JSON schema is unchanged
