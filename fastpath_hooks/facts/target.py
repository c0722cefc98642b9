"""`FASTPATH_HOOKS_TARGET` / `--target`: pose as another machine.

A spec is a comma list of `key=value` facts, e.g.
`gpu=sm_90,torch=2.11.0,cuda=13.0,triton=3.6.0,python=3.12`, `gpu=none` or
`hip=6.4,gpu=gfx942`. Every fact the policy reads can be set; the ones not named
are probed from this machine. Several GPUs: `gpu=sm_90+sm_80`. A CUDA GPU is an arch of a
released GPU (`CUDA_ARCHS`, or one the pins' -gencode tables know); `sm_90a` / `sm_100f` are
accepted and pose that GPU's arch (`sm_90`, `sm_100`). The model's gated-delta-rule shapes
(otherwise read from the transformers configs imported): `head_dims=128x128` (K x V),
`heads=16x32` (key heads x value heads).
"""

from __future__ import annotations

import os

from .._registry import PinsFileError, read_pins_file
from .distributions import canonical_name
from .pins import PinsError, load

FACT_KEYS = ("gpu", "torch", "cuda", "hip", "xpu", "triton", "python", "os", "arch", "platform",
             "glibc", "abi", "nvcc", "hipcc", "uv", "cpus", "numeric", "head_dims", "heads")
_OS = ("linux", "darwin", "windows")
_ARCH = ("x86_64", "aarch64", "arm64", "amd64")
_NONE = ("none", "no", "absent", "")
_YES = ("yes", "1", "true", "on")
_NO = ("no", "0", "false", "off", "none")


def distribution_keys(pins) -> tuple:
    """The distributions a target may pose (value: a version or `none`): every one the pins name
    that fastpath-hooks may install or read - the kernels', their dependencies, transformers, numpy
    (torch and its triton are facts of their own)."""
    named = (set(pins.allowed) | set(pins.protected)) - set(pins.triton_distributions) - {"torch"}
    return tuple(sorted(named))


def parse_target(spec: str, *, pins=None, pins_file: str | None = None) -> dict:
    """Parse a target spec into normalized facts; ValueError names the bad entry. A posed
    distribution is checked against the registry's kernel distributions (and, for any other name,
    `pins` - loaded from `pins_file` and the shipped pins when not given)."""
    facts: dict = {}
    seen: set = set()
    entries = [e.strip() for e in spec.split(",") if e.strip()]
    if not entries:
        raise ValueError("empty target; expected key=value facts such as gpu=sm_90,torch=2.11.0")
    for entry in entries:
        if "=" not in entry:
            raise ValueError(f"{entry!r}: expected key=value (e.g. gpu=sm_90)")
        key, _, value = entry.partition("=")
        key = key.strip().lower()
        value = value.strip()
        same = {"os": "platform", "arch": "platform", "platform": "os"}.get(key)
        if canonical_name(key) in seen or same in seen or (key == "platform" and "arch" in seen):
            raise ValueError(f"{entry!r}: {key} is given twice")
        seen.add(canonical_name(key))
        if key == "gpu":
            facts["gpus"] = _gpus(entry, value)
        elif key in ("torch", "triton", "cuda", "hip", "glibc"):
            facts[key] = None if value.lower() in _NONE else _version(entry, value)
        elif key == "python":
            facts["python"] = _python(entry, value)
        elif key == "xpu":
            facts["xpu"] = _flag(entry, value)
        elif key == "abi":
            facts["cxx11_abi"] = _flag(entry, value)
        elif key in ("uv", "hipcc"):
            facts[key] = _flag(entry, value)
        elif key in ("head_dims", "heads"):
            facts[key] = _pair(entry, value)
        elif key == "cpus":
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{entry!r}: cpus is a number of CPU cores, e.g. cpus=16")
            facts["cpus"] = int(value)
        elif key == "nvcc":
            low = value.lower()
            if low in _NO:
                facts["nvcc"] = None
            elif low in _YES:
                facts["nvcc"] = "posed"
            else:
                facts["nvcc"] = _version(entry, value)
        elif key == "numeric":   # where the numeric checks of a posed GPU run: cpu (CPU stand-ins), none: skipped
            if value.lower() not in ("cpu", "none", "no"):
                raise ValueError(f"{entry!r}: numeric=cpu runs the numeric checks on CPU tensors (a posed GPU has none "
                                 "here); numeric=none skips them")
            facts["numeric"] = "cpu" if value.lower() == "cpu" else None
        elif key == "os":
            if value.lower() not in _OS:
                raise ValueError(f"{entry!r}: os must be one of {', '.join(_OS)}")
            facts["os"] = value.lower()
        elif key == "arch":
            facts["arch"] = _arch(entry, value)
        elif key == "platform":
            os_name, _, arch = value.lower().partition("-")
            if os_name not in _OS or not arch:
                raise ValueError(f"{entry!r}: platform looks like linux-x86_64")
            facts["os"], facts["arch"] = os_name, _arch(entry, arch)
        else:
            name = canonical_name(key)
            if not _posable(name, pins, pins_file):
                accepted = ", ".join(FACT_KEYS + distribution_keys(pins or _pins(pins_file)))
                raise ValueError(f"{entry!r}: unknown fact {key!r}; accepted: {accepted}")
            dists = facts.setdefault("distributions", {})
            dists[name] = None if value.lower() in _NONE else _version(entry, value)
    if facts.get("hip") and facts.get("cuda"):
        raise ValueError("cuda=... and hip=... together: a torch build has one or the other")
    return facts


# The CUDA GPU archs (compute capabilities) of released GPUs: `nvcc --list-gpu-code` of CUDA 11.8
# (sm_35 ... sm_90), 12.8 / 12.9 (sm_50 ... sm_121, sm_101) and 13.0 (sm_75 ... sm_121, sm_88, sm_110 -
# sm_101 renamed). A posed GPU must be one of these or an arch the pins' -gencode tables know.
CUDA_ARCHS = ("sm_35", "sm_37", "sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75",
              "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_101", "sm_103", "sm_110", "sm_120",
              "sm_121")
# Arch-specific (sm_90a, sm_100a) and family-specific (sm_100f) compile targets name the GPU's own arch:
# a posed sm_90a is an sm_90 GPU (what the probe reports for an H100), so every rule about sm_90 applies.
ARCH_SUFFIXES = ("a", "f")


def known_cuda_archs() -> tuple:
    """CUDA_ARCHS and every arch a -gencode table of the pins names (the shipped file and a
    FASTPATH_HOOKS_PINS file), sorted by number. Read only when a posed arch is not in CUDA_ARCHS."""
    found = set(CUDA_ARCHS)

    def walk(node):
        if isinstance(node, dict):
            table = node.get("cuda_archs")
            if isinstance(table, dict) and isinstance(table.get("pairs"), dict):
                found.update(k for k in table["pairs"] if isinstance(k, str) and k.startswith("sm_"))
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    files = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "pins.json")]
    user = os.environ.get("FASTPATH_HOOKS_PINS", "").strip()
    if user:
        files.append(os.path.abspath(os.path.expanduser(user)))
    for path in files:
        try:
            walk(read_pins_file(path))
        except (OSError, PinsFileError):   # a bad pins file is reported where pins are loaded
            pass
    return tuple(sorted(found, key=lambda a: int(a[3:]) if a[3:].isdigit() else 0))


def _cuda_arch(entry: str, part: str) -> str:
    """sm_XY / smXY / sm_XYa / sm_XYf -> the GPU's arch sm_XY; an arch no CUDA release knows is refused."""
    digits = part[3:] if part.startswith("sm_") else part[2:]
    if digits[-1:] in ARCH_SUFFIXES:
        digits = digits[:-1]
    if not (digits.isdigit() and len(digits) in (2, 3)):
        raise ValueError(f"{entry!r}: a GPU is sm_XY (CUDA compute capability, e.g. sm_90 or sm_90a), gfxNNN (ROCm) "
                         "or none")
    arch = "sm_" + digits
    if arch not in CUDA_ARCHS:
        known = known_cuda_archs()
        if arch not in known:
            raise ValueError(f"{entry!r}: {part} is not a CUDA GPU arch; known: sm_" + " ".join(a[3:] for a in known)
                             + " (each also with an a or f suffix, e.g. sm_90a)")
    return arch


def _posable(name: str, pins, pins_file) -> bool:
    if pins is None:
        from .._names import PINS
        from .._registry import registry

        if any(name in e["distributions"] for e in registry({PINS: pins_file} if pins_file else {}).values()):
            return True   # a kernel's own distribution: known without loading the pins
        pins = _pins(pins_file)
    return name in distribution_keys(pins)


def _pins(pins_file):
    try:
        return load(pins_file)
    except PinsError:   # said where the pins are loaded for the decision
        return load(None)


def _gpus(entry: str, value: str) -> tuple:
    if value.lower() in _NONE:
        return ()
    out = []
    for part in value.replace("/", "+").split("+"):
        part = part.strip().lower()
        if part.startswith("sm") and len(part) > 2:
            out.append(_cuda_arch(entry, part))
        elif part.startswith("gfx") and len(part) > 3 and part[3:].isalnum():
            out.append(part)
        elif part == "xpu":
            out.append("xpu")
        else:
            raise ValueError(f"{entry!r}: a GPU is sm_XY (CUDA compute capability, e.g. sm_90), gfxNNN (ROCm) or none")
    return tuple(out)


def _pair(entry: str, value: str) -> tuple:
    parts = value.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{entry!r}: expected two numbers such as 128x128")
    return int(parts[0]), int(parts[1])


def _version(entry: str, value: str) -> str:
    from packaging.version import InvalidVersion, Version

    try:
        Version(value)
    except InvalidVersion:
        raise ValueError(f"{entry!r}: {value!r} is not a version") from None
    return value


def _python(entry: str, value: str) -> str:
    parts = value.split(".")
    if not (2 <= len(parts) <= 3 and all(p.isdigit() for p in parts) and parts[0] == "3"):
        raise ValueError(f"{entry!r}: python looks like 3.12 or 3.12.3")
    return value


def _flag(entry: str, value: str) -> bool:
    low = value.lower()
    if low in _YES:
        return True
    if low in _NO:
        return False
    raise ValueError(f"{entry!r}: expected yes or no")


def _arch(entry: str, value: str) -> str:
    low = value.lower()
    if low not in _ARCH:
        raise ValueError(f"{entry!r}: arch must be one of x86_64, aarch64")
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(low, low)
