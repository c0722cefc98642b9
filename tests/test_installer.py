"""The guarded installer (issue 4), end to end: real pip and uv, a real venv, fake kernel wheels.

Every test drives fastpath-hooks through a public surface - `fastpath-hooks install` in
the venv, or a script that calls `fastpath_hooks.install()` and imports a kernel - while
posing as a GPU machine with FASTPATH_HOOKS_TARGET, and ends by checking that torch,
numpy and transformers are untouched (triton: still absent) and `pip check` is as clean
as before. One venv serves the module: each test starts from it with no kernel installed;
the protected distributions' content hashes are compared at the module's start and end.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time

import pytest
from conftest import A100, CAUSAL_WHEEL, H100_OLD_TRITON
from support import guarded, venvs, wheels

from fastpath_hooks.facts import pins as pins_mod
from fastpath_hooks.act.installer import same_release
from fastpath_hooks.decide.plan import constraints

PINS = pins_mod.load()
MODELING = "transformers.models.qwen3_5.modeling_qwen3_5"
A100_TRITON_39 = "gpu=sm_80,cuda=12.8,torch=2.10.0,triton=3.9.0,nvcc=yes"

# slow: real venvs, real pip/uv installs of the stand-in wheels (docs/development.md)
pytestmark = pytest.mark.slow


def _broken_cases():
    """Every (tilelang, broken apache-tvm-ffi, arch) of the shipped data; arch-specific entries pose that arch."""
    seen, cases = set(), []
    for entry in PINS.kernel("tilelang").broken:
        for ffi in entry.companions:
            key = (entry.version, ffi, entry.arch)
            if key not in seen:
                seen.add(key)
                arch = entry.arch.replace("*", "any")
                cases.append(pytest.param(*key, id=f"tilelang{entry.version}-ffi{ffi}-{arch}"))
    return cases


def _pose(arch: str) -> str:
    return H100_OLD_TRITON if arch == "*" else f"gpu={arch},cuda=12.8,torch=2.10.0,triton=3.6.0,nvcc=yes"


# -- pure parts -------------------------------------------------------------------------------

@pytest.mark.parametrize("have,pinned,ok", [
    ("1.6.2.post1+cu12torch2.10cxx11abiTRUE", "1.6.2.post1", True),  # a release wheel's local label
    ("1.6.2.post1", "1.6.2.post1", True),
    ("0.6", "0.6.0", True),
    ("1.6.2", "1.6.2.post1", False),
    ("0.1.15.post2", "0.1.15", False),
    ("2.10.0+cu128", "2.10.0+cu126", False),  # a pin with a local label wants exactly that build
    ("2.10.0+cu128", "2.10.0+cu128", True),
    ("2.10.0", "2.10.0+cu128", False),
    (None, "0.6.0", False),
    ("not a version", "0.6.0", False),
])
def test_resolved_version_check(have, pinned, ok):
    assert same_release(have, pinned) is ok


def test_constraints_pin_everything_the_steps_do_not_name():
    installed = {"torch": "2.13.0+cpu", "numpy": "2.4.6", "einops": "0.8.2", "psutil": "5.9.0",
                 "fla-core": "0.5.2", "~la-core": "0.5.2", "odd": "not a version"}
    lines = constraints(installed, PINS.protected, ["fla-core", "flash-linear-attention", "einops"])
    assert lines[:2] == ["torch==2.13.0+cpu", "numpy==2.4.6"]  # the protected ones first
    assert lines[2:] == ["psutil==5.9.0"]  # named ones free, a stash and an unparsable version left out


# -- the shared venv ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def venv(tmp_path_factory, torch_wheel, fastpath_wheel):
    v = venvs.make_venv(str(tmp_path_factory.mktemp("installer") / "venv"), torch_wheel=torch_wheel,
                        fastpath_wheel=fastpath_wheel, transformers="latest")
    # pip's bytecode once (PYTHONDONTWRITEBYTECODE=1 here): every pip run and `pip check` then starts in ~1 s.
    subprocess.run([v.python, "-m", "compileall", "-q", os.path.join(v.site, "pip")], check=True,
                   capture_output=True, env=venvs.clean_env())
    v.start_hashes = v.file_hashes()
    v.start_pip_check = v.pip_check()
    assert "triton" not in v.start_hashes
    return v


@pytest.fixture
def fresh(venv):
    """The module venv with no kernel installed; returns the protected state to compare with."""
    guarded.reset_kernels(venv)
    return guarded.stat_state(venv)


@pytest.fixture(scope="module")
def uv_bin(tmp_path_factory):
    return guarded.uv_dir(str(tmp_path_factory.mktemp("uvbin")))


def assert_untouched(venv, before):
    """torch/numpy/transformers: same versions and files; triton still absent; pip check as clean as before."""
    assert guarded.stat_state(venv) == before
    assert "triton" not in venv.versions()
    assert venv.pip_check() == venv.start_pip_check


def child_import(venv, code: str) -> str:
    proc = venv.run(code, env=venvs.clean_env(FASTPATH_HOOKS_DISABLE="1"))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def env_for(tmp_path, target, **kw):
    return guarded.kernel_env(target=target, cache_dir=str(tmp_path / "cache"), **kw)


# -- plain installs -------------------------------------------------------------------------

@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_install_fla_with_each_installer(venv, fresh, tmp_path, make_wheelhouse, test_pins, uv_bin, installer):
    wh = make_wheelhouse(fla="0.6.0")
    env = env_for(tmp_path, A100, wheelhouse=wh, installer=installer, pins=test_pins(),
                  uv=uv_bin if installer == "uv" else None)
    proc = venv.cli("install", "fla", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fla: installed" in proc.stdout
    assert f"with {installer}; verified in a child process" in proc.stderr
    assert guarded.kernel_versions(venv) == {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}
    assert "einops" in venv.versions()  # fla's runtime dep, installed explicitly next to the --no-deps pair
    assert child_import(venv, "import fla; print(fla.__version__, fla.FAKE_FLA)") == "0.6.0 True"
    again = venv.cli("install", "fla", env=env)
    assert again.returncode == 0 and "fla: ok" in again.stdout, again.stdout + again.stderr
    assert "installing" not in again.stderr  # installed and verified: nothing to do
    assert_untouched(venv, fresh)


def test_plan_prints_the_constraints_the_installer_writes(venv, fresh, tmp_path, make_wheelhouse, test_pins):
    """`plan` shows the exact constraints file: a uv in front of the real one keeps a copy of every
    constraints file the installer passes it, through a real install."""
    import json

    wh = make_wheelhouse(fla="0.6.0")
    captured = tmp_path / "captured"
    bindir = guarded.capturing_uv(str(tmp_path), str(captured))
    env = env_for(tmp_path, A100, wheelhouse=wh, installer="uv", pins=test_pins(), uv=bindir)

    plan = venv.cli("plan", "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    data = json.loads(plan.stdout)
    expected = data["kernel_constraints"]["fla"]
    assert expected[:len(data["constraints"])] == data["constraints"]   # the protected ones first ...
    assert len(expected) > len(data["constraints"]) + 5                 # ... then everything else installed
    text = venv.cli("plan", env=env).stdout
    assert "    <constraints.txt>: " + " ".join(expected) in text.splitlines()

    proc = venv.cli("install", "fla", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(captured.iterdir())
    assert len(files) == len(data["commands"]["fla"]) >= 1  # one per installer run
    for path in files:
        assert path.read_text().splitlines() == expected, path
    assert_untouched(venv, fresh)


def test_auto_mode_falls_back_to_pip_when_uv_rejects_lzma_wheels(venv, fresh, tmp_path, make_wheelhouse, test_pins,
                                                                 uv_bin):
    wh = make_wheelhouse(fla="0.6.0")
    for name in os.listdir(wh):
        if name.startswith(("fla_core", "flash_linear")):
            guarded.lzma_copy(os.path.join(wh, name))
    env = env_for(tmp_path, A100, wheelhouse=wh, pins=test_pins(), uv=uv_bin, FASTPATH_HOOKS_LOG="debug")
    proc = venv.cli("install", "fla", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.path.join(uv_bin, "uv") + " pip install" in proc.stderr  # auto mode tried uv first
    assert "unsupported compression method" in proc.stderr and "retrying with pip" in proc.stderr
    assert "with pip; verified in a child process" in proc.stderr
    assert guarded.kernel_versions(venv) == {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}
    assert_untouched(venv, fresh)


def test_never_installs_a_distribution_off_the_allow_list(venv, fresh, tmp_path, make_wheelhouse, test_pins):
    # A newer einops in the wheelhouse that drags in a stranger: the deps step resolves it, the
    # check after the step refuses it, and the whole install is rolled back.
    wh = make_wheelhouse(fla="0.6.0")
    wheels.build_wheel(wh, "einops", "99.0", {"einops/__init__.py": "__version__ = '99.0'\n"}, requires=("evilpkg",))
    wheels.build_wheel(wh, "evilpkg", "1.0", {"evilpkg/__init__.py": "RAN = True\n"})
    env = env_for(tmp_path, A100, wheelhouse=wh, installer="pip", pins=test_pins())
    proc = venv.cli("install", "fla", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "evilpkg (absent -> 1.0), which is not on the pins' allow-list" in proc.stderr
    versions = venv.versions()
    assert not {"evilpkg", "einops", "fla-core", "flash-linear-attention"} & set(versions)
    assert guarded.site_entries(venv, ("evilpkg", "einops", "fla")) == []
    assert_untouched(venv, fresh)


# -- repair of a broken tilelang / apache-tvm-ffi pair ------------------------------------------

@pytest.mark.parametrize("tilelang,broken_ffi,arch", _broken_cases())
def test_repairs_every_broken_pair_of_the_data(venv, fresh, tmp_path, make_wheelhouse, test_pins, uv_bin,
                                               tilelang, broken_ffi, arch, request):
    # The user's environment: fla installed next to tilelang X + a broken apache-tvm-ffi Y.
    good = PINS.good_companions("tilelang", tilelang)
    wh = make_wheelhouse(fla="0.6.0", tilelang=tilelang, tvm_ffi=(broken_ffi,) + tuple(good))
    venv.uv_install(*(os.path.join(wh, f) for f in os.listdir(wh)
                      if f.startswith(("fla", "flash", "einops", "tilelang-", f"apache_tvm_ffi-{broken_ffi}-"))),
                    no_deps=True)
    assert guarded.kernel_versions(venv) == {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0",
                                             "tilelang": tilelang, "apache-tvm-ffi": broken_ffi}
    gpu = _pose(arch).split(",")[0].split("=")[1]
    installer = ("pip", "uv", "uv")[request.node.callspec.indices["tilelang"] % 3]  # both installers over the cases
    env = env_for(tmp_path, _pose(arch), wheelhouse=wh, installer=installer, pins=test_pins(), uv=uv_bin)
    # On Hopper with triton 3.6 fla needs tilelang: asking for fla repairs it. Elsewhere (an arch-specific
    # entry) fla does not need tilelang, and `install tilelang` repairs it.
    kernel = "fla" if arch == "*" else "tilelang"
    proc = venv.cli("install", kernel, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tilelang: repaired apache-tvm-ffi" in proc.stderr and f"with {installer}" in proc.stderr
    after = guarded.kernel_versions(venv)
    assert after["apache-tvm-ffi"] in PINS.good_companions("tilelang", after["tilelang"])
    assert PINS.broken_for("tilelang", after["tilelang"], after["apache-tvm-ffi"], (gpu,)) is None
    assert after["fla-core"] == after["flash-linear-attention"] == "0.6.0"
    assert child_import(venv, "import tilelang; print(tilelang.__version__)") == after["tilelang"]
    # the user's process: fla imports, the repair is not redone and tilelang not checked again. fla's one pass
    # may start in the background at the pins' defaults as it imports (engine/first_call.py: while a model would
    # be built) - the only run there may be, and whether it began before the import returned is a race
    result, asked = guarded.ask(venv, "fla", env)
    assert result is not None and result["first"] == "ok 0.6.0", asked.stderr
    runs = [m for m in result["events"] if m.startswith("running:")]
    assert len(runs) <= 1 and all("check_child.py" in m and '"gdr": {"kind": "gated-delta-rule", "kernel": "fla"' in m
                                  and "the pins' defaults, no model known yet" in m for m in runs), runs
    said = result["events"]
    assert not any("repairing" in m or "installing" in m for m in said), said
    assert any(m.startswith("fla: fla 0.6.0 installed") for m in said), said
    if arch == "*":   # fla needs tilelang here: the repair's warm verdict says what is true now, not "repairing to"
        assert any(m.startswith("tilelang: ") and f"apache-tvm-ffi {after['apache-tvm-ffi']}" in m
                   and "put in by a repair on " in m and "repairing" not in m for m in said), said
    assert_untouched(venv, fresh)


def test_import_fla_repairs_an_aborting_pair_then_installs_fla(venv, fresh, tmp_path, make_wheelhouse, test_pins,
                                                               uv_bin):
    # tilelang 0.1.11 + apache-tvm-ffi 0.1.12 aborts any process that imports tilelang (SIGABRT).
    wh = make_wheelhouse(fla="0.6.0", tilelang="0.1.11", tvm_ffi=("0.1.12", "0.1.11", "0.1.10"))
    venv.uv_install(*(os.path.join(wh, f) for f in os.listdir(wh)
                      if f.startswith(("tilelang-", "apache_tvm_ffi-0.1.12-"))), no_deps=True)
    crash = venv.run("import tilelang", env=venvs.clean_env(FASTPATH_HOOKS_DISABLE="1"))
    assert crash.returncode == -6  # the fake really aborts with this pair
    env = env_for(tmp_path, H100_OLD_TRITON, wheelhouse=wh, installer="uv", pins=test_pins(), uv=uv_bin)
    result, proc = guarded.ask(venv, "fla", env)
    assert result is not None, proc.stdout + proc.stderr
    assert result["first"] == "ok 0.6.0", proc.stderr
    assert "tilelang: repaired" in proc.stderr and "fla: installed" in proc.stderr
    after = guarded.kernel_versions(venv)
    assert after["tilelang"] == "0.1.11" and after["apache-tvm-ffi"] in PINS.good_companions("tilelang", "0.1.11")
    assert child_import(venv, "import tilelang; print('alive')") == "alive"
    assert_untouched(venv, fresh)


def test_repair_fails_closed_when_the_good_tvm_ffi_is_not_in_the_wheelhouse(venv, fresh, tmp_path, make_wheelhouse,
                                                                           test_pins):
    wh = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi=("0.1.15.post2",))
    venv.uv_install(*(os.path.join(wh, f) for f in os.listdir(wh) if not f.startswith("packaging")), no_deps=True)
    before = venv.file_hashes(guarded.KERNEL_DISTS)
    env = env_for(tmp_path, H100_OLD_TRITON, wheelhouse=wh, pins=test_pins())
    result, proc = guarded.ask(venv, "fla", env)
    assert result is not None and result["alive"], proc.stdout + proc.stderr
    assert result["first"].startswith("ImportError: fastpath-hooks blocked `import fla`")
    assert "apache-tvm-ffi 0.1.15.post2 is broken with tilelang 0.1.15" in result["first"]
    assert "triton >= 3.7.1" in result["first"]  # says how to fix it
    assert result["runs_first"] == 0 and result["second"] == result["first"]
    assert venv.file_hashes(guarded.KERNEL_DISTS) == before
    assert_untouched(venv, fresh)


def test_repair_fails_closed_when_the_good_pair_still_aborts(venv, fresh, tmp_path, make_wheelhouse, test_pins):
    wh = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tilelang_abort=True, tvm_ffi=("0.1.9", "0.1.12"))
    venv.uv_install(*(os.path.join(wh, f) for f in os.listdir(wh)
                      if f.startswith(("fla", "flash", "einops", "tilelang", "apache_tvm_ffi-0.1.9-"))), no_deps=True)
    before = venv.file_hashes(guarded.KERNEL_DISTS)
    env = env_for(tmp_path, H100_OLD_TRITON, wheelhouse=wh, installer="pip", pins=test_pins())
    result, proc = guarded.ask(venv, "fla", env)
    assert result is not None and result["alive"], proc.stdout + proc.stderr
    assert result["runs_first"] >= 1  # the repair was tried ...
    assert "SIGABRT" in proc.stderr and "rolled back" in proc.stderr
    assert result["first"].startswith("ImportError: fastpath-hooks blocked `import fla`")  # ... and failed closed
    assert result["runs_second"] == 0 and result["second"] == result["first"]
    assert venv.file_hashes(guarded.KERNEL_DISTS) == before  # tilelang, tvm-ffi 0.1.9 and fla exactly as before
    # A new process remembers the failure (FASTPATH_HOOKS_RETRY_AFTER, default 1 h): no retry, still blocked.
    again, proc2 = guarded.ask(venv, "fla", env)
    assert again["runs_first"] == 0, proc2.stderr
    assert again["first"].startswith("ImportError: fastpath-hooks blocked `import fla`") and "SIGABRT" in again["first"]
    assert venv.file_hashes(guarded.KERNEL_DISTS) == before
    assert_untouched(venv, fresh)


# -- failed verification: rolled back, the asking process stays on the torch path ----------------

def _check_torch_path(result, proc):
    assert result is not None and result["alive"], proc.stdout + proc.stderr
    assert result["first"] == "ModuleNotFoundError: No module named 'fla'"
    assert result["runs_first"] >= 1 and result["runs_second"] == 0  # tried once, remembered in-process
    assert result["resolved"] == {"torch_chunk_gated_delta_rule": MODELING,
                                  "torch_recurrent_gated_delta_rule": MODELING}
    assert result["logits_finite"]


def test_fla_whose_import_raises_is_rolled_back(venv, fresh, tmp_path, make_wheelhouse, test_pins, uv_bin):
    wh = make_wheelhouse(fla="0.6.0", fla_broken="raise")
    env = env_for(tmp_path, A100, wheelhouse=wh, installer="uv", pins=test_pins(), uv=uv_bin)
    result, proc = guarded.ask(venv, "fla", env, model=True)
    _check_torch_path(result, proc)
    assert "fla: could not install - verification failed" in proc.stderr and "broken on purpose" in proc.stderr
    assert "rolled back: removed " in proc.stderr
    assert guarded.site_entries(venv) == [] and guarded.kernel_versions(venv) == {}
    again, proc2 = guarded.ask(venv, "fla", env)
    assert again["runs_first"] == 0 and again["first"] == result["first"], proc2.stderr
    assert "broken on purpose" in proc2.stderr and " s ago: " in proc2.stderr      # remembered: why, and when
    assert "(now: fastpath-hooks install fla)" in proc2.stderr                     # and the command that tries now
    assert_untouched(venv, fresh)


def test_fla_whose_import_raises_restores_the_older_fla(venv, fresh, tmp_path, make_wheelhouse, test_pins):
    old = make_wheelhouse(fla="0.5.2")
    venv.uv_install(*(os.path.join(old, f) for f in os.listdir(old) if not f.startswith("packaging")), no_deps=True)
    before = venv.file_hashes(guarded.KERNEL_DISTS)
    wh = make_wheelhouse(fla="0.6.0", fla_broken="raise")
    # triton 3.9.0: fla 0.5.2 does not import there, so the policy replaces it with 0.6.0 - which is broken.
    env = env_for(tmp_path, A100_TRITON_39, wheelhouse=wh, installer="pip", pins=test_pins())
    proc = venv.cli("install", "fla", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # failed, or blocked: the policy may fence off the restored 0.5.2, which does not import with triton 3.9
    assert "verification failed" in proc.stdout and "broken on purpose" in proc.stdout
    assert "restored fla-core 0.5.2" in proc.stderr
    assert venv.file_hashes(guarded.KERNEL_DISTS) == before
    assert child_import(venv, "import fla; print(fla.__version__)") == "0.5.2"
    assert_untouched(venv, fresh)


def test_tilelang_that_aborts_is_rolled_back(venv, fresh, tmp_path, make_wheelhouse, test_pins, uv_bin):
    wh = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tilelang_abort=True, tvm_ffi=("0.1.12",))
    env = env_for(tmp_path, H100_OLD_TRITON, wheelhouse=wh, installer="uv", pins=test_pins(), uv=uv_bin)
    result, proc = guarded.ask(venv, "fla", env, model=True)
    _check_torch_path(result, proc)
    assert "verification failed: import tvm_ffi, tilelang killed the process (SIGABRT)" in proc.stderr
    assert "rolled back: removed " in proc.stderr
    assert "fla: not installed - needs tilelang here, which is not usable (fix tilelang first" in proc.stderr
    assert guarded.site_entries(venv) == [] and guarded.kernel_versions(venv) == {}
    again, proc2 = guarded.ask(venv, "fla", env)
    assert again["runs_first"] == 0 and again["first"] == result["first"], proc2.stderr
    assert "SIGABRT" in proc2.stderr
    assert_untouched(venv, fresh)


def test_tilelang_that_aborts_restores_the_previous_pair(venv, fresh, tmp_path, make_wheelhouse, test_pins):
    old = make_wheelhouse(tilelang="0.1.8", tvm_ffi=("0.1.12",), deps=False)
    venv.uv_install(*(os.path.join(old, f) for f in os.listdir(old)), no_deps=True)
    before = venv.file_hashes(guarded.KERNEL_DISTS)
    # No good apache-tvm-ffi for 0.1.8 offline, so the repair goes to the pair 0.1.15 + 0.1.12 - which aborts.
    wh = make_wheelhouse(tilelang="0.1.15", tilelang_abort=True, tvm_ffi=("0.1.12",), deps=False)
    env = env_for(tmp_path, H100_OLD_TRITON, wheelhouse=wh, installer="pip", pins=test_pins())
    proc = venv.cli("install", "tilelang", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "SIGABRT" in proc.stderr and "restored tilelang 0.1.8" in proc.stderr
    assert venv.file_hashes(guarded.KERNEL_DISTS) == before
    assert guarded.kernel_versions(venv) == {"tilelang": "0.1.8", "apache-tvm-ffi": "0.1.12"}
    assert_untouched(venv, fresh)


def test_restart_is_advised_when_the_process_imported_the_old_version(venv, fresh, tmp_path, make_wheelhouse,
                                                                      test_pins, uv_bin):
    old = make_wheelhouse(fla="0.5.2")
    venv.uv_install(*(os.path.join(old, f) for f in os.listdir(old) if not f.startswith("packaging")), no_deps=True)
    wh = make_wheelhouse(fla="0.6.0")
    env = env_for(tmp_path, A100_TRITON_39, wheelhouse=wh, installer="uv", pins=test_pins(), uv=uv_bin)
    code = ("import fla, fastpath_hooks\n"
            "fastpath_hooks.install()\n"
            "from transformers.utils import import_utils\n"
            "import_utils.is_flash_linear_attention_available()\n"
            "print('loaded', fla.__version__)\n")
    proc = venv.run(code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "loaded 0.5.2"
    assert "fla: repaired" in proc.stderr
    assert "had already imported fla before it changed on disk; restart it" in proc.stderr
    assert guarded.kernel_versions(venv) == {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}
    assert_untouched(venv, fresh)


# -- causal-conv1d: the release wheel and its sha256 --------------------------------------------

@pytest.mark.parametrize("source", ["wheelhouse", "release-url"])
@pytest.mark.parametrize("digest", ["pinned", "mismatch"])
def test_causal_conv1d_release_wheel_sha256(venv, fresh, tmp_path, make_wheelhouse, test_pins, uv_bin, source,
                                           digest):
    wh = make_wheelhouse(causal=True, deps=False)
    pins = test_pins(wh) if digest == "pinned" else test_pins()  # test_pins() keeps the real wheel's digest
    if source == "wheelhouse":
        env = env_for(tmp_path, A100, wheelhouse=wh, installer="uv", pins=pins, uv=uv_bin)
    else:
        os.makedirs(tmp_path / "none", exist_ok=True)
        empty_index = wheels.simple_index(str(tmp_path / "none"), str(tmp_path / "index"))
        env = env_for(tmp_path, A100, offline=False, installer="pip", pins=pins,
                      FASTPATH_HOOKS_INDEX_URL=empty_index,
                      FASTPATH_HOOKS_CAUSAL_CONV1D_WHEEL_URL="file://" + wh + "/")
    env["FASTPATH_HOOKS_LOG"] = "debug"  # the lines whole (URLs and digests are long)
    proc = venv.cli("install", "causal-conv1d", env=env)
    if source == "release-url":
        assert "downloading file://" + wh + "/causal_conv1d-1.6.2.post1%2Bcu12torch2.10" in proc.stderr
    if digest == "mismatch":
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"{CAUSAL_WHEEL}: sha256 {wheels.sha256_of(os.path.join(wh, CAUSAL_WHEEL))}, not the expected " \
               f"{PINS.release('causal-conv1d').sha256[CAUSAL_WHEEL]}; refused" in proc.stderr   # (the debug log)
        assert guarded.kernel_versions(venv) == {} and guarded.site_entries(venv) == []
    else:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "causal-conv1d: installed" in proc.stdout
        assert guarded.kernel_versions(venv) == {"causal-conv1d": "1.6.2.post1+cu12torch2.10cxx11abiTRUE"}
        assert "verified in a child process" in proc.stderr
        assert child_import(venv, "import importlib.util as u; print(u.find_spec('causal_conv1d').origin)") == \
            os.path.join(venv.site, "causal_conv1d", "__init__.py")
    assert_untouched(venv, fresh)


# -- a step that hangs: the timeout, the heartbeat ----------------------------------------------

class _SilentIndex(http.server.BaseHTTPRequestHandler):
    """Accepts the request and never answers (a stalled index or proxy)."""

    def do_GET(self):  # noqa: N802
        self.server.hits += 1
        self.server.release.wait(120)

    def log_message(self, *args):
        pass


class _Stalled:
    """`fastpath-hooks install fla` against a stalled index, FASTPATH_HOOKS_TIMEOUT=32, running in the
    background while the other tests run (it only waits on a socket): the heartbeat comes at 30 s."""

    TIMEOUT = 32

    def __init__(self, base, fastpath_wheel, pins):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SilentIndex)
        self.server.daemon_threads = True
        self.server.hits, self.server.release = 0, threading.Event()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        # torch is posed (torch=2.10.0) and nothing imports it: a small venv will do
        self.venv = venvs.make_venv(os.path.join(base, "venv"), torch_wheel=None, fastpath_wheel=fastpath_wheel,
                                    transformers=None)
        self.before = (self.venv.versions(), self.venv.pip_check())
        wh = os.path.join(base, "wheelhouse")
        wheels.fake_fla(wh, "0.6.0")  # einops is not there: it must come from the stalled index
        env = guarded.kernel_env(target=A100, cache_dir=os.path.join(base, "cache"), wheelhouse=wh, offline=False,
                                 installer="pip", pins=pins, FASTPATH_HOOKS_TIMEOUT=str(self.TIMEOUT),
                                 FASTPATH_HOOKS_INDEX_URL=f"http://127.0.0.1:{self.server.server_address[1]}/simple/")
        self.start = time.monotonic()
        self.proc = subprocess.Popen([os.path.join(self.venv.bin, "fastpath-hooks"), "install", "fla"], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=base)
        self.output = None
        self.waiter = threading.Thread(target=self._wait, daemon=True)
        self.waiter.start()

    def _wait(self):
        out, err = self.proc.communicate()
        self.output = (self.proc.returncode, out, err, time.monotonic() - self.start)

    def result(self):
        self.waiter.join(timeout=120)
        assert self.output is not None, "the stalled install did not end"
        return self.output

    def close(self):
        # the waiter thread owns communicate(): a second reader of the same pipes fails (EBADF) when
        # the module's tests that read the result were deselected and the install still runs
        if self.proc.poll() is None:
            self.proc.kill()
        self.server.release.set()
        self.waiter.join(timeout=60)
        self.server.shutdown()


@pytest.fixture(scope="module", autouse=True)
def stalled(tmp_path_factory, fastpath_wheel):
    pins = tmp_path_factory.mktemp("stalled-pins") / "pins.json"
    pins.write_text('{"kernels": {"tilelang": {"runtime_deps": []}, "causal-conv1d": {"runtime_deps": []}}}')
    job = _Stalled(str(tmp_path_factory.mktemp("stalled")), fastpath_wheel, str(pins))
    yield job
    job.close()


def test_a_step_that_hangs_times_out_with_heartbeats(stalled):
    code, out, err, took = stalled.result()
    assert stalled.server.hits >= 1
    assert code == 1, out + err
    assert "still installing einops (30 s)" in err  # the heartbeat (packaging is installed: not named)
    assert f"did not finish within {stalled.TIMEOUT} s (FASTPATH_HOOKS_TIMEOUT)" in err
    assert "fla: " in out and "did not finish" in out
    assert stalled.TIMEOUT <= took < stalled.TIMEOUT + 30
    assert (stalled.venv.versions(), stalled.venv.pip_check()) == stalled.before  # nothing installed, nothing changed


def test_zz_protected_content_unchanged_over_the_module(venv):
    """Content hashes of torch, numpy and transformers (triton: absent) after every test above."""
    assert venv.file_hashes() == venv.start_hashes
    assert venv.pip_check() == venv.start_pip_check
