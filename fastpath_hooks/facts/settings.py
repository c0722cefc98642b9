"""Every FASTPATH_HOOKS_* environment variable, parsed and validated in one place. `Settings.from_env()`
returns a complete, immutable `Settings` or raises `SettingsError` listing every bad variable, its value
and what is accepted. A blank value counts as unset (`ENV FASTPATH_HOOKS_X=` in a Dockerfile: the default)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Mapping
from urllib.parse import urlsplit

# the start-up path's raw readers (_names) give the values; settings adds the validation only
from .._names import (CACHE_DIR, DEFAULT_LOG, DISABLE, FALSE_VALUES, FIND_LINKS, LOG, LOG_LEVELS, PINS,
                      TRUE_VALUES as _TRUE, cache_dir_given, cache_dir_problem, default_cache_root, disabled,
                      find_links_given, log_level)
from .._registry import REGISTRY, listed, pins_file_kind_problem, pins_file_size_problem, registry
from .distributions import canonical_name
from .environment import parse_target
from .pins import closest as _closest
from .frozen import FrozenMap, thaw

MODES = ("install", "report")
BUILD_MODES = ("auto", "1", "0")
INSTALLERS = ("auto", "uv", "pip")
_FALSE = ("",) + FALSE_VALUES

DEFAULT_TIMEOUT = 900.0
DEFAULT_LOCK_TIMEOUT = 1800.0
DEFAULT_RETRY_AFTER = 3600.0


def kernel_aliases(reg) -> dict:
    """Every name FASTPATH_HOOKS_SKIP, install(kernels=...) and the CLI accept -> the kernel."""
    out = {}
    for kernel, entry in reg.items():
        out[kernel] = kernel
        for alias in entry["aliases"]:
            out.setdefault(alias, kernel)
    return out


def mirror_variables(reg) -> dict:
    """kernel -> the variable naming a mirror of its release wheels (the registry's `mirror`)."""
    return {kernel: entry["mirror"] for kernel, entry in reg.items() if entry["mirror"]}


def variables(reg) -> dict:
    """Every variable, with the mirror variables of the registry's kernels (listed after the log level)."""
    out = {}
    for name, meaning in _VARIABLES.items():
        out[name] = meaning
        if name == LOG:
            for kernel, variable in mirror_variables(reg).items():
                out[variable] = f"base URL (http(s):// or file://) of a {kernel} release-wheel mirror"
    return out


KERNELS = listed(REGISTRY)
KERNEL_ALIASES = kernel_aliases(REGISTRY)
_COMPILED = tuple(k for k in KERNELS if REGISTRY[k]["kind"] == "compiled")

# name -> what it means, its accepted values and default: docs/settings.md's table says the same
# (tests/test_settings.py compares them).
_VARIABLES = {
    "FASTPATH_HOOKS_DISABLE": ("1/true/yes/on turns fastpath-hooks off entirely (install() and the start-up entry "
                               "do nothing)"),
    "FASTPATH_HOOKS_SKIP": f"comma list of kernels to leave alone: {', '.join(KERNELS)}",
    "FASTPATH_HOOKS_MODE": "install (default): act on the plan; report: decide and report, never install",
    "FASTPATH_HOOKS_FIND_LINKS": "comma or whitespace separated wheel directories or URLs, searched by the installer",
    "FASTPATH_HOOKS_OFFLINE": "1: never reach an index; install only from FASTPATH_HOOKS_FIND_LINKS",
    "FASTPATH_HOOKS_INDEX_URL": "an http(s):// or file:// package index to use instead of the installer's default",
    "FASTPATH_HOOKS_INSTALLER": ("auto (default: uv when available, unless pip is configured with its own index or "
                                 "find-links, which uv ignores; else pip), uv or pip"),
    "FASTPATH_HOOKS_TIMEOUT": "seconds one install or verification step may take (default 900)",
    "FASTPATH_HOOKS_ALLOW_BUILD": (f"source builds of {', '.join(_COMPILED[:-1])} and {_COMPILED[-1]} when no prebuilt wheel fits: auto "
                                   "(default: only with nvcc of torch's CUDA major, or hipcc, and only for the visible "
                                   "GPU archs), 1 (also for all archs: long), 0 (never)"),
    "FASTPATH_HOOKS_SPLIT_COMPILE": ("source builds: auto (default: nvcc's --split-compile where nvcc >= 11.8 and "
                                     "the kernel's pins allow it, its threads from the build's share of the cores), "
                                     "0 (off) or the threads per nvcc job"),
    "FASTPATH_HOOKS_CACHE_DIR": ("absolute directory for verdicts and the wheel cache of built and downloaded kernel "
                                 "wheels (default: the user cache dir, e.g. ~/.cache/fastpath-hooks); one that is "
                                 "relative or cannot be created or written falls back to the default, said once"),
    PINS: ("a JSON (or TOML) file that overrides or extends the shipped pins and rules (at most 1 MB: a larger one is "
           "refused unread)"),
    "FASTPATH_HOOKS_TARGET": "pose as another machine, e.g. gpu=sm_90,torch=2.11.0,cuda=13.0,triton=3.6.0,python=3.12",
    "FASTPATH_HOOKS_LOG": ("what the printing process (one per node, see Safety) writes to stderr: off, error, "
                           "warning, info (default) or debug"),
    "FASTPATH_HOOKS_RETRY_AFTER": ("seconds a failed attempt is remembered before an interpreter start retries it "
                                   "(default 3600); `fastpath-hooks install` retries at once"),
    "FASTPATH_HOOKS_LOCK_TIMEOUT": "seconds a process waits for another one's install to finish (default 1800)",
}
VARIABLES = variables(REGISTRY)


class SettingsError(ValueError):
    """One or more FASTPATH_HOOKS_* variables hold a value that cannot be used."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        self.problems = problems
        lines = [f"{var}={value!r} is not valid: {why}" for var, value, why in problems]
        super().__init__("; ".join(lines))


@dataclass(frozen=True)
class Settings:
    disable: bool = False
    skip: frozenset = frozenset()
    mode: str = "install"
    find_links: tuple = ()
    offline: bool = False
    index_url: str | None = None
    installer: str = "auto"
    timeout: float = DEFAULT_TIMEOUT
    allow_build: str = "auto"          # "auto", "1" or "0" (see BUILD_MODES)
    split_compile: str = "auto"        # "auto", "0" or a number of threads per nvcc job
    cache_dir: str | None = None
    pins_file: str | None = None
    target: str | None = None
    log: str = DEFAULT_LOG
    wheel_urls: FrozenMap = field(default_factory=FrozenMap)   # kernel -> its release-wheel mirror (registry `mirror`)
    retry_after: float = DEFAULT_RETRY_AFTER
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    # FASTPATH_HOOKS_CACHE_DIR given but unusable (relative, cannot be created or written): why, in one sentence;
    # cache_dir is then None (the default root), said once as a warning
    cache_dir_unusable: str | None = None
    cache_dir_refused: tuple = field(default=(), compare=False)   # (value given, why, root used): the short line
    # the variables the user set: reports tell defaults from choices
    explicit: frozenset = field(default=frozenset(), compare=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        problems: list[tuple[str, str, str]] = []
        values: dict = {}

        def get(name: str) -> str | None:
            return (env.get(name) or "").strip() or None

        def parse(name: str, key: str | None, parser):
            raw = get(name)
            if raw is None:
                return None
            try:
                value = parser(raw)
            except ValueError as exc:
                problems.append((name, env.get(name, ""), str(exc)))
                return None
            if key is not None:
                values[key] = value
            return value

        reg = registry(env) if get(PINS) else REGISTRY   # a pins file may add kernels (their names, mirrors)
        parse(DISABLE, "disable", lambda raw: parse_bool(raw) and disabled({DISABLE: raw}))
        parse("FASTPATH_HOOKS_SKIP", "skip", lambda raw: parse_kernel_list(raw, reg))
        parse("FASTPATH_HOOKS_MODE", "mode", _choice(MODES))
        parse(FIND_LINKS, "find_links", _parse_find_links)
        parse("FASTPATH_HOOKS_OFFLINE", "offline", parse_bool)
        parse("FASTPATH_HOOKS_INDEX_URL", "index_url", _url)
        parse("FASTPATH_HOOKS_INSTALLER", "installer", _choice(INSTALLERS))
        parse("FASTPATH_HOOKS_TIMEOUT", "timeout", _seconds)
        parse("FASTPATH_HOOKS_ALLOW_BUILD", "allow_build", parse_build_mode)
        parse("FASTPATH_HOOKS_SPLIT_COMPILE", "split_compile", parse_split_compile)
        parse(CACHE_DIR, "cache_dir", _directory_or_creatable)
        parse(PINS, "pins_file", _readable_file)
        parse("FASTPATH_HOOKS_TARGET", "target", lambda raw: _target_spec(raw, get(PINS)))
        parse(LOG, "log", _log_level)
        urls = {kernel: parse(variable, None, _url) for kernel, variable in mirror_variables(reg).items()}
        if any(urls.values()):
            values["wheel_urls"] = FrozenMap((k, u) for k, u in urls.items() if u)
        parse("FASTPATH_HOOKS_RETRY_AFTER", "retry_after", lambda raw: _seconds(raw, zero=True))
        parse("FASTPATH_HOOKS_LOCK_TIMEOUT", "lock_timeout", _seconds)

        known = variables(reg)
        unknown = sorted(k for k in env if k.startswith("FASTPATH_HOOKS_") and k not in known)
        prefix = len("FASTPATH_HOOKS_")
        suffixes = {v[prefix:]: v for v in known}
        for name in unknown:
            # compare what follows the shared prefix, or every name looks alike
            close = suffixes.get(_closest(name[prefix:], suffixes, cutoff=0.7) or "")
            hint = f"did you mean {close}?" if close else "see `fastpath-hooks doctor` for the list"
            problems.append((name, env[name], f"unknown variable; {hint}"))

        if values.get("offline") and get(FIND_LINKS) is None:
            problems.append(("FASTPATH_HOOKS_OFFLINE", env.get("FASTPATH_HOOKS_OFFLINE", ""), "offline installs need "
                             "a wheelhouse: set FASTPATH_HOOKS_FIND_LINKS to a directory of wheels (`fastpath-hooks "
                             "download --dest DIR` makes one)"))
        if problems:
            raise SettingsError(problems)
        unusable = values.get("cache_dir") and cache_dir_problem(values["cache_dir"])
        if unusable:
            values["cache_dir_unusable"] = (f"{CACHE_DIR}={values['cache_dir']} {unusable}; using "
                                            f"{default_cache_root(env)} instead")
            values["cache_dir_refused"] = (values["cache_dir"], unusable, default_cache_root(env))
            values["cache_dir"] = None
        explicit = frozenset(k for k in known if get(k) is not None)
        return cls(explicit=explicit, **values)

    def with_target(self, spec: str | None) -> "Settings":
        if spec is None:
            return self
        try:
            _target_spec(spec)
        except ValueError as exc:
            raise SettingsError([("--target", spec, str(exc))]) from None
        return replace(self, target=spec)

    def public(self) -> dict:
        """A JSON-ready view (for doctor/plan reports): the compared fields, allow_build as a bool and its mode."""
        data = {f.name: thaw(getattr(self, f.name)) for f in fields(self) if f.compare}
        data.update(allow_build=self.allow_build != "0", allow_build_mode=self.allow_build)
        return data


def parse_bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected one of 1, true, yes, on (or 0, false, no, off)")


def parse_build_mode(raw: str) -> str:
    low = raw.strip().lower()
    if low == "auto":
        return "auto"
    try:
        return "1" if parse_bool(low) else "0"
    except ValueError:
        raise ValueError("expected auto, 1 or 0 (true/yes/on or false/no/off too)") from None


def parse_split_compile(raw: str) -> str:
    low = raw.strip().lower()
    if low == "auto":
        return "auto"
    if low in _FALSE:
        return "0"
    if low.isdigit() and 0 < int(low) <= 1024:
        return str(int(low))
    raise ValueError("expected auto, 0 (off) or the threads per nvcc job, e.g. 4")


def parse_kernel_list(raw: str, reg=None) -> frozenset:
    reg = registry() if reg is None else reg
    return frozenset(k for name in kernel_list_names(raw) for k in kernels_named(name, reg))


def kernel_list_names(raw: str) -> list:
    """A kernel list's names as FASTPATH_HOOKS_SKIP and install(kernels=...) take it: comma or space separated."""
    return [part for part in raw.replace(",", " ").split() if part]


def kernels_named(name: str, reg=None) -> tuple:
    """The kernels a name of a kernel list means: any spelling of a kernel or an alias (PEP 503:
    `Causal.Conv1d`), or `all`; ValueError naming the closest known one."""
    reg = registry() if reg is None else reg
    kernels, aliases = listed(reg), kernel_aliases(reg)
    low = name.strip().lower()
    if low == "all":
        return tuple(kernels)
    for spelling in (low, canonical_name(low)):
        if spelling in aliases:
            return (aliases[spelling],)
    close = _closest(low, aliases, cutoff=0.6)
    hint = f"did you mean {aliases[close]}? " if close else ""
    raise ValueError(f"unknown kernel {name!r}; {hint}known: {', '.join(kernels)}")   # `all` too: no fix


def normalize_kernel(name: str, reg=None) -> str:
    reg = registry() if reg is None else reg
    try:
        return kernel_aliases(reg)[name.strip().lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown kernel {name!r}; known: {', '.join(listed(reg))}") from None


def _choice(options):
    def parse(raw: str) -> str:
        low = raw.lower()
        if low not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return low
    return parse


def _seconds(raw: str, zero: bool = False) -> float:
    says = ("expected a number of seconds >= 0 (0 retries at once), e.g. 3600" if zero else
            "expected a number of seconds greater than 0, e.g. 600")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(says) from None
    if not (value >= 0 if zero else value > 0) or value == float("inf"):
        raise ValueError(says)
    return value


def _url(raw: str) -> str:
    expected = "expected an http://, https:// or file:// URL"
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https", "file") or not (parts.netloc or parts.scheme == "file"):
        raise ValueError(expected)
    if any(c.isspace() for c in raw):
        raise ValueError(f"a URL cannot contain spaces; {expected}")
    return raw


def _log_level(raw: str) -> str:
    level = log_level({LOG: raw})
    if level is None:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)} (unset: {DEFAULT_LOG})")
    return level


def _parse_find_links(raw: str) -> tuple:
    items = list(find_links_given({FIND_LINKS: raw}))
    if not items:
        raise ValueError("expected one or more wheel directories or URLs")
    out = []
    for item in items:
        url = "://" in item
        if url and not item.startswith(("http://", "https://", "file://")):
            raise ValueError(f"{item!r}: only http(s):// and file:// URLs or local directories are accepted")
        path = item if url else os.path.abspath(os.path.expanduser(item))
        if not (url or os.path.isdir(path)):
            raise ValueError(f"{item!r} is not a directory (`fastpath-hooks download --dest` makes one)")
        out.append(path)
    return tuple(out)


def _directory_or_creatable(raw: str) -> str:
    path = cache_dir_given({CACHE_DIR: raw})
    if not path:
        raise ValueError("expected a directory path")
    if os.path.isabs(path) and os.path.exists(path) and not os.path.isdir(path):
        raise ValueError("exists and is not a directory; expected a directory (created if missing)")
    return path


def _readable_file(raw: str) -> str:
    path = os.path.abspath(os.path.expanduser(raw))
    try:
        st = os.stat(path)
    except OSError:
        raise ValueError("no such file; expected a JSON or TOML pins file") from None
    problem = pins_file_kind_problem(st.st_mode)
    if not problem and not os.access(path, os.R_OK):
        problem = "the file is not readable"
    problem = problem or pins_file_size_problem(st.st_size)
    if problem:
        raise ValueError(problem)
    return path


def _target_spec(raw: str, pins_file: str | None = None) -> str:
    parse_target(raw, pins_file=pins_file)  # raises ValueError with the offending entry
    return raw


