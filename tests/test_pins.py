"""Pins and rules as data: the shipped pins.json validates and is consistent; a user file
(JSON or TOML, FASTPATH_HOOKS_PINS) overrides and extends it; a malformed one raises
PinsError naming the file and the entry - also through the real CLI."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys

import pytest

from fastpath_hooks.facts import pins as pins_mod
from fastpath_hooks.facts.pins import SOURCE_KINDS, PinsError, load
from fastpath_hooks.decide.plan import INSTALL, OK, REPAIR
from fastpath_hooks.decide.policy import decide
from fastpath_hooks.facts.settings import Settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support.venvs import clean_env  # noqa: E402
from test_policy import make_env  # noqa: E402

SHIPPED = load()


def write(tmp_path, name: str, content) -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


# -- the shipped data ----------------------------------------------------------------------------

def test_shipped_pins_validate():
    assert SHIPPED.origins == (pins_mod.SHIPPED,)
    assert set(SHIPPED.kernels) == {"fla", "tilelang", "causal-conv1d", "mamba-ssm", "flash-attn", "flash-attn-3", "flash-qla"}
    assert SHIPPED.kernel("fla").releases and SHIPPED.kernel("tilelang").pairs and SHIPPED.kernel("tilelang").broken and SHIPPED.hazards
    qla = SHIPPED.kernel("flash-qla")
    assert (qla.kind, qla.serves, qla.with_kernels, qla.switch.variable) == ("backend", ("fla",), ("tilelang",), "FLA_FLASH_QLA")
    assert qla.archs.train == ("sm_90", "sm_100", "sm_103") and qla.head_dims.k == qla.head_dims.v == (128,)
    assert str(qla.releases[0].partners["tilelang"]) == ">=0.1.12"
    assert "flash-qla" in SHIPPED.kernel("fla").releases[0].backends     # fla 0.6.0 dispatches to it
    # decided after fla (whose release and use it reads), which still comes after tilelang
    assert SHIPPED.decision_order.index("flash-qla") > SHIPPED.decision_order.index("fla") > \
        SHIPPED.decision_order.index("tilelang")


def test_every_fact_names_its_source():
    with open(pins_mod.SHIPPED) as fh:
        raw = json.load(fh)
    records = []

    def walk(node, path):
        if isinstance(node, dict):
            if "source" in node:
                records.append((path, node["source"]))
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(raw, "")
    assert len(records) >= 20
    for path, source in records:
        assert source.split(":", 1)[0] in SOURCE_KINDS, path
    # every record of the lists the policy reads carries one
    for rec in itertools.chain(SHIPPED.kernel("fla").releases, SHIPPED.kernel("tilelang").pairs, SHIPPED.kernel("tilelang").broken, SHIPPED.hazards):
        assert rec.source.split(":", 1)[0] in SOURCE_KINDS


def test_fla_releases_are_newest_first():
    """The policy takes the first release that fits: the order is the preference."""
    from packaging.version import Version

    versions = [Version(r.version) for r in SHIPPED.kernel("fla").releases]
    assert versions == sorted(versions, reverse=True)


def test_no_known_good_pair_is_broken_on_any_arch():
    for pair in SHIPPED.kernel("tilelang").pairs:
        for ffi in pair.companions:
            for entry in SHIPPED.kernel("tilelang").broken:
                assert not (entry.version == pair.version and ffi in entry.companions), (pair, entry)
            assert ffi not in SHIPPED.yanked["apache-tvm-ffi"]


def test_the_hopper_hazard_is_data():
    (hz,) = [h for h in SHIPPED.hazards if h.id == "fla#640"]
    assert hz.gpu == ("sm_90",) and hz.needs == "tilelang"
    assert [v for v in ("3.3.1", "3.4.0", "3.6.0", "3.7.0", "3.7.1", "3.9.0") if hz.triton.contains(v)] == \
        ["3.4.0", "3.6.0", "3.7.0"]


def test_causal_conv1d_hashes_belong_to_the_published_builds():
    rel = SHIPPED.release("causal-conv1d")
    names = set()
    for build in rel.builds:
        for torch_mm, py, arch, abi in itertools.product(build["torch_mm"], build["python"], build["arch"], build["abi"]):
            names.add(rel.filename.format(version=rel.version, cuda_major=build["cuda_major"], torch_mm=torch_mm,
                                          abi=abi, py=py.replace(".", ""), arch=arch))
    assert rel.sha256 and set(rel.sha256) <= names
    assert all(alias in {m for b in rel.builds for m in b["torch_mm"]} for alias in rel.torch_aliases.values())


def test_allow_list_covers_every_installable_and_no_protected_distribution():
    from packaging.requirements import Requirement

    from fastpath_hooks.facts.distributions import canonical_name

    for spec in SHIPPED.kernels.values():
        for dist in spec.distributions:
            assert dist in SHIPPED.allowed
        for req in spec.runtime_deps:
            assert canonical_name(Requirement(req).name) in SHIPPED.allowed
    assert {"torch", "triton", "transformers"} & SHIPPED.allowed == set()


# -- a user file overrides and extends -----------------------------------------------------------

NEW_RELEASE = {"version": "0.7.0", "torch": ">=2.7", "triton": ">=3.3", "transformers": ">=5.6.2,<6",
               "backends": ["tilelang"], "source": "measured: a test release"}
NEW_RELEASE_TOML = '''
[[kernels.fla.releases]]
version = "0.7.0"
torch = ">=2.7"
triton = ">=3.3"
transformers = ">=5.6.2,<6"
backends = ["tilelang"]
source = "measured: a test release"
'''


@pytest.mark.parametrize("name,content", [("user.json", {"kernels": {"fla": {"releases": [NEW_RELEASE]}}}),
                                          ("user.toml", NEW_RELEASE_TOML)])
def test_user_release_is_preferred_first(tmp_path, name, content):
    pins = load(write(tmp_path, name, content))
    assert [r.version for r in pins.kernel("fla").releases] == ["0.7.0", "0.6.0", "0.5.2", "0.4.1"]
    assert pins.origins[-1].endswith(name)
    plan = decide(make_env(), Settings(), pins)
    assert plan["fla"].action == INSTALL and plan["fla"].target["fla-core"] == "0.7.0"
    # everything not named is still the shipped data
    assert pins.kernel("tilelang").pairs == SHIPPED.kernel("tilelang").pairs and pins.hazards == SHIPPED.hazards


def test_user_release_with_the_same_version_replaces_the_shipped_one(tmp_path):
    narrowed = {**NEW_RELEASE, "version": "0.6.0", "triton": ">=3.3,<3.9"}
    pins = load(write(tmp_path, "p.json", {"kernels": {"fla": {"releases": [narrowed]}}}))
    assert [r.version for r in pins.kernel("fla").releases] == ["0.6.0", "0.5.2", "0.4.1"]
    assert not pins.kernel("fla").releases[0].triton.contains("3.9.0")
    plan = decide(make_env({"transformers": "5.24.0"}, triton="3.9.0", gpus=("sm_80",)), Settings(), pins)
    assert plan["fla"].target["fla-core"] == "0.4.1"  # the narrowed 0.6.0 no longer fits triton 3.9


BROKEN_ON_HOPPER = {"tilelang": "0.1.15", "apache-tvm-ffi": ["0.1.12"], "arch": "sm_90", "effect": "wrong results",
                    "source": "reported: a test entry"}


def test_user_broken_entry_is_respected_by_the_policy(tmp_path):
    pins = load(write(tmp_path, "p.json", {"kernels": {"tilelang": {"broken": [BROKEN_ON_HOPPER]}}}))
    assert len(pins.kernel("tilelang").broken) == len(SHIPPED.kernel("tilelang").broken) + 1
    fresh = decide(make_env(), Settings(), pins)["tilelang"]
    assert fresh.action == INSTALL and fresh.target == {"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.11"}
    installed = decide(make_env({"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"}), Settings(), pins)["tilelang"]
    assert installed.action == REPAIR and installed.target["apache-tvm-ffi"] == "0.1.11"
    assert "wrong results" in installed.reason
    elsewhere = decide(make_env({"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.12"}, gpus=("sm_80",)), Settings(), pins)
    assert elsewhere["tilelang"].action == OK


def test_user_replaces_a_tilelang_pair(tmp_path):
    pair = {"tilelang": "0.1.15", "apache-tvm-ffi": ["0.1.11"], "source": "measured: only this one on our cluster"}
    pins = load(write(tmp_path, "p.toml", '[[kernels.tilelang.pairs]]\ntilelang = "0.1.15"\n"apache-tvm-ffi" = ["0.1.11"]\n'
                                          'source = "measured: only this one on our cluster"\n'))
    assert pins.kernel("tilelang").pairs[0] == pins_mod.Pair(pair["tilelang"], tuple(pair["apache-tvm-ffi"]), pair["source"])
    assert [p.version for p in pins.kernel("tilelang").pairs] == ["0.1.15", "0.1.11", "0.1.8"]
    assert decide(make_env(), Settings(), pins)["tilelang"].target == {"tilelang": "0.1.15", "apache-tvm-ffi": "0.1.11"}


def test_user_file_is_reread_when_it_changes(tmp_path):
    path = write(tmp_path, "p.json", {"kernels": {"fla": {"releases": [NEW_RELEASE]}}})
    assert load(path).kernel("fla").releases[0].version == "0.7.0"
    with open(path, "w") as fh:
        json.dump({"kernels": {"fla": {"releases": [{**NEW_RELEASE, "version": "0.8.0"}]}}}, fh)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert load(path).kernel("fla").releases[0].version == "0.8.0"


# -- malformed user files ------------------------------------------------------------------------

def _release(**over):
    return {"kernels": {"fla": {"releases": [{**NEW_RELEASE, **over}]}}}


def _without_source():
    rel = dict(NEW_RELEASE)
    del rel["source"]
    return {"kernels": {"fla": {"releases": [rel]}}}


SHIPPED_BUILD = {"cuda_major": "12", "torch_mm": ["2.10"], "python": ["3.11"], "arch": ["x86_64"], "abi": ["TRUE"]}

MALFORMED = [
    ("bad JSON", "p.json", '{"kernels": {', "", "not valid JSON"),
    ("bad TOML", "p.toml", "kernels = [\n", "", "not valid TOML"),
    ("not a table", "p.json", "[1, 2]", "", "the top level must be a table"),
    ("bad specifier", "p.json", _release(triton=">>3.4"), "kernels.fla.releases[0].triton", "is not a version specifier"),
    ("bad specifier in TOML", "p.toml", NEW_RELEASE_TOML.replace('">=3.3"', '"~~3"'),
     "kernels.fla.releases[0].triton", "is not a version specifier"),
    ("bad version", "p.json", _release(version="seven"), "kernels.fla.releases[0].version", "'seven' is not a version"),
    ("missing source", "p.json", _without_source(), "kernels.fla.releases[0].source", "every fact needs a source"),
    ("source of an unknown kind", "p.json", _release(source="I think so"), "kernels.fla.releases[0].source",
     "'measured: ...'"),
    ("backends not a list", "p.json", _release(backends="tilelang"), "kernels.fla.releases[0].backends",
     "expected a list"),
    ("a backend that is no kernel", "p.json", _release(backends=["tilelang2"]), "kernels.fla.releases[0].backends[0]",
     "'tilelang2': expected another kernel"),
    ("duplicate release", "p.json", {"kernels": {"fla": {"releases": [NEW_RELEASE, NEW_RELEASE]}}},
     "kernels.fla.releases[1].version", "listed twice"),
    ("not a list", "p.json", {"kernels": {"fla": {"releases": {}}}}, "kernels.fla.releases", "expected a list"),
    ("unknown kernel", "p.json", {"kernels": {"mamba": {}}}, "kernels.mamba", "unknown kernel"),
    ("unknown section", "p.json", {"kernel": {}}, "kernel", "unknown section"),
    ("wrong schema", "p.json", {"schema": 2}, "schema", "unsupported schema 2"),
    ("good pair also listed broken", "p.json",
     {"kernels": {"tilelang": {"broken": [{**BROKEN_ON_HOPPER, "arch": "*"}]}}},
     "kernels.tilelang.pairs[0]", "also listed as broken in kernels.tilelang.broken[0]"),
    ("yanked version pinned", "p.json",
     {"kernels": {"tilelang": {"pairs": [{"tilelang": "0.1.15", "apache-tvm-ffi": ["0.1.13"], "source": "measured: x"}]}}},
     "kernels.tilelang.pairs[0].apache-tvm-ffi[0]", "yanked"),
    ("bad broken arch", "p.json", {"kernels": {"tilelang": {"broken": [{**BROKEN_ON_HOPPER, "arch": "hopper"}]}}},
     "kernels.tilelang.broken[0].arch", "expected '*', sm_XY or gfxNNN"),
    ("pair without tvm-ffi", "p.json",
     {"kernels": {"tilelang": {"pairs": [{"tilelang": "0.1.16", "apache-tvm-ffi": [], "source": "measured: x"}]}}},
     "kernels.tilelang.pairs[0].apache-tvm-ffi", "at least one"),
    ("disallowed distribution", "p.json", {"kernels": {"fla": {"runtime_deps": ["einops", "requests"]}}},
     "kernels.fla.runtime_deps[1]", "requests is not in allowed_distributions.names"),
    ("protected distribution allowed", "p.json", {"allowed_distributions": {"names": sorted(SHIPPED.allowed) + ["torch"]}},
     "allowed_distributions.names", "torch is protected"),
    ("bad requirement", "p.json", {"kernels": {"fla": {"runtime_deps": ["einops>>1"]}}},
     "kernels.fla.runtime_deps[0]", "is not a requirement"),
    ("bad sha256", "p.json", {"kernels": {"causal-conv1d": {"release": {"sha256": {"x.whl": "abc123"}}}}},
     "kernels.causal-conv1d.release.sha256.x.whl", "64 lowercase hex digits"),
    ("wheel name template without a field", "p.json",
     {"kernels": {"causal-conv1d": {"release": {"filename": "causal_conv1d-{version}.whl"}}}},
     "kernels.causal-conv1d.release.filename", "must contain {cuda_major}"),
    ("hazard needing an unknown kernel", "p.json",
     {"hazards": [{"id": "x", "kernel": "fla", "gpu": ["sm_90"], "triton": ">=3", "needs": "mamba", "effect": "e",
                   "fix": "f", "source": "reported: x"}]}, "hazards[0].needs", "'mamba'"),
    ("bad platform", "p.json", {"kernels": {"tilelang": {"platforms": ["linux"]}}}, "kernels.tilelang.platforms[0]",
     "os-arch"),
    ("bad accelerator", "p.json", {"kernels": {"fla": {"accelerators": ["cuda", "tpu"]}}}, "kernels.fla.accelerators[1]",
     "expected cuda, rocm or xpu"),
    ("build seconds", "p.json", {"kernels": {"causal-conv1d": {"source_build": {"measured": {"seconds": 0}}}}},
     "kernels.causal-conv1d.source_build.measured.seconds", "positive number"),
    ("build time with a guessed source", "p.json",
     {"kernels": {"causal-conv1d": {"source_build": {"measured": {"seconds": 60, "source": "guessed: fast"}}}}},
     "kernels.causal-conv1d.source_build.measured.source", "every fact needs a source"),
    ("build requirement without one version", "p.json",
     {"kernels": {"causal-conv1d": {"source_build": {"requirement": "causal-conv1d>=1.6"}}}},
     "kernels.causal-conv1d.source_build.requirement", "one exact version"),
    ("gencode table with a non-arch", "p.json",
     {"kernels": {"causal-conv1d": {"source_build": {"cuda_archs": {"pairs": {"compute_90": ""}}}}}},
     "kernels.causal-conv1d.source_build.cuda_archs.pairs.compute_90", "sm_XY"),
    ("mamba-ssm build of a version not among its releases", "p.json",
     {"kernels": {"mamba-ssm": {"source_build": {"requirement": "mamba-ssm==2.2.4"}}}},
     "kernels.mamba-ssm.releases", "mamba-ssm==2.2.4 is not one of the releases"),
    ("mamba-ssm with an unknown partner kernel", "p.json", {"kernels": {"mamba-ssm": {"with": ["mamba"]}}},
     "kernels.mamba-ssm.with[0]", "expected another kernel"),
    ("mamba-ssm importing itself optionally", "p.json", {"kernels": {"mamba-ssm": {"imports_optional": ["mamba-ssm"]}}},
     "kernels.mamba-ssm.imports_optional[0]", "expected another kernel"),
    ("mamba-ssm release declaring a bad requirement", "p.json",
     {"kernels": {"mamba-ssm": {"releases": [{"version": "2.3.2.post1", "declares": ["tilelang=0.1.8"],
                                              "source": "upstream: x"}]}}},
     "kernels.mamba-ssm.releases[0].declares[0]", "is not a requirement"),
    # issue 40: a key no field reads was silently ignored (a typo'd `backends` said "(fla does from ?)")
    ("unknown keys in a kernel", "p.json", {"kernels": {"fla": {"relases": [], "tyop": 1}}}, "kernels.fla.relases",
     "unknown key (did you mean releases?); also tyop"),
    ("unknown key in a release", "p.json", _release(backnds=["tilelang"]), "kernels.fla.releases[0].backnds",
     "unknown key (did you mean backends?)"),
    ("unknown key in a table of a record", "p.json",
     {"kernels": {"causal-conv1d": {"source_build": {"parallel": {"split_compil": True}}}}},
     "kernels.causal-conv1d.source_build.parallel.split_compil", "unknown key (did you mean split_compile?)"),
    ("unknown key in a reader's table", "p.json",
     {"kernels": {"causal-conv1d": {"release": {"builds": [{**SHIPPED_BUILD, "cuda": "12"}]}}}},
     "kernels.causal-conv1d.release.builds[0].cuda", "unknown key"),
    ("unknown key in the hub's rules", "p.json", {"hub": {"probe_secs": 5}}, "hub.probe_secs",
     "unknown key (did you mean probe_seconds?)"),
    ("unknown key in a section", "p.json", {"protected": {"distributions": ["torch"], "source": "upstream: x",
                                                          "note": "x"}}, "protected.note", "unknown key"),
    ("a key of another kind's release", "p.json",
     {"kernels": {"flash-qla": {"releases": [{"version": "0.1.4", "backends": ["tilelang"], "source": "upstream: x"}]}}},
     "kernels.flash-qla.releases[0].backends", "only a pure kernel has backends"),
    ("mamba-ssm build for another distribution", "p.json",
     {"kernels": {"mamba-ssm": {"source_build": {"requirement": "causal-conv1d==1.6.2.post1"}}}},
     "kernels.mamba-ssm.releases", "is not one of the releases"),
]


def test_mamba_ssm_is_data_like_causal_conv1d():
    """The second compiled kernel: its release-wheel scheme (no hashes known), its own build data,
    and the releases the policy chooses from per machine."""
    rel, build = SHIPPED.release("mamba-ssm"), SHIPPED.build("mamba-ssm")
    assert rel.filename.startswith("mamba_ssm-{version}+cu{cuda_major}torch{torch_mm}") and rel.sha256 == {}
    assert {m for b in rel.builds for m in b["torch_mm"]} == {"2.6", "2.7", "2.8", "2.9", "2.10"}
    assert build.requirement == "mamba-ssm==2.3.2.post1" and build.env == {"MAMBA_FORCE_BUILD": "TRUE"}
    assert (build.seconds, build.archs, build.cores) == (117, 1, 16)
    old = SHIPPED.build("mamba-ssm", "2.3.1")
    assert old.requirement == "mamba-ssm==2.3.1" and {"sm_53", "sm_70"} <= set(old.cuda_archs) - set(build.cuda_archs)
    assert old.seconds == build.seconds
    spec = SHIPPED.kernel("mamba-ssm")
    assert spec.with_kernels == ("causal-conv1d",) and spec.runtime_deps == ("einops", "packaging")
    assert spec.imports_optional == ("tilelang",) and SHIPPED.kernel("causal-conv1d").imports_optional == ()
    assert not {"tilelang", "apache-tvm-ffi", "quack-kernels"} & set(spec.runtime_deps)
    assert [r.version for r in SHIPPED.kernel("mamba-ssm").releases] == ["2.3.2.post1", "2.3.1"]
    assert SHIPPED.build_for_distribution("mamba_ssm") == ("mamba-ssm", build)


@pytest.mark.parametrize("name,filename,content,entry,fragment", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_pins_name_the_file_and_the_entry(tmp_path, name, filename, content, entry, fragment):
    path = write(tmp_path, filename, content)
    with pytest.raises(PinsError) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(f"pins file {path}: ")
    assert info.value.origin == path and info.value.entry == entry
    if entry:
        assert f": {entry}: " in message
    assert fragment in message


def test_missing_user_file(tmp_path):
    with pytest.raises(PinsError, match="cannot read"):
        load(str(tmp_path / "gone.json"))


def test_bad_pins_file_through_the_cli_exits_2_with_the_message(tmp_path):
    path = write(tmp_path, "bad.json", _release(triton=">>3.4"))
    env = clean_env(FASTPATH_HOOKS_PINS=path, FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"))
    console = os.path.join(os.path.dirname(sys.executable), "fastpath-hooks")
    for argv in ([console, "plan"], [sys.executable, "-m", "fastpath_hooks", "doctor", "--json"]):
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        # one line; a long path may be cut in its middle (events.fit), the file's name and the entry stay
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert "pins file /" in result.stderr
        assert "bad.json: kernels.fla.releases[0].triton: '>>3.4' is not a version specifier" in result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""


def test_pins_are_immutable_values():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SHIPPED.kernel("fla").releases[0].version = "9"  # type: ignore[misc]


def test_a_kernels_verdict_depends_on_the_kernels_its_import_runs():
    """`import mamba_ssm` imports an installed tilelang (a broken pair aborts it): a change to that pair must
    re-check mamba-ssm; causal-conv1d imports no tilelang, so its verdict stays."""
    from fastpath_hooks.engine.context import verdict_distributions

    assert {"mamba-ssm", "causal-conv1d", "tilelang", "apache-tvm-ffi", "einops"} <= set(verdict_distributions(SHIPPED, "mamba-ssm"))
    assert not {"tilelang", "apache-tvm-ffi"} & set(verdict_distributions(SHIPPED, "causal-conv1d"))
    # flash-qla's check runs through fla and on tilelang: a new fla or tilelang checks it again
    assert set(verdict_distributions(SHIPPED, "flash-qla")) == {"flash-qla", "tilelang", "apache-tvm-ffi", "fla-core",
                                                                "flash-linear-attention"}
