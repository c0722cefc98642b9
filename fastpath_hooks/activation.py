"""`fastpath-hooks enable / disable`: a start-up entry in the current environment.

Two methods, both checking FASTPATH_HOOKS_DISABLE before importing anything
(coverage.py's pattern) and both unable to break interpreter start:

- `pth` (default): one line in `<site-packages>/fastpath-hooks-startup.pth`;
- `sitecustomize`: a marked block in the environment's `sitecustomize.py`
  (created if absent; existing content kept byte for byte and restored by
  `disable`), compiled to `.pyc` so PYTHONDONTWRITEBYTECODE images do not pay a
  compile at every start.

Never writes a module named `sitecustomize` that would shadow - or be shadowed
by - another one (Debian ships its own): that is refused with the reason.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import sys

from .distributions import site_packages

PTH_NAME = "fastpath-hooks-startup.pth"
BEGIN = "# >>> fastpath-hooks >>>"
END = "# <<< fastpath-hooks <<<"
_TRUE = '("1", "true", "yes", "on")'


class ActivationError(RuntimeError):
    pass


def package_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def pth_line() -> str:
    # An uninstalled package must not turn into an error at every start: check the directory first.
    return (f'import os; os.environ.get("FASTPATH_HOOKS_DISABLE", "").strip().lower() in {_TRUE} '
            f'or not os.path.isdir({os.path.dirname(package_dir())!r} + "/fastpath_hooks") '
            f'or __import__("fastpath_hooks.hooks").hooks.activate()\n')


def block(flags: str) -> str:
    return (
        f"{BEGIN} {flags}\n"
        "# Written by `fastpath-hooks enable`; `fastpath-hooks disable` removes it. FASTPATH_HOOKS_DISABLE=1 skips it.\n"
        "try:\n"
        "    import os as _fph_os\n"
        f"    if _fph_os.environ.get('FASTPATH_HOOKS_DISABLE', '').strip().lower() not in {_TRUE}:\n"
        "        import fastpath_hooks.hooks as _fph_hooks\n"
        "        _fph_hooks.activate()\n"
        "        del _fph_hooks\n"
        "    del _fph_os\n"
        "except Exception:\n"
        "    pass\n"
        f"{END}\n"
    )


def enable(method: str = "pth") -> list[str]:
    if method not in ("pth", "sitecustomize"):
        raise ActivationError(f"unknown method {method!r}; use pth or sitecustomize")
    done = _compile_package()
    if method == "pth":
        path = os.path.join(site_packages(), PTH_NAME)
        _write(path, pth_line())
        return done + [f"wrote {path}"]
    path, created = _sitecustomize_target()
    original = b""
    if not created:
        with open(path, "rb") as fh:
            original, created = _strip_block(fh.read(), with_flags=True)  # enable twice: one block, same flags
    flags = "v1"
    if created:
        flags += " created"
    elif original and not original.endswith(b"\n"):
        flags += " newline"
    content = original + (b"\n" if "newline" in flags else b"") + block(flags).encode()
    _write(path, content)
    _compile(path)
    return done + [f"wrote the block in {path} (compiled)"]


def disable() -> list[str]:
    done = []
    pth = os.path.join(site_packages(), PTH_NAME)
    if os.path.exists(pth):
        os.unlink(pth)
        done.append(f"removed {pth}")
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
                f"{os.path.dirname(package)} is a sitecustomize package (sitecustomize-entrypoints?): it runs the "
                "'sitecustomize' entry points, where fastpath-hooks is already registered; or use --method pth")
        if os.path.isfile(module):
            if not os.path.realpath(module).startswith(prefix + os.sep):
                raise ActivationError(
                    f"{module} belongs to the system Python and runs instead of one in this environment; "
                    "use --method pth (the default)")
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
    for name in ("__init__.py", "hooks.py"):
        path = os.path.join(package_dir(), name)
        if not os.path.exists(importlib.util.cache_from_source(path)):
            _compile(path)
            out.append(f"compiled {path}")
    return out
