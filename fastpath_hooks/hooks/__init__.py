"""The import hook: install() / uninstall(), the start-up hand-over, and the finder of the watched imports.

Loaded at the first watched import of an enabled environment: at module level it imports only what is
loaded by then. For a kernel module the engine may install, repair or block it (an ImportError with the
reason before any of its code runs, so transformers keeps its torch path); after `import_utils` executes the
gates are wrapped (gates.py), after `hub_kernels` (5.25+) the hub mapping's getter, after `masking_utils` its
mask preprocessing, looked at once for packed rows that leak (packed.py). A failure of ours is one line and
leaves the import as it would be without fastpath-hooks.
"""

import _thread
import sys

from .._names import (ASKED, GATES_MODULE, HUB_MODULE, KERNEL_MODULES, MASKS_MODULE, PINS, SERVES, STAND_IN,
                      STARTUP_FORMAT, VOICE, WATCHED, disabled, local_rank, log)


class Hooks:
    """What install() decided, handed to gates.py and late.py (they never import this module). The lock is
    held for milliseconds; `ended`: uninstall() ran, so a start-up stand-in must not install again."""

    def __init__(self):
        self.lock = _thread.RLock()
        self.finder = None
        self.kernels = None   # the kernels selected (None: all)
        self.ended = False

    def installed(self) -> bool:
        return self.finder is not None and self.finder in sys.meta_path

    def selected(self, kernel) -> bool:
        return self.kernels is None or kernel in self.kernels

    @staticmethod
    def internal_error(exc) -> None:
        """A bug of ours on the import path: one line; the import goes on without us."""
        try:
            from ..events import internal_error as report

            report(exc)
        except Exception:
            pass


HOOKS = Hooks()
internal_error = HOOKS.internal_error


def _guarded(function):
    """`function` whose exception is one line (internal_error) and a None: never an import made worse."""
    def guarded(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            internal_error(exc)
            return None
    guarded.__name__, guarded.__qualname__, guarded.__doc__ = function.__name__, function.__qualname__, function.__doc__
    return guarded


@_guarded
def activate():
    """The start-up entry (hooks/startup.py, or the `sitecustomize` entry point); never raises."""
    if not disabled():
        install()


@_guarded
def resume(fullname, path=None, target=None, *, format=None, **_newer):
    """The start-up stand-in's hand-over, inside the first watched import: activate (unless install() or
    uninstall() already decided), then answer as the finder would."""
    if format != STARTUP_FORMAT:
        from ..events import warning

        warning(f"the start-up entry here is of another format ({format!r}) than this fastpath-hooks writes "
                f"({STARTUP_FORMAT}); run `fastpath-hooks enable` again to rewrite it", once="startup-format")
    if HOOKS.finder is None and not HOOKS.ended:
        activate()
    finder = HOOKS.finder
    return None if finder is None else finder.find_spec(fullname, path, target)


def install(*, kernels=None, on_event=None):
    """Hook transformers' kernel choice. Idempotent, thread-safe, imports nothing heavy.

    kernels: names to manage, a list or one string as FASTPATH_HOOKS_SKIP takes it; None = all (another type: a
    TypeError).
    on_event: called with a JSON-serialisable dict per event (`on_event=queue.put` works).
    Returns True when the hooks are in place, False when FASTPATH_HOOKS_DISABLE is set. Modeling modules
    imported before this call already chose their kernels: hooks/late.py rebinds their choice.
    """
    if on_event is not None and not callable(on_event):
        raise TypeError(f"install(on_event=...) takes a callable (e.g. queue.put), not {type(on_event).__name__}")
    names = None if kernels is None else _kernel_names(kernels)
    if disabled():
        log("install() is a no-op: FASTPATH_HOOKS_DISABLE is set", level=20)
        return False
    import os

    with HOOKS.lock:
        HOOKS.ended = False
        if on_event is not None:
            from ..events import add_listener

            add_listener(on_event)
        HOOKS.kernels = None if names is None else _normalize(names)
        finder = HOOKS.finder
        if finder is None or finder not in sys.meta_path:
            finder = HOOKS.finder = KernelImportFinder()
            _place(finder)
        if os.environ.get(PINS, "").strip():   # the modules of the kernels a pins file adds, too
            from .._registry import registry, watched_modules

            finder.watched = watched_modules(registry())
        else:
            finder.watched = WATCHED
        _quiet_stand_ins()
        if GATES_MODULE in sys.modules:   # else the finder wraps them at their import
            _after_gates_import(sys.modules[GATES_MODULE])
        if HUB_MODULE in sys.modules:
            _after_hub_import(sys.modules[HUB_MODULE])
        if MASKS_MODULE in sys.modules:
            _after_masks_import(sys.modules[MASKS_MODULE])
    _claim_voice()
    _check_settings()
    # An install killed half-way (or running now) left its journal: rolled back (engine/jobs.py) before any
    # kernel is imported. One access(2) per site-packages: install() runs at every start-up hand-over. The
    # literal is _names' STATE_DIR_NAME/JOURNAL (tests/test_interrupted.py keeps it equal).
    prefix = sys.prefix + os.sep
    if any(entry.endswith("-packages") and entry.startswith(prefix)
           and os.access(entry + "/.fastpath-hooks/journal.json", 0) for entry in sys.path):   # 0: F_OK
        _recover()
    if "transformers" in sys.modules:  # a modeling module may have chosen its kernels already
        _heal()
    return True


@_guarded
def _recover(wait=False) -> None:
    from ..engine.jobs import recover_now

    recover_now(wait=wait)


@_guarded
def _heal() -> None:
    from .late import heal

    heal(HOOKS)


def _kernel_names(kernels) -> list:
    """install(kernels=...) as a list of str; a TypeError naming the parameter for anything else (b'fla' was read
    as the numbers 102, 108, 97; a number raised a bare TypeError)."""
    if isinstance(kernels, str):
        return [kernels]
    names = None
    if not isinstance(kernels, (bytes, bytearray, memoryview)):
        try:
            names = list(kernels)
        except TypeError:
            pass
    if names is not None and all(isinstance(name, str) for name in names):
        return names
    what = type(kernels).__name__ if names is None else \
        f"a {type(kernels).__name__} holding {next(type(n).__name__ for n in names if not isinstance(n, str))}"
    raise TypeError(f"install(kernels=...) takes kernel names, a str or a list of str (e.g. kernels=['fla']), "
                    f"not {what}")


def _normalize(names: list) -> frozenset:
    """install(kernels=...)'s names -> canonical kernel names, in any form FASTPATH_HOOKS_SKIP takes; an unknown
    name is said and ignored - and when none is left, that none is managed."""
    from .. import events
    from ..facts.settings import kernel_list_names, kernels_named

    out, unknown = set(), []
    for name in (part for item in names for part in kernel_list_names(item)):
        try:
            out.update(kernels_named(name))
        except ValueError as exc:
            unknown.append(str(exc))
    for i, why in enumerate(unknown):
        events.error(f"install(kernels=...): {why}; " + ("ignoring it" if out or i < len(unknown) - 1 else
                                                         "no kernel is managed"))
    return frozenset(out)


def _claim_voice() -> None:
    """A launcher's local rank 0 prints for its node: marked, so that the workers it starts (they inherit
    LOCAL_RANK=0) stay quiet, while ranks started by torch.multiprocessing.spawn still speak."""
    import os

    marker = os.environ.get(VOICE)
    if (not marker or marker == str(os.getpid())) and local_rank() == 0:
        os.environ[VOICE] = str(os.getpid())


_posed: set = set()


@_guarded
def _check_settings() -> None:
    """Say a bad FASTPATH_HOOKS_* variable now, once. Valid values leave a marker named after them, so a
    start with the same ones costs a digest and a stat, not settings.py's import; only the variables'
    names are read when none is given (reading every value costs install() a tenth of its instructions)."""
    import os

    from .._names import DISABLE, PREFIX, cache_root_from_environ, given, sha256_hex

    if not any(name.startswith(PREFIX) and name != DISABLE for name in os.environ):
        return
    digest = sha256_hex(repr(list(given())).encode("utf-8", "surrogateescape"))[:24]
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
    if target and target not in _posed:   # once per process
        _posed.add(target)
        if _said_before(f"posed:{target}"):
            return
        from ..events import warning

        warning(f"posing {target}: nothing here is real (FASTPATH_HOOKS_TARGET; unset it to decide for this "
                "machine)", once="posed", persist=f"posed:{target}")


def _said_before(key: str) -> bool:
    """A line said once per environment (events' `persist`) that would reach no one now: said at an earlier start,
    FASTPATH_HOOKS_LOG not debug, and neither events (callbacks) nor logging loaded - not loaded for nothing."""
    import os

    from .._names import log_level, said_path

    return not ("fastpath_hooks.events" in sys.modules or "logging" in sys.modules) and log_level() != "debug" \
        and os.path.exists(said_path(key))


def uninstall():
    """Undo install(): finders removed, the original gates and hub mapping back; a start-up stand-in
    stays quiet from now on (install() turns fastpath-hooks on again)."""
    with HOOKS.lock:
        HOOKS.ended = True
        _quiet_stand_ins()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, KernelImportFinder)]
        HOOKS.finder = None
        HOOKS.kernels = None
        for module, function in (("fastpath_hooks.events", "clear_listeners"),
                                 ("fastpath_hooks.hooks.gates", "unpatch"), ("fastpath_hooks.hooks.packed", "unpatch"),
                                 ("fastpath_hooks.engine", "forget")):
            found = getattr(sys.modules.get(module), function, None)
            if found is not None:   # else nothing of it is loaded to undo
                found()
        hub = sys.modules.get(HUB_MODULE)
        original = getattr(getattr(hub, "__dict__", {}).get(MAPPING), "_fastpath_hooks_original", None)
        if original is not None:
            hub.__dict__[MAPPING] = original


def _place(finder) -> None:
    """Put the finder in a start-up stand-in's slot, else first; never shifts the list, which CPython may be
    iterating now (resume runs inside an import)."""
    for i, entry in enumerate(sys.meta_path):
        if getattr(entry, "__name__", None) == STAND_IN:
            sys.meta_path[i] = finder
            return
    sys.meta_path.insert(0, finder)


def _quiet_stand_ins() -> None:
    """Stand-ins still on sys.meta_path (another entry's, or a second enable method) stay, inert."""
    for entry in sys.meta_path:
        if getattr(entry, "__name__", None) == STAND_IN:
            entry.watched = frozenset()


# -- the finder ---------------------------------------------------------------------------

_busy: set = set()   # (thread, name) while the finder resolves `name` itself: no recursion


class KernelImportFinder:
    """A `sys.meta_path` finder for the `watched` names (set by install()); it ignores the rest."""

    watched = WATCHED

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.watched:
            return None
        key = (_thread.get_ident(), fullname)
        if key in _busy:
            return None
        _busy.add(key)
        try:
            if fullname == GATES_MODULE:
                return _after_import_spec(fullname, path, target,
                                          lambda module: _after_gates_import(module, just_imported=True))
            if fullname == HUB_MODULE:
                return _after_import_spec(fullname, path, target, _after_hub_import)
            if fullname == MASKS_MODULE:
                return _after_import_spec(fullname, path, target, _after_masks_import)
            return _before_kernel_import(fullname, path, target)
        except Exception as exc:  # never make an import worse than without fastpath-hooks
            internal_error(exc)
            return None
        finally:
            _busy.discard(key)


@_guarded
def _after_gates_import(module, *, just_imported=False) -> None:
    """Wrap the gates only while installed (an uninstall() may have run since find_spec). just_imported:
    only the module that has just executed holds the gates."""
    with HOOKS.lock:
        if HOOKS.installed():
            from . import gates

            gates.patch(module, HOOKS, just_imported=just_imported)


MAPPING = "get_kernel_mapping_transformers"   # transformers 5.25+: the hub-kernel mapping, built on first use


@_guarded
def _after_hub_import(module) -> None:
    """transformers 5.25+: the hub kernels that may serve here are decided (engine/hub.py) on a copy of the
    mapping, when transformers asks for it."""
    with HOOKS.lock:
        original = module.__dict__.get(MAPPING)
        if not HOOKS.installed() or original is None or hasattr(original, "_fastpath_hooks_original"):
            return

        def get_kernel_mapping_transformers():
            mapping = original()
            if not HOOKS.installed():
                return mapping
            try:
                from ..engine.hub import choose

                return choose(mapping)
            except Exception as exc:   # never make loading worse than without fastpath-hooks
                internal_error(exc)
                return mapping

        get_kernel_mapping_transformers._fastpath_hooks_original = original
        module.__dict__[MAPPING] = get_kernel_mapping_transformers


@_guarded
def _after_masks_import(module) -> None:
    """Its mask preprocessing is looked at until the first training forward: packed rows that leak are
    said (packed.py)."""
    with HOOKS.lock:
        if HOOKS.installed():
            from . import packed

            packed.patch(module)


def _before_kernel_import(fullname, path=None, target=None):
    """None where the engine is not to be asked before this kernel import resolves, else what it says."""
    modules, serves = KERNEL_MODULES, SERVES
    if HOOKS.finder is not None and HOOKS.finder.watched is not WATCHED:   # a pins file added kernels
        from .._registry import kernel_modules, registry, served_modules

        known = registry()
        modules, serves = kernel_modules(known), served_modules(known)
    kernel = modules.get(fullname)
    if kernel is None:
        return None
    if not HOOKS.selected(kernel):   # not ours to decide - but never imported from a half-written install
        from ..engine.jobs import pending_journal

        if pending_journal():
            _recover(wait=True)
        return None
    importer = _importer(modules)
    engine = sys.modules.get("fastpath_hooks.engine")
    decided = bool(engine and kernel in engine.outcomes())
    if importer is not None and importer != kernel and not decided:
        return None   # another kernel package's optional import (fla.layers tries mamba_ssm), not yet decided
    if not decided and _asked_only(kernel):
        return None   # flash attention: decided when a model asks for it (its gate), not at any import of it
    served = serves.get(fullname)
    if served and not any(_installed(modules, name) for name in (fullname, *served)):
        return None   # someone else's optional import (see _names.SERVES): not ours to install
    if served and any(name in sys.modules for name in served):
        from .._registry import registry

        if (registry().get(kernel) or {}).get("kind") == "backend" and not _installed(modules, fullname):
            return None   # looked for at the served kernel's first call: decided with it, before its import
    return _ask_engine(fullname, kernel, path, target)


@_guarded
def _ask_engine(fullname, kernel, path=None, target=None):
    """None (the import proceeds), a spec that fails it with the engine's reason, or - where the kernel's check
    waits for its first call - the real spec, whose module's checked functions are held once it has run."""
    from importlib.machinery import ModuleSpec

    from .. import engine
    from .gates import modeling_kernels

    engine.expect_from(modeling_kernels)   # read only if this kernel is about to be installed
    outcome = engine.ensure(kernel)
    if outcome.block is not None:
        return ModuleSpec(fullname, BlockedLoader(outcome.block))
    if outcome.first_call is None:
        return None
    from .first_call import hold

    pending = outcome.first_call
    return _after_import_spec(fullname, path, target, _guarded(lambda module: hold(pending)))


def _asked_only(kernel) -> bool:
    """An attention kernel (pins `attn_implementation`) that no model is asking for right now (hooks/gates.py)."""
    if HOOKS.finder is not None and HOOKS.finder.watched is not WATCHED:   # a pins file's kernels too
        from .._registry import registry

        wanted = (registry().get(kernel) or {}).get("attn_implementation")
    else:
        wanted = ASKED.get(kernel)
    if not wanted:
        return False
    from .gates import asked

    return not asked(wanted)


def _importer(modules):
    """The managed kernel whose package runs this import (fla for `fla/layers/mamba2.py`'s `try: from
    mamba_ssm ...`), None for other code: a kernel is installed when transformers or the user asks for
    it, never because another kernel package tries it."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__") or ""
        if not name.startswith(("importlib", "_frozen_importlib", "fastpath_hooks")):
            return modules.get(name.partition(".")[0])
        frame = frame.f_back
    return None


def _installed(modules, module) -> bool:
    """One of the module's kernel's distributions has its metadata on sys.path (an empty `fla/` that an
    uninstall left is a namespace package to the path finder, not fla)."""
    from .._registry import registry
    from ..facts.distributions import installed_versions

    entry = registry().get(modules.get(module, ""))
    return bool(entry and installed_versions(entry["distributions"]))


def _after_import_spec(fullname, path, target, callback):
    """The spec the rest of sys.meta_path finds, its loader wrapped to call `callback(module)` afterwards."""
    for finder in list(sys.meta_path):
        find = getattr(finder, "find_spec", None)
        if find is not None and not isinstance(finder, KernelImportFinder):
            spec = find(fullname, path, target)
            if spec is not None:
                break
    else:
        return None
    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
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
    """Runs the real loader, then a callback on the executed module. Before the module's code runs, its
    `__spec__.loader` and `__loader__` are the real loader again (tracebacks, `inspect.getsource`,
    `importlib.reload` see what they would without us); other attributes are delegated."""

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
