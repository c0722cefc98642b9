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
  restored by `disable`).

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


def startup_source() -> str:
    """hooks/startup.py as `enable` writes it, its watched names taken from the registry: _names.WATCHED
    (a test keeps the shipped file's line equal to them, and checks the rest of its names against
    _names), and the modules of the kernels a FASTPATH_HOOKS_PINS file set now adds (run `enable` again
    after adding one: until then the finder watches it from the first watched import, or install(), on)."""
    from .._registry import registry, watched_modules

    watched = watched_modules(registry())
    with open(STARTUP_FILE, encoding="utf-8") as fh:
        lines = fh.read().splitlines(keepends=True)
    out = []
    for line in lines:
        if line.rstrip("\n").endswith(WATCHED_MARK):
            indent = line[:len(line) - len(line.lstrip())]
            line = f"{indent}{tuple(sorted(watched))!r})))" + WATCHED_MARK + "\n"
        out.append(line)
    return "".join(out)


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
    original = b""
    if not created:
        with open(path, "rb") as fh:
            original, created = _strip_block(fh.read(), with_flags=True)  # enable twice: one block, same flags
    flags = FORMAT
    if created:
        flags += " created"
    elif original and not original.endswith(b"\n"):
        flags += " newline"
    content = original + (b"\n" if "newline" in flags else b"") + block(flags).encode()
    _write(path, content)
    _compile(path)
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
        with open(path, "rb") as fh:
            content = fh.read()
        if BEGIN.encode() not in content:
            continue
        restored, created = _strip_block(content, with_flags=True)
        if created and not restored:
            os.unlink(path)
            _remove_pyc(path)
            done.append(f"removed {path} (it was created by enable)")
        else:
            with open(path, "wb") as fh:
                fh.write(restored)
            _compile(path)
            done.append(f"restored {path}")
    return done


def status() -> dict:
    pth = os.path.join(site_packages(), PTH_NAME)
    blocks = []
    for path in _sitecustomize_files():
        try:
            with open(path, "rb") as fh:
                if BEGIN.encode() in fh.read():
                    blocks.append(path)
        except OSError:
            continue
    return {"pth": pth if os.path.exists(pth) else None, "sitecustomize": blocks}


# -- helpers -----------------------------------------------------------------------------

def _strip_block(content: bytes, with_flags: bool = False):
    """Remove our block (and the newline enable added before it)."""
    begin = content.find(BEGIN.encode())
    created = False
    if begin < 0:
        return (content, False) if with_flags else content
    end = content.find(END.encode(), begin)
    end = len(content) if end < 0 else end + len(END)
    if content[end:end + 1] == b"\n":
        end += 1
    line_end = content.find(b"\n", begin)
    flags = content[begin:line_end].decode(errors="replace").split()
    created = "created" in flags
    start = begin - 1 if "newline" in flags and begin > 0 and content[begin - 1:begin] == b"\n" else begin
    out = content[:start] + content[end:]
    return (out, created) if with_flags else out


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
            return module, False
    return os.path.join(site_packages(), "sitecustomize.py"), True


def _write(path: str, data) -> None:
    data = data.encode() if isinstance(data, str) else data
    tmp = path + ".fastpath-hooks.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
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
    for name in ("__init__.py", "_names.py", "hooks/__init__.py", "hooks/importer.py"):
        path = os.path.join(package_dir(), name)
        if not os.path.exists(importlib.util.cache_from_source(path)):
            _compile(path)
            out.append(f"compiled {path}")
    return out
