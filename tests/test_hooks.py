"""install() / uninstall(), the gate wrappers and the import finder, in this very process.

Real transformers (the dev environment's) on this real CPU machine, no target override:
the wrapped gates ask the real runtime, which finds no accelerator and installs nothing.
This module imports two gates BY NAME before any install() - the way user code and
transformers' own modules hold them - so the rebinding is checked on a real importer.
Every test leaves the process as it found it (the `hooks` fixture uninstalls).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import subprocess
import sys
import threading
import types

import pytest

import fastpath_hooks
from fastpath_hooks.hooks import gates
from fastpath_hooks import hooks
from support import venvs
from transformers.utils import is_causal_conv1d_available
from transformers.utils.import_utils import is_flash_linear_attention_available

import transformers
import transformers.utils.import_utils as import_utils

ORIGINALS = {"is_flash_linear_attention_available": is_flash_linear_attention_available,
             "is_causal_conv1d_available": is_causal_conv1d_available}
THIS = sys.modules[__name__]
PY = f"cp{sys.version_info[0]}{sys.version_info[1]}"


@pytest.fixture
def hooks_env(monkeypatch, tmp_path):
    """This machine as it is (no FASTPATH_HOOKS_* from outside), a private cache; uninstall() after."""
    for name in list(os.environ):
        if name.startswith(("FASTPATH_HOOKS_", "_FASTPATH_HOOKS_")) or name in ("LOCAL_RANK", "RANK"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FASTPATH_HOOKS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("_FASTPATH_HOOKS_VOICE", "")   # install() may mark this process: undone after the test
    fastpath_hooks.uninstall()
    yield
    fastpath_hooks.uninstall()


def holders(obj) -> set:
    """(module name, global name) for every module global that IS obj."""
    out = set()
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            out.update((name, key) for key, value in list(namespace.items()) if value is obj)
    return out


def finders() -> list:
    return [f for f in sys.meta_path if isinstance(f, hooks.KernelImportFinder)]


def test_a_gate_imported_by_name_before_install_sees_the_wrapper_and_uninstall_restores_it(hooks_env):
    where = {name: holders(gate) for name, gate in ORIGINALS.items()}
    assert (__name__, "is_flash_linear_attention_available") in where["is_flash_linear_attention_available"]
    assert ("transformers.utils", "is_causal_conv1d_available") in where["is_causal_conv1d_available"]
    lazy_before = dict(transformers.__dict__)

    fastpath_hooks.install()
    for name, original in ORIGINALS.items():
        wrapper = import_utils.__dict__[name]
        assert wrapper is not original and wrapper.__wrapped__ is original
        assert holders(wrapper) == where[name]          # every holder rebound, nothing else
        assert holders(original) == set()
    assert THIS.is_flash_linear_attention_available is import_utils.is_flash_linear_attention_available
    assert transformers.__dict__ == lazy_before       # no lazy-module attribute was loaded by the rebinding

    fastpath_hooks.uninstall()
    for name, original in ORIGINALS.items():
        assert holders(original) == where[name]
        assert import_utils.__dict__[name] is original
    assert finders() == []
    fastpath_hooks.install()     # uninstall() forgot what it had wrapped: wrapped again
    assert all(import_utils.__dict__[name]._fastpath_hooks_original is original for name, original in ORIGINALS.items())
    fastpath_hooks.uninstall()


def test_wrapped_gates_answer_false_here_and_stay_transparent(hooks_env):
    fastpath_hooks.install()
    fla_gate, conv_gate = import_utils.is_flash_linear_attention_available, import_utils.is_causal_conv1d_available
    assert fla_gate() is False and conv_gate() is False      # a CPU machine: the real gates' answer
    assert fla_gate.__name__ == "is_flash_linear_attention_available"
    assert fla_gate.__wrapped__ is ORIGINALS["is_flash_linear_attention_available"]
    # cache_clear is the original's own: after it, the original's cache is empty
    assert fla_gate() is False
    assert ORIGINALS["is_flash_linear_attention_available"].cache_info().currsize == 1
    fla_gate.cache_clear()
    assert ORIGINALS["is_flash_linear_attention_available"].cache_info().currsize == 0
    assert fla_gate() is False
    # arguments reach the original: the TypeError is the original's own, naming it (5.24 takes none)
    with pytest.raises(TypeError, match=r"is_flash_linear_attention_available\(\) takes 0 positional"):
        fla_gate("0.2.2")


MAIN_STYLE_GATES = '''
from functools import lru_cache
SEEN = []

@lru_cache
def is_flash_linear_attention_available(min_version: str = "0.2.2"):
    SEEN.append(min_version)
    return min_version == "0.2.2"

@lru_cache
def is_causal_conv1d_available():
    return False
'''


def test_wrappers_pass_arguments_through_as_transformers_main_calls_them(hooks_env):
    """transformers main calls the fla gate with a minimum version; a stand-in module with that signature."""
    module = types.ModuleType("fastpath_hooks_test_main_gates")
    exec(MAIN_STYLE_GATES, module.__dict__)
    sys.modules[module.__name__] = module
    try:
        original = module.is_flash_linear_attention_available
        with hooks.HOOKS.lock:
            gates.patch(module, hooks.HOOKS)
        wrapper = module.is_flash_linear_attention_available
        assert wrapper is not original
        assert wrapper("0.5.0") is False and wrapper(min_version="0.2.2") is True and wrapper() is True
        assert module.SEEN == ["0.5.0", "0.2.2", "0.2.2"]      # positional, keyword, default: all reached it
        with hooks.HOOKS.lock:
            gates.unpatch()
        assert module.is_flash_linear_attention_available is original
    finally:
        del sys.modules[module.__name__]


def test_install_is_idempotent(hooks_env):
    for _ in range(10):
        assert fastpath_hooks.install() is True
    assert len(finders()) == 1 and sys.meta_path[0] is finders()[0]
    wrapper = import_utils.is_flash_linear_attention_available
    assert wrapper.__wrapped__ is ORIGINALS["is_flash_linear_attention_available"]   # wrapped once, not twice
    fastpath_hooks.uninstall()
    fastpath_hooks.uninstall()
    assert finders() == [] and import_utils.is_flash_linear_attention_available is wrapper.__wrapped__


@pytest.mark.slow
def test_concurrent_install_and_uninstall_end_consistent(hooks_env):
    errors, barrier = [], threading.Barrier(12)

    def storm(seed):
        rng = random.Random(seed)
        try:
            barrier.wait()
            for _ in range(16):
                (fastpath_hooks.install if rng.random() < 0.5 else fastpath_hooks.uninstall)()
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=storm, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # whatever state the storm left, it is a consistent one ...
    wrapped = [hasattr(import_utils.__dict__[n], "_fastpath_hooks_original") for n in ORIGINALS]
    assert wrapped in ([True, True], [False, False])
    assert len(finders()) == (1 if wrapped[0] else 0) and hooks.HOOKS.installed() == wrapped[0]
    # ... from which install() and uninstall() behave exactly as from scratch
    fastpath_hooks.install()
    assert len(finders()) == 1
    for name, original in ORIGINALS.items():
        wrapper = import_utils.__dict__[name]
        assert wrapper.__wrapped__ is original and holders(original) == set()
    fastpath_hooks.uninstall()
    assert finders() == []
    for name, original in ORIGINALS.items():
        assert import_utils.__dict__[name] is original
        assert holders_of_any_wrapper(name) == []


def holders_of_any_wrapper(name) -> list:
    """Module globals still holding some wrapper of the gate `name` (none may survive uninstall)."""
    out = []
    for mod_name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            out += [(mod_name, k) for k, v in list(namespace.items())
                    if type(v) is types.FunctionType and v.__dict__.get("_fastpath_hooks_original") is ORIGINALS[name]]
    return out


def test_on_event_queue_put_gets_json_dicts(hooks_env):
    events = queue.Queue()
    fastpath_hooks.install(on_event=events.put)
    assert import_utils.is_causal_conv1d_available() is False
    got = []
    while not events.empty():
        got.append(events.get())
    assert got, "the first gate query reports its decision"
    for event in got:
        assert set(event) >= {"type", "kernel", "message", "ts"} and event["type"] in ("status", "warning", "error")
        assert json.loads(json.dumps(event)) == event
    assert any("no CUDA/XPU accelerator" in e["message"] for e in got)


def test_only_local_rank_zero_prints_every_rank_gets_events(hooks_env, monkeypatch, capsys):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "0")                   # LOCAL_RANK wins over RANK
    events = []
    fastpath_hooks.install(on_event=events.append)
    assert import_utils.is_flash_linear_attention_available() is False
    assert events and "fastpath-hooks:" not in capsys.readouterr().err

    fastpath_hooks.uninstall()
    monkeypatch.setenv("LOCAL_RANK", "0")
    fastpath_hooks.install()
    assert import_utils.is_flash_linear_attention_available() is False
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fastpath-hooks:")]
    assert len(lines) == 1 and "no CUDA/XPU accelerator" in lines[0]


def test_disable_makes_install_a_logged_no_op(hooks_env, monkeypatch, caplog):
    monkeypatch.setenv("FASTPATH_HOOKS_DISABLE", "1")
    with caplog.at_level(logging.INFO, logger="fastpath_hooks"):
        assert fastpath_hooks.install() is False
    assert finders() == []
    assert all(import_utils.__dict__[name] is original for name, original in ORIGINALS.items())
    assert any("FASTPATH_HOOKS_DISABLE" in r.getMessage() for r in caplog.records)


FRESH_PROCESS = r'''
import inspect, json, sys, importlib.machinery
import fastpath_hooks
fastpath_hooks.install()
out = {"heavy_after_install": sorted(m for m in ("transformers", "torch", "packaging", "importlib.metadata", "subprocess",
                                                 "logging", "threading") if m in sys.modules)}
from transformers.utils import import_utils
spec = import_utils.__spec__
out["wrapped"] = hasattr(import_utils.is_flash_linear_attention_available, "_fastpath_hooks_original")
out["loader"] = [type(spec.loader).__name__, type(import_utils.__loader__).__name__]
out["source"] = "def is_flash_linear_attention_available" in inspect.getsource(import_utils)
# a module reloaded keeps working (the finder's wrapper is gone from its spec)
out["finder_first"] = type(sys.meta_path[0]).__name__
fastpath_hooks.uninstall()
out["after_uninstall"] = [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "KernelImportFinder"]
print(json.dumps(out))
'''


@pytest.mark.slow
def test_gates_module_imported_after_install_is_wrapped_and_its_loader_is_transparent():
    proc = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, env=venvs.clean_env(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["heavy_after_install"] == []           # install() imports nothing heavy, never transformers
    assert out["wrapped"] and out["source"]
    assert out["loader"] == ["SourceFileLoader", "SourceFileLoader"]
    assert out["finder_first"] == "KernelImportFinder" and out["after_uninstall"] == []


def test_the_finder_ignores_every_other_module(hooks_env):
    fastpath_hooks.install()
    finder = finders()[0]
    for name in ("json", "transformers", "transformers.utils", "flax", "fla.ops", "causal_conv1d_x", "torch"):
        assert finder.find_spec(name, None) is None


def test_install_kernels_limits_which_imports_are_managed(hooks_env):
    events = []
    fastpath_hooks.install(kernels=["causal_conv1d", "no-such-kernel"], on_event=events.append)
    assert any(e["type"] == "error" and "no-such-kernel" in e["message"] for e in events)
    assert [k for k in ("causal-conv1d", "fla", "tilelang") if hooks.HOOKS.selected(k)] == ["causal-conv1d"]
    # (a modeling module another test imported into this process makes install()'s late pass decide already)
    at_install = list(events)
    events.clear()
    with pytest.raises(ModuleNotFoundError):
        import fla  # noqa: F401 - not managed: no decision, no event
    assert events == []
    with pytest.raises(ModuleNotFoundError):
        import causal_conv1d  # noqa: F401 - managed: decided (no accelerator here), then the normal import
    decided = [e["kernel"] for e in at_install + events if "no CUDA/XPU accelerator" in e["message"]]
    assert decided == ["causal-conv1d"]


def test_a_gate_of_a_kernel_not_selected_asks_nothing(hooks_env):
    events = []
    fastpath_hooks.install(kernels=["causal-conv1d"], on_event=events.append)
    from fastpath_hooks import engine

    assert import_utils.is_flash_linear_attention_available() is False
    assert "fla" not in engine.outcomes() and not [e for e in events if e["kernel"] == "fla"], events
    assert import_utils.is_causal_conv1d_available() is False      # the selected one is decided
    assert "causal-conv1d" in engine.outcomes()


@pytest.mark.parametrize("spelling", ["flash_linear_attention", "FLA", "Flash.Linear_Attention", "fla_core"])
def test_install_kernels_accepts_any_spelling_of_a_distribution_name(hooks_env, spelling):
    events = []
    fastpath_hooks.install(kernels=[spelling], on_event=events.append)
    assert hooks.HOOKS.selected("fla") and not hooks.HOOKS.selected("causal-conv1d")
    assert not [e for e in events if e["type"] == "error"], events


@pytest.mark.parametrize("kernels", ["causal-conv1d,mamba-ssm", "causal_conv1d, mamba_ssm", "causal-conv1d mamba-ssm",
                                     ["causal-conv1d,mamba-ssm"]])
def test_install_kernels_accepts_the_comma_form_of_fastpath_hooks_skip(hooks_env, kernels):
    """Issue 34, defect 5: `install(kernels="causal-conv1d,mamba-ssm")` managed no kernel at all."""
    events = []
    fastpath_hooks.install(kernels=kernels, on_event=events.append)
    assert not [e for e in events if e["type"] == "error"], events
    selected = [k for k in ("causal-conv1d", "mamba-ssm", "fla") if hooks.HOOKS.selected(k)]
    assert selected == ["causal-conv1d", "mamba-ssm"]


@pytest.mark.parametrize("kernels, what", [(b"fla", "bytes"), (5, "int"), (bytearray(b"fla"), "bytearray"),
                                            (["fla", 5], "a list holding int"), ((b"fla",), "a tuple holding bytes")])
def test_install_kernels_of_another_type_is_a_type_error_naming_the_parameter(hooks_env, kernels, what):
    """Issue 40: `install(kernels=b'fla')` said "108 is not a kernel name" (bytes read as numbers), `kernels=5` raised
    a bare TypeError; either is a TypeError naming the parameter, before anything is installed."""
    with pytest.raises(TypeError) as raised:
        fastpath_hooks.install(kernels=kernels)
    assert str(raised.value) == ("install(kernels=...) takes kernel names, a str or a list of str "
                                 f"(e.g. kernels=['fla']), not {what}")
    assert finders() == [] and not hooks.HOOKS.installed()
    fastpath_hooks.install(kernels=(name for name in ["fla"]))    # any iterable of names: a generator too
    assert hooks.HOOKS.selected("fla") and not hooks.HOOKS.selected("causal-conv1d")


def test_install_kernels_naming_no_known_kernel_says_that_none_is_managed(hooks_env):
    events = []
    fastpath_hooks.install(kernels="causal-convld", on_event=events.append)
    (error,) = [e for e in events if e["type"] == "error"]
    assert "unknown kernel 'causal-convld'; did you mean causal-conv1d?" in error["message"], error
    assert "no kernel is managed" in error["message"], error
    assert not hooks.HOOKS.selected("causal-conv1d")


def test_install_again_after_the_wrappers_stepped_aside_does_not_wrap_again(hooks_env):
    where = {name: holders(gate) for name, gate in ORIGINALS.items()}
    fastpath_hooks.install()
    assert import_utils.is_causal_conv1d_available() is False and import_utils.is_flash_linear_attention_available() is False
    for name, original in ORIGINALS.items():       # stepped aside: the original back in every holder
        assert import_utils.__dict__[name] is original and holders(original) == where[name]
    fastpath_hooks.install()
    for name, original in ORIGINALS.items():       # its job is done: not wrapped (and queried) again
        assert import_utils.__dict__[name] is original and holders(original) == where[name]
    fastpath_hooks.uninstall()
    fastpath_hooks.install()                       # after uninstall() it starts afresh
    assert import_utils.is_causal_conv1d_available.__wrapped__ is ORIGINALS["is_causal_conv1d_available"]


def test_step_aside_reaches_transformers_modules_that_took_the_wrapper_later(hooks_env):
    fastpath_hooks.install()
    wrapper = import_utils.is_causal_conv1d_available
    late = types.ModuleType("transformers.fastpath_hooks_test_late")
    late.is_causal_conv1d_available = wrapper          # a modeling module imported after install()
    sys.modules[late.__name__] = late
    try:
        assert wrapper() is False
        assert late.is_causal_conv1d_available is ORIGINALS["is_causal_conv1d_available"]
    finally:
        del sys.modules[late.__name__]


def test_install_looks_for_the_gates_in_transformers_modules_and_modules_that_took_one_by_name(hooks_env):
    """install() after transformers rebinds the gates where they can be (gates.patch): transformers' own modules
    and, as the gate's reference count says one is held elsewhere, those holding it under its own name (what
    `from transformers.utils import ...` binds), each whole - not by walking all ~1,400 namespaces of a training
    process (11-20 ms, issue 40). uninstall() still takes every wrapper back, wherever it went."""
    original = ORIGINALS["is_causal_conv1d_available"]
    inside = types.ModuleType("transformers.fastpath_hooks_test_alias")
    took = types.ModuleType("fastpath_hooks_test_took")
    other = types.ModuleType("fastpath_hooks_test_other")
    inside.conv_ok = took.conv_ok = took.is_causal_conv1d_available = other.conv_ok = original
    added = {m.__name__: m for m in (inside, took, other)}
    sys.modules.update(added)
    try:
        fastpath_hooks.install()
        wrapper = import_utils.is_causal_conv1d_available
        assert wrapper.__wrapped__ is original
        assert inside.conv_ok is wrapper and took.is_causal_conv1d_available is wrapper and took.conv_ok is wrapper
        assert other.conv_ok is original      # only another name outside transformers: the original, answering as ever
        other.copied = wrapper                # copied since, under any name: taken back too
        fastpath_hooks.uninstall()
        assert inside.conv_ok is took.conv_ok is took.is_causal_conv1d_available is other.copied is original
    finally:
        for name in added:
            del sys.modules[name]


# -- fail safe at the seams: a refresh that throws keeps the block ----------------------------------

BROKEN_FINDER_SCRIPT = r'''
import sys
import torch
torch.cuda.is_available = lambda: True  # the posed H100 (transformers' own gate asks torch, not the target)
import fastpath_hooks
fastpath_hooks.install()

class BrokenFinder:  # a third-party finder whose cache reset raises (importlib.invalidate_caches calls it)
    def find_spec(self, *args):
        return None
    def invalidate_caches(self):
        raise RuntimeError("broken finder")

sys.meta_path.append(BrokenFinder())
from transformers.utils.import_utils import is_flash_linear_attention_available
print(is_flash_linear_attention_available(), is_flash_linear_attention_available())
'''


def test_a_gate_refresh_that_throws_keeps_the_kernel_blocked(tmp_path):
    """The refresh after the decision (importlib.invalidate_caches) throws through a real path - a
    broken finder on sys.meta_path; the blocked fla stays blocked (without the fail-safe, the
    original gate said True: fla is importable here)."""
    import subprocess

    standin = tmp_path / "site"
    (standin / "fla").mkdir(parents=True)
    (standin / "fla" / "__init__.py").write_text("__version__ = '0.6.0'\n")
    for dist in ("fla_core", "flash_linear_attention"):
        info = standin / f"{dist}-0.6.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 0.6.0\n")
        (info / "RECORD").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTPATH_HOOKS_", "_FASTPATH_HOOKS_"))}
    env.update(FASTPATH_HOOKS_TARGET="gpu=sm_90,cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=yes",
               FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"), FASTPATH_HOOKS_SKIP="causal-conv1d,tilelang",
               PYTHONPATH=os.pathsep.join(p for p in (str(standin), env.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-c", BROKEN_FINDER_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"], proc.stderr
    assert "fla: blocked" in proc.stderr and "internal error" in proc.stderr and "broken finder" in proc.stderr


# -- a kernel is here when its distribution's metadata is (issue 34, defect 4) ------------------

HOPPER = "gpu=sm_90,cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=yes"   # fla#640: fla needs tilelang here


def test_an_empty_fla_directory_does_not_make_tilelang_ours_to_install(tmp_path):
    """What `pip uninstall fla-core flash-linear-attention` can leave: an empty `fla/` (a namespace package to
    the path finder). Another package's optional `import tilelang` (mamba-ssm's) must not install the tilelang
    pair "for fla" then - only fla's metadata says fla is here."""
    site = tmp_path / "site"
    (site / "fla").mkdir(parents=True)
    env = venvs.clean_env(PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(fastpath_hooks.__file__)),
                                                       str(site)]),
                          FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"), FASTPATH_HOOKS_TARGET=HOPPER,
                          FASTPATH_HOOKS_MODE="report", LOCAL_RANK="0")
    script = "import importlib.util, fastpath_hooks; fastpath_hooks.install(); print(importlib.util.find_spec('tilelang'))"

    def tilelang_lines():
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stdout + proc.stderr
        return [line for line in proc.stderr.splitlines() if "tilelang" in line]

    assert tilelang_lines() == []              # not ours: the import goes on as without fastpath-hooks
    info = site / "fla_core-0.6.0.dist-info"   # fla's metadata there: tilelang is fla's, decided as such
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fla-core\nVersion: 0.6.0\n\n")
    assert any("tilelang: would install" in line for line in tilelang_lines())


def test_another_kernel_packages_optional_import_installs_nothing(tmp_path):
    """fla 0.6.0's root loads its layers, whose Mamba layers try `from mamba_ssm ... import` (issue 33): that is
    not a request for mamba-ssm. With its wheels at hand, nothing is decided, said or installed for it, and the
    import fails as it would without fastpath-hooks - while transformers' own `import fla` is decided as ever."""
    import zipfile

    from support import wheels

    house, site = tmp_path / "wheelhouse", tmp_path / "site"
    for path in wheels.fake_fla(str(tmp_path / "fla-wheels"), "0.6.0"):
        with zipfile.ZipFile(path) as zf:
            zf.extractall(site)             # fla installed (its files and metadata) ...
    wheels.mamba_ssm_wheel(str(house), filename=f"mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-{PY}-{PY}-"
                                                "linux_x86_64.whl")
    wheels.fake_causal_conv1d(str(house), f"causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-{PY}-{PY}-"
                                          "linux_x86_64.whl")   # ... and mamba-ssm's wheels to be had
    env = venvs.clean_env(PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(fastpath_hooks.__file__)),
                                                       str(site)]),
                          FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"), FASTPATH_HOOKS_MODE="report",
                          FASTPATH_HOOKS_TARGET="gpu=sm_80,cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=yes",
                          FASTPATH_HOOKS_FIND_LINKS=str(house), FASTPATH_HOOKS_OFFLINE="1", LOCAL_RANK="0")
    script = ("import json, sys, fastpath_hooks\nfastpath_hooks.install()\nimport fla\n"
              "print(json.dumps([sys.modules['fla.layers.mamba2'].selective_state_update is None, "
              "'mamba_ssm' in sys.modules, sorted(fastpath_hooks.engine.outcomes())]))")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, False, ["fla"]], proc.stdout
    assert [ln for ln in proc.stderr.splitlines() if "mamba" in ln or "causal" in ln] == [], proc.stderr


@pytest.mark.slow
def test_a_qwen3_5_import_on_hopper_plans_fla_tilelang_and_causal_conv1d_only(tmp_path, test_pins):
    """A model's kernels are the ones its modeling module asks for (issue 33): a posed sm_90 Qwen3.5 process plans
    fla (installed here by hand, as the stand-in 0.6.0 whose layers try mamba_ssm), tilelang for it (fla#640) and
    causal-conv1d - never mamba-ssm, whose wheels are at hand too."""
    import zipfile

    from support import wheels

    house, site = tmp_path / "wheelhouse", tmp_path / "site"
    for path in wheels.fake_fla(str(tmp_path / "fla-wheels"), "0.6.0"):
        with zipfile.ZipFile(path) as zf:
            zf.extractall(site)
    wheels.mamba_ssm_wheel(str(house), filename=f"mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-{PY}-{PY}-"
                                                "linux_x86_64.whl")
    wheels.fake_causal_conv1d(str(house), f"causal_conv1d-1.6.2.post1+cu12torch2.10cxx11abiTRUE-{PY}-{PY}-"
                                          "linux_x86_64.whl")
    wheels.fake_tvm_ffi(str(house), "0.1.12")
    wheels.fake_tilelang(str(house), "0.1.15")
    env = venvs.clean_env(PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(fastpath_hooks.__file__)),
                                                       str(site)]),
                          FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"), FASTPATH_HOOKS_MODE="report",
                          FASTPATH_HOOKS_TARGET=HOPPER, FASTPATH_HOOKS_FIND_LINKS=str(house), FASTPATH_HOOKS_OFFLINE="1",
                          FASTPATH_HOOKS_PINS=test_pins(str(house)), LOCAL_RANK="0")
    script = ("import json, sys, fastpath_hooks\nfastpath_hooks.install()\n"
              "import transformers.models.qwen3_5.modeling_qwen3_5\n"
              "out = fastpath_hooks.engine.outcomes()\n"
              "print(json.dumps({k: o.state for k, o in out.items()}))")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    decided = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "mamba-ssm" not in decided and {"fla", "tilelang", "causal-conv1d"} <= set(decided), decided
    planned = [ln.split(":")[1].strip() for ln in proc.stderr.splitlines() if "would install" in ln]
    assert sorted(planned) == ["causal-conv1d", "tilelang"], proc.stderr     # fla: here already (it needs tilelang)
