"""The probe: this machine's facts read into an `Environment`, cheaply - versions from dist-info names,
torch's CUDA/HIP/XPU build from `torch/version.py` as text, the transformers models in use from sys.modules.
torch is imported only to list the GPUs, where it is such a build and no target poses them: 1-3 s in a
fresh process, nothing in a training process (which has imported torch and initialises CUDA anyway).
Posed facts (FASTPATH_HOOKS_TARGET) replace what is probed.

The hub's kernels (transformers 5.25+ with HF `kernels` 0.19): the entries of transformers' kernel mapping
that apply here, and where each loads from - a user's LOCAL_KERNELS, the kernels cache (offline), the hub
(when it answers) - or why it cannot; read only with transformers 5.25+ imported and an accelerator."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass, field, replace

from .._names import DECORATED, KERNEL_MODULES, cache_root, default_cache_root
from . import memory, wheels
from .distributions import scan, site_packages
from .environment import Environment, parse_target
from .host import (find_hipcc, find_nvcc, find_uv, glibc, mem_available_gib, normal_arch, nvcc_release,
                   pip_index_config, toolkit_version, usable_cpus)
from .pins import load

# watched besides the pins' distributions: the installer uv, the hub's `kernels` (is_kernels_available)
_ALSO_WATCHED = ("uv", "kernels")


def watched_distributions(pins) -> frozenset:
    """The distributions whose half-installed state the policy reads: every one the pins name
    (the kernels', their dependencies, the protected ones) and _ALSO_WATCHED."""
    return frozenset(pins.allowed) | frozenset(pins.protected) | frozenset(_ALSO_WATCHED)


def probe(settings=None, *, pins=None, allow_torch_import: bool = True, found=None) -> Environment:
    """`pins`: the loaded pins (which distributions provide triton); default the shipped ones.
    `found`: a `scan()` of sys.path already made (the installer's, after an install), else one is made."""
    if pins is None:
        pins = load(None)
    posed = parse_target(settings.target, pins=pins) if settings is not None and settings.target else {}
    found, duplicates = scan() if found is None else found
    torch_info = torch_build_info(found.get("torch"))
    gpus, gpu_source, cxx11_abi = visible_gpus(torch_info, posed, allow_torch_import)

    uname = os.uname() if hasattr(os, "uname") else None
    facts = {
        "python": "%d.%d.%d" % sys.version_info[:3],
        "os": {"linux": "linux", "darwin": "darwin", "win32": "windows"}.get(sys.platform, sys.platform),
        "arch": normal_arch(uname.machine if uname else os.environ.get("PROCESSOR_ARCHITECTURE", "")),
        "glibc": glibc(),
        "torch": found["torch"].version if "torch" in found else None,
        "cuda": torch_info.get("cuda"),
        "hip": torch_info.get("hip"),
        "xpu": bool(torch_info.get("xpu")),
        "cxx11_abi": cxx11_abi,
        "uv": find_uv(),
        "hipcc": find_hipcc(),
        "cpus": usable_cpus(),
    }
    facts.update((key, value) for key, value in posed.items() if key in facts)
    for key in ("hipcc", "uv"):
        if isinstance(facts[key], bool):
            facts[key] = "posed" if facts[key] else None
    if "cuda" in posed and posed["cuda"] and "hip" not in posed:
        facts["hip"] = None
    if "hip" in posed and posed["hip"] and "cuda" not in posed:
        facts["cuda"] = None
    if "gpus" in posed:
        gpus, gpu_source = posed["gpus"], "target"
        if facts["xpu"] is False and "xpu" in gpus:
            facts["xpu"] = True
    env = Environment(
        python=facts["python"],
        implementation=sys.implementation.name,
        os=facts["os"],
        arch=facts["arch"],
        glibc=facts["glibc"],
        torch=facts["torch"],
        torch_cuda=facts["cuda"],
        torch_hip=facts["hip"],
        torch_xpu=bool(facts["xpu"]),
        cxx11_abi=facts["cxx11_abi"],
        gpus=tuple(gpus),
        gpu_source=gpu_source,
        triton=None,
        triton_dist=None,
        nvcc=None,
        uv=facts["uv"],
        wheelhouse=_wheelhouse(settings.find_links if settings is not None else ()),
        switches={spec.switch.variable: os.environ[spec.switch.variable] for spec in pins.kernels.values()
                  if spec.switch is not None and spec.switch.variable in os.environ},
        posed=tuple(sorted(k for k in posed if k != "distributions") + sorted(posed.get("distributions", {}))),
        prefix=os.path.realpath(sys.prefix),
        unwritable_site=_unwritable_site(),
        pip_index_config=pip_index_config(),
        hipcc=facts["hipcc"],
        cpus=facts["cpus"],
        memory_gib=mem_available_gib(),
        model_shapes=_posed_shapes(posed) if ("head_dims" in posed or "heads" in posed) else model_shapes(pins),
        **_jit_caches(pins, settings),
    )
    return _with_distributions(env, found, duplicates, posed, settings, pins)


def _unwritable_site() -> str | None:
    """This interpreter's site-packages, where installs go, when this process cannot write it (a read-only
    mount, another user's environment): never posed - a target poses another machine, not these rights."""
    site = site_packages()
    return None if os.access(site, os.W_OK) else site


def _posed_shapes(posed: dict) -> tuple:
    k, v = posed.get("head_dims") or (None, None)
    hk, hv = posed.get("heads") or (None, None)
    return (("posed", k, v, hk, hv),)


def _jit_caches(pins, settings) -> dict:
    """The pins' JIT cache variables (a kernel's `jit_caches`): the directory each one names here - the
    user's, or one under fastpath-hooks' cache (<cache>/jit/<name>)."""
    root = cache_root(settings) if settings is not None else default_cache_root()
    caches, given = {}, []
    for spec in pins.kernels.values():
        for var, sub in spec.jit_caches.items():
            if var in caches:
                continue
            ours = os.path.join(root, "jit", sub)
            value = os.environ.get(var, "").strip()
            # our own directory is not the user's choice: an earlier decision of this process set it (apply_env),
            # and the decisions read again after an install must still carry it (the warm verdict remembers them)
            if value and _normal(value) != _normal(ours):
                given.append(var)
            caches[var] = value or ours
    return {"jit_caches": caches, "jit_caches_given": tuple(sorted(given))}


def _normal(path: str) -> str:
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def after_install(env: Environment, settings, pins, found) -> Environment:
    """`env` as `probe` would find it after an install: what follows from the installed distributions is
    derived again from `found` (the installer's `scan()`); the machine's own facts (GPUs, torch's build,
    the compilers) stay as probed - an install never changes them (torch & co are protected)."""
    posed = parse_target(settings.target, pins=pins) if settings is not None and settings.target else {}
    return _with_distributions(env, found[0], found[1], posed, settings, pins)


def _with_distributions(env: Environment, found: dict, duplicates: dict, posed: dict, settings, pins) -> Environment:
    """The facts that follow from the installed distributions (and the wheel cache), posed ones applied."""
    dists = {name: item.version for name, item in found.items()}  # all: deps are checked offline too
    nvcc = find_nvcc(dists)
    nvcc_version = toolkit_version(nvcc)
    if "nvcc" in posed:  # nvcc=13.0 poses a toolkit of that release; nvcc=yes one of unknown release
        if posed["nvcc"] is None:
            nvcc, nvcc_version = None, None
        elif nvcc and os.path.isfile(nvcc):
            # a real toolkit stays the compiler that runs (and gets the arch restriction): a posed release only
            # says which release it is (an image builder's `--target ...,nvcc=13.0` with CUDA_HOME set)
            nvcc_version = nvcc_version if posed["nvcc"] == "posed" else posed["nvcc"]
        else:
            nvcc = "posed"
            nvcc_version = None if posed["nvcc"] == "posed" else posed["nvcc"]
    for name, version in {**posed.get("distributions", {}), **{k: posed[k] for k in ("torch",) if k in posed}}.items():
        if version is None:
            dists.pop(name, None)
        else:
            dists[name] = version
    triton, triton_dist = _triton(dists, posed, env, pins.triton_distributions)
    if "triton" in posed:  # a posed triton replaces whichever triton distribution is installed
        for name in pins.triton_distributions:
            dists.pop(name, None)
        if triton_dist is not None:
            dists[triton_dist] = triton
    cache = cache_root(settings) if settings is not None else None
    env = replace(
        env,
        triton=triton,
        triton_dist=triton_dist,
        nvcc=nvcc,
        nvcc_version=nvcc_version,
        distributions=dists,
        half_installed=tuple(sorted(set(duplicates) & watched_distributions(pins))),
        wheel_cache=wheels.directory(cache) if cache else None,
        cached_wheels=wheels.listing(cache),
        build_history=memory.read_builds(cache),
        pip="pip" in dists,
        numeric_device=posed.get("numeric"),
        numeric_failures=memory.failures(cache, [k for k, s in pins.kernels.items() if s.numeric_checks]),
        model_types=imported_model_types(),
    )
    return replace(env, **hub_facts(env, settings, pins))


def with_nvcc_version(env: Environment) -> Environment:
    """`env` with the CUDA release of its nvcc, asking `nvcc --version` (once per nvcc and process):
    done only when a source build is being considered (engine.context.snapshot), never at every probe."""
    if env.nvcc_version or not env.nvcc or not os.path.isfile(env.nvcc):
        return env
    return replace(env, nvcc_version=nvcc_release(env.nvcc))


def _triton(dists: dict, posed: dict, env: Environment, names: tuple):
    if "triton" in posed:
        if posed["triton"] is None:
            return None, None
        if env.torch_hip:
            return posed["triton"], "pytorch-triton-rocm"
        if env.torch_xpu:
            return posed["triton"], "pytorch-triton-xpu"
        return posed["triton"], "triton"
    for name in names:
        if name in dists:
            return dists[name], name
    return None, None


def _wheelhouse(find_links) -> tuple:
    names = []
    for location in find_links:
        path = wheels.find_links_dir(location)
        if path is None:
            continue
        try:
            names.extend(n for n in os.listdir(path) if n.endswith((".whl", ".tar.gz", ".zip")))
        except OSError:
            continue
    return tuple(sorted(set(names)))


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


def imported_model_types() -> tuple:
    """The model types whose transformers modeling module this process has imported (or is importing: a
    kernel's decision runs inside that import), e.g. ("mamba2",): which families are in use, when known."""
    out = set()
    for name in list(sys.modules):
        if name.startswith("transformers.models."):
            parts = name.split(".")
            if len(parts) == 4 and parts[3] == f"modeling_{parts[2]}":
                out.add(parts[2])
    return tuple(sorted(out))


def model_shapes(pins, modules=None) -> tuple:
    """((model type, K, V, key heads, value heads), ...) of the models whose transformers configuration
    module is imported (a modeling module imports its own before it chooses its kernels): the class
    defaults of the config attributes the pins name (a backend's `head_dims.config`). Reads
    sys.modules only; a default that is not an int (derived at run time) is None."""
    attrs: dict = {}
    for spec in pins.kernels.values():
        if spec.head_dims is not None:
            for key, names in spec.head_dims.config.items():
                attrs.setdefault(key, [])
                attrs[key] += [n for n in names if n not in attrs[key]]
    if not attrs.get("k") or not attrs.get("v"):
        return ()
    modules = sys.modules if modules is None else modules
    out = []
    for name, module in list(modules.items()):
        parts = name.split(".")
        if len(parts) != 4 or parts[:2] != ["transformers", "models"] or not parts[3].startswith("configuration_"):
            continue
        for obj in list(vars(module).values()):
            if not isinstance(obj, type) or getattr(obj, "__module__", None) != name:
                continue
            values = []
            for key in ("k", "v", "heads_k", "heads_v"):
                found = next((getattr(obj, a) for a in attrs.get(key, ()) if hasattr(obj, a)), None)
                values.append(found if isinstance(found, int) and not isinstance(found, bool) else None)
            if not any(hasattr(obj, a) for a in attrs["k"]):
                continue
            row = (parts[2], *values)
            if row not in out:
                out.append(row)
    return tuple(sorted(out, key=str))


# -- the hub's kernels ----------------------------------------------------------------------------

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
    """Environment.hub_entries / hub_where: the managed functions' entries of the mapping here and where each
    loads from (the policy installs no package for what the hub serves); only where transformers 5.25+ is
    imported, on an accelerator, unless USE_HUB_KERNELS turns the hub off."""
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
