"""This host's own facts, read with the standard library (a process only for `nvcc --version`), never
raising: CPU arch, glibc, cores, memory, the compilers and uv as the kernels' builds find them, /proc, and
whether pip is configured with an index or find-links (which uv ignores)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import sysconfig


def normal_arch(machine: str) -> str:
    low = machine.lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(low, low)


def glibc() -> str | None:
    try:
        value = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):
        return None
    return value.split()[1] if value.startswith("glibc ") else None


def usable_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


_NVCC_RELEASES: dict = {}


def nvcc_release(path: str) -> str | None:
    """'13.0' from `nvcc --version` (10 s at most); None when it cannot tell."""
    import subprocess

    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _NVCC_RELEASES:
        try:   # not act/runner.py: facts may not import act
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10,
                                 stdin=subprocess.DEVNULL).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        match = re.search(r"release (\d+\.\d+)", out)
        _NVCC_RELEASES[key] = match.group(1) if match else None
    return _NVCC_RELEASES[key]


def toolkit_version(nvcc: str | None) -> str | None:
    """The CUDA release of a toolkit's version.json (11.1+ ship one beside bin/): a file read, no process."""
    if not nvcc or not os.path.isfile(nvcc):
        return None
    path = os.path.join(os.path.dirname(os.path.dirname(nvcc)), "version.json")
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)["cuda"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    parts = str(value).split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and all(p.isdigit() for p in parts[:2]) else None


def _tool(variables: tuple, name: str) -> str | None:
    for var in variables:
        home = os.environ.get(var)
        if home and os.path.isfile(os.path.join(home, "bin", name)):
            return os.path.join(home, "bin", name)
    return shutil.which(name)


def find_hipcc() -> str | None:
    return _tool(("ROCM_HOME", "ROCM_PATH"), "hipcc") or (
        "/opt/rocm/bin/hipcc" if os.path.isfile("/opt/rocm/bin/hipcc") else None)


def find_nvcc(dists: dict) -> str | None:
    """Mirror fla's has_usable_nvcc(): CUDA_HOME/CUDA_PATH, PATH, the nvcc wheel, /usr/local/cuda."""
    found = _tool(("CUDA_HOME", "CUDA_PATH"), "nvcc")
    if found:
        return found
    nvcc_wheel = dists.get("nvidia-cuda-nvcc")
    if nvcc_wheel and nvcc_wheel.split(".")[0].isdigit() and int(nvcc_wheel.split(".")[0]) >= 13:
        return f"nvidia-cuda-nvcc {nvcc_wheel}"
    if os.path.isfile("/usr/local/cuda/bin/nvcc"):
        return "/usr/local/cuda/bin/nvcc"
    return None


def find_uv() -> str | None:
    """This environment's, else on PATH, else where the `uv` package installed elsewhere has its binary."""
    dirs = (sysconfig.get_path("scripts"), os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath))
    found = shutil.which("uv", path=os.pathsep.join(dirs))
    if found:
        return found
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except Exception:  # not installed, or its binary is missing
        return None


def read_text(path: str, limit: int = 4096) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(limit).strip()
    except OSError:
        return None


def boot_id() -> str | None:
    """This boot of the kernel: with a start time, it tells a reused pid from the process recorded."""
    return read_text("/proc/sys/kernel/random/boot_id")


def process_stat(pid: int):
    """(state, process group, start time in clock ticks since boot), None when gone."""
    text = read_text(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text[text.rfind(")") + 2:].split()   # the command name may hold spaces and parentheses
    try:
        return fields[0], int(fields[2]), int(fields[19])
    except (IndexError, ValueError):
        return None


def group_members(pgid: int) -> list:
    """Pids of the group's living members (zombies are done writing)."""
    try:
        pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []
    stats = ((pid, process_stat(pid)) for pid in pids)
    return [pid for pid, stat in stats if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X")]


def mem_available_gib() -> float | None:
    for line in (read_text("/proc/meminfo", limit=1 << 16) or "").splitlines():
        if line.startswith("MemAvailable:"):
            try:
                return round(int(line.split()[1]) / (1 << 20), 1)
            except (IndexError, ValueError):
                return None
    return None


def pip_index_config(environ=None) -> str | None:
    """Where pip is configured with an index or find-links for `pip install`, as pip reads it (Linux: its files
    in load order; a PIP_CONFIG_FILE that exists hides the user's, os.devnull all), or None."""
    env = os.environ if environ is None else environ
    found = [name for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS") if env.get(name, "").strip()]
    explicit = env.get("PIP_CONFIG_FILE")
    home = env.get("HOME") or os.path.expanduser("~")
    dirs = [d for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep) if d]
    files = [os.path.join(d, "pip", "pip.conf") for d in dirs] + ["/etc/pip.conf"]
    if not (explicit and os.path.exists(explicit)):
        files += [os.path.join(home, ".pip", "pip.conf"),
                  os.path.join(env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "pip", "pip.conf")]
    files += [os.path.join(sys.prefix, "pip.conf")] + ([explicit] if explicit else [])
    for path in files if explicit != os.devnull else ():
        keys = _pip_index_keys(path)
        if keys:
            found.append(f"{path} sets {', '.join(keys)}")
    return "; ".join(found) or None


def _pip_index_keys(path: str) -> list:
    """The index options a pip config file sets for `pip install` ([global] and [install])."""
    if not os.path.isfile(path):
        return []
    import configparser

    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return []
    names = (key.lower().replace("_", "-").lstrip("-") for section in ("global", "install")
             if parser.has_section(section) for key, value in parser.items(section) if value.strip())
    return list(dict.fromkeys(n for n in names if n in ("index-url", "extra-index-url", "find-links")))
