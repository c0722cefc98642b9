"""`fastpath-hooks enable / disable`: a start-up entry in the current environment.

Both methods put the stand-in finder of hooks/startup.py on `sys.meta_path` at interpreter start (a stand-in,
not `import fastpath_hooks.hooks`: each module import costs ~0.3-0.5 M instructions at every start):
- `pth`: `<site-packages>/fastpath-hooks-startup.pth` importing the stand-in, a module beside it;
- `sitecustomize`: the stand-in as a marked block in the environment's `sitecustomize.py` (created if
  absent); `disable` takes out only the block's lines, so the user's own come back byte for byte;
- `auto` (default): `sitecustomize` where this environment owns its sitecustomize.py, else `pth`.
Nothing is written that would not compile (it must never stop `python` from starting), and its .pyc is
written too (PYTHONDONTWRITEBYTECODE images). Never a `sitecustomize` that would shadow, or be shadowed by,
another one (Debian ships its own).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import py_compile
import re
import sys

from .._names import STARTUP_FORMAT
from ..facts.distributions import site_packages

PTH_NAME = "fastpath-hooks-startup.pth"
STARTUP_MODULE = "_fastpath_hooks_startup"
BEGIN = "# >>> fastpath-hooks >>>"
END = "# <<< fastpath-hooks <<<"
FORMAT = f"v{STARTUP_FORMAT}"   # the block's header; the stand-in tells resume() the same number

STARTUP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup.py")
WATCHED_MARK = "  # _names.WATCHED"


def watched_line(watched) -> str:
    """hooks/startup.py's line of watched module names (marked WATCHED_MARK)."""
    return f"            {tuple(sorted(watched))!r})))" + WATCHED_MARK + "\n"


def startup_source() -> str:
    """hooks/startup.py as `enable` writes it, watching the registry's modules: the shipped ones
    (generated into the file by tools/registry_index.py) and those a FASTPATH_HOOKS_PINS file adds now."""
    from .._registry import registry, watched_modules

    with open(STARTUP_FILE, encoding="utf-8") as fh:
        lines = fh.read().splitlines(keepends=True)
    watched = watched_line(watched_modules(registry()))
    return "".join(watched if line.rstrip("\n").endswith(WATCHED_MARK) else line for line in lines)


class ActivationError(RuntimeError):
    pass


def package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # fastpath_hooks/


def enable(method: str = "auto") -> list[str]:
    if method not in ("auto", "pth", "sitecustomize"):
        raise ActivationError(f"unknown method {method!r}; use auto, pth or sitecustomize")
    done = []
    if method == "auto":
        try:
            _sitecustomize_target()
            method = "sitecustomize"
        except ActivationError as exc:
            method = "pth"
            done.append(f"using the .pth entry: {exc}")
    done += disable(keep=method) + _compile_package()
    if method == "pth":
        module = os.path.join(site_packages(), STARTUP_MODULE + ".py")
        _write(module, startup_source())
        path = os.path.join(site_packages(), PTH_NAME)
        _write(path, f"import {STARTUP_MODULE}\n")   # site.py parses .pth lines at every start: one import
        return done + [f"wrote {module} (compiled) and {path}"]
    path, created = _sitecustomize_target()
    write_block(path, created=created)
    return done + [f"wrote the block in {path} (compiled)"]


def disable(keep: str | None = None) -> list[str]:
    """Remove the start-up entries of every method but `keep` (enable: never two entries at once)."""
    done = []
    if keep != "pth":
        for name in (PTH_NAME, STARTUP_MODULE + ".py"):
            path = os.path.join(site_packages(), name)
            if os.path.exists(path):
                os.unlink(path)
                if path.endswith(".py"):
                    _remove_pyc(path)
                done.append(f"removed {path}")
    if keep == "sitecustomize":
        return done
    for path in _sitecustomize_files():
        said = remove_block(path)
        if said:
            done.append(said)
    return done


def write_block(path: str, *, created: bool) -> None:
    """The block at the end of the sitecustomize.py at `path` (created: there is none yet), compiled."""
    original = b""
    if not created:
        with open(path, "rb") as fh:
            original = fh.read()
    _write(path, with_block(original, created=created))


def remove_block(path: str) -> str | None:
    """Take the block out of the sitecustomize.py at `path`; what was done, None when it holds none."""
    with open(path, "rb") as fh:
        content = fh.read()
    if BEGIN.encode() not in content:
        return None
    if find_block(content) is None:   # lines that look like ours, not a block enable wrote: not ours to touch
        if any(_begin_flags(line) for line in content.splitlines()):
            return (f"left {path} as it is: it has fastpath-hooks' begin line but not the block `enable` wrote "
                    "(its end line is gone?); remove what is left of it by hand")
        return None
    restored, created = without_block(content)
    if created and not restored:
        os.unlink(path)
        _remove_pyc(path)
        return f"removed {path} (it was created by enable)"
    _write(path, restored, what="without fastpath-hooks' block")
    return f"restored {path}"


def status() -> dict:
    pth = os.path.join(site_packages(), PTH_NAME)
    blocks = []
    for path in _sitecustomize_files():
        try:
            with open(path, "rb") as fh:
                if find_block(fh.read()) is not None:
                    blocks.append(path)
        except OSError:
            continue
    runs = _sitecustomize_that_runs()
    shadowed = {path: runs for path in blocks if runs and os.path.realpath(runs) != os.path.realpath(path)}
    return {"pth": pth if os.path.exists(pth) else None, "sitecustomize": blocks, "shadowed": shadowed}


def _sitecustomize_that_runs():
    """The file Python imports as `sitecustomize` at a start like this one (its PYTHONPATH): the one this
    process ran, else the first on sys.path; None: none. A block in another file never runs (silently)."""
    module = sys.modules.get("sitecustomize")
    if module is not None:
        return getattr(module, "__file__", None)
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize")
    return spec.origin if spec is not None and spec.has_location else None


# The block is whole lines: a BEGIN line at column 0 (`BEGIN v<format> [created] [newline]`), the stand-in,
# an END line. Anything that merely looks like a marker (indented, in a string, without a format tag, a
# BEGIN without an END after it) is the user's own line.

_BEGIN_LINE = re.compile(re.escape(BEGIN.encode()) + rb" (\s*v[0-9]+(?:\s+[a-z]+)*)\s*")


def _begin_flags(line: bytes):
    """The flags of a BEGIN line as enable writes it (`v<format>`, then lower-case words), else None."""
    found = _BEGIN_LINE.fullmatch(line)
    return found and found.group(1).decode().split()


def find_block(content: bytes):
    """(lines, first, last, flags) of the block enable wrote (first, last: the BEGIN and END lines' indices
    in content.splitlines(keepends=True)), or None. A pair of markers around lines that are not the
    stand-in is the user's."""
    lines = content.splitlines(keepends=True)
    first = flags = None
    for i, line in enumerate(lines):
        begin = _begin_flags(line)
        if begin is not None:
            first, flags = i, begin
        elif first is not None and line.rstrip(b"\r\n") == END.encode():
            if b"fastpath_hooks" in b"".join(lines[first + 1:i]):   # the stand-in hands over to the package
                return lines, first, i, flags
            first = flags = None    # a pair of marker lines around the user's own code
    return None


def without_block(content: bytes):
    """(content without the block, whether enable created the file). The line end enable added after a
    last line that had none ("newline") goes only where that line is still the last one (a line the user
    appended since is never glued onto it)."""
    found = find_block(content)
    if found is None:
        return content, False
    lines, first, last, flags = found
    before, after = lines[:first], lines[last + 1:]
    if "newline" in flags and not after and before and before[-1].endswith(b"\n"):
        before[-1] = before[-1][:-1]
    return b"".join(before + after), "created" in flags


def with_block(original: bytes, *, created: bool) -> bytes:
    """The file with one block at its end (enable twice: one block, the first one's flags kept)."""
    if find_block(original) is not None:
        original, created = without_block(original)
    flags = FORMAT
    if created:
        flags += " created"
    elif original and not original.endswith((b"\n", b"\r")):
        flags += " newline"
    return original + (b"\n" if "newline" in flags else b"") + f"{BEGIN} {flags}\n{startup_source()}{END}\n".encode()


def compile_problem(data: bytes, path: str):
    """Why `data` would not compile as the Python file `path` (a line for the user), else None."""
    try:
        compile(data, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"line {exc.lineno}: {exc.msg}"
    except ValueError as exc:   # e.g. a NUL byte
        return str(exc)
    return None


def _sitecustomize_files() -> list[str]:
    candidates = (os.path.join(entry, "sitecustomize.py") for entry in sys.path if entry)
    return [path for path in candidates if os.path.isfile(path)]


def _sitecustomize_target():
    """(path, created): the file Python imports as `sitecustomize` in this environment."""
    prefix = os.path.realpath(sys.prefix)
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        package = os.path.join(entry, "sitecustomize", "__init__.py")
        module = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(package):
            raise ActivationError(
                f"{os.path.dirname(package)} is a sitecustomize package (it runs fastpath-hooks' entry point "
                "already); use --method pth")
        if os.path.isfile(module):
            if not os.path.realpath(module).startswith(prefix + os.sep):
                raise ActivationError(
                    f"{module} is the system Python's and runs instead of one here; use --method pth")
            if not os.access(module, os.W_OK):
                raise ActivationError(f"{module} is not writable")
            with open(module, "rb") as fh:
                problem = compile_problem(fh.read(), module)
            if problem:  # Python already says "Error in sitecustomize" at every start: ours would never run
                raise ActivationError(f"{module} does not compile ({problem}); fix it, or use --method pth")
            return module, False
    return os.path.join(site_packages(), "sitecustomize.py"), True


def _write(path: str, data, what: str = "with fastpath-hooks' entry") -> None:
    """Atomically; a .py file only when it compiles, and then its .pyc too."""
    data = data.encode() if isinstance(data, str) else data
    if path.endswith(".py"):
        problem = compile_problem(data, path)
        if problem:
            raise ActivationError(f"{path} would not compile {what} ({problem}); left as it is: "
                                  "fix that line, then run this again")
    tmp = path + ".fastpath-hooks.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if os.path.exists(path):
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ActivationError(f"cannot write {path}: {exc.strerror}") from None
    if path.endswith(".py"):
        _compile(path)


def _compile(path: str) -> None:
    try:
        py_compile.compile(path, cfile=importlib.util.cache_from_source(path), doraise=True)
    except (py_compile.PyCompileError, OSError):
        pass  # only a start-up cost, never a failure


def _remove_pyc(path: str) -> None:
    try:
        os.unlink(importlib.util.cache_from_source(path))
    except OSError:
        pass


def _compile_package() -> list[str]:
    """The modules that run at the first watched import need their .pyc."""
    out = []
    for name in ("__init__.py", "_names.py", "hooks/__init__.py"):
        path = os.path.join(package_dir(), name)
        if not os.path.exists(importlib.util.cache_from_source(path)):
            _compile(path)
            out.append(f"compiled {path}")
    return out
