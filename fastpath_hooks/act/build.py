"""Source builds of compiled kernels: restricted to the GPU archs asked for, logged, keyed.

causal-conv1d's (and mamba-ssm's) setup.py hard-codes one `-gencode` pair per arch the
nvcc knows (nine with CUDA 13) and ignores TORCH_CUDA_ARCH_LIST: an all-arch build
outlasts most install timeouts. torch's ninja build takes nvcc from `PYTORCH_NVCC`, so
a generated wrapper (in the install's work directory) hands the real nvcc only the
pairs of the archs asked for. ROCm reads `HIP_ARCHITECTURES` (set by the policy).

The build runs `pip wheel --no-deps --no-build-isolation --no-cache-dir --no-binary
<dist>`: against the installed torch, never through pip's wheel cache (keyed by the sdist
alone, it would hand an old build back under a new torch), never taking a wheel instead
of the sdist. `MAX_JOBS` and nvcc's `--split-compile` threads come from the build's share of
the cores and the memory (decide.builds.core_budget: one job per translation unit, the cores
left over as split threads; builds of one request run side by side and split the machine); the
restricting wrapper runs act/nvcc_speed.py's as its nvcc (the split, ccache/sccache, a record
of every compile). The whole output goes to a log file that is kept (`<cache root>/logs/`) and
named in every message about the build. The wheel is then relabelled with its key
(`facts.cached_wheels.label`) so that it can be cached and shared, and the build's figures go
to the cache's build history, which later estimates are made from.
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
from ..facts.wheel_names import parse_wheel, with_local_label

WRAPPER_MARK = "fastpath-hooks nvcc wrapper:"


class BuildError(Exception):
    """The build failed; the message names the log file."""


@dataclass(frozen=True)
class Built:
    path: str          # the relabelled wheel, in the work directory
    log: str
    seconds: float
    key: FrozenMap     # what the binary depends on (also in the file name)
    record: FrozenMap = FrozenMap()   # how it was built (facts/build_history.py's fields)

    _freezes_itself = True

    def __post_init__(self):
        freeze_fields(self)


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


def build_environ(step, *, env, work: str, jobs: int, split: int = 1) -> tuple:
    """(the build's extra environment, its nvcc_speed.Speed or None): the pins' variables, CUDA_HOME
    of the probed nvcc, the restricting wrapper, MAX_JOBS (unless the user set it), the interpreter's
    bin first on PATH (torch uses ninja only when `ninja` is on PATH, and only its ninja build
    honours PYTORCH_NVCC). The restricting wrapper runs the speed wrapper (act/nvcc_speed.py:
    --split-compile=`split`, a compiler cache, a record per compile) as its real nvcc."""
    from . import nvcc_speed

    extra = dict(step.env)
    path = os.environ.get("PATH", "")
    extra["PATH"] = os.pathsep.join([d for d in _tool_dirs() if d not in path.split(os.pathsep)] + [path])
    if "MAX_JOBS" not in os.environ:
        extra["MAX_JOBS"] = str(jobs)
    speed = None
    if env.torch_cuda and env.nvcc and os.path.isfile(env.nvcc):
        home = os.path.dirname(os.path.dirname(env.nvcc))
        extra.setdefault("CUDA_HOME", home)
        speed = nvcc_speed.write(work, env.nvcc, split=split, path_var=extra["PATH"])
        extra.update(nvcc_speed.launcher_environ(speed, work))
        if step.archs and step.archs != ("all",):
            extra["PYTORCH_NVCC"] = nvcc_wrapper(work, speed.wrapper, step.archs)
        else:
            extra["PYTORCH_NVCC"] = speed.wrapper
    return extra, speed


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


def run_build(step, *, settings, env, pins, work: str, kernel: str, scratch=(), started=None, share=None,
              expected: float | None = None, together=()) -> Built:
    """Build the step's sdist into a wheel labelled with its key; BuildError names the log.
    `share`: its decide.builds.Share of the machine when other builds run at the same time
    (`together`: their kernels), else the whole machine's; `expected`: the estimate in seconds, said
    up front and with the heartbeat. The build is recorded for later estimates (facts/build_history.py)."""
    from packaging.requirements import Requirement

    from ..decide.commands import build_argv
    from .runner import execute
    from ..decide.builds import cuda_codes, cxx11_abi_flag
    from .._environ import cache_root
    from . import nvcc_speed

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
    if share is None:
        share = machine_share(kernel, spec, settings=settings, env=env, expected=expected)
    jobs = int(os.environ.get("MAX_JOBS") or share.jobs)
    extra, speed = build_environ(step, env=env, work=work, jobs=jobs, split=share.split)
    what = f"{spec.requirement} for {', '.join(archs)}"
    how = f"MAX_JOBS={jobs}" + (f", --split-compile={share.split}" if speed is not None and share.split > 1 else "") + \
        (f", {share.cores} of {env.cpus} cores" if together and env.cpus else "")
    events.status(f"{kernel}: building {what} from source ({how}){_expected(expected)}; log: {log}", kernel)
    argv = build_argv(step, settings=settings, out_dir=out_dir)
    inv = _Invocation(tuple(argv), tuple(sorted(extra.items())))
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(f"# fastpath-hooks source build of {what}\n# started: {time.time():.2f}\n# argv: {' '.join(argv)}\n")
        fh.write("".join(f"# env: {k}={v}\n" for k, v in sorted(extra.items()) if k != "PATH"))
    sccache_before = nvcc_speed.sccache_counts(speed.launcher) if speed is not None else None
    ran = execute(inv, settings.timeout, kernel, f"building {what} (log: {log})", work=work, extra_env=scratch,
                  log=log, started=started, expected=expected)
    code, tail, seconds = ran.code, ran.tail, ran.seconds
    compiled, info = nvcc_speed.summary(speed, work, sccache_before) if speed is not None else ("", {})
    if compiled:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"# {nvcc_speed.MARK} {compiled}\n")
        nvcc_speed.keep_calls(speed, log)
    if code is None:
        raise BuildError(f"the source build of {what} did not finish within {settings.timeout:.0f} s "
                         f"(FASTPATH_HOOKS_TIMEOUT); log: {log}")
    wheels = [n for n in os.listdir(out_dir) if n.endswith(".whl")]
    if code != 0 or len(wheels) != 1:
        raise BuildError(f"the source build of {what} failed (pip exit {code}); full log: {log}; {tail}")
    if "PYTORCH_NVCC" in extra and not _mentions(log, WRAPPER_MARK):
        events.warning(f"{kernel}: the build never ran the arch-restricting nvcc wrapper (no ninja on PATH? torch's "
                       "other build ignores PYTORCH_NVCC), so it compiled every arch its setup.py names; the wheel "
                       f"still runs here; log: {log}", kernel)
    key = {"distribution": spec.distribution, "version": spec.version, "torch": env.torch, "cuda": env.torch_cuda,
           "hip": env.torch_hip, "python": env.python, "cxx11_abi": cxx11_abi_flag(env), "platform": env.platform,
           "archs": list(archs), "nvcc": env.nvcc_version}
    lab = cached_wheels.label(torch=env.torch, cuda=env.torch_cuda, hip=env.torch_hip, abi=key["cxx11_abi"], archs=archs)
    path = relabel(os.path.join(out_dir, wheels[0]), lab, work)
    record = {"distribution": spec.distribution, "version": spec.version, "kernel": kernel, "archs": list(archs),
              "n_archs": len(archs) if archs != ("all",) else len(cuda_codes(spec, env.nvcc_version)),
              "cores": share.cores, "cpus": env.cpus, "jobs": jobs, "split": share.split if speed is not None else 1,
              "seconds": round(seconds, 1), "nvcc": env.nvcc_version, "launcher": info.get("launcher"),
              "concurrent": sorted(together), "cache": info.get("cache"), "slowest": info.get("slowest")}
    remember_build(root, record)
    events.status(f"{kernel}: built {os.path.basename(path)} in {seconds:.0f} s" +
                  (f" ({compiled})" if compiled else "") + f"; log: {log}", kernel)
    return Built(path=path, log=log, seconds=seconds, key=key, record=record)


def machine_share(kernel: str, spec, *, settings, env, expected=None):
    """The whole machine's Share for one build (decide.builds.core_budget of one)."""
    from ..decide.builds import core_budget, split_allowed

    given = os.environ.get("MAX_JOBS")
    budget = core_budget([(kernel, spec, expected, split_allowed(spec, settings, env.nvcc_version))], cpus=env.cpus,
                         memory_gib=env.memory_gib, settings=settings,
                         jobs_given=int(given) if given and given.isdigit() and int(given) > 0 else None)
    return budget[kernel]


def _expected(seconds) -> str:
    if not seconds:
        return ""
    from ..decide.builds import minutes

    return (f", about {minutes(seconds)} (an estimate; `fastpath-hooks build` or examples/Dockerfile does it ahead "
            "of time)")


def remember_build(root: str, record: dict) -> None:
    """Append the build's record to this cache's build history (facts/build_history.py), for later
    estimates; a history that cannot be written costs only those (said at debug)."""
    import json

    from ..facts import build_history
    from .locks import file_lock

    path = build_history.path(root)
    entry = dict(record, host=build_history.host(), when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with file_lock(path + ".lock", timeout=30.0):
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry, sort_keys=True) + "\n")
            _trim(path)
    except Exception as exc:   # OSError, a lock timeout
        events.debug(f"build history not written ({path}): {exc}")


def _trim(path: str) -> None:
    from ..facts import build_history
    from .files import atomic_write

    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.readlines()
    if len(lines) > build_history.KEEP * 4:
        atomic_write(path, lambda out: out.write("".join(lines[-build_history.KEEP * 2:])))


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
