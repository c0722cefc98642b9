"""What the import finder does for the names it watches (`hooks.KernelImportFinder`), for the
hooks' registry it is handed (`hooks.HOOKS`: the lock, what is installed and selected).

Loaded at the first watched import, never at interpreter start:

- `fla`, `causal_conv1d`, `tilelang`, `mamba_ssm`, `flash_qla`: ask the engine (`engine.ensure`) BEFORE the
  import resolves (a backend's - flash_qla's - only while the kernel it serves is not imported yet, or
  when it is installed: fla looks for it at its first call, inside a training step). It may install or repair (then the normal import proceeds and finds the new files), or say the
  kernel would crash here: the import then fails with an ImportError carrying the reason,
  before any of the kernel's code runs, so transformers keeps its torch path.
- `transformers.utils.import_utils`: let the real finder and loader import it, then wrap
  its gates (`gates.patch`).

Every failure of our own is reported and leaves the import exactly as it would be
without fastpath-hooks.
"""

from __future__ import annotations

import _thread
import sys

from .._names import GATES_MODULE, HUB_MODULE, KERNEL_MODULES, SERVES, WATCHED

_busy: set = set()   # (thread, name) while this module resolves `name` itself: no recursion


def find_spec(fullname, path, target, hooks):
    key = (_thread.get_ident(), fullname)
    if key in _busy:
        return None
    _busy.add(key)
    try:
        if fullname == GATES_MODULE:
            return _after_import_spec(fullname, path, target,
                                      lambda module: after_gates_import(module, hooks, just_imported=True), hooks)
        if fullname == HUB_MODULE:
            return _after_import_spec(fullname, path, target, lambda module: after_hub_import(module, hooks), hooks)
        return _before_kernel_import(fullname, hooks)
    finally:
        _busy.discard(key)


def normalize(kernels) -> frozenset:
    """install(kernels=...) -> canonical kernel names, in any form FASTPATH_HOOKS_SKIP takes (a list, or
    one string: `"causal-conv1d,mamba-ssm"`) and any spelling of a name (PEP 503: `flash_linear_attention`,
    `Causal.Conv1d`); an unknown name is said and ignored - and when none is left, that none is managed."""
    from .. import events
    from ..facts.settings import kernel_list_names, kernels_named

    names = [part for item in ([kernels] if isinstance(kernels, str) else kernels)
             for part in (kernel_list_names(item) if isinstance(item, str) else [item])]
    out, unknown = set(), []
    for name in names:
        try:
            out.update(kernels_named(name))
        except (ValueError, AttributeError) as exc:
            unknown.append(str(exc) if isinstance(exc, ValueError) else f"{name!r} is not a kernel name")
    for i, why in enumerate(unknown):
        events.error(f"install(kernels=...): {why}; " + ("ignoring it" if out or i < len(unknown) - 1 else
                                                         "no kernel is managed"))
    return frozenset(out)


def after_gates_import(module, hooks, *, just_imported: bool = False) -> None:
    """Wrap the gates - under the hooks' lock, and only while installed (an uninstall() may
    have run between this module's find_spec and the end of its execution).
    just_imported: the module has just executed, so only it holds the gates."""
    try:
        with hooks.lock:
            if hooks.installed():
                from . import gates

                gates.patch(module, hooks, just_imported=just_imported)
    except Exception as exc:
        hooks.internal_error(exc)


MAPPING = "get_kernel_mapping_transformers"   # transformers 5.25+: the hub-kernel mapping, built on first use


def after_hub_import(module, hooks) -> None:
    """transformers 5.25+: wrap its mapping getter, so that the hub kernels that may serve here are decided
    when transformers asks for them (engine/hub.py) - a copy of the mapping, the original left as it is."""
    try:
        with hooks.lock:
            original = module.__dict__.get(MAPPING)
            if not hooks.installed() or original is None or hasattr(original, "_fastpath_hooks_original"):
                return

            def get_kernel_mapping_transformers():
                mapping = original()
                if not hooks.installed():
                    return mapping
                try:
                    from ..engine.hub import choose

                    return choose(mapping)
                except Exception as exc:   # never make loading worse than without fastpath-hooks
                    hooks.internal_error(exc)
                    return mapping

            get_kernel_mapping_transformers._fastpath_hooks_original = original
            module.__dict__[MAPPING] = get_kernel_mapping_transformers
    except Exception as exc:
        hooks.internal_error(exc)


def unwrap_hub(module) -> None:
    """uninstall(): the original mapping getter back."""
    current = module.__dict__.get(MAPPING)
    original = getattr(current, "_fastpath_hooks_original", None)
    if original is not None:
        module.__dict__[MAPPING] = original


def _before_kernel_import(fullname, hooks):
    modules, serves = KERNEL_MODULES, SERVES
    finder = hooks.finder
    if finder is not None and finder.watched is not WATCHED:   # a FASTPATH_HOOKS_PINS file added kernels
        from .._registry import kernel_modules, registry, served_modules

        known = registry()
        modules, serves = kernel_modules(known), served_modules(known)
    kernel = modules.get(fullname)
    if kernel is None or not hooks.selected(kernel):
        if kernel is not None:   # not ours to decide - but never imported from a half-written install
            from ..engine.jobs import pending_journal, recover_now

            if pending_journal():
                try:
                    recover_now()
                except Exception as exc:
                    hooks.internal_error(exc)
        return None
    importer = _importer(modules)
    if importer is not None and importer != kernel and not _decided(kernel):
        return None   # another kernel package's optional import (fla.layers tries mamba_ssm): not a request
    served = serves.get(fullname)
    if served and not any(_installed(modules, name) for name in (fullname, *served)):
        return None   # someone else's optional import (see _names.SERVES): not ours to install
    if served and any(name in sys.modules for name in served) and _backend(kernel) and not _installed(modules, fullname):
        # the served kernel looks for its backend (fla: find_spec at its first call): installing it now would
        # happen inside a training step; it was decided - ensured right after fla - before fla's import
        return None
    try:
        from .. import engine

        engine.expect_from(_modeling_hint)   # read only if this kernel is about to be installed
        message = engine.before_import(kernel)
    except Exception as exc:  # never make an import worse than without fastpath-hooks
        hooks.internal_error(exc)
        return None
    if message is None:
        return None
    from importlib.machinery import ModuleSpec

    return ModuleSpec(fullname, BlockedLoader(message))


def _importer(modules) -> str | None:
    """The managed kernel whose package holds the code that runs this import (fla for `fla/layers/mamba2.py`'s
    `try: from mamba_ssm ...`), None when it is other code (transformers, the user). A kernel is installed
    because transformers or the user asks for it, never because another kernel package tries it: that import
    gets what it would get without fastpath-hooks. One frame walk, only for the watched names."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__") or ""
        if not name.startswith(("importlib", "_frozen_importlib", "fastpath_hooks")):
            return modules.get(name.partition(".")[0])
        frame = frame.f_back
    return None


def _decided(kernel: str) -> bool:
    """Decided in this process already (its outcome then stands: a block still blocks)."""
    engine = sys.modules.get("fastpath_hooks.engine")
    return engine is not None and kernel in engine.outcomes()


def _backend(kernel: str) -> bool:
    from .._registry import registry

    return (registry().get(kernel) or {}).get("kind") == "backend"


def _installed(modules: dict, module: str) -> bool:
    """Whether a kernel's module is installed: one of its kernel's distributions has its metadata on
    sys.path (an empty `fla/` that an uninstall left is a namespace package to the path finder, not fla)."""
    from .._registry import registry
    from ..facts.distributions import installed_versions

    entry = registry().get(modules.get(module, ""))
    return bool(entry and installed_versions(entry["distributions"]))


def _after_import_spec(fullname, path, target, callback, hooks):
    """The spec the rest of sys.meta_path finds, its loader wrapped to call `callback(module)` afterwards."""
    for finder in list(sys.meta_path):
        if hooks.ours(finder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            break
    else:
        return None
    if spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return spec
    spec.loader = AfterImportLoader(spec.loader, callback)
    return spec


class BlockedLoader:
    """Makes `import <kernel>` fail with the reason, before any of its code runs."""

    def __init__(self, message):
        self.message = message

    def create_module(self, spec):
        raise ImportError(self.message, name=spec.name)

    def exec_module(self, module):  # pragma: no cover - create_module always raises
        raise ImportError(self.message, name=module.__name__)


class AfterImportLoader:
    """Runs the real loader, then a callback on the executed module.

    Transparent: before the module's code runs, its `__spec__.loader` and `__loader__`
    are the real loader again (tracebacks, `inspect.getsource`, `importlib.reload` and
    resource readers see what they would without us); other attributes are delegated.
    """

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        try:
            module.__loader__ = self._loader
        except AttributeError:
            pass
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name):  # get_source, get_filename, is_package, get_resource_reader ...
        if name in ("_loader", "_callback"):
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __repr__(self):
        return f"<fastpath-hooks after-import wrapper of {self._loader!r}>"


def _modeling_hint():
    """The kernels the modeling module being imported names (hooks/gates.py), for the engine's batch."""
    from .gates import modeling_kernels

    return modeling_kernels()
