"""The hub's kernels as facts (transformers 5.25+ with HF `kernels` 0.19): the entries of transformers' kernel
mapping that apply to this machine, and where each one's kernel loads from here - a user's LOCAL_KERNELS, the
kernels cache (offline), the hub (when it answers) - or why it cannot. Read only where they matter: transformers
5.25+ installed, an accelerator, and the mapping asked for (from_pretrained, `plan`, `doctor`)."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field

from .._names import DECORATED, KERNEL_MODULES

LOCAL, CACHE, ONLINE = "LOCAL_KERNELS", "cache", "hub"
MAPPING_MODULE = "transformers.integrations.hub_kernels"

# func_name -> the kernel fastpath-hooks manages it as (causal_conv1d_fn -> causal-conv1d)
FUNCTION_KERNELS = {func: KERNEL_MODULES[package] for func, package in DECORATED.values() if package in KERNEL_MODULES}


@dataclass(frozen=True)
class HubEntry:
    """One entry of transformers' kernel mapping for this machine's device type."""
    name: str                 # the mapping's key: a decorated function (chunk_gated_delta_rule) or a layer (SiLU)
    repo_id: str
    layer: str                # the layer's name in the repo
    version: int | None = None
    revision: str | None = None
    kernel: str | None = None  # the managed kernel whose function it replaces (None: SiLU, RMSNorm ...)
    modes: tuple = ()         # "training", "inference"
    repository: object = field(default=None, compare=False, repr=False)   # kernels' LayerRepository: what kernelize loads

    @property
    def ref(self) -> str:
        if self.version is not None:
            return f"{self.repo_id}@v{self.version}"
        return f"{self.repo_id}@{(self.revision or 'main')[:12]}"


@dataclass(frozen=True)
class Where:
    """Where an entry's kernel loads from here: `how` LOCAL / CACHE / ONLINE, or "" (nowhere), and why."""
    how: str
    detail: str = ""          # the path (LOCAL_KERNELS, cache) or why it cannot be loaded


def device_type(accelerator) -> str | None:
    """The device type kernelize looks kernels up for on this machine (None: none, e.g. a CPU)."""
    return {"cuda": "cuda", "rocm": "rocm", "xpu": "xpu"}.get(accelerator or "")


def entries(mapping: dict, device: str, gpus) -> tuple:
    """HubEntry per mapping entry for `device` that applies to these GPUs (a Device with a capability range
    of other GPUs only - Qwen3_5GatedDeltaNet for sm_121 - does not)."""
    caps = [_capability(g) for g in gpus]
    out = []
    for name, per_device in mapping.items():
        for key, repos in per_device.items():
            if key_type(key) != device or not _fits(key, caps):
                continue
            modes = ()
            if isinstance(repos, dict):
                modes = tuple(sorted({m for mode in repos for m in ("training", "inference") if m in str(mode).lower()}))
                repos = next(iter(repos.values()), None)
            repo_id = getattr(repos, "_repo_id", None)
            if repo_id is None:
                continue        # a local repository a user registered: it loads without the hub
            out.append(HubEntry(name=name, repo_id=repo_id, layer=getattr(repos, "layer_name", name),
                                version=getattr(repos, "_version", None), revision=getattr(repos, "_revision", None),
                                kernel=FUNCTION_KERNELS.get(name), modes=modes, repository=repos))
    return tuple(out)


def read_mapping():
    """The installed transformers' kernel mapping (its own, as fastpath-hooks' wrapper does not change it),
    or None where it has none (before 5.25, or no `kernels` in its window)."""
    try:
        module = importlib.import_module(MAPPING_MODULE)
        getter = module.__dict__.get("get_kernel_mapping_transformers")
        getter = getattr(getter, "_fastpath_hooks_original", getter)
        return getter() if getter is not None else None
    except Exception:   # noqa: BLE001 - transformers without the mapping, or kernels outside its window
        return None


def locate(refs: dict, *, offline: bool, probe_seconds: float, builds: str = "") -> dict:
    """ref -> Where for each `refs` entry (ref -> HubEntry): LOCAL_KERNELS, else the hub when it answers, else the
    kernels cache, else nowhere and why. `builds`: "" - an answering hub counts as serving it (kernelize then finds
    out, and falls back by itself where it has no build); "ask" - only where kernels finds a build of it for this
    machine's torch (has_kernel: a request to the hub); else the reason it is not asked (a posed machine)."""
    local = local_kernels()
    why = offline_reason(offline, probe_seconds) if any(e.repo_id not in local for e in refs.values()) else None
    out = {}
    for ref, entry in refs.items():
        if entry.repo_id in local:
            out[ref] = Where(LOCAL, local[entry.repo_id])
        elif why is None and builds not in ("", "ask"):
            out[ref] = Where("", builds)
        elif why is None and builds == "ask" and not _has_build(entry):
            out[ref] = Where("", "the hub has no build of it for this torch")
        elif why is None:
            out[ref] = Where(ONLINE)
        else:
            path = cached(entry)
            out[ref] = Where(CACHE, path) if path else Where("", f"{why}, and it is not in the kernels cache")
    return out


def _has_build(entry: HubEntry) -> bool:
    try:
        from kernels import has_kernel

        return bool(has_kernel(entry.repo_id, version=entry.version, revision=None if entry.version else entry.revision,
                               check_arch=False))
    except Exception:   # noqa: BLE001 - kernels outside its window, the hub failing mid-way: not known to serve
        return False


_reachable: dict = {}   # (endpoint, seconds) -> None (answers) or why not: asked once per process


def offline_reason(offline: bool, seconds: float) -> str | None:
    """Why the hub is not asked here (None: it answers)."""
    if offline:
        return "FASTPATH_HOOKS_OFFLINE is set"
    try:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return "HF_HUB_OFFLINE is set"
        endpoint = constants.ENDPOINT
    except Exception:   # noqa: BLE001 - no huggingface_hub: kernels cannot reach the hub either
        return "huggingface_hub does not import"
    key = (endpoint, seconds)
    if key not in _reachable:
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=seconds).close()
            _reachable[key] = None
        except urllib.error.HTTPError:
            _reachable[key] = None          # it answered
        except Exception:   # noqa: BLE001 - refused, unresolvable, a timeout: not reachable
            _reachable[key] = f"the hub did not answer within {seconds:g} s"
    return _reachable[key]


def local_kernels() -> dict:
    """repo -> path, as kernels reads LOCAL_KERNELS (`repo=path:repo=path`)."""
    out = {}
    for part in os.environ.get("LOCAL_KERNELS", "").split(":"):
        repo, sep, path = part.partition("=")
        if sep and repo:
            out[repo] = path
    return out


def cached(entry: HubEntry) -> str | None:
    """The variant directory the kernels cache holds for this entry and machine, without the network (kernels'
    own notes about it - "skipping the publisher trust check ... offline" - kept out of the user's output)."""
    import logging

    quiet = logging.getLogger("kernels")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        from kernels import install_kernel

        return str(install_kernel(entry.repo_id, version=entry.version, revision=None if entry.version else entry.revision,
                                  local_files_only=True))
    except Exception:   # noqa: BLE001 - not cached, or no build for this machine in it
        return None
    finally:
        quiet.setLevel(level)


def key_type(key) -> str:
    return key if isinstance(key, str) else str(getattr(key, "type", ""))


def _capability(gpu: str) -> int | None:
    digits = "".join(ch for ch in gpu if ch.isdigit())
    return int(digits) if digits and gpu.startswith("sm_") else None


def _fits(key, caps) -> bool:
    props = getattr(key, "properties", None)
    low, high = getattr(props, "min_capability", None), getattr(props, "max_capability", None)
    if low is None or high is None:
        return True
    return any(c is not None and low <= c <= high for c in caps)


def hub_facts(env, settings, pins) -> dict:
    """The probe's hub facts (Environment.hub_entries / hub_where): the managed functions' entries of the
    installed transformers' mapping for this machine and where each loads from - read only in a process that
    imported transformers 5.25+ (the policy then knows which kernels the hub serves: no package for them),
    on an accelerator, unless USE_HUB_KERNELS turns the hub off."""
    version = env.dist_version("transformers")
    device = device_type(env.accelerator)
    if device is None or version is None or version.release[:2] < (5, 25) or "transformers" not in sys.modules:
        return {}
    if os.environ.get("USE_HUB_KERNELS", "YES").strip().upper() not in ("1", "ON", "YES", "TRUE"):
        return {}
    mapping = read_mapping()
    if not mapping:
        return {}
    found = tuple(e for e in entries(mapping, device, env.gpus) if e.kernel is not None)
    refs = {}
    for entry in found:
        refs.setdefault(entry.ref, entry)
    # a posed machine's torch is not this one's: which builds the hub has for it is not asked (LOCAL_KERNELS and the
    # cache still count, and kernelize decides on the real machine)
    builds = "ask" if env.gpu_source != "target" else "the machine is posed: the hub's builds for it are not looked up"
    where = locate(refs, offline=bool(settings is not None and settings.offline), probe_seconds=pins.hub.probe_seconds,
                   builds=builds)
    return {"hub_entries": tuple((e.name, e.repo_id, e.layer, e.version, e.revision, e.kernel, e.modes) for e in found),
            "hub_where": {ref: (w.how, w.detail) for ref, w in where.items()}}
