"""Kernels fastpath-hooks does not ship, added by a FASTPATH_HOOKS_PINS file alone - for real: stand-in
wheels and an sdist in a local wheelhouse, real venvs, real pip installing offline (--no-index
--find-links), the verification child, the real CLI, the start-up entry `enable` writes.

- foo-attn: a pure-Python kernel (its own module `foo_attn`, no transformers gate): `import foo_attn`
  installs and verifies it, after install() or with only the start-up entry; doctor, plan and install
  know it by name.
- foo-conv: a compiled kernel with no release wheels: `fastpath-hooks install foo-conv` builds it from its
  sdist with the (fake) nvcc for the visible GPU only, installs and verifies it.
Neither name appears in fastpath_hooks' code: the pins entries (tests/test_registry.py, with their
policy rows) are all there is.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import A100, offline_env
from support import sdists, wheels
from support.venvs import clean_env
from test_registry import FOO_ATTN, FOO_CONV

pytestmark = pytest.mark.slow

FOO_ATTN_MODULE = '''"""A stand-in pure-Python kernel that only a user's pins file knows."""
__version__ = "VERSION"


def attend(q, k, v):
    return v
'''
HOPPER = "gpu=sm_90,cuda=13.0,torch=2.13.0,cpus=16"    # torch 2.13: no release wheel, a build for sm_90


def _pins(tmp_path, **kernels) -> str:
    path = tmp_path / "user-pins.json"
    path.write_text(json.dumps({"kernels": {k.replace("_", "-"): v for k, v in kernels.items()}}))
    return str(path)


@pytest.fixture
def foo_house(make_wheelhouse):
    """An offline wheelhouse: foo-attn 1.0.0 and 1.1.0 (pure wheels) and packaging, its runtime dependency."""
    house = make_wheelhouse()
    for version in ("1.0.0", "1.1.0"):
        wheels.build_wheel(house, "foo-attn", version, {"foo_attn/__init__.py": FOO_ATTN_MODULE.replace("VERSION", version)})
    return house


def _imported(venv, env) -> dict:
    code = ("import json, foo_attn, importlib.metadata as m\n"
            "print(json.dumps({'version': m.version('foo-attn'), 'attend': callable(foo_attn.attend)}))")
    proc = venv.run(code, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_pure_kernel_added_by_a_pins_file_installs_at_its_import(make_venv, foo_house, tmp_path):
    pins = _pins(tmp_path, foo_attn=FOO_ATTN)
    env = offline_env(foo_house, A100, cache_dir=str(tmp_path / "cache"), pins=pins)
    venv = make_venv(transformers=None)

    # plan knows it by name, before anything is installed: the newest release that fits
    plan = venv.cli("plan", "foo-attn", "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    (decision,) = json.loads(plan.stdout)["decisions"]
    assert (decision["kernel"], decision["action"], decision["rule"]) == ("foo-attn", "install", "foo.install")
    assert decision["target"] == {"foo-attn": "1.1.0"}

    # `import foo_attn` after install(): decided, installed from the wheelhouse, verified in a child process
    code = ("import fastpath_hooks\nfastpath_hooks.install()\n"
            "import json, foo_attn, importlib.metadata as m\n"
            "print(json.dumps({'version': m.version('foo-attn'), 'attend': callable(foo_attn.attend)}))")
    proc = venv.run(code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"version": "1.1.0", "attend": True}
    assert re.search(r"foo-attn: installed foo-attn 1\.1\.0 in [\d.]+ s with (pip|uv); verified in a child process", proc.stderr), \
        proc.stderr

    # doctor and install know it: installed, nothing to do
    doctor = venv.cli("doctor", "--json", env=env)
    assert doctor.returncode == 0, doctor.stderr
    by_kernel = {d["kernel"]: d for d in json.loads(doctor.stdout)["decisions"]}
    assert (by_kernel["foo-attn"]["action"], by_kernel["foo-attn"]["rule"]) == ("ok", "foo.ok")
    assert "foo-attn" in venv.cli("doctor", env=env).stdout
    again = venv.cli("install", "foo_attn", env=env)     # an alias from its entry
    assert again.returncode == 0 and again.stdout.startswith("foo-attn: ok - foo-attn 1.1.0"), again.stdout
    skipped = venv.cli("plan", "foo-attn", "--json", env={**env, "FASTPATH_HOOKS_SKIP": "fooattn"})
    assert json.loads(skipped.stdout)["decisions"][0]["rule"] == "skip.user"


def test_a_pure_kernel_added_by_a_pins_file_is_watched_from_interpreter_start(make_venv, foo_house, tmp_path):
    """`enable` with the pins file set writes the kernel's module into the start-up stand-in's watched
    names: a bare `import foo_attn` (no install(), no transformers) hands over and installs it; the
    CLI installs it elsewhere."""
    pins = _pins(tmp_path, foo_attn=FOO_ATTN)
    env = offline_env(foo_house, A100, cache_dir=str(tmp_path / "cache"), pins=pins)
    venv = make_venv(transformers=None)
    enabled = venv.cli("enable", env=env)
    assert enabled.returncode == 0, enabled.stderr
    assert _imported(venv, env) == {"version": "1.1.0", "attend": True}
    # without the pins file the name is unknown again, and nothing of it is touched
    plain = venv.cli("install", "foo-attn", env={k: v for k, v in env.items() if k != "FASTPATH_HOOKS_PINS"})
    assert plain.returncode == 2 and "unknown kernel 'foo-attn'" in plain.stderr

    other = make_venv(transformers=None)
    proc = other.cli("install", "foo-attn", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("foo-attn: installed"), proc.stdout
    assert _imported(other, clean_env(FASTPATH_HOOKS_DISABLE="1")) == {"version": "1.1.0", "attend": True}


@pytest.fixture
def foo_conv_house(tmp_path, build_dep_wheels):
    house = str(tmp_path / "foo-sdists")
    sdists.foo_conv_sdist(house)
    for name in os.listdir(build_dep_wheels):
        os.link(os.path.join(build_dep_wheels, name), os.path.join(house, name))
    return house


def test_a_compiled_kernel_added_by_a_pins_file_builds_for_the_visible_gpu(make_venv, toolkit, foo_conv_house, tmp_path):
    pins = _pins(tmp_path, foo_conv=FOO_CONV)
    env = offline_env(foo_conv_house, HOPPER, cache_dir=str(tmp_path / "cache"), pins=pins, CUDA_HOME=toolkit.home)
    venv = make_venv(transformers=None)
    # plan knows it by name, before anything is built: a source build for this machine's GPU
    plan = venv.cli("plan", "foo-conv", "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    (decision,) = json.loads(plan.stdout)["decisions"]
    assert (decision["kernel"], decision["action"]) == ("foo-conv", "install"), decision
    assert decision["rule"].startswith("fooconv.") and [s["kind"] for s in decision["steps"]][-1] == "build", decision
    proc = venv.cli("install", "foo-conv", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "foo-conv: building - from source for sm_90" in proc.stderr, proc.stderr
    assert re.search(r"foo-conv: built for sm_90 in \d+ s; log: \$FASTPATH_HOOKS_CACHE_DIR/logs/foo-conv-0\.1\.0-sm_90-",
                     proc.stderr), proc.stderr
    calls = toolkit.calls()
    assert len(calls) == 3 and all(sdists.gencode_codes(argv) == ["sm_90"] for argv in calls), calls
    code = ("import json, foo_conv, importlib.metadata as m\n"
            "print(json.dumps({'version': m.version('foo-conv'), 'fn': callable(foo_conv.foo_conv_fn)}))")
    out = venv.run(code, env=clean_env(FASTPATH_HOOKS_DISABLE="1"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"version": "0.1.0+fph.torch2.13.0.cu130.abi1.sm90", "fn": True}
    assert "verified in a child process" in proc.stderr
    # the build is in the wheel cache under the kernel's name
    listing = json.loads(venv.cli("cache", "list", "--json", env=env).stdout)
    assert [(w["distribution"], w["origin"], w["key"]["archs"]) for w in listing["wheels"]] == [("foo-conv", "built", ["sm_90"])]
