"""One reading of wheel file names (facts/wheels.py): every caller gets the canonical
distribution, and a built wheel's relabelled copy is one installers accept."""
from __future__ import annotations

import os
import zipfile

import pytest

from fastpath_hooks.act import fetch as wheelcache
from fastpath_hooks.act.build import relabel
from fastpath_hooks.decide.plan import Step
from fastpath_hooks.decide.policy.compiled import built_archs
from fastpath_hooks.facts.wheels import fits as wheel_fits, label, parse_wheel, wheel_distribution, with_local_label
from support import wheels

LABEL = "fph.torch2.13.0.cu130.abi1.sm90"


@pytest.mark.parametrize("filename,dist", [
    ("causal_conv1d-1.6.2.post1-cp312-cp312-linux_x86_64.whl", "causal-conv1d"),
    ("Causal_Conv1D-1.6.2.post1+cu12torch2.10cxx11abiTRUE-cp312-cp312-linux_x86_64.whl", "causal-conv1d"),
    ("/some/dir/mamba_ssm-2.3.2.post1-1-cp312-cp312-linux_x86_64.whl", "mamba-ssm"),
    ("causal_conv1d-not_a_version-x.whl", "causal-conv1d"),    # not standard: what comes before the version
])
def test_every_reader_gets_the_canonical_distribution(filename, dist):
    assert wheel_distribution(filename) == dist
    # a plan step that installs the file wants that distribution
    assert Step(kind="wheel", requirements=(filename,)).wants[0].name == dist


def test_a_name_that_is_not_a_wheel_name_parses_to_none():
    assert parse_wheel("causal_conv1d-not_a_version-x.whl") is None
    assert parse_wheel("causal_conv1d-1.6.2.tar.gz") is None
    w = parse_wheel("mamba_ssm-2.3.2.post1-1-cp312-cp312-linux_x86_64.whl")
    assert (str(w.version), w.build, w.tag_text) == ("2.3.2.post1", (1, ""), "cp312-cp312-linux_x86_64")


def test_a_local_label_replaces_the_old_one_and_keeps_build_and_tags():
    assert with_local_label("Causal_Conv1D-1.6.2.post1+cu12torch2.10-2-cp312-cp312-linux_x86_64.whl", LABEL) == \
        f"causal_conv1d-1.6.2.post1+{LABEL}-2-cp312-cp312-linux_x86_64.whl"
    with pytest.raises(ValueError, match="not a wheel file name"):
        with_local_label("causal_conv1d.whl", LABEL)


def test_relabel_writes_a_wheel_whose_name_metadata_and_record_agree(tmp_path):
    src = wheels.fake_causal_conv1d(str(tmp_path / "w"), "Causal_Conv1D-1.6.2.post1-cp312-cp312-linux_x86_64.whl")
    out = relabel(src, LABEL, str(tmp_path))
    assert os.path.basename(out) == f"causal_conv1d-1.6.2.post1+{LABEL}-cp312-cp312-linux_x86_64.whl"
    version = f"1.6.2.post1+{LABEL}"
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        info = f"causal_conv1d-{version}.dist-info"
        assert f"{info}/METADATA" in names and f"{info}/RECORD" in names
        assert f"Version: {version}" in zf.read(f"{info}/METADATA").decode().splitlines()
        recorded = {line.split(",", 1)[0] for line in zf.read(f"{info}/RECORD").decode().splitlines()}
        assert recorded == set(names)


def test_clearing_one_distribution_matches_any_spelling(tmp_path):
    root = str(tmp_path / "cache")
    cc = wheels.fake_causal_conv1d(str(tmp_path / "a"), f"Causal_Conv1D-1.6.2.post1+{LABEL}-cp312-cp312-linux_x86_64.whl")
    other = wheels.build_wheel(str(tmp_path / "b"), "causal-conv1d-extra", "1.0", {"x.py": ""})
    for wheel in (cc, other):
        wheelcache.store(root, wheel, meta={})
    assert wheelcache.clear(root, "causal_conv1d") == [os.path.basename(cc)]
    assert sorted(os.listdir(wheelcache.directory(root))) == [".lock", os.path.basename(other), os.path.basename(other) + ".json"]


def test_the_linux_platforms_of_a_glibc_are_packagings_own_for_this_machine():
    """linux_platforms() poses packaging.tags.platform_tags() for another glibc: for this machine's own glibc
    and arch both lists are the same (musllinux aside); a lower glibc only drops the newer tags."""
    import platform

    from packaging import tags

    from fastpath_hooks.facts.host import glibc
    from fastpath_hooks.facts.wheels import linux_platforms

    here = glibc()
    if here is None or platform.system() != "Linux":
        pytest.skip("not a glibc Linux machine")
    arch = platform.machine()
    own = [t for t in tags.platform_tags() if not t.startswith("musllinux")]
    assert linux_platforms(here, arch) == own
    older = linux_platforms("2.28", arch)
    assert older == [t for t in own if not t.startswith("manylinux_2_") or int(t.split("_")[2]) <= 28]
    assert "manylinux_2_29_" + arch not in older and "manylinux2014_" + arch in older


@pytest.mark.parametrize("variant,needs,fits", [
    ("hd256", ((256,), False), True),           # Qwen3.5's head dim, no window
    ("hd256", ((128,), False), False),          # a head dim the build left out
    ("hd128x256.swa", ((256,), True), True),    # more than needed
    ("hd256", ((256,), True), False),           # local attention left out
    ("swa", (None, True), True),                # every head dim kept: any model
    ("hd256.swa", (None, False), False),        # a model of unknown head dim needs every one
])
def test_a_trimmed_build_fits_only_where_it_keeps_what_the_models_need(variant, needs, fits):
    """A trimmed build's label says what it keeps (FA3: head dims, local attention), after its GPU codes."""
    local = label(torch="2.13.0", cuda="12.8", hip=None, abi="TRUE", archs=("sm_90",), variant=tuple(variant.split(".")))
    name = f"flash_attn_3-3.0.0b1+{local}-cp39-abi3-linux_x86_64.whl"
    assert built_archs(f"3.0.0b1+{local}") == ("sm_90",)
    assert wheel_fits(name, distribution="flash-attn-3", version="3.0.0b1", torch="2.13.0", cuda="12.8", hip=None,
                      abi="TRUE", python="3.11", arch="x86_64", gpus=("sm_90",), needs=needs) is fits
