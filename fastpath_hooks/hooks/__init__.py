"""install() / uninstall(), the start-up entry and the import finder: the top of the hook layer.

This module is what an enabled environment loads at the first watched import (or
`sitecustomize-entrypoints` at every start), so it holds only what that needs: it
imports nothing new (`sys` and `_thread` are loaded by then) and puts one finder
on `sys.meta_path`. The finder returns None
at once for every name it does not watch; for the ones it does (the registry's kernel modules and
the gates module: `_names.WATCHED`, and the modules of the kernels a FASTPATH_HOOKS_PINS file adds,
read at install()), `importer` (loaded then) acts:

- `fla`, `causal_conv1d`, `tilelang`, `mamba_ssm` (and a user's kernels): before the import resolves -
  install, repair, or make the import fail with an explanation (era C of transformers
  chooses kernels with exactly this import, see transformers-eras.md);
- `transformers.utils.import_utils`: after it executed - wrap the gates;
- `transformers.integrations.hub_kernels` (5.25+): after it executed - wrap the hub-kernel mapping's getter.

What install() decided lives in one object, `HOOKS` (the lock, the finder, the selected
kernels); the modules below (importer, gates, late) are handed it and never import this
module, so the hook layer has no import circle. (A separate state module would cost
install() one more module load - ~0.4 M instructions, a fifth of what install() costs.)
"""

import _thread
import sys

from .._names import GATES_MODULE, HUB_MODULE, PINS, STAND_IN, STARTUP_FORMAT, VOICE, WATCHED, disabled, local_rank


class Hooks:
    """What install() decided, handed to the modules that act on it: one lock (held for
    milliseconds: registering, wrapping, rebinding), the finder in place, the kernels
    selected (None: all), and whether uninstall() ended it (a start-up stand-in must not
    install the hooks again then)."""

    def __init__(self):
        self.lock = _thread.RLock()
        self.finder = None
        self.kernels = None
        self.ended = False

    def installed(self) -> bool:
        return self.finder is not None and self.finder in sys.meta_path

    def selected(self, kernel) -> bool:
        return self.kernels is None or kernel in self.kernels

    @staticmethod
    def ours(finder) -> bool:
        """Whether a sys.meta_path entry is fastpath-hooks' finder."""
        return isinstance(finder, KernelImportFinder)

    @staticmethod
    def internal_error(exc) -> None:
        """One error line for a bug of ours on the import path; the import goes on without us."""
        try:
            from ..events import internal_error as report

            report(exc)
        except Exception:
            pass


HOOKS = Hooks()
internal_error = HOOKS.internal_error


def activate():
    """The start-up entry (via hooks/startup.py, or the `sitecustomize` entry point).

    Reads FASTPATH_HOOKS_DISABLE before anything else and never lets an
    exception reach the interpreter's start.
    """
    try:
        if not disabled():
            install()
    except Exception as exc:
        internal_error(exc)


def resume(fullname, path=None, target=None, *, format=None, **_newer):
    """Called by the start-up stand-in (hooks/startup.py) at the first watched import, from
    inside that import: activate - unless install() or uninstall() already decided - then
    answer the import as the finder would. Never raises into the import. `format`: the
    stand-in's format; another one (a newer fastpath-hooks wrote the entry) is said in one
    line, and the hand-over goes on."""
    try:
        if format != STARTUP_FORMAT:
            from ..events import warning

            warning(f"the start-up entry here is of another format ({format!r}) than this fastpath-hooks writes "
                    f"({STARTUP_FORMAT}); run `fastpath-hooks enable` again to rewrite it", once="startup-format")
        if HOOKS.finder is None and not HOOKS.ended:
            activate()
        finder = HOOKS.finder
        return None if finder is None else finder.find_spec(fullname, path, target)
    except Exception as exc:
        internal_error(exc)
        return None


def install(*, kernels=None, on_event=None):
    """Hook transformers' kernel choice. Idempotent, thread-safe, imports nothing heavy.

    kernels: names to manage (fla, causal-conv1d, tilelang, mamba-ssm, flash-qla), a list or one string
    as FASTPATH_HOOKS_SKIP takes it ("causal-conv1d,mamba-ssm"); None = all.
    on_event: called with a JSON-serialisable dict per event (`on_event=queue.put` works).
    Returns True when the hooks are in place, False when FASTPATH_HOOKS_DISABLE is set.
    A bad FASTPATH_HOOKS_* variable is said here. Modeling modules imported before this call
    already chose their kernels: hooks/late.py decides those kernels and rebinds their choice.
    A non-callable on_event is a TypeError here, at the call (not a silence at the first event).
    """
    if on_event is not None and not callable(on_event):
        raise TypeError(f"install(on_event=...) takes a callable (e.g. queue.put), not {type(on_event).__name__}")
    if disabled():
        import logging

        logging.getLogger("fastpath_hooks").info("install() is a no-op: FASTPATH_HOOKS_DISABLE is set")
        return False
    with HOOKS.lock:
        HOOKS.ended = False
        if on_event is not None:
            from ..events import add_listener

            add_listener(on_event)
        if kernels is None:
            HOOKS.kernels = None
        else:
            from .importer import normalize

            HOOKS.kernels = normalize(kernels)
        finder = HOOKS.finder
        if finder is None or finder not in sys.meta_path:
            finder = HOOKS.finder = KernelImportFinder()
            _place(finder)
        if _user_pins():
            finder.watched = _with_user_kernels()   # the modules of the kernels a pins file adds, too
        elif finder.watched is not WATCHED:
            finder.watched = WATCHED
        _quiet_stand_ins()
        gates_module = sys.modules.get(GATES_MODULE)
        if gates_module is not None:  # already imported: wrap now (else the finder does, at its import)
            from .importer import after_gates_import

            after_gates_import(gates_module, HOOKS)
        hub_module = sys.modules.get(HUB_MODULE)
        if hub_module is not None:    # transformers 5.25+'s mapping: the same
            from .importer import after_hub_import

            after_hub_import(hub_module, HOOKS)
    _claim_voice()
    if _settings_given():
        _check_settings()
    # An install into this environment killed half-way (or running now) left its journal: rolled back
    # (engine/jobs.py) before any kernel is imported, whatever FASTPATH_HOOKS_SKIP or kernels= leave
    # out. One access(2) per site-packages directory of this environment on sys.path (one in a venv):
    # installs go only to a writable site-packages, so the journal is <site-packages>/act.files.STATE_DIR_NAME/
    # act.files.JOURNAL (tests/test_interrupted.py keeps the literal equal). Inline, without a helper
    # function: install() runs at every start-up hand-over (benchmarks/import_cost.py counts it).
    import os

    prefix = sys.prefix + os.sep
    for entry in sys.path:
        if entry.endswith("-packages") and entry.startswith(prefix) and \
                os.access(entry + "/.fastpath-hooks/journal.json", 0):   # site-packages, dist-packages; F_OK
            try:
                from ..engine.jobs import recover_now

                recover_now(wait=False)
            except Exception as exc:
                internal_error(exc)
            break
    if "transformers" in sys.modules:  # a modeling module may have chosen its kernels already
        _late()
    return True


def _with_user_kernels() -> frozenset:
    """_names.WATCHED and the modules of the kernels a FASTPATH_HOOKS_PINS file adds (its kernels table is read)."""
    from .._registry import registry, watched_modules

    return watched_modules(registry())


def _claim_voice() -> None:
    """A launcher's local rank 0 prints for its node: mark it, so that the workers it starts later
    (DataLoader, pool, Process: they inherit LOCAL_RANK=0 with the environment) stay quiet, while the
    ranks that a plain script starts with torch.multiprocessing.spawn still speak for themselves."""
    import os

    marker = os.environ.get(VOICE)
    if marker and marker != str(os.getpid()):
        return  # a worker of a process that speaks
    if local_rank() == 0:
        os.environ[VOICE] = str(os.getpid())


def _settings_given() -> bool:
    """Any FASTPATH_HOOKS_* variable besides DISABLE (read above): then validate them at install().
    The names only (reading every value costs install() a tenth of its instructions)."""
    import os

    from .._names import DISABLE, PREFIX

    return any(name.startswith(PREFIX) and name != DISABLE for name in os.environ)


def _user_pins() -> bool:
    """A FASTPATH_HOOKS_PINS file is named: it may add kernels whose modules the finder must watch."""
    import os

    return bool(os.environ.get(PINS, "").strip())


def _check_settings() -> None:
    """Say a bad variable now, once (the engine stays quiet about it later). Values found valid
    before are remembered by a marker named after them (<cache>/settings-ok/<digest>), so a
    start with the same variables costs a digest and a stat, not settings.py's import. A valid
    FASTPATH_HOOKS_TARGET is said too - every decision of this process is for that machine - once per
    environment and target, like every line that would repeat at each start (later: the debug log)."""
    try:
        import hashlib
        import os

        from .._names import cache_root_from_environ
        from .._names import given

        digest = hashlib.sha256(repr(list(given())).encode("utf-8", "surrogateescape")).hexdigest()[:24]
        marker = os.path.join(cache_root_from_environ(os.environ), "settings-ok", digest)
        if not os.path.exists(marker):
            from ..engine import check_settings

            if not check_settings():
                return
            try:
                os.makedirs(os.path.dirname(marker), exist_ok=True)
                open(marker, "a").close()
            except OSError:
                pass  # only the shortcut is lost
        target = os.environ.get("FASTPATH_HOOKS_TARGET", "").strip()
        if target and target not in _posed:   # once per process (install() again says nothing new)
            _posed.add(target)
            from ..events import warning

            warning(f"posing {target}: nothing here is real (FASTPATH_HOOKS_TARGET; unset it to decide for this "
                    "machine)", once="posed", persist=f"posed:{target}")
    except Exception as exc:
        internal_error(exc)


_posed: set = set()   # the posed targets this process announced


def _late() -> None:
    """Heal the kernel choice of modeling modules imported before install() (hooks/late.py)."""
    try:
        from .late import heal

        heal(HOOKS)
    except Exception as exc:
        internal_error(exc)


def uninstall():
    """Undo install(): finders removed, the original gates back in every module; a start-up
    stand-in stays quiet from now on (install() turns fastpath-hooks on again)."""
    with HOOKS.lock:
        HOOKS.ended = True
        _quiet_stand_ins()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, KernelImportFinder)]
        HOOKS.finder = None
        HOOKS.kernels = None
        clear = getattr(sys.modules.get("fastpath_hooks.events"), "clear_listeners", None)
        if clear is not None:
            clear()
        unpatch = getattr(sys.modules.get("fastpath_hooks.hooks.gates"), "unpatch", None)
        if unpatch is not None:
            unpatch()
        unwrap, hub_module = getattr(sys.modules.get("fastpath_hooks.hooks.importer"), "unwrap_hub", None), \
            sys.modules.get(HUB_MODULE)
        if unwrap is not None and hub_module is not None:
            unwrap(hub_module)
        # (a module another thread is importing right now has decided nothing yet: nothing of it to undo)
        forget = getattr(sys.modules.get("fastpath_hooks.engine"), "forget", None)
        if forget is not None:
            forget()


def installed():
    return HOOKS.installed()


def selected(kernel):
    return HOOKS.selected(kernel)


def _place(finder) -> None:
    """Put the finder in a start-up stand-in's slot, else first. Never shifts the list: this can
    run from inside an import (the stand-in's resume), while CPython iterates sys.meta_path -
    removing an entry there would skip the finder after it."""
    for i, entry in enumerate(sys.meta_path):
        if is_stand_in(entry):
            sys.meta_path[i] = finder
            return
    sys.meta_path.insert(0, finder)


def _quiet_stand_ins() -> None:
    """Stand-ins still on sys.meta_path (another entry's, or a second enable method) watch nothing:
    install() / uninstall() decided; they stay where they are, inert."""
    for entry in sys.meta_path:
        if is_stand_in(entry):
            entry.watched = frozenset()


def is_stand_in(entry) -> bool:
    """A start-up stand-in (hooks/startup.py writes a function of that name)."""
    return getattr(entry, "__name__", None) == STAND_IN


class KernelImportFinder:
    """A `sys.meta_path` finder that watches the kernels' top-level module names and the gates module
    (`watched`: _names.WATCHED and a user's kernels, set by install()), and ignores the rest."""

    watched = WATCHED

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.watched:
            return None
        try:
            from .importer import find_spec

            return find_spec(fullname, path, target, HOOKS)
        except Exception as exc:  # never make an import worse than without fastpath-hooks
            internal_error(exc)
            return None
