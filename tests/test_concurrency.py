"""Many processes, one environment: exactly one installs, the others wait and re-read the result.

Real processes started together on a real venv, posing as an A100 machine, installing
fake kernels from a local wheelhouse through uv - whose every invocation is counted by a
logging `uv` placed where fastpath-hooks looks for it first (the venv's bin).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess

import pytest

from conftest import A100, offline_env
from support.processes import IMPORT_FLA_TOGETHER, counting_uv, installer_calls, run_env, start_together

# slow: real venvs, many processes at once (docs/development.md)
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train_tiny_qwen3_5.py")

def _planned_steps(venv, env, kernel: str) -> list:
    out = venv.cli("plan", "--json", kernel, env=env)
    assert out.returncode == 0, out.stderr
    (decision,) = [d for d in json.loads(out.stdout)["decisions"] if d["kernel"] == kernel]
    assert decision["action"] == "install", decision
    return decision["steps"]


def test_eight_processes_started_together_install_once(make_venv, make_wheelhouse, tmp_path):
    venv = make_venv(transformers=None)  # `import fla` alone: no transformers needed
    wheelhouse = make_wheelhouse(fla="0.6.0")
    log = str(tmp_path / "uv-calls.log")
    counting_uv(venv, log)
    env = offline_env(wheelhouse, A100, cache_dir=str(tmp_path / "cache"), FASTPATH_HOOKS_INSTALLER="uv",
                      FASTPATH_HOOKS_LOCK_TIMEOUT="300")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    steps = _planned_steps(venv, env, "fla")
    pip_check_before = venv.pip_check()
    # the posed target's line is said at the first start (once per environment): the eight say it no more, and the
    # node's voice goes to one that has something to say of fla - not to a late one whose verdict was ready
    first = venv.run("import fastpath_hooks; fastpath_hooks.install()", env=env)
    assert "nothing here is real" in first.stderr, first.stderr

    results = start_together(venv.python, IMPORT_FLA_TOGETHER, 8, env, str(tmp_path))

    for pid, out, err, code in results:
        assert code == 0 and "Traceback" not in err, (pid, out, err)
    reports = [json.loads(out.strip().splitlines()[-1]) for _, out, _, _ in results]
    assert all(r["version"] == "0.6.0" and r["fake"] is True for r in reports), reports
    states = sorted(r["state"] for r in reports)
    assert states == ["installed"] + ["ok"] * 7, states

    # Exactly one install: every installer call came from the one process that reports it,
    # and there were as many calls as the plan has steps.
    (installer_pid,) = [r["pid"] for r in reports if r["state"] == "installed"]
    calls = installer_calls(log)
    assert {pid for pid, _ in calls} == {installer_pid}, calls
    assert len(calls) == len(steps), (calls, steps)
    assert "fla-core==0.6.0" in calls[-1][1] and "flash-linear-attention==0.6.0" in calls[-1][1]

    # No rank variables, one parent: one process of the eight prints (events.speaks) - the installer
    # ("installing", "installed"), or a waiter that says why it paused and what it found after.
    errs = {pid: err for pid, _, err, _ in results}
    speakers = [pid for pid, err in errs.items() if "fastpath-hooks:" in err]
    assert len(speakers) == 1, errs
    said = errs[speakers[0]]
    if speakers[0] == installer_pid:
        assert "fla: installing" in said and "fla: installed" in said, said
    else:
        assert "waiting for another process" in said and "done by another process" in said, said
        assert "fla: installing" not in said and "fla: installed" not in said, said

    assert not os.path.exists(os.path.join(venv.site, ".fastpath-hooks", "journal.json"))
    assert venv.pip_check() == pip_check_before
    assert "No broken requirements" in pip_check_before


def test_torchrun_four_ranks_install_once_and_train_with_the_kernels(make_venv, make_wheelhouse, test_pins, tmp_path):
    venv = make_venv()
    wheelhouse = make_wheelhouse(fla="0.6.0", causal=True)
    log = str(tmp_path / "uv-calls.log")
    counting_uv(venv, log)
    env = offline_env(wheelhouse, A100, cache_dir=str(tmp_path / "cache"), pins=test_pins(wheelhouse),
                      FASTPATH_HOOKS_INSTALLER="uv", FASTPATH_HOOKS_LOG="debug", FASTPATH_HOOKS_LOCK_TIMEOUT="300",
                      OMP_NUM_THREADS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    planned = {k: _planned_steps(venv, env, k) for k in ("fla", "causal-conv1d")}
    pip_check_before = venv.pip_check()
    # Compile transformers' modules once (bytecode), not in each of the four ranks.
    venv.run("import transformers.models.qwen3_5.modeling_qwen3_5", env=run_env(FASTPATH_HOOKS_DISABLE="1"), check=True)

    logs = str(tmp_path / "ranks")
    proc = subprocess.run(
        [os.path.join(venv.bin, "torchrun"), "--nproc-per-node", "4", "--master-port", str(_free_port()),
         "--log-dir", logs, "--redirects", "3", EXAMPLE,
         "--steps", "2", "--json", "--hidden", "64", "--layers", "4", "--seq", "8", "--batch", "1", "--vocab", "128"],
        env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])

    per_rank = {}
    for rank in range(4):
        (out,) = glob.glob(os.path.join(logs, "**", "attempt_0", str(rank), "stdout.log"), recursive=True)
        (err,) = glob.glob(os.path.join(logs, "**", "attempt_0", str(rank), "stderr.log"), recursive=True)
        per_rank[rank] = (open(out).read(), open(err).read())

    for rank, (out, err) in per_rank.items():
        assert "Traceback" not in err, (rank, err)
        result = json.loads(out.strip().splitlines()[-1])
        assert result["rank"] == rank and result["world"] == 4 and len(result["losses"]) == 2
        assert result["kernels"] == {
            "causal_conv1d_fn": "package causal_conv1d.causal_conv1d_fn",
            "causal_conv1d_update": "package causal_conv1d.causal_conv1d_update",
            "torch_chunk_gated_delta_rule": "package fla.ops.gated_delta_rule.chunk_gated_delta_rule",
            "torch_recurrent_gated_delta_rule": "package fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule",
        }, (rank, result["kernels"])
        human = [line for line in err.splitlines() if line.startswith("fastpath-hooks:")]
        if rank == 0:
            assert human, err       # FASTPATH_HOOKS_LOG=debug: rank 0 always has something to say
        else:
            assert human == [], (rank, human)

    # One install per kernel, whichever rank did it.
    calls = installer_calls(log)
    assert len(calls) == sum(len(steps) for steps in planned.values()), calls
    assert sum("fla-core==0.6.0" in args for _, args in calls) == 1, calls
    assert sum("causal_conv1d-" in args for _, args in calls) == 1, calls
    assert venv.pip_check() == pip_check_before


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
