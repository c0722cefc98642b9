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
one nvcc wrapper (act/compiler_wrapper.py) also gives the split, runs ccache/sccache in front and
records every compile (planned and read back by act/nvcc_speed.py). The whole output goes to a log file that is kept (`<cache root>/logs/`) and
named in every message about the build. The wheel is then relabelled with its key
(`facts.cached_wheels.label`) so that it can be cached and shared, and the build's figures go
to the cache's build history, which later estimates are made from.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import sys
import time
import zipfile
from dataclasses import dataclass

from .. import events
from .._names import cache_root
from ..decide.builds import core_budget, cuda_codes, split_allowed
from ..decide.messages import minutes
from ..decide.plan import build_argv
from ..decide.policy.compiled import cxx11_abi_flag
from ..events import shown_path
from ..facts import memory, wheels as cached_wheels
from ..facts.frozen import FrozenMap, freeze_fields
from ..facts.host import find_hipcc, find_nvcc
from ..facts.wheels import parse_wheel, with_local_label
from . import compiler_wrapper, nvcc_speed
from .compiler_wrapper import MARK as WRAPPER_MARK, STD_MARK, codes as _pair_codes
from .transaction import atomic_write
from .locks import file_lock
from .runner import execute



class BuildError(Exception):
    """The build failed; the message names the log file."""


@dataclass(frozen=True)
class Built:
    path: str          # the relabelled wheel, in the work directory
    log: str
    seconds: float
    key: FrozenMap     # what the binary depends on (also in the file name)
    record: FrozenMap = FrozenMap()   # how it was built (facts/memory.py's fields)

    _freezes_itself = True

    def __post_init__(self):
        freeze_fields(self)


def _for(archs) -> str:
    """What a build's line says it compiles: `for sm_90`, `for every arch`, or no GPU code at all (a
    Triton-only build: the opt-in CUDA extension left out)."""
    if tuple(archs) == ("py",):
        return "without its CUDA extension"
    return "for every arch" if tuple(archs) == ("all",) else f"for {', '.join(archs)}"


def log_path(root: str, distribution: str, version: str, archs) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    name = f"{distribution}-{version}-{'+'.join(archs) or 'all'}-{stamp}-{os.getpid()}.log"
    return os.path.join(root, "logs", name)


def write_wrapper(work: str, name: str, *, real, kind: str, keep=None, std: str | None = None, speed=None) -> str:
    """A `/bin/sh` shim `<work>/<name>` that runs act/compiler_wrapper.py with this interpreter and a
    config (a `#!python` line would break on interpreter paths with spaces or longer than the kernel's
    shebang limit): the real compiler `real` (argv list), `keep` (nvcc: the archs whose -gencode pairs
    stay), `std` (the C++ standard handed last), `speed` (nvcc: act/nvcc_speed.py's Speed - the split,
    the compiler cache, the record of each compile)."""
    import shlex


    config = os.path.join(work, name + ".json")
    with open(config, "w", encoding="utf-8") as fh:
        json.dump({"real": list(real), "kind": kind, "keep": list(keep) if keep is not None else None, "std": std,
                   **(speed.config() if speed is not None else {})}, fh)
    path = os.path.join(work, name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"#!/bin/sh\n# Written by fastpath-hooks for one source build ({kind}"
                 f"{': only ' + ' '.join(keep) if keep is not None else ''}{'; -std=' + std if std else ''}"
                 f"{'; --split-compile=%d' % speed.split if speed is not None and speed.split > 1 else ''}).\n"
                 f"exec {shlex.quote(sys.executable)} {shlex.quote(compiler_wrapper.__file__)} "
                 f"{shlex.quote(config)} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def nvcc_wrapper(work: str, real_nvcc: str, keep, std: str | None = None, speed=None) -> str:
    """The one nvcc wrapper of a build: the archs, the C++ standard, and the speed part (act/nvcc_speed.py)."""
    return write_wrapper(work, "nvcc-restricted", real=[real_nvcc], kind="nvcc", keep=keep, std=std, speed=speed)


def real_nvcc(env) -> str | None:
    """The nvcc torch's build would run (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda), whatever the target
    poses: a posed `nvcc=13.0` says which release it is, never which compiler runs or for which archs."""
    if env.nvcc and os.path.isfile(env.nvcc):
        return env.nvcc
    return find_nvcc({})   # the facts' own search, the nvcc wheel left out (torch's build does not look there)


def real_hipcc(env) -> str | None:
    """ROCm's hipcc as torch's build finds it (ROCM_HOME/ROCM_PATH, PATH, /opt/rocm), whatever is posed."""
    if env.hipcc and os.path.isfile(env.hipcc):
        return env.hipcc
    return find_hipcc()


def build_environ(step, *, env, work: str, jobs: int, split: int = 1, parts=()) -> tuple:
    """(the build's extra environment, its nvcc_speed.Speed or None): the pins' variables, CUDA_HOME of
    the real nvcc, the compiler wrappers (PYTORCH_NVCC: nvcc restricted to the archs asked for, given the
    C++ standard where the step asks, `--split-compile=<split>`, a compiler cache and a record per
    compile - one wrapper, act/compiler_wrapper.py; hipcc given the standard; CXX: the host compiler
    given the standard - only where the step asks), MAX_JOBS (unless the user set it), the interpreter's
    bin first on PATH (torch uses ninja only when `ninja` is on PATH, and only its ninja build honours
    PYTORCH_NVCC and CXX this way)."""
    import shlex


    extra = dict(step.env)
    path = os.environ.get("PATH", "")
    extra["PATH"] = os.pathsep.join([d for d in _tool_dirs() if d not in path.split(os.pathsep)] + [path])
    if "MAX_JOBS" not in os.environ:
        extra["MAX_JOBS"] = str(jobs)
    std = getattr(step, "cxx_std", None)
    restricted = bool(step.archs) and step.archs not in (("all",), ("py",))
    speed = None
    if env.torch_cuda:
        nvcc = real_nvcc(env)
        if nvcc is not None:
            extra.setdefault("CUDA_HOME", os.path.dirname(os.path.dirname(nvcc)))
            speed = nvcc_speed.plan(work, split=split, path_var=extra["PATH"], parts=parts)
            extra.update(nvcc_speed.launcher_environ(speed, work))
            extra["PYTORCH_NVCC"] = nvcc_wrapper(work, nvcc, step.archs if restricted else None, std, speed=speed)
    elif env.torch_hip and std:
        hipcc = real_hipcc(env)
        if hipcc is not None:
            extra["PYTORCH_NVCC"] = write_wrapper(work, "hipcc-std", real=[hipcc], kind="hipcc", std=std)
    if std:
        host = shlex.split(os.environ.get("CXX", "")) or ["c++"]   # torch: CXX, else c++
        extra["CXX"] = write_wrapper(work, "cxx-std", real=host, kind="cxx", std=std)
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
    up front and with the heartbeat. The build is recorded for later estimates (facts/memory.py)."""
    from packaging.requirements import Requirement


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
        share = shares([(kernel, spec, expected)], settings=settings, env=env)[kernel]
    jobs = int(os.environ.get("MAX_JOBS") or share.jobs)
    extra, speed = build_environ(step, env=env, work=work, jobs=jobs, split=share.split,
                                 parts=[(unit, share.parts) for unit in spec.split_units])
    what = f"{spec.requirement} for {', '.join(archs)}"
    shown = shown_path(log)   # short on the line, still a path the shell expands; whole in the event's detail
    how = f"MAX_JOBS={jobs}" + (f", --split-compile={share.split}" if speed is not None and share.split > 1 else "") + \
        (f", {share.cores} of {env.cpus} cores" if together and env.cpus else "")
    parted = f"; {' '.join(spec.split_units)} in {share.parts} parts" if speed is not None and speed.parts else ""
    events.status(f"{kernel}: building {_for(archs)} ({how}); log: {shown}", kernel,
                  detail=f"{kernel}: building {what} from source ({how}{parted}){_expected(expected)}; log: {log}")
    argv = build_argv(step, settings=settings, out_dir=out_dir)
    inv = _Invocation(tuple(argv), tuple(sorted(extra.items())))
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(f"# fastpath-hooks source build of {what}\n# started: {time.time():.2f}\n# argv: {' '.join(argv)}\n")
        fh.write("".join(f"# env: {k}={v}\n" for k, v in sorted(extra.items()) if k != "PATH"))
    sccache_before = nvcc_speed.sccache_counts(speed.launcher) if speed is not None else None
    ran = execute(inv, settings.timeout, kernel, f"building {kernel} for {', '.join(archs)} (log: {shown})", work=work,
                  extra_env=scratch, log=log, started=started, expected=expected)
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
        first = first_compiler_error(log)
        raise BuildError(f"the source build of {what} failed (pip exit {code})" + (f": {first}" if first else "") +
                         f"; full log: {log}" + ("" if first else f"; {tail}"))
    built = _built_archs(log, archs, env=env, kernel=kernel, spec=spec, wrapped="PYTORCH_NVCC" in extra, shown=shown)
    if step.cxx_std and not _mentions(log, STD_MARK):
        events.warning(f"{kernel}: the build never ran the wrapper handing -std={step.cxx_std} last (no ninja on "
                       f"PATH?); it built anyway; log: {shown}", kernel,
                       detail=f"{kernel}: the build never ran the compiler wrapper that hands -std={step.cxx_std} last "
                              f"(no ninja on PATH? torch's other build ignores CXX and PYTORCH_NVCC); it built anyway; "
                              f"log: {log}")
    key = {"distribution": spec.distribution, "version": spec.version, "torch": env.torch, "cuda": env.torch_cuda,
           "hip": env.torch_hip, "python": env.python, "cxx11_abi": cxx11_abi_flag(env), "platform": env.platform,
           "archs": list(built), "nvcc": env.nvcc_version, "cxx_std": step.cxx_std}
    lab = cached_wheels.label(torch=env.torch, cuda=env.torch_cuda, hip=env.torch_hip, abi=key["cxx11_abi"], archs=built)
    path = relabel(os.path.join(out_dir, wheels[0]), lab, work)
    record = {"distribution": spec.distribution, "version": spec.version, "kernel": kernel, "archs": list(built),
              "n_archs": len(built) if built != ("all",) else len(cuda_codes(spec, env.nvcc_version)),
              "cores": share.cores, "cpus": env.cpus, "jobs": jobs, "split": share.split if speed is not None else 1,
              "parts": share.parts if speed is not None and speed.parts else 1,
              "seconds": round(seconds, 1), "nvcc": env.nvcc_version, "launcher": info.get("launcher"),
              "concurrent": sorted(together), "cache": info.get("cache"), "slowest": info.get("slowest")}
    remember_build(root, record)
    events.status(f"{kernel}: built {_for(built)} in {seconds:.0f} s; log: {shown}", kernel,
                  detail=f"{kernel}: built {os.path.basename(path)} in {seconds:.0f} s" +
                         (f" ({compiled})" if compiled else "") + f"; log: {log}")
    return Built(path=path, log=log, seconds=seconds, key=key, record=record)


def shares(builds, *, settings, env) -> dict:
    """kernel -> its decide.builds.Share of the machine, for `builds` = [(kernel, spec, expected seconds)]
    run side by side (MAX_JOBS, where the user set it, is every build's)."""
    given = os.environ.get("MAX_JOBS")
    return core_budget([(k, spec, expected, split_allowed(spec, settings, env.nvcc_version)) for k, spec, expected in builds],
                       cpus=env.cpus, memory_gib=env.memory_gib, settings=settings,
                       jobs_given=int(given) if given and given.isdigit() and int(given) > 0 else None)


def _expected(seconds) -> str:
    if not seconds:
        return ""

    return (f", about {minutes(seconds)} (an estimate; `fastpath-hooks build` or examples/Dockerfile does it ahead "
            "of time)")


def remember_build(root: str, record: dict) -> None:
    """Append the build's record to this cache's build history (facts/memory.py), for later
    estimates; a history that cannot be written costs only those (said at debug)."""
    path = memory.builds_path(root)
    entry = dict(record, host=memory.host(), when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with file_lock(path + ".lock", timeout=30.0):
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry, sort_keys=True) + "\n")
            _trim(path)
    except Exception as exc:   # OSError, a lock timeout
        events.debug(f"build history not written ({path}): {exc}")


def _trim(path: str) -> None:
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.readlines()
    if len(lines) > memory.KEEP * 4:
        atomic_write(path, lambda out: out.write("".join(lines[-memory.KEEP * 2:])))


def _built_archs(log: str, archs: tuple, *, env, kernel: str, spec, wrapped: bool, shown: str = "") -> tuple:
    """The archs the wheel really holds, read back from the wrapper's lines in the log (the label says
    what was built, not what was asked): a CUDA build restricted by the wrapper holds the codes it kept;
    one that never ran it holds every arch its setup.py names (`all`) - refused where an arch rule
    says that nvcc's code for a visible GPU is wrong."""
    if not env.torch_cuda or archs in (("all",), ("py",)):
        return archs
    kept = wrapper_codes(log) if wrapped else None
    if kept:
        return tuple(sorted(kept, key=lambda c: cached_wheels.compute_capability(c) or (0, 0)))
    bad = [(g, r) for r in spec.arch_rules for g in env.gpus if r.applies(g, env.nvcc_version)]
    if bad:
        gpu, rule = bad[0]
        raise BuildError(f"the source build of {spec.requirement} never ran the arch-restricting nvcc wrapper, so it "
                         f"holds {gpu} code from nvcc {env.nvcc_version or '(release unknown)'}, which {rule.effect} "
                         f"({rule.id}); not installed; log: {log}")
    events.warning(f"{kernel}: the build never ran the arch-restricting nvcc wrapper (no ninja on PATH?): every "
                   f"arch compiled, the wheel runs (labelled `all`); log: {shown or log}", kernel,
                   detail=f"{kernel}: the build never ran the arch-restricting nvcc wrapper (no ninja on PATH? torch's "
                          "other build ignores PYTORCH_NVCC), so it compiled every arch its setup.py names; the wheel "
                          f"still runs here and is labelled `all`; log: {log}")
    return ("all",)


def wrapper_codes(log: str) -> set:
    """The codes of every -gencode pair the nvcc wrapper kept, from its `kept ...` lines in the log."""
    out: set = set()
    try:
        with open(log, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                _, found, rest = line.partition(WRAPPER_MARK + " kept ")   # pip -v indents the build's output
                if found:
                    for pair in rest.split(";", 1)[0].split():
                        out |= _pair_codes(pair)
    except OSError:
        pass
    return out


_ERROR_LINES = None


def first_compiler_error(log: str) -> str | None:
    """The first diagnostic a compiler wrote into the log: gcc/clang `file:12:3: error: ...` (fatal too),
    nvcc's front end `file.cu(42): error: ...`, `nvcc fatal : ...`, `c++: error: ...` - not pip's or
    setuptools' own `error:` lines. Cut to 240 characters."""
    global _ERROR_LINES
    if _ERROR_LINES is None:
        _ERROR_LINES = re.compile(
            r"(\S+:\d+(:\d+)?: (fatal |catastrophic )?error: .*"
            r"|\S+\(\d+\): (catastrophic )?error: .*"
            r"|nvcc fatal\s*:.*"
            r"|(\S*/)?(c\+\+|g\+\+|gcc|cc|clang\+\+|clang|cc1plus|hipcc|nvcc): (fatal )?error: .*)")
    try:
        with open(log, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                match = _ERROR_LINES.search(line.strip())
                if match:
                    text = match.group(0).strip()
                    return text if len(text) <= 240 else text[:237] + "..."
    except OSError:
        pass
    return None


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
