"""One kernel registry, in the data: each kernel's pins entry says its kind, modules, aliases, gates,
mirror variable, what it is used with or serves and its rule prefix, and every list of kernels in the
package is derived from it - the start-up path's literal index too (proved equal to pins.json here).
A FASTPATH_HOOKS_PINS file adds a kernel the same way: a stand-in pure-wheel kernel and a stand-in
compiled one are known to the settings, the target, the pins, the policy (their own table rows),
the hooks and the CLI by the file alone. (The real venvs that install them: tests/test_user_kernels.py.)
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest

from fastpath_hooks import _names, _registry
from fastpath_hooks.decide import messages as rule_ids
from fastpath_hooks.decide.transformers import era
from fastpath_hooks.decide.plan import BLOCK, INSTALL, OK, SKIP
from fastpath_hooks.facts import pins as pins_mod
from fastpath_hooks.facts.settings import Settings, SettingsError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support.venvs import clean_env  # noqa: E402
from test_policy import make_env, plan_for  # noqa: E402

DECIDE = os.path.join(os.path.dirname(os.path.dirname(pins_mod.__file__)), "decide")

# A stand-in pure-Python kernel (tests/test_user_kernels.py builds its wheel): gate-free, its own module.
FOO_ATTN = {
    "kind": "pure", "modules": ["foo_attn"], "distributions": ["foo-attn"], "aliases": ["foo_attn", "fooattn"],
    "rule_prefix": "foo", "python": ">=3.10", "torch": ">=2.5", "accelerators": ["cuda"],
    "platforms": ["linux-x86_64", "linux-aarch64"], "runtime_deps": ["packaging"],
    "verify": {"modules": ["foo_attn"], "attributes": ["foo_attn:attend"]},
    "source": "measured: a stand-in kernel of the tests",
    "releases": [
        {"version": "1.1.0", "torch": ">=2.8", "triton": "", "transformers": "", "source": "measured: test"},
        {"version": "1.0.0", "torch": ">=2.6", "triton": "", "transformers": "", "source": "measured: test"},
    ],
}
# A stand-in compiled kernel (tests/support/sdists.py foo_conv_sdist): no release wheels, a source build.
FOO_CONV = {
    "kind": "compiled", "modules": ["foo_conv"], "distributions": ["foo-conv"], "aliases": ["foo_conv"],
    "gates": ["is_foo_conv_available"], "mirror": "FASTPATH_HOOKS_FOO_CONV_WHEEL_URL", "rule_prefix": "fooconv",
    "python": ">=3.9", "torch": ">=2.6", "accelerators": ["cuda", "rocm"], "platforms": ["linux-x86_64", "linux-aarch64"],
    "runtime_deps": ["packaging"], "verify": {"modules": ["foo_conv"], "attributes": ["foo_conv:foo_conv_fn"]},
    "source": "measured: a stand-in compiled kernel of the tests",
    "source_build": {
        "requirement": "foo-conv==0.1.0", "env": {"FOO_CONV_FORCE_BUILD": "TRUE"}, "rocm_env": {"FOO_CONV_FORCE_BUILD": "TRUE"},
        "build_deps": {"requirements": ["wheel", "ninja", "packaging"], "source": "upstream: its setup.py"},
        "measured": {"seconds": 40, "archs": 1, "cores": 16, "source": "measured: a stand-in"},
        "cuda_archs": {"pairs": {"sm_75": "", "sm_80": "", "sm_87": "", "sm_90": ">=11.8", "sm_100": ">=12.8",
                                 "sm_120": ">=12.8", "sm_103": ">=13.0", "sm_110": ">=13.0", "sm_121": ">=13.0"},
                       "source": "upstream: its setup.py (tests/support/sdists.py foo_conv_sdist) hard-codes these"},
        "source": "upstream: a stand-in whose setup.py compiles with the nvcc it is given",
    },
}
# A stand-in backend of fla (a kernel fla would dispatch to by itself): decided by the backend rules alone.
FOO_QLA = {
    "kind": "backend", "modules": ["foo_qla"], "distributions": ["foo-qla"], "serves": ["fla"], "with": ["tilelang"],
    "rule_prefix": "fooqla", "switch": {"variable": "FLA_FOO_QLA", "off": "0", "source": "measured: a stand-in"},
    "python": ">=3.10", "torch": ">=2.8", "accelerators": ["cuda"], "platforms": ["linux-x86_64"], "needs_nvcc": True,
    "verify": {"modules": ["foo_qla"], "attributes": []}, "source": "measured: a stand-in backend of the tests",
    "archs": {"train": ["sm_90"], "source": "measured: test"},
    "head_dims": {"k": [64], "v": [64], "source": "measured: test"},
    "pays": {"hazard": True, "elsewhere": False, "source": "measured: test"},
    "releases": [{"version": "0.2.0", "torch": ">=2.8", "triton": "", "transformers": "", "with": {"tilelang": ">=0.1.12"},
                  "source": "measured: test"}],
}


def user_pins(tmp_path, **kernels) -> str:
    path = tmp_path / "user-pins.json"
    path.write_text(json.dumps({"kernels": {name.replace("_", "-"): entry for name, entry in kernels.items()}}))
    return str(path)


# -- the index is the data ---------------------------------------------------------------------------

TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "registry_index.py")


def run_index_tool(*args, root=None):
    argv = [sys.executable, TOOL, *args] + (["--root", str(root)] if root else [])
    return subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=60)


def test_the_generated_index_is_fresh():
    """_registry.REGISTRY, _names' kernel names and hooks/startup.py's watched names are generated from
    pins.json (read by install() and the gates without parsing it). After changing a kernel there, run
    `python tools/registry_index.py`."""
    result = run_index_tool("--check")
    assert result.returncode == 0, result.stderr
    reg = _registry.REGISTRY
    assert set(_registry.KEYS) == set(next(iter(reg.values())))
    assert (_names.KERNELS, _names.KERNEL_MODULES, _names.SERVES, _names.WATCHED) == (
        _registry.listed(reg), _registry.kernel_modules(reg), _registry.served_modules(reg), _registry.watched_modules(reg))


def test_a_kernel_added_to_pins_json_reaches_the_index_through_the_tool(tmp_path):
    """A copy of the package with a new shipped kernel in its pins.json: the check fails and names the
    stale files; the tool writes them; the copy's index, names and stand-in then know the kernel."""
    import shutil

    root = tmp_path / "repo"
    shutil.copytree(os.path.dirname(os.path.dirname(pins_mod.__file__)), root / "fastpath_hooks",
                    ignore=shutil.ignore_patterns("__pycache__"))
    pins_path = root / "fastpath_hooks" / "facts" / "pins.json"
    data = json.loads(pins_path.read_text())
    data["kernels"]["foo-attn"] = FOO_ATTN
    pins_path.write_text(json.dumps(data))
    stale = run_index_tool("--check", root=root)
    assert stale.returncode == 1
    assert "_registry.py" in stale.stderr and "_names.py" in stale.stderr and "startup.py" in stale.stderr
    assert run_index_tool(root=root).returncode == 0
    assert run_index_tool("--check", root=root).returncode == 0
    code = ("from fastpath_hooks import _names, _registry; from fastpath_hooks.hooks import activation;"
            "print(_registry.REGISTRY['foo-attn']['kind'], _names.KERNEL_MODULES['foo_attn'], 'foo-attn' in _names.KERNELS,"
            " 'foo_attn' in open(activation.STARTUP_FILE).read())")
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(), cwd=root, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == ["pure", "foo-attn", "True", "True"], out.stderr


def test_every_derived_list_follows_the_index():
    """The lists that used to be written out by hand, read back from the registry."""
    from fastpath_hooks.facts.settings import KERNEL_ALIASES, KERNELS, VARIABLES
    from fastpath_hooks.hooks import gates, late as late_layouts

    assert KERNELS == ("fla", "causal-conv1d", "mamba-ssm", "flash-attn", "flash-attn-3", "tilelang",
                       "flash-qla")   # what models use, then what serves them
    assert KERNEL_ALIASES == {"fla": "fla", "flash-linear-attention": "fla", "fla-core": "fla", "tilelang": "tilelang",
                              "causal-conv1d": "causal-conv1d", "causal_conv1d": "causal-conv1d",
                              "mamba-ssm": "mamba-ssm", "mamba_ssm": "mamba-ssm", "flash-qla": "flash-qla",
                              "flash_qla": "flash-qla", "flashqla": "flash-qla", "flash-attn": "flash-attn",
                              "flash_attn": "flash-attn", "fa2": "flash-attn", "flash-attention-2": "flash-attn",
                              "flash-attn-3": "flash-attn-3", "flash_attn_3": "flash-attn-3", "fa3": "flash-attn-3",
                              "flash-attention-3": "flash-attn-3"}
    assert [v for v in VARIABLES if v.endswith("_WHEEL_URL")] == ["FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL",
                                                                  "FASTPATH_HOOKS_MAMBA_SSM_WHEEL_URL",
                                                                  "FASTPATH_HOOKS_FLASH_ATTN_WHEEL_URL"]
    assert _names.WATCHED == {"fla", "tilelang", "causal_conv1d", "mamba_ssm", "flash_qla", "flash_attn", "flash_attn_3",
                              "flash_attn_interface", "transformers.utils.import_utils",
                              "transformers.integrations.hub_kernels", "transformers.masking_utils"}
    assert _names.SERVES == {"tilelang": ("fla",), "flash_qla": ("fla",)}
    assert gates.gate_table(_registry.REGISTRY) == {"is_flash_linear_attention_available": ("fla",), "is_causal_conv1d_available": ("causal-conv1d",),
                           "is_mamba_ssm_available": ("mamba-ssm", "causal-conv1d"),
                           "is_mamba_2_ssm_available": ("mamba-ssm", "causal-conv1d"),
                           "is_flash_attn_2_available": ("flash-attn",), "is_flash_attn_3_available": ("flash-attn-3",)}
    assert late_layouts.gates() == {"fla": "is_flash_linear_attention_available", "causal_conv1d": "is_causal_conv1d_available",
                                  "mamba_ssm": "is_mamba_ssm_available", "flash_attn": "is_flash_attn_2_available",
                                  "flash_attn_interface": "is_flash_attn_3_available"}
    pins = pins_mod.load()
    assert pins.decision_order == ("tilelang", "fla", "causal-conv1d", "mamba-ssm", "flash-attn", "flash-attn-3",
                                   "flash-qla")
    assert {k: s.rule_prefix for k, s in pins.kernels.items()} == {"fla": "fla", "tilelang": "tilelang",
                                                                  "causal-conv1d": "causal", "mamba-ssm": "mamba",
                                                                  "flash-attn": "fa2", "flash-attn-3": "fa3",
                                                                  "flash-qla": "qla"}


def test_a_circle_of_kernels_is_refused(tmp_path):
    """Each kernel is decided after the ones it names: a circle has no order."""
    tilelang_with_fla = {"with": ["mamba-ssm"]}
    with pytest.raises(pins_mod.PinsError, match="make a circle"):
        pins_mod.load(user_pins(tmp_path, tilelang={**tilelang_with_fla}, mamba_ssm={"imports_optional": ["tilelang"]}))


@pytest.mark.parametrize("entry,where,fragment", [
    ({"kind": "pure"}, "kernels.bar", "needs at least `kind`"),
    ({**FOO_ATTN, "kind": "wheel"}, "kernels.bar.kind", "expected one of pure, pair, compiled"),
    ({**FOO_ATTN, "modules": ["foo.attn"]}, "kernels.bar.modules[0]", "a top-level module name"),
    ({**FOO_ATTN, "modules": ["fla"]}, "kernels.bar", "module 'fla' is also fla's"),
    ({**FOO_ATTN, "aliases": ["fla-core"]}, "kernels.bar", "name 'fla-core' is also fla's"),
    ({**FOO_ATTN, "rule_prefix": "mamba"}, "kernels.bar", "rule prefix 'mamba' is also mamba-ssm's"),
    ({**FOO_ATTN, "distributions": ["torch"]}, "kernels.bar.distributions", "torch is protected"),
    ({**FOO_ATTN, "mirror": "FOO_URL"}, "kernels.bar.mirror", "a compiled kernel's"),
    ({**FOO_ATTN, "pairs": []}, "kernels.bar.pairs", "only a pair kernel has pairs"),
    ({**FOO_CONV, "source_build": None, "rule_prefix": "b"}, "kernels.bar.source_build", "expected a table"),
    ({k: v for k, v in FOO_CONV.items() if k != "source_build"}, "kernels.bar.source_build", "needs its source build"),
    ({**FOO_QLA, "serves": []}, "kernels.bar.serves", "a backend kernel serves another kernel"),
    ({k: v for k, v in FOO_QLA.items() if k != "switch"}, "kernels.bar.switch", "its import is never blocked"),
    ({**FOO_ATTN, "archs": FOO_QLA["archs"]}, "kernels.bar.archs", "only a backend kernel has archs"),
    ({**FOO_QLA, "archs": {"train": ["hopper"], "source": "measured: x"}}, "kernels.bar.archs.train[0]", "expected sm_XY"),
    ({**FOO_QLA, "releases": [{**FOO_QLA["releases"][0], "with": {"fla": ">=0.6"}}]}, "kernels.bar.releases[0].with.fla",
     "expected a kernel of its `with` (tilelang)"),
    ({**FOO_ATTN, "warm": {"check_seq": 0, "heads": [1, 1], "dims": [64, 64], "source": "measured: x"}},
     "kernels.bar.warm.check_seq", "expected a positive integer"),
    ({**FOO_ATTN, "jit_caches": {"triton": "x"}}, "kernels.bar.jit_caches.triton", "an environment variable name"),
    # a backend is never blocked, so it has no numeric checks (its check is against the served kernel's own path)
    ({**FOO_QLA, "numeric_checks": []}, "kernels.bar.numeric_checks", "only a pure or compiled or pair kernel has"),
])
def test_a_malformed_new_kernel_names_the_entry(tmp_path, entry, where, fragment):
    with pytest.raises(pins_mod.PinsError) as info:
        pins_mod.load(user_pins(tmp_path, bar=entry))
    assert info.value.entry == where and fragment in info.value.message, str(info.value)


def test_a_shipped_kernels_modules_are_fixed(tmp_path):
    with pytest.raises(pins_mod.PinsError, match="modules are fixed"):
        pins_mod.load(user_pins(tmp_path, fla={"modules": ["fla", "fla2"]}))


# -- the start-up stand-in's literal -------------------------------------------------------------------

def test_enable_writes_the_user_kernels_modules_into_the_stand_in(tmp_path):
    """The shipped hooks/startup.py holds the shipped index's modules (tests/test_startup_handover.py); what
    `enable` writes with a FASTPATH_HOOKS_PINS file set also watches the modules of the kernels it adds."""
    from fastpath_hooks.hooks import activation

    code = "from fastpath_hooks.hooks import activation; print(activation.startup_source())"
    plain = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, check=True).stdout
    with_user = subprocess.run([sys.executable, "-c", code], env=clean_env(FASTPATH_HOOKS_PINS=user_pins(tmp_path, foo_attn=FOO_ATTN)),
                               capture_output=True, text=True, check=True).stdout

    def watched(text):
        line = next(li for li in text.splitlines() if li.endswith(activation.WATCHED_MARK))
        return ast.literal_eval(line.split("frozenset(")[-1].strip().rstrip(activation.WATCHED_MARK).rstrip(")") + ")")

    assert set(watched(plain)) == _names.WATCHED
    assert set(watched(with_user)) == _names.WATCHED | {"foo_attn"}


# -- one transformers era ----------------------------------------------------------------------------------

ERAS = [("4.57.6", "A"), ("4.56.2", "A"), ("5.0.0", "B"), ("5.0.0rc1", "B"), ("5.14.2", "B"), ("5.15.0", "C"),
        ("5.15.0rc1", "C"), ("5.15.0.dev0", "C"), ("5.24.0", "C"), ("5.25.0", "D"), ("5.25.0rc1", "D"), ("6.0.0", "D"), ("3.9.0", None), ("?", None),
        ("", None)]


@pytest.mark.parametrize("version,expected", ERAS)
def test_one_transformers_era_for_the_policy_the_report_and_the_late_pass(version, expected, monkeypatch):
    """decide/transformers.py is the one answer: the late pass (reading the imported transformers' __version__),
    the policy and the doctor report (reading the installed distribution) agree on every version -
    pre-releases are their release's era (5.15.0rc1 carries 5.15's code)."""
    from fastpath_hooks import report
    from fastpath_hooks.hooks import late

    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(__version__=version))
    assert late.transformers_era() == expected
    env = make_env({"transformers": version or None})
    assert era(env.dist_version("transformers")) == era(version) == expected
    plan = plan_for(env)
    doctor = report.doctor_json(plan, Settings(), pins=pins_mod.load(), activation={}, verdicts={}, real_installed={})
    assert doctor["transformers_era"] == expected
    uses = plan["causal-conv1d"].transformers_uses
    if expected is not None:
        assert f"(era {expected})" in uses, uses


# -- rule ids declared once ----------------------------------------------------------------------------------

def _suffixes(path: str):
    """(suffix or f-string template, line) of every rule id a rules module makes: ctx.rule(kernel, S),
    ctx.skip(kernel, S, ...) and the shared rules' skip(S, ...)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
        if name in ("rule", "skip") and len(node.args) >= 2 and isinstance(node.func, ast.Attribute):
            arg = node.args[1]
        elif name == "skip" and isinstance(node.func, ast.Name) and node.args:
            arg = node.args[0]
        else:
            continue
        if isinstance(arg, ast.Name) and arg.id == "suffix":
            continue   # the helpers that pass a suffix on (Context.skip, shared_skip's skip)
        if isinstance(arg, ast.Constant):
            yield arg.value, node.lineno
        elif isinstance(arg, ast.JoinedStr):
            yield "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in arg.values), node.lineno
        elif isinstance(arg, ast.IfExp):
            for branch in (arg.body, arg.orelse):
                assert isinstance(branch, ast.Constant), ast.unparse(arg)
                yield branch.value, node.lineno
        else:
            raise AssertionError(f"{path}:{node.lineno}: a rule id from {ast.unparse(arg)}: make it a literal")


def _matches(made: str, templates) -> bool:
    import re

    for template in templates:
        pattern = re.escape(template)
        pattern = re.sub(r"\\\{[a-z]+\\\}", "[a-z0-9_-]+", pattern)
        made_pattern = re.escape(made).replace(r"\{\}", "[a-z0-9_-]+")
        if re.fullmatch(pattern, made.replace("{}", "x")) or re.fullmatch(made_pattern, template):
            return True
    return False


@pytest.mark.parametrize("module,table", [("policy/pure.py", rule_ids.PURE), ("policy/pair.py", rule_ids.PAIR),
                                          ("policy/compiled.py", rule_ids.COMPILED), ("builds.py", rule_ids.COMPILED),
                                          ("common.py", {**rule_ids.SHARED, **rule_ids.PURE, **rule_ids.COMPILED})])
def test_every_rule_id_a_rules_module_makes_is_declared(module, table):
    """Read from the source, so a path no row reaches is checked too (rule_ids.rule_id also refuses an
    undeclared id at run time); the rows of tests/test_policy.py show every declared id is reached."""
    made = list(_suffixes(os.path.join(DECIDE, module)))
    assert made, module
    for suffix, line in made:
        assert _matches(suffix, table), f"decide/{module}:{line}: {suffix!r} is not declared in decide/messages.py"


def test_the_engine_reads_severity_and_needs_from_the_table_not_the_text():
    pins = pins_mod.load()
    warning = rule_ids.lookup(pins, "causal.no-nvcc")
    assert warning.severity == "warning" and rule_ids.lookup(pins, "causal.build").severity == "status"
    assert rule_ids.lookup(pins, "skip.no-torch").machine_wide and not rule_ids.lookup(pins, "skip.user").machine_wide
    assert rule_ids.NVCC_RELEASE in rule_ids.lookup(pins, "mamba.nvcc-unknown").needs
    assert rule_ids.lookup(pins, "causal.nvcc-unknown.typo") is None
    with pytest.raises(KeyError, match="not declared"):
        rule_ids.rule_id(pins, "fla", "build")       # a compiled kernel's rule, not a pure one's
    engine = os.path.join(os.path.dirname(DECIDE), "engine")
    for name in ("machine.py", "outcome.py", "context.py"):
        source = open(os.path.join(engine, name), encoding="utf-8").read()
        assert "rule.split(" not in source and ".endswith(\".nvcc" not in source, name


# -- a user's kernels: the pins file alone ---------------------------------------------------------------

A100 = dict(gpus=("sm_80",), torch="2.10.0", torch_cuda="12.8", triton="3.6.0")


def test_a_user_pure_kernel_is_known_by_name_everywhere(tmp_path, monkeypatch):
    from fastpath_hooks import cli
    from fastpath_hooks.facts.environment import parse_target
    from fastpath_hooks.hooks import gates

    path = user_pins(tmp_path, foo_attn={**FOO_ATTN, "gates": ["is_foo_attn_available"]})
    environ = {"FASTPATH_HOOKS_PINS": path, "FASTPATH_HOOKS_SKIP": "fooattn,tilelang"}
    settings = Settings.from_env(environ)
    assert settings.skip == {"foo-attn", "tilelang"}
    with pytest.raises(SettingsError, match="known: fla, causal-conv1d, mamba-ssm, flash-attn, flash-attn-3, tilelang, flash-qla"):
        Settings.from_env({"FASTPATH_HOOKS_SKIP": "foo-attn"})    # without the file: unknown
    assert parse_target("foo-attn=1.0.0", pins_file=path) == {"distributions": {"foo-attn": "1.0.0"}}
    with pytest.raises(ValueError, match="unknown fact 'foo-attn'"):
        parse_target("foo-attn=1.0.0")
    known = _registry.registry(environ)
    assert _registry.kernel_modules(known)["foo_attn"] == "foo-attn" and "foo_attn" in _registry.watched_modules(known)
    assert gates.gate_table(known)["is_foo_attn_available"] == ("foo-attn",)
    monkeypatch.setenv("FASTPATH_HOOKS_PINS", path)
    said = " ".join(_subcommand_help(cli, "install").split()).replace("- ", "-")   # argparse wraps at a hyphen
    assert "fla, causal-conv1d, mamba-ssm, flash-attn, flash-attn-3, foo-attn, tilelang, flash-qla (default: all)" in said


def _subcommand_help(cli, name: str) -> str:
    parser = cli._parser()
    action = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    return action.choices[name].format_help()


def _foo_pins(tmp_path, **entries):
    return pins_mod.load(user_pins(tmp_path, **entries))


@dataclasses.dataclass
class KernelRow:
    id: str
    kernel: str
    action: str
    rule: str
    env: dict = dataclasses.field(default_factory=dict)
    dists: dict = dataclasses.field(default_factory=dict)
    settings: dict = dataclasses.field(default_factory=dict)
    check: object = None


# The rows a new pure kernel comes with: its rule prefix, its releases, the shared skips.
FOO_ATTN_ROWS = [
    KernelRow("foo.install: the newest release that fits", "foo-attn", INSTALL, "foo.install",
              check=lambda d, p: (d.target == {"foo-attn": "1.1.0"}, d.steps[-1].requirements == ("foo-attn==1.1.0",),
                                  d.steps[-1].no_deps, d.needs == ())),
    KernelRow("foo.install: an older torch takes the older release", "foo-attn", INSTALL, "foo.install",
              env={"torch": "2.6.0"}, check=lambda d, p: d.target == {"foo-attn": "1.0.0"}),
    KernelRow("foo.no-release", "foo-attn", SKIP, "foo.no-release", env={"torch": "2.5.1"},
              check=lambda d, p: "no known-good foo-attn release for triton 3.6.0, torch 2.5.1" in d.reason),
    KernelRow("foo.ok", "foo-attn", OK, "foo.ok", dists={"foo-attn": "1.1.0"},
              check=lambda d, p: d.reason == "foo-attn 1.1.0 installed" and not d.steps),
    KernelRow("foo.repair: half-installed", "foo-attn", "repair", "foo.repair", dists={"foo-attn": "1.1.0"},
              env={"half_installed": ("foo-attn",)}, check=lambda d, p: d.steps[-1].force and "interrupted" in d.reason),
    KernelRow("foo.offline-missing", "foo-attn", SKIP, "foo.offline-missing",
              settings={"offline": True, "find_links": ("/wheelhouse",)},
              check=lambda d, p: "lacks foo-attn==1.1.0" in d.reason),
    KernelRow("skip.user", "foo-attn", SKIP, "skip.user", settings={"skip": frozenset({"foo-attn"})},
              check=lambda d, p: "remove foo-attn from FASTPATH_HOOKS_SKIP" in d.fix),
    KernelRow("skip.accelerator.rocm", "foo-attn", SKIP, "skip.accelerator.rocm",
              env=dict(torch_cuda=None, torch_hip="6.4", gpus=("gfx942",), triton_dist="pytorch-triton-rocm"),
              check=lambda d, p: "foo-attn does not support ROCm" in d.reason),
]

# The rows a new compiled kernel comes with (no release wheels: a source build, or the reason why not).
NO_RELEASE_HOST = {"torch": "2.13.0", "torch_cuda": "13.0", "nvcc_version": "13.0"}
FOO_CONV_ROWS = [
    KernelRow("fooconv.build for the visible arch", "foo-conv", INSTALL, "fooconv.build", env=NO_RELEASE_HOST,
              check=lambda d, p: (d.steps[-1].kind == "build", d.steps[-1].archs == ("sm_90",),
                                  dict(d.steps[-1].env) == {"FOO_CONV_FORCE_BUILD": "TRUE"},
                                  d.target == {"foo-conv": "0.1.0"}, d.expected_seconds == 40)),
    KernelRow("fooconv.no-wheel: builds off, no release wheels", "foo-conv", SKIP, "fooconv.no-wheel",
              env=NO_RELEASE_HOST, settings={"allow_build": "0"},
              check=lambda d, p: "no release wheels of foo-conv are pinned" in d.reason),
    KernelRow("fooconv.no-nvcc", "foo-conv", SKIP, "fooconv.no-nvcc", env={**NO_RELEASE_HOST, "nvcc": None},
              check=lambda d, p: "needs a CUDA toolkit's nvcc" in d.reason),
    KernelRow("fooconv.build.no-arch: the sdist has no sm_70 code", "foo-conv", SKIP, "fooconv.build.no-arch",
              env={**NO_RELEASE_HOST, "gpus": ("sm_70",)},
              check=lambda d, p: "compiles no code that runs on sm_70" in d.reason),
    KernelRow("fooconv.ok: installed, checked once", "foo-conv", OK, "fooconv.ok", env=NO_RELEASE_HOST,
              dists={"foo-conv": "0.1.0"}, check=lambda d, p: d.verify and d.on_failure == "block"),
    KernelRow("fooconv.block.arch: our sm_80 build on an sm_90", "foo-conv", BLOCK, "fooconv.block.arch",
              env=NO_RELEASE_HOST, dists={"foo-conv": "0.1.0+fph.torch2.13.0.cu130.abi1.sm80"},
              check=lambda d, p: "build foo-conv --arch sm_80,sm_90" in d.fix),
]


@pytest.mark.parametrize("row", FOO_ATTN_ROWS + FOO_CONV_ROWS, ids=lambda r: r.id)
def test_a_user_kernel_is_decided_by_its_kinds_rules(row, tmp_path):
    """A pins entry and these rows: no code of fastpath-hooks names foo-attn or foo-conv. The shipped
    kernels' decisions do not change with them."""
    pins = _foo_pins(tmp_path, foo_attn=FOO_ATTN, foo_conv=FOO_CONV)
    env = make_env(row.dists, **{**A100, "gpus": ("sm_90",), **row.env})
    settings = dataclasses.replace(Settings(), **row.settings)
    plan = plan_for(env, settings, pins)
    d = plan[row.kernel]
    assert (d.action, d.rule) == (row.action, row.rule), d.reason
    assert d.rule in rule_ids.declared(pins)
    verdict = row.check(d, plan)
    assert verdict is True or (isinstance(verdict, tuple) and verdict and all(v is True for v in verdict)), verdict
    shipped = plan_for(env, settings)
    assert {k: (v.action, v.rule) for k, v in plan.decisions.items() if k in shipped.decisions} == \
        {k: (v.action, v.rule) for k, v in shipped.decisions.items()}


def test_the_user_kernels_come_in_the_plan_and_their_mirror_is_a_setting(tmp_path):
    path = user_pins(tmp_path, foo_attn=FOO_ATTN, foo_conv=FOO_CONV)
    pins = pins_mod.load(path)
    assert tuple(plan_for(make_env(**A100), pins=pins).decisions) == (
        "fla", "causal-conv1d", "mamba-ssm", "flash-attn", "flash-attn-3", "foo-attn", "foo-conv", "tilelang", "flash-qla")
    settings = Settings.from_env({"FASTPATH_HOOKS_PINS": path, "FASTPATH_HOOKS_FOO_CONV_WHEEL_URL": "https://mirror.example/foo/"})
    assert settings.wheel_urls == {"foo-conv": "https://mirror.example/foo/"}
    assert settings.public()["wheel_urls"] == {"foo-conv": "https://mirror.example/foo/"}
    with pytest.raises(SettingsError, match="FASTPATH_HOOKS_FOO_CONV_WHEEL_URL.*unknown variable"):
        Settings.from_env({"FASTPATH_HOOKS_FOO_CONV_WHEEL_URL": "https://mirror.example/foo/"})


def test_a_users_backend_of_fla_is_decided_by_the_backend_rules(tmp_path):
    """A backend a pins file adds (and names in fla's release): decided after fla, ensured by fla (`wants`),
    switched off through its own switch, by the backend kind's rules and rule ids alone."""
    release = {"version": "0.6.0", "torch": ">=2.7", "triton": ">=3.3", "transformers": ">=5.6.2,<6",
               "backends": ["tilelang", "flash-qla", "foo-qla"], "source": "measured: test"}
    # flash-qla turned on too (off by default on Hopper): the two backends side by side
    path = user_pins(tmp_path, foo_qla=FOO_QLA, fla={"releases": [release]}, flash_qla={"pays": {"hazard": True}})
    pins = pins_mod.load(path)
    assert pins.decision_order.index("foo-qla") > pins.decision_order.index("fla")
    assert {"fooqla.install", "fooqla.arch", "fooqla.without.tilelang", "fooqla.old.tilelang"} <= set(rule_ids.declared(pins))
    plan = plan_for(make_env(model_shapes=(("m", 64, 64, 4, 8),)), pins=pins)
    d = plan["foo-qla"]
    assert (d.action, d.rule, dict(d.target)) == (INSTALL, "fooqla.install", {"foo-qla": "0.2.0"})
    assert d.needs == ("tilelang", "fla") and dict(d.off) == {"FLA_FOO_QLA": "0"} and not d.check   # no `warm`
    # each backend by its own head dims: flash-qla (K = V = 128) is not used for this 64 x 64 model, foo-qla is
    assert (plan["flash-qla"].action, plan["flash-qla"].rule) == (SKIP, "qla.head-dims")
    assert plan["fla"].wants == ("foo-qla",)
    assert plan_for(make_env(), pins=pins)["fla"].wants == ("flash-qla", "foo-qla")   # head dims not known: both
    installed = plan_for(make_env({"foo-qla": "0.2.0"}, gpus=("sm_80",)), pins=pins)["foo-qla"]
    assert (installed.action, installed.rule, dict(installed.env)) == (SKIP, "fooqla.arch", {"FLA_FOO_QLA": "0"})
