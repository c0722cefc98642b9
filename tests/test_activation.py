"""`fastpath-hooks enable / disable` and the `sitecustomize` entry point, in real venvs.

The venvs hold fastpath-hooks installed from its wheel (what users get) and nothing heavy:
activation must not need torch or transformers. Every check starts a plain interpreter
(`python -c ...`) and looks at what it has loaded.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import zipfile

import pytest

from support import venvs

pytestmark = pytest.mark.slow

BEGIN = b"# >>> fastpath-hooks >>>"
STUB, FINDER = "_FastpathHooksStartup", "KernelImportFinder"
# A plain interpreter start, then (argv[1] == "watch") a watched import: what is on sys.meta_path and
# which of our modules are loaded, at start and after. The stand-in hands over at the first watched import.
PROBE = r"""
import json, sys
def seen():
    names = [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path]   # the stand-in is a function
    return {"finders": [n for n in names if n in ("%s", "%s")],
            "modules": sorted(m for m in sys.modules if "fastpath_hooks" in m.split(".")[0]),
            "user": getattr(sys.modules.get("sitecustomize"), "USER_CODE_RAN", False)}
out = {"start": seen()}
if sys.argv[1:] == ["watch"]:
    try:
        import fla
    except ImportError as exc:
        out["import_fla"] = type(exc).__name__
    out["after"] = seen()
print(json.dumps(out))
""" % (STUB, FINDER)


@pytest.fixture(scope="module")
def venv(tmp_path_factory, fastpath_wheel):
    return venvs.make_venv(str(tmp_path_factory.mktemp("activation") / "venv"), torch_wheel=None,
                           fastpath_wheel=fastpath_wheel, transformers=None)


@pytest.fixture
def clean(venv):
    """Each test starts and ends with no start-up entry and no sitecustomize.py in the venv."""
    _cli(venv, "disable")
    _remove_sitecustomize(venv)
    yield venv
    _cli(venv, "disable")
    _remove_sitecustomize(venv)


def _cli(venv, *args, env=None):
    proc = venv.cli(*args, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _remove_sitecustomize(venv):
    for path in [os.path.join(venv.site, "sitecustomize.py")] + glob.glob(
            os.path.join(venv.site, "__pycache__", "sitecustomize.*.pyc")):
        if os.path.exists(path):
            os.unlink(path)


def _start(venv, *args, **env) -> dict:
    """A plain interpreter start (quiet: FASTPATH_HOOKS_LOG=off), then optionally a watched import."""
    proc = subprocess.run([venv.python, "-c", PROBE, *args], env=venvs.clean_env(FASTPATH_HOOKS_LOG="off", **env),
                          capture_output=True, text=True, cwd=venv.path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return json.loads(proc.stdout)


def _active(started: dict) -> bool:
    """The stand-in at start with nothing of the package loaded; the real finder after a watched import."""
    return (started["start"]["finders"] == [STUB] and
            not [m for m in started["start"]["modules"] if m.startswith("fastpath_hooks")] and
            started["after"]["finders"] == [FINDER] and "fastpath_hooks.hooks" in started["after"]["modules"] and
            started["import_fla"] == "ModuleNotFoundError")


def _inactive(started: dict) -> bool:
    return started["start"]["finders"] == [] and started.get("after", {"finders": []})["finders"] == [] and not [
        m for m in started["start"]["modules"] + started.get("after", {"modules": []})["modules"]
        if m.startswith("fastpath_hooks")]


def _pth(venv) -> str:
    return os.path.join(venv.site, "fastpath-hooks-startup.pth")


def _sitecustomize(venv) -> str:
    return os.path.join(venv.site, "sitecustomize.py")


def test_enable_pth_activates_at_start_once_and_disable_removes_it(clean):
    venv = clean
    assert _inactive(_start(venv, "watch"))
    _cli(venv, "enable", "--method", "pth")
    _cli(venv, "enable", "--method", "pth")
    with open(_pth(venv)) as fh:
        assert fh.read() == "import _fastpath_hooks_startup\n"
    assert glob.glob(os.path.join(venv.site, "__pycache__", "_fastpath_hooks_startup.*.pyc"))
    started = _start(venv, "watch")
    assert _active(started), started
    assert started["start"]["modules"] == ["_fastpath_hooks_startup"]
    # what loads at the first watched import is compiled too (PYTHONDONTWRITEBYTECODE images would
    # otherwise compile it in every process)
    package = os.path.join(venv.site, "fastpath_hooks")

    def compiled(folder):
        return {os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(folder, "__pycache__", "*.pyc"))}

    assert compiled(package) >= {"__init__", "_names"}
    assert compiled(os.path.join(package, "hooks")) >= {"__init__"}
    _cli(venv, "disable")
    assert not os.path.exists(_pth(venv)) and not os.path.exists(os.path.join(venv.site, "_fastpath_hooks_startup.py"))
    assert not glob.glob(os.path.join(venv.site, "__pycache__", "_fastpath_hooks_startup.*.pyc"))
    assert _inactive(_start(venv, "watch"))


def test_enable_sitecustomize_creates_one_block_and_disable_removes_the_file(clean):
    venv = clean
    _cli(venv, "enable", "--method", "sitecustomize")
    _cli(venv, "enable", "--method", "sitecustomize")
    with open(_sitecustomize(venv), "rb") as fh:
        assert fh.read().count(BEGIN) == 1
    assert glob.glob(os.path.join(venv.site, "__pycache__", "sitecustomize.*.pyc"))
    started = _start(venv, "watch")
    assert _active(started), started
    assert started["start"]["modules"] == []
    assert "sitecustomize" in _cli(venv, "doctor", "--json").stdout
    _cli(venv, "disable")
    assert not os.path.exists(_sitecustomize(venv))
    assert not glob.glob(os.path.join(venv.site, "__pycache__", "sitecustomize.*.pyc"))
    assert _inactive(_start(venv, "watch"))


@pytest.mark.parametrize("user_code", [
    b"import os\nUSER_CODE_RAN = True",                         # no trailing newline
    b"# the user's own start-up code\r\nimport os\nUSER_CODE_RAN = True\n\n",   # one, and odd line ends
], ids=["no-trailing-newline", "trailing-newline"])
def test_disable_restores_an_existing_sitecustomize_byte_for_byte(clean, user_code):
    venv = clean
    with open(_sitecustomize(venv), "wb") as fh:
        fh.write(user_code)
    _cli(venv, "enable", "--method", "sitecustomize")
    _cli(venv, "enable", "--method", "sitecustomize")
    with open(_sitecustomize(venv), "rb") as fh:
        content = fh.read()
    assert content.startswith(user_code) and content.count(BEGIN) == 1
    started = _start(venv, "watch")
    assert _active(started) and started["start"]["user"] is True   # both ran
    _cli(venv, "disable")
    with open(_sitecustomize(venv), "rb") as fh:
        assert fh.read() == user_code
    started = _start(venv, "watch")
    assert _inactive(started) and started["start"]["user"] is True


@pytest.mark.parametrize("method", ["pth", "sitecustomize"])
def test_disable_variable_means_no_fastpath_hooks_module_at_all(clean, method):
    venv = clean
    _cli(venv, "enable", "--method", method)
    for value in ("1", "true", "YES", " on "):
        started = _start(venv, "watch", FASTPATH_HOOKS_DISABLE=value)
        assert _inactive(started), started
        assert started["after"]["modules"] == ([] if method == "sitecustomize" else ["_fastpath_hooks_startup"])
    assert _active(_start(venv, "watch", FASTPATH_HOOKS_DISABLE="0"))


def test_enable_defaults_to_the_cheaper_sitecustomize_and_switching_methods_leaves_one_entry(clean):
    venv = clean
    out = _cli(venv, "enable")
    assert os.path.exists(_sitecustomize(venv)) and not os.path.exists(_pth(venv)), out
    _cli(venv, "enable", "--method", "pth")
    assert os.path.exists(_pth(venv)) and not os.path.exists(_sitecustomize(venv))
    _cli(venv, "enable", "--method", "sitecustomize")
    assert os.path.exists(_sitecustomize(venv)) and not os.path.exists(_pth(venv))
    assert _active(_start(venv, "watch"))
    _cli(venv, "disable")
    assert not os.path.exists(_sitecustomize(venv)) and not os.path.exists(_pth(venv))


def test_sitecustomize_package_is_refused_with_the_reason(clean):
    venv = clean
    package = os.path.join(venv.site, "sitecustomize")
    os.makedirs(package)
    try:
        with open(os.path.join(package, "__init__.py"), "w") as fh:
            fh.write("")
        proc = venv.cli("enable", "--method", "sitecustomize")
        assert proc.returncode == 2
        assert "sitecustomize package" in proc.stderr and "--method pth" in proc.stderr
        assert not os.path.exists(_sitecustomize(venv))
    finally:
        shutil.rmtree(package)   # (with the bytecode the interpreter may have written for it)


def test_the_sitecustomize_entry_point_is_declared_and_activates(venv, fastpath_wheel):
    with zipfile.ZipFile(fastpath_wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = zf.read(name).decode()
    section = text.split("[sitecustomize]", 1)[1].split("[", 1)[0]
    assert "fastpath_hooks = fastpath_hooks.hooks:activate" in section
    # what sitecustomize-entrypoints does with it: load the group and call each
    proc = venv.run("import sys, importlib.metadata as m\n"
                    "for ep in m.entry_points(group='sitecustomize'): ep.load()()\n"
                    "print([type(f).__name__ for f in sys.meta_path if type(f).__name__ == 'KernelImportFinder'])",
                    check=True)
    assert proc.stdout.strip() == "['KernelImportFinder']"


@pytest.mark.parametrize("method", ["pth", "sitecustomize"])
def test_a_removed_or_broken_package_never_breaks_interpreter_start(tmp_path, fastpath_wheel, method):
    venv = venvs.make_venv(str(tmp_path / "venv"), torch_wheel=None, fastpath_wheel=fastpath_wheel, transformers=None)
    _cli(venv, "enable", "--method", method)
    hooks_py = os.path.join(venv.site, "fastpath_hooks", "hooks", "__init__.py")
    # broken: the module the stand-in hands over to raises on import. A new file, never an edit
    # in place: uv hard-links installed files to its cache, an in-place edit would reach every venv.
    with open(hooks_py) as fh:
        broken = fh.read() + "\nraise RuntimeError('broken on purpose')\n"
    with open(hooks_py + ".new", "w") as fh:
        fh.write(broken)
    os.replace(hooks_py + ".new", hooks_py)
    for cache in glob.glob(os.path.join(venv.site, "fastpath_hooks", "hooks", "__pycache__", "__init__.*.pyc")):
        os.unlink(cache)
    started = _start(venv, "watch")
    assert started["start"]["finders"] == [STUB] and FINDER not in started["after"]["finders"]
    assert started["import_fla"] == "ModuleNotFoundError"      # the import itself as without fastpath-hooks
    # removed: both start-up entries stay behind, the package is gone
    subprocess.run([venvs.uv(), "pip", "uninstall", "-q", "--python", venv.python, "fastpath-hooks"], check=True,
                   env=venvs.clean_env(), capture_output=True)
    assert os.path.exists(_pth(venv) if method == "pth" else _sitecustomize(venv)) and not os.path.exists(hooks_py)
    proc = venv.run("import json\ntry:\n    import fla\nexcept ImportError as e:\n    print(type(e).__name__)",
                    env=venvs.clean_env())
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "ModuleNotFoundError\n", "")
