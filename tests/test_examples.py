"""The examples run on CPU, and the smoke test's reference is the computation transformers does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.venvs import ROOT, clean_env


@pytest.mark.slow
def test_training_example_runs_on_cpu_on_the_torch_path(tmp_path):
    env = clean_env(FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_tiny_qwen3_5.py"), "--steps", "3",
                           "--json"], capture_output=True, text=True, env=env, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result["losses"]) == 3 and all(l == l and 0 < l < 20 for l in result["losses"])  # finite, sane
    # No accelerator here: fastpath-hooks says why once, and transformers keeps its torch functions.
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("fastpath-hooks:")]
    assert len(lines) == 1 and "no CUDA/XPU accelerator" in lines[0], lines
    assert set(result["kernels"]) == {"causal_conv1d_fn", "causal_conv1d_update", "torch_chunk_gated_delta_rule",
                                      "torch_recurrent_gated_delta_rule"}
    assert all(impl.startswith("torch transformers.models.qwen3_5.") for impl in result["kernels"].values()), result


@pytest.mark.slow
def test_the_gated_delta_rule_reference_matches_transformers_torch_gated_delta_rule():
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    from fastpath_hooks.act.check_child import gdr_ref

    gen = torch.Generator().manual_seed(0)
    B, T, H, K = 1, 96, 2, 16
    q, k, v = (torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64))
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64))
    ours = gdr_ref(q, k, v, g, beta)[0].double()   # the one reference: numeric, gated-delta-rule check, smoke
    torch_fn = getattr(m.torch_chunk_gated_delta_rule, "__wrapped__", m.torch_chunk_gated_delta_rule)
    theirs, _ = torch_fn(q.float(), k.float(), v.float(), g=g.float(), beta=beta.float(), chunk_size=64,
                         use_qk_l2norm_in_kernel=True)
    rel = (torch.linalg.vector_norm(ours - theirs.double()) / torch.linalg.vector_norm(theirs.double())).item()
    assert rel < 1e-4, rel
    # value heads grouped over key heads (GVA) read as q and k repeated to the value heads
    v2 = torch.randn(B, T, 2 * H, K, generator=gen, dtype=torch.float64)
    g2, beta2 = g.repeat_interleave(2, dim=2), beta.repeat_interleave(2, dim=2)
    grouped, _ = gdr_ref(q, k, v2, g2, beta2)
    repeated, _ = gdr_ref(q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2), v2, g2, beta2)
    assert torch.allclose(grouped, repeated)


def test_doctor_smoke_is_skipped_without_a_gpu(tmp_path):
    env = clean_env(FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "fastpath_hooks", "doctor", "--smoke", "--json"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    smoke = json.loads(proc.stdout)["smoke"]
    assert smoke["status"] == "skipped" and "CUDA" in smoke["reason"]
