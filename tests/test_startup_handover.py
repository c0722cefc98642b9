"""Start-up hand-over, import-path guards and the verdict cache under many processes.

- the start-up stand-in hands over IN PLACE: it never removes itself from `sys.meta_path`
  while an import iterates it (the finder after it was skipped), never undoes uninstall(),
  never resets install(kernels=...);
- an exception of our own on the import path becomes one error line, the import proceeds;
- a remembered failure is not verified again; a bad variable is named, not "report mode";
- 8 processes on a cold cache verify an installed kernel once (under the environment lock),
  and concurrent verdict writers lose nothing;
- the fingerprint's distributions come from the pins data (one source of truth).

The stand-in tests run the start-up source (`activation.startup_source()`, what `enable`
writes) at the top of a fresh interpreter of the dev environment, with a finder behind it
that provides `fla` and `causal_conv1d` from memory - like an editable install's finder.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import A100, H100_OLD_TRITON, offline_env
from fastpath_hooks.hooks import activation
from fastpath_hooks.facts import pins as pins_mod
from fastpath_hooks import engine
from fastpath_hooks.facts.environment import Environment
from fastpath_hooks.facts.settings import Settings
from support import venvs
from support.processes import AUDIT_PRELUDE, link_uv, run_env

# -- the start-up stand-in ------------------------------------------------------------------

PROVIDER = r'''
import importlib.util, json, os, sys

class Provider:
    """Provides `fla` and `causal_conv1d` from memory (an editable install's finder does this)."""
    def find_spec(self, fullname, path=None, target=None):
        if fullname in ("fla", "causal_conv1d"):
            return importlib.util.spec_from_loader(fullname, self)
        return None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.FROM_PROVIDER = True

def kinds():
    names = [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path]   # the stand-in is a function
    return [n for n in names if n in ("_FastpathHooksStartup", "KernelImportFinder", "Provider")]

def provided(name):
    try:
        return getattr(__import__(name), "FROM_PROVIDER", False)
    except ImportError as exc:
        return type(exc).__name__ + ": " + str(exc)

sys.meta_path.insert(1, Provider())   # right behind the stand-in
out = {"start": kinds(), "length": len(sys.meta_path)}
'''

SCENARIOS = {
    # the stand-in hands over at the first watched import: the real finder takes its slot
    "hand-over": '''
out["fla"] = provided("fla")
from fastpath_hooks import hooks
out["installed"] = hooks.HOOKS.installed()
''',
    # install() before any watched import: the finder takes the stand-in's slot at once
    "installed-first": '''
import fastpath_hooks
fastpath_hooks.install(kernels=["causal-conv1d"])
out["after_install"] = kinds()
out["fla"] = provided("fla")
out["causal_conv1d"] = provided("causal_conv1d")
from fastpath_hooks import hooks
out["selected"] = sorted(k for k in ("fla", "causal-conv1d", "tilelang") if hooks.HOOKS.selected(k))
''',
    # FASTPATH_HOOKS_DISABLE set at run time, before the first watched import
    "disabled-at-run-time": '''
os.environ["FASTPATH_HOOKS_DISABLE"] = "1"
out["fla"] = provided("fla")
out["loaded"] = "fastpath_hooks.hooks" in sys.modules
''',
    # uninstall() is final: the stand-in must not install the hooks again
    "uninstalled": '''
import fastpath_hooks
fastpath_hooks.install()
fastpath_hooks.uninstall()
out["fla"] = provided("fla")
from fastpath_hooks import hooks
out["installed"] = hooks.HOOKS.installed()
''',
    # the package breaks under a running process (an upgrade): the import proceeds, one line says why
    "broken-importer": '''
sys.modules["fastpath_hooks.engine"] = None
out["fla"] = provided("fla")
out["causal_conv1d"] = provided("causal_conv1d")
''',
}


def _scenario(name: str, tmp_path, source: str | None = None, **env) -> tuple[dict, str]:
    script = tmp_path / f"{name}.py"
    script.write_text((source or activation.startup_source()) + PROVIDER + SCENARIOS[name] + "\nout['end'] = kinds()\n"
                      "out['end_length'] = len(sys.meta_path)\nprint(json.dumps(out))\n")
    environ = venvs.clean_env(FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"),
                              FASTPATH_HOOKS_SKIP="fla,causal-conv1d,tilelang", **env)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=environ,
                          cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_the_stand_in_hands_over_in_place(tmp_path):
    out, _ = _scenario("hand-over", tmp_path)
    assert out["start"] == ["_FastpathHooksStartup", "Provider"]
    assert out["fla"] is True and out["installed"] is True
    assert out["end"] == ["KernelImportFinder", "Provider"] and out["end_length"] == out["length"]


def test_a_stand_in_of_another_format_hands_over_safely(tmp_path):
    source = activation.startup_source()
    tag = f"format={activation.STARTUP_FORMAT})"
    assert source.count(tag) == 1
    # a newer fastpath-hooks wrote the entry (then the package was downgraded): one line, the hand-over goes on
    out, err = _scenario("hand-over", tmp_path, source=source.replace(tag, "format=99, future_option=1)"))
    assert out["fla"] is True and out["installed"] is True and out["end"] == ["KernelImportFinder", "Provider"]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "another format (99)" in lines[0] and "fastpath-hooks enable" in lines[0], err
    # an entry without the tag (a development build before 0.1.0 wrote one): the same line, the hand-over goes on
    out, err = _scenario("hand-over", tmp_path, source=source.replace(", " + tag, ")"))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert out["fla"] is True and out["installed"] is True and len(lines) == 1 and "another format (None)" in lines[0]


def test_the_startup_module_is_what_enable_writes_and_agrees_with_names(tmp_path):
    """hooks/startup.py is code: its source is what `enable` writes, its names are _names', and
    run at the top of an interpreter it leaves nothing but the stand-in behind."""
    import ast

    from fastpath_hooks import _names

    with open(activation.STARTUP_FILE, encoding="utf-8") as fh:
        shipped = fh.read()
    text = activation.startup_source()
    # what enable writes is the module, its watched names filled in from _names; the shipped file must
    # already hold them (a new kernel: update its watched line), so the package's own copy never drifts
    assert shipped == text
    assert sum(line.endswith(activation.WATCHED_MARK) for line in shipped.splitlines()) == 1
    tree = ast.parse(text)
    functions = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert _names.STAND_IN in functions
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert _names.DISABLE in strings
    tuples = [ast.literal_eval(n) for n in ast.walk(tree) if isinstance(n, ast.Tuple)]
    assert _names.TRUE_VALUES in tuples and tuple(sorted(_names.WATCHED)) in tuples
    formats = [k.value.value for n in ast.walk(tree) if isinstance(n, ast.Call)
               for k in n.keywords if k.arg == "format"]
    assert formats == [_names.STARTUP_FORMAT]
    assert activation.FORMAT == f"v{_names.STARTUP_FORMAT}"
    code = ("import json, sys\nns = {'__name__': 'sitecustomize'}\nexec(compile(sys.argv[1], 'startup.py', 'exec'), ns)\n"
            "print(json.dumps([sorted(k for k in ns if k != '__builtins__'), sys.meta_path[0].__name__, "
            "sorted(sys.meta_path[0].watched), 'fastpath_hooks' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code, text], capture_output=True, text=True, timeout=60,
                          env=venvs.clean_env())
    assert proc.returncode == 0, proc.stderr
    names, first, watched, imported = json.loads(proc.stdout)
    assert names == ["__name__"] and first == _names.STAND_IN and watched == sorted(_names.WATCHED)
    assert imported is False   # nothing of the package at start


def test_hooks_installed_before_the_first_watched_import_skip_no_finder(tmp_path):
    out, _ = _scenario("installed-first", tmp_path)
    assert out["fla"] is True and out["causal_conv1d"] is True             # the finder behind it was asked
    assert out["selected"] == ["causal-conv1d"]                            # install(kernels=...) stands
    assert out["after_install"] == ["KernelImportFinder", "Provider"]      # in the stand-in's slot
    assert out["end_length"] == out["length"]


def test_disable_set_at_run_time_skips_no_finder(tmp_path):
    out, _ = _scenario("disabled-at-run-time", tmp_path)
    assert out["fla"] is True
    assert "KernelImportFinder" not in out["end"]


def test_uninstall_is_not_undone_by_the_stand_in(tmp_path):
    out, _ = _scenario("uninstalled", tmp_path)
    assert out["fla"] is True and out["installed"] is False
    assert "KernelImportFinder" not in out["end"]


def test_an_internal_error_on_the_import_path_is_one_line_and_the_import_proceeds(tmp_path):
    out, err = _scenario("broken-importer", tmp_path)
    assert out["fla"] is True and out["causal_conv1d"] is True
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fastpath-hooks: internal error, leaving this import alone: "
                                                   "ModuleNotFoundError: import of fastpath_hooks.engine"), err


def test_the_stand_in_reads_disable_as_the_settings_do():
    """One list of true values: the start-up source, hooks and settings agree."""
    from fastpath_hooks import _names

    source = activation.startup_source()
    for value in ("1", "true", "YES", " on ", "0", "no", "maybe", "y", ""):
        assert _names.disabled({"FASTPATH_HOOKS_DISABLE": value}) == (value.strip().lower() in _names.TRUE_VALUES)
    assert repr(_names.TRUE_VALUES) in source


# -- one source of truth for what a kernel's verdict depends on ------------------------------

def _environment(**dists) -> Environment:
    return Environment(python="3.11.9", implementation="cpython", os="linux", arch="x86_64", glibc="2.39",
                       torch="2.10.0", torch_cuda="12.8", torch_hip=None, torch_xpu=False, cxx11_abi=True,
                       gpus=("sm_80",), gpu_source="target", triton="3.6.0", triton_dist="triton", nvcc="yes",
                       distributions=dict(dists))


def test_the_fingerprint_follows_the_pins_data(tmp_path):
    user = tmp_path / "pins.json"
    user.write_text(json.dumps({"kernels": {"fla": {"runtime_deps": ["einops", "packaging", "cloudpickle"]}}}))
    pins = pins_mod.load(str(user))
    settings = Settings()
    base = _environment(**{"fla-core": "0.6.0", "cloudpickle": "3.0.0"})
    other = _environment(**{"fla-core": "0.6.0", "cloudpickle": "3.1.0"})
    # a runtime dependency the pins name for fla is part of fla's verdict, not of the others'
    assert engine.fingerprint(base, settings, pins, "fla") != engine.fingerprint(other, settings, pins, "fla")
    assert engine.fingerprint(base, settings, pins, "causal-conv1d") == \
        engine.fingerprint(other, settings, pins, "causal-conv1d")
    # fla depends on tilelang where the Hopper hazard applies: its distributions are in fla's verdict
    shipped = pins_mod.load()
    with_ffi = _environment(**{"fla-core": "0.6.0", "apache-tvm-ffi": "0.1.12"})
    other_ffi = _environment(**{"fla-core": "0.6.0", "apache-tvm-ffi": "0.1.11"})
    assert engine.fingerprint(with_ffi, settings, shipped, "fla") != \
        engine.fingerprint(other_ffi, settings, shipped, "fla")
    assert engine.fingerprint(with_ffi, settings, shipped, "causal-conv1d") == \
        engine.fingerprint(other_ffi, settings, shipped, "causal-conv1d")


# -- concurrent verdict writers ------------------------------------------------------------------

WRITER = r'''
import sys
from fastpath_hooks.act.store import VerdictCache
cache = VerdictCache(root=sys.argv[1], retry_after=60.0)
for j in range(12):
    cache.record(f"k{sys.argv[2]}-{j}", verdict=("fp", "good", "verified"))
    cache.record(f"w{sys.argv[2]}-{j}", warm=("sig", {"reason": "r", "posed": None, "env": []}))
'''


@pytest.mark.slow
def test_concurrent_verdict_writers_lose_nothing(tmp_path):
    root = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, root, str(i)], env=venvs.clean_env())
             for i in range(6)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 6
    from fastpath_hooks.act.store import VerdictCache

    cache = VerdictCache(root=root, retry_after=60.0)
    assert set(cache.entries()) == {f"k{i}-{j}" for i in range(6) for j in range(12)}
    assert set(cache.warm_entries()) == {f"w{i}-{j}" for i in range(6) for j in range(12)}


# -- in a real venv: remembered failures, the invalid-variable line, one verification for 8 ranks --

@pytest.fixture(scope="module")
def venv(tmp_path_factory, torch_wheel, fastpath_wheel):
    venv = venvs.make_venv(str(tmp_path_factory.mktemp("review") / "venv"), torch_wheel=torch_wheel,
                           fastpath_wheel=fastpath_wheel, transformers=None)
    link_uv(venv)
    return venv


TILELANG_SCRIPT = AUDIT_PRELUDE + r'''
import json, sys
import fastpath_hooks
fastpath_hooks.install()
try:
    import ''' + "{module}" + r'''
    result = "imported"
except ImportError as exc:
    result = type(exc).__name__ + ": " + str(exc)
from fastpath_hooks import engine
print(json.dumps({"result": result, "spawns": len(SPAWNS),
                  "states": {k: o.state for k, o in engine.outcomes().items()}}))
'''


def _run(venv, module: str, env: dict) -> tuple[dict, str]:
    proc = venv.run(TILELANG_SCRIPT.replace("{module}", module), env=env, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _install(venv, *paths) -> None:
    venv.uv_install(*paths, no_deps=True, extra=("--reinstall",))


@pytest.mark.slow
def test_a_remembered_failure_is_not_verified_again(venv, make_wheelhouse, test_pins, tmp_path):
    """tilelang installed with a known-good apache-tvm-ffi, but its import aborts; the repair (the same
    pair) aborts too. The next start remembers that: no verification child, still blocked."""
    wheelhouse = make_wheelhouse(tilelang="0.1.15", tilelang_abort=True, tvm_ffi=("0.1.12",), deps=False)
    _install(venv, *glob.glob(os.path.join(wheelhouse, "*.whl")))
    env = offline_env(wheelhouse, H100_OLD_TRITON, cache_dir=str(tmp_path / "cache"), pins=test_pins(wheelhouse),
                      FASTPATH_HOOKS_INSTALLER="uv")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    first, err = _run(venv, "tilelang", env)
    assert first["states"]["tilelang"] == "blocked" and first["spawns"] >= 2, (first, err)
    assert "SIGABRT" in err
    again, err = _run(venv, "tilelang", env)
    assert again["states"]["tilelang"] == "blocked" and again["result"].startswith("ImportError: fastpath-hooks")
    assert again["spawns"] == 0, (again, err)


@pytest.mark.slow
def test_an_invalid_variable_is_named_on_the_nested_path(venv, make_wheelhouse, test_pins, tmp_path):
    """fla needs tilelang here; tilelang is installed and good. With an invalid variable (report mode),
    the one line names that variable as the reason, not FASTPATH_HOOKS_MODE=report; nothing "would install"."""
    wheelhouse = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi=("0.1.12",))
    _install(venv, *glob.glob(os.path.join(wheelhouse, "tilelang-*.whl")),
             *glob.glob(os.path.join(wheelhouse, "apache_tvm_ffi-*.whl")))
    env = offline_env(wheelhouse, H100_OLD_TRITON, cache_dir=str(tmp_path / "cache"), pins=test_pins(wheelhouse),
                      FASTPATH_HOOKS_RETRY_AFTER="soon")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out, err = _run(venv, "fla", env)
    assert out["states"] == {"tilelang": "ok", "fla": "reported"}, (out, err)
    assert "FASTPATH_HOOKS_RETRY_AFTER='soon' is not valid" in err
    lines = [line for line in err.splitlines() if line.startswith("fastpath-hooks: ")]
    assert len(lines) == 1 and "so nothing is installed" in lines[0] and "would install" not in err, err
    assert "FASTPATH_HOOKS_MODE=report" not in err


EIGHT = AUDIT_PRELUDE + r'''
import importlib.util, json, os, sys, time
import fastpath_hooks
fastpath_hooks.install()
open(sys.argv[1] + ".ready", "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.002)
spec = importlib.util.find_spec("causal_conv1d")   # decided by the hook; the module itself is not run
from fastpath_hooks import engine
print(json.dumps({"state": engine.outcomes()["causal-conv1d"].state, "spawns": len(SPAWNS)}))
'''


def _eight(venv, env, tmp_path, phase: str) -> list:
    """8 processes that decide at the same moment; [(report, stderr)]."""
    go = str(tmp_path / f"{phase}-go")
    procs = [subprocess.Popen([venv.python, "-c", EIGHT, str(tmp_path / f"{phase}-{i}"), go], env=env,
                              cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(8)]
    deadline = time.monotonic() + 120
    while len(glob.glob(str(tmp_path / f"{phase}-*.ready"))) < 8:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate() for p in procs if p.poll() is not None]
        time.sleep(0.01)
    open(go, "w").close()
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    for out, err, code in results:
        assert code == 0 and "Traceback" not in err, (out, err)
    return [(json.loads(out.strip().splitlines()[-1]), err) for out, err, _ in results]


def _depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        deepest = max(deepest, depth)
    return deepest


@pytest.mark.slow
def test_eight_processes_install_once_then_verify_once(venv, make_wheelhouse, test_pins, tmp_path):
    subprocess.run([venvs.uv(), "pip", "uninstall", "-q", "--python", venv.python, "causal-conv1d"],
                   check=True, env=venvs.clean_env(), capture_output=True)
    wheelhouse = make_wheelhouse(causal=True, deps=False)
    cache = tmp_path / "cache"
    env = run_env(**offline_env(wheelhouse, A100, cache_dir=str(cache), pins=test_pins(wheelhouse),
                                FASTPATH_HOOKS_INSTALLER="uv", FASTPATH_HOOKS_LOCK_TIMEOUT="300"))
    # A cold start: one installs; one process of the eight speaks (no rank variables, one parent):
    # the installer, or a waiter that says what happened, in one level of parentheses.
    first = _eight(venv, env, tmp_path, "install")
    assert sorted(r["state"] for r, _ in first) == ["installed"] + ["ok"] * 7, first
    assert [r["spawns"] > 0 for r, _ in first].count(True) == 1, first
    speakers = [err for _, err in first if "fastpath-hooks:" in err]
    assert len(speakers) == 1, first
    waited = [line for line in speakers[0].splitlines() if "done by another process" in line]
    assert waited or "causal-conv1d: installed" in speakers[0], speakers
    assert all(line.startswith("fastpath-hooks: causal-conv1d: ready") and _depth(line) <= 1 for line in waited), waited

    # Installed, the verdicts forgotten: the installed kernel is verified again - by one process.
    shutil.rmtree(cache)
    second = _eight(venv, env, tmp_path, "verify")
    assert [r["state"] for r, _ in second] == ["ok"] * 8, second
    assert sum(r["spawns"] for r, _ in second) == 1, second     # one verification child in all
    said = [line for _, err in second for line in err.splitlines() if not line.startswith("fastpath-hooks: posing ")]
    # nothing else worth saying: a process that said it waits says how that ended, after it
    waits = [line for line in said if line.startswith("fastpath-hooks: causal-conv1d: waiting for another process that "
                                                      "is installing or checking kernels")]
    ready = [line for line in said if line == "fastpath-hooks: causal-conv1d: ready - done by another process while "
                                              "this one waited"]
    assert len(waits) + len(ready) == len(said) and len(ready) <= len(waits), said
