"""benchmarks/device.py - the one device driver (issue 39) - checked on the CPU: its cases are data a run can name,
and a dry run makes a case's fresh environment over a base that is itself a venv (as the device's python is), runs
it in the background and brings back a summary with each case's phases."""

import json
import os
import subprocess
import sys

import pytest

from support import benchmarks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = benchmarks.path("device")


def _driver():
    return benchmarks.load("device", "device_driver")


def test_the_cases_are_data_of_known_kinds_and_environments():
    cases = _driver().CASES
    for name in ("qwen3_5-cold", "qwen3_5-later", "qwen3_5-by-hand-cold", "qwen3_5-by-hand-later",
                 "granitemoehybrid-cold", "granitemoehybrid-later"):   # issue 39's, named as its summary needs
        assert cases[name]["kind"] == "step" and cases[name]["model"] in name
    assert len([n for n in cases if n.startswith("era-d-")]) == 6     # issue 32's six
    for name, case in cases.items():
        assert case["kind"] in ("step", "jit", "era_d"), name
        assert case["kind"] == "jit" or case["env"] in ("hooks", "by-hand", "5.25", "hooks-5.25"), name
        assert case.get("cold") or case["kind"] != "jit", name   # a parallel-JIT case starts from empty caches
    proc = subprocess.run([sys.executable, DRIVER, "start", "--cases", "nope"], capture_output=True, text=True)
    assert proc.returncode != 0 and "unknown cases: nope" in proc.stderr


@pytest.mark.slow   # a venv, a pip install, a tiny training step on the CPU
def test_a_dry_run_brings_back_the_case_and_its_phases(tmp_path, fastpath_wheel):
    carried = tmp_path / "carried"
    carried.mkdir()
    os.link(fastpath_wheel, carried / os.path.basename(fastpath_wheel))
    env = dict(os.environ, WORK=str(tmp_path / "work"), KEEP=str(tmp_path / "keep"), OUT=str(tmp_path / "out"),
               CARRIED=str(carried))
    proc = subprocess.run([sys.executable, DRIVER, "start", "wait", "--cases", "qwen3_5-cold", "--dry",
                           "--until", "500"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "background: done" in proc.stdout, proc.stdout + proc.stderr
    (case,) = json.loads((tmp_path / "out" / "summary.json").read_text())["cases"]
    assert case["case"] == "qwen3_5-cold" and case["error"] is None and case["first_step_done_s"] > 0, case
    phases = case["phases"]
    assert {"imports_s", "modeling_import_s", "model_build_s", "first_step_s"} <= set(phases), phases
    assert (tmp_path / "out" / "cases.tgz").stat().st_size > 0

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
