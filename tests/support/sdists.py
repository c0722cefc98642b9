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


# -- flash-attn (FA2) and FlashAttention-3 (its hopper/ directory) ------------------------------------

# The module both stand-ins ship: flash_attn_func / flash_attn_varlen_func with the real signatures' leading
# arguments, computing attention in torch (scaled_dot_product_attention in float32, the result in the input's
# dtype); `wrong`: 0.5 added to the output (a miscompile), so the numeric check has something to catch.
ATTENTION_MODULE = r'''"""A stand-in for VERSION's kernels (tests/support/sdists.py): attention computed in torch."""
import torch
import torch.nn.functional as F

__version__ = "VERSION"
FAKE_FLASH_ATTN = True
WRONG = WRONG_VALUE
CALLS = {"func": 0, "varlen": 0}


def _attend(q, k, v, causal, scale):
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return out.transpose(1, 2) + (0.5 if WRONG else 0.0)


def flash_attn_func(q, k, v, *args, softmax_scale=None, causal=False, **kwargs):
    CALLS["func"] += 1
    return _attend(q, k, v, causal, softmax_scale).to(q.dtype)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *args, softmax_scale=None,
                           causal=False, **kwargs):
    CALLS["varlen"] += 1
    bounds = cu_seqlens_q.tolist()
    pieces = [_attend(q[None, a:e], k[None, a:e], v[None, a:e], causal, softmax_scale)[0]
              for a, e in zip(bounds[:-1], bounds[1:])]
    return torch.cat(pieces, dim=0).to(q.dtype)


def flash_attn_with_kvcache(*args, **kwargs):
    raise NotImplementedError("the stand-in has no KV-cache kernel")
'''

BERT_PADDING = r'''"""flash_attn.bert_padding, as transformers imports it (pad_input, unpad_input)."""
import torch


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    cu = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu, int(seqlens.max()), seqlens


def pad_input(hidden_states, indices, batch, seqlen):
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
'''

# Both setup.py's command: a wheel with compiled code (FLASH_ATTENTION_SKIP_CUDA_BUILD: without), whose release wheel
# is guessed first (offline: fails) unless FLASH_ATTENTION_FORCE_BUILD; compile_all() is each one's own.
_FLASH_BUILD_COMMAND = r'''

class CachedWheelsCommand(bdist_wheel):
    def run(self):
        if not SKIP_CUDA_BUILD:
            if not FORCE_BUILD:
                raise RuntimeError("NAME: could not download the release wheel "
                                   "(urlopen error [Errno -3] Temporary failure in name resolution)")
            compile_all()
        super().run()


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True
'''

# flash-attn 2.8.3.post2's setup.py where fastpath-hooks relies on it: FLASH_ATTENTION_FORCE_BUILD (else a release
# wheel is guessed - offline: fails), FLASH_ATTENTION_SKIP_CUDA_BUILD, the -gencode pairs from FLASH_ATTN_CUDA_ARCHS
# (default 80;90;100;120; TORCH_CUDA_ARCH_LIST ignored) by nvcc version, nvcc `--threads $NVCC_THREADS` (4),
# -std=c++17, MAX_JOBS from free memory where unset (psutil); the .cu files with PYTORCH_NVCC, the .cpp with $CXX.
_FA2_SETUP = r'''
import os
import subprocess

from packaging.version import parse  # noqa: F401 - imported like the real setup.py (no build isolation)
from setuptools import setup
from setuptools.dist import Distribution
from wheel.bdist_wheel import bdist_wheel

FORCE_BUILD = os.getenv("FLASH_ATTENTION_FORCE_BUILD", "FALSE") == "TRUE"
SKIP_CUDA_BUILD = os.getenv("FLASH_ATTENTION_SKIP_CUDA_BUILD", "FALSE") == "TRUE"
SOURCES = SOURCES_VALUE
CXX_SOURCES = ["csrc/flash_attn/flash_api.cpp"]


def cuda_archs():
    return os.getenv("FLASH_ATTN_CUDA_ARCHS", "80;90;100;120").split(";")


def cuda_home():
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"


def bare_metal_version(home):
    out = subprocess.check_output([os.path.join(home, "bin", "nvcc"), "-V"], text=True)
    return tuple(int(x) for x in out.split("release ")[1].split(",")[0].split("."))


def cc_flags(version):
    flags = []
    if "80" in cuda_archs():
        flags += ["-gencode", "arch=compute_80,code=sm_80"]
    if version >= (11, 8) and "90" in cuda_archs():
        flags += ["-gencode", "arch=compute_90,code=sm_90"]
    if version >= (12, 8) and "100" in cuda_archs():
        flags += ["-gencode", "arch=compute_100,code=sm_100"]
    if version >= (12, 8) and "120" in cuda_archs():
        flags += ["-gencode", "arch=compute_120,code=sm_120"]
    return flags


def compile_all():
    home = cuda_home()
    nvcc = os.environ.get("PYTORCH_NVCC") or os.path.join(home, "bin", "nvcc")
    if not os.environ.get("MAX_JOBS"):
        import psutil  # noqa: F401 - the real NinjaBuildExtension sizes MAX_JOBS by free memory
        raise RuntimeError("stand-in: MAX_JOBS unset, the real build would size it by free memory")
    flags = ["-O3", "-std=c++17", "--threads", os.getenv("NVCC_THREADS") or "4"] + cc_flags(bare_metal_version(home))
    os.makedirs("build/obj", exist_ok=True)
    jobs = [(nvcc, src, flags) for src in SOURCES]
    if os.environ.get("CXX"):
        jobs += [(os.environ["CXX"], src, ["-O3", "-std=c++17"]) for src in CXX_SOURCES]
    for compiler, src, flags in jobs:
        obj = os.path.join("build/obj", os.path.basename(src) + ".o")
        print("compiling", src, flush=True)
        if subprocess.run([compiler, "-c", src, "-o", obj] + flags).returncode != 0:
            raise RuntimeError(f"error compiling {src} with {compiler}")

''' + _FLASH_BUILD_COMMAND.replace("NAME", "flash-attn") + r'''

setup(name="flash_attn", version="VERSION", packages=["flash_attn"], install_requires=["einops"],
      cmdclass={"bdist_wheel": CachedWheelsCommand}, distclass=BinaryDistribution)
'''

# hopper/setup.py (FlashAttention-3) where fastpath-hooks relies on it: ../README.md read, FLASH_ATTENTION_FORCE_BUILD,
# nvcc >= 12.3, and unless it is 12.8 a download of NVIDIA's nvcc (offline: fails); the FLASH_ATTENTION_DISABLE_*
# switches as -D flags and as the list of instantiation files (the same product as the real one, fewer head dims
# per file), sm_90a for `_sm90.cu`, sm_80 for `_sm80.cu`, both for the others; an abi3 wheel (py_limited_api).
_FA3_SETUP = r'''
import itertools
import os
import subprocess

from setuptools import setup
from setuptools.dist import Distribution
from wheel.bdist_wheel import bdist_wheel

with open("../README.md", encoding="utf-8") as fh:
    long_description = fh.read()

FORCE_BUILD = os.getenv("FLASH_ATTENTION_FORCE_BUILD", "FALSE") == "TRUE"
SKIP_CUDA_BUILD = os.getenv("FLASH_ATTENTION_SKIP_CUDA_BUILD", "FALSE") == "TRUE"
SWITCHES = ["BACKWARD", "SPLIT", "PAGEDKV", "APPENDKV", "LOCAL", "SOFTCAP", "PACKGQA", "FP16", "FP8", "VARLEN",
            "CLUSTER", "HDIM64", "HDIM96", "HDIM128", "HDIM192", "HDIM256", "SM80"]
DISABLED = {name for name in SWITCHES if os.getenv(f"FLASH_ATTENTION_DISABLE_{name}", "FALSE") == "TRUE"}


def sources():
    dtypes = ["bf16"] + ([] if "FP16" in DISABLED else ["fp16"])
    fwd90 = dtypes + ([] if "FP8" in DISABLED else ["e4m3"])
    hdims = [h for h in (64, 96, 128, 192, 256) if f"HDIM{h}" not in DISABLED]
    split = [""] + ([] if "SPLIT" in DISABLED else ["_split"])
    paged = [""] + ([] if "PAGEDKV" in DISABLED else ["_paged"])
    softcap = [""] + ([] if "SOFTCAP" in DISABLED else ["_softcap"])
    packgqa = [""] + ([] if "PACKGQA" in DISABLED else ["_packgqa"])
    out = ["flash_api.cpp"]
    out += [f"instantiations/flash_fwd_hdim{h}_{d}{p}{s}{c}{g}_sm90.cu"
            for h, d, s, p, c, g in itertools.product(["all", "diff"], fwd90, split, paged, softcap, packgqa)
            if not (g and (p or s))]
    if "SM80" not in DISABLED:
        out += [f"instantiations/flash_fwd_hdim{h}_{d}_sm80.cu" for h, d in itertools.product(hdims, dtypes)]
    if "BACKWARD" not in DISABLED:
        out += [f"instantiations/flash_bwd_hdim{h}_{d}{c}_sm90.cu" for h, d, c in itertools.product(hdims, dtypes, [""])]
        if "SM80" not in DISABLED:
            out += [f"instantiations/flash_bwd_hdim{h}_{d}_sm80.cu" for h, d in itertools.product(hdims, dtypes)]
    if "SPLIT" not in DISABLED:
        out.append("flash_fwd_combine.cu")
    out.append("flash_prepare_scheduler.cu")
    return out


def compile_all():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    out = subprocess.check_output([os.path.join(home, "bin", "nvcc"), "-V"], text=True)
    version = tuple(int(x) for x in out.split("release ")[1].split(",")[0].split("."))
    if version < (12, 3):
        raise RuntimeError("FlashAttention-3 is only supported on CUDA 12.3 and above")
    if version != (12, 8):
        raise RuntimeError("downloading cuda_nvcc-linux-x86_64-12.6.85-archive.tar.xz from NVIDIA: "
                           "urlopen error [Errno -3] Temporary failure in name resolution")
    nvcc = os.environ.get("PYTORCH_NVCC") or os.path.join(home, "bin", "nvcc")
    features = [f"-DFLASHATTENTION_DISABLE_{'SM8x' if n == 'SM80' else n}" for n in SWITCHES if n in DISABLED]
    flags = ["--threads", os.getenv("NVCC_THREADS") or "2", "-O3", "-std=c++17"] + features
    sm90, sm80 = ["-gencode", "arch=compute_90a,code=sm_90a"], ["-gencode", "arch=compute_80,code=sm_80"]
    os.makedirs("build/obj", exist_ok=True)
    for src in sources():
        obj = os.path.join("build/obj", os.path.basename(src) + ".o")
        if src.endswith(".cpp"):
            if not os.environ.get("CXX"):
                continue
            argv = [os.environ["CXX"], "-c", src, "-o", obj, "-O3", "-std=c++17"] + features
        else:
            pairs = sm90 if src.endswith("_sm90.cu") else sm80 if src.endswith("_sm80.cu") else sm90 + sm80
            argv = [nvcc, "-c", src, "-o", obj] + flags + pairs
        print("compiling", src, flush=True)
        if subprocess.run(argv).returncode != 0:
            raise RuntimeError(f"error compiling {src}")

''' + _FLASH_BUILD_COMMAND.replace("NAME", "flash_attn_3") + r'''

setup(name="flash_attn_3", version="FA3_VERSION", packages=["flash_attn_3"], py_modules=["flash_attn_interface"],
      long_description=long_description, install_requires=["einops", "packaging", "ninja"],
      cmdclass={"bdist_wheel": CachedWheelsCommand}, distclass=BinaryDistribution,
      options={"bdist_wheel": {"py_limited_api": "cp39"}})
'''

FA2_SOURCES = tuple(f"csrc/flash_attn/src/flash_{kind}_hdim128_bf16_sm80.cu" for kind in ("fwd", "bwd", "fwd_split"))


def flash_attn_sdist(dest: str, version: str = "2.8.3.post2", *, wrong: bool = False, fa3_version: str = "3.0.0b1") -> str:
    """Write flash_attn-<version>.tar.gz into `dest` (its hopper/ holds FlashAttention-3 at `fa3_version`, with its
    kernel sources - the real sdist's hopper/ has only its setup.py and Python); return its path. wrong=True: both
    built kernels compute attention 0.5 off."""
    module = ATTENTION_MODULE.replace("WRONG_VALUE", repr(wrong))
    root = f"flash_attn-{version}"
    files = {
        "setup.py": _FA2_SETUP.replace("VERSION", version).replace("SOURCES_VALUE", repr(list(FA2_SOURCES))),
        "README.md": "# FlashAttention (stand-in)\n",
        "PKG-INFO": f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\nRequires-Dist: einops\n",
        "flash_attn/__init__.py": module.replace("VERSION", version),
        "flash_attn/bert_padding.py": BERT_PADDING,
        "csrc/flash_attn/flash_api.cpp": "// stand-in\n#include <torch/extension.h>\n",
        "hopper/setup.py": _FA3_SETUP.replace("FA3_VERSION", fa3_version),
        "hopper/flash_attn_interface.py": module.replace("VERSION", fa3_version),
        "hopper/flash_attn_3/__init__.py": f'"""The stand-in\'s compiled part (_C in the real one)."""\n__version__ = "{fa3_version}"\n',
        "hopper/flash_api.cpp": "// stand-in\n#include <torch/extension.h>\n",
        "hopper/flash_prepare_scheduler.cu": "// stand-in\n__global__ void k() {}\n",
        "hopper/flash_fwd_combine.cu": "// stand-in\n__global__ void k() {}\n",
    }
    for src in FA2_SOURCES:
        files[src] = f"// stand-in for {src}\n__global__ void k() {{}}\n"
    import itertools

    for h, d, rest in itertools.product(["all", "diff", 64, 96, 128, 192, 256], ["bf16", "fp16", "e4m3"],
                                        ["", "_split", "_paged", "_paged_split", "_softcap", "_packgqa",
                                         "_split_softcap", "_paged_softcap", "_paged_split_softcap", "_softcap_packgqa"]):
        for kind, arch in (("fwd", "sm90"), ("fwd", "sm80"), ("bwd", "sm90"), ("bwd", "sm80")):
            files[f"hopper/instantiations/flash_{kind}_hdim{h}_{d}{rest}_{arch}.cu"] = "__global__ void k() {}\n"
    os.makedirs(dest, exist_ok=True)
    return _write_sdist(dest, root, files)
