"""The build rules as data, for real on a CPU machine: the C++ standard torch needs (pins:
cxx_standard), the arch rules (pins: kernels.<name>.arch_rules) and a posed nvcc release that must
never change which compiler runs. Stand-in sdists whose setup.py calls the compilers it is given
(the .cu files with PYTORCH_NVCC / $CUDA_HOME/bin/nvcc / $ROCM_HOME/bin/hipcc, the .cpp files with
CXX, with the real sdists' hard-coded flags), fake compilers that record their argv, real pip
building in real venvs through `fastpath-hooks build`.

The wrapper unit tests and the log readers at the bottom are fast.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import offline_env
from support import sdists

HOST_213 = "cuda=13.0,torch=2.13.0,triton=3.7.1,cpus=16"
HOST_214 = "cuda=13.0,torch=2.14.1,triton=3.8.0,cpus=16"


@pytest.fixture
def house(tmp_path, build_dep_wheels):
    """Offline: both stand-in sdists and what building them needs."""
    path = str(tmp_path / "sdists")
    os.makedirs(path)
    for name in os.listdir(build_dep_wheels):
        os.link(os.path.join(build_dep_wheels, name), os.path.join(path, name))
    sdists.causal_conv1d_sdist(path)
    sdists.mamba_ssm_sdist(path)
    return path


def _log(proc, env) -> str:
    """The build log the lines name (short: `$FASTPATH_HOOKS_CACHE_DIR/logs/...`, what the shell expands back)."""
    logs = sorted({p.replace("$FASTPATH_HOOKS_CACHE_DIR", env["FASTPATH_HOOKS_CACHE_DIR"])
                   for p in re.findall(r"log: (\S+\.log)", proc.stdout + proc.stderr)})
    assert len(logs) == 1, proc.stdout + proc.stderr
    return open(logs[0]).read()


def _built(cache) -> list:
    where = os.path.join(cache, "wheels")
    return sorted(n for n in os.listdir(where) if n.endswith(".whl")) if os.path.isdir(where) else []


# -- the C++ standard: torch >= 2.14 needs C++20, whatever the sdist hard-codes ------------------

@pytest.mark.slow
@pytest.mark.parametrize("host,std", [(HOST_214, "c++20"), (HOST_213, None)], ids=["torch-2.14.1", "torch-2.13.0"])
def test_mamba_ssm_gets_a_last_cxx20_on_both_compilers_with_torch_214_and_nothing_changes_on_213(
        make_venv, toolkit, house, tmp_path, test_pins, host, std):
    cache = str(tmp_path / "cache")
    env = offline_env(house, host, cache_dir=cache, pins=test_pins(), CUDA_HOME=toolkit.home, CXX=toolkit.cxx)
    builder = make_venv(transformers=None)
    plan = json.loads(builder.cli("plan", "mamba-ssm", "--json", env=dict(env, FASTPATH_HOOKS_TARGET=host + ",gpu=sm_90,transformers=5.24.0"))
                      .stdout)
    (mamba,) = [d for d in plan["decisions"] if d["kernel"] == "mamba-ssm"]
    assert mamba["steps"][-1]["cxx_std"] == std
    proc = builder.cli("build", "mamba-ssm", "--arch", "sm_90", env=env)
    assert proc.returncode == 0, proc.stderr
    host_calls = toolkit.host_calls()
    nvcc_calls = [a for a in toolkit.calls() if any("selective_scan" in x for x in a)]
    assert len(host_calls) == 1 and len(nvcc_calls) == 9          # selective_scan.cpp, the nine .cu files
    assert all(sdists.gencode_codes(a) == ["sm_90"] for a in nvcc_calls)
    log = _log(proc, env)
    if std:
        # one -std each, the rule's, last: the sdist's -std=c++17 is gone (nvcc refuses two, and a host
        # side of another standard than nvcc's front end breaks the build)
        for argv in host_calls + nvcc_calls:
            assert sdists.std_flags(argv) == ["-std=c++20"] and argv[-1] == "-std=c++20", argv
        assert "building from source for sm_90 with nvcc 13.0 and -std=c++20" in proc.stdout
        assert "fastpath-hooks compiler wrapper: cxx gets -std=c++20 last (dropped -std=c++17)" in log
        assert "fastpath-hooks compiler wrapper: nvcc gets -std=c++20 last (dropped -std=c++17)" in log
        assert re.search(r"^# env: CXX=\S+/cxx-std$", log, re.M)
    else:
        # the sdist's own flags, as it wrote them: no C++ wrapper at all
        for argv in host_calls + nvcc_calls:
            assert sdists.std_flags(argv) == ["-std=c++17"], argv
        assert "compiler wrapper" not in log and "# env: CXX=" not in log and "-std=" not in proc.stdout
        assert re.search(r"^# env: PYTORCH_NVCC=\S+/nvcc-restricted$", log, re.M)   # the arch restriction stays
    assert [n.split("-")[1] for n in _built(cache)] == [f"2.3.2.post1+fph.torch{host.split('torch=')[1].split(',')[0]}"
                                                        ".cu130.abi1.sm90"]


@pytest.mark.slow
@pytest.mark.parametrize("host,std", [("hip=6.4,torch=2.14.1,cpus=16", "c++20"), ("hip=6.4,torch=2.13.0,cpus=16", None)],
                         ids=["torch-2.14.1", "torch-2.13.0"])
def test_causal_conv1d_hip_path_gets_a_last_cxx20_with_torch_214(make_venv, house, tmp_path, test_pins, host, std):
    """causal-conv1d's HIP path hard-codes -std=c++17 for hipcc and the host compiler (its CUDA path none)."""
    rocm = sdists.fake_rocm(str(tmp_path / "rocm"))
    env = offline_env(house, host, cache_dir=str(tmp_path / "cache"), pins=test_pins(), ROCM_HOME=rocm.home,
                      CXX=rocm.cxx)
    proc = make_venv(transformers=None).cli("build", "causal-conv1d", "--arch", "gfx942", env=env)
    assert proc.returncode == 0, proc.stderr
    hip_calls, host_calls = rocm.calls(), rocm.host_calls()
    assert len(hip_calls) == 3 and len(host_calls) == 1
    assert all("--offload-arch=gfx942" in argv for argv in hip_calls)
    for argv in hip_calls + host_calls:
        assert sdists.std_flags(argv) == [f"-std={std or 'c++17'}"], argv
        if std:
            assert argv[-1] == "-std=c++20"
    log = _log(proc, env)
    assert ("fastpath-hooks compiler wrapper: hipcc gets -std=c++20 last (dropped -std=c++17)" in log) == bool(std)


@pytest.mark.slow
def test_causal_conv1d_cuda_path_keeps_torchs_own_standard_and_gets_the_rules(make_venv, toolkit, house, tmp_path,
                                                                              test_pins):
    """Its CUDA path passes no -std (torch's cpp_extension adds its own): with torch 2.14 the wrappers
    hand -std=c++20 last all the same, one -std each."""
    env = offline_env(house, HOST_214, cache_dir=str(tmp_path / "cache"), pins=test_pins(), CUDA_HOME=toolkit.home,
                      CXX=toolkit.cxx)
    proc = make_venv(transformers=None).cli("build", "causal-conv1d", "--arch", "sm_90", env=env)
    assert proc.returncode == 0, proc.stderr
    for argv in toolkit.calls() + toolkit.host_calls():
        assert sdists.std_flags(argv) == ["-std=c++20"] and argv[-1] == "-std=c++20", argv


# -- arch rules: sm_103 gets sm_100 code with nvcc 13.x (causal-conv1d#105) -----------------------

@pytest.mark.slow
def test_a_visible_sm_103_with_nvcc_13_gets_sm_100_code_and_no_sm_103_pair(make_venv, toolkit, house, tmp_path,
                                                                           test_pins):
    cache = str(tmp_path / "cache")
    pins = test_pins()
    env = offline_env(house, HOST_213, cache_dir=cache, pins=pins, CUDA_HOME=toolkit.home)
    builder = make_venv(transformers=None)
    proc = builder.cli("build", "causal-conv1d", "--arch", "sm_103", env=env)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"building from source for sm_100 with nvcc 13\.0, about .*; sm_103 gets sm_100 code: "
                     r"causal-conv1d#105", proc.stdout), proc.stdout
    calls = toolkit.calls()
    assert len(calls) == 3 and all(sdists.gencode_codes(a) == ["sm_100"] for a in calls), calls
    assert not any("sm_103" in x for a in calls for x in a)
    (wheel,) = _built(cache)
    assert wheel.startswith("causal_conv1d-1.6.2.post1+fph.torch2.13.0.cu130.abi1.sm100-")
    # a machine with that GPU installs it from the cache (sm_100 code runs on sm_103), and says why
    node = offline_env(house, HOST_213 + ",gpu=sm_103", cache_dir=cache, pins=pins, CUDA_HOME=toolkit.home)
    plan = json.loads(builder.cli("plan", "causal-conv1d", "--json", env=node).stdout)
    (conv,) = [d for d in plan["decisions"] if d["kernel"] == "causal-conv1d"]
    assert conv["rule"] == "causal.cache" and wheel in conv["reason"]


@pytest.mark.slow
def test_a_posed_nvcc_release_with_a_real_toolkit_still_restricts_the_archs(make_venv, toolkit, house, tmp_path,
                                                                           test_pins):
    """The image builder's case (examples/Dockerfile): CUDA_HOME has a toolkit, `--target ...,nvcc=13.0` says its
    release. The compiler that runs is CUDA_HOME's, restricted to the arch asked for, and the label says
    what the wrapper kept."""
    cache = str(tmp_path / "cache")
    env = offline_env(house, HOST_213 + ",nvcc=13.0", cache_dir=cache, pins=test_pins(), CUDA_HOME=toolkit.home)
    proc = make_venv(transformers=None).cli("build", "causal-conv1d", "--arch", "sm_90", env=env)
    assert proc.returncode == 0, proc.stderr
    calls = toolkit.calls()
    assert len(calls) == 3 and all(sdists.gencode_codes(a) == ["sm_90"] for a in calls), calls
    assert re.findall(r"fastpath-hooks nvcc wrapper: kept (\S+);", _log(proc, env)) == ["arch=compute_90,code=sm_90"] * 3
    (wheel,) = _built(cache)
    assert ".abi1.sm90-" in wheel


# -- fast: the wrapper's rewriting, the log readers -------------------------------------------------

def test_the_nvcc_wrapper_drops_every_std_and_other_archs_and_appends_the_rule_last():
    from fastpath_hooks.act.compiler_wrapper import rewrite

    argv = ["-c", "x.cu", "-o", "x.o", "-std=c++17", "--std", "c++14", "-Xcompiler", "-fPIC,-std=gnu++17",
            "-Xcompiler=-std=c++17", "--compiler-options", "-O2", "-gencode", "arch=compute_90,code=sm_90",
            "--generate-code=arch=compute_100,code=[sm_100,compute_100]", "-gencode", "arch=compute_120,code=sm_120"]
    out, said = rewrite(argv, {"kind": "nvcc", "keep": ["sm_100"], "std": "c++20"})
    assert out == ["-c", "x.cu", "-o", "x.o", "-Xcompiler", "-fPIC", "--compiler-options", "-O2",
                   "--generate-code=arch=compute_100,code=[sm_100,compute_100]", "-std=c++20"]
    assert said[0] == ("fastpath-hooks nvcc wrapper: kept arch=compute_100,code=[sm_100,compute_100]; dropped "
                       "arch=compute_90,code=sm_90 arch=compute_120,code=sm_120")
    assert said[1].startswith("fastpath-hooks compiler wrapper: nvcc gets -std=c++20 last (dropped -std=c++17, "
                              "--std c++14, -Xcompiler -std=gnu++17, -Xcompiler -std=c++17)")
    # the arch filter alone leaves the standard as the sdist wrote it
    assert rewrite(argv[:5], {"kind": "nvcc", "keep": ["sm_90"], "std": None}) == (argv[:5], [])


@pytest.mark.parametrize("argv,expected", [
    (["-O3", "-std=c++17", "-c", "a.cpp", "-o", "a.o"], ["-O3", "-c", "a.cpp", "-o", "a.o", "-std=c++20"]),
    (["-c", "a.cpp"], ["-c", "a.cpp", "-std=c++20"]),                   # none given: the rule's all the same
    (["-v"], ["-v"]),                                                    # torch's compiler check
    (["a.o", "b.o", "-shared", "-o", "x.so"], ["a.o", "b.o", "-shared", "-o", "x.so"]),   # a link
], ids=["replaced", "added", "version-check", "link"])
def test_the_host_wrapper_hands_the_standard_last_to_compiles_only(argv, expected):
    from fastpath_hooks.act.compiler_wrapper import rewrite

    assert rewrite(argv, {"kind": "cxx", "keep": None, "std": "c++20"})[0] == expected


def test_the_label_says_what_the_wrapper_kept_not_what_was_asked(tmp_path):
    from fastpath_hooks.act.build import wrapper_codes

    log = tmp_path / "b.log"
    log.write_text("# fastpath-hooks source build\ncompiling csrc/a.cu\n"      # pip -v indents the output
                   "  fastpath-hooks nvcc wrapper: kept arch=compute_100,code=sm_100; dropped arch=compute_90,code=sm_90\n"
                   "fastpath-hooks nvcc wrapper: kept arch=compute_100,code=[sm_100,compute_100]; dropped none\n")
    assert wrapper_codes(str(log)) == {"sm_100"}
    log.write_text("compiling csrc/a.cu\n")
    assert wrapper_codes(str(log)) == set()


def test_a_failed_build_names_the_first_compiler_error_not_pips(tmp_path):
    from fastpath_hooks.act.build import first_compiler_error

    log = tmp_path / "b.log"
    log.write_text(
        "  error: subprocess-exited-with-error\n"
        "  running bdist_wheel\n"
        "  [1/3] c++ -MMD -c /src/csrc/selective_scan.cpp -o x.o -std=c++17\n"
        "  In file included from /src/csrc/selective_scan.cpp:5:\n"
        "  /venv/torch/include/ATen/ATen.h:4:2: error: #error C++20 or later compatible compiler is required to use ATen.\n"
        "  /src/csrc/selective_scan.cpp:80:1: error: second\n"
        "  error: command '/usr/bin/g++' failed with exit code 1\n"
        "ERROR: Failed building wheel for mamba-ssm\n")
    assert first_compiler_error(str(log)) == ("/venv/torch/include/ATen/ATen.h:4:2: error: #error C++20 or later "
                                              "compatible compiler is required to use ATen.")
    log.write_text('csrc/causal_conv1d_fwd.cu(42): error: identifier "__nv_bfloat16" is undefined\n')
    assert first_compiler_error(str(log)).startswith("csrc/causal_conv1d_fwd.cu(42): error: identifier")
    log.write_text("nvcc fatal   : Unsupported gpu architecture 'compute_103'\n")
    assert first_compiler_error(str(log)) == "nvcc fatal   : Unsupported gpu architecture 'compute_103'"
    log.write_text("error: subprocess-exited-with-error\nERROR: Failed building wheel\n")
    assert first_compiler_error(str(log)) is None


# -- the next mamba-ssm: its CUDA extension is opt-in (MAMBA_KEEP_CUDA_BUILD=TRUE, state-spaces/mamba #977) ------

NEXT = {"kernels": {"mamba-ssm": {"releases": [
    {"version": "2.4.0", "torch": ">=2.6", "triton": ">=3.5.0", "source": "upstream: the stand-in of the next release"}]}}}
H100_213 = "gpu=sm_90,cuda=13.0,torch=2.13.0,triton=3.7.1,cpus=16"


def _import_modeling(venv, model_type, env):
    code = ("import fastpath_hooks; fastpath_hooks.install()\n"
            f"import transformers.models.{model_type}.modeling_{model_type}\n"
            "import importlib.metadata as m, importlib.util as u\n"
            "print(m.version('mamba-ssm'), u.find_spec('selective_scan_cuda') is not None)\n")
    proc = venv.run(code, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.slow
def test_only_mamba2_in_use_builds_the_next_mamba_ssm_without_compiling_and_a_mamba1_model_rebuilds_it(
        make_venv, toolkit, tmp_path, build_dep_wheels, test_pins):
    """The rule: no CUDA compile when the modeling modules imported when the kernel is decided are of families
    that use only its Triton ops (mamba2 here) and none calls its extension; the wheel is labelled `py`; a
    later process importing a Mamba-1 family (mamba) rebuilds it with MAMBA_KEEP_CUDA_BUILD=TRUE."""
    house = str(tmp_path / "house")
    os.makedirs(house)
    for name in os.listdir(build_dep_wheels):
        os.link(os.path.join(build_dep_wheels, name), os.path.join(house, name))
    sdists.causal_conv1d_sdist(house)
    sdists.mamba_ssm_sdist(house, "2.4.0", opt_in_cuda=True)
    venv = make_venv()
    env = offline_env(house, H100_213, cache_dir=str(tmp_path / "cache"), pins=test_pins(extra=NEXT),
                      CUDA_HOME=toolkit.home)
    proc = _import_modeling(venv, "mamba2", env)
    assert re.search(r"mamba-ssm: building - 2\.4\.0 without its CUDA extension: only mamba2 in use", proc.stderr), \
        proc.stderr
    assert proc.stdout.split() == ["2.4.0+fph.torch2.13.0.cu130.abi1.py", "False"], proc.stdout + proc.stderr
    assert re.search(r"mamba-ssm: built without its CUDA extension in \d+ s; log: ", proc.stderr), proc.stderr
    mamba_calls = [a for a in toolkit.calls() if any("selective_scan" in x for x in a)]
    assert mamba_calls == [] and len(toolkit.calls()) == 3, "causal-conv1d compiled, mamba-ssm nothing"

    proc = _import_modeling(venv, "mamba", env)
    assert re.search(r"mamba-ssm: repairing - 2\.4\.0\S* lacks its CUDA extension, which mamba calls; rebuilding",
                     proc.stderr), proc.stderr
    assert re.search(r"mamba-ssm: building for sm_90 \(", proc.stderr), proc.stderr
    assert proc.stdout.split() == ["2.4.0+fph.torch2.13.0.cu130.abi1.sm90", "True"], proc.stdout + proc.stderr
    mamba_calls = [a for a in toolkit.calls() if any("selective_scan" in x for x in a)]
    assert len(mamba_calls) == 9 and all(sdists.gencode_codes(a) == ["sm_90"] for a in mamba_calls)


# -- torch 2.14 for real: its own headers need C++20, the rule gives it ------------------------------------

@pytest.mark.slow
@pytest.mark.network
def test_torch_214_headers_fail_with_cxx17_and_pass_through_the_rules_wrapper(tmp_path):
    """torch 2.14.1's ATen/ATen.h, from its PyPI wheel (three range requests, ~11 MB, cached once): the sdists'
    -std=c++17 fails on its #error; the same argv through the host-compiler wrapper a build writes for the pins'
    rule compiles. torch 2.13.0's headers (this venv's) accept c++17, and the rule leaves 2.13 alone."""
    import shutil
    import subprocess
    import sysconfig

    import torch.utils.cpp_extension  # noqa: F401 - only to find the installed torch's include directory

    from fastpath_hooks.act.build import first_compiler_error, write_wrapper
    from fastpath_hooks.facts.pins import load
    from support import torch_headers

    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ on this machine: the C++ rule's proof needs a real host compiler")
    try:
        include = torch_headers.torch_include("2.14.1")
    except torch_headers.Unreachable as exc:
        pytest.skip(f"torch 2.14.1's headers cannot be fetched (network unreachable): {exc}")
    pins = load()
    rule = pins.cxx_standard("2.14.1")
    assert rule is not None and rule.std == "c++20" and pins.cxx_standard("2.13.0") is None
    src = tmp_path / "aten.cpp"
    src.write_text("#include <ATen/ATen.h>\nint main() { return at::zeros({1}).dim() == 1 ? 0 : 1; }\n")

    def compile_(compiler, headers, *mode):
        argv = [compiler, "-O0", "-std=c++17", *mode, f"-I{headers}", f"-I{headers}/torch/csrc/api/include",
                f"-I{sysconfig.get_paths()['include']}", str(src), "-o", os.devnull]
        return subprocess.run(argv, capture_output=True, text=True, timeout=900)

    failed = compile_(gxx, include, "-E")           # the #error is the preprocessor's: seconds, not minutes
    log = tmp_path / "build.log"
    log.write_text(failed.stdout + failed.stderr)
    assert failed.returncode != 0
    assert "error: #error C++20 or later compatible compiler is required to use ATen" in first_compiler_error(str(log))

    wrapper = write_wrapper(str(tmp_path), "cxx-std", real=[gxx], kind="cxx", std=rule.std)
    passed = compile_(wrapper, include, "-fsyntax-only")   # a whole front-end pass over ATen, as a build's compile
    assert passed.returncode == 0, passed.stderr[-2000:]
    assert "fastpath-hooks compiler wrapper: cxx gets -std=c++20 last (dropped -std=c++17)" in passed.stderr

    import torch

    own = os.path.join(os.path.dirname(torch.__file__), "include")
    assert compile_(gxx, own, "-E").returncode == 0, "torch 2.13.0's headers take C++17: the rule need not apply"


@pytest.mark.slow   # two CLI processes (the policy row `causal.build: torch 2.13 ...` is the fast twin)
def test_plan_picks_causal_conv1d_170_for_torch_213_on_sm_90(tmp_path):
    """`fastpath-hooks plan` (this venv, a posed H100 with torch 2.13, which no release wheel serves): a build
    of causal-conv1d 1.7.0, the preferred release, for sm_90; torch 2.10 keeps 1.6.2.post1's pinned-digest wheel."""
    import subprocess
    import sys

    from support.venvs import clean_env

    def plan(target):
        proc = subprocess.run([sys.executable, "-m", "fastpath_hooks", "plan", "causal-conv1d", "--json"], text=True,
                              capture_output=True, timeout=300,
                              env=clean_env(FASTPATH_HOOKS_TARGET=target, FASTPATH_HOOKS_CACHE_DIR=str(tmp_path)))
        (conv,) = [d for d in json.loads(proc.stdout)["decisions"] if d["kernel"] == "causal-conv1d"]
        return conv

    conv = plan("gpu=sm_90,cuda=13.0,torch=2.13.0,nvcc=13.0,cpus=16")
    assert (conv["action"], conv["rule"], conv["target"]) == ("install", "causal.build", {"causal-conv1d": "1.7.0"})
    assert conv["steps"][-1]["requirements"] == ["causal-conv1d==1.7.0"] and conv["steps"][-1]["archs"] == ["sm_90"]
    old = plan("gpu=sm_90,cuda=12.8,torch=2.10.0,nvcc=12.8,python=3.12")
    assert old["rule"] == "causal.wheel" and old["steps"][-1]["sha256"]
    assert old["steps"][-1]["requirements"][0].startswith("causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-cp312")
