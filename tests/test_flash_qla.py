"""Acceptance of issue #21 on a CPU (slow): flash-qla, the backend fla 0.6 dispatches to by itself, for real -
real venvs, real pip installing offline from a wheelhouse of stand-in wheels (tests/support/wheels.py: an fla
whose chunk entry point dispatches like fla 0.6.0's registry - find_spec("flash_qla") + FLA_FLASH_QLA, no
try/except - and a flash-qla computing in torch, with a JIT failure or a wrong result baked in where asked),
the real verification children (the gated-delta-rule check: act/check_child.py), a Hopper posed through
FASTPATH_HOOKS_TARGET.

- planned only where its rules allow: sm_90 + nvcc + tilelang yes; not without nvcc, not on sm_80, not on
  sm_120 for training, not with FASTPATH_HOOKS_SKIP=flash-qla (the real CLI's plan, and installs);
- `import fla` installs tilelang, then fla, then flash-qla - before fla's code runs - checks flash-qla against
  fla's own path, and the user's call then runs on flash-qla, under the JIT caches the check warmed;
- its failure (a JIT error in its check) rolls it back: fla stays installed and runs its own path - not
  transformers' torch path - and FLA_FLASH_QLA=0 keeps it so;
- a broken flash-qla installed by hand crashes fla's first call without fastpath-hooks, and is switched off
  with it.
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import H100_OLD_TRITON, offline_env
from support import guarded, venvs

pytestmark = pytest.mark.slow

HOPPER = H100_OLD_TRITON      # sm_90 + triton 3.6.0 (fla#640: fla runs tilelang) + nvcc
QLA_DISTS = guarded.RESET_DISTS + ("flash-qla",)

# The user's process: fastpath-hooks on, `import fla` (what a modeling module does), then fla's chunk entry
# point called as transformers' Qwen3.5 calls it (K = V = 128, bf16), forward + backward.
USER = r'''
import json, os, sys
seen = []
import fastpath_hooks
fastpath_hooks.install(on_event=lambda e: seen.append((e["message"], "fla" in sys.modules)))
import torch
import fla
from fla.ops.gated_delta_rule import CALLS, chunk_gated_delta_rule
q, k = (torch.randn(1, 8, 1, 128).bfloat16().requires_grad_() for _ in range(2))
v = torch.randn(1, 8, 2, 128).bfloat16().requires_grad_()
g, beta = -torch.rand(1, 8, 2), torch.rand(1, 8, 2).bfloat16()
out, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
out.float().sum().backward()
import importlib.util
if importlib.util.find_spec("tilelang") is not None:   # as fla 0.6.0's first backward on Hopper does (fla#640)
    before = os.environ.get("TILELANG_CACHE_DIR")
    import tilelang  # noqa: F401
    seen.append(("imported tilelang under TILELANG_CACHE_DIR=" + str(os.environ.get("TILELANG_CACHE_DIR")), before))
print("RESULT " + json.dumps({
    "calls": dict(CALLS), "finite": bool(torch.isfinite(q.grad.float()).all()),
    "flash_qla_importable": importlib.util.find_spec("flash_qla") is not None,
    "env": {k: os.environ.get(k) for k in ("FLA_FLASH_QLA", "TRITON_CACHE_DIR", "TILELANG_CACHE_DIR")},
    "events": seen}))
'''


def _acted(message: str) -> bool:
    """A line of an install or a verification child (not a verdict remembered from an earlier one)."""
    return ": installing " in message or ": installed " in message or message.startswith("verified ")


def _user(venv, env) -> dict:
    proc = venv.run(USER, env=env, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[len("RESULT "):]), "stderr": proc.stderr}
    raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")


@pytest.fixture
def house(make_wheelhouse):
    def make(flash_qla="ok"):
        return make_wheelhouse(fla="0.6.0", tilelang="0.1.15", tvm_ffi="0.1.12", flash_qla=flash_qla)
    return make


@pytest.fixture(scope="module")
def venv(tmp_path_factory, torch_wheel, fastpath_wheel):
    return venvs.make_venv(str(tmp_path_factory.mktemp("qla") / "venv"), torch_wheel=torch_wheel,
                           fastpath_wheel=fastpath_wheel, transformers=None)


@pytest.fixture
def clean(venv):
    venvs_reset(venv)
    yield venv
    venvs_reset(venv)


def venvs_reset(venv) -> None:
    import shutil
    import subprocess

    subprocess.run([venvs.uv(), "pip", "uninstall", "-q", "--python", venv.python, *QLA_DISTS],
                   check=True, env=venvs.clean_env(), capture_output=True, text=True)
    shutil.rmtree(os.path.join(venv.site, ".fastpath-hooks"), ignore_errors=True)


def _plan(venv, env, target) -> dict:
    proc = venv.cli("plan", "--json", "--target", target, env=env)
    assert proc.returncode == 0, proc.stderr
    return {d["kernel"]: d for d in json.loads(proc.stdout)["decisions"]}


def test_planned_only_where_its_rules_allow(clean, house, test_pins, tmp_path):
    wh = house()
    env = offline_env(wh, HOPPER, cache_dir=str(tmp_path / "cache"), pins=test_pins(wh))
    yes = _plan(clean, env, HOPPER)["flash-qla"]
    assert (yes["action"], yes["rule"]) == ("install", "qla.install") and yes["target"] == {"flash-qla": "0.1.3"}
    assert yes["needs"] == ["tilelang", "fla"] and yes["off"] == {"FLA_FLASH_QLA": "0"}
    assert _plan(clean, env, HOPPER)["fla"]["wants"] == ["flash-qla"]
    cases = {
        HOPPER.replace("nvcc=yes", "nvcc=no"): "qla.not-used",          # no nvcc: no tilelang, so no fla (fla#640)
        HOPPER.replace("sm_90", "sm_80"): "qla.arch",
        HOPPER.replace("sm_90", "sm_120"): "qla.arch",                  # a bf16 forward only: no training path
        HOPPER.replace("triton=3.6.0", "triton=3.7.1"): "qla.off",      # fla needs no tilelang: off until it pays
        HOPPER + ",head_dims=64x64": "qla.head-dims",
    }
    for target, rule in cases.items():
        d = _plan(clean, env, target)["flash-qla"]
        assert (d["action"], d["rule"]) == ("skip", rule), (target, d["reason"])
        assert d["reason"] and not d["steps"]
    # the shipped pins: off by default on Hopper too (measured on the H200: 1.02-1.08x over fla + tilelang at
    # small sizes), said with the way to turn it on; fla then wants nothing of it
    shipped = _plan(clean, {**env, "FASTPATH_HOOKS_PINS": test_pins(wh, flash_qla_on=False)}, HOPPER)
    off = shipped["flash-qla"]
    assert (off["action"], off["rule"]) == ("skip", "qla.off") and not off["steps"]
    assert "fla#640" in off["reason"] and "not shown to pay" in off["reason"], off
    assert "pays.hazard" in off["fix"], off
    assert shipped["fla"]["wants"] == [] and shipped["tilelang"]["action"] == "install"
    skipped = _plan(clean, {**env, "FASTPATH_HOOKS_SKIP": "flash-qla"}, HOPPER)
    assert skipped["flash-qla"]["rule"] == "skip.user" and skipped["fla"]["wants"] == []

    # and installed accordingly: `fastpath-hooks install` on an sm_80, and with the skip, installs fla alone
    for extra in ({"FASTPATH_HOOKS_TARGET": HOPPER.replace("sm_90", "sm_80")}, {"FASTPATH_HOOKS_SKIP": "flash-qla"}):
        proc = clean.cli("install", env={**env, **extra}, timeout=900)
        versions = clean.versions()
        assert versions.get("fla-core") == "0.6.0", proc.stdout + proc.stderr
        assert "flash-qla" not in versions, proc.stdout + proc.stderr
        venvs_reset(clean)


def test_import_fla_installs_flash_qla_after_tilelang_and_before_fla_and_fla_then_runs_on_it(clean, house, test_pins,
                                                                                             tmp_path):
    wh = house()
    cache = tmp_path / "cache"
    env = offline_env(wh, HOPPER, cache_dir=str(cache), pins=test_pins(wh))
    result = _user(clean, env)
    said = [m for m, _ in result["events"]]
    installed = [m.split(":")[0] for m in said if ": installed " in m]
    assert installed == ["tilelang", "fla", "flash-qla"], said
    # every install - flash-qla's too - happened before fla's code ran (fla's find_spec finds it at its first call)
    assert not any(fla_imported for m, fla_imported in result["events"] if ": installed " in m)
    assert any(m.startswith("verified flash-qla: flash-qla's gated-delta-rule check: ") for m in said), said
    versions = clean.versions()
    assert versions["flash-qla"] == "0.1.3" and versions["fla-core"] == "0.6.0" and versions["tilelang"] == "0.1.15"
    # the user's call dispatched to flash-qla, and its gradients are finite
    assert result["calls"]["flash_qla"] == 1 and result["calls"]["chunk"] == 0 and result["finite"]
    # the JIT caches the check used are the training process's: under fastpath-hooks' cache
    assert result["env"]["TRITON_CACHE_DIR"] == str(cache / "jit" / "triton")
    assert result["env"]["TILELANG_CACHE_DIR"] == str(cache / "jit" / "tilelang")
    assert result["env"]["FLA_FLASH_QLA"] is None
    warm = json.loads((cache / "jit" / "warm.json").read_text())
    assert set(warm) == {"fla", "flash-qla"} and warm["flash-qla"]["shapes"] == [[1, 2, 128, 128]]
    assert warm["flash-qla"]["dirs"]["TILELANG_CACHE_DIR"] == str(cache / "jit" / "tilelang")

    # `doctor` says what is warm
    doctor = clean.cli("doctor", "--json", env=env)
    assert doctor.returncode == 0, doctor.stderr
    jit = json.loads(doctor.stdout)["jit"]
    assert jit["caches"]["TILELANG_CACHE_DIR"]["directory"] == str(cache / "jit" / "tilelang")
    assert set(jit["warmed"]) == {"fla", "flash-qla"}
    text = clean.cli("doctor", env=env).stdout
    assert "JIT caches" in text and "flash-qla: compiled" in text

    # the next process: nothing installed or checked again; still flash-qla
    again = _user(clean, env)
    assert not [m for m, _ in again["events"] if _acted(m)], again["events"]
    assert again["calls"]["flash_qla"] == 1
    assert again["env"]["TRITON_CACHE_DIR"] == str(cache / "jit" / "triton")     # the caches the check warmed


def test_a_flash_qla_that_fails_its_check_leaves_fla_on_its_own_path_not_the_torch_path(clean, house, test_pins,
                                                                                        tmp_path):
    wh = house("jit")        # its first call raises, as a tilelang JIT whose nvcc fails
    cache = tmp_path / "cache"
    env = offline_env(wh, HOPPER, cache_dir=str(cache), pins=test_pins(wh))
    result = _user(clean, env)
    said = [m for m, _ in result["events"]]
    # the line: the outcome, as much of the check's error as fits, and that fla keeps its own path (the whole
    # error is in the event's detail and doctor)
    assert any(m.startswith("flash-qla: could not install - verification failed: flash-qla's gated-delta-rule")
               and "(fla keeps its own path" in m for m in said), said
    versions = clean.versions()
    assert "flash-qla" not in versions and versions["fla-core"] == "0.6.0"      # rolled back; fla stays
    assert not result["flash_qla_importable"] and result["env"]["FLA_FLASH_QLA"] == "0"
    assert result["calls"] == {"chunk": 1, "recurrent": 0, "flash_qla": 0} and result["finite"]   # fla's own path

    again = _user(clean, env)     # remembered: not retried at the next start, still switched off
    assert not [m for m, _ in again["events"] if _acted(m)], again["events"]
    assert again["env"]["FLA_FLASH_QLA"] == "0" and again["calls"]["chunk"] == 1
    assert again["env"]["TRITON_CACHE_DIR"] == str(cache / "jit" / "triton")


def test_with_the_shipped_pins_fla_is_warmed_on_hopper_and_the_next_process_loads_what_was_warmed(
        clean, house, test_pins, tmp_path):
    """flash-qla off (the shipped default on Hopper): fla's own check warms its tilelang path; a later process,
    with nothing left to check, still sets the caches it warmed - on the H200, before it did, the first
    training process compiled everything again (first step 144.0 s; 5.0 s once it found them)."""
    wh = house()
    cache = tmp_path / "cache"
    env = offline_env(wh, HOPPER, cache_dir=str(cache), pins=test_pins(wh, flash_qla_on=False))
    first = _user(clean, env)
    said = [m for m, _ in first["events"]]
    assert [m.split(":")[0] for m in said if ": installed " in m] == ["tilelang", "fla"], said
    assert first["calls"] == {"chunk": 1, "recurrent": 0, "flash_qla": 0} and first["finite"]
    assert set(json.loads((cache / "jit" / "warm.json").read_text())) == {"fla"}
    again = _user(clean, env)
    assert not [m for m, _ in again["events"] if _acted(m)], again["events"]
    for result in (first, again):
        assert result["env"]["TRITON_CACHE_DIR"] == str(cache / "jit" / "triton"), result["events"]
        # set before tilelang was imported (inside fla's first backward), where it reads it
        assert f"imported tilelang under TILELANG_CACHE_DIR={cache / 'jit' / 'tilelang'}" in [
            m for m, _ in result["events"]], result["events"]


def test_a_broken_flash_qla_installed_by_hand_is_switched_off(clean, house, test_pins, tmp_path):
    wh = house("import")     # `import flash_qla` raises, as on a GPU it does not support
    clean.uv_install(*(os.path.join(wh, f) for f in os.listdir(wh) if f.startswith(("fla", "flash_", "tilelang",
                                                                                    "apache_tvm"))), no_deps=True)
    env = offline_env(wh, HOPPER, cache_dir=str(tmp_path / "cache"), pins=test_pins(wh))
    without = clean.run(USER, env={**env, "FASTPATH_HOOKS_DISABLE": "1"}, timeout=600)
    assert without.returncode != 0 and "FlashQLA now support sm90" in without.stderr   # fla does not catch it
    result = _user(clean, env)
    assert result["env"]["FLA_FLASH_QLA"] == "0" and result["calls"]["chunk"] == 1 and result["finite"]
    assert any(m.startswith("flash-qla: could not verify it - import flash_qla: ValueError: FlashQLA")
               and "(fla keeps its own path" in m for m, _ in result["events"]), result["events"]
    assert clean.versions()["flash-qla"] == "0.1.3"     # the user's install is never removed
