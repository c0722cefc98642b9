"""Source builds of compiled kernels: restricted to the GPU archs asked for, logged, keyed.

causal-conv1d's (and mamba-ssm's) setup.py hard-codes one `-gencode` pair per arch the
nvcc knows (nine with CUDA 13) and ignores TORCH_CUDA_ARCH_LIST: an all-arch build
outlasts most install timeouts. torch's ninja build takes nvcc from `PYTORCH_NVCC`, so
a generated wrapper (in the install's work directory) hands the real nvcc only the
pairs of the archs asked for. ROCm reads `HIP_ARCHITECTURES` (set by the policy).

The build runs `pip wheel --no-deps --no-build-isolation --no-cache-dir --no-binary
<dist>`: against the installed torch, never through pip's wheel cache (keyed by the sdist
alone, it would hand an old build back under a new torch), never taking a wheel instead
of the sdist. `MAX_JOBS` comes from the cores and the memory (nvcc runs 4 threads per job,
GBs each). The whole output goes to a log file that is kept (`<cache root>/logs/`) and
named in every message about the build. The wheel is then relabelled with its key
(`facts.cached_wheels.label`) so that it can be cached and shared.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import time
import zipfile
from dataclasses import dataclass

from .. import events
from ..facts import cached_wheels
from ..facts.frozen import FrozenMap, freeze_fields
from ..events.lines import shown_path
from ..facts.wheel_names import parse_wheel, with_local_label

WRAPPER_MARK = "fastpath-hooks nvcc wrapper:"
GIB_PER_JOB = 5.0   # nvcc --threads 4 of a causal-conv1d file: measured 4-6 GB resident per job (gpu-findings.md)


class BuildError(Exception):
    """The build failed; the message names the log file."""


@dataclass(frozen=True)
class Built:
    path: str          # the relabelled wheel, in the work directory
    log: str
    seconds: float
    key: FrozenMap     # what the binary depends on (also in the file name)

    _freezes_itself = True

    def __post_init__(self):
        freeze_fields(self)


def max_jobs(cpus: int | None, memory_gib: float | None) -> int:
    jobs = cpus or 1
    if memory_gib:
        jobs = min(jobs, int(memory_gib // GIB_PER_JOB))
    return max(1, jobs)


def log_path(root: str, distribution: str, version: str, archs) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    name = f"{distribution}-{version}-{'+'.join(archs) or 'all'}-{stamp}-{os.getpid()}.log"
    return os.path.join(root, "logs", name)


_WRAPPER = r'''# Written by fastpath-hooks for one source build: hands nvcc only the -gencode pairs of {keep}.
import os, sys

REAL = {real!r}
KEEP = {keep!r}
MARK = {mark!r}


def codes(spec):
    """'arch=compute_90,code=sm_90' or 'arch=compute_90,code=[sm_90,compute_90]' -> {{'sm_90'}}."""
    _, _, code = spec.partition("code=")
    out = set()
    for item in code.strip("[]\"'").split(","):
        item = item.strip().replace("compute_", "sm_")
        while item and item[-1].isalpha() and not item.endswith("sm_"):
            item = item[:-1]   # sm_90a / sm_100f: the family
        if item:
            out.add(item)
    return out


args, kept, dropped, i = [], [], [], 1
argv = sys.argv
while i < len(argv):
    arg = argv[i]
    for flag in ("-gencode", "--generate-code"):
        if arg == flag and i + 1 < len(argv):
            pair, pieces, i = argv[i + 1], [arg, argv[i + 1]], i + 2
            break
        if arg.startswith(flag + "="):
            pair, pieces, i = arg[len(flag) + 1:], [arg], i + 1
            break
    else:
        args.append(arg)
        i += 1
        continue
    if codes(pair) & set(KEEP):
        args.extend(pieces)
        kept.append(pair)
    else:
        dropped.append(pair)
if dropped and not kept:
    sys.stderr.write("fastpath-hooks nvcc wrapper: none of the -gencode pairs %s is for %s\n" % (dropped, ", ".join(KEEP)))
    sys.exit(2)
if kept or dropped:
    sys.stderr.write("%s kept %s; dropped %s\n" % (MARK, " ".join(kept), " ".join(dropped) or "none"))
    sys.stderr.flush()
os.execv(REAL, [REAL] + args)
'''


def nvcc_wrapper(work: str, real_nvcc: str, keep) -> str:
    """A `/bin/sh` script that runs the filter with this interpreter (a `#!python` line would break on
    interpreter paths with spaces or longer than the kernel's shebang limit)."""
    import shlex

    script = os.path.join(work, "nvcc-restricted.py")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(_WRAPPER.format(real=real_nvcc, keep=tuple(keep), mark=WRAPPER_MARK))
    path = os.path.join(work, "nvcc-restricted")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(script)} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def build_environ(step, *, env, work: str, jobs: int) -> dict:
    """The build's extra environment: the pins' variables, CUDA_HOME of the probed nvcc, the
    restricting wrapper, MAX_JOBS (unless the user set it), the interpreter's bin first on PATH
    (torch uses ninja only when `ninja` is on PATH, and only its ninja build honours PYTORCH_NVCC)."""
    extra = dict(step.env)
    path = os.environ.get("PATH", "")
    extra["PATH"] = os.pathsep.join([d for d in _tool_dirs() if d not in path.split(os.pathsep)] + [path])
    if "MAX_JOBS" not in os.environ:
        extra["MAX_JOBS"] = str(jobs)
    if env.torch_cuda and env.nvcc and os.path.isfile(env.nvcc):
        home = os.path.dirname(os.path.dirname(env.nvcc))
        extra.setdefault("CUDA_HOME", home)
        if step.archs and step.archs != ("all",):
            extra["PYTORCH_NVCC"] = nvcc_wrapper(work, env.nvcc, step.archs)
    return extra


def _tool_dirs() -> list:
    """Directories to put first on the build's PATH: the interpreter's bin, and wherever a `ninja`
    of this interpreter's distributions lives (an environment layered over another one's
    site-packages sees its ninja package, not its bin directory)."""
    out = [os.path.dirname(sys.executable)]
    for entry in sys.path:
        if not entry.endswith("site-packages"):
            continue
        for candidate in (os.path.join(entry, "ninja", "data", "bin"),
                          os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(entry))), "bin")):
            if os.path.isfile(os.path.join(candidate, "ninja")) and candidate not in out:
                out.append(candidate)
    return out


def run_build(step, *, settings, env, pins, work: str, kernel: str, scratch=(), started=None) -> Built:
    """Build the step's sdist into a wheel labelled with its key; BuildError names the log."""
    from packaging.requirements import Requirement

    from ..decide.commands import build_argv
    from .runner import execute
    from ..decide.builds import cxx11_abi_flag
    from .._environ import cache_root

    # the kernel's build data (pins: kernels.<kernel>.source_build), of the version the step builds
    req = Requirement(step.requirements[0])
    pinned = [s.version for s in req.specifier if s.operator == "=="]
    if kernel not in pins.source_builds:
        raise BuildError(f"{kernel} has no source build in the pins (kernels.{kernel}.source_build)")
    spec = pins.build(kernel, pinned[0] if pinned else None)
    archs = tuple(step.archs) or ("all",)
    root = cache_root(settings)
    log = log_path(root, spec.distribution, spec.version or "", archs)
    os.makedirs(os.path.dirname(log), exist_ok=True)
    out_dir = os.path.join(work, "built")
    os.makedirs(out_dir, exist_ok=True)
    jobs = int(os.environ.get("MAX_JOBS") or max_jobs(env.cpus, env.memory_gib))
    extra = build_environ(step, env=env, work=work, jobs=jobs)
    what = f"{spec.requirement} for {', '.join(archs)}"
    shown = shown_path(log)   # short on the line, still a path the shell expands; whole in the event's detail
    events.status(f"{kernel}: building for {', '.join(archs)}; log: {shown}", kernel,
                  detail=f"{kernel}: building {what} from source (MAX_JOBS={jobs}); log: {log}")
    argv = build_argv(step, settings=settings, out_dir=out_dir)
    inv = _Invocation(tuple(argv), tuple(sorted(extra.items())))
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(f"# fastpath-hooks source build of {what}\n# argv: {' '.join(argv)}\n")
        fh.write("".join(f"# env: {k}={v}\n" for k, v in sorted(extra.items()) if k != "PATH"))
    ran = execute(inv, settings.timeout, kernel, f"building {kernel} for {', '.join(archs)} (log: {shown})", work=work, extra_env=scratch,
                  log=log, started=started)
    code, tail, seconds = ran.code, ran.tail, ran.seconds
    if code is None:
        raise BuildError(f"the source build of {what} did not finish within {settings.timeout:.0f} s "
                         f"(FASTPATH_HOOKS_TIMEOUT); log: {log}")
    wheels = [n for n in os.listdir(out_dir) if n.endswith(".whl")]
    if code != 0 or len(wheels) != 1:
        raise BuildError(f"the source build of {what} failed (pip exit {code}); full log: {log}; {tail}")
    if "PYTORCH_NVCC" in extra and not _mentions(log, WRAPPER_MARK):
        events.warning(f"{kernel}: the build never ran the arch-restricting nvcc wrapper (no ninja on PATH?): every "
                       f"arch compiled, the wheel runs; log: {shown}", kernel,
                       detail=f"{kernel}: the build never ran the arch-restricting nvcc wrapper (no ninja on PATH? "
                              "torch's other build ignores PYTORCH_NVCC), so it compiled every arch its setup.py names; "
                              f"the wheel still runs here; log: {log}")
    key = {"distribution": spec.distribution, "version": spec.version, "torch": env.torch, "cuda": env.torch_cuda,
           "hip": env.torch_hip, "python": env.python, "cxx11_abi": cxx11_abi_flag(env), "platform": env.platform,
           "archs": list(archs), "nvcc": env.nvcc_version}
    lab = cached_wheels.label(torch=env.torch, cuda=env.torch_cuda, hip=env.torch_hip, abi=key["cxx11_abi"], archs=archs)
    path = relabel(os.path.join(out_dir, wheels[0]), lab, work)
    events.status(f"{kernel}: built for {', '.join(archs)} in {seconds:.0f} s; log: {shown}", kernel,
                  detail=f"{kernel}: built {os.path.basename(path)} in {seconds:.0f} s; log: {log}")
    return Built(path=path, log=log, seconds=seconds, key=key)


@dataclass(frozen=True)
class _Invocation:
    argv: tuple
    env: tuple


def relabel(wheel: str, local: str, dest: str) -> str:
    """A copy of `wheel` whose version carries the local label `local` (file name, dist-info
    directory, METADATA and RECORD agree, as installers check)."""
    base = os.path.basename(wheel)
    new_name = with_local_label(base, local)
    new_version = str(parse_wheel(new_name).version)
    target = os.path.join(dest, new_name)
    with zipfile.ZipFile(wheel) as zin:
        infos = zin.infolist()
        old_info = next(i.filename.split("/", 1)[0] for i in infos if i.filename.endswith(".dist-info/METADATA"))
        new_info = f"{old_info.split('-', 1)[0]}-{new_version}.dist-info"
        record = []
        with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in infos:
                name = info.filename
                if name.split("/", 1)[0] == old_info:
                    name = new_info + name[len(old_info):]
                if name == f"{new_info}/RECORD":
                    continue
                data = zin.read(info)
                if name == f"{new_info}/METADATA":
                    lines = data.decode("utf-8").split("\n")
                    lines = [f"Version: {new_version}" if ln.startswith("Version:") else ln for ln in lines]
                    data = "\n".join(lines).encode("utf-8")
                out = zipfile.ZipInfo(name, date_time=info.date_time)
                out.external_attr, out.compress_type = info.external_attr, zipfile.ZIP_DEFLATED
                zout.writestr(out, data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                record.append(f"{name},sha256={digest},{len(data)}")
            record.append(f"{new_info}/RECORD,,")
            zout.writestr(f"{new_info}/RECORD", "\n".join(record) + "\n")
    return target


def _mentions(path: str, text: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return any(text in line for line in fh)
    except OSError:
        return False
