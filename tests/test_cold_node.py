"""benchmarks/cold_node.sh (issue 20's GPU run) checked on CPU: its `check` phase names what the wheelhouse
lacks, and its training script runs and says when the kernels were (not) ready."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEEDED = ["causal_conv1d-1.7.0.tar.gz", "mamba_ssm-2.3.2.post1.tar.gz", "ninja-1.13.0-py3-none-any.whl",
          "packaging-25.0-py3-none-any.whl", "filelock-3.20.0-py3-none-any.whl",
          "fastpath_hooks-0.2.0-py3-none-any.whl"]


def _check(tmp_path, house):
    env = dict(os.environ, WHEELHOUSE=str(house), WORK=str(tmp_path / "work"), OUT=str(tmp_path / "out"),
               BASE=sys.executable)
    return subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "cold_node.sh"), "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_check_phase_names_what_the_wheelhouse_lacks_and_passes_a_full_one(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    for name in NEEDED:
        if not name.startswith("mamba_ssm"):
            (house / name).write_text("")
    proc = _check(tmp_path, house)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"the wheelhouse {house} lacks mamba_ssm-2.3.2.post1.tar.gz;" in proc.stdout
    (house / NEEDED[1]).write_text("")
    proc = _check(tmp_path, house)
    assert proc.returncode == 0 and "wheelhouse ok" in proc.stdout, proc.stdout + proc.stderr
    assert "wheelhouse ok" in (tmp_path / "out" / "log.txt").read_text()   # the phase's output is kept in $OUT


@pytest.mark.slow
def test_the_training_script_on_cpu_says_the_kernels_stayed_on_the_torch_path(tmp_path):
    out = tmp_path / "env.json"
    env = dict(os.environ, FASTPATH_HOOKS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "cold_node_train.py"), "--device", "cpu",
                           "--steps", "1", "--seq", "64", "--out", str(out)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert 0 < r["install_s"] <= r["ready_s"] <= r["first_step_s"]
    assert r["ready"] is False and "mamba2_split_conv1d_scan_combined" in r["unresolved"]   # no kernels on CPU
    assert any("no CUDA/XPU accelerator" in (e["message"] or "") for e in r["events"]), r["events"]


@pytest.mark.slow   # a venv and a pip install
def test_every_device_benchmark_makes_its_fresh_environment_over_a_base_that_is_a_venv(tmp_path):
    """benchmarks/lib.sh's fresh_env, which every device script sources: over a $BASE that is itself a venv
    (this dev venv, as the device's python is), the new environment sees the base's torch without
    installing it, and holds only what it was asked to install."""
    from support import wheels

    house = str(tmp_path / "house")
    os.makedirs(house)
    wheels.build_wheel(house, "standin-pkg", "1.0", {"standin_pkg/__init__.py": "X = 1\n"})
    env_dir = str(tmp_path / "env")
    script = f'. {ROOT}/benchmarks/lib.sh && fresh_env "$1" --no-deps --find-links "$2" standin-pkg'
    proc = subprocess.run(["bash", "-c", script, "fresh", env_dir, house], env=dict(os.environ, BASE=sys.executable),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code = "import json, torch, standin_pkg; print(json.dumps([torch.__file__, standin_pkg.__file__]))"
    torch_file, own_file = json.loads(subprocess.run([os.path.join(env_dir, "bin", "python"), "-c", code],
                                                     capture_output=True, text=True, timeout=300, check=True).stdout)
    assert not torch_file.startswith(env_dir) and own_file.startswith(env_dir), (torch_file, own_file)
    for script_name in sorted(os.listdir(os.path.join(ROOT, "benchmarks"))):
        if script_name.endswith(".sh") and script_name != "lib.sh":
            text = open(os.path.join(ROOT, "benchmarks", script_name)).read()
            assert "fresh_env() {" not in text and ("lib.sh" in text or "fresh_env" not in text), script_name
