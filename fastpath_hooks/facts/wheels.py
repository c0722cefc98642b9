"""Wheels, read one way: file names (distribution, version, tags: `causal_conv1d` and `Causal-Conv1D`
are one distribution everywhere), which files fit a machine by their tags, the wheel cache's keys and
complete entries (their bytes checked against the recorded sha256 whenever their size or mtime is not the
recorded one; _names.find_links_dir: the local directories of find-links entries, which the warm path lists)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion

from .. import events
from .distributions import canonical_name


@dataclass(frozen=True)
class WheelName:
    filename: str
    distribution: str      # canonical: causal-conv1d
    version: object        # packaging Version
    build: tuple           # () or (number, text): the optional build tag
    tags: frozenset        # packaging Tags
    tag_text: str          # the name's own python-abi-platform part: cp312-cp312-linux_x86_64


@functools.lru_cache(maxsize=4096)
def parse_wheel(filename: str) -> WheelName | None:
    """The parts of a standard wheel file name (of a path's base name), else None. Cached: the policy reads
    the same names for every candidate build."""
    base = os.path.basename(filename)
    try:
        name, version, build, tags = parse_wheel_filename(base)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    tag_text = "-".join(base[:-len(".whl")].split("-")[-3:])
    return WheelName(base, canonical_name(name), version, tuple(build), frozenset(tags), tag_text)


def wheel_distribution(filename: str) -> str:
    """For a name that is not standard: what comes before its first dash (as installers that accept it read it)."""
    parsed = parse_wheel(filename)
    return parsed.distribution if parsed else canonical_name(os.path.basename(filename).split("-", 1)[0])


def with_local_label(filename: str, local: str) -> str:
    """The same wheel's name with the local version label `local` (any old one replaced)."""
    parsed = parse_wheel(filename)
    if parsed is None:
        raise ValueError(f"{os.path.basename(filename)!r} is not a wheel file name")
    build = f"-{parsed.build[0]}{parsed.build[1]}" if parsed.build else ""
    return f"{parsed.distribution.replace('-', '_')}-{parsed.version.public}+{local}{build}-{parsed.tag_text}.whl"


SUBDIR = "wheels"
LABEL = "fph"
SIDECAR = ".json"


def directory(root: str) -> str:
    return os.path.join(root, SUBDIR)


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def key_prefix(*, torch: str, cuda: str | None, hip: str | None, abi: str) -> str:
    """The label's fixed part: `fph.torch2.11.0.cu130.abi1` (rocm64 for HIP 6.4; abi: the cxx11 ABI flag)."""
    toolkit, release = ("cu", cuda) if cuda else ("rocm", hip) if hip else ("cpu", "")
    toolkit += "".join(release.split(".")[:2])
    return ".".join((LABEL, "torch" + _public(torch).lower(), toolkit, "abi1" if abi == "TRUE" else "abi0"))


def label(*, torch: str, cuda: str | None, hip: str | None, abi: str, archs, variant=()) -> str:
    """A built wheel's local version label; archs `("all",)` for an unrestricted build; `variant`: what a trimmed
    build keeps (`hd256`, `swa`: see `kept`)."""
    codes = ".".join(a.replace("_", "").lower() for a in archs)
    return f"{key_prefix(torch=torch, cuda=cuda, hip=hip, abi=abi)}.{codes}" + "".join(f".{t}" for t in variant)


HEAD_DIMS, WINDOW = "hd", "swa"   # a trimmed build's label: the head dims it keeps (hd128x256), local attention kept


def variant_tokens(head_dims, window: bool) -> tuple:
    """The label's tokens for a trimmed build keeping `head_dims` (None: all) and, where `window`, local attention."""
    return ((f"{HEAD_DIMS}{'x'.join(map(str, head_dims))}",) if head_dims is not None else ()) + \
        ((WINDOW,) if window else ())


def label_parts(tokens) -> tuple:
    """(archs, variant) of a build label's tokens after its key (`sm90`, `hd256`, `swa`)."""
    variant = tuple(t for t in tokens if t == WINDOW or (t.startswith(HEAD_DIMS) and t[2:].replace("x", "").isdigit()))
    return [t for t in tokens if t not in variant], variant


def kept(variant) -> tuple:
    """(head dims a trimmed build keeps - None: all -, whether it keeps local attention) from its label's tokens."""
    dims = next((t[len(HEAD_DIMS):] for t in variant if t.startswith(HEAD_DIMS)), None)
    return (None if dims is None else tuple(int(d) for d in dims.split("x"))), WINDOW in variant


def covers(variant, head_dims, window: bool) -> bool:
    """Whether a build labelled with `variant` keeps the head dims (None: all) and the local attention needed."""
    have, have_window = kept(variant)
    return (have is None or (head_dims is not None and set(head_dims) <= set(have))) and (have_window or not window)


def compute_capability(arch: str) -> tuple | None:
    """sm_90 -> (9, 0), sm_121 -> (12, 1); None for anything else."""
    digits = arch[3:] if arch.startswith("sm_") else arch[2:] if arch.startswith("sm") else ""
    if len(digits) < 2 or not digits.isdigit():
        return None
    return int(digits[:-1]), int(digits[-1])


def pair_for(gpu: str, codes) -> str | None:
    """The code in `codes` that runs on `gpu`: ROCm gfx archs exactly; CUDA cubins on their own major with an
    equal or higher minor (sm_80 code runs on sm_86 and sm_89)."""
    if gpu.startswith("gfx"):
        return gpu if gpu in codes else None
    want = compute_capability(gpu)
    if want is None:
        return None
    runs = [cc for cc in map(compute_capability, codes) if cc and cc[0] == want[0] and cc[1] <= want[1]]
    return "sm_%d%d" % max(runs) if runs else None


def fits(filename: str, *, distribution: str, version: str, torch: str, cuda: str | None, hip: str | None,
         abi: str, python: str, arch: str, gpus, all_codes=(), bad=None, python_only: bool = False,
         needs=None) -> bool:
    """A built wheel (fph label) that runs here: same distribution, version and key, this Python and platform,
    code for every visible GPU (`all_codes`: what an `all` build holds) but not the code `bad` says it must not
    run (gpu -> code); one labelled `py` (no compiled code) where `python_only`; `needs`: (head dims, window) a
    trimmed build must keep (`covers`)."""
    wheel = parse_wheel(filename)
    if wheel is None:
        return False
    ver, tags = wheel.version, wheel.tags
    if wheel.distribution != canonical_name(distribution) or ver.public != _public(version) or not ver.local:
        return False
    prefix = key_prefix(torch=torch, cuda=cuda, hip=hip, abi=abi) + "."
    if not ver.local.startswith(prefix):
        return False
    have, variant = label_parts(ver.local[len(prefix):].split("."))
    if needs is not None and not covers(variant, *needs):
        return False
    py = "cp" + "".join(python.split(".")[:2])
    if not any((t.interpreter == py or _abi3_for(t, python)) and t.platform.endswith("_" + arch)
               and t.platform.startswith(("linux_", "manylinux")) for t in tags):
        return False
    if have == ["py"]:
        return python_only
    codes = set(all_codes) if "all" in have else {(f"sm_{a[2:]}" if a.startswith("sm") else a) for a in have}
    bad = bad or {}
    return bool(gpus) and all(pair_for(g, codes) is not None and pair_for(g, codes) != bad.get(g) for g in gpus)


# PEP 600 tags name the glibc they need (manylinux_2_28); the older names stand for one (PEP 599, 571, 513)
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def linux_platforms(glibc: str | None, arch: str) -> list:
    """The platform tags a Linux machine with this glibc (2.x) and CPU arch loads, best first: the list
    packaging.tags.platform_tags() makes for the running machine (linux_<arch>, then manylinux_2_N down to
    2_17, 2_5 on x86, each legacy name beside its own), for a posed one - packaging reads only the running
    glibc. A glibc not known: from 2.17 (manylinux2014)."""
    try:
        major, minor = (int(part) for part in str(glibc).split(".")[:2])
    except ValueError:
        major, minor = 2, 17
    if major != 2:
        major, minor = 2, 17
    floor = 5 if arch in ("x86_64", "i686") else 17
    out = [f"linux_{arch}"]
    for m in range(minor, floor - 1, -1):
        out.append(f"manylinux_2_{m}_{arch}")
        if m in _LEGACY_MANYLINUX:
            out.append(f"{_LEGACY_MANYLINUX[m]}_{arch}")
    return out


def _abi3_for(tag, python: str) -> bool:
    """A stable-ABI tag (cp39-abi3: flash-attn-3's wheels) that this CPython runs: its minimum is this or older."""
    if tag.abi != "abi3" or not tag.interpreter.startswith("cp3") or not tag.interpreter[3:].isdigit():
        return False
    return int(tag.interpreter[3:]) <= int((python.split(".") + ["0", "0"])[1])


def listing(root: str | None) -> tuple:
    """File names of the complete entries (wheel + sidecar of the right size); the others said at debug."""
    if not root:
        return ()
    where = directory(root)
    try:
        names = os.listdir(where)
    except OSError:
        return ()
    out = []
    for name in sorted(names):
        if not name.endswith(".whl"):
            continue
        problem = defect(os.path.join(where, name))
        if problem:
            events.debug(f"wheel cache: ignoring {name}: {problem}")
            continue
        out.append(name)
    return tuple(out)


def sidecar(path: str) -> dict | None:
    try:
        with open(path + SIDECAR, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def defect(path: str) -> str | None:
    """Why a cache entry is not to be used, else None. Its bytes are hashed only when its size or mtime is
    not the one its sidecar recorded (an entry as stored costs a stat: no start hashes it)."""
    meta = sidecar(path)
    if meta is None:
        return "no readable sidecar (an interrupted store?)"
    try:
        stat = os.stat(path)
    except OSError as exc:
        return f"unreadable: {exc}"
    if meta.get("size") != stat.st_size or not isinstance(meta.get("sha256"), str):
        return f"size {stat.st_size} differs from the recorded {meta.get('size')} (a partial or damaged file)"
    if meta.get("mtime_ns") == stat.st_mtime_ns:
        return None
    try:
        digest = sha256_of(path)
    except OSError as exc:
        return f"unreadable: {exc}"
    if digest != meta["sha256"]:
        return (f"sha256 {digest} differs from the recorded {meta['sha256']} (altered since it was stored; "
                "`fastpath-hooks cache clear` removes it)")
    return None


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
