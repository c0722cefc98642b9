"""`fastpath-hooks install`'s exit code (issue 17, defect 4): a Dockerfile step must fail when a kernel
it names cannot be had.

- A named kernel: exit 0 only when every named kernel ends installed, repaired or already good; a
  skipped or blocked one exits 1 - the same outcome the same code, whichever kernel and whatever the
  cause - and the last line says which.
- None named: exit 1 only when a kernel this machine needs (the plan installs, repairs or keeps it)
  is not usable, or one is blocked; a kernel left alone here (no GPU, not needed) does not count.

Before, `install fla` in a `uv venv` without pip exited 0 (fla skipped: its tilelang had no
installer) while `install tilelang` exited 1 for the same cause.
"""

from __future__ import annotations

import pytest

from conftest import A100, H100_OLD_TRITON, offline_env
from support import venvs
from support.processes import link_uv

pytestmark = pytest.mark.slow   # a real venv, real installs


@pytest.fixture
def no_pip(tmp_path, torch_wheel, fastpath_wheel):
    """A `uv venv` without pip (and no uv of its own): no installer can run here."""
    return venvs.make_venv(str(tmp_path / "venv"), torch_wheel=torch_wheel, fastpath_wheel=fastpath_wheel,
                           transformers=None, seed=False)


def _install(venv, env, *kernels):
    proc = venv.cli("install", *kernels, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def test_a_named_kernel_that_ends_skipped_or_failed_exits_1_whatever_the_kernel(no_pip, make_wheelhouse, test_pins,
                                                                                 tmp_path):
    wheelhouse = make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi="0.1.12", causal=True)
    env = offline_env(wheelhouse, H100_OLD_TRITON, cache_dir=str(tmp_path / "cache"), pins=test_pins(wheelhouse))
    env["PATH"] = "/usr/bin:/bin"          # no uv on PATH either
    outcomes = {}
    for kernel in ("fla", "tilelang", "causal-conv1d"):
        code, out, err = _install(no_pip, env, kernel)
        outcomes[kernel] = code
        assert "no installer" in out + err, (out, err)
        assert f"not installed: {kernel} (" in err and "named but not usable" in err, err
    # fla ends skipped (it needs tilelang here, which cannot be installed), tilelang and causal-conv1d
    # failed: the same cause, the same exit code
    assert outcomes == {"fla": 1, "tilelang": 1, "causal-conv1d": 1}
    # none named: what this machine needs cannot be installed either
    code, out, err = _install(no_pip, env)
    assert code == 1 and "needed here but not usable" in err, (out, err)


def test_installed_or_already_good_exits_0_and_a_machine_that_needs_nothing_exits_0_unless_a_kernel_is_named(
        no_pip, make_wheelhouse, tmp_path):
    link_uv(no_pip)   # now uv can install here
    wheelhouse = make_wheelhouse(fla="0.6.0")
    env = offline_env(wheelhouse, A100, cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_INSTALLER="uv")
    code, out, err = _install(no_pip, env, "fla")
    assert code == 0 and "fla: installed" in out, (out, err)
    code, out, err = _install(no_pip, env, "fla")
    assert code == 0 and "fla: ok" in out, (out, err)
    # no GPU (this CPU machine as it is): nothing is needed, so `install` alone is fine...
    cpu = offline_env(wheelhouse, "gpu=none", cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_INSTALLER="uv")
    code, out, err = _install(no_pip, cpu)
    assert code == 0 and "not installed" not in err, (out, err)
    # ... but a kernel named there cannot be had: exit 1, and which one
    code, out, err = _install(no_pip, cpu, "causal-conv1d")
    assert code == 1 and "not installed: causal-conv1d (skipped)" in err, (out, err)
