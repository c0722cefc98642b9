"""The one real-package test: fastpath-hooks installs the REAL fla 0.6.0 from the index.

fla-core 0.6.0's `import fla` succeeds without triton but exports nothing (its layers
are optional imports), and `fla.modules` / `fla.ops.gated_delta_rule` - what the
verification imports - need triton. CPU torch wheels ship none, so the venv gets the
triton that torch 2.13 pins (3.7.1, uv --no-deps) first, and the target poses that triton
on an A100. Then `fastpath-hooks install fla` resolves, installs and verifies the real pair
through its own installer, and a user process imports the real kernel.
"""

from __future__ import annotations

import pytest
from support import guarded

TRITON = "3.7.1"  # torch 2.13.0's Requires-Dist: triton==3.7.1 (Linux)
TARGET = f"gpu=sm_80,cuda=12.8,triton={TRITON}"

pytestmark = [pytest.mark.slow, pytest.mark.network]


def test_real_fla_installs_from_the_index_and_imports(make_venv, tmp_path_factory, tmp_path):
    venv = make_venv()
    venv.uv_install(f"triton=={TRITON}", no_deps=True)
    before = venv.file_hashes()
    assert before["triton"][0] == TRITON
    uv = guarded.uv_dir(str(tmp_path_factory.mktemp("uvbin")))
    env = guarded.kernel_env(target=TARGET, cache_dir=str(tmp_path / "cache"), offline=False, uv=uv)

    proc = venv.cli("install", "fla", env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fla: installed" in proc.stdout
    assert "verified in a child process" in proc.stderr
    versions = venv.versions()
    assert versions["fla-core"] == "0.6.0" and versions["flash-linear-attention"] == "0.6.0"
    assert "einops" in versions

    code = ("import fastpath_hooks\n"
            "fastpath_hooks.install()\n"
            "from fla.ops.gated_delta_rule import chunk_gated_delta_rule\n"
            "from fla.modules import FusedRMSNormGated\n"
            "import fla\n"
            "print(fla.__version__, chunk_gated_delta_rule.__module__, 'FAKE_FLA' in vars(fla))\n")
    run = venv.run(code, env=env, timeout=900)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "0.6.0 fla.ops.gated_delta_rule.chunk False"
    assert "fastpath-hooks: fla: installing" not in run.stderr  # installed and verified once, remembered

    assert venv.file_hashes() == before  # torch, numpy, transformers and the triton torch needs: untouched
    assert venv.pip_check() == "No broken requirements found."
