"""install() / uninstall(), the start-up entry and the kernel import hook.

This module is what runs at interpreter start when fastpath-hooks is enabled,
so it imports nothing but `sys` and `_thread` and does nothing but put one
finder on `sys.meta_path`. The finder returns None at once for every module it
does not watch; for the few it does, it calls into `runtime` (loaded then):

- `fla`, `causal_conv1d`, `tilelang`: before the import resolves - install,
  repair, or make the import fail with an explanation (era C of transformers
  chooses kernels with exactly this import, see transformers-eras.md);
- `transformers.utils.import_utils`: after it executed - wrap the gates.
"""

import sys
import _thread

KERNEL_MODULES = {"fla": "fla", "causal_conv1d": "causal-conv1d", "tilelang": "tilelang"}
GATES_MODULE = "transformers.utils.import_utils"
_WATCHED = frozenset(KERNEL_MODULES) | {GATES_MODULE}
_TRUE = ("1", "true", "yes", "on")

_lock = _thread.RLock()
_state = {"finder": None, "kernels": None, "listeners": []}


def activate():
    """The start-up entry (`.pth` line, sitecustomize block, `sitecustomize` entry point).

    Reads FASTPATH_HOOKS_DISABLE before anything else and never lets an
    exception reach the interpreter's start.
    """
    try:
        import os

        if os.environ.get("FASTPATH_HOOKS_DISABLE", "").strip().lower() in _TRUE:
            return
        install()
    except Exception:
        pass


def install(*, kernels=None, on_event=None):
    """Hook transformers' kernel choice. Idempotent, thread-safe, imports nothing heavy.

    kernels: names to manage (fla, causal-conv1d, tilelang); None = all.
    on_event: called with a JSON-serialisable dict per event (`on_event=queue.put` works).
    Returns True when the hooks are in place, False when FASTPATH_HOOKS_DISABLE is set.
    """
    import os

    if os.environ.get("FASTPATH_HOOKS_DISABLE", "").strip().lower() in _TRUE:
        import logging

        logging.getLogger("fastpath_hooks").info("install() is a no-op: FASTPATH_HOOKS_DISABLE is set")
        return False
    with _lock:
        if on_event is not None and on_event not in _state["listeners"]:
            _state["listeners"].append(on_event)
        _state["kernels"] = None if kernels is None else _normalize(kernels)
        if _state["finder"] is None or _state["finder"] not in sys.meta_path:
            finder = KernelImportFinder()
            sys.meta_path.insert(0, finder)
            _state["finder"] = finder
        gates_module = sys.modules.get(GATES_MODULE)
    if gates_module is not None:
        _after_gates_import(gates_module)
    return True


def uninstall():
    """Undo install(): finders removed, the original gates back in every module."""
    with _lock:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, KernelImportFinder)]
        _state["finder"] = None
        _state["kernels"] = None
        _state["listeners"] = []
        gates = sys.modules.get("fastpath_hooks.gates")
        if gates is not None:
            gates.unpatch()
        runtime = sys.modules.get("fastpath_hooks.runtime")
        if runtime is not None:
            runtime.forget()


def installed():
    return _state["finder"] is not None and _state["finder"] in sys.meta_path


def listeners():
    return tuple(_state["listeners"])


def selected(kernel):
    kernels = _state["kernels"]
    return kernels is None or kernel in kernels


def _normalize(kernels):
    from .settings import normalize_kernel

    if isinstance(kernels, str):
        kernels = [kernels]
    out = set()
    for name in kernels:
        try:
            out.add(normalize_kernel(name))
        except ValueError as exc:
            from . import events

            events.error(f"install(kernels=...): {exc}; ignoring it")
    return frozenset(out)


class _BlockedLoader:
    """Makes `import <kernel>` fail with the reason, before any of its code runs."""

    def __init__(self, message):
        self.message = message

    def create_module(self, spec):
        raise ImportError(self.message, name=spec.name)

    def exec_module(self, module):  # pragma: no cover - create_module always raises
        raise ImportError(self.message, name=module.__name__)


class _AfterImportLoader:
    """Runs the real loader, then a callback on the executed module."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader  # transparent afterwards: tracebacks, get_source, reload
        try:
            module.__loader__ = self._loader
        except AttributeError:
            pass
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class KernelImportFinder:
    """A `sys.meta_path` finder that watches four module names and ignores the rest."""

    def __init__(self):
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _WATCHED:
            return None
        key = (_thread.get_ident(), fullname)
        if key in self._busy:
            return None
        self._busy.add(key)
        try:
            if fullname == GATES_MODULE:
                return self._after_import(fullname, path, target)
            return _before_kernel_import(fullname)
        finally:
            self._busy.discard(key)

    def invalidate_caches(self):
        pass

    def _after_import(self, fullname, path, target):
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, KernelImportFinder):
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
        spec.loader = _AfterImportLoader(spec.loader, _after_gates_import)
        return spec


def _before_kernel_import(fullname):
    kernel = KERNEL_MODULES[fullname]
    if not selected(kernel):
        return None
    try:
        from . import runtime

        message = runtime.before_import(kernel)
    except Exception as exc:  # never make an import worse than without fastpath-hooks
        _internal_error(exc)
        return None
    if message is None:
        return None
    from importlib.machinery import ModuleSpec

    return ModuleSpec(fullname, _BlockedLoader(message))


def _after_gates_import(module):
    try:
        from . import gates

        gates.patch(module)
    except Exception as exc:
        _internal_error(exc)


def _internal_error(exc):
    try:
        from . import events

        events.error(f"internal error, leaving this import alone: {type(exc).__name__}: {exc}", once="internal")
    except Exception:
        pass
