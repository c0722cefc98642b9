"""`fastpath-hooks enable / disable`: a start-up entry in the current environment.

Both methods put the same small stand-in finder (hooks/startup.py, written as source and
compiled to .pyc) on `sys.meta_path` at interpreter start. It reads
FASTPATH_HOOKS_DISABLE before anything else (coverage.py's pattern), imports
nothing of fastpath_hooks at start, and at the first import of a watched module
(fla, causal_conv1d, tilelang, mamba_ssm, transformers.utils.import_utils) loads
`fastpath_hooks.hooks`, activates it and hands that import over. A removed or
broken package then costs nothing and says nothing: the stand-in steps aside.

- `auto` (default): `sitecustomize` where this environment owns its sitecustomize.py,
  else `pth`;
- `pth`: `<site-packages>/fastpath-hooks-startup.pth` holds one line,
  `import _fastpath_hooks_startup`, the stand-in as a module beside it;
- `sitecustomize`: the stand-in as a marked block in the environment's
  `sitecustomize.py` (created if absent; existing content kept byte for byte and
  restored by `disable`: the user's own lines come back exactly, also lines they
  added or changed since - only the block's lines are taken out).

Whatever enable/disable write must compile: the new content is compiled before the
atomic replace, and nothing is written when it would not (the user's file stays as
it is, and the line says which line to fix).

Why a stand-in and not `import fastpath_hooks.hooks` at start: site.py parses every
.pth line at every start and each module import costs ~0.3-0.5 M instructions;
the stand-in keeps the start-up cost to one small compiled module (pth) or a few
compiled lines (sitecustomize) - benchmarks/startup_cost.py measures both.
Everything written is compiled to .pyc so PYTHONDONTWRITEBYTECODE images do not
compile it at every start.

Never writes a module named `sitecustomize` that would shadow - or be shadowed
by - another one (Debian ships its own): that is refused with the reason.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import sys

from .._names import STARTUP_FORMAT  # noqa: F401 (activation.STARTUP_FORMAT: the tag tests read)
from ..facts.distributions import site_packages

PTH_NAME = "fastpath-hooks-startup.pth"
STARTUP_MODULE = "_fastpath_hooks_startup"
BEGIN = "# >>> fastpath-hooks >>>"
END = "# <<< fastpath-hooks <<<"
FORMAT = f"v{STARTUP_FORMAT}"   # the block's header; the stand-in tells resume() the same number

# The stand-in finder is the real module hooks/startup.py (linted and tested as code; see its
# header); `startup_source()` is what `enable` writes.
STARTUP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup.py")
WATCHED_MARK = "  # _names.WATCHED"


def watched_line(watched) -> str:
    """hooks/startup.py's line of watched module names (marked WATCHED_MARK)."""
    return f"            {tuple(sorted(watched))!r})))" + WATCHED_MARK + "\n"


def startup_source() -> str:
    """hooks/startup.py as `enable` writes it, watching the registry's modules: the shipped ones
    (_names.WATCHED, generated into the file by tools/registry_index.py) and those of the kernels a
    FASTPATH_HOOKS_PINS file set now adds (run `enable` again after adding one: until then the finder
    watches it from the first watched import, or install(), on)."""
    from .._registry import registry, watched_modules

    with open(STARTUP_FILE, encoding="utf-8") as fh:
        lines = fh.read().splitlines(keepends=True)
    watched = watched_line(watched_modules(registry()))
    return "".join(watched if line.rstrip("\n").endswith(WATCHED_MARK) else line for line in lines)


class ActivationError(RuntimeError):
    pass


def package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # fastpath_hooks/


def pth_line() -> str:
    # Only `import <module>`: site.py parses .pth lines at every start, the module is compiled.
    return f"import {STARTUP_MODULE}\n"


def block(flags: str) -> str:
    return f"{BEGIN} {flags}\n{startup_source()}{END}\n"


def enable(method: str = "auto") -> list[str]:
    """auto: the sitecustomize block where this environment owns its sitecustomize.py (nearly free:
    site.py imports `sitecustomize` at every start anyway), else the .pth entry (one extra import)."""
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
    done += _remove_entries(keep=method) + _compile_package()
    if method == "pth":
        module = os.path.join(site_packages(), STARTUP_MODULE + ".py")
        _write(module, startup_source())
        _compile(module)
        path = os.path.join(site_packages(), PTH_NAME)
        _write(path, pth_line())
        return done + [f"wrote {module} (compiled) and {path}"]
    path, created = _sitecustomize_target()
    write_block(path, created=created)
    return done + [f"wrote the block in {path} (compiled)"]


def disable() -> list[str]:
    return _remove_entries(keep=None)


def _remove_entries(keep: str | None) -> list[str]:
    """Remove the start-up entries of every method but `keep` (never two entries at once)."""
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
    _compile(path)


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
    _compile(path)
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
    return {"pth": pth if os.path.exists(pth) else None, "sitecustomize": blocks}


# -- helpers -----------------------------------------------------------------------------

# The block is whole lines: a BEGIN line at column 0 (`BEGIN v<format> [created] [newline]`), the
# stand-in, an END line. Anything else that merely looks like a marker (indented, inside a string, without
# a format tag, a BEGIN without an END after it) is the user's own line and is kept as it is.

def _begin_flags(line: bytes):
    """The flags of a BEGIN line as enable writes it, else None."""
    text = line.rstrip(b"\r\n")
    head = BEGIN.encode()
    if not text.startswith(head + b" "):
        return None
    flags = text[len(head):].split()
    if not flags or not (flags[0][:1] == b"v" and flags[0][1:].isdigit()):
        return None
    if not all(flag.isalpha() and flag.islower() for flag in flags[1:]):
        return None
    return [flag.decode() for flag in flags]


def find_block(content: bytes):
    """(lines, first, last, flags) of the block enable wrote (first and last: the BEGIN and END
    lines' indices in `lines`, content.splitlines(keepends=True)), or None. A BEGIN line without an
    END line after it is the user's (a later BEGIN line opens the block instead), and so is a pair of
    them around lines that are not the stand-in."""
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
    """(content without the block, whether enable created the file). The user's lines come back
    exactly; the line end enable added after a last line that had none ("newline") is taken away
    again only where that line is still the last one - a line the user appended since stays a line
    of its own, never glued onto it."""
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
    return original + (b"\n" if "newline" in flags else b"") + block(flags).encode()


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
    out = []
    for entry in sys.path:
        if not entry:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            out.append(candidate)
    return out


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
    """Atomically: the whole new file or the old one, never half of it. A .py file is written only
    when it compiles (nothing written here may stop `python` from starting)."""
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
    """The modules that run at start (package __init__ and hooks) need their .pyc."""
    out = []
    for name in ("__init__.py", "_names.py", "hooks/__init__.py"):
        path = os.path.join(package_dir(), name)
        if not os.path.exists(importlib.util.cache_from_source(path)):
            _compile(path)
            out.append(f"compiled {path}")
    return out
