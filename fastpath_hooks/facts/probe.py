"""The probe: this machine's facts read into an `Environment`, cheaply (versions from dist-info names, torch's
build from `torch/version.py` as text); torch is imported only to list the GPUs of an accelerator build that no
target poses (1-3 s in a fresh process, nothing in a training process). Posed facts replace probed ones.
The hub's kernels (transformers 5.25+): the mapping's entries that apply here and where each loads from."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass, field, replace

from .._names import DECORATED, HUB_MODULE, KERNEL_MODULES, cache_root, default_cache_root, find_links_dir
from . import memory, wheels
from .distributions import scan, site_packages
from .environment import Environment, parse_target
from .host import (find_hipcc, find_nvcc, find_uv, glibc, mem_available_gib, normal_arch, nvcc_release,
                   pip_index_config, toolkit_version, usable_cpus)
from .pins import load


def probe(settings=None, *, pins=None, allow_torch_import: bool = True, found=None) -> Environment:
    """`found`: a `scan()` of sys.path already made (the installer's, after an install)."""
    pins = load(None) if pins is None else pins
    posed = parse_target(settings.target, pins=pins) if settings is not None and settings.target else {}
    found, duplicates = scan() if found is None else found
    torch_info = torch_build_info(found.get("torch"))
    gpus, gpu_source, cxx11_abi = visible_gpus(torch_info, posed, allow_torch_import)
    facts = {"python": "%d.%d.%d" % sys.version_info[:3], "glibc": glibc(), "cxx11_abi": cxx11_abi,
             "os": sys.platform, "arch": normal_arch(os.uname().machine),
             "torch": found["torch"].version if "torch" in found else None, "torch_cuda": torch_info.get("cuda"),
             "torch_hip": torch_info.get("hip"), "torch_xpu": bool(torch_info.get("xpu")), "uv": find_uv(),
             "hipcc": find_hipcc(), "cpus": usable_cpus()}
    named = {"cuda": "torch_cuda", "hip": "torch_hip", "xpu": "torch_xpu"}
    facts.update((named.get(key, key), value) for key, value in posed.items() if named.get(key, key) in facts)
    for key in ("hipcc", "uv"):
        if isinstance(facts[key], bool):
            facts[key] = "posed" if facts[key] else None
    if posed.get("cuda") and "hip" not in posed:
        facts["torch_hip"] = None
    if posed.get("hip") and "cuda" not in posed:
        facts["torch_cuda"] = None
    if "gpus" in posed:
        gpus, gpu_source = posed["gpus"], "target"
        facts["torch_xpu"] = facts["torch_xpu"] or "xpu" in gpus
    env = Environment(
        **facts, implementation=sys.implementation.name, gpus=tuple(gpus), gpu_source=gpu_source, triton=None,
        triton_dist=None, nvcc=None, wheelhouse=_wheelhouse(settings.find_links if settings is not None else ()),
        switches={spec.switch.variable: os.environ[spec.switch.variable] for spec in pins.kernels.values()
                  if spec.switch is not None and spec.switch.variable in os.environ},
        posed=tuple(sorted(k for k in posed if k != "distributions") + sorted(posed.get("distributions", {}))),
        prefix=os.path.realpath(sys.prefix), pip_index_config=pip_index_config(),
        memory_gib=posed.get("memory_gib") or mem_available_gib(),
        unwritable_site=None if os.access(site_packages(), os.W_OK) else site_packages(),   # never posed
        model_shapes=_posed_shapes(posed) if ("head_dims" in posed or "heads" in posed) else model_shapes(pins),
        attention_shapes=(tuple((m, k, hk, hv, None) for m, k, _, hk, hv in _posed_shapes(posed))
                          if ("head_dims" in posed or "heads" in posed) else attention_shapes(pins)),
        **_jit_caches(pins, settings),
    )
    return _with_distributions(env, found, duplicates, posed, settings, pins)


def _posed_shapes(posed: dict) -> tuple:
    k, v = posed.get("head_dims") or (None, None)
    hk, hv = posed.get("heads") or (None, None)
    return (("posed", k, v, hk, hv),)


def _jit_caches(pins, settings) -> dict:
    """The pins' JIT cache variables: the user's directory, or one under fastpath-hooks' cache."""
    root = cache_root(settings) if settings is not None else default_cache_root()
    caches, given = {}, []
    for spec in pins.kernels.values():
        for var, sub in spec.jit_caches.items():
            if var in caches:
                continue
            ours = os.path.join(root, "jit", sub)
            value = os.environ.get(var, "").strip()
            # our own directory is not the user's: an earlier decision of this process set it (apply_env)
            if value and os.path.abspath(os.path.expanduser(value)) != os.path.abspath(ours):
                given.append(var)
            caches[var] = value or ours
    return {"jit_caches": caches, "jit_caches_given": tuple(sorted(given))}


def after_install(env: Environment, settings, pins, found) -> Environment:
    """`env` as `probe` would find it after an install (`found`: the installer's `scan()`); the machine's own
    facts stay as probed: an install never changes them (torch & co are protected)."""
    posed = parse_target(settings.target, pins=pins) if settings is not None and settings.target else {}
    return _with_distributions(env, found[0], found[1], posed, settings, pins)


def _with_distributions(env: Environment, found: dict, duplicates: dict, posed: dict, settings, pins) -> Environment:
    dists = {name: item.version for name, item in found.items()}  # all: deps are checked offline too
    nvcc = find_nvcc(dists)
    nvcc_version = toolkit_version(nvcc)
    if "nvcc" in posed:  # nvcc=13.0 poses a toolkit of that release; nvcc=yes one of unknown release
        if posed["nvcc"] is None:
            nvcc, nvcc_version = None, None
        elif nvcc and os.path.isfile(nvcc):   # a real toolkit still runs: a posed release says which it is
            nvcc_version = nvcc_version if posed["nvcc"] == "posed" else posed["nvcc"]
        else:
            nvcc = "posed"
            nvcc_version = None if posed["nvcc"] == "posed" else posed["nvcc"]
    dists.update(posed.get("distributions", {}))
    if "torch" in posed:
        dists["torch"] = posed["torch"]
    triton, triton_dist = _triton(dists, posed, env, pins.triton_distributions)
    if "triton" in posed:  # a posed triton replaces whichever triton distribution is installed
        dists.update(dict.fromkeys(pins.triton_distributions))
        if triton_dist is not None:
            dists[triton_dist] = triton
    dists = {name: version for name, version in dists.items() if version is not None}
    cache = cache_root(settings) if settings is not None else None
    watched = set(pins.allowed) | set(pins.protected) | {"uv", "kernels"}   # the hub's: is_kernels_available
    env = replace(
        env, triton=triton, triton_dist=triton_dist, nvcc=nvcc, nvcc_version=nvcc_version, distributions=dists,
        half_installed=tuple(sorted(set(duplicates) & watched)), wheel_cache=wheels.directory(cache) if cache else None,
        cached_wheels=wheels.listing(cache), build_history=memory.read_builds(cache), pip="pip" in dists,
        numeric_device=posed.get("numeric"), model_types=imported_model_types(),
        numeric_failures=memory.failures(cache, [k for k, s in pins.kernels.items() if s.checks_numbers]))
    return replace(env, **hub_facts(env, settings, pins))


def with_nvcc_version(env: Environment) -> Environment:
    """`env` with its nvcc's CUDA release from `nvcc --version`: only where a source build is considered."""
    if env.nvcc_version or not env.nvcc or not os.path.isfile(env.nvcc):
        return env
    return replace(env, nvcc_version=nvcc_release(env.nvcc))


def _triton(dists: dict, posed: dict, env: Environment, names: tuple):
    if "triton" not in posed:
        return next(((dists[name], name) for name in names if name in dists), (None, None))
    dist = "pytorch-triton-rocm" if env.torch_hip else "pytorch-triton-xpu" if env.torch_xpu else "triton"
    return (posed["triton"], dist) if posed["triton"] else (None, None)


def _wheelhouse(find_links) -> tuple:
    names = set()
    for path in filter(None, map(find_links_dir, find_links)):   # remote ones: None
        try:
            names.update(n for n in os.listdir(path) if n.endswith((".whl", ".tar.gz", ".zip")))
        except OSError:
            pass
    return tuple(sorted(names))


def torch_build_info(dist) -> dict:
    try:
        with open(os.path.join(dist.site, "torch", "version.py"), encoding="utf-8") as fh:
            lines = [line.partition("=") for line in fh]
    except (AttributeError, OSError):   # no torch (dist None), or no version.py
        return {}
    info = {}
    for name, sep, value in lines:
        key, value = name.split(":")[0].strip(), value.strip().strip("'\"")
        if sep and key in ("cuda", "hip", "xpu"):
            info[key] = None if value in ("None", "") else value
    return info


def visible_gpus(torch_info: dict, posed: dict, allow_import: bool):
    """(gpus, how they were found, cxx11 abi flag if torch was imported)."""
    if "gpus" in posed:
        return (), "target", None
    if not any(torch_info.get(k) for k in ("cuda", "hip", "xpu")):
        return (), "none: torch is a CPU build" if torch_info else "none: torch is not installed", None
    torch = sys.modules.get("torch")
    if torch is None:
        if not allow_import:
            return (), "not probed (torch not imported)", None
        try:
            import torch  # noqa: F401  - the documented cost: only on accelerator builds
        except Exception as exc:  # a broken torch: report, never crash the caller
            return (), f"none: import torch failed ({type(exc).__name__}: {exc})", None
    abi = getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", None)
    abi = None if abi is None else bool(abi)
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


def model_modules() -> frozenset:
    """The transformers configuration and modeling modules this process imports: what the model facts (model types,
    shapes) are read from - a reading made before one of them was imported is not this process' now."""
    return frozenset(name for name in list(sys.modules) if name.startswith("transformers.models.")
                     and (".configuration_" in name or ".modeling_" in name))


def imported_model_types() -> tuple:
    """The model types whose transformers modeling module this process imports (a decision may run inside it)."""
    names = (name.split(".") for name in list(sys.modules) if name.startswith("transformers.models."))
    return tuple(sorted({parts[2] for parts in names if len(parts) == 4 and parts[3] == f"modeling_{parts[2]}"}))


def config_attributes(pins, kind: str = "backend") -> dict:
    """"k" / "v" / "heads_k" / "heads_v" (and "window": compiled kernels') -> the transformers config attributes
    that hold them (the `kind` kernels' pins `head_dims.config`), first found wins."""
    attrs: dict = {}
    for spec in pins.kernels.values():
        for key, names in spec.head_dims.config.items() if spec.head_dims and spec.kind == kind else ():
            attrs[key] = list(dict.fromkeys(attrs.get(key, []) + list(names)))
    return attrs


def model_shapes(pins, modules=None) -> tuple:
    """((model type, K, V, key heads, value heads), ...): the linear attention of the imported transformers
    configuration modules - the class defaults of the attributes the backends' pins name (`head_dims.config`);
    None where not an int (derived)."""
    return _config_rows(pins, "backend", ("k", "v", "heads_k", "heads_v"), ("k",), modules)


def attention_shapes(pins, modules=None) -> tuple:
    """((model type, head dim, key heads, heads, sliding window), ...): the attention of the imported transformers
    configuration modules, as the compiled kernels' pins name it (`head_dims.config`); the window True where its
    class default is a number, else False."""
    rows = _config_rows(pins, "compiled", ("k", "heads_k", "heads_v", "window"), ("k", "heads_v"), modules)
    return tuple((*row[:4], row[4] is not None) for row in rows)


def _config_rows(pins, kind: str, keys: tuple, qualify: tuple, modules) -> tuple:
    """(model type, the value of each key, ...) of each configuration class that has an attribute of a `qualify`
    key, read from the class defaults of the attributes the `kind` kernels' `head_dims.config` name."""
    attrs = config_attributes(pins, kind)
    if not all(attrs.get(key) for key in qualify):
        return ()
    wanted = [a for key in qualify for a in attrs[key]]
    modules = sys.modules if modules is None else modules
    out = []
    for name, module in list(modules.items()):
        parts = name.split(".")
        if len(parts) != 4 or parts[:2] != ["transformers", "models"] or not parts[3].startswith("configuration_"):
            continue
        for obj in list(vars(module).values()):
            if (not isinstance(obj, type) or getattr(obj, "__module__", None) != name
                    or not any(hasattr(obj, a) for a in wanted)):
                continue
            values = [next((getattr(obj, a) for a in attrs.get(key, ()) if hasattr(obj, a)), None) for key in keys]
            row = (parts[2], *(v if isinstance(v, int) and not isinstance(v, bool) else None for v in values))
            if row not in out:
                out.append(row)
    return tuple(sorted(out, key=str))


# -- the hub's kernels ----------------------------------------------------------------------------

LOCAL, CACHE, ONLINE = "LOCAL_KERNELS", "cache", "hub"
# func_name -> the kernel fastpath-hooks manages it as (causal_conv1d_fn -> causal-conv1d)
FUNCTION_KERNELS = {func: KERNEL_MODULES[package] for func, package in DECORATED.values() if package in KERNEL_MODULES}


@dataclass(frozen=True)
class HubEntry:   # one entry of transformers' kernel mapping for this machine's device type
    name: str                 # the mapping's key: a decorated function (chunk_gated_delta_rule) or a layer (SiLU)
    repo_id: str
    layer: str                # the layer's name in the repo
    version: int | None = None
    revision: str | None = None
    kernel: str | None = None  # the managed kernel whose function it replaces (None: SiLU, RMSNorm ...)
    modes: tuple = ()         # "training", "inference"
    repository: object = field(default=None, compare=False, repr=False)   # kernels' LayerRepository

    @property
    def ref(self) -> str:
        if self.version is not None:
            return f"{self.repo_id}@v{self.version}"
        return f"{self.repo_id}@{(self.revision or 'main')[:12]}"


@dataclass(frozen=True)
class Where:
    how: str                  # LOCAL / CACHE / ONLINE, or "" (nowhere)
    detail: str = ""          # the path (LOCAL_KERNELS, cache) or why it cannot be loaded


def device_type(accelerator) -> str | None:
    return {"cuda": "cuda", "rocm": "rocm", "xpu": "xpu"}.get(accelerator or "")


def entries(mapping: dict, device: str, gpus) -> tuple:
    """The mapping's entries for `device` that apply to these GPUs (not a capability range of other GPUs only:
    Qwen3_5GatedDeltaNet for sm_121)."""
    caps = [wheels.compute_capability(g) for g in gpus]
    out = []
    for name, per_device in mapping.items():
        for key, repos in per_device.items():
            if key_type(key) != device or not _fits(key, caps):
                continue
            modes = ()
            if isinstance(repos, dict):
                modes = tuple(sorted({m for mode in repos for m in ("training", "inference")
                                      if m in str(mode).lower()}))
                repos = next(iter(repos.values()), None)
            repo_id = getattr(repos, "_repo_id", None)
            if repo_id is None:
                continue        # a local repository a user registered: it loads without the hub
            out.append(HubEntry(name=name, repo_id=repo_id, layer=getattr(repos, "layer_name", name),
                                version=getattr(repos, "_version", None), revision=getattr(repos, "_revision", None),
                                kernel=FUNCTION_KERNELS.get(name), modes=modes, repository=repos))
    return tuple(out)


def read_mapping():
    """The installed transformers' own kernel mapping (not our wrapper's), None before 5.25 or without `kernels`."""
    try:
        module = importlib.import_module(HUB_MODULE)
        getter = module.__dict__.get("get_kernel_mapping_transformers")
        getter = getattr(getter, "_fastpath_hooks_original", getter)
        return getter() if getter is not None else None
    except Exception:   # noqa: BLE001 - transformers without the mapping, or kernels outside its window
        return None


def locate(refs: dict, *, offline: bool, probe_seconds: float, builds: str = "") -> dict:
    """ref -> Where for each `refs` entry (ref -> HubEntry): LOCAL_KERNELS, else the hub when it answers, else the
    kernels cache, else nowhere and why. `builds`: "" - an answering hub serves it (kernelize falls back by itself);
    "ask" - only where the hub has a build for this torch (has_kernel); else why that is not asked."""
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


_reachable: dict = {}   # (endpoint, seconds) -> None (answers) or why not


def offline_reason(offline: bool, seconds: float) -> str | None:
    """Why the hub is not asked here (None: it answers); asked once per process."""
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
    """The kernels cache's variant directory for this entry here, without the network (kernels' own notes,
    "skipping the publisher trust check ... offline", kept out of the user's output)."""
    quiet = logging.getLogger("kernels")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        from kernels import install_kernel

        return str(install_kernel(entry.repo_id, version=entry.version, local_files_only=True,
                                  revision=None if entry.version else entry.revision))
    except Exception:   # noqa: BLE001 - not cached, or no build for this machine in it
        return None
    finally:
        quiet.setLevel(level)


def key_type(key) -> str:
    return key if isinstance(key, str) else str(getattr(key, "type", ""))


def _fits(key, caps) -> bool:
    props = getattr(key, "properties", None)
    low, high = getattr(props, "min_capability", None), getattr(props, "max_capability", None)
    if low is None or high is None:
        return True
    return any(c is not None and low <= c[0] * 10 + c[1] <= high for c in caps)


def hub_facts(env, settings, pins) -> dict:
    """Environment.hub_entries / hub_where (the policy installs no package for what the hub serves): only where
    transformers 5.25+ is imported, on an accelerator, unless USE_HUB_KERNELS turns the hub off."""
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
    builds = "ask" if env.gpu_source != "target" else "the machine is posed: the hub's builds for it are not looked up"
    where = locate(refs, offline=bool(settings is not None and settings.offline), probe_seconds=pins.hub.probe_seconds,
                   builds=builds)
    return {"hub_entries": tuple((e.name, e.repo_id, e.layer, e.version, e.revision, e.kernel, e.modes) for e in found),
            "hub_where": {ref: (w.how, w.detail) for ref, w in where.items()}}
