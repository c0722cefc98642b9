"""The environment probe: real facts of this machine, cheap (no torch import on a CPU
build), every fact overridable with a target spec, versions from dist-info names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version as dist_version

import pytest

from fastpath_hooks.facts.distributions import canonical_name, scan
from fastpath_hooks.facts.environment import Environment
from fastpath_hooks.facts.probe import probe
from fastpath_hooks.facts.settings import Settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support.venvs import clean_env  # noqa: E402


def run_probe(code: str, **env) -> dict:
    """Run `code` (which prints one JSON line last) in a fresh interpreter of this venv."""
    result = subprocess.run([sys.executable, "-c", code], env=clean_env(**env), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_real_probe_on_this_machine_is_cheap_and_correct():
    data = run_probe(
        "import json, sys\n"
        "from fastpath_hooks.facts.probe import probe\n"
        "env = probe()\n"
        "print(json.dumps({'env': env.to_json(), 'torch_imported': 'torch' in sys.modules,"
        " 'metadata_imported': 'importlib.metadata' in sys.modules}))")
    env = data["env"]
    assert env["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert env["prefix"] == os.path.realpath(sys.prefix)
    assert env["distributions"]["transformers"] == dist_version("transformers")
    torch = env["distributions"].get("torch")
    if torch is not None:
        assert torch == dist_version("torch") and env["torch"] == torch
    # a CPU machine: the probe reads torch's build from torch/version.py and never imports torch
    assert env["accelerator"] is None and env["gpus"] == []
    assert env["gpu_source"] in ("none: torch is a CPU build", "none: torch is not installed")
    assert not data["torch_imported"]
    assert not data["metadata_imported"]
    assert env["posed"] == []


POSED = [
    ("gpu=sm_90,torch=2.11.0,cuda=13.0,triton=3.6.0,python=3.12",
     dict(accelerator="cuda", torch_build="CUDA 13.0", triton="3.6.0", triton_dist="triton", python="3.12",
          gpus=("sm_90",), gpu_source="target", torch="2.11.0")),
    ("hip=6.4,gpu=gfx942,torch=2.9.1,triton=3.5.0",
     dict(accelerator="rocm", torch_build="ROCm 6.4", torch_cuda=None, triton_dist="pytorch-triton-rocm")),
    ("gpu=none", dict(accelerator=None, gpus=(), gpu_source="target")),
    ("gpu=xpu,torch=2.9.0,triton=3.5.0", dict(accelerator="xpu", torch_xpu=True, triton_dist="pytorch-triton-xpu")),
    ("gpu=sm_80", dict(gpus=("sm_80",), accelerator=None)),      # this host's CPU torch cannot use it
    ("torch=none,gpu=sm_90,cuda=12.8", dict(torch=None, accelerator=None)),
    ("triton=none", dict(triton=None, triton_dist=None)),
    ("nvcc=no,uv=no", dict(nvcc=None, uv=None)),
    ("uv=yes", dict(uv="posed")),
    ("platform=linux-aarch64,glibc=2.31,abi=no", dict(arch="aarch64", platform="linux-aarch64", glibc="2.31",
                                                      cxx11_abi=False)),
]


@pytest.mark.parametrize("spec,expected", POSED, ids=[s for s, _ in POSED])
def test_posed_facts_override_the_probe(spec, expected):
    env = probe(Settings(target=spec))
    for key, value in expected.items():
        assert getattr(env, key) == value, key
    assert env.posed


def test_a_posed_nvcc_release_never_replaces_the_real_toolkit(tmp_path, monkeypatch):
    """`nvcc=13.0` in the target (an image builder's `--target` with CUDA_HOME set) says which release the
    toolkit is; the compiler that runs - and gets the arch restriction - stays the real one."""
    from support import sdists

    real = probe(Settings())
    if real.nvcc is None:   # no toolkit on this machine: a posed one stands for one
        assert probe(Settings(target="nvcc=yes")).nvcc == "posed"
    tk = sdists.fake_cuda_toolkit(str(tmp_path / "cuda"), release="13.0")
    monkeypatch.setenv("CUDA_HOME", tk.home)
    env = probe(Settings(target="nvcc=13.0"))
    assert (env.nvcc, env.nvcc_version) == (tk.nvcc, "13.0") and "nvcc" in env.posed
    assert probe(Settings(target="nvcc=12.8")).nvcc == tk.nvcc
    assert probe(Settings(target="nvcc=yes")).nvcc == tk.nvcc
    assert (probe(Settings(target="nvcc=no")).nvcc, probe(Settings(target="nvcc=no")).nvcc_version) == (None, None)


def test_posed_distributions_replace_or_remove_installed_ones():
    env = probe(Settings(target="fla-core=0.6.0,transformers=none,tilelang=0.1.15,triton=3.6.0,gpu=sm_90,cuda=12.8"))
    assert env.version("fla-core") == "0.6.0" and env.version("tilelang") == "0.1.15"
    assert env.version("transformers") is None
    assert env.version("triton") == "3.6.0"
    assert {"fla-core", "transformers", "tilelang", "gpus", "triton", "cuda"} <= set(env.posed)


def test_scan_reads_versions_from_dist_info_names(tmp_path):
    for name in ("fla_core-0.6.0.dist-info", "Flash_Linear_Attention-0.6.0.dist-info", "foo-1.0-py3.11.egg-info",
                 "apache_tvm_ffi-0.1.12.dist-info", "apache_tvm_ffi-0.1.15.post2.dist-info", "not-a-dist"):
        (tmp_path / name).mkdir()
    odd = tmp_path / "weird.dist-info"
    odd.mkdir()
    (odd / "METADATA").write_text("Metadata-Version: 2.1\nName: weird\nVersion: 3.2.1\n\nbody\n")
    found, duplicates = scan([str(tmp_path)])
    versions = {k: v.version for k, v in found.items()}
    assert versions["fla-core"] == "0.6.0" and versions["flash-linear-attention"] == "0.6.0"
    assert versions["foo"] == "1.0" and versions["weird"] == "3.2.1"
    assert "not-a-dist" not in versions
    assert sorted(d.version for d in duplicates["apache-tvm-ffi"]) == ["0.1.12", "0.1.15.post2"]


def test_first_directory_on_the_path_wins(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    (first / "tilelang-0.1.15.dist-info").mkdir(parents=True)
    (second / "tilelang-0.1.8.dist-info").mkdir(parents=True)
    found, duplicates = scan([str(first), str(second)])
    assert found["tilelang"].version == "0.1.15" and not duplicates


def test_half_installed_kernel_distribution_is_reported(tmp_path):
    for name in ("apache_tvm_ffi-0.1.12.dist-info", "apache_tvm_ffi-0.1.15.post2.dist-info", "tilelang-0.1.15.dist-info"):
        (tmp_path / name).mkdir()
    data = run_probe("import json; from fastpath_hooks.facts.probe import probe; print(json.dumps(probe().to_json()))",
                     PYTHONPATH=str(tmp_path))
    assert data["half_installed"] == ["apache-tvm-ffi"]
    assert data["distributions"]["tilelang"] == "0.1.15"


def test_torch_build_is_read_from_version_py_without_importing_torch(tmp_path):
    (tmp_path / "torch-2.10.0+cu128.dist-info").mkdir()
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.10.0+cu128'\ncuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n")
    (tmp_path / "torch" / "__init__.py").write_text("raise RuntimeError('the probe must not import torch here')\n")
    data = run_probe(
        "import json, sys; from fastpath_hooks.facts.probe import probe; from fastpath_hooks.facts.settings import Settings\n"
        "env = probe(Settings(), allow_torch_import=False)\n"
        "print(json.dumps({'build': env.torch_build, 'torch': env.torch, 'source': env.gpu_source,"
        " 'imported': 'torch' in sys.modules}))", PYTHONPATH=str(tmp_path))
    assert data == {"build": "CUDA 12.8", "torch": "2.10.0+cu128", "source": "not probed (torch not imported)",
                    "imported": False}


def test_wheelhouse_lists_package_files(tmp_path):
    for name in ("fla_core-0.6.0-py3-none-any.whl", "causal_conv1d-1.6.2.post1.tar.gz", "README.txt"):
        (tmp_path / name).write_text("x")
    env = probe(Settings(find_links=(str(tmp_path), "https://example.org/wheels/")))
    assert env.wheelhouse == ("causal_conv1d-1.6.2.post1.tar.gz", "fla_core-0.6.0-py3-none-any.whl")


def test_fla_tilelang_variable_is_a_fact(monkeypatch):
    monkeypatch.setenv("FLA_TILELANG", "0")
    monkeypatch.delenv("FLA_FLASH_QLA", raising=False)
    assert probe(Settings(target="gpu=none")).switches == {"FLA_TILELANG": "0"}
    monkeypatch.setenv("FLA_FLASH_QLA", "0")          # flash-qla's switch (the pins' `switch` of a backend)
    assert probe(Settings(target="gpu=none")).switches == {"FLA_TILELANG": "0", "FLA_FLASH_QLA": "0"}


def test_the_models_shapes_are_read_from_the_imported_configs(monkeypatch):
    """A modeling module imports its configuration module before it chooses its kernels: the class defaults
    of the attributes the pins name are the shapes fla's gated delta rule will see (where the user's config
    keeps them); posed: head_dims= / heads=."""
    import types

    from fastpath_hooks.facts.pins import load
    from fastpath_hooks.facts.probe import model_shapes

    module = types.ModuleType("transformers.models.qwen3_5.configuration_qwen3_5")
    config = type("Qwen3_5TextConfig", (), {"__module__": module.__name__, "linear_key_head_dim": 128,
                                              "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                                              "linear_num_value_heads": 32})
    derived = type("OlmoHybridConfig", (), {"__module__": "transformers.models.olmo_hybrid.configuration_olmo_hybrid",
                                            "linear_key_head_dim": None, "linear_value_head_dim": None})
    module.Qwen3_5TextConfig = config
    other = types.ModuleType("transformers.models.olmo_hybrid.configuration_olmo_hybrid")
    other.OlmoHybridConfig = derived
    modules = {module.__name__: module, other.__name__: other, "transformers.models.qwen3_5.modeling_qwen3_5": module}
    assert model_shapes(load(), modules) == (("olmo_hybrid", None, None, None, None), ("qwen3_5", 128, 128, 16, 32))
    posed = probe(Settings(target="gpu=sm_90,cuda=12.8,torch=2.10.0,head_dims=64x64,heads=4x8"))
    assert posed.model_shapes == (("posed", 64, 64, 4, 8),)
    assert posed.to_json()["model_shapes"] == [{"model": "posed", "k": 64, "v": 64, "heads_k": 4, "heads_v": 8}]


def test_the_jit_caches_are_under_fastpath_hooks_cache_unless_set(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.delenv("TILELANG_CACHE_DIR", raising=False)
    env = probe(Settings(target="gpu=none", cache_dir=str(tmp_path / "cache")))
    assert env.jit_caches == {"TRITON_CACHE_DIR": str(tmp_path / "mine"),
                              "TILELANG_CACHE_DIR": str(tmp_path / "cache" / "jit" / "tilelang")}
    assert env.jit_caches_given == ("TRITON_CACHE_DIR",)


def test_our_own_jit_cache_directory_set_earlier_in_the_process_is_not_the_users(monkeypatch, tmp_path):
    """A decision of this process set TRITON_CACHE_DIR to fastpath-hooks' directory (apply_env); the read after an
    install must not take it for the user's choice, or the decision (and the warm verdict the next process
    applies) loses it - on the H200 the next training process then compiled everything again."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache" / "jit" / "triton") + "/")
    monkeypatch.delenv("TILELANG_CACHE_DIR", raising=False)
    env = probe(Settings(target="gpu=none", cache_dir=str(tmp_path / "cache")))
    assert env.jit_caches_given == ()
    assert env.jit_caches["TRITON_CACHE_DIR"].rstrip("/") == str(tmp_path / "cache" / "jit" / "triton")


def test_environment_is_immutable_and_json_ready():
    env = probe(Settings(target="gpu=sm_90,cuda=12.8,torch=2.10.0,triton=3.6.0"))
    assert isinstance(env, Environment)
    with pytest.raises(AttributeError):
        env.torch = "1.0"  # type: ignore[misc]
    data = json.loads(json.dumps(env.to_json()))
    assert data["accelerator"] == "cuda" and data["platform"] == env.platform and data["torch_build"] == "CUDA 12.8"


@pytest.mark.parametrize("raw,canonical", [("Flash_Linear.Attention", "flash-linear-attention"),
                                           ("apache__tvm--ffi", "apache-tvm-ffi"), ("Torch", "torch")])
def test_canonical_name(raw, canonical):
    assert canonical_name(raw) == canonical
