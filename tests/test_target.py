"""FASTPATH_HOOKS_TARGET / --target specs: valid specs parse to exact facts, invalid ones
raise ValueError naming the bad entry."""

from __future__ import annotations

import pytest

from fastpath_hooks.facts.environment import parse_target

VALID = [
    ("gpu=sm_90,torch=2.11.0,cuda=13.0,triton=3.6.0,python=3.12",
     {"gpus": ("sm_90",), "torch": "2.11.0", "cuda": "13.0", "triton": "3.6.0", "python": "3.12"}),
    ("gpu=none", {"gpus": ()}),
    ("hip=6.4,gpu=gfx942", {"hip": "6.4", "gpus": ("gfx942",)}),
    ("gpu=sm_90+sm_80", {"gpus": ("sm_90", "sm_80")}),
    ("gpu=sm90/sm100", {"gpus": ("sm_90", "sm_100")}),
    ("GPU=SM_90", {"gpus": ("sm_90",)}),
    ("gpu=xpu,xpu=yes", {"gpus": ("xpu",), "xpu": True}),
    ("torch=none,triton=none", {"torch": None, "triton": None}),
    ("torch=2.10.0+cu128", {"torch": "2.10.0+cu128"}),
    ("python=3.12.3", {"python": "3.12.3"}),
    ("nvcc=no", {"nvcc": None}),
    ("nvcc=yes", {"nvcc": "posed"}),
    ("nvcc=12.8", {"nvcc": "12.8"}),
    ("abi=false,uv=yes", {"cxx11_abi": False, "uv": True}),
    ("os=Linux,arch=arm64", {"os": "linux", "arch": "aarch64"}),
    ("platform=linux-amd64", {"os": "linux", "arch": "x86_64"}),
    ("glibc=2.31", {"glibc": "2.31"}),
    ("fla-core=0.6.0,tilelang=none,apache_tvm_ffi=0.1.12",
     {"distributions": {"fla-core": "0.6.0", "tilelang": None, "apache-tvm-ffi": "0.1.12"}}),
    ("Transformers=4.57.6", {"distributions": {"transformers": "4.57.6"}}),
    (" gpu = sm_80 , cuda = 12.8 ,", {"gpus": ("sm_80",), "cuda": "12.8"}),
    ("head_dims=128x128,heads=16X32", {"head_dims": (128, 128), "heads": (16, 32)}),
    ("flash-qla=0.1.3", {"distributions": {"flash-qla": "0.1.3"}}),
    ("cpus=16,memory=64.5", {"cpus": 16, "memory_gib": 64.5}),
]


@pytest.mark.parametrize("spec,expected", VALID, ids=[s for s, _ in VALID])
def test_valid_spec_parses_to_exact_facts(spec, expected):
    assert parse_target(spec) == expected


INVALID = [
    ("", "empty target"),
    ("   ,  ", "empty target"),
    ("sm_90", "'sm_90': expected key=value"),
    ("head_dims=128", "'head_dims=128': expected two numbers such as 128x128"),
    ("heads=0x32", "'heads=0x32': expected two numbers such as 128x128"),
    ("gpu=sm_9", "'gpu=sm_9': a GPU is sm_XY"),
    ("gpu=sm_90+", "'gpu=sm_90+': a GPU is sm_XY"),
    ("gpu=a100", "'gpu=a100': a GPU is sm_XY"),
    ("gpu=sm_90,gpu=sm_80", "'gpu=sm_80': gpu is given twice"),
    ("fla-core=0.6.0,fla_core=0.5.2", "'fla_core=0.5.2': fla_core is given twice"),
    ("os=linux,platform=linux-x86_64", "'platform=linux-x86_64': platform is given twice"),
    ("platform=linux-x86_64,arch=aarch64", "'arch=aarch64': arch is given twice"),
    ("torch=latest", "'torch=latest': 'latest' is not a version"),
    ("cuda=twelve", "'cuda=twelve': 'twelve' is not a version"),
    ("tilelang=0.1.x", "'tilelang=0.1.x': '0.1.x' is not a version"),
    ("nvcc=maybe", "'nvcc=maybe': 'maybe' is not a version"),
    ("python=2.7", "'python=2.7': python looks like 3.12"),
    ("python=3", "'python=3': python looks like 3.12"),
    ("python=3.12.1.4", "'python=3.12.1.4'"),
    ("cuda=12.8,hip=6.4", "cuda=... and hip=... together"),
    ("os=beos", "'os=beos': os must be one of linux, darwin, windows"),
    ("arch=mips", "'arch=mips': arch must be one of x86_64, aarch64"),
    ("platform=linux", "'platform=linux': platform looks like linux-x86_64"),
    ("platform=linux-sparc", "'platform=linux-sparc': arch must be one of"),
    ("xpu=maybe", "'xpu=maybe': expected yes or no"),
    ("abi=cxx11", "'abi=cxx11': expected yes or no"),
    ("colour=blue", "'colour=blue': unknown fact 'colour'; accepted: gpu, torch"),
    ("torch", "'torch': expected key=value"),
    ("memory=lots", "'memory=lots': memory is the GiB available, e.g. memory=128"),
    ("memory=0", "'memory=0': memory is the GiB available"),
    ("memory=inf", "'memory=inf': memory is the GiB available"),
]


@pytest.mark.parametrize("spec,fragment", INVALID, ids=[s or "empty" for s, _ in INVALID])
def test_invalid_spec_names_the_bad_entry(spec, fragment):
    with pytest.raises(ValueError) as info:
        parse_target(spec)
    assert fragment in str(info.value)


def test_first_bad_entry_is_named_not_a_later_good_one():
    with pytest.raises(ValueError) as info:
        parse_target("gpu=sm_90,torch=banana,cuda=12.8")
    assert "'torch=banana'" in str(info.value) and "cuda" not in str(info.value)


def test_a_posed_memory_sizes_the_builds_not_this_hosts():
    """The builds' jobs and split threads are sized by the memory a target poses (tests that assert them pass
    on a host of any memory); unposed, the memory is this host's."""
    from fastpath_hooks.facts.pins import load
    from fastpath_hooks.facts.probe import probe
    from fastpath_hooks.facts.settings import Settings

    pins = load()
    assert probe(Settings(target="gpu=sm_90,cpus=16,memory=3"), pins=pins).memory_gib == 3.0
    host = probe(Settings(target="gpu=sm_90,cpus=16"), pins=pins).memory_gib
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    assert host == pytest.approx(int(meminfo["MemAvailable"].split()[0]) / (1 << 20), abs=2.0)
