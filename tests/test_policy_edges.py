"""Policy and probe edge cases: an old fla without fla-core, satisfied deps, pre-release triton,
pip configuration, one-clause messages. Pure rows where the rule is the policy's (plain Environment values,
as in test_policy.py); real processes, real environment variables and real pip configuration
files where the fact is the probe's."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

from fastpath_hooks.decide import plan as commands, common

from fastpath_hooks.facts import probe as probe_mod
from fastpath_hooks.facts.distributions import canonical_name
from fastpath_hooks.facts.pins import PinsError, load
from fastpath_hooks.facts.host import pip_index_config
from fastpath_hooks.decide.plan import BLOCK, INSTALL, OK, REPAIR, SKIP
from fastpath_hooks.decide.policy import Commands
from fastpath_hooks.facts.settings import Settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support.venvs import clean_env  # noqa: E402
from test_policy import OFFLINE, PINS, ROCM, ROWS, make_env, plan_for  # noqa: E402

OLD_FLA = {"flash-linear-attention": "0.3.2"}   # before fla-core split off, this shipped `fla` itself
GOOD_PAIR = {"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"}


def dep_names(decision) -> set:
    return {canonical_name(Requirement(r).name) for s in decision.steps if s.kind == "deps" for r in s.requirements}


def depth(text: str) -> int:
    """How deeply parentheses nest in `text`."""
    level = deepest = 0
    for char in text:
        level += {"(": 1, ")": -1}.get(char, 0)
        deepest = max(deepest, level)
    return deepest


# -- 1: a flash-linear-attention without fla-core is an installed fla ----------------------------

def test_old_fla_without_fla_core_is_blocked_on_hopper_when_tilelang_is_unavailable():
    plan = plan_for(make_env(OLD_FLA), Settings(skip=frozenset({"tilelang"})))
    d = plan["fla"]
    assert (d.action, d.rule) == (BLOCK, "fla.hazard.block"), d.reason
    assert d.installed == OLD_FLA and d.on_failure == "block"


def test_old_fla_without_fla_core_is_replaced_forced_when_tilelang_can_be_had():
    d = plan_for(make_env(OLD_FLA))["fla"]
    assert (d.action, d.rule) == (REPAIR, "fla.repair"), d.reason
    assert "flash-linear-attention 0.3.2 without fla-core" in d.reason
    assert d.steps[-1].force and d.steps[-1].requirements == ("fla-core==0.6.0", "flash-linear-attention==0.6.0")
    assert d.needs == ("tilelang",) and d.on_failure == "block"


def test_old_fla_without_fla_core_is_replaced_without_the_hazard_too():
    d = plan_for(make_env(OLD_FLA, gpus=("sm_80",)))["fla"]
    assert (d.action, d.rule) == (REPAIR, "fla.repair") and d.steps[-1].force, d.reason
    assert d.on_failure == "proceed" and d.needs == ()


def test_old_fla_without_fla_core_and_no_wheels_is_blocked_as_unsafe():
    d = plan_for(make_env({**OLD_FLA, **GOOD_PAIR}), Settings(**OFFLINE))["fla"]
    assert (d.action, d.rule) == (BLOCK, "fla.unsafe.block"), d.reason
    assert "0.3.2" in d.reason


# -- 8 (policy half): deps the installed versions satisfy are not named ---------------------------

def test_tilelang_deps_drop_what_is_installed_and_good():
    env = make_env({"numpy": "2.2.6", "tqdm": "4.67.1", "typing-extensions": "4.15.0"})
    d = plan_for(env)["tilelang"]
    assert d.action == INSTALL
    names = dep_names(d)
    assert {"z3-solver", "cloudpickle", "ml-dtypes", "psutil", "torch-c-dlpack-ext"} <= names
    assert not names & {"numpy", "tqdm", "typing-extensions"}, names


def test_an_absent_or_too_old_dep_is_named():
    d = plan_for(make_env({"numpy": None, "tqdm": "4.0.0"}))["tilelang"]
    reqs = [r for s in d.steps if s.kind == "deps" for r in s.requirements]
    assert "numpy>=1.23.5" in reqs and "tqdm>=4.62.3" in reqs


def test_fla_needs_no_deps_step_when_einops_and_packaging_are_installed():
    d = plan_for(make_env(gpus=("sm_80",)))["fla"]
    assert d.action == INSTALL and [s.kind for s in d.steps] == ["kernel"]
    d = plan_for(make_env({"einops": None}, gpus=("sm_80",)))["fla"]
    assert dep_names(d) == {"einops"}


def test_a_fresh_plan_keeps_every_dep_for_the_new_machine():
    d = plan_for(make_env({"numpy": "2.2.6"}), fresh=True)["tilelang"]
    assert "numpy" in dep_names(d)


# -- 9: the hazard range fails closed on pre-releases ---------------------------------------------

@pytest.mark.parametrize("triton,inside", [
    ("3.7.1rc1", True), ("3.4.0rc1", True), ("3.4.0.dev0", True), ("3.7.1.dev20260101", True),
    ("3.6.0+git1234", True), ("3.6.0", True),
    ("3.7.1", False), ("3.7.1.post1", False), ("3.7.2rc1", False), ("3.3.1", False), ("3.3.9rc1", False),
])
def test_hopper_hazard_range_fails_closed_on_pre_releases(triton, inside):
    plan = plan_for(make_env(triton=triton))
    assert (plan["fla"].needs == ("tilelang",)) is inside, plan["fla"].reason
    assert (plan["tilelang"].action == INSTALL) is inside, plan["tilelang"].reason


# -- 14: pip's own index configuration keeps auto mode on pip ------------------------------------

UV = "/usr/bin/uv"


def test_auto_picks_pip_when_pip_is_configured_with_an_index():
    configured = make_env(uv=UV, pip_index_config="PIP_INDEX_URL")
    name, why = commands.installer_choice(Settings(), configured)
    assert name == "pip" == Commands.of(Settings(), configured, PINS).installer
    assert "PIP_INDEX_URL" in why and "uv" in why
    assert Commands.of(Settings(), make_env(uv=UV), PINS).installer == "uv"
    assert Commands.of(Settings(), make_env(pip_index_config=None), PINS).installer == "pip"   # no uv
    # fastpath-hooks' own index choice (or none at all) leaves uv nothing to get wrong
    assert Commands.of(Settings(**OFFLINE), configured, PINS).installer == "uv"
    assert Commands.of(Settings(index_url="https://mirror.example/simple"), configured, PINS).installer == "uv"
    # an explicit choice stands
    assert Commands.of(Settings(installer="uv"), configured, PINS).installer == "uv"


@pytest.mark.parametrize("settings, env, fix", [
    (Settings(), make_env(uv=None, pip=False), ("uv on PATH", "FASTPATH_HOOKS_INSTALLER=uv", "ensurepip")),
    (Settings(installer="uv"), make_env(uv=None, pip=True), ("uv on PATH", "ensurepip")),
    (Settings(installer="pip"), make_env(uv=UV, pip=False), ("ensurepip", "uv on PATH")),
])
def test_no_installer_that_can_run_is_none_with_the_fix(settings, env, fix):
    """A `uv venv` has no pip; without uv found nothing can install: no installer is promised."""
    name, why = commands.installer_choice(settings, env)
    assert name is None and all(part in why for part in fix), why
    assert len("fastpath-hooks: tilelang: not installed - " + why) <= 160


def test_pip_configuration_does_not_pick_a_pip_that_is_absent():
    assert commands.installer_choice(Settings(), make_env(uv=UV, pip=False, pip_index_config="PIP_INDEX_URL"))[0] == "uv"
    assert commands.installer_choice(Settings(), make_env(uv=None, pip=True))[0] == "pip"


def _conf(path, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
    return path


def test_pip_index_config_reads_variables_and_files_as_pip_does(tmp_path):
    home, xdg = str(tmp_path / "home"), str(tmp_path / "xdg")
    user = _conf(os.path.join(home, ".config", "pip", "pip.conf"), "[global]\nextra-index-url = https://in.example/simple\n")
    base = {"HOME": home, "XDG_CONFIG_DIRS": xdg}
    find = pip_index_config
    assert find({**base, "PIP_CONFIG_FILE": os.devnull}) is None                 # devnull: no files at all
    assert find({**base, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "https://in.example/simple"}) == "PIP_INDEX_URL"
    assert user in find(base) and "extra-index-url" in find(base)
    site = _conf(os.path.join(xdg, "pip", "pip.conf"), "[install]\nfind_links = /wheels\n")
    assert site in find({**base, "HOME": str(tmp_path)}) and "find-links" in find({**base, "HOME": str(tmp_path)})
    os.unlink(site)
    # a PIP_CONFIG_FILE that exists hides the user's files (as in pip); [download] does not apply to install
    custom = _conf(str(tmp_path / "custom.conf"), "[global]\ntimeout = 60\n[download]\nindex-url = https://x.example/\n")
    assert find({**base, "PIP_CONFIG_FILE": custom}) is None
    _conf(custom, "[global]\nindex-url = https://in.example/simple\n")
    assert find({**base, "PIP_CONFIG_FILE": custom}) == f"{custom} sets index-url"


def test_the_probe_records_pip_configuration_in_a_real_process():
    code = ("import json; from fastpath_hooks.facts.probe import probe; from fastpath_hooks.facts.settings import Settings\n"
            "print(json.dumps(probe(Settings()).to_json()['pip_index_config']))")
    run = lambda **env: json.loads(subprocess.run([sys.executable, "-c", code], env=clean_env(**env),  # noqa: E731
                                                  capture_output=True, text=True, timeout=60, check=True).stdout)
    assert run() is None
    assert run(PIP_FIND_LINKS="/somewhere") == "PIP_FIND_LINKS"


# -- 17: the wheelhouse is parsed once per decision ----------------------------------------------

def test_wheelhouse_is_parsed_once():
    env = make_env(wheelhouse=("fla_core-0.6.0-py3-none-any.whl", "causal_conv1d-1.6.2.post1.tar.gz", "junk.whl"))
    ctx = common.Context(env, Settings(), PINS, False)
    first = ctx.housed
    assert first is ctx.housed
    files, sdists = ({k: sorted(map(str, v)) for k, v in found.items()} for found in first)
    assert files == {"fla-core": ["0.6.0"], "causal-conv1d": ["1.6.2.post1"]} and sdists == {"causal-conv1d": ["1.6.2.post1"]}


# -- 18: one helper per duplicated fact --------------------------------------------------------

@pytest.mark.parametrize("entry,expected", [
    ("/srv/wheels", "/srv/wheels"),
    ("file:///srv/wheels", "/srv/wheels"),
    ("file://localhost/srv/wheels", "/srv/wheels"),
    ("file:///srv/my%20wheels", "/srv/my wheels"),
    ("~/wheels", os.path.expanduser("~/wheels")),
    ("https://example.org/wheels/", None),
    ("http://example.org/wheels/", None),
])
def test_find_links_entry_to_local_directory(entry, expected):
    from fastpath_hooks._names import find_links_dir

    assert find_links_dir(entry) == expected


def test_probe_lists_a_file_url_wheelhouse_as_the_installer_reads_it(tmp_path):
    house = tmp_path / "my wheels"
    house.mkdir()
    (house / "fla_core-0.6.0-py3-none-any.whl").write_text("x")
    url = "file://localhost" + str(house).replace(" ", "%20")
    env = probe_mod.probe(Settings(find_links=(url,)))
    assert env.wheelhouse == ("fla_core-0.6.0-py3-none-any.whl",)


def test_one_version_equality():
    from fastpath_hooks.facts.pins import same_version

    assert same_version("0.6", "0.6.0") and same_version("not a version", "not a version")
    assert not same_version("0.1.12", "0.1.12.post1")
    from fastpath_hooks.decide import builds, policy
    from fastpath_hooks.decide.policy import compiled, pair, pure

    assert not any(hasattr(m, "_same") for m in (policy, common, builds, compiled, pair, pure))


def test_the_probe_takes_triton_distribution_names_from_the_pins(tmp_path):
    site = tmp_path / "site"
    (site / "triton_nightly-3.8.0.dev1.dist-info").mkdir(parents=True)
    names = list(PINS.triton_distributions) + ["triton-nightly"]
    user = tmp_path / "pins.json"
    user.write_text(json.dumps({"triton_distributions": {"names": names},
                                "protected": {"distributions": list(PINS.protected) + ["triton-nightly"]}}))
    code = ("import json; from fastpath_hooks.facts.probe import probe; from fastpath_hooks.facts.pins import load\n"
            "from fastpath_hooks.facts.settings import Settings\n"
            f"env = probe(Settings(), pins=load({str(user)!r}))\n"
            "print(json.dumps([env.triton, env.triton_dist]))")
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(PYTHONPATH=str(site)), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["3.8.0.dev1", "triton-nightly"]


def test_a_triton_distribution_must_be_protected(tmp_path):
    user = tmp_path / "pins.json"
    user.write_text(json.dumps({"triton_distributions": {"names": ["triton", "triton-nightly"]}}))
    with pytest.raises(PinsError, match=r"triton_distributions.names.*triton-nightly.*protected"):
        load(str(user))


def test_a_posed_uv_is_never_run():
    assert Commands.of(Settings(), make_env(uv="posed"), PINS).uv is None
    assert Commands.of(Settings(), make_env(uv=None), PINS).uv is None
    assert Commands.of(Settings(), make_env(uv=UV), PINS).uv == UV


# -- 20: the pins decide which accelerators a kernel supports -------------------------------------

def test_a_kernel_the_pins_do_not_support_on_rocm_is_skipped():
    spec = dataclasses.replace(PINS.kernel("causal-conv1d"), accelerators=("cuda",))
    pins = dataclasses.replace(PINS, kernels={**PINS.kernels, "causal-conv1d": spec})
    d = plan_for(make_env(**ROCM), Settings(allow_build="1"), pins)["causal-conv1d"]
    assert (d.action, d.rule) == (SKIP, "skip.accelerator.rocm"), d.reason


# -- 21: the hazard message: short, the facts, what happens, the right fix -----------------------

def test_hazard_block_names_the_facts_and_tilelangs_own_fix():
    d = plan_for(make_env({"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}, nvcc=None))["fla"]
    assert (d.action, d.rule) == (BLOCK, "fla.hazard.block")
    assert d.reason == ("sm_90 + triton 3.6.0 computes fla's backward wrongly (fla#640), "
                        "and tilelang is unavailable: no nvcc")
    assert d.fix.startswith("install a CUDA toolkit") and "triton >= 3.7.1" in d.fix
    assert depth(d.reason) <= 1 and depth(d.fix) <= 1


@pytest.mark.parametrize("settings,dists,why,fix", [
    ({"skip": frozenset({"tilelang"})}, {}, "skipped by FASTPATH_HOOKS_SKIP", "remove tilelang from FASTPATH_HOOKS_SKIP"),
    (OFFLINE, {}, "offline", "fastpath-hooks download"),
    (OFFLINE, {"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.15.post2"},
     "apache-tvm-ffi 0.1.15.post2 is broken with tilelang 0.1.15", "fastpath-hooks download"),
])
def test_hazard_messages_say_why_tilelang_is_unavailable(settings, dists, why, fix):
    plan = plan_for(make_env({"fla-core": "0.6.0", "flash-linear-attention": "0.6.0", **dists}), Settings(**settings))
    d = plan["fla"]
    assert d.action == BLOCK and f"tilelang is unavailable: {why}" in d.reason, d.reason
    assert fix in d.fix and "triton >= 3.7.1" in d.fix, d.fix
    assert len(d.reason) < 200 and depth(d.reason) <= 1, d.reason


def test_the_blocked_import_says_it_in_one_short_line(tmp_path):
    target = "gpu=sm_90,cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=no,fla-core=0.6.0,flash-linear-attention=0.6.0"
    code = "from fastpath_hooks import engine; print(engine.ensure('fla').block)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=clean_env(FASTPATH_HOOKS_TARGET=target, FASTPATH_HOOKS_CACHE_DIR=str(tmp_path),
                                       FASTPATH_HOOKS_LOG="off"))
    assert out.returncode == 0, out.stderr
    message = out.stdout.strip()
    assert message == ("fastpath-hooks blocked `import fla`: sm_90 + triton 3.6.0 computes fla's backward wrongly "
                       "(fla#640), and tilelang is unavailable: no nvcc; using transformers' torch path. "
                       "Fix: install a CUDA toolkit matching torch or point CUDA_HOME at one; "
                       "or use triton >= 3.7.1 with a torch that ships it."), message


# -- 22: wording ---------------------------------------------------------------------------------

def test_a_rocm_torch_without_a_device_is_not_called_cuda_or_xpu():
    plan = plan_for(make_env(**{**ROCM, "gpus": ()}, gpu_source="none: torch.cuda.is_available() is False"))
    assert plan.notes[0].startswith("no ROCm accelerator: torch 2.10.0 (ROCm 6.4) sees no device"), plan.notes


def _wrapped_reasons(row) -> list:
    """The reasons the engine wraps: an acting or good decision's, `installing X (reason)`, `ready (reason; ...)`."""
    plan = plan_for(make_env(row.dists, **row.env), dataclasses.replace(Settings(), **row.settings), row.pins or PINS)
    return [d.reason for d in plan.decisions.values() if d.action in (OK, INSTALL, REPAIR)]


WRAPPING_ROWS = [r for r in ROWS if _wrapped_reasons(r)]   # a row that only skips or blocks would check nothing


@pytest.mark.parametrize("row", WRAPPING_ROWS, ids=[r.id for r in WRAPPING_ROWS])
def test_reasons_do_not_nest_parentheses_when_wrapped(row):
    for reason in _wrapped_reasons(row):
        assert depth(f"ready ({reason}; done by another process)") <= 1, reason
