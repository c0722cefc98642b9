"""torch's build and the GPUs it sees: the CUDA/HIP/XPU build from `torch/version.py` read as text,
then the devices torch enumerates - imported only when torch is such a build and no target spec names
the GPUs. That import costs 1-3 s in a fresh process (nothing inside a training process, which has
imported torch already); `torch.cuda.get_device_capability` then initialises the CUDA runtime, which
the training run does anyway."""

from __future__ import annotations

import os
import sys


def torch_build_info(dist) -> dict:
    """cuda/hip/xpu of the installed torch build, from torch/version.py as text."""
    if dist is None:
        return {}
    path = os.path.join(dist.site, "torch", "version.py")
    info: dict = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                name, sep, value = line.partition("=")
                if not sep:
                    continue
                key = name.split(":")[0].strip()
                if key in ("cuda", "hip", "xpu"):
                    value = value.strip().strip("'\"")
                    info[key] = None if value in ("None", "") else value
    except OSError:
        pass
    return info


def visible_gpus(torch_info: dict, posed: dict, allow_import: bool):
    """(gpus, how they were found, cxx11 abi flag if torch was imported)."""
    if "gpus" in posed:
        return (), "target", None
    if not any(torch_info.get(k) for k in ("cuda", "hip", "xpu")):
        if torch_info:
            return (), "none: torch is a CPU build", None
        return (), "none: torch is not installed", None
    torch = sys.modules.get("torch")
    if torch is None:
        if not allow_import:
            return (), "not probed (torch not imported)", None
        try:
            import torch  # noqa: F401  - the documented cost: only on accelerator builds
        except Exception as exc:  # a broken torch: report, never crash the caller
            return (), f"none: import torch failed ({type(exc).__name__}: {exc})", None
    abi = None
    try:
        abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    except Exception:
        pass
    try:
        if torch_info.get("xpu") and hasattr(torch, "xpu") and torch.xpu.is_available():
            return ("xpu",) * torch.xpu.device_count(), "torch.xpu", abi
        if not torch.cuda.is_available():
            return (), "none: torch.cuda.is_available() is False", abi
        out = []
        for i in range(torch.cuda.device_count()):
            if torch_info.get("hip"):
                arch = getattr(torch.cuda.get_device_properties(i), "gcnArchName", "gfx")
                out.append(arch.split(":")[0])
            else:
                major, minor = torch.cuda.get_device_capability(i)
                out.append(f"sm_{major}{minor}")
        return tuple(out), "torch.cuda", abi
    except Exception as exc:
        return (), f"none: GPU query failed ({type(exc).__name__}: {exc})", abi
