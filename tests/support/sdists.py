"""Stand-in causal-conv1d and mamba-ssm sdists, a fake CUDA toolkit and a fake ROCm, for source builds on a CPU machine.

The sdist's setup.py does what the real one (1.6.2.post1) does where fastpath-hooks
relies on it: without CAUSAL_CONV1D_FORCE_BUILD=TRUE it first tries to download a
release wheel (here: fails, as offline); with it, it asks `$CUDA_HOME/bin/nvcc -V` for
the release, hard-codes the same nine `-gencode` pairs by nvcc version, and compiles its
files with the compilers torch's ninja build would use, as that build runs them (it imports `wheel` and
`packaging` as the real one does, so they must be installed: no build isolation): the .cu
files with `PYTORCH_NVCC`, else `$CUDA_HOME/bin/nvcc`; the .cpp files with `$CXX` (torch: CXX,
else `c++`; here only when CXX is set - a test machine may have no host compiler), failing the
build when a compiler fails. Each compile is a shell command line, as ninja runs torch's rules: `PYTORCH_NVCC`
is put in as given (torch's `nvcc = $PYTORCH_NVCC`: a command such as `ccache nvcc`), every other compiler
quoted (torch 2.13's `shlex.join`), the arguments quoted. The flags are the real sdists': mamba-ssm hard-codes `-std=c++17`
for cxx and nvcc, causal-conv1d's CUDA path passes none (then torch's cpp_extension adds
`-std=c++20`, as it does only when no -std is given). causal-conv1d's HIP path (a stand-in for
`torch.version.hip`: HIP_ARCHITECTURES is set, as the policy sets it for ROCm builds) compiles
the .cu files with `PYTORCH_NVCC`, else `$ROCM_HOME/bin/hipcc`, with `-std=c++17
--offload-arch=$HIP_ARCHITECTURES`, like the real one. The wheel is a platform wheel
(cpXY-cpXY-linux_<arch>) holding the fake `causal_conv1d` module of wheels.py.

The toolkit's `bin/nvcc` (ROCm's `bin/hipcc`) answers `--version` like nvcc 13.0 (hipcc 6.4) and
appends every other argv to `<home>/calls.jsonl`; a file `<home>/FAIL` makes it fail like a
compile error, and `<home>/DELAY` (seconds) makes every compile take that long. Its host compiler
`<home>/host/c++` (give it as CXX) records into `<home>/host-calls.jsonl`; `<home>/FAIL_HOST`
makes it fail like g++ on a missing header.

`fake_ccache(dir)` puts a `ccache` there that works like the real one where fastpath-hooks relies
on it: it runs the compiler it is given, keeps the object under a key of the command line (the
`-o` path left out) and the source's bytes, hands it back on the next identical compile without
running the compiler, and writes each result to `$CCACHE_STATSLOG` as ccache 4.x does.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile


_SETUP = r'''
import os
import shlex
import subprocess

from packaging.version import parse  # noqa: F401 - imported like the real setup.py (no build isolation)
from setuptools import setup
from setuptools.dist import Distribution
from wheel.bdist_wheel import bdist_wheel

FORCE_BUILD = os.getenv("CAUSAL_CONV1D_FORCE_BUILD", "FALSE") == "TRUE"
SKIP_CUDA_BUILD = os.getenv("CAUSAL_CONV1D_SKIP_CUDA_BUILD", "FALSE") == "TRUE"
COMPILE_CUDA = True
SOURCES = ["csrc/causal_conv1d.cu", "csrc/causal_conv1d_fwd.cu", "csrc/causal_conv1d_bwd.cu"]
CXX_SOURCES = ["csrc/causal_conv1d.cpp"]
CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3", "--threads", "4"]
HIP_BUILD = bool(os.getenv("HIP_ARCHITECTURES"))   # stands in for torch.version.hip
HIP_CXX_FLAGS = ["-O3", "-std=c++17"]
HIP_FLAGS = ["-O3", "-std=c++17", "--offload-arch=" + os.getenv("HIP_ARCHITECTURES", "native")]


def with_torch_std(flags):
    """torch's cpp_extension adds its own -std only when none is given."""
    return flags if any(f.startswith("-std=") for f in flags) else flags + ["-std=c++20"]


def cuda_home():
    """As torch.utils.cpp_extension finds it: CUDA_HOME / CUDA_PATH, else /usr/local/cuda."""
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"


def bare_metal_version(home):
    out = subprocess.check_output([os.path.join(home, "bin", "nvcc"), "-V"], text=True)
    release = out.split("release ")[1].split(",")[0]
    return tuple(int(x) for x in release.split("."))


def gencode_flags(version):
    """The real setup.py's hard-coded pairs (it ignores TORCH_CUDA_ARCH_LIST)."""
    flags = []
    for arch in ("75", "80", "87"):
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    if version >= (11, 8):
        flags += ["-gencode", "arch=compute_90,code=sm_90"]
    if version >= (12, 8):
        flags += ["-gencode", "arch=compute_100,code=sm_100", "-gencode", "arch=compute_120,code=sm_120"]
    if version >= (13, 0):
        for arch in ("103", "110", "121"):
            flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    return flags


def device_compiler(default):
    """torch's ninja file: `nvcc = <PYTORCH_NVCC as given>`, else the default quoted."""
    return os.environ.get("PYTORCH_NVCC") or shlex.quote(default)


def compile_all(device, device_flags, cxx_flags):
    os.makedirs("build/obj", exist_ok=True)
    jobs = [(device, src, with_torch_std(device_flags)) for src in SOURCES]
    if os.environ.get("CXX"):
        jobs += [(shlex.quote(os.environ["CXX"]), src, with_torch_std(cxx_flags)) for src in CXX_SOURCES]
    for compiler, src, flags in jobs:
        obj = os.path.join("build/obj", os.path.basename(src) + ".o")
        command = compiler + " " + shlex.join(["-c", src, "-o", obj] + flags)   # ninja runs it with /bin/sh -c
        print("compiling", src, flush=True)
        if subprocess.run(command, shell=True).returncode != 0:
            raise RuntimeError(f"error compiling {src} with {compiler}")


class CachedWheelsCommand(bdist_wheel):
    def run(self):
        import shutil

        print("ninja:", shutil.which("ninja"), flush=True)   # torch's build takes the ninja on PATH
        if not SKIP_CUDA_BUILD and COMPILE_CUDA:
            if not FORCE_BUILD:
                raise RuntimeError("causal-conv1d: could not download the release wheel "
                                   "(urlopen error [Errno -3] Temporary failure in name resolution)")
            if HIP_BUILD:
                rocm = os.environ.get("ROCM_HOME") or os.environ.get("ROCM_PATH") or "/opt/rocm"
                hipcc = os.path.join(rocm, "bin", "hipcc")
                subprocess.check_output([hipcc, "--version"], text=True)
                compile_all(device_compiler(hipcc), HIP_FLAGS, HIP_CXX_FLAGS)
            else:
                home = cuda_home()
                compile_all(device_compiler(os.path.join(home, "bin", "nvcc")),
                            NVCC_FLAGS + gencode_flags(bare_metal_version(home)), CXX_FLAGS)
        super().run()


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(name="causal_conv1d", version="VERSION", packages=["causal_conv1d"], install_requires=["packaging"],
      cmdclass={"bdist_wheel": CachedWheelsCommand}, distclass=BinaryDistribution)
'''

_NVCC = r'''#!PYTHON
import json, os, sys

HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
args = sys.argv[1:]
if "--version" in args or "-V" in args:
    print("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
          "Built on Wed_Aug_20_01:58:59_PM_PDT_2025\nCuda compilation tools, release RELEASE, VRELEASE.88\n"
          "Build cuda_RELEASE.r13.0/compiler.36424714_0")
    sys.exit(0)
with open(os.path.join(HOME, "calls.jsonl"), "a") as fh:
    fh.write(json.dumps(args) + "\n")
if os.path.exists(os.path.join(HOME, "DELAY")):   # a compile that takes a while (concurrent builds overlap)
    import time
    time.sleep(float(open(os.path.join(HOME, "DELAY")).read() or 0))
if os.path.exists(os.path.join(HOME, "FAIL")):
    sys.stderr.write('csrc/causal_conv1d_fwd.cu(42): error: identifier "__nv_bfloat16" is undefined (fake nvcc)\n')
    sys.exit(1)
with open(args[args.index("-o") + 1], "w") as fh:
    fh.write("fake object\n")
'''

_HIPCC_VERSION = "HIP version: 6.4.43482-0f2d60242\nAMD clang version 19.0.0git (fake hipcc)\n"

_HOST = r'''#!PYTHON
import json, os, sys

HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
args = sys.argv[1:]
if args in (["-v"], ["--version"]):
    sys.stderr.write("Using built-in specs.\nCOLLECT_GCC=g++\ngcc version 12.2.0 (fake host compiler)\n")
    sys.exit(0)
with open(os.path.join(HOME, "host-calls.jsonl"), "a") as fh:
    fh.write(json.dumps(args) + "\n")
if os.path.exists(os.path.join(HOME, "FAIL_HOST")):
    sys.stderr.write("csrc/fake.cpp:1:10: fatal error: ATen/ATen.h: No such file or directory (fake g++)\n")
    sys.exit(1)
if "-o" in args:
    with open(args[args.index("-o") + 1], "w") as fh:
        fh.write("fake object\n")
'''


def causal_conv1d_sdist(dest: str, version: str = "1.6.2.post1", *, wrong: bool = False) -> str:
    """Write causal_conv1d-<version>.tar.gz into `dest`; return its path. wrong=True: the built kernel
    imports and runs but returns numbers 0.5 off (a miscompile such as causal-conv1d#105)."""
    from .wheels import conv_module

    os.makedirs(dest, exist_ok=True)
    root = f"causal_conv1d-{version}"
    files = {
        "setup.py": _SETUP.replace("VERSION", version),
        "pyproject.toml": '[build-system]\nrequires = ["setuptools>=70.1", "torch", "packaging"]\n'
                          'build-backend = "setuptools.build_meta"\n',
        "PKG-INFO": f"Metadata-Version: 2.1\nName: causal_conv1d\nVersion: {version}\n",
        "causal_conv1d/__init__.py": conv_module(version, wrong=wrong),
    }
    for src in ("causal_conv1d.cu", "causal_conv1d_fwd.cu", "causal_conv1d_bwd.cu"):
        files[f"csrc/{src}"] = f"// stand-in for {src}\n__global__ void k() {{}}\n"
    files["csrc/causal_conv1d.cpp"] = "// stand-in for causal_conv1d.cpp\n#include <torch/extension.h>\n"
    return _write_sdist(dest, root, files)


def _write_sdist(dest: str, root: str, files: dict) -> str:
    """<dest>/<root>.tar.gz holding `files` (path -> text) under <root>/, reproducibly (fixed mtime)."""
    path = os.path.join(dest, f"{root}.tar.gz")
    with tarfile.open(path, "w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size, info.mtime, info.mode = len(data), 1700000000, 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


class FakeToolkit:
    def __init__(self, home: str, compiler: str = "nvcc"):
        self.home = home
        self.nvcc = os.path.join(home, "bin", compiler)     # nvcc, or ROCm's hipcc
        self.cxx = os.path.join(home, "host", "c++")         # give it as CXX

    def calls(self) -> list:
        """argv of every compile (not --version) nvcc (hipcc) ran, in order."""
        return _read_calls(os.path.join(self.home, "calls.jsonl"))

    def host_calls(self) -> list:
        """argv of every call of the host compiler (not -v/--version), in order."""
        return _read_calls(os.path.join(self.home, "host-calls.jsonl"))

    def delay(self, seconds: float) -> None:
        """Every compile takes `seconds` from now on (0: none)."""
        with open(os.path.join(self.home, "DELAY"), "w") as fh:
            fh.write(str(seconds))

    def fail(self, on: bool = True) -> None:
        marker = os.path.join(self.home, "FAIL")
        if on:
            open(marker, "w").close()
        elif os.path.exists(marker):
            os.unlink(marker)


def _read_calls(path: str) -> list:
    try:
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def _script(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o755)


def fake_cuda_toolkit(home: str, release: str = "13.0") -> FakeToolkit:
    tk = FakeToolkit(home)
    _script(tk.nvcc, _NVCC.replace("PYTHON", sys.executable).replace("RELEASE", release))
    _script(tk.cxx, _HOST.replace("PYTHON", sys.executable))
    return tk


def fake_rocm(home: str) -> FakeToolkit:
    """ROCm's `bin/hipcc` (found through ROCM_HOME) recording its compiles, and a host compiler."""
    tk = FakeToolkit(home, compiler="hipcc")
    nvcc = _NVCC.replace("PYTHON", sys.executable)
    banner = nvcc[nvcc.index("    print("):nvcc.index("    sys.exit(0)")]
    _script(tk.nvcc, nvcc.replace(banner, f"    print({_HIPCC_VERSION!r})\n"))
    _script(tk.cxx, _HOST.replace("PYTHON", sys.executable))
    return tk


def last_std(argv) -> str | None:
    """The C++ standard a compiler argv ends up with (the last -std/--std; `-Xcompiler -std=..` counts
    for nvcc's host side too), e.g. 'c++20'."""
    found = None
    for i, arg in enumerate(argv):
        if arg in ("-std", "--std") and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(("-std=", "--std=")):
            found = arg.split("=", 1)[1]
        elif arg in ("-Xcompiler", "--compiler-options") and i + 1 < len(argv):
            for part in argv[i + 1].split(","):
                if part.startswith(("-std=", "--std=")):
                    found = part.split("=", 1)[1]
    return found


def std_flags(argv) -> list:
    """Every C++ standard option in one argv, in order (`-Xcompiler -std=..` too)."""
    out = []
    for i, arg in enumerate(argv):
        if arg.startswith(("-std=", "--std=")) or arg in ("-std", "--std"):
            out.append(arg)
        elif arg in ("-Xcompiler", "--compiler-options") and i + 1 < len(argv) and "std=" in argv[i + 1]:
            out.append(f"{arg} {argv[i + 1]}")
    return out


def gencode_codes(argv) -> list:
    """The codes of the -gencode pairs in one nvcc argv, e.g. ['sm_90']."""
    out = []
    for i, arg in enumerate(argv):
        pair = argv[i + 1] if arg in ("-gencode", "--generate-code") and i + 1 < len(argv) else \
            arg.split("=", 1)[1] if arg.startswith(("-gencode=", "--generate-code=")) else None
        if pair:
            out.append(pair.split("code=", 1)[1])
    return out


# -- mamba-ssm -------------------------------------------------------------------------------

MAMBA_SOURCES = ("csrc/selective_scan/selective_scan.cpp",) + tuple(
    f"csrc/selective_scan/selective_scan_{kind}.cu" for kind in (
        "fwd_fp32", "fwd_fp16", "fwd_bf16", "bwd_fp32_real", "bwd_fp32_complex", "bwd_fp16_real",
        "bwd_fp16_complex", "bwd_bf16_real", "bwd_bf16_complex"))


def _mamba_setup(version: str, requires, *, opt_in_cuda: bool = False) -> str:
    """The causal-conv1d stand-in's setup.py, with mamba-ssm's switches (MAMBA_FORCE_BUILD,
    MAMBA_SKIP_CUDA_BUILD), its nine .cu files, its .cpp, its flags (`-std=c++17` for cxx and nvcc,
    as the real 2.3.1 / 2.3.2.post1 / main hard-code) and its package tree (the real 2.3.2.post1
    hard-codes the same -gencode pairs by nvcc version). opt_in_cuda: like mamba-ssm main (#977),
    the CUDA extension is compiled - and shipped - only with MAMBA_KEEP_CUDA_BUILD=TRUE."""
    text = _SETUP.replace("CAUSAL_CONV1D_FORCE_BUILD", "MAMBA_FORCE_BUILD")
    text = text.replace("CAUSAL_CONV1D_SKIP_CUDA_BUILD", "MAMBA_SKIP_CUDA_BUILD")
    text = text.replace('"causal-conv1d: could not download', '"mamba-ssm: could not download')
    cu = [s for s in MAMBA_SOURCES if s.endswith(".cu")]
    cpp = [s for s in MAMBA_SOURCES if s.endswith(".cpp")]
    for old, new in (
            ('SOURCES = ["csrc/causal_conv1d.cu", "csrc/causal_conv1d_fwd.cu", "csrc/causal_conv1d_bwd.cu"]',
             f"SOURCES = {cu!r}"),
            ('CXX_SOURCES = ["csrc/causal_conv1d.cpp"]', f"CXX_SOURCES = {cpp!r}"),
            ('CXX_FLAGS = ["-O3"]', 'CXX_FLAGS = ["-O3", "-std=c++17"]'),
            ('NVCC_FLAGS = ["-O3", "--threads", "4"]',
             'NVCC_FLAGS = ["-O3", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr", '
             '"--threads", "4"]')):
        assert old in text
        text = text.replace(old, new)
    if opt_in_cuda:
        text = text.replace("COMPILE_CUDA = True", 'COMPILE_CUDA = os.getenv("MAMBA_KEEP_CUDA_BUILD", "FALSE") == "TRUE"')
    old = ('setup(name="causal_conv1d", version="VERSION", packages=["causal_conv1d"], install_requires=["packaging"],')
    assert old in text
    packages = ["mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"]
    modules = '["selective_scan_cuda"] if COMPILE_CUDA else []'
    return text.replace(old, f'setup(name="mamba_ssm", version="{version}", packages={packages!r}, '
                             f'py_modules={modules}, install_requires={list(requires)!r},')


def mamba_ssm_sdist(dest: str, version: str = "2.3.2.post1", *, requires=None, opt_in_cuda: bool = False) -> str:
    """Write mamba_ssm-<version>.tar.gz into `dest` (the stand-in package of wheels.mamba_ssm_files,
    built by a setup.py that compiles like the real one, see _mamba_setup); return its path.
    opt_in_cuda: the next release's behaviour (mamba-ssm main, #977): no CUDA compile and no
    selective_scan_cuda without MAMBA_KEEP_CUDA_BUILD=TRUE; `import mamba_ssm` works without it and
    the Mamba-1 functions raise at their first call."""
    from .wheels import MAMBA_REQUIRES, mamba_ssm_files

    if requires is None:
        requires = MAMBA_REQUIRES.get(version, MAMBA_REQUIRES["2.3.2.post1"])
    os.makedirs(dest, exist_ok=True)
    root = f"mamba_ssm-{version}"
    files = {
        "setup.py": _mamba_setup(version, requires, opt_in_cuda=opt_in_cuda),
        "pyproject.toml": '[build-system]\nrequires = ["setuptools>=61.0.0", "wheel", "packaging", "ninja"]\n'
                          'build-backend = "setuptools.build_meta"\n',
        "PKG-INFO": f"Metadata-Version: 2.1\nName: mamba_ssm\nVersion: {version}\n" +
                    "".join(f"Requires-Dist: {r}\n" for r in requires),
        **mamba_ssm_files(version, opt_in_cuda=opt_in_cuda),
    }
    for src in MAMBA_SOURCES:
        files[src] = f"// stand-in for {src}\n__global__ void k() {{}}\n"
    return _write_sdist(dest, root, files)


# -- a kernel fastpath-hooks does not ship: foo-conv -------------------------------------------------

FOO_CONV_MODULE = '''"""A stand-in compiled kernel that only a user's pins file knows (tests/test_user_kernels.py)."""
__version__ = "VERSION"


def foo_conv_fn(x):
    return x
'''


def foo_conv_sdist(dest: str, version: str = "0.1.0") -> str:
    """Write foo_conv-<version>.tar.gz: the causal-conv1d stand-in's setup.py (the same hard-coded
    -gencode pairs, compiling with the nvcc it is given) under foo-conv's names (FOO_CONV_FORCE_BUILD,
    csrc/foo_conv*.cu, the package foo_conv)."""
    text = _SETUP.replace("CAUSAL_CONV1D", "FOO_CONV").replace("causal_conv1d", "foo_conv").replace("causal-conv1d", "foo-conv")
    root = f"foo_conv-{version}"
    files = {
        "setup.py": text.replace("VERSION", version),
        "pyproject.toml": '[build-system]\nrequires = ["setuptools>=70.1", "torch", "packaging"]\n'
                          'build-backend = "setuptools.build_meta"\n',
        "PKG-INFO": f"Metadata-Version: 2.1\nName: foo_conv\nVersion: {version}\n",
        "foo_conv/__init__.py": FOO_CONV_MODULE.replace("VERSION", version),
    }
    for src in ("foo_conv.cu", "foo_conv_fwd.cu", "foo_conv_bwd.cu"):
        files[f"csrc/{src}"] = f"// stand-in for {src}\n__global__ void k() {{}}\n"
    os.makedirs(dest, exist_ok=True)
    return _write_sdist(dest, root, files)


_CCACHE = r'''#!PYTHON
import hashlib, json, os, shutil, subprocess, sys

STORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "store")
args = sys.argv[1:]
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.jsonl"), "a") as fh:
    fh.write(json.dumps(args) + "\n")
out = args[args.index("-o") + 1] if "-o" in args else None
source = next((a for a in args if a.endswith((".cu", ".cpp"))), None)
key = hashlib.sha256(json.dumps([a for a in args if a != out]).encode()
                     + (open(source, "rb").read() if source and os.path.exists(source) else b"")).hexdigest()
cached = os.path.join(STORE, key)
log = os.environ.get("CCACHE_STATSLOG")
def stats(counter):
    if log:
        with open(log, "a") as fh:
            fh.write("# %s\n%s\n" % (source, counter))
if out and os.path.exists(cached):
    shutil.copyfile(cached, out)
    stats("direct_cache_hit")
    sys.exit(0)
code = subprocess.call(args)
if code == 0 and out:
    os.makedirs(STORE, exist_ok=True)
    shutil.copyfile(out, cached)
    stats("cache_miss")
sys.exit(code)
'''


def fake_ccache(directory: str) -> str:
    """A stand-in `ccache` in `directory` (see the module docstring); its calls in calls.jsonl there."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "ccache")
    with open(path, "w") as fh:
        fh.write(_CCACHE.replace("PYTHON", sys.executable))
    os.chmod(path, 0o755)
    return path
