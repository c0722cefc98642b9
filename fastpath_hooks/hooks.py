"""install() / uninstall(), the start-up entry and the import finder.

This module is what an enabled environment loads at the first watched import (or
`sitecustomize-entrypoints` at every start), so it holds only what that needs: it
imports nothing new (`sys` and `_thread` are loaded by then) and puts one finder
on `sys.meta_path`. The finder returns None
at once for every name it does not watch; for the four it does, `importer`
(loaded then) acts:

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
    """The start-up entry (via activation.STARTUP, or the `sitecustomize` entry point).

    Reads FASTPATH_HOOKS_DISABLE before anything else and never lets an
    exception reach the interpreter's start.
    """
    try:
        import os

        if os.environ.get("FASTPATH_HOOKS_DISABLE", "").strip().lower() not in _TRUE:
            install()
    except Exception:
        pass


def resume(fullname, path=None, target=None):
    """Called by the start-up stand-in (activation.STARTUP) at the first watched import:
    activate, then answer that import as the finder would."""
    activate()
    finder = _state["finder"]
    return None if finder is None else finder.find_spec(fullname, path, target)


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
        if kernels is None:
            _state["kernels"] = None
        else:
            from .importer import normalize

            _state["kernels"] = normalize(kernels)
        if _state["finder"] not in sys.meta_path:
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, KernelImportFinder)]
            _state["finder"] = KernelImportFinder()
            sys.meta_path.insert(0, _state["finder"])
        gates_module = sys.modules.get(GATES_MODULE)
        if gates_module is not None:  # already imported: wrap now (else the finder does, at its import)
            from .importer import after_gates_import

            after_gates_import(gates_module)
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


class KernelImportFinder:
    """A `sys.meta_path` finder that watches four module names and ignores the rest."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _WATCHED:
            return None
        from .importer import find_spec

        return find_spec(fullname, path, target)
