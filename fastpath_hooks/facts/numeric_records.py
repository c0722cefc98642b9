"""The numeric checks' records (facts): what act/numeric.py remembered, read by the probe.

`<cache root>/numeric/<kernel>.json`: {key: {state: good|mismatch, detail, version, arch, torch_build, ...}},
one key per (installed files, GPU arch, torch build); shared by every environment of the user. The
probe hands the mismatches to the policy, which blocks that release on that arch under that torch build.
"""

from __future__ import annotations

import json
import os

SUBDIR = "numeric"
GOOD, MISMATCH = "good", "mismatch"


def path(root: str, kernel: str) -> str:
    return os.path.join(root, SUBDIR, f"{kernel}.json")


def read(root: str | None, kernel: str) -> dict:
    if not root:
        return {}
    try:
        with open(path(root, kernel), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def failures(root: str | None, kernels) -> tuple:
    """Every remembered mismatch, as (kernel, version, arch, torch build, detail, file), sorted."""
    out = set()
    for kernel in kernels:
        for entry in read(root, kernel).values():
            if entry.get("state") == MISMATCH:
                out.add((kernel, str(entry.get("version")), str(entry.get("arch")), str(entry.get("torch_build")),
                         str(entry.get("detail")), path(root, kernel)))
    return tuple(sorted(out))


def torch_build(env) -> str:
    """The torch part of a record's key: `torch 2.13.0 CUDA 13.0`."""
    return f"torch {env.torch} {env.torch_build}"
